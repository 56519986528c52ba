"""Which guards exist and which are on.

Each guard is an ms-swift `TrainerCallback`, registered as `vora_<name>` and appended to the trainer's callbacks
when enabled by the plugin's wiring (swift_vora/swift_registry.py, which also appends the speed levers').
Under `megatron sft` the guards of `MEGATRON_GUARDS` run as Megatron-SWIFT callbacks (guards/megatron.py),
registered under the same `vora_<name>` in `megatron_callbacks_map` and named by the launch's `--callbacks`.

Selection, read when the trainer is built:
- `SWIFT_VORA_GUARDS=all` (default) | `none` | a comma list of names, optionally starting from `all` and
  removing some: `all,-memory,-verify_adapter`.
- `SWIFT_VORA_GUARD_<NAME>=0|1` overrides one guard either way (e.g. `SWIFT_VORA_GUARD_VERIFY_ADAPTER=0`).
"""
from __future__ import annotations

import importlib
from typing import Dict, List, Optional

from .. import switches

GUARDS_ENV = 'SWIFT_VORA_GUARDS'
# name -> (module, class); the order is the order the callbacks run in. Each has its switch SWIFT_VORA_GUARD_<NAME>
# (swift_vora/switches.py GUARD_NAMES, the same names in the same order).
GUARDS: Dict[str, tuple] = {
    'fingerprint': ('swift_vora.guards.fingerprint', 'FingerprintGuard'),
    'zero3_load': ('swift_vora.guards.zero3_load', 'Zero3LoadGuard'),
    'memory': ('swift_vora.guards.memory', 'MemoryGuard'),
    'coverage': ('swift_vora.guards.coverage', 'CoverageGuard'),
    'supervision': ('swift_vora.guards.supervision', 'SupervisionGuard'),
    'lora_update': ('swift_vora.guards.lora_update', 'LoraUpdateGuard'),
    'verify_adapter': ('swift_vora.guards.verify_adapter', 'VerifyAdapterGuard'),
}

# name -> class in swift_vora.guards.megatron: the guards that also run under `megatron sft`.
MEGATRON_GUARDS: Dict[str, str] = {
    'fingerprint': 'MegatronFingerprintGuard',
    'memory': 'MegatronMemoryGuard',
    'lora_update': 'MegatronLoraUpdateGuard',
}


def enabled_guards(environ: Optional[Dict[str, str]] = None) -> List[str]:
    """The guards switched on by `SWIFT_VORA_GUARDS` and `SWIFT_VORA_GUARD_<NAME>`, in run order. The list's words
    are checked by swift_vora/switches.py where every command reads the environment (a SwitchError, a ValueError,
    names an unknown one)."""
    spec = switches.read(GUARDS_ENV, environ).lower()
    chosen: List[str] = []
    for token in [t.strip() for t in spec.split(',') if t.strip()]:
        if token == 'all':
            chosen = list(GUARDS)
        elif token == 'none':
            chosen = []
        elif token.startswith('-'):
            chosen = [n for n in chosen if n != token[1:]]
        else:
            if token not in chosen:
                chosen.append(token)
    for name in GUARDS:
        flag = switches.read(f'SWIFT_VORA_GUARD_{name.upper()}', environ)
        if flag is True and name not in chosen:
            chosen.append(name)
        elif flag is False and name in chosen:
            chosen.remove(name)
    return [name for name in GUARDS if name in chosen]


def guard_class(name: str):
    module, cls = GUARDS[name]
    return getattr(importlib.import_module(module), cls)


def megatron_guard_class(name: str):
    """The Megatron-SWIFT callback of guard `name` (imports torch; megatron itself is not needed)."""
    return getattr(importlib.import_module('swift_vora.guards.megatron'), MEGATRON_GUARDS[name])
