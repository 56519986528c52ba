"""Every upstream internal swift-vora patches, in one inventory: what, where, how to turn it off, what proves it.

swift-vora changes the behaviour of ms-swift, transformers, PEFT, torch and decord at a few narrow points (no
public hook exists for them). Each point is a `Patch` below: the target (`module:qualified.name`), how it is
changed (`wraps`: our code runs around the original, which still runs; `replaces`: our code runs instead of the
original's body and must stay equivalent to it; `sets`: a flag the original reads), the parameters our code
relies on, the swift-vora module that does it, how a user turns it off, and the test that shows the patched
behaviour is the same.

The same check runs when a patch is applied (`applicable(name)`, before the code that patches): the target must
exist with these parameters and use these names, and for `replaces` patches the original's source must be the one
checked by the equivalence test (its hash, per tested version). An upstream the inventory does not know gets the
patch's `policy`: `skip` (upstream's code runs as it is, with one warning naming the patch, its switch and the
version) or `refuse` (PatchRefused: the plugin cannot work without it). What was decided is recorded, and the
`fingerprint` guard writes it into fingerprint.json (`report()`). tests/test_patched_upstream.py runs the same check
against the installed packages, so an upgrade that moves or changes a target fails there too, naming the patch.

Every replacement carries one marker, `MARKER` (`mark`, `patched_by`, `upstream`): "already patched" is asked the
same way everywhere, and the original stays reachable.

Importing this module imports nothing of swift-vora (the standard library only; targets are imported when checked).
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

# Every replacement swift-vora installs carries this attribute: (the patch's name, the object it replaced).
MARKER = '_swift_vora_patch'
POLICIES = ('skip', 'refuse')
logger = logging.getLogger('swift')

VIT_ATTENTION_PARAMS = ('self', 'hidden_states', 'cu_seqlens', 'position_embeddings', 'max_seqlen', 'kwargs')
# transformers versions whose replaced functions have the same source, byte for byte (hashed from the 5.17.0, 5.18.0
# and 5.19.0 wheels, 2026-12-02): the equivalence tests run on 5.19.0 here and ran on 5.17.0, the H200 image's, in
# the GPU sessions; pyproject allows these three.
TRANSFORMERS_CHECKED = ('5.17.0', '5.18.0', '5.19.0')


def _same_source(digest: str) -> Dict[str, str]:
    return {v: digest for v in TRANSFORMERS_CHECKED}


VIT_ATTENTION_SOURCE = _same_source('2afc2f9fa3ebd677')  # the four classes share one forward's source
DEEPSTACK_PARAMS = ('self', 'hidden_states', 'visual_pos_masks', 'visual_embeds')
DEEPSTACK_SOURCE = _same_source('07178743d3d5ebc3')
# torch's two-line Conv3d.forward, the same in the local wheel and the H200 image (printed there in run 16)
# megatron-core 0.16.1's GatedDeltaNet.forward (mcore-bridge 1.6.5's override takes the same)
MEGATRON_GDN_FORWARD_PARAMS = ('self', 'hidden_states', 'attention_mask', 'key_value_states', 'inference_context',
                               'attention_bias', 'packed_seq_params', 'sequence_len_offset', 'inference_params',
                               'kwargs')
CONV3D_FORWARD_SOURCE = {version: '91cbbd182f3c8657' for version in ('2.14.1', '2.11.0', '2.11.0+cu130')}
# transformers' Gated DeltaNet forward (Qwen3.5 and Qwen3.5-MoE share one source, Qwen3-Next has its own): hashed from
# the 5.17.0 wheel (the H200 image's) and the installed 5.19.0 on 2026-12-05, the same bytes in both; 5.18.0 not read
GDN_FORWARD_PARAMS = ('self', 'hidden_states', 'cache_params', 'attention_mask', 'kwargs')
GDN_FORWARD_SOURCE = {v: 'bd25761e1031fff0' for v in ('5.17.0', '5.19.0')}
GDN_NEXT_FORWARD_SOURCE = {v: 'fc80496fd00b7992' for v in ('5.17.0', '5.19.0')}


class Patch(NamedTuple):
    name: str
    target: str  # 'module:Qualified.name'
    package: str  # the distribution the target ships in (its version keys `sources`)
    kind: str  # wraps | replaces | sets
    params: Tuple[str, ...]  # the target's parameters, as our code calls or overrides it
    where: str  # the swift-vora module that patches it
    off: str  # how a user turns it off
    proof: str  # the test that shows the patched behaviour is the same
    sources: Dict[str, str] = {}  # `replaces`: package version -> sha256[:16] of the original's source
    uses: Tuple[str, ...] = ()  # names the original's source must contain (attributes our code relies on)
    # on an upstream the inventory does not know: skip (warn once, upstream's code runs) | refuse (PatchRefused)
    policy: str = 'skip'
    # modules the target's module imports that a CPU machine cannot have (transformer_engine): where they are
    # missing, tests/test_patched_upstream.py reads the target's source file instead of importing it
    needs: Tuple[str, ...] = ()


PATCHES = (
    Patch('plugin_loader', 'swift.utils.utils:import_external_file', 'ms-swift', 'wraps', ('file_path', ),
          '_swift_vora_hook.py', 'pass `--custom_register_path` a .py file (handed to ms-swift unchanged), or remove '
          'swift_vora_plugin_path.pth from site-packages', 'tests/test_plugin_hook.py',
          uses=('_external_files', )),  # the hook checks the parameters itself: it runs before swift-vora imports
    Patch('annotation_datasets', 'swift.dataset.dataset_syntax:DatasetSyntax.get_dataset_meta', 'ms-swift', 'wraps',
          ('self', 'use_hf'), 'dataset.py', 'only files that hold Video-ORA annotations are rerouted; give ms-swift '
          'rows instead', 'tests/test_swift_e2e.py', policy='refuse'),
    Patch('default_callbacks', 'swift.trainers.mixin:SwiftMixin._get_callbacks', 'ms-swift', 'wraps',
          ('self', 'args'), 'swift_registry.py', 'SWIFT_VORA_GUARDS=none and the levers\' switches off: nothing '
          'is appended', 'tests/test_guards_registry.py', policy='refuse'),
    Patch('sft_padding_free_check', 'swift.arguments.sft_args:SftArguments._check_padding_free', 'ms-swift', 'wraps',
          ('self', ), 'speed/packed_attention.py', 'SWIFT_VORA_PACKED_ATTENTION=0', 'tests/test_packed_attention.py',
          uses=('self.attn_impl', 'self.packing')),
    Patch('guard_tap_training_step', 'transformers:Trainer.training_step', 'transformers', 'wraps',
          ('self', 'model', 'inputs', 'num_items_in_batch'), 'guards/common.py', 'SWIFT_VORA_GUARDS=none',
          'tests/test_guards_coverage.py', policy='refuse'),  # a guard that cannot see the batches must not pass
    Patch('guard_tap_dataset', 'swift.dataset:LazyLLMDataset.__init__', 'ms-swift', 'wraps',
          ('self', 'dataset', 'encode_func', 'n_try_fetch', 'strict', 'random_state', 'traceback_limit'),
          'guards/common.py', 'SWIFT_VORA_GUARDS=none', 'tests/test_guards_coverage.py',
          uses=('self.dataset', 'self.encode_func'), policy='refuse'),
    *(Patch(f'vit_attention_{short}', f'transformers.models.{module}:{cls}.forward', 'transformers', 'replaces',
            VIT_ATTENTION_PARAMS, 'speed/vit_attention.py', 'SWIFT_VORA_VIT_ATTENTION=transformers',
            'tests/test_vit_attention.py', VIT_ATTENTION_SOURCE)
      for short, module, cls in (
          ('qwen3_vl', 'qwen3_vl.modeling_qwen3_vl', 'Qwen3VLVisionAttention'),
          ('qwen3_vl_moe', 'qwen3_vl_moe.modeling_qwen3_vl_moe', 'Qwen3VLMoeVisionAttention'),
          ('qwen3_5', 'qwen3_5.modeling_qwen3_5', 'Qwen3_5VisionAttention'),
          ('qwen3_5_moe', 'qwen3_5_moe.modeling_qwen3_5_moe', 'Qwen3_5MoeVisionAttention'))),
    *(Patch(f'patch_embed_{short}', f'transformers.models.{module}:{cls}.forward', 'transformers', 'wraps',
            ('self', 'hidden_states'), 'speed/patch_embed.py', 'SWIFT_VORA_PATCH_EMBED=conv',
            'tests/test_patch_embed.py', uses=('self.proj(', ))
      for short, module, cls in (
          ('qwen2_vl', 'qwen2_vl.modeling_qwen2_vl', 'PatchEmbed'),
          ('qwen2_5_vl', 'qwen2_5_vl.modeling_qwen2_5_vl', 'Qwen2_5_VisionPatchEmbed'),
          ('qwen3_vl', 'qwen3_vl.modeling_qwen3_vl', 'Qwen3VLVisionPatchEmbed'),
          ('qwen3_vl_moe', 'qwen3_vl_moe.modeling_qwen3_vl_moe', 'Qwen3VLMoeVisionPatchEmbed'),
          ('qwen3_5', 'qwen3_5.modeling_qwen3_5', 'Qwen3_5VisionPatchEmbed'),
          ('qwen3_5_moe', 'qwen3_5_moe.modeling_qwen3_5_moe', 'Qwen3_5MoeVisionPatchEmbed'))),
    # per eligible instance (a stride == kernel Conv3d in a patch embedding above); other inputs still reach
    # _conv_forward, what the original forward calls
    Patch('patch_embed_conv_forward', 'torch.nn:Conv3d.forward', 'torch', 'replaces', ('self', 'input'),
          'speed/patch_embed.py', 'SWIFT_VORA_PATCH_EMBED=conv', 'tests/test_patch_embed.py',
          CONV3D_FORWARD_SOURCE, uses=('self._conv_forward(input, self.weight, self.bias)', )),
    Patch('compiled_vision_block', 'transformers.models.qwen3_vl.modeling_qwen3_vl:Qwen3VLVisionBlock.forward',
          'transformers', 'replaces', ('self', 'hidden_states', 'cu_seqlens', 'position_embeddings', 'kwargs'),
          'speed/compile_layers.py', 'SWIFT_VORA_COMPILE_VISION=0 (or SWIFT_VORA_COMPILE=off, the default)',
          'tests/test_compile_vision.py', _same_source('681e62f9206787af')),
    Patch('compiled_decoder_layers', 'torch.nn:Module.compile', 'torch', 'wraps', ('self', 'args', 'kwargs'),
          'speed/compile_layers.py', 'SWIFT_VORA_COMPILE=off (the default)', 'tests/test_compile_layers.py',
          uses=('_compiled_call_impl', )),
    Patch('deepstack_qwen3_vl', 'transformers.models.qwen3_vl.modeling_qwen3_vl:Qwen3VLTextModel._deepstack_process',
          'transformers', 'replaces', DEEPSTACK_PARAMS, 'speed/host_overhead.py', 'SWIFT_VORA_HOST_OVERHEAD=0',
          'tests/test_host_overhead.py', DEEPSTACK_SOURCE),
    Patch('deepstack_qwen3_vl_moe',
          'transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe:Qwen3VLMoeTextModel._deepstack_process',
          'transformers', 'replaces', DEEPSTACK_PARAMS, 'speed/host_overhead.py', 'SWIFT_VORA_HOST_OVERHEAD=0',
          'tests/test_host_overhead.py', DEEPSTACK_SOURCE),
    Patch('token_accuracy', 'swift.trainers.mixin:SwiftMixin._compute_acc', 'ms-swift', 'replaces',
          ('self', 'outputs', 'labels', 'cu_seqlens'), 'speed/host_overhead.py', 'SWIFT_VORA_HOST_OVERHEAD=0',
          'tests/test_host_overhead.py', {'4.6.0': '037d7a70785e8a82'}),
    Patch('flops_parameter_count', 'transformers:Trainer.floating_point_ops', 'transformers', 'replaces',
          ('self', 'inputs'), 'speed/host_overhead.py', 'SWIFT_VORA_HOST_OVERHEAD=0', 'tests/test_host_overhead.py',
          _same_source('ffd8b0eb8cf7c98b')),
    Patch('train_mode', 'torch.nn:Module.train', 'torch', 'wraps', ('self', 'mode'), 'speed/host_overhead.py',
          'SWIFT_VORA_HOST_OVERHEAD=0', 'tests/test_host_overhead.py'),
    Patch('lora_input_cast', 'peft.tuners.lora.layer:Linear._cast_input_dtype', 'peft', 'sets',
          ('self', 'x', 'dtype'), 'speed/lora_autocast.py', 'SWIFT_VORA_LORA_AUTOCAST_INPUTS=0',
          'tests/test_lora_autocast.py', uses=('cast_input_dtype_enabled', )),
    Patch('selective_checkpoint_func', 'transformers.modeling_layers:GradientCheckpointingLayer.__call__',
          'transformers', 'sets', ('self', 'args', 'kwargs'), 'speed/selective_checkpoint.py',
          'SWIFT_VORA_SELECTIVE_CHECKPOINT=off (the default)', 'tests/test_selective_checkpoint.py',
          uses=('_gradient_checkpointing_func', 'gradient_checkpointing')),
    Patch('decoder_threads', 'decord:VideoReader.__init__', 'decord', 'wraps',
          ('self', 'uri', 'ctx', 'width', 'height', 'num_threads', 'fault_tol'), 'speed/video_decode.py',
          'SWIFT_VORA_DECODE_THREADS=0', 'tests/test_video_decode.py'),
    # ms-swift's trainer replaces torch.utils.checkpoint.checkpoint by a wrapper that forces its use_reentrant and
    # keeps torch's as `_old_checkpoint`; around each compiled layer's call with the checkpoint inside the graph,
    # torch's own is set back (dynamo's activation-checkpoint region passes use_reentrant=False)
    Patch('compiled_checkpoint_swap', 'swift.trainers.mixin:SwiftMixin._fix_gradient_checkpointing', 'ms-swift',
          'sets', ('self', ), 'speed/compile_layers.py', 'SWIFT_VORA_COMPILE_CHECKPOINT=eager (the default)',
          'tests/test_compile_layers.py',
          uses=('torch.utils.checkpoint._old_checkpoint = ', 'torch.utils.checkpoint.checkpoint = ')),
    # a video_ora checkpoint's trained budget into the environment before its template and dataset are built, and
    # its file into the model's additional_saved_files (what save_checkpoint copies into a merged model)
    Patch('trained_budget_template', 'swift.arguments.base_args.base_args:BaseArguments.get_template', 'ms-swift',
          'wraps', ('self', 'processor', 'kwargs'), 'trained_budget.py', 'export the SWIFT_VORA_* budget you want '
          '(it wins, with a warning), or delete swift_vora_budget.json from the checkpoint',
          'tests/test_trained_budget.py', uses=('get_template_kwargs', "template_kwargs['template_type']")),
    # qwen_vl_utils' fetch_video decodes with the reader its module globals name, chosen once per process: the PyAV
    # reader is added to VIDEO_READER_BACKENDS, the chosen one set in FORCE_QWENVL_VIDEO_READER (what
    # get_video_reader_backend reads) and that cached choice cleared
    Patch('qwen_vl_video_reader', 'qwen_vl_utils.vision_process:fetch_video', 'qwen-vl-utils', 'sets',
          ('ele', 'image_patch_size', 'return_video_sample_fps', 'return_video_metadata'), 'video_reader.py',
          'FORCE_QWENVL_VIDEO_READER=decord (or torchcodec): a reader qwen_vl_utils has itself',
          'tests/test_video_reader.py', uses=('get_video_reader_backend()', 'VIDEO_READER_BACKENDS[')),
    # Gated DeltaNet under `megatron sft` (backends/megatron_fla.py): the flash-linear-attention globals both
    # GatedDeltaNet modules read at call time, pointed at unsloth_zoo's vendored fla (correct on Hopper with Triton
    # < 3.7.1, fla #640); `HAVE_FLA` is what megatron-core's __init__ checks
    Patch('megatron_gdn_fla', 'megatron.core.ssm.gated_delta_net:GatedDeltaNet.forward', 'megatron-core', 'sets',
          MEGATRON_GDN_FORWARD_PARAMS, 'backends/megatron_fla.py', 'SWIFT_VORA_MEGATRON_FLA=off',
          'tests/test_megatron_fla.py', uses=('l2norm(', 'chunk_gated_delta_rule(')),
    Patch('mcore_bridge_gdn_fla', 'mcore_bridge.model.modules.gated_delta_net:GatedDeltaNet.forward', 'mcore-bridge',
          'sets', MEGATRON_GDN_FORWARD_PARAMS, 'backends/megatron_fla.py',
          'SWIFT_VORA_MEGATRON_FLA=off', 'tests/test_megatron_fla.py',
          uses=('l2norm(', 'chunk_gated_delta_rule(', 'causal_conv1d is None'), needs=('transformer_engine', )),
    # `megatron sft` step profile (backends/megatron_profile.py; only where SWIFT_VORA_PROFILE_STEP is set, which names
    # its callback): the iterator Megatron-SWIFT's SFT trainer hands to each train_step, through that trainer's
    # identity hook `_replace_data_iterator`, timed on the trainer instance (the batches pass unchanged); and, in the
    # one profiled step, the optimizer's step inside a record_function range (the instance's, put back after it)
    Patch('megatron_data_wait', 'swift.megatron.trainers.base:BaseMegatronTrainer._replace_data_iterator', 'ms-swift',
          'wraps', ('self', 'data_iterator'), 'backends/megatron_profile.py', 'leave SWIFT_VORA_PROFILE_STEP unset '
          '(the default: the callback is not named)', 'tests/test_megatron_profile.py',
          needs=('transformer_engine', )),
    Patch('megatron_profile_optimizer', 'megatron.core.optimizer.optimizer:MegatronOptimizer.step', 'megatron-core',
          'wraps', ('self', ), 'backends/megatron_profile.py', 'leave SWIFT_VORA_PROFILE_STEP unset or 0 (no step '
          'profiled)', 'tests/test_megatron_profile.py'),
    # `megatron sft`: the training DataLoader read across epoch ends (backends/megatron_prefetch.py): the trainer
    # instance's `_prepare_dataloader` wrapped; the DataLoader it returns built again by the trainer's own
    # `_create_dataloader` over the same random batch sampler, read without end, one epoch per `for`
    Patch('megatron_epoch_prefetch', 'swift.megatron.trainers.base:BaseMegatronTrainer._prepare_dataloader',
          'ms-swift', 'wraps', ('self', 'train_dataset', 'val_dataset'), 'backends/megatron_prefetch.py',
          'SWIFT_VORA_MEGATRON_PREFETCH=off', 'tests/test_megatron_prefetch.py',
          uses=('MegatronPretrainingRandomSampler(', 'self._create_dataloader(train_dataset, train_batch_sampler)',
                'return train_dataloader, val_dataloader'), needs=('transformer_engine', )),
    # `megatron sft`, MoE LoRA (SWIFT_VORA_MEGATRON_EXPERT_LORA=grouped_mm): after mcore-bridge's update_layer has built
    # an expert layer's two factors, each replaced by its own generic grouped LoRA module (NpuGroupedLoraLinear, the
    # same weight{i}) with a forward of one torch._grouped_mm (backends/megatron_expert_lora.py)
    Patch('megatron_expert_lora_grouped_mm', 'mcore_bridge.tuners.lora:LoraParallelLinear.update_layer',
          'mcore-bridge', 'wraps', ('self', 'adapter_name', 'r', 'lora_alpha', 'kwargs'),
          'backends/megatron_expert_lora.py', 'SWIFT_VORA_MEGATRON_EXPERT_LORA=te (the default)',
          'tests/test_megatron_expert_lora.py',
          uses=('self.lora_A[adapter_name] = lora_a', 'self.lora_B[adapter_name] = lora_b', 'TEGroupedLinear(',
                'NpuGroupedLoraLinear(', 'self.reset_lora_parameters(adapter_name, init_lora_weights)'),
          needs=('transformer_engine', )),
    # `megatron sft`, MoE LoRA (SWIFT_VORA_MEGATRON_EXPERT_BASE=grouped_mm): after mcore-bridge's update_layer has built
    # an expert layer's LoRA, the layer's frozen base (megatron-core's TE grouped linear) becomes a subclass of its own
    # class whose forward, for frozen weights, is one torch._grouped_mm over the stacked experts
    # (backends/megatron_expert_base.py)
    Patch('megatron_expert_base_grouped_mm', 'mcore_bridge.tuners.lora:LoraParallelLinear.update_layer',
          'mcore-bridge', 'wraps', ('self', 'adapter_name', 'r', 'lora_alpha', 'kwargs'),
          'backends/megatron_expert_base.py', 'SWIFT_VORA_MEGATRON_EXPERT_BASE=te (the default)',
          'tests/test_megatron_expert_base.py',
          uses=('self.base_layer', 'TEGroupedLinear', 'self.is_expert', 'self.is_grouped'),
          needs=('transformer_engine', )),
    # `megatron sft` (SWIFT_VORA_MEGATRON_OPTIMIZER=coalesced): on the trainer's distributed optimizer instance, once
    # built and before its first step, the per-parameter gradient views replaced by one per coalesced run of a
    # gradient buffer (the optimizer's param_groups hold the runs' parameter views; its per-parameter state save and
    # load refused) -- backends/megatron_coalesced_optimizer.py
    Patch('megatron_coalesced_optimizer',
          'megatron.core.optimizer.distrib_optimizer:DistributedOptimizer._copy_model_grads_to_main_grads',
          'megatron-core', 'replaces', ('self', ), 'backends/megatron_coalesced_optimizer.py',
          'SWIFT_VORA_MEGATRON_OPTIMIZER=per_tensor (the default)', 'tests/test_megatron_coalesced_optimizer.py',
          {'0.16.1': 'ffcdecd38d14405a'}),
    # ... and, on the same instances, the gradient norm's list: upstream's per-tensor gradient views, made once in its
    # order with its filters (a norm over the runs adds the squares in another order)
    Patch('megatron_coalesced_optimizer_norm',
          'megatron.core.optimizer.optimizer:MegatronOptimizer.get_main_grads_for_grad_norm', 'megatron-core',
          'replaces', ('self', ), 'backends/megatron_coalesced_optimizer.py',
          'SWIFT_VORA_MEGATRON_OPTIMIZER=per_tensor (the default)', 'tests/test_megatron_coalesced_optimizer.py',
          {'0.16.1': '1c4210d1042432dc'}),
    # Unsloth's grouped-GEMM MoE forward (its cached copy too): three statements rewritten so that each expert LoRA's
    # scaling multiplies the rank-r intermediate, not the expert output (speed/moe_lora_scale.py); unsloth_zoo is
    # installed with the GPU's MoE wheel set only, so on a CPU machine its source is pinned here and read there
    Patch('moe_lora_rank_scale', 'unsloth_zoo.temporary_patches.moe_utils:forward_native_grouped_mm', 'unsloth_zoo',
          'replaces', ('self', 'hidden_states', 'top_k_index', 'top_k_weights'), 'speed/moe_lora_scale.py',
          'SWIFT_VORA_MOE_LORA_SCALE=output (the default)', 'tests/test_moe_lora_scale.py',
          {'2026.10.9': '847af07a72257c2f'},
          uses=('lora_out = lora_out.contiguous()', 'mm1_out = mm1_out + lora_delta * scaling',
                'mm2_out = mm2_out + lora_delta * scaling'), needs=('unsloth_zoo', )),
    # the same forward's down projection: its LoRA folded into the base grouped GEMM along the reduction axis (three
    # statements rewritten, by the same rewriter and against the same pinned source; speed/moe_down_fold.py)
    Patch('moe_down_lora_fold', 'unsloth_zoo.temporary_patches.moe_utils:forward_native_grouped_mm', 'unsloth_zoo',
          'replaces', ('self', 'hidden_states', 'top_k_index', 'top_k_weights'), 'speed/moe_down_fold.py',
          'SWIFT_VORA_MOE_DOWN_LORA=add (the default)', 'tests/test_moe_down_fold.py',
          {'2026.10.9': '847af07a72257c2f'},
          uses=('lora_delta = _grouped_mm_with_backward_fix(lora_out, second_weight, offsets)',
                'mm2_out = mm2_out + lora_delta * scaling', 'inter, offsets, _down_provider, _recompute'),
          needs=('unsloth_zoo', )),
    # the gate-gradient identity's backward (the same module): its fp32 dot product as one fused reduction
    # (speed/moe_gate_grad.py)
    Patch('moe_gate_grad_fused', 'unsloth_zoo.temporary_patches.moe_utils:_MoEGateGradIdentity.backward',
          'unsloth_zoo', 'replaces', ('ctx', 'grad_inter'), 'speed/moe_gate_grad.py',
          'SWIFT_VORA_MOE_GATE_GRAD=eager (the default)', 'tests/test_moe_gate_grad.py',
          {'2026.10.9': '8f9c1d5a82935f32'},
          uses=('dgate = (inter.to(torch.float32) * grad_inter.to(torch.float32)).sum(dim=-1)', ),
          needs=('unsloth_zoo', )),
    # unsloth_zoo's fused-router reader: where it finds no form, the copy Unsloth's compiler generated for the router
    # class, looked up through the class forward's own globals (its generated module claims the modeling module's
    # name, so upstream's sys.modules lookup misses it); the forms and the fused forward stay unsloth_zoo's
    Patch('moe_router_compiled_copy', 'unsloth_zoo.temporary_patches.moe_router_triton:_router_form', 'unsloth_zoo',
          'wraps', ('cls', ), 'speed/moe_router.py', 'UNSLOTH_MOE_FUSED_ROUTER=0 (the default: no fused router)',
          'tests/test_moe_router.py', uses=('sys.modules.get(cls.__module__)', '_body_lines(', '_ROUTER_FORMS.items()'),
          needs=('unsloth_zoo', )),
    # Gated DeltaNet's query and key at their own head count for fla's GVA kernel (one condition rewritten; the forward
    # that runs -- transformers' or Unsloth's generated copy with the same statements; speed/gdn_qk_heads.py)
    *(Patch(f'gdn_qk_grouped_heads_{short}', f'transformers.models.{module}:{cls}.forward', 'transformers', 'replaces',
            GDN_FORWARD_PARAMS, 'speed/gdn_qk_heads.py', 'SWIFT_VORA_GDN_QK_HEADS=repeat (the default)',
            'tests/test_gdn_qk_heads.py', sources,
            uses=('query = query.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)',
                  'torch_chunk_gated_delta_rule(', 'use_precomputed_states and seq_len == 1'))
      for short, module, cls, sources in (
          ('qwen3_5_moe', 'qwen3_5_moe.modeling_qwen3_5_moe', 'Qwen3_5MoeGatedDeltaNet', GDN_FORWARD_SOURCE),
          ('qwen3_5', 'qwen3_5.modeling_qwen3_5', 'Qwen3_5GatedDeltaNet', GDN_FORWARD_SOURCE),
          ('qwen3_next', 'qwen3_next.modeling_qwen3_next', 'Qwen3NextGatedDeltaNet', GDN_NEXT_FORWARD_SOURCE))),
    # the routed-row gather of the same forward: unsloth_zoo's own permutation-undoing autograd function in eager
    # mode too, not only under torch.compile (speed/moe_gather.py)
    Patch('moe_gather_permutation', 'unsloth_zoo.temporary_patches.moe_utils:gather_routed_rows', 'unsloth_zoo',
          'wraps', ('hidden_states', 'sorted_indices', 'top_k'), 'speed/moe_gather.py',
          'SWIFT_VORA_MOE_GATHER=index (the default)', 'tests/test_moe_gather.py',
          uses=('_RoutedRowGather.apply', 'hidden_states[sorted_indices // top_k]'), needs=('unsloth_zoo', )),
)
BY_NAME = {patch.name: patch for patch in PATCHES}


def forward_targets(prefix: str) -> List[Tuple[str, str]]:
    """(module, class) of every inventoried `Class.forward` patch named `prefix*`, in inventory order: the lever
    modules install their patches on these, so the inventory checked by tests/test_patched_upstream.py is the one
    list of what they touch."""
    return [(module, cls) for _, module, cls in forward_patches(prefix)]


def forward_patches(prefix: str) -> List[Tuple[str, str, str]]:
    """(patch name, module, class) of every inventoried `Class.forward` patch named `prefix*`, in inventory order."""
    found = []
    for patch in PATCHES:
        module, qualname = patch.target.split(':')
        if patch.name.startswith(prefix) and qualname.endswith('.forward'):
            found.append((patch.name, module, qualname[:-len('.forward')]))
    return found


# ---------------------------------------------------------------------------------------------------------------
# the marker
# ---------------------------------------------------------------------------------------------------------------
def mark(replacement: Any, name: str, original: Any = None) -> Any:
    """Mark `replacement` as patch `name`'s, replacing `original`; returns it. The one "already patched" marker."""
    if name not in BY_NAME:
        raise KeyError(f'{name}: not a patch of swift_vora/patches.py')
    setattr(replacement, MARKER, (name, original))
    applied(name)
    return replacement


