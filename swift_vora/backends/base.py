"""The shape of a backend: a `Launcher` turns a plan (as `PlanView` reads it) and a recipe into a `Launch` (argv,
environment, files).

One launcher per engine, each in its own module: `SwiftSft` (deepspeed.py: ddp and DeepSpeed ZeRO-2/3 through
`swift sft`), `MegatronSft` (megatron.py: `megatron sft`), `UnslothRunner` (unsloth.py: our runner). launch.py keeps
the list of them and asks each in turn, as PEFT's `_create_new_module` asks its dispatchers; a new backend is a
`Backend` member (swift_vora/plan/backend.py), the planner's rules and memory model for it, and one `Launcher`
subclass in a module of its own, added to launch.py's LAUNCHERS (docs/architecture.md).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..plan.backend import Backend
from ..plan.model_source import load_model_spec
from ..plan.model_spec import ModelSpec
from ..plan.request import Plan
from .recipe import Recipe


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

    def command(self) -> List[str]:
        """`env K=V ... argv`: the launch as one directly executable list (the plan's `command` field)."""
        env = [f'{k}={v}' for k, v in sorted(self.env.items())]
        return (['env', *env] if env else []) + list(self.argv)

    def shell(self) -> str:
        """The launch as one copy-pasteable shell command (env assignments first), one flag a line."""
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
        from ..outputs import write_text_atomic  # never over a device or a symlink; no half-written config
        for path, text in self.files.items():
            write_text_atomic(path, text, what='launch file')

    def run(self, environ: Optional[Mapping[str, str]] = None, stdout: Optional[int] = None) -> int:
        """Write the files and run the argv (list, no shell); return the child's exit code. `stdout`: a file
        descriptor for the child's stdout (`train --json` sends it to stderr, keeping its JSON alone)."""
        self.write_files()
        env = dict(os.environ if environ is None else environ)
        env.update(self.env)
        try:
            return subprocess.run(self.argv, env=env, check=False, stdout=stdout).returncode
        except FileNotFoundError as e:
            print(f'swift-vora train: cannot start {self.argv[0]!r}: {e}', file=sys.stderr)
            return 127
        except KeyboardInterrupt:
            return 130


def _quote_env(value: str) -> str:
    # A rendezvous value not known when printing stays a shell expansion that fails loudly when unset.
    if _is_required_expansion(value):
        return f'"{value}"'
    return shlex.quote(value)


def _is_required_expansion(value: str) -> bool:
    """`${NAME:?message}`: a value the shell fills on each node (common.py writes these), nothing else."""
    if not (value.startswith('${') and value.endswith('}') and ':?' in value):
        return False
    name, _, message = value[2:-1].partition(':?')
    return name.isidentifier() and not any(c in message for c in '"`$\\}')


def command_line(command: Sequence[str]) -> str:
    """A plan's `command` (`env K=V ... argv`) as one line to paste into a shell: every word quoted for the shell,
    except a `K=${K:?...}` assignment, whose expansion is kept (double-quoted) so the shell fills it on each node
    and stops with the message where it is unset (single quotes would set the literal text)."""
    words = []
    for word in command:
        name, eq, value = word.partition('=')
        if eq and name.isidentifier() and _is_required_expansion(value):
            words.append(f'{name}={_quote_env(value)}')
        else:
            words.append(shlex.quote(word))
    return ' '.join(words)


@dataclass
class PlanView:
    """What a launcher takes from a plan: the planner's decisions and the one description of the model."""
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
    model_type: str  # ms-swift's --model_type: the recipe's model.type, else config.json's
    gpu_peak_gib: Optional[float]
    host_peak_gib: Optional[float]
    gpu_mem_gib: Optional[float] = None  # capacity of one GPU (DeepSpeed picks its small-GPU config from it)
    num_layers: int = 0  # decoder layers (0 when unknown)
    linear_attention_layers: int = 0  # of them, linear attention (Qwen3.5's Gated DeltaNet)
    model: Optional[ModelSpec] = None  # config.json as the planner read it (None: a launch without a plan)
    checkpoints: Optional[str] = None  # unsloth_split_lora: 'gpu' | 'host' (the plan's choice for checkpoints=auto)
    # the first N decoder layers checkpointed (the recipe's number, or the plan's pick for auto); None: every layer
    checkpoint_layers: Optional[int] = None

    @property
    def world(self) -> int:
        return self.num_gpus * self.nodes

    @classmethod
    def of(cls, plan: Plan, recipe: Recipe) -> 'PlanView':
        """The launcher's view of `plan` (the planner's `Plan`) for `recipe`, whose model.type, when it names one,
        must be the model's."""
        model = plan.spec if plan.spec is not None else load_model_spec(recipe['model.path'])
        declared = recipe['model.type']
        if declared and not declared.startswith(model.model_type):  # qwen3_vl_emb etc. share qwen3_vl's config type
            raise LaunchUsageError(f'{recipe.path}: model.type is {declared!r} but {recipe["model.path"]} is a '
                                   f'{model.model_type!r} model; set model.type={model.model_type} (or '
                                   f'model.type=null to take it from config.json)')
        return cls(backend=plan.backend, verdict=plan.verdict, reasons=list(plan.reasons),
                   num_gpus=int(plan.num_gpus or 1), nodes=int(plan.nodes), ep=int(plan.ep), tp=int(plan.tp),
                   offload=plan.offload, micro_batch=int(plan.micro_batch), is_moe=model.is_moe,
                   model_type=declared or model.model_type, gpu_peak_gib=plan.gpu_peak_gib,
                   host_peak_gib=plan.host_peak_gib, gpu_mem_gib=plan.gpu_capacity_gib, num_layers=model.num_layers,
                   linear_attention_layers=model.num_linear_attention_layers, model=model,
                   checkpoints=plan.checkpoints, checkpoint_layers=plan.checkpoint_layers)

    def described_model(self, model_path: str) -> ModelSpec:
        """The model this view was planned for; a view made without a plan (the Unsloth runner's) reads it with the
        planner's own reader (a local config.json, the HF / ModelScope cache, or a config shipped with swift-vora)."""
        return self.model if self.model is not None else load_model_spec(model_path)


class Launcher:
    """One engine's way to train: the backends it runs and the process it starts for them."""

    backends: Tuple[Backend, ...] = ()
    # `swift sft` / `megatron sft`: a recipe's swift_args and extra_args are that engine's flags, checked by its own
    # argument parser; None: the launcher's own runner, which takes no extra_args and of swift_args only these:
    engine: Optional[str] = None
    # the `swift sft` arguments (ms-swift's names) a runner without an engine takes from swift_args all the same
    swift_args_taken: Tuple[str, ...] = ()
    quantization: bool = False  # train.quantization=4bit (bitsandbytes QLoRA) can be launched

    def build(self, view: PlanView, recipe: Recipe, environ: Optional[Mapping[str, str]] = None) -> Launch:
        """The process that trains `recipe` as the plan (`view`) decided; LaunchUsageError / LaunchRefused."""
        raise NotImplementedError

    def argument_parser(self):
        """The engine's own argument parser (imports the engine; ImportError when it is not installed)."""
        raise ImportError(f'{type(self).__name__} has no engine argument parser')

