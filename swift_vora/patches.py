"""Every upstream internal swift-vora patches, in one inventory: what, where, how to turn it off, what proves it.

swift-vora changes the behaviour of ms-swift, transformers, PEFT, torch and decord at a few narrow points (no
public hook exists for them). Each point is a `Patch` below: the target (`module:qualified.name`), how it is
changed (`wraps`: our code runs around the original, which still runs; `replaces`: our code runs instead of the
original's body and must stay equivalent to it; `sets`: a flag the original reads), the parameters our code
relies on, the swift-vora module that does it, how a user turns it off, and the test that shows the patched
behaviour is the same.

tests/test_patched_upstream.py checks every target against the installed packages: the target must exist with
these parameters, and for `replaces` patches the original's source must be the one checked by the equivalence
test (its hash, per tested version). An upgrade of ms-swift, transformers, PEFT, torch or decord that moves or
changes a target therefore fails that test, naming the patch, instead of silently running swift-vora's copy of
code that no longer matches.

Importing this module imports nothing else.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Tuple

VIT_ATTENTION_PARAMS = ('self', 'hidden_states', 'cu_seqlens', 'position_embeddings', 'max_seqlen', 'kwargs')
VIT_ATTENTION_SOURCE = {'5.19.0': '2afc2f9fa3ebd677'}  # the four classes share one forward's source
DEEPSTACK_PARAMS = ('self', 'hidden_states', 'visual_pos_masks', 'visual_embeds')
DEEPSTACK_SOURCE = {'5.19.0': '07178743d3d5ebc3'}
# torch's two-line Conv3d.forward, the same in the local wheel and the H200 image (printed there in run 16)
CONV3D_FORWARD_SOURCE = {version: '91cbbd182f3c8657' for version in ('2.14.1', '2.11.0', '2.11.0+cu130')}


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


PATCHES = (
    Patch('plugin_loader', 'swift.utils.utils:import_external_file', 'ms-swift', 'wraps', ('file_path', ),
          '_swift_vora_hook.py', 'pass `--custom_register_path` a .py file (handed to ms-swift unchanged), or remove '
          'swift_vora_plugin_path.pth from site-packages', 'tests/test_plugin_hook.py',
          uses=('_external_files', )),
    Patch('annotation_datasets', 'swift.dataset.dataset_syntax:DatasetSyntax.get_dataset_meta', 'ms-swift', 'wraps',
          ('self', 'use_hf'), 'dataset.py', 'only files that hold Video-ORA annotations are rerouted; give ms-swift '
          'rows instead', 'tests/test_swift_e2e.py'),
    Patch('default_callbacks', 'swift.trainers.mixin:SwiftMixin._get_callbacks', 'ms-swift', 'wraps',
          ('self', 'args'), 'swift_registry.py', 'SWIFT_VORA_GUARDS=none and the levers\' switches off: nothing '
          'is appended', 'tests/test_guards_registry.py'),
    Patch('sft_padding_free_check', 'swift.arguments.sft_args:SftArguments._check_padding_free', 'ms-swift', 'wraps',
          ('self', ), 'speed/packed_attention.py', 'SWIFT_VORA_PACKED_ATTENTION=0', 'tests/test_packed_attention.py',
          uses=('self.attn_impl', 'self.packing')),
    Patch('guard_tap_training_step', 'transformers:Trainer.training_step', 'transformers', 'wraps',
          ('self', 'model', 'inputs', 'num_items_in_batch'), 'guards/common.py', 'SWIFT_VORA_GUARDS=none',
          'tests/test_guards_coverage.py'),
    Patch('guard_tap_dataset', 'swift.dataset:LazyLLMDataset.__init__', 'ms-swift', 'wraps',
          ('self', 'dataset', 'encode_func', 'n_try_fetch', 'strict', 'random_state', 'traceback_limit'),
          'guards/common.py', 'SWIFT_VORA_GUARDS=none', 'tests/test_guards_coverage.py',
          uses=('self.dataset', 'self.encode_func')),
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
          'tests/test_compile_vision.py', {'5.19.0': '681e62f9206787af'}),
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
          {'5.19.0': 'ffd8b0eb8cf7c98b'}),
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
)


def forward_targets(prefix: str) -> List[Tuple[str, str]]:
    """(module, class) of every inventoried `Class.forward` patch named `prefix*`, in inventory order: the lever
    modules install their patches on these, so the inventory checked by tests/test_patched_upstream.py is the one
    list of what they touch."""
    found = []
    for patch in PATCHES:
        module, qualname = patch.target.split(':')
        if patch.name.startswith(prefix) and qualname.endswith('.forward'):
            found.append((module, qualname[:-len('.forward')]))
    return found
