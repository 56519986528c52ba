"""What every backend's launcher shares: the environment and the ms-swift arguments common to all backends, and the
recipe's settings they all read the same way.

The dispatcher (`build_launch`, swift_vora/backends/launch.py) picks a launcher (deepspeed.py, megatron.py,
unsloth.py; the interface is base.py); each of them builds its `Launch` from the pieces here, so this module imports
none of them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional

from ..budget import VideoBudget
from ..offline import OFFLINE_ENV
from ..plan.backend import AUTO, DEEPSPEED
from ..plan.memory import MEGATRON_BACKENDS
from ..plan.model_source import load_model_spec
from ..plan.model_spec import UnsupportedModel
from .base import Launch, PlanView
from .recipe import RENDEZVOUS, Recipe

# Environment the launcher derives from the recipe (`env` / `guards.env` may not set it: recipe.py checks that where
# the recipe is read).
DEFAULT_MASTER_PORT = '29500'


def config_model_type(model_path: str) -> str:
    """config.json's model_type ('' when the model cannot be described)."""
    try:
        return load_model_spec(model_path).model_type
    except (OSError, UnsupportedModel):
        return ''


# ---------------------------------------------------------------------------------------------------------------
# Environment shared by every backend
# ---------------------------------------------------------------------------------------------------------------
def video_budget(recipe: Recipe) -> VideoBudget:
    return VideoBudget(**{k: v for k, v in recipe.section('video').items()})


def checkpoint_layers(recipe: Recipe, view: PlanView) -> Optional[int]:
    """How many decoder layers the launch checkpoints (None: every layer): the recipe's number, or for `auto` the
    plan's pick (plan/fit.py; None where it picked every layer)."""
    asked = recipe['train.checkpoint_layers']
    return view.checkpoint_layers if asked == AUTO else asked