def patched_by(obj: Any) -> Optional[str]:
    """The name of the swift-vora patch that put `obj` there; None for upstream's own code."""
    found = getattr(obj, MARKER, None)
    return found[0] if isinstance(found, tuple) else None


def in_chain(obj: Any, name: str) -> bool:
    """Whether patch `name` is one of the swift-vora replacements stacked on `obj` (two patches may wrap one target)."""
    while True:
        found = getattr(obj, MARKER, None)
        if not isinstance(found, tuple):
            return False
        if found[0] == name:
            return True
        obj = found[1]


def upstream(obj: Any) -> Any:
    """The upstream object behind swift-vora's replacements (and `functools.wraps` wrappers) of `obj`."""
    while True:
        found = getattr(obj, MARKER, None)
        if isinstance(found, tuple) and found[1] is not None:
            obj = found[1]
        elif hasattr(obj, '__wrapped__'):
            obj = obj.__wrapped__
        else:
            return obj


# ---------------------------------------------------------------------------------------------------------------
# checked when applied
# ---------------------------------------------------------------------------------------------------------------
class PatchRefused(RuntimeError):
    """A patch whose policy is `refuse` meets an upstream the inventory does not know."""


_checked: Dict[str, Optional[str]] = {}  # patch name -> why the installed upstream is unknown (None: known)
_applied: Dict[str, int] = {}  # patch name -> how many times it was installed in this process


