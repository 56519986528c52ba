"""From a plan and a recipe to the exact process that trains: `build_launch(plan, recipe) -> Launch`.

A `Launch` (swift_vora/backends/base.py) is an argv list (no shell), the environment to add, and the files to
write first (generated DeepSpeed JSON, the Unsloth run config). The launchers are the engines' own, one `Launcher`
each, asked in the order of `LAUNCHERS`:

- `ddp`, `deepspeed_zero2`, `deepspeed_zero3` -> `swift sft` (ms-swift starts `torch.distributed.run` itself
  when `NPROC_PER_NODE` / `NNODES` are set; see swift/cli/main.py) -- deepspeed.py `SwiftSft`
- `megatron_ep_lora` -> `megatron sft` (same torchrun convention) -- megatron.py `MegatronSft`
- `unsloth_split_lora` -> `python -m swift_vora.backends.unsloth_runner CONFIG.json` (one process per GPU: with
  `NPROC_PER_NODE` / `NNODES` set the runner starts torchrun itself, as swift does) -- unsloth.py `UnslothRunner`

Several nodes: `NNODES`, `NODE_RANK`, `MASTER_ADDR`, `MASTER_PORT` go to the engine's torchrun rendezvous.
`NODE_RANK` and `MASTER_ADDR` come from the environment of `swift-vora train` on each node.

Whatever the plan and the recipe say, `build_launch` refuses (exit 4) a launch that would put a MoE model under
DeepSpeed ZeRO-3: it inspects the final argv (presets, JSON files, inline JSON) rather than trusting the path
that produced it. This module is the dispatcher only; the pieces the backends share live in common.py.
"""
from __future__ import annotations

import json
import os
import sys
from typing import List, Mapping, Optional, Sequence, Tuple

from .. import switches
from ..plan.backend import Backend
from ..plan.request import Plan
from .base import Launch, Launcher, LaunchRefused, LaunchUsageError, PlanView
from .common import EngineArgumentError, parse_engine_argv, swift_argv
from .deepspeed import SwiftSft
from .megatron import MegatronSft
from .recipe import Recipe
from .unsloth import UnslothRunner

# Every launcher, asked in turn for the plan's backend (each backend has exactly one).
LAUNCHERS: Tuple[Launcher, ...] = (SwiftSft(), MegatronSft(), UnslothRunner())


def launcher_for(backend: str) -> Launcher:
    for launcher in LAUNCHERS:
        if backend in launcher.backends:
            return launcher
    raise LaunchUsageError(f'no launcher for backend {backend!r}')

# Flags the backend sets from the plan; `extra_args` may not change them (choose them in the recipe instead).
RESERVED_FLAGS = ('--deepspeed', '--tuner_backend', '--model', '--model_type', '--template', '--custom_register_path',
                  '--external_plugins', '--expert_model_parallel_size', '--tensor_model_parallel_size',
                  '--pipeline_model_parallel_size', '--tuner_type', '--output_dir', '--dataset',
                  # the plan's Megatron logits term follows megatron.cross_entropy_fusion_impl
                  '--cross_entropy_fusion_impl', '--cross_entropy_loss_fusion')

# ---------------------------------------------------------------------------------------------------------------
# MoE + ZeRO-3: refused on the final argv, whatever produced it
# ---------------------------------------------------------------------------------------------------------------
def _flag_values(argv: Sequence[str], flag: str) -> List[str]:
    out = []
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith(flag + '='):
            out.append(a.split('=', 1)[1])
    return out


def deepspeed_stage(value: str, files: Mapping[str, str]) -> Optional[int]:
    """The ZeRO stage a `--deepspeed` value selects: a swift preset name, a JSON path, or inline JSON."""
    v = value.strip()
    if v.startswith('zero') and v[4:5].isdigit():
        return int(v[4])
    text = None
    if v.startswith('{'):
        text = v
    elif v in files:
        text = files[v]
    elif os.path.isfile(v):
        with open(v, encoding='utf-8') as f:
            text = f.read()
    if text is None:
        return None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError:
        return None
    stage = (cfg.get('zero_optimization') or {}).get('stage') if isinstance(cfg, dict) else None
    return int(stage) if isinstance(stage, (int, float)) else None


