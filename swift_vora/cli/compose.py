"""Where the plan meets the launch: the command a plan prints is the launch its backend builds.

    recipe -> PlanRequest -> Plan (swift_vora.plan: pure) -> Launch (swift_vora.backends) -> process

`swift-vora plan` (with a recipe made from its flags) and `swift-vora train` (with the user's recipe) both come
through `launch_plan` once. The plan flows into the launch and never back: the planner builds no command, and no
recipe is rebuilt from a plan. An alternative of a plan is launched as `train` would launch it: the same recipe
with the alternative's overrides (`alternative_overrides`, which `train` also prints as `fits_with_overrides`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..backends.base import Launch, LaunchRefused
from ..backends.launch import LAUNCHERS, build_launch
from ..backends.recipe import Recipe
from ..plan.fit import PARTIAL_CHECKPOINT_BACKENDS
from ..plan.memory import MEGATRON_BACKENDS
from ..plan.request import Plan, alternative_plan


def launch_plan(plan: Plan, recipe: Recipe,
                environ: Optional[Mapping[str, str]] = None) -> Tuple[Plan, Optional[Launch]]:
    """(the plan as printed, the launch that trains it; None when it has none).

    The plan's `command` and each alternative's are their launches'. A launch the backend refuses makes the plan
    "refused" with the backend's reasons, so that `plan` and `train` never disagree. LaunchUsageError: the recipe
    cannot be launched as written."""
    plan = with_alternative_commands(plan, recipe, environ)
    if not has_launch(plan):
        return plan, None
    if not any(plan.backend in launcher.backends for launcher in LAUNCHERS):  # planned, but nothing here runs it
        if plan.verdict != 'fits':
            return plan, None
        return refused(plan, [f'this swift-vora has no launcher for {plan.backend} yet']), None
    try:
        launch = build_launch(plan, recipe.with_overrides(chosen_overrides(plan, recipe)), environ)
    except LaunchRefused as exc:
        return refused(plan, exc.reasons), None
    return replace(plan, command=launch.command()), launch


def chosen_overrides(plan: Plan, recipe: Recipe) -> List[str]:
    """The settings the plan's search chose where the recipe left them free (plan/search.py: micro-batch,
    checkpointed layers, offload, a lowered video budget), as `key=value` overrides of the recipe: the launch trains
    what the plan planned. [] when nothing was searched or the recipe already says the same."""
    chosen = (plan.search or {}).get('chosen') or {}
    keys = {'micro_batch': 'train.micro_batch', 'checkpoint_layers': 'train.checkpoint_layers',
            'offload': 'deepspeed.offload', 'max_frames': 'video.max_frames', 'pair_tokens': 'video.pair_tokens'}
    out = []
    for setting, key in keys.items():
        if setting not in chosen:
            continue
        value = chosen[setting]
        if setting == 'offload' and value == 'none' and recipe[key] in (None, 'none'):
            continue
        if recipe[key] != value:
            out.append(f'{key}={"null" if value is None else value}')
    return out


def has_launch(plan: Plan) -> bool:
    """Whether `plan` is one to launch: not refused, and with an estimate (a plan for no GPU has none)."""
    return plan.verdict != 'refused' and plan.gpu_peak_gib is not None


def with_alternative_commands(plan: Plan, recipe: Optional[Recipe],
                              environ: Optional[Mapping[str, str]] = None) -> Plan:
    """`plan` with each alternative's command (none without a recipe)."""
    if not plan.alternatives:
        return plan
    alternatives = [{**a, 'command': alternative_command(plan, a, recipe, environ) if recipe is not None else []}
                    for a in plan.alternatives]
    return replace(plan, alternatives=alternatives, alternative=alternatives[0])


def refused(plan: Plan, reasons: List[str]) -> Plan:
    """`plan`, refused for `reasons` (added to its own) by the launcher."""
    return replace(plan, verdict='refused', command=[], reasons=[*plan.reasons, *reasons])


def alternative_command(plan: Plan, alternative: Dict[str, Any], recipe: Recipe,
                        environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """What `train` would run for the alternative: its plan, launched with the recipe and the alternative's
    overrides; [] when the launcher would not run it (the alternative is still listed for its numbers)."""
    try:
        alternative_recipe = recipe.with_overrides(alternative_overrides(alternative, recipe))
        return build_launch(alternative_plan(plan, alternative), alternative_recipe, environ).command()
    except (LaunchRefused, ValueError):  # ValueError: RecipeError, LaunchUsageError
        return []


def alternative_overrides(alternative: Dict[str, Any], recipe: Recipe) -> List[str]:
    """The `key=value` overrides (ms-swift's names where the recipe has them) that turn `recipe` into `alternative`
    on the same hardware: the backend, tuner, 4-bit base, offload, micro-batch, Megatron parallelism and packing the
    alternative was planned with, each where it differs from the recipe."""
    alt = alternative
    wanted = {'train.backend': alt['backend'], 'train.tuner_type': alt['tuner'], 'train.quantization': alt['quant'],
              'deepspeed.offload': alt['offload'], 'train.per_device_train_batch_size': alt['micro_batch']}
    if alt['backend'] in MEGATRON_BACKENDS:
        wanted.update({'megatron.ep': alt['ep'], 'megatron.tp': alt['tp']})
    packed = recipe['data.max_length'] if recipe['train.packing'] == 'dataset' else None
    if alt.get('pack_length') != packed:  # the planner's packing alternatives: shorter rows, or none
        wanted.update({'train.packing': 'dataset', 'data.max_length': alt['pack_length']} if alt.get('pack_length')
                      else {'train.packing': 'off'})
    current = {'deepspeed.offload': recipe['deepspeed.offload'] or 'none'}
    out = [f'{key}={value}' for key, value in wanted.items()
           if value is not None and str(current.get(key, recipe[key])) != str(value)]
    # the checkpointed layers the alternative was planned with, where the backend takes a number of them
    layers = alt.get('checkpoint_layers')
    if (recipe['train.gradient_checkpointing'] and alt['backend'] in PARTIAL_CHECKPOINT_BACKENDS
            and recipe['train.checkpoint_layers'] != layers):
        out.append(f'train.checkpoint_layers={"null" if layers is None else layers}')
    return out