def installed_version(package: str) -> Optional[str]:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def resolve(target: str) -> Any:
    """The upstream object a target names (`module:Qualified.name`), seen through swift-vora's own patches, as the
    module defines it (`_defined_in`)."""
    module, qualname = target.split(':')
    home = obj = importlib.import_module(module)
    for part in qualname.split('.'):
        owner, obj = obj, upstream(getattr(obj, part))
        if inspect.isclass(owner):
            obj = _defined_in(home, owner, part, obj)
    return obj


def _code_file(obj: Any) -> Optional[str]:
    code = getattr(inspect.unwrap(obj), '__code__', None) if callable(obj) else None
    return os.path.realpath(code.co_filename) if code is not None else None


def _defined_in(module: Any, cls: type, name: str, found: Any) -> Any:
    """`cls.name` as `module`'s own file defines it, where the class the module holds now is not the file's: Unsloth's
    compiler puts a class of its own in the modeling module in place of transformers' (claiming the module's name),
    its `forward` one call of a copy defined in Unsloth's file, and the inventory must check, and a rewrite compare
    against, the definition in the modeling module's source. A method replaced on the file's own class is what it
    is (the inventory reads it, and refuses what it does not know); so is `found` where the file defines no such
    method."""
    home = getattr(module, '__file__', None)
    if home is None or not _replaced_class(home, cls):
        return found
    original = _from_module_source(module, cls.__name__, name)
    return found if original is None else original


