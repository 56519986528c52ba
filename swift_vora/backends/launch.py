"""From a plan and a recipe to the exact process that trains: `build_launch(plan, recipe) -> Launch`.

A `Launch` is an argv list (no shell), the environment to add, and the files to write first (generated
DeepSpeed JSON, the Unsloth run config). The launchers are the engines' own:

- `ddp`, `deepspeed_zero2`, `deepspeed_zero3` -> `swift sft` (ms-swift starts `torch.distributed.run` itself
  when `NPROC_PER_NODE` / `NNODES` are set; see swift/cli/main.py)
- `megatron_ep_lora` -> `megatron sft` (same torchrun convention)
- `unsloth_split_lora` -> `python -m swift_vora.backends.unsloth_runner CONFIG.json` (one GPU, one process)

Several nodes: `NNODES`, `NODE_RANK`, `MASTER_ADDR`, `MASTER_PORT` go to the engine's torchrun rendezvous.
`NODE_RANK` and `MASTER_ADDR` come from the environment of `swift-vora train` on each node.

Whatever the plan and the recipe say, `build_launch` refuses (exit 4) a launch that would put a MoE model under
DeepSpeed ZeRO-3: it inspects the final argv (presets, JSON files, inline JSON) rather than trusting the path
that produced it.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..budget import VideoBudget
from ..offline import OFFLINE_ENV
from .recipe import Recipe

# Flags the backend sets from the plan; `extra_args` may not change them (choose them in the recipe instead).
RESERVED_FLAGS = ('--deepspeed', '--tuner_backend', '--model', '--model_type', '--template', '--custom_register_path',
                  '--external_plugins', '--expert_model_parallel_size', '--tensor_model_parallel_size',
                  '--pipeline_model_parallel_size', '--tuner_type', '--output_dir', '--dataset')
# Environment the launcher derives from the recipe; `env` / `guards.env` may not set them.
RESERVED_ENV_PREFIXES = ('SWIFT_VORA_', 'NPROC_PER_NODE', 'NNODES')
RENDEZVOUS = ('NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT')
DEFAULT_MASTER_PORT = '29500'


class LaunchRefused(Exception):
    """The launch would run an unsupported combination (exit 4)."""

    def __init__(self, reasons: Sequence[str]):
        super().__init__('; '.join(reasons))
        self.reasons = list(reasons)


class LaunchUsageError(ValueError):
    """The recipe asks for something the launcher cannot express (exit 2)."""


@dataclass
class Launch:
    argv: List[str]  # executable first; run without a shell
    env: Dict[str, str] = field(default_factory=dict)  # added to the caller's environment
    files: Dict[str, str] = field(default_factory=dict)  # path -> text, written before the launch
    backend: str = ''
    notes: List[str] = field(default_factory=list)  # what the user should know (printed by --dry-run)

    def shell(self) -> str:
        """The launch as one copy-pasteable shell command (env assignments first)."""
        env = ' '.join(f'{k}={_quote_env(v)}' for k, v in sorted(self.env.items()))
        parts, line = [], []
        for a in self.argv:
            if a.startswith('--') and line:
                parts.append(' '.join(line))
                line = []
            line.append(shlex.quote(a))
        parts.append(' '.join(line))
        body = ' \\\n    '.join(parts)
        return f'{env} \\\n  {body}' if env else body

    def write_files(self) -> None:
        for path, text in self.files.items():
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, 'w', encoding='utf-8') as f:
                f.write(text)

    def run(self, environ: Optional[Mapping[str, str]] = None) -> int:
        """Write the files and run the argv (list, no shell); return the child's exit code."""
        self.write_files()
        env = dict(os.environ if environ is None else environ)
        env.update(self.env)
        try:
            return subprocess.run(self.argv, env=env, check=False).returncode
        except FileNotFoundError as e:
            print(f'swift-vora train: cannot start {self.argv[0]!r}: {e}', file=sys.stderr)
            return 127
        except KeyboardInterrupt:
            return 130


def _quote_env(value: str) -> str:
    # A rendezvous value not known when printing stays a shell expansion that fails loudly when unset.
    if value.startswith('${') and value.endswith('}') and ':?' in value:
        return f'"{value}"'
    return shlex.quote(value)


