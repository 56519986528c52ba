"""Where compiled kernels and autotuning results persist between launches, and whether a launch found them warm.

The Unsloth path's first optimizer step compiles and autotunes Triton kernels (the Gated DeltaNet kernels
unsloth_zoo vendors, Unsloth's own kernels) and traces torch.compile regions. Done once per machine, that is minutes;
done again in every process, it is minutes per launch. Three caches keep the work between processes:

- Triton's cache (`TRITON_CACHE_DIR`): compiled kernels, and autotuning timings for every autotuner that asks for
  them -- flash-linear-attention does (`FLA_CACHE_RESULTS`, on by default); `TRITON_CACHE_AUTOTUNING=1` asks it of
  the others too (Triton's `knobs.autotuning.cache`; an autotuner whose configs carry pre-hooks still re-runs).
- Inductor's cache (`TORCHINDUCTOR_CACHE_DIR`): torch.compile's generated code and FX graphs.
- Unsloth's generated modules (`UNSLOTH_COMPILE_LOCATION`): written once, imported by later runs.

All three go under one folder, `SWIFT_VORA_CACHE_DIR` (default `$XDG_CACHE_HOME/swift_vora`, else
`~/.cache/swift_vora`), so that one volume mounted there keeps a container's launches fast. A variable the user set
is left as it is -- except torch's own default for inductor: `import torch._dynamo` (which transformers and peft do)
writes `/tmp/torchinductor_<user>` into the environment, so that value is torch's, not a choice (#30 call j found
inductor's entries there). `first_step_report` says how long the first step took and how many cache entries it had
to write (none: everything it needed was there -- a warm cache); `FirstStepClock` takes it inside a training loop
that only offers step events (the Megatron-SWIFT callbacks: `megatron sft` processes use the same caches).
"""
from __future__ import annotations

import contextlib
import getpass
import os
import re
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, Mapping, Optional

from .. import switches

CACHE_DIR_SWITCH = 'SWIFT_VORA_CACHE_DIR'
# variable -> sub-folder of the cache root
CACHE_FOLDERS = {
    'TRITON_CACHE_DIR': 'triton',
    'TORCHINDUCTOR_CACHE_DIR': 'inductor',
    'UNSLOTH_COMPILE_LOCATION': 'unsloth_compiled',
}
# Autotuning timings on disk for every Triton autotuner (fla's already ask for it; Unsloth's and others do not).
AUTOTUNE_ENV = {'TRITON_CACHE_AUTOTUNING': '1', 'FLA_CACHE_RESULTS': '1'}
# A count, not an inventory: stop walking a huge cache after this many files (the report says "at least").
MAX_COUNTED_FILES = 200_000


def cache_root(environ: Optional[Mapping[str, str]] = None) -> str:
    environ = os.environ if environ is None else environ
    configured = switches.read(CACHE_DIR_SWITCH, environ)
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    base = environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'swift_vora')


def torch_default_inductor_dir() -> str:
    """The folder torch's inductor falls back to (torch._inductor.runtime.cache_dir_utils.default_cache_dir), worked
    out the same way without importing torch."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError, ModuleNotFoundError):  # a uid with no passwd entry, no pwd module: compare with nothing
        return ''
    return os.path.join(tempfile.gettempdir(), 'torchinductor_' + re.sub(r'[\\/:*?"<>|]', '_', user))


def user_value(var: str, environ: Mapping[str, str]) -> Optional[str]:
    """The caller's own value of a cache variable, or None where it is unset or is torch's default written by
    `import torch._dynamo` (not a choice anybody made)."""
    value = environ.get(var)
    if not value:
        return None
    if var == 'TORCHINDUCTOR_CACHE_DIR' and os.path.abspath(value) == os.path.abspath(torch_default_inductor_dir()):
        return None
    return value


def cache_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The cache variables to add to a launch: every one the caller's environment does not set already."""
    environ = os.environ if environ is None else environ
    root = cache_root(environ)
    env = {var: os.path.join(root, sub) for var, sub in CACHE_FOLDERS.items() if user_value(var, environ) is None}
    env.update({k: v for k, v in AUTOTUNE_ENV.items() if k not in environ})
    return env


def use_in_this_process() -> Dict[str, str]:
    """Put the cache variables into this process's environment -- before anything compiles or autotunes; a value
    the user set is kept, torch's default for inductor is replaced. Returns what was added."""
    added = cache_env()
    os.environ.update(added)
    return added


@contextlib.contextmanager
def kept_through_imports() -> Iterator[None]:
    """Put back, after the block, every cache variable this process had before it that the block removed or changed.
    Unsloth's import removes `TORCHINDUCTOR_CACHE_DIR` (unsloth_zoo/patching_utils.py: `os.environ.pop`), and
    inductor then writes into /tmp/torchinductor_<user>, outside the folder a user mounts to keep launches fast
    (call g of #30 found it there). Inductor reads the variable each time it needs the folder, so restoring it after
    the import is enough."""
    saved = {var: os.environ[var] for var in CACHE_FOLDERS if var in os.environ}
    try:
        yield
    finally:
        for var, value in saved.items():
            if os.environ.get(var) != value:
                os.environ[var] = value


