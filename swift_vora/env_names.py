"""Every `SWIFT_VORA_*` environment variable swift-vora reads, and a warning for the ones it does not.

A misspelt variable (`SWIFT_VORA_MAX_FRAME=16`) is otherwise silently ignored and the run uses the default, so
`swift-vora` and the plugin (imported by `swift sft --custom_register_path swift_vora`) warn about any
`SWIFT_VORA_*` name in the environment that nothing reads, with the closest known name (difflib).

The names built from other tables (the video budget's fields, one switch per guard) are derived from those
tables, so they cannot drift; tests/test_env_names.py checks that every name spelt out in the code, scripts and
documentation is known here.
"""
from __future__ import annotations

import difflib
import os
from typing import List, Mapping, Optional, Tuple

PREFIX = 'SWIFT_VORA_'

# Read by name somewhere in swift_vora/, scripts/ or benchmarks/ (the module that reads it in the comment).
NAMED = {
    'WINDOW', 'STRIDE', 'MIN_EVENT', 'VIDEO_ROOT',  # dataset.py: windowing of annotation files
    'ENCODE_LOG', 'LOG_FIRST', 'TAIL',  # template.py, guards/coverage.py
    'RECIPE', 'RECIPE_OVERRIDES',  # guards/fingerprint.py (set by `swift-vora train`)
    'GUARDS', 'MEMORY_FIRST', 'MEMORY_EVERY', 'MEMINFO', 'LORA_CHECK_STEPS', 'ZERO3_LOAD', 'VERIFY_TIMEOUT',
    'CGROUP_ROOT',  # guards/*, plan/probe.py
    'PROBE_TORCH',  # plan/probe.py (doctor)
    'COMPILE', 'COMPILE_VISION', 'COMPILE_CHECKPOINT', 'COMPILE_BACKEND', 'COMPILE_MODE', 'PAD_MULTIPLE',
    'LORA_AUTOCAST_INPUTS', 'VIT_ATTENTION', 'PIXEL_DTYPE', 'HOST_OVERHEAD', 'DECODE_THREADS',  # speed levers
    'TINY_MODEL', 'REPLICATE_TINY',  # tiny_model.py, tests
    'PYTHON', 'WHEELS', 'SITE',  # scripts/gpu/setup_env.sh
    'BENCH_DIR', 'BENCH_TORCH_PROFILE', 'BENCH_SYNC_DEBUG', 'WORKER_NICE',  # benchmarks/
}


def known_names() -> List[str]:
    """Every SWIFT_VORA_* name something reads, sorted."""
    from .budget import VideoBudget
    from dataclasses import fields
    names = {PREFIX + n for n in NAMED}
    names |= {PREFIX + f.name.upper() for f in fields(VideoBudget)}  # budget.py: VideoBudget.from_env
    try:
        from .guards.registry import GUARDS
        names |= {f'{PREFIX}GUARD_{g.upper()}' for g in GUARDS}  # guards/registry.py: one switch per guard
    except ImportError:
        pass
    return sorted(names)


def unknown_names(environ: Optional[Mapping[str, str]] = None) -> List[Tuple[str, Optional[str]]]:
    """(name, closest known name or None) for each SWIFT_VORA_* variable in `environ` that nothing reads."""
    environ = os.environ if environ is None else environ
    known = known_names()
    out = []
    for name in sorted(environ):
        if name.startswith(PREFIX) and name not in known:
            # compared without the shared prefix, which would make every name look close
            close = difflib.get_close_matches(name[len(PREFIX):], [k[len(PREFIX):] for k in known], n=1, cutoff=0.6)
            out.append((name, PREFIX + close[0] if close else None))
    return out


def unknown_name_warnings(environ: Optional[Mapping[str, str]] = None) -> List[str]:
    return [f'{name} is set but swift-vora does not read it' + (f' (did you mean {close}?)' if close else
                                                              '; `python -m swift_vora.env_names` lists the ones it reads')
            for name, close in unknown_names(environ)]


if __name__ == '__main__':
    print('\n'.join(known_names()))
