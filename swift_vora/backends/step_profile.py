"""One optimizer step under torch.profiler, for the runners that own their training loop (the Unsloth runner).

`SWIFT_VORA_PROFILE_STEP=N` profiles step N (1-based; all its micro-batches and the optimizer step) and writes,
next to the run's other files:
- `torch_profile.txt`: torch's own table of the ops, sorted by device time (what a user reads first);
- `torch_profile.json`: the step's wall seconds, the device time summed over kernels, and the top 200 events
  (name, device time in us, calls, whether it is a device kernel) -- the raw numbers a benchmark groups by family;
- `torch_profile_stacks.txt`: the same ops grouped by the Python lines that called them (5 frames deep), and
  `torch_profile_shapes.txt` by their input shapes: where a kernel family comes from (call e of #30 had 1,085 bf16
  adds and 240 strided copies a step that the op table alone could not place);
- `syncs` in the JSON: the step's synchronising calls from Python by call site (backends/sync_sites.py) -- where the
  host makes the GPU wait (21 `cudaStreamSynchronize` a step at full depth, #30 call j, places unknown).
Profiling (with stacks and shapes) slows the profiled step: take a step outside the measured ones.
`megatron sft` profiles through backends/megatron_profile.py with this class, without stacks and shapes (a Megatron
MoE step launches ~10^5 kernels) and with the chrome trace kept (`torch_trace.json.gz`, `trace=True`): what
benchmarks/megatron_step_profile.py attributes.

    python -m swift_vora.backends.step_profile recount torch_profile.json   # an older file without annotations
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional

from swift_vora import switches

TOP_EVENTS = 200
STACK_DEPTH = 5  # Python frames per group in torch_profile_stacks.txt
TABLE_ROWS = 60


class StepProfiler:
    """`with profiler.step(n):` around optimizer step n (1-based); a no-op for every other step."""

    def __init__(self, out_dir: str, step: Optional[int] = None, stacks: bool = True, trace: bool = False):
        self.out_dir = out_dir
        self.target = switches.read('SWIFT_VORA_PROFILE_STEP') if step is None else step
        self.stacks = stacks  # Python stacks and input shapes (the grouped tables); off: a smaller, faster profile
        self.trace = trace  # also keep the chrome trace, gzipped (TRACE_FILE)
        self.written: Optional[str] = None
        self.trace_written: Optional[str] = None

    def step(self, n: int) -> '_StepContext':
        return _StepContext(self, n if self.target and n == self.target else None)


class _StepContext:
    def __init__(self, owner: StepProfiler, n: Optional[int]):
        self.owner, self.n, self.prof, self.t0, self.syncs = owner, n, None, 0.0, None

    def __enter__(self):
        if self.n is None:
            return self
        import torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        # the Python frames of each op need the profiler's verbose mode (torch 2.11-2.14: without it no stack is kept)
        config = getattr(torch.profiler, '_ExperimentalConfig', None)
        stacks = self.owner.stacks
        extra = {'experimental_config': config(verbose=True)} if config is not None and stacks else {}
        self.prof = torch.profiler.profile(activities=activities, record_shapes=stacks, with_stack=stacks, **extra)
        self.prof.__enter__()
        from .sync_sites import SyncRecorder
        self.syncs = SyncRecorder().__enter__()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.prof is None:
            return False
        self.syncs.__exit__(exc_type, exc, tb)  # first: the wall clock's own synchronize below is not the step's
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - self.t0
        self.prof.__exit__(exc_type, exc, tb)
        if exc_type is None:
            self.owner.written = write_profile(self.prof, self.owner.out_dir, self.n, wall, self.syncs.summary(),
                                               grouped=self.owner.stacks)
            if self.owner.trace:
                self.owner.trace_written = write_trace(self.prof, self.owner.out_dir)
        return False


def is_annotation(name: str) -> bool:
    """A GPU user annotation: inductor's '## Call CompiledFxGraph <key> ##' range spans kernels counted already."""
    return name.startswith('## ') and name.endswith(' ##')