def _replaced_class(home: str, cls: type) -> bool:
    """Whether none of the functions `cls` defines itself comes from the file `home` (and it defines some)."""
    files = {_code_file(value) for value in vars(cls).values() if inspect.isfunction(value)}
    return bool(files) and os.path.realpath(home) not in files


def _from_module_source(module: Any, class_name: str, name: str) -> Any:
    """Method `name` of class `class_name` compiled from `module`'s file at its own lines, in the module's globals (so
    that inspect reads its source, signature and decorators there); None where the file defines none."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return None
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                first = min([d.lineno for d in item.decorator_list] + [item.lineno])
                text = ''.join(source.splitlines(keepends=True)[first - 1:item.end_lineno])
                return upstream(compile_at_lines(text, module.__file__, first, vars(module))[name])
    return None


def compile_at_lines(source: str, filename: str, first_line: int, namespace: Dict[str, Any]) -> Dict[str, Any]:
    """`source` (dedented: a method taken out of its class) compiled as lines `first_line`... of `filename` and run
    against `namespace` (a module's globals, so every name it calls resolves as upstream's does); the names it
    defines. The line numbers keep tracebacks and inspect pointing at upstream's own lines."""
    code = compile('\n' * (first_line - 1) + textwrap.dedent(source), filename, 'exec')
    defined: Dict[str, Any] = {}
    exec(code, namespace, defined)
    return defined


