"""Dense models through `swift sft`: plain (ddp / one GPU) or DeepSpeed ZeRO-2/3, with a generated JSON.

The JSON starts from ms-swift 4.6's own presets (swift/config/zero2.json, zero3.json, *_offload.json) and keeps
their "auto" values wherever the transformers DeepSpeed integration fills them from the training arguments
(batch sizes, accumulation, clipping, fp16/bf16) or from the model (bucket sizes from hidden_size). Where the
plan's GPUs are small (<= 16 GiB, e.g. 12 GB RTX 3060s) it uses the configuration that worked in the field:

    stage 3, overlap_comm false, contiguous_gradients true, reduce_bucket_size = stage3_prefetch_bucket_size = 5e6,
    stage3_param_persistence_threshold 1e4, stage3_max_live_parameters = stage3_max_reuse_distance = 1e8,
    stage3_gather_16bit_weights_on_model_save true, bf16 "auto"

Small buckets and a 1e8 live-parameter cap bound the gathered working set (swift's preset allows 1e9 live
parameters = 2 GB of bf16 gathered weights, too much next to activations on a 12 GB card); offload variants
use pin_memory false (pinned host buffers are what blew host RAM up in the field) and sub_group_size 1e8.

Weights load through the upstream path: ms-swift -> transformers `from_pretrained` under DeepSpeed's
`zero.Init` (HfDeepSpeedConfig is set by the HF Trainer arguments before the model is built); no custom loader.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, Mapping, Optional

from ..plan import constants as C
from ..plan.backend import DEEPSPEED, Backend
from .base import Launch, Launcher, LaunchUsageError, PlanView
from .common import bool_arg, common_env, console_script, engine_argument_parser, lora_args, swift_common_args
from .packing import swift_sft_packing_args
from .recipe import Recipe, learning_rate

SMALL_GPU_GIB = C.ZERO3_SMALL_GPU_GIB  # at or below: the field-tested 12 GB configuration

# The values the transformers integration fills ("auto"): see transformers.integrations.deepspeed
# HfTrainerDeepSpeedConfig.trainer_config_process / trainer_config_finalize.
_TOP_LEVEL = {
    'fp16': {'enabled': 'auto', 'loss_scale': 0, 'loss_scale_window': 1000, 'initial_scale_power': 16,
             'hysteresis': 2, 'min_loss_scale': 1},
    'bf16': {'enabled': 'auto'},
    'gradient_accumulation_steps': 'auto',
    'gradient_clipping': 'auto',
    'steps_per_print': 2000,
    'train_batch_size': 'auto',
    'train_micro_batch_size_per_gpu': 'auto',
    'wall_clock_breakdown': False,
}

# swift/config/zero3.json's zero_optimization (ms-swift 4.6.0), for GPUs above SMALL_GPU_GIB.
ZERO3_SWIFT = {
    'stage': 3,
    'offload_optimizer': {'device': 'none', 'pin_memory': True},
    'offload_param': {'device': 'none', 'pin_memory': True},
    'overlap_comm': False,
    'contiguous_gradients': True,
    'sub_group_size': 1e9,
    'reduce_bucket_size': 'auto',
    'zero_quantized_weights': False,
    'zero_quantized_gradients': False,
    'stage3_prefetch_bucket_size': 'auto',
    'stage3_param_persistence_threshold': 'auto',
    'stage3_max_live_parameters': C.ZERO3_MAX_LIVE_PARAMS,  # 1e9, as in swift's preset; the planner reads it
    'stage3_max_reuse_distance': 1e9,
    'stage3_gather_16bit_weights_on_model_save': True,
}
# The configuration that trained on 4 x 12 GB RTX 3060 in the field.
ZERO3_SMALL_GPU = {
    'stage': 3,
    'offload_optimizer': {'device': 'none', 'pin_memory': False},
    'offload_param': {'device': 'none', 'pin_memory': False},
    'overlap_comm': False,
    'contiguous_gradients': True,
    'sub_group_size': 1e9,
    'reduce_bucket_size': 5e6,
    'stage3_prefetch_bucket_size': 5e6,
    'stage3_param_persistence_threshold': 1e4,
    'stage3_max_live_parameters': C.ZERO3_MAX_LIVE_PARAMS_SMALL_GPU,  # 1e8; the planner models the same value
    'stage3_max_reuse_distance': 1e8,
    'stage3_gather_16bit_weights_on_model_save': True,
}
# swift/config/zero2.json's zero_optimization.
ZERO2_SWIFT = {
    'stage': 2,
    'offload_optimizer': {'device': 'none', 'pin_memory': True},
    'allgather_partitions': True,
    'allgather_bucket_size': 2e8,
    'overlap_comm': False,
    'reduce_scatter': True,
    'reduce_bucket_size': 2e8,
    'contiguous_gradients': True,
}
OFFLOAD_SUB_GROUP_SIZE = 1e8


def zero_config(stage: int, offload: str = 'none', gpu_mem_gib: Optional[float] = None,
                overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The DeepSpeed JSON for ZeRO `stage` (2 or 3); offload 'cpu' moves optimizer states (and, for ZeRO-3,
    parameters) to host RAM with unpinned buffers. `overrides` are merged over zero_optimization (the launcher
    refuses a `stage` override that disagrees with the planned backend)."""
    if stage == 3:
        small = gpu_mem_gib is not None and gpu_mem_gib <= SMALL_GPU_GIB
        zero = copy.deepcopy(ZERO3_SMALL_GPU if small else ZERO3_SWIFT)
    elif stage == 2:
        zero = copy.deepcopy(ZERO2_SWIFT)
    else:
        raise ValueError(f'ZeRO stage {stage}: only 2 and 3 are generated')
    if offload == 'cpu':
        zero['offload_optimizer'] = {'device': 'cpu', 'pin_memory': False}
        if stage == 3:
            zero['offload_param'] = {'device': 'cpu', 'pin_memory': False}
            zero['sub_group_size'] = OFFLOAD_SUB_GROUP_SIZE
    elif offload not in ('none', None):
        raise ValueError(f'offload {offload!r}: none | cpu')
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(zero.get(key), dict):
            zero[key] = {**zero[key], **value}
        else:
            zero[key] = value
    config = copy.deepcopy(_TOP_LEVEL)
    config['zero_optimization'] = zero
    return config


