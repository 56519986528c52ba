"""From a recipe to the planner's request: the one way a recipe reaches the planner (swift_vora.plan).

- `plan_request(recipe)`: the planner's PlanRequest for a recipe (hardware, tuner, backend, video budget ...).
- `plan_recipe(recipe)`: make_plan on it (reads config.json only; no weights).

The plan then flows on to the launch (`build_launch(plan, recipe)`), never back: nothing here turns a plan or a
request into a recipe.
"""
from __future__ import annotations

import re
from typing import Optional

from ..plan import constants as C
from ..plan.hardware import resolve
from ..plan.request import Plan, PlanRequest
from ..plan.select import make_plan
from ..plan.video_budget import budget_sample
from .common import video_budget
from .recipe import Recipe

ATTENTION_LEAVES = {'q_proj', 'k_proj', 'v_proj', 'o_proj', 'in_proj_qkv', 'in_proj_z', 'out_proj'}


def _lora_targets(recipe: Recipe) -> str:
    """The planner's coarse LoRA-target classes from the recipe's module list (an upper bound when unsure)."""
    targets = recipe['train.target_modules']
    if targets == 'attention' or (isinstance(targets, list) and set(targets) <= ATTENTION_LEAVES):
        return 'attention'
    return 'all-linear'


# the plan command's hardware flags and the recipe keys they stand for (the planner's words name the flags)
_HARDWARE_FLAGS = {'hardware': 'hardware', 'gpus': 'gpus', 'gpu-mem-gib': 'gpu_mem_gib', 'host-ram-gib': 'host_ram_gib',
                   'nodes': 'nodes'}
_FLAG = re.compile(r'--(' + '|'.join(_HARDWARE_FLAGS) + r')\b( (?=[A-Z0-9]))?')


def in_recipe_words(text: str) -> str:
    """The planner's hardware advice as a recipe says it: `give --gpus N with --hardware 3090x1` -> `give gpus: N
    with hardware: 3090x1` (`train` takes the recipe's keys, not `plan`'s flags)."""
    return _FLAG.sub(lambda m: _HARDWARE_FLAGS[m.group(1)] + (': ' if m.group(2) else ''), text)


def plan_request(recipe: Recipe) -> PlanRequest:
    try:
        hardware = resolve(recipe['hardware'], recipe['gpus'], recipe['gpu_mem_gib'], recipe['host_ram_gib'],
                           recipe['nodes'])
    except KeyError as e:  # an unknown profile: KeyError's message is its one argument
        raise KeyError(in_recipe_words(str(e.args[0]) if e.args else str(e))) from None
    except ValueError as e:
        raise ValueError(in_recipe_words(str(e))) from None
    hardware.host_ram_source = in_recipe_words(hardware.host_ram_source)
    hardware.notes = [in_recipe_words(n) for n in hardware.notes]
    budget = video_budget(recipe)
    clip = float(recipe['data.window'] or C.DEFAULT_CLIP_SECONDS)  # None: the dataset's default window
    frames, pair_tokens = budget_sample(budget, clip)  # min/max frames and max_video_tokens as the template applies
    return PlanRequest(
        model=recipe['model.path'], hardware=hardware, tuner=recipe['train.tuner'], backend=recipe['train.backend'],
        offload=recipe['deepspeed.offload'] or 'none', quant=recipe['train.quantization'], ep=recipe['megatron.ep'],
        tp=recipe['megatron.tp'],
        micro_batch=recipe['train.micro_batch'], fps=float(budget.fps), max_frames=frames,
        min_frames=min(int(budget.min_frames), frames),
        pack_length=recipe['data.max_length'] if recipe['train.packing'] == 'dataset' else None,
        max_length=recipe['data.max_length'],
        frame_tokens=pair_tokens, clip_seconds=clip, lora_rank=recipe['train.lora_rank'],
        lora_targets=_lora_targets(recipe), nodes=recipe['nodes'],
        gradient_checkpointing=recipe['train.gradient_checkpointing'], checkpoints=unsloth_checkpoints(recipe),
        checkpoint_layers=recipe['train.checkpoint_layers'],
        compile=recipe['train.compile'], fp8=recipe['train.fp8'], samples_per_epoch=samples_per_epoch(recipe),
        cross_entropy=recipe['megatron.cross_entropy_fusion_impl'], recompute=recipe['megatron.recompute'],
        min_pair_tokens=int(budget.min_pair_tokens), search=searched(recipe),
        global_batch=recipe['megatron.global_batch'])


# The recipe keys that fix each setting the planner would otherwise search (plan/request.py SEARCHABLE)
FIXED_BY = {
    'micro_batch': ('train.micro_batch', ),
    'checkpoint_layers': ('train.checkpoint_layers', ),
    'offload': ('deepspeed.offload', ),
    'video_budget': ('video.max_frames', 'video.pair_tokens', 'video.max_video_tokens'),
}


def searched(recipe: Recipe) -> tuple:
    """The settings the recipe leaves to the planner: those whose keys it does not set (`deepspeed.offload: null`
    is unset too). A recipe that sets a key keeps it, and the plan says so."""
    free = []
    for setting, keys in FIXED_BY.items():
        if setting == 'offload' and recipe['deepspeed.offload'] is None:
            free.append(setting)
        elif setting != 'offload' and not any(k in recipe.given for k in keys):
            free.append(setting)
    return tuple(free)


def samples_per_epoch(recipe: Recipe) -> Optional[int]:
    """The windowed samples of the recipe's datasets (for the plan's hours per epoch); None when one of them is not
    a local file (a hub id) or cannot be read."""
    from ..data.windowing import WindowConfig
    from ..dataset import count_samples
    entries = recipe['data.dataset']
    default = WindowConfig()  # a key the recipe leaves unset is the dataset's default, as the launch sets it
    config = WindowConfig(**{k: default.__dict__[k] if recipe[f'data.{k}'] is None else recipe[f'data.{k}']
                             for k in ('window', 'stride', 'min_event')})
    total = 0
    for entry in [entries] if isinstance(entries, str) else list(entries):
        n = count_samples(entry.split('#', 1)[0], config, recipe['data.video_root'])
        if n is None:
            return None
        total += n
    return total


def unsloth_checkpoints(recipe: Recipe) -> str:
    """The planner's `checkpoints` for the recipe's unsloth.gradient_checkpointing (auto | true | unsloth | false):
    'auto', 'gpu' or 'host'. false (no checkpointing) is planned as 'gpu', the nearest the memory model has."""
    return {'auto': 'auto', 'unsloth': 'host'}.get(recipe['unsloth.gradient_checkpointing'], 'gpu')


def plan_recipe(recipe: Recipe) -> Plan:
    request = plan_request(recipe)
    return make_plan(request, hardware=request.hardware)