# ---------------------------------------------------------------------------------------------------------------
# The plan, whatever shape it comes in (the planner's Plan dataclass or the CONTRACT JSON dict)
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class PlanView:
    backend: str
    verdict: str
    reasons: List[str]
    num_gpus: int  # per node
    nodes: int
    ep: int
    tp: int
    offload: str
    micro_batch: int
    is_moe: bool
    model_type: str
    gpu_peak_gib: Optional[float]
    host_peak_gib: Optional[float]
    gpu_mem_gib: Optional[float] = None  # capacity of one GPU (DeepSpeed picks its small-GPU config from it)

    @property
    def world(self) -> int:
        return self.num_gpus * self.nodes


def _get(plan: Any, key: str, default: Any = None) -> Any:
    if isinstance(plan, Mapping):
        return plan.get(key, default)
    return getattr(plan, key, default)


def plan_view(plan: Any, recipe: Recipe) -> PlanView:
    """Read the fields a launch needs; a field the plan lacks falls back to the recipe (documented there)."""
    model = _get(plan, 'model') or {}
    hardware = _get(plan, 'hardware') or {}
    num_gpus = _get(plan, 'num_gpus') or _get(hardware, 'num_gpus') or recipe['gpus'] or 1
    nodes = _get(plan, 'nodes') or _get(hardware, 'nodes') or recipe['nodes']
    declared, found = recipe['model.type'], config_model_type(recipe['model.path'])
    if declared and found and not declared.startswith(found):  # qwen3_vl_emb etc. share qwen3_vl's config type
        raise LaunchUsageError(f'{recipe.path}: model.type is {declared!r} but {recipe["model.path"]} is a {found!r} '
                               f'model; set model.type={found} (or model.type=null to take it from config.json)')
    # the plan's model summary, else config.json: a MoE is never taken for dense because the plan lacks a field
    is_moe = _get(model, 'kind') == 'moe' or bool(_get(model, 'is_moe')) or model_is_moe(recipe['model.path'])
    return PlanView(
        backend=_get(plan, 'backend') or '',
        verdict=_get(plan, 'verdict') or 'fits',
        reasons=list(_get(plan, 'reasons') or []),
        num_gpus=int(num_gpus),
        nodes=int(nodes),
        ep=int(_get(plan, 'ep') or recipe['megatron.ep'] or 1),
        tp=int(_get(plan, 'tp') or recipe['megatron.tp'] or 1),
        offload=str(_get(plan, 'offload') or recipe['deepspeed.offload'] or 'none'),
        micro_batch=int(_get(plan, 'micro_batch') or recipe['train.micro_batch']),
        is_moe=is_moe,
        model_type=declared or _get(model, 'model_type') or found,
        gpu_peak_gib=_get(plan, 'gpu_peak_gib'),
        host_peak_gib=_get(plan, 'host_peak_gib'),
        gpu_mem_gib=_get(plan, 'gpu_capacity_gib') or _get(hardware, 'gpu_mem_gib') or recipe['gpu_mem_gib'],
    )


def read_config(model_path: str) -> Dict[str, Any]:
    path = model_path if model_path.endswith('.json') else os.path.join(model_path, 'config.json')
    try:
        with open(path, encoding='utf-8') as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def config_model_type(model_path: str) -> str:
    return str(read_config(model_path).get('model_type') or '')


def model_is_moe(model_path: str) -> bool:
    """MoE from config.json alone (no weights)."""
    return config_is_moe(read_config(model_path))


def config_is_moe(cfg: Mapping[str, Any]) -> bool:
    """Routed experts in the config or its text_config (a `*_moe` model type, or more than one expert)."""
    for c in (cfg, cfg.get('text_config') or {}):
        if not isinstance(c, dict):
            continue
        if str(c.get('model_type', '')).endswith('_moe'):
            return True
        for key in ('num_experts', 'n_routed_experts', 'num_local_experts'):
            if (c.get(key) or 0) > 1:
                return True
    return False


# ---------------------------------------------------------------------------------------------------------------
# Environment shared by every backend
# ---------------------------------------------------------------------------------------------------------------
def video_budget(recipe: Recipe) -> VideoBudget:
    return VideoBudget(**{k: v for k, v in recipe.section('video').items()})


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
    if os.path.isfile(recipe.path):  # the fingerprint guard hashes it into fingerprint.json (guards/fingerprint.py)
        env['SWIFT_VORA_RECIPE'] = os.path.abspath(recipe.path)
    if recipe.overrides:
        env['SWIFT_VORA_RECIPE_OVERRIDES'] = json.dumps(list(recipe.overrides))
    for source in ('guards.env', 'env'):
        for key, value in recipe[source].items():
            if key.startswith(RESERVED_ENV_PREFIXES) or key in RENDEZVOUS:
                raise LaunchUsageError(f'{recipe.path}: {source}.{key}: set by swift-vora train from the recipe '
                                       f'(use the video./data./nodes keys instead)')
            env[key] = '' if value is None else str(value)
    env.update(rendezvous_env(view, environ))
    return env