def zero_config_json(config: Dict[str, Any]) -> str:
    return json.dumps(config, indent=2) + '\n'


def launch_dir(recipe: Recipe) -> str:
    """Where generated files go: a fixed folder inside the run's output_dir."""
    return os.path.join(recipe['train.output_dir'], 'swift-vora-launch')


def build_swift_sft_launch(view: PlanView, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
    env = common_env(recipe, view, environ)
    argv = [console_script('swift'), 'sft', *swift_common_args(recipe, view), *lora_args(recipe)]
    dtype = recipe['train.dtype']
    argv += ['--torch_dtype', dtype]
    if dtype == 'float32':  # CPU: swift turns fp16 on even for float32 unless told otherwise
        argv += ['--fp16', 'false', '--bf16', 'false']
    elif dtype == 'bfloat16':
        argv += ['--bf16', 'true']
    grad_accum = recipe['train.grad_accum']
    if grad_accum is None:
        grad_accum = max(1, 16 // max(1, view.world * view.micro_batch))
    argv += ['--num_train_epochs', f'{recipe["train.epochs"]:g}', '--per_device_train_batch_size',
             str(view.micro_batch), '--gradient_accumulation_steps', str(grad_accum), '--learning_rate',
             f'{learning_rate(recipe):g}', '--warmup_ratio', f'{recipe["train.warmup_ratio"]:g}',
             '--gradient_checkpointing', bool_arg(recipe['train.gradient_checkpointing']), '--freeze_vit',
             bool_arg(recipe['train.freeze_vit'])]
    if recipe['train.max_steps'] is not None:
        argv += ['--max_steps', str(recipe['train.max_steps'])]
    argv += swift_sft_packing_args(recipe, view)
    if recipe['train.liger_kernel']:
        argv += ['--use_liger_kernel', 'true']
    files: Dict[str, str] = {}
    notes = []
    uses_deepspeed = view.backend in DEEPSPEED
    if recipe['train.compile'] != 'off':
        env['SWIFT_VORA_COMPILE'] = recipe['train.compile']
        if uses_deepspeed:
            notes.append(f'train.compile={recipe["train.compile"]} is not applied under DeepSpeed ({view.backend}): '
                         'the layers run uncompiled (the plugin logs it); train.backend=ddp compiles them')
        if recipe['train.liger_kernel']:
            notes.append('train.compile with train.liger_kernel: Liger\'s kernels break the compiled layers into '
                         'many graphs, measured slower than the compiled layers without Liger (docs/benchmarks.md); '
                         'choose one')
    if recipe['train.fp8'] != 'off':  # the plan refused it where it cannot run (plan/rules.py)
        env['SWIFT_VORA_FP8'] = recipe['train.fp8']
    argv += ['--dataloader_num_workers', str(recipe['train.dataloader_workers']), '--save_steps',
             str(recipe['train.save_steps']), '--logging_steps', str(recipe['train.logging_steps']), '--output_dir',
             recipe['train.output_dir'], '--add_version', bool_arg(recipe['train.add_version']), '--seed',
             str(recipe['train.seed']), '--report_to', 'none']
    if uses_deepspeed:
        stage = 3 if view.backend == Backend.DEEPSPEED_ZERO3 else 2
        offload = recipe['deepspeed.offload'] or view.offload
        config = zero_config(stage, offload, view.gpu_mem_gib, recipe['deepspeed.zero_optimization'])
        if config['zero_optimization']['stage'] != stage and not view.is_moe:  # MoE: refused below (stage 3)
            raise LaunchUsageError(f'deepspeed.zero_optimization.stage={config["zero_optimization"]["stage"]}: the '
                                   f'stage comes from train.backend ({view.backend} was planned); change the backend')
        path = os.path.join(launch_dir(recipe), f'deepspeed_zero{stage}{"_offload" if offload == "cpu" else ""}.json')
        files[path] = zero_config_json(config)
        argv += ['--deepspeed', path]
        if offload == 'cpu' and recipe['train.dataloader_workers'] > 2:
            notes.append('offload with forked DataLoader workers can blow host RAM up (copy-on-write); '
                         'consider train.dataloader_workers<=2')
    elif recipe['deepspeed.zero_optimization']:
        raise LaunchUsageError(f'{recipe.path}: deepspeed.zero_optimization is set but the backend is {view.backend}')
    if recipe['guards.callbacks']:
        argv += ['--callbacks', *recipe['guards.callbacks']]
    argv += recipe['extra_args']
    return Launch(argv=argv, env=env, files=files, notes=notes)


class SwiftSft(Launcher):
    """ddp and DeepSpeed ZeRO-2/3: `swift sft`, with a generated DeepSpeed JSON for the ZeRO stages."""
    backends = (Backend.DDP, *DEEPSPEED)
    engine = 'swift sft'
    quantization = True

    def build(self, view: PlanView, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
        return build_swift_sft_launch(view, recipe, environ)

    def argument_parser(self):
        from swift.arguments import SftArguments
        return engine_argument_parser(SftArguments)
