"""Which guards exist, which are on, and how they get into ms-swift's trainer.

Each guard is an ms-swift `TrainerCallback` registered in `swift.callbacks.callbacks_map` as `vora_<name>`, so
`--callbacks vora_coverage ...` works like any ms-swift callback. To make them default without a flag, one
narrow patch wraps `SwiftMixin._get_callbacks` (the method that turns `args.callbacks` into callback objects,
swift/trainers/mixin.py): it appends the enabled guards that the command line did not already name. It applies
to ms-swift's SFT-style trainers (`swift.trainers`), not to the RLHF trainers.

Selection, read when the trainer is built:
- `SWIFT_VORA_GUARDS=all` (default) | `none` | a comma list of names, optionally starting from `all` and
  removing some: `all,-memory,-verify_adapter`.
- `SWIFT_VORA_GUARD_<NAME>=0|1` overrides one guard either way (e.g. `SWIFT_VORA_GUARD_VERIFY_ADAPTER=0`).
The same wrap appends the speed levers' callbacks, which are not guards: `vora_lora_autocast`
(swift_vora/lora_autocast.py) unless `SWIFT_VORA_LORA_AUTOCAST_INPUTS=0`, `vora_host_overhead`
(swift_vora/host_overhead.py) unless `SWIFT_VORA_HOST_OVERHEAD=0`, `vora_compile_layers` (swift_vora/compile_layers.py)
when `SWIFT_VORA_COMPILE=layers`, and `vora_pixel_dtype` (swift_vora/pixel_dtype.py: checks the vision tower runs
in the dtype the template hands pixels over in) unless `SWIFT_VORA_PIXEL_DTYPE=float32`.
"""
from __future__ import annotations

import importlib
import os
from typing import Dict, List, Optional

from .. import env_switch

GUARDS_ENV = 'SWIFT_VORA_GUARDS'
PREFIX = 'vora_'
# name -> (module, class); the order is the order the callbacks run in.
GUARDS: Dict[str, tuple] = {
    'fingerprint': ('swift_vora.guards.fingerprint', 'FingerprintGuard'),
    'zero3_load': ('swift_vora.guards.zero3_load', 'Zero3LoadGuard'),
    'memory': ('swift_vora.guards.memory', 'MemoryGuard'),
    'coverage': ('swift_vora.guards.coverage', 'CoverageGuard'),
    'supervision': ('swift_vora.guards.supervision', 'SupervisionGuard'),
    'lora_update': ('swift_vora.guards.lora_update', 'LoraUpdateGuard'),
    'verify_adapter': ('swift_vora.guards.verify_adapter', 'VerifyAdapterGuard'),
}
_TRUE, _FALSE = ('1', 'true', 'yes', 'on'), env_switch.OFF
LORA_AUTOCAST = PREFIX + 'lora_autocast'  # a default callback that is not a guard (SWIFT_VORA_LORA_AUTOCAST_INPUTS)
COMPILE_LAYERS = PREFIX + 'compile_layers'  # opt-in, not a guard (SWIFT_VORA_COMPILE=layers)
HOST_OVERHEAD = PREFIX + 'host_overhead'  # a default callback that is not a guard (SWIFT_VORA_HOST_OVERHEAD)
PIXEL_DTYPE = PREFIX + 'pixel_dtype'  # the check that goes with pixels cast in the workers (SWIFT_VORA_PIXEL_DTYPE)


def enabled_guards(environ: Optional[Dict[str, str]] = None) -> List[str]:
    """The guards switched on by `SWIFT_VORA_GUARDS` and `SWIFT_VORA_GUARD_<NAME>`, in run order."""
    environ = os.environ if environ is None else environ
    spec = (environ.get(GUARDS_ENV) or 'all').strip().lower()
    chosen: List[str] = []
    for token in [t.strip() for t in spec.split(',') if t.strip()]:
        if token == 'all':
            chosen = list(GUARDS)
        elif token == 'none':
            chosen = []
        elif token.startswith('-'):
            name = token[1:]
            _check(name)
            chosen = [n for n in chosen if n != name]
        else:
            _check(token)
            if token not in chosen:
                chosen.append(token)
    for name in GUARDS:
        variable = f'SWIFT_VORA_GUARD_{name.upper()}'
        flag = (environ.get(variable) or '').strip().lower()
        if not flag:
            continue
        if flag not in _TRUE + _FALSE:
            raise ValueError(f'{variable}={flag!r}: expected one of {", ".join(_TRUE + _FALSE)}')
        if flag in _TRUE and name not in chosen:
            chosen.append(name)
        elif flag in _FALSE and name in chosen:
            chosen.remove(name)
    return [name for name in GUARDS if name in chosen]


def _check(name: str) -> None:
    if name not in GUARDS:
        raise ValueError(f'{GUARDS_ENV}: unknown guard {name!r}; known: all, none, {", ".join(GUARDS)}')


def guard_class(name: str):
    module, cls = GUARDS[name]
    return getattr(importlib.import_module(module), cls)


def _applies_to(trainer) -> bool:
    module = type(trainer).__module__
    return not module.startswith(('swift.rlhf_trainers', 'swift.megatron'))


def register_guards() -> None:
    """Put the guards into `callbacks_map` and make the enabled ones default (idempotent)."""
    from swift.callbacks import callbacks_map
    from swift.trainers.mixin import SwiftMixin

    for name in GUARDS:
        callbacks_map.setdefault(PREFIX + name, guard_class(name))
    from ..compile_layers import CompileDecoderLayers, mode as compile_mode
    from ..host_overhead import HostOverhead, enabled as host_overhead_enabled
    from ..lora_autocast import LoraAutocastInputs, enabled as lora_autocast_enabled
    from ..pixel_dtype import PixelDtypeCheck, mode as pixel_mode
    callbacks_map.setdefault(LORA_AUTOCAST, LoraAutocastInputs)
    callbacks_map.setdefault(HOST_OVERHEAD, HostOverhead)
    callbacks_map.setdefault(COMPILE_LAYERS, CompileDecoderLayers)
    callbacks_map.setdefault(PIXEL_DTYPE, PixelDtypeCheck)
    original = SwiftMixin._get_callbacks
    if getattr(original, '_swift_vora_guards', False):
        return

    def _get_callbacks(self, args):
        callbacks = original(self, args)
        if not _applies_to(self):
            return callbacks
        named = set(getattr(args, 'callbacks', None) or [])
        for name in enabled_guards():
            if PREFIX + name not in named:
                callbacks.append(callbacks_map[PREFIX + name](args, self))
        # Not guards, but trainer-level like them: the speed levers (switches read when the trainer is built).
        if lora_autocast_enabled() and LORA_AUTOCAST not in named:
            callbacks.append(LoraAutocastInputs(args, self))
        if host_overhead_enabled() and HOST_OVERHEAD not in named:
            callbacks.append(HostOverhead(args, self))
        if compile_mode() != 'off' and COMPILE_LAYERS not in named:
            callbacks.append(CompileDecoderLayers(args, self))
        if pixel_mode() == 'model' and PIXEL_DTYPE not in named:
            callbacks.append(PixelDtypeCheck(args, self))
        return callbacks

    _get_callbacks._swift_vora_guards = True
    _get_callbacks.__wrapped__ = original
    SwiftMixin._get_callbacks = _get_callbacks