def rendezvous_env(view: PlanView, environ: Mapping[str, str], single_process: bool = False) -> Dict[str, str]:
    """torchrun settings read by `swift sft` / `megatron sft` (swift/cli/main.py get_torchrun_args)."""
    if single_process:
        return {}
    env: Dict[str, str] = {}
    distributed = view.world > 1 or view.backend in ('deepspeed_zero2', 'deepspeed_zero3', 'megatron_ep_lora')
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


SELECTIVE_REGEX = r'.*\.(self_attn|linear_attn|shared_expert)\..*'


def lora_args(recipe: Recipe) -> List[str]:
    if recipe['train.tuner'] == 'full':
        return ['--tuner_type', 'full']
    if recipe['train.tuner'] == 'selective':  # the planner's 'selective': attention and shared experts, full
        return ['--tuner_type', 'full', '--freeze_parameters_ratio', '1', '--trainable_parameters_regex',
                SELECTIVE_REGEX]
    targets = recipe['train.target_modules']
    targets = [targets] if isinstance(targets, str) else list(targets)
    return ['--tuner_type', 'lora', '--target_modules', *targets, '--lora_rank', str(recipe['train.lora_rank']),
            '--lora_alpha', _num(recipe['train.lora_alpha']), '--lora_dropout', _num(recipe['train.lora_dropout'])]


def _num(x: Any) -> str:
    return f'{x:g}' if isinstance(x, float) else str(x)


def bool_arg(x: bool) -> str:
    return 'true' if x else 'false'


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


def check_extra_args(recipe: Recipe) -> None:
    for a in recipe['extra_args']:
        flag = a.split('=', 1)[0]
        if flag in RESERVED_FLAGS:
            raise LaunchUsageError(f'{recipe.path}: extra_args: {flag} is set by swift-vora train from the plan; '
                                   'choose it with the recipe keys (train.backend, model.*, megatron.*) instead')


# ---------------------------------------------------------------------------------------------------------------
# QLoRA and the pass-through arguments (swift sft / megatron sft only), checked by the engine's own parser
# ---------------------------------------------------------------------------------------------------------------
ENGINE_LAUNCHERS = ('ddp', 'deepspeed_zero2', 'deepspeed_zero3', 'megatron_ep_lora')


def quantization_args(recipe: Recipe, backend: str) -> List[str]:
    """`train.quantization: 4bit` -> ms-swift's bitsandbytes NF4 load (QLoRA), computing in the recipe's dtype."""
    if recipe['train.quantization'] == 'none':
        return []
    if backend not in ('ddp', 'deepspeed_zero2', 'deepspeed_zero3'):
        raise LaunchUsageError(f'{recipe.path}: train.quantization={recipe["train.quantization"]} needs a swift sft '
                               f'backend (ddp or DeepSpeed); {backend} has no bitsandbytes 4-bit path')
    return ['--quant_method', 'bnb', '--quant_bits', '4', '--bnb_4bit_quant_type', 'nf4',
            '--bnb_4bit_use_double_quant', 'true', '--bnb_4bit_compute_dtype', recipe['train.dtype']]


def passthrough_args(recipe: Recipe) -> List[str]:
    """`swift_args: {name: value}` -> `--name value` (lists: several values; mappings: inline JSON)."""
    argv: List[str] = []
    for name, value in recipe['swift_args'].items():
        if isinstance(value, bool):
            values = [bool_arg(value)]
        elif isinstance(value, list):
            values = [bool_arg(v) if isinstance(v, bool) else str(v) for v in value]
        elif isinstance(value, dict):
            values = [json.dumps(value)]
        else:
            values = [_num(value)]
        argv += [f'--{name}', *values]
    return argv


def engine_parser(backend: str):
    """The argument parser the engine itself builds for `swift sft` / `megatron sft` (ms-swift's HfArgumentParser
    over SftArguments / MegatronSftArguments, swift.utils.parse_args)."""
    from transformers import HfArgumentParser
    from swift.utils.utils import _patch_get_type_hints
    if backend == 'megatron_ep_lora':
        from swift.megatron.arguments import MegatronSftArguments as arguments
    else:
        from swift.arguments import SftArguments as arguments
    with _patch_get_type_hints():
        parser = HfArgumentParser([arguments])
    return parser


