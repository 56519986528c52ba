"""The `command` field of a plan: what `swift-vora train` would run for it.

This is a small, replaceable seam. The default builders below write a plausible ms-swift / Megatron-SWIFT argv
from the plan's inputs; the backends engineer (swift_vora/backends/) replaces them with the real recipe logic:

    from swift_vora.plan import command
    command.register_command_builder('deepspeed_zero3', my_builder)   # my_builder(request, plan) -> list[str]

A builder gets the `PlanRequest` and the finished `Plan` (backend, ep, tp, tuner, offload, lora_rank, model
summary, tokens) and returns an argv list. Environment variables go first through `env` (`['env', 'A=1', 'swift',
...]`) so the list is directly executable. `build_command` returns [] for refused plans.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Dict, List

if TYPE_CHECKING:  # pragma: no cover
    from .select import Plan, PlanRequest

CommandBuilder = Callable[['PlanRequest', 'Plan'], List[str]]
_BUILDERS: Dict[str, CommandBuilder] = {}


def register_command_builder(backend: str, fn: CommandBuilder) -> None:
    """Replace the command builder of one backend (e.g. from swift_vora.backends at import time)."""
    _BUILDERS[backend] = fn


def build_command(request: 'PlanRequest', plan: 'Plan') -> List[str]:
    if plan.verdict == 'refused' or not plan.backend:
        return []
    fn = _BUILDERS.get(plan.backend, _default_builder)
    return [str(a) for a in fn(request, plan)]


def _env(request: 'PlanRequest', plan: 'Plan') -> List[str]:
    env = []
    nproc = plan.num_gpus
    if nproc > 1 or plan.backend in ('deepspeed_zero2', 'deepspeed_zero3', 'megatron_ep_lora'):
        env.append(f'NPROC_PER_NODE={nproc}')
    if plan.nodes > 1:
        env += [f'NNODES={plan.nodes}', 'NODE_RANK=${NODE_RANK}', 'MASTER_ADDR=${MASTER_ADDR}']
    t = plan.tokens or {}
    if t.get('frames'):  # the video_ora template's budget, under the names the recipes and `plan` use
        env += [f'SWIFT_VORA_FPS={t["fps"]:g}', f'SWIFT_VORA_MAX_FRAMES={request.max_frames}',
                f'SWIFT_VORA_PAIR_TOKENS={t["tokens_per_group"]}', f'SWIFT_VORA_WINDOW={t["clip_seconds"]:g}']
    if plan.backend == 'unsloth_split_lora':
        env += ['UNSLOTH_DISABLE_STATISTICS=1']
    return ['env'] + env if env else []


def _common(request: 'PlanRequest', plan: 'Plan') -> List[str]:
    model_type = (plan.model or {}).get('model_type', '')
    model = request.model
    if str(model).endswith('.json'):  # a config.json was planned; swift loads the directory that holds it
        model = os.path.dirname(os.path.abspath(model))
    a = ['--model', model, '--model_type', model_type, '--custom_register_path', 'swift_vora',
         '--template', 'video_ora', '--dataset', 'video_ora', '--torch_dtype', 'bfloat16']
    return a


def _tuner_args(request: 'PlanRequest', plan: 'Plan', megatron: bool = False) -> List[str]:
    if plan.tuner == 'lora':
        a = ['--tuner_type', 'lora', '--lora_rank', str(plan.lora_rank), '--lora_alpha', str(2 * plan.lora_rank)]
        targets = request.lora_targets
        if megatron:
            a += ['--target_modules', 'all-linear']
        elif targets == 'attention':
            a += ['--target_modules', 'q_proj', 'k_proj', 'v_proj', 'o_proj']
        else:
            a += ['--target_modules', 'all-linear']
            if targets == 'all-linear' and (plan.model or {}).get('kind') == 'moe':
                # fused 3-D expert tensors are nn.Parameters: PEFT reaches them through target_parameters
                a += ['--target_parameters', 'mlp.experts.gate_up_proj', 'mlp.experts.down_proj']
        if request.quant == '4bit':
            a += ['--quant_method', 'bnb', '--quant_bits', '4']
        return a
    if plan.tuner == 'full':
        return ['--tuner_type', 'full']
    # selective: freeze everything, then unfreeze attention (full and linear) and the shared experts
    return ['--tuner_type', 'full', '--freeze_parameters_ratio', '1', '--trainable_parameters_regex',
            r'.*\.(self_attn|linear_attn|shared_expert|shared_expert_gate)\..*']


def _default_builder(request: 'PlanRequest', plan: 'Plan') -> List[str]:
    b = plan.backend
    if b == 'megatron_ep_lora':
        argv = _env(request, plan) + ['megatron', 'sft'] + _common(request, plan) + _tuner_args(request, plan, True)
        argv += ['--tensor_model_parallel_size', str(plan.tp), '--expert_model_parallel_size', str(plan.ep),
                 '--sequence_parallel', 'true' if plan.tp > 1 else 'false', '--moe_grouped_gemm', 'true',
                 '--recompute_granularity', 'full', '--recompute_method', 'uniform', '--recompute_num_layers', '1',
                 '--micro_batch_size', str(plan.micro_batch)]
        return argv
    argv = _env(request, plan) + ['swift', 'sft'] + _common(request, plan) + _tuner_args(request, plan)
    argv += ['--gradient_checkpointing', 'true', '--per_device_train_batch_size', str(plan.micro_batch)]
    if b == 'deepspeed_zero3':
        argv += ['--deepspeed', 'zero3_offload' if plan.offload == 'cpu' else 'zero3']
    elif b == 'deepspeed_zero2':
        argv += ['--deepspeed', 'zero2_offload' if plan.offload == 'cpu' else 'zero2']
        if plan.offload == 'cpu':
            # forked DataLoader workers + pinned offload buffers blow up host RAM (copy-on-write); keep them few
            argv += ['--dataloader_num_workers', '2']
    elif b == 'unsloth_split_lora':
        argv += ['--tuner_backend', 'unsloth']
    return argv
