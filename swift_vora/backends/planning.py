"""The seam between the planner (swift_vora.plan) and the backends.

- `plan_request(recipe)`: the planner's PlanRequest for a recipe (hardware, tuner, backend, video budget ...).
- `plan_recipe(recipe)`: make_plan on it (reads config.json only; no weights).
- `plan_command(request, plan)`: the planner's `command` field, from `build_launch`, so `swift-vora plan` prints
  what `swift-vora train` would run (with a stand-in dataset, since `plan` has none).
"""
from __future__ import annotations

from typing import Any, List

from .recipe import Recipe, recipe_from_dict

PLAN_DATASET_PLACEHOLDER = 'ANNOTATIONS.jsonl'
ATTENTION_LEAVES = {'q_proj', 'k_proj', 'v_proj', 'o_proj', 'in_proj_qkv', 'in_proj_z', 'out_proj'}


def _lora_targets(recipe: Recipe) -> str:
    """The planner's coarse LoRA-target classes from the recipe's module list (an upper bound when unsure)."""
    targets = recipe['train.target_modules']
    if targets == 'attention' or (isinstance(targets, list) and set(targets) <= ATTENTION_LEAVES):
        return 'attention'
    return 'all-linear'


def plan_request(recipe: Recipe):
    from ..plan import PlanRequest
    from ..plan import constants as C
    from ..plan.hardware import resolve
    from ..plan.video_budget import budget_sample
    from .common import video_budget
    hardware = resolve(recipe['hardware'], recipe['gpus'], recipe['gpu_mem_gib'], recipe['host_ram_gib'],
                       recipe['nodes'])
    budget = video_budget(recipe)
    clip = float(recipe['data.window'] or C.DEFAULT_CLIP_SECONDS)  # None: the dataset's default window
    frames, pair_tokens = budget_sample(budget, clip)  # min/max frames and max_video_tokens as the template applies
    return PlanRequest(
        model=recipe['model.path'], hardware=hardware, tuner=recipe['train.tuner'], backend=recipe['train.backend'],
        offload=recipe['deepspeed.offload'] or 'none', quant=recipe['train.quantization'], ep=recipe['megatron.ep'],
        tp=recipe['megatron.tp'],
        micro_batch=recipe['train.micro_batch'], fps=float(budget.fps), max_frames=frames,
        pack_length=recipe['data.max_length'] if recipe['train.packing'] == 'dataset' else None,
        frame_tokens=pair_tokens, clip_seconds=clip, lora_rank=recipe['train.lora_rank'],
        lora_targets=_lora_targets(recipe), nodes=recipe['nodes'],
        gradient_checkpointing=recipe['train.gradient_checkpointing'], checkpoints=unsloth_checkpoints(recipe),
        compile=recipe['train.compile'])


def unsloth_checkpoints(recipe: Recipe) -> str:
    """The planner's `checkpoints` for the recipe's unsloth.gradient_checkpointing (auto | true | unsloth | false):
    'auto', 'gpu' or 'host'. false (no checkpointing) is planned as 'gpu', the nearest the memory model has."""
    return {'auto': 'auto', 'unsloth': 'host'}.get(recipe['unsloth.gradient_checkpointing'], 'gpu')


def plan_recipe(recipe: Recipe):
    from ..plan import make_plan
    request = plan_request(recipe)
    return make_plan(request, hardware=request.hardware)


def recipe_for_request(request: Any, plan: Any) -> Recipe:
    """A recipe equivalent to a bare `plan` request (used to print the plan's command)."""
    hw = plan.hardware or {}
    doc = {
        'gpus': int(hw.get('num_gpus') or plan.num_gpus or 1), 'gpu_mem_gib': float(hw.get('gpu_mem_gib') or 1.0),
        'nodes': int(plan.nodes or 1),
        'model': {'path': request.model[:-len('/config.json')] if request.model.endswith('/config.json')
                  else request.model},
        'data': {'dataset': PLAN_DATASET_PLACEHOLDER, 'window': float(request.clip_seconds),
                 **({'max_length': int(request.pack_length)} if request.pack_length else {})},
        'video': {'fps': float(request.fps), 'max_frames': int(request.max_frames),
                  'pair_tokens': int(request.frame_tokens)},
        'train': {'backend': plan.backend, 'tuner': plan.tuner, 'quantization': plan.quant,
                  'lora_rank': int(plan.lora_rank), 'micro_batch': int(plan.micro_batch),
                  'target_modules': 'attention' if plan.lora_targets == 'attention' else 'all-linear',
                  'gradient_checkpointing': bool(request.gradient_checkpointing), 'compile': request.compile,
                  **({'packing': 'dataset'} if request.pack_length else {})},
        'deepspeed': {'offload': plan.offload},
        'megatron': {'ep': int(plan.ep), 'tp': int(plan.tp)},
    }
    return recipe_from_dict(doc, where='<plan request>')


def command_argv(launch) -> List[str]:
    """`env K=V ... argv`: a directly executable list, the shape the planner's `command` field uses."""
    env = [f'{k}={v}' for k, v in sorted(launch.env.items())]
    return (['env', *env] if env else []) + list(launch.argv)


def plan_command(request: Any, plan: Any) -> List[str]:
    """The command `train` would run for a bare `plan` request; CommandRefused when the launcher would not run it."""
    from ..plan.command import CommandRefused
    from .common import LaunchRefused
    from .launch import build_launch
    try:
        launch = build_launch(plan, recipe_for_request(request, plan), environ={})
    except LaunchRefused as exc:
        raise CommandRefused(exc.reasons) from None
    except ValueError as exc:  # LaunchUsageError included: `train` would stop on this request too
        raise CommandRefused([f'swift-vora train would not launch this: {exc}']) from None
    return command_argv(launch)