def refuse_moe_zero3(launch: Launch, is_moe: bool) -> None:
    if not is_moe:
        return
    for value in _flag_values(launch.argv, '--deepspeed'):
        stage = deepspeed_stage(value, launch.files)
        if stage is None or stage == 3:
            raise LaunchRefused([
                f'--deepspeed {value}: DeepSpeed ZeRO-3 with a MoE model is refused (ZeRO-3 partitions every expert '
                'and gathers them all per layer; DeepSpeed\'s own MoE layer refuses ZeRO-3 and ms-swift\'s maintainers '
                'point MoE users to Megatron). Use megatron_ep_lora on several GPUs or unsloth_split_lora on one.'
                + ('' if stage == 3 else ' (the stage of this DeepSpeed config could not be read)')])


def refuse_text_only(view: PlanView, recipe: Recipe) -> None:
    """Every launch trains the video_ora template, which feeds a clip's frames to a vision tower: a text-only model
    would start, load, and fail at its first sample (or train on prompts without the video)."""
    model = view.model
    if model is not None and model.vision is None:
        raise LaunchRefused([f'{recipe["model.path"]} is a text-only model ({model.model_type}, no vision tower): the '
                             'video_ora template trains vision-language models that watch the clip (Qwen2-VL, '
                             'Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen3.5, Qwen3.5-MoE); the memory figures above '
                             'still hold for this model'])


def check_extra_args(recipe: Recipe) -> None:
    for a in recipe['extra_args']:
        flag = a.split('=', 1)[0]
        if flag in RESERVED_FLAGS:
            raise LaunchUsageError(f'{recipe.path}: extra_args: {flag} is set by swift-vora train from the plan; '
                                   'choose it with the recipe keys (train.backend, model.*, megatron.*) instead')


# ---------------------------------------------------------------------------------------------------------------
# QLoRA and the pass-through arguments (swift sft / megatron sft only), checked by the engine's own parser
# ---------------------------------------------------------------------------------------------------------------
def quantization_args(recipe: Recipe, launcher: Launcher, backend: str) -> List[str]:
    """`train.quantization: 4bit` -> ms-swift's bitsandbytes NF4 load (QLoRA), computing in the recipe's dtype."""
    if recipe['train.quantization'] == 'none':
        return []
    if not launcher.quantization:
        raise LaunchUsageError(f'{recipe.path}: train.quantization={recipe["train.quantization"]} needs a swift sft '
                               f'backend (ddp or DeepSpeed); {backend} has no bitsandbytes 4-bit path')
    return ['--quant_method', 'bnb', '--quant_bits', '4', '--bnb_4bit_quant_type', 'nf4',
            '--bnb_4bit_use_double_quant', 'true', '--bnb_4bit_compute_dtype', recipe['train.dtype']]


def passthrough_args(recipe: Recipe) -> List[str]:
    """`swift_args: {name: value}` -> `--name value` (lists: several values; mappings: inline JSON)."""
    return swift_argv(recipe['swift_args'])


# What an engine's argument parser imports on the way to a module that needs CUDA (mcore-bridge imports
# transformer_engine): a failed import of it must not leave these behind
HALF_IMPORTED = ('swift.megatron', 'mcore_bridge')