def common_env(recipe: Recipe, view: PlanView, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Offline flags, the video budget, the window settings, the guards' env, and the rendezvous."""
    environ = os.environ if environ is None else environ
    env = dict(OFFLINE_ENV)
    env.update(video_budget(recipe).to_env())
    for key in ('window', 'stride', 'min_event'):
        value = recipe[f'data.{key}']
        if value is not None:
            env[f'SWIFT_VORA_{key.upper()}'] = f'{float(value):g}'
    if recipe['data.video_root']:
        env['SWIFT_VORA_VIDEO_ROOT'] = recipe['data.video_root']
    env['SWIFT_VORA_ENCODE_LOG'] = os.path.join(recipe['train.output_dir'], 'encode_log.jsonl')
    layers = checkpoint_layers(recipe, view)
    if layers is not None:  # speed/partial_checkpoint.py (swift sft and Unsloth)
        env['SWIFT_VORA_CHECKPOINT_LAYERS'] = str(layers)
    if os.path.isfile(recipe.path):  # hashed into fingerprint.json (a plan's stand-in recipe has no file)
        env['SWIFT_VORA_RECIPE'] = os.path.abspath(recipe.path)
        if recipe.overrides:  # recorded next to the recipe's hash in fingerprint.json (guards/fingerprint.py)
            env['SWIFT_VORA_RECIPE_OVERRIDES'] = json.dumps(list(recipe.overrides))
    for source in ('guards.env', 'env'):  # checked when the recipe was read (recipe.env_entry_problem)
        for key, value in recipe[source].items():
            env[key] = '' if value is None else str(value)
    # Grow CUDA segments instead of caching fixed blocks: the same allocations in less reserved memory, on every
    # backend (the benchmarks measured each with it; the plan's ALLOCATOR_FRAGMENTATION_EXPANDABLE); a value the
    # user or the recipe set wins.
    if 'PYTORCH_CUDA_ALLOC_CONF' not in env and not environ.get('PYTORCH_CUDA_ALLOC_CONF'):
        env['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'
    env.update(rendezvous_env(view, environ))
    return env


def rendezvous_env(view: PlanView, environ: Mapping[str, str], single_process: bool = False) -> Dict[str, str]:
    """torchrun settings read by `swift sft` / `megatron sft` (swift/cli/main.py get_torchrun_args)."""
    if single_process:
        return {}
    env: Dict[str, str] = {}
    distributed = view.world > 1 or view.backend in (*DEEPSPEED, *MEGATRON_BACKENDS)
    if distributed:
        env['NPROC_PER_NODE'] = str(view.num_gpus)
    if view.nodes > 1:
        env['NNODES'] = str(view.nodes)
        for key in RENDEZVOUS:
            if environ.get(key):
                env[key] = environ[key]
            elif key == 'MASTER_PORT':
                env[key] = DEFAULT_MASTER_PORT
            else:
                env[key] = '${%s:?set %s on every node}' % (key, key)
    return env


def missing_rendezvous(env: Mapping[str, str]) -> List[str]:
    return [k for k in RENDEZVOUS if str(env.get(k, '')).startswith('${')]


def swift_common_args(recipe: Recipe, view: PlanView) -> List[str]:
    """Arguments every ms-swift entry point (swift sft, megatron sft) takes the same way."""
    datasets = recipe['data.dataset']
    datasets = [datasets] if isinstance(datasets, str) else list(datasets)
    argv = ['--custom_register_path', 'swift_vora', '--model', recipe['model.path'], '--model_type', view.model_type,
            '--template', 'video_ora', '--dataset', *datasets, '--split_dataset_ratio', '0', '--use_hf', 'true',
            '--check_model', 'false']
    if recipe['data.max_length'] is not None:
        argv += ['--max_length', str(recipe['data.max_length'])]
    if recipe['data.strict']:
        argv += ['--strict', 'true']
    return argv


# Selective unfreezing: attention (full and linear) and the shared expert with its gate -- the parameters the
# planner counts as trainable (plan/model_spec.py selective_groups).
SELECTIVE_REGEX = r'.*\.(self_attn|linear_attn|shared_expert|shared_expert_gate)\..*'


def lora_args(recipe: Recipe) -> List[str]:
    if recipe['train.tuner'] == 'full':
        return ['--tuner_type', 'full']
    if recipe['train.tuner'] == 'selective':  # the planner's 'selective': attention and shared experts, full
        return ['--tuner_type', 'full', '--freeze_parameters_ratio', '1', '--trainable_parameters_regex',
                SELECTIVE_REGEX]
    targets = recipe['train.target_modules']
    targets = [targets] if isinstance(targets, str) else list(targets)
    return ['--tuner_type', 'lora', '--target_modules', *targets, '--lora_rank', str(recipe['train.lora_rank']),
            '--lora_alpha', format_number(recipe['train.lora_alpha']), '--lora_dropout',
            format_number(recipe['train.lora_dropout'])]


def engine_argument_parser(arguments):
    """ms-swift's own parser over an engine's arguments dataclass (SftArguments, MegatronSftArguments): an
    HfArgumentParser, as swift.utils.parse_args builds it (imports ms-swift)."""
    from swift.utils.utils import _patch_get_type_hints
    from transformers import HfArgumentParser
    with _patch_get_type_hints():
        return HfArgumentParser([arguments])


class EngineArgumentError(ValueError):
    """An argv an engine's argument parser rejects (argparse's own message)."""


def parse_engine_argv(parser, argv: List[str]):
    """(namespace, unknown) from an engine's argument parser without exiting: a misspelt name is an error, not a
    guess at the closest argument; argparse's complaint is raised as EngineArgumentError."""
    parser.exit_on_error = False
    parser.allow_abbrev = False

    def fail(message: str):
        raise EngineArgumentError(message)

    parser.error = fail  # argparse reports through error(); raise instead of exiting
    try:
        return parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise EngineArgumentError(str(e)) from None


def swift_argv(args: Mapping[str, Any]) -> List[str]:
    """`{name: value}` -> `--name value` as ms-swift's parser reads it (lists: several values; mappings: inline
    JSON; booleans: true/false)."""
    argv: List[str] = []
    for name, value in args.items():
        if isinstance(value, bool):
            values = [bool_arg(value)]
        elif isinstance(value, list):
            values = [bool_arg(v) if isinstance(v, bool) else str(v) for v in value]
        elif isinstance(value, dict):
            values = [json.dumps(value)]
        else:
            values = [format_number(value)]
        argv += [f'--{name}', *values]
    return argv


def swift_optimizer_defaults() -> Dict[str, Any]:
    """The optimizer settings `swift sft` trains with when a recipe sets none, read from ms-swift's own
    TrainingArguments (its mixin over transformers'): weight decay 0.1, betas (0.9, 0.95), eps 1e-8, gradients
    clipped at norm 1, a cosine schedule after the linear warm-up. Read, not copied, so that the Unsloth runner
    follows the installed ms-swift (imports it)."""
    import dataclasses

    from swift.trainers.arguments import TrainingArguments
    fields = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    return {k: fields[k] for k in ('weight_decay', 'adam_beta1', 'adam_beta2', 'adam_epsilon', 'max_grad_norm',
                                     'lr_scheduler_type', 'lr_scheduler_kwargs')}


def format_number(x: Any) -> str:
    return f'{x:g}' if isinstance(x, float) else str(x)


def bool_arg(x: bool) -> str:
    return 'true' if x else 'false'


def launch_record(launch: Launch, plan_json: Dict[str, Any], recipe: Recipe) -> str:
    """launch.json written next to the run: what ran and why (argv, env, plan, recipe)."""
    return json.dumps({'backend': launch.backend, 'argv': launch.argv, 'env': launch.env,
                       'files': sorted(launch.files), 'plan': plan_json, 'recipe': recipe.path,
                       'overrides': recipe.overrides}, indent=2, default=str) + '\n'


def console_script(name: str) -> str:
    """The console script installed next to this interpreter (the venv's `swift`), else the name on PATH."""
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else name