def cache_dirs(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """variable -> the folder in effect (the caller's value, else ours)."""
    environ = os.environ if environ is None else environ
    root = cache_root(environ)
    return {var: user_value(var, environ) or os.path.join(root, sub) for var, sub in CACHE_FOLDERS.items()}


def count_entries(path: str, limit: int = MAX_COUNTED_FILES) -> int:
    """Files under `path` (0 when it does not exist), at most `limit`."""
    n = 0
    for _, _, files in os.walk(path):
        n += len(files)
        if n >= limit:
            return limit
    return n


def snapshot(environ: Optional[Mapping[str, str]] = None) -> Dict[str, int]:
    return {var: count_entries(path) for var, path in cache_dirs(environ).items()}


def first_step_report(seconds: float, before: Mapping[str, int], after: Mapping[str, int],
                      environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """How long the first optimizer step took and what it had to add to each cache. `warm` is true when it added
    nothing: every kernel, autotuning result and compiled graph it used came from an earlier process."""
    written = {var: max(0, after.get(var, 0) - before.get(var, 0)) for var in CACHE_FOLDERS}
    return {
        'first_step_s': round(seconds, 2),
        'cache_dirs': cache_dirs(environ),
        'cache_entries_before': dict(before),
        'cache_entries_written': written,
        'warm': not any(written.values()),
    }


class FirstStepClock:
    """The first optimizer step of a process, timed from its step-begin event to its step-end event, and what it
    added to the caches (`first_step_report`). The caches are counted at train begin (or, without that event, at the
    first step's begin), so the load before training is not in the count."""

    def __init__(self, environ: Optional[Mapping[str, str]] = None) -> None:
        self.environ = environ
        self.before: Optional[Dict[str, int]] = None
        self.start: Optional[float] = None
        self.report: Optional[Dict[str, Any]] = None

    def train_begin(self) -> None:
        self.before = snapshot(self.environ)

    def step_begin(self) -> None:
        if self.start is None and self.report is None:
            if self.before is None:
                self.before = snapshot(self.environ)
            self.start = time.perf_counter()

    def step_end(self, synchronize: Optional[Callable[[], None]] = None) -> Optional[Dict[str, Any]]:
        """The report once, at the first step's end (`synchronize`: wait for the device's queued work first);
        None at every other step."""
        if self.start is None or self.report is not None:
            return None
        if synchronize is not None:
            synchronize()
        self.report = first_step_report(time.perf_counter() - self.start, self.before or {}, snapshot(self.environ),
                                        self.environ)
        return self.report


def describe(report: Mapping[str, Any], environ: Optional[Mapping[str, str]] = None) -> str:
    written = report['cache_entries_written']
    if report['warm']:
        state = 'warm cache: nothing compiled or autotuned'
    else:
        parts = [f'{n} {CACHE_FOLDERS[var]}' for var, n in written.items() if n]
        state = 'cold cache: wrote ' + ', '.join(parts) + ' entries (the next launch reuses them)'
    dirs = report['cache_dirs']
    root = cache_root(environ)
    if all(os.path.dirname(d) == root for d in dirs.values()):
        where = f'caches under {root}'
    else:  # some set by the user elsewhere
        where = 'caches: ' + ', '.join(f'{CACHE_FOLDERS[var]} {d}' for var, d in dirs.items())
    return f'first step took {report["first_step_s"]:.1f} s ({state}; {where})'


class TritonActivity:
    """What Triton did while installed: kernels compiled or loaded from its cache, autotuners that benchmarked their
    configs or read the timings from disk -- through Triton's own listeners (`triton.knobs.compilation.listener`,
    `knobs.autotuning.listener`). A Triton without them (older than the knobs API) leaves `available` False."""

    def __init__(self) -> None:
        self.available = False
        self.compiled = 0
        self.compile_cache_hits = 0
        self.autotuned = 0
        self.autotune_cache_hits = 0
        self.autotune_s = 0.0
        self._knobs: Any = None
        self._previous: Dict[str, Any] = {}

    @classmethod
    def install(cls) -> 'TritonActivity':
        activity = cls()
        try:
            from triton import knobs
        except ImportError:
            return activity
        compilation, autotuning = getattr(knobs, 'compilation', None), getattr(knobs, 'autotuning', None)
        if not (hasattr(compilation, 'listener') and hasattr(autotuning, 'listener')):
            return activity
        activity._knobs = knobs
        activity._previous = {'compilation': compilation.listener, 'autotuning': autotuning.listener}
        compilation.listener = activity._on_compile
        autotuning.listener = activity._on_autotune
        activity.available = True
        return activity

    def _on_compile(self, **kwargs: Any) -> None:
        if kwargs.get('cache_hit'):
            self.compile_cache_hits += 1
        else:
            self.compiled += 1
        previous = self._previous.get('compilation')
        if previous is not None:
            previous(**kwargs)

    def _on_autotune(self, **kwargs: Any) -> None:
        if kwargs.get('cache_hit'):
            self.autotune_cache_hits += 1
        else:
            self.autotuned += 1
            self.autotune_s += float(kwargs.get('duration') or 0.0)
        previous = self._previous.get('autotuning')
        if previous is not None:
            previous(**kwargs)

    def remove(self) -> None:
        if self._knobs is not None:
            self._knobs.compilation.listener = self._previous['compilation']
            self._knobs.autotuning.listener = self._previous['autotuning']
            self._knobs = None

    def summary(self) -> Dict[str, Any]:
        if not self.available:
            return {'available': False}
        return {'available': True, 'kernels_compiled': self.compiled, 'kernels_from_cache': self.compile_cache_hits,
                'autotuned': self.autotuned, 'autotune_s': round(self.autotune_s, 2),
                'autotune_from_cache': self.autotune_cache_hits}

    def describe(self) -> str:
        if not self.available:
            return ''
        return (f'; Triton: {self.compiled} kernels compiled, {self.compile_cache_hits} from its cache, '
                f'{self.autotuned} autotuned ({self.autotune_s:.1f} s benchmarking), '
                f'{self.autotune_cache_hits} autotuning results read from disk')