def check_engine_args(launch: Launch, recipe: Recipe, launcher: Launcher) -> None:
    """Parse the final argv with the engine's own parser (argparse level: names, types, choices; nothing is
    loaded) so that a misspelt or ill-typed `swift_args` / `extra_args` entry stops here, not minutes into a
    launch. Without the engine installed (megatron-core, Transformer Engine), a note says the check did not run."""
    before = set(sys.modules)
    try:
        parser = launcher.argument_parser()
    except ImportError as e:
        # the failed import leaves the packages it had entered half-imported (swift.megatron without its arguments):
        # taken out again, or this process would read them as installed (swift_registry: "inside megatron sft")
        for name in set(sys.modules) - before:
            if name.startswith(HALF_IMPORTED):
                sys.modules.pop(name, None)
        launch.notes.append(f'swift_args/extra_args not checked: the {launch.argv[1]} argument parser could not be '
                            f'imported here ({e})')
        return
    engine = ' '.join(os.path.basename(a) for a in launch.argv[:2])
    try:
        _, unknown = parse_engine_argv(parser, launch.argv[2:])
    except EngineArgumentError as e:
        raise LaunchUsageError(f'{recipe.path}: swift_args/extra_args: {engine} rejects the arguments: {e}') from None
    if unknown:
        raise LaunchUsageError(f'{recipe.path}: swift_args/extra_args: {engine} has no argument '
                               f'{" ".join(a for a in unknown if a.startswith("-")) or " ".join(unknown)} '
                               f'(`{engine} --help` lists them)')


def add_engine_args(launch: Launch, recipe: Recipe, launcher: Launcher) -> None:
    user = recipe['swift_args'] or recipe['extra_args']
    if launcher.engine is None:
        if recipe['train.quantization'] != 'none':
            raise LaunchUsageError(f'{recipe.path}: train.quantization is for swift sft; the {launch.backend} runner '
                                   'has no bitsandbytes 4-bit path')
        other = [name for name in recipe['swift_args'] if name not in launcher.swift_args_taken]
        if other:
            taken = (f'; it takes {", ".join(launcher.swift_args_taken)} (the optimizer and its schedule)'
                     if launcher.swift_args_taken else '')
            raise LaunchUsageError(f'{recipe.path}: swift_args.{other[0]} is a swift sft / megatron sft argument the '
                                   f'{launch.backend} runner does not take{taken}; its own settings are the '
                                   'unsloth.* keys')
        return
    added = quantization_args(recipe, launcher, launch.backend) + passthrough_args(recipe)
    for flag in (a for a in added if a.startswith('--')):
        if flag in launch.argv:
            raise LaunchUsageError(f'{recipe.path}: {flag} is already set by swift-vora train from the recipe; '
                                   'change the recipe key that sets it (docs/backends.md)')
    launch.argv += added
    if user:
        check_engine_args(launch, recipe, launcher)


# ---------------------------------------------------------------------------------------------------------------
def check_launch_environment(launch: Launch, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> None:
    """Every `SWIFT_VORA_*` switch the launched process will read -- this environment with the launch's on top --
    holds a value it accepts (the guard list included): the plugin and the runner check the same when they start,
    which is after the model has loaded."""
    child = {**(os.environ if environ is None else environ), **launch.env}
    try:
        switches.check_environment(child)
    except switches.SwitchError as exc:
        name = str(exc).split('=', 1)[0].split(':', 1)[0]
        source = 'the launch\'s environment (from the recipe)' if name in launch.env else 'the environment'
        raise LaunchUsageError(f'{recipe.path}: not launched: {exc} (in {source}; `swift-vora switches` lists '
                               'them)') from None


def build_launch(plan: Plan, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
    """The process that trains `recipe` as `plan` decided. Raises LaunchRefused (exit 4) for refused or
    unsupported combinations and LaunchUsageError (exit 2) for recipes the launcher cannot express."""
    view = PlanView.of(plan, recipe)
    if view.verdict == 'refused':
        raise LaunchRefused(view.reasons or ['the planner refused this combination'])
    refuse_text_only(view, recipe)
    launcher = launcher_for(view.backend)
    launch = launcher.build(view, recipe, environ)
    # The guard runs on what would actually be executed, extra_args included, before the reserved-flag check
    # (swift_args cannot name --deepspeed: the recipe check stops it).
    refuse_moe_zero3(launch, view.is_moe)
    check_extra_args(recipe)
    launch.backend = Backend(view.backend)
    add_engine_args(launch, recipe, launcher)
    check_launch_environment(launch, recipe, environ)
    return launch