def install_in_loaded(name: str, modules: Sequence[str], function: str, make: Callable[[Any], Any],
                      what: str) -> Dict[str, Any]:
    """Patch `name`: `function` of every loaded module of `modules` replaced by `make(module)` (a module already
    patched keeps its replacement), and the other modules of the first one's package that imported an original by
    name pointed at its replacement. Returns {'patched': [...], 'rebound': [...]}, or {'patched': [], 'skipped': why}
    where none of `modules` is loaded (`what` names them) or the installed upstream is not one the inventory knows
    (warned once; upstream's code runs)."""
    loaded = [sys.modules[m] for m in modules if m in sys.modules]
    if not loaded:
        return {'patched': [], 'skipped': f'{what} is not loaded'}
    if not applicable(name):
        return {'patched': [], 'skipped': check(name)}
    replaced: Dict[int, Any] = {}  # id(original) -> its replacement
    for module in loaded:
        if patched_by(getattr(module, function, None)) != name:
            original = getattr(module, function)
            replaced[id(original)] = make(module)
            setattr(module, function, replaced[id(original)])
    package = modules[0].split('.', 1)[0] + '.'
    return {'patched': [m.__name__ for m in loaded],
            'rebound': rebind_importers(package, modules, function, replaced)}


def rebind_importers(prefix: str, skip, function: str, replaced: Dict[int, Any]) -> List[str]:
    """Modules named `prefix*` (but those in `skip`, patched themselves) that imported an original by name (`from
    .moe_utils import forward_native_grouped_mm`) and call it through their own global: bound to its replacement
    (`replaced`: id(original) -> replacement; by identity, nothing else is touched). Returns their names."""
    rebound = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix) or name in skip:
            continue
        bound = getattr(module, function, None)
        if bound is not None and id(bound) in replaced:
            setattr(module, function, replaced[id(bound)])
            rebound.append(name)
    return sorted(rebound)


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def mismatch(patch: Patch) -> Optional[str]:
    """Why the installed upstream is not one `patch` was checked against (None: it is): the target is gone, takes
    other parameters, no longer uses a name our code relies on, or (replaces) has another source than the one its
    equivalence test was written for."""
    installed = installed_version(patch.package)
    # a module the target's module needs and this machine lacks (transformer_engine on a CPU or an Unsloth machine):
    # importing the target would fail halfway, leaving its package half-imported in sys.modules -- where
    # `'swift.megatron' in sys.modules` then reads as "inside megatron sft" (swift_registry.py)
    # (one already imported counts as there, whatever its spec: find_spec raises on a module without one)
    missing = [m for m in patch.needs if m not in sys.modules and importlib.util.find_spec(m) is None]
    if missing:
        return f'{patch.target} needs {", ".join(missing)}, which is not installed'
    try:
        target = resolve(patch.target)
    except (ImportError, AttributeError) as e:
        return f'{patch.target} is not in {patch.package} {installed} ({e})'
    params = tuple(inspect.signature(target).parameters)
    if params != patch.params:
        return f'{patch.target} takes {params}, {patch.where} was written for {patch.params}'
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError) as e:
        return f'the source of {patch.target} cannot be read ({e})'
    missing = [name for name in patch.uses if name not in source]
    if missing:
        return f'{patch.target} no longer uses {", ".join(map(repr, missing))}'
    if patch.kind == 'replaces':
        if installed not in patch.sources:
            return (f'{patch.package} {installed} is not a version {patch.where} was checked against '
                    f'({", ".join(patch.sources)})')
        if source_hash(source) != patch.sources[installed]:
            return f'the source of {patch.target} is not the one {patch.proof} checked'
    return None