def recount(profile: Dict[str, Any]) -> Dict[str, Any]:
    """A torch_profile.json written before annotations were told apart (2026-12-03, #30 call f), recounted: device
    kernel seconds and busy fraction without them (over its kept top events), and what they had added."""
    spans = sum(e['device_us'] for e in profile['events'] if e['kernel'] and is_annotation(e['name'])) / 1e6
    kernel_s = profile['device_kernel_s'] - spans
    return {'device_kernel_s': round(kernel_s, 4), 'annotation_s': round(spans, 4),
            'device_busy_fraction': round(kernel_s / profile['wall_s'], 4) if profile['wall_s'] > 0 else None}


TRACE_FILE = 'torch_trace.json.gz'


def write_trace(prof, out_dir: str) -> str:
    """The profiled step's chrome trace, gzipped next to torch_profile.json; returns its path."""
    import gzip
    import shutil
    plain = os.path.join(out_dir, 'torch_trace.json')
    prof.export_chrome_trace(plain)
    path = os.path.join(out_dir, TRACE_FILE)
    with open(plain, 'rb') as src, gzip.open(path, 'wb', compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(plain)
    return path


def write_profile(prof, out_dir: str, step: int, wall_s: float, syncs: Optional[Dict[str, Any]] = None,
                  grouped: bool = True) -> str:
    """torch_profile.txt + torch_profile.json (module docstring), and the tables grouped by stack and shape when
    they were recorded (`grouped`); returns the JSON's path."""
    events = prof.key_averages()
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, 'torch_profile.txt'), 'w', encoding='utf-8') as f:
        f.write(f'optimizer step {step}: {wall_s:.3f} s wall\n')
        f.write(events.table(sort_by='self_device_time_total', row_limit=TABLE_ROWS))
    views = (('stacks', dict(group_by_stack_n=STACK_DEPTH)), ('shapes', dict(group_by_input_shape=True)))
    for name, by in views if grouped else ():
        with open(os.path.join(out_dir, f'torch_profile_{name}.txt'), 'w', encoding='utf-8') as f:
            f.write(f'optimizer step {step}: {wall_s:.3f} s wall; ops grouped by {name}\n')
            f.write(prof.key_averages(**by).table(sort_by='self_device_time_total', row_limit=TABLE_ROWS))
    rows: List[Dict[str, Any]] = []
    kernel_us = 0.0
    for e in events:
        device_us = float(getattr(e, 'self_device_time_total', 0.0) or 0.0)
        is_kernel = (getattr(e, 'device_type', None) is not None and 'CUDA' in str(e.device_type)
                     and not bool(getattr(e, 'is_user_annotation', False)) and not is_annotation(e.key))
        if is_kernel:
            kernel_us += device_us
        rows.append({'name': e.key[:160], 'device_us': round(device_us, 1), 'calls': int(e.count),
                     'kernel': is_kernel, 'cpu_us': round(float(getattr(e, 'self_cpu_time_total', 0.0) or 0.0), 1)})
    rows.sort(key=lambda r: (-r['device_us'], -r['cpu_us']))
    # the CUDA runtime calls (launches, syncs, copies): a host that waits in cudaStreamSynchronize / a DtoH copy is
    # where the device goes idle; these have no device time and fall outside the top events
    runtime = {r['name']: {'calls': r['calls'], 'cpu_us': r['cpu_us']} for r in rows
               if r['name'].startswith('cuda') and not r['kernel']}
    summary = {'step': step, 'wall_s': round(wall_s, 4), 'device_kernel_s': round(kernel_us / 1e6, 4),
               'device_busy_fraction': round(kernel_us / 1e6 / wall_s, 4) if wall_s > 0 else None,
               'cuda_runtime': runtime, 'syncs': syncs, 'events': rows[:TOP_EVENTS]}
    path = os.path.join(out_dir, 'torch_profile.json')
    with open(path, 'w', encoding='utf-8') as f:
        json.dump(summary, f, indent=1)
    return path


if __name__ == '__main__':
    import sys
    if len(sys.argv) != 3 or sys.argv[1] != 'recount':
        sys.exit('usage: python -m swift_vora.backends.step_profile recount torch_profile.json')
    with open(sys.argv[2]) as f:
        print(json.dumps(recount(json.load(f))))
