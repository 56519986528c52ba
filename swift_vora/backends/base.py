"""The shape of a backend: a `Launcher` turns a plan and a recipe into a `Launch` (argv, environment, files).

One launcher per engine, each in its own module: `SwiftSft` (deepspeed.py: ddp and DeepSpeed ZeRO-2/3 through
`swift sft`), `MegatronSft` (megatron.py: `megatron sft`), `UnslothRunner` (unsloth.py: our runner). launch.py keeps
the list of them and asks each in turn, as PEFT's `_create_new_module` asks its dispatchers; a new backend is a
`Backend` member (swift_vora/plan/backend.py), the planner's rules and memory model for it, and one launcher here.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from ..plan.backend import Backend

if TYPE_CHECKING:  # pragma: no cover
    from .common import PlanView
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
    if value.startswith('${') and value.endswith('}') and ':?' in value:
        return f'"{value}"'
    return shlex.quote(value)


class Launcher:
    """One engine's way to train: the backends it runs and the process it starts for them."""

    backends: Tuple[Backend, ...] = ()
    # `swift sft` / `megatron sft`: a recipe's swift_args and extra_args are that engine's flags, checked by its own
    # argument parser; None: the launcher's own runner, which takes neither
    engine: Optional[str] = None
    quantization: bool = False  # train.quantization=4bit (bitsandbytes QLoRA) can be launched

    def build(self, view: 'PlanView', recipe: 'Recipe', environ: Optional[Mapping[str, str]] = None) -> Launch:
        """The process that trains `recipe` as the plan (`view`) decided; LaunchUsageError / LaunchRefused."""
        raise NotImplementedError

    def argument_parser(self):
        """The engine's own argument parser (imports the engine; ImportError when it is not installed)."""
        raise ImportError(f'{type(self).__name__} has no engine argument parser')