def check(name: str) -> Optional[str]:
    """`mismatch` of patch `name`, decided once per process."""
    if name not in _checked:
        _checked[name] = mismatch(BY_NAME[name])
    return _checked[name]


def applicable(name: str) -> bool:
    """Whether patch `name` may be applied in this process. An upstream the inventory does not know gets the
    patch's policy: `skip` returns False after one warning (upstream's code then runs as it is), `refuse` raises
    PatchRefused. Call it right before patching."""
    first = name not in _checked
    why = check(name)
    if why is None:
        return True
    patch = BY_NAME[name]
    installed = installed_version(patch.package)
    if patch.policy == 'refuse':
        raise PatchRefused(f'swift-vora cannot run on {patch.package} {installed}: {patch.name} ({patch.where}) '
                           f'patches {patch.target}, and {why}. Install a version it was checked against, or: '
                           f'{patch.off}')
    if first:
        logger.warning(f'swift-vora: {patch.name} ({patch.where}) is not applied on {patch.package} {installed}: '
                       f'{why}; upstream\'s code runs as it is ({patch.off} says so for good; {patch.proof} checks '
                       f'a new version)')
    return False


def applied(name: str) -> None:
    """Record that patch `name` was installed (once per call site that installs it)."""
    _applied[name] = _applied.get(name, 0) + 1


def report() -> Dict[str, Dict[str, Any]]:
    """Every patch with the installed upstream's version, whether the inventory knows it (and why not), its policy
    and whether it was applied in this process: what fingerprint.json records."""
    out = {}
    for patch in PATCHES:
        why = check(patch.name)
        out[patch.name] = {'package': patch.package, 'version': installed_version(patch.package),
                           'known': why is None, 'policy': patch.policy, 'applied': _applied.get(patch.name, 0) > 0,
                           **({'why': why} if why else {})}
    return out