class _EngineArgumentError(Exception):
    pass


def check_engine_args(launch: Launch, recipe: Recipe) -> None:
    """Parse the final argv with the engine's own parser (argparse level: names, types, choices; nothing is
    loaded) so that a misspelt or ill-typed `swift_args` / `extra_args` entry stops here, not minutes into a
    launch. Without the engine installed (megatron-core, Transformer Engine), a note says the check did not run."""
    try:
        parser = engine_parser(launch.backend)
    except ImportError as e:
        launch.notes.append(f'swift_args/extra_args not checked: the {launch.argv[1]} argument parser could not be '
                            f'imported here ({e})')
        return
    parser.exit_on_error = False
    parser.allow_abbrev = False  # a misspelt name is an error here, not a guess at the closest argument

    def fail(message: str):
        raise _EngineArgumentError(message)

    parser.error = fail  # argparse reports through error(); raise instead of exiting
    engine = ' '.join(os.path.basename(a) for a in launch.argv[:2])
    try:
        _, unknown = parser.parse_known_args(launch.argv[2:])
    except (_EngineArgumentError, argparse.ArgumentError) as e:
        raise LaunchUsageError(f'{recipe.path}: swift_args/extra_args: {engine} rejects the arguments: {e}') from None
    if unknown:
        raise LaunchUsageError(f'{recipe.path}: swift_args/extra_args: {engine} has no argument '
                               f'{" ".join(a for a in unknown if a.startswith("-")) or " ".join(unknown)} '
                               f'(`{engine} --help` lists them)')


def add_engine_args(launch: Launch, recipe: Recipe, backend: str) -> None:
    user = recipe['swift_args'] or recipe['extra_args']
    if backend not in ENGINE_LAUNCHERS:
        if recipe['swift_args'] or recipe['train.quantization'] != 'none':
            raise LaunchUsageError(f'{recipe.path}: swift_args and train.quantization are for swift sft / megatron '
                                   f'sft; the {backend} runner takes neither (see its unsloth.* keys)')
        return
    added = quantization_args(recipe, backend) + passthrough_args(recipe)
    for flag in (a for a in added if a.startswith('--')):
        if flag in launch.argv:
            raise LaunchUsageError(f'{recipe.path}: {flag} is already set by swift-vora train from the recipe; '
                                   'change the recipe key that sets it (docs/backends.md)')
    launch.argv += added
    if user:
        check_engine_args(launch, recipe)


# ---------------------------------------------------------------------------------------------------------------
def build_launch(plan: Any, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
    """The process that trains `recipe` as `plan` decided. Raises LaunchRefused (exit 4) for refused or
    unsupported combinations and LaunchUsageError (exit 2) for recipes the launcher cannot express."""
    view = plan_view(plan, recipe)
    if view.verdict == 'refused':
        raise LaunchRefused(view.reasons or ['the planner refused this combination'])
    backend = view.backend
    if backend in ('ddp', 'deepspeed_zero2', 'deepspeed_zero3'):
        from .deepspeed import build_swift_sft_launch
        launch = build_swift_sft_launch(view, recipe, environ)
    elif backend == 'megatron_ep_lora':
        from .megatron import build_megatron_launch
        launch = build_megatron_launch(view, recipe, environ)
    elif backend == 'unsloth_split_lora':
        from .unsloth import build_unsloth_launch
        launch = build_unsloth_launch(view, recipe, environ)
    else:
        raise LaunchUsageError(f'no launcher for backend {backend!r}')
    # The guard runs on what would actually be executed, extra_args included, before the reserved-flag check
    # (swift_args cannot name --deepspeed: the recipe check stops it).
    refuse_moe_zero3(launch, view.is_moe)
    check_extra_args(recipe)
    launch.backend = backend
    add_engine_args(launch, recipe, backend)
    return launch


def launch_record(launch: Launch, plan_json: Dict[str, Any], recipe: Recipe) -> str:
    """launch.json written next to the run: what ran and why (argv, env, plan, recipe)."""
    return json.dumps({'backend': launch.backend, 'argv': launch.argv, 'env': launch.env,
                       'files': sorted(launch.files), 'plan': plan_json, 'recipe': recipe.path,
                       'overrides': recipe.overrides}, indent=2, default=str) + '\n'


def console_script(name: str) -> str:
    """The console script installed next to this interpreter (the venv's `swift`), else the name on PATH."""
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else name
