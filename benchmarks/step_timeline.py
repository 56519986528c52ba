"""Where a training step leaves the GPU idle, and which host calls wait for it (throughput.py's diagnostics).

A host-bound step shows up as gaps between kernels. Three instruments, all outside the timed steps:
- `Regions`: `torch.profiler.record_function` marks around the trainer's phases (fetching the batches, the
  vision tower, the language model, backward, the optimizer) so a trace says in which phase each gap falls.
- `gpu_idle(trace)`: from a chrome trace (torch.profiler's `export_chrome_trace`), the time no kernel, copy
  or memset ran, split by the innermost region open at each gap, and the largest gaps with the host calls
  made during them.
- `SyncRecorder` (swift_vora/backends/sync_sites.py, shared with the Unsloth runner's profiled step): every
  synchronising call the Python side makes during one step, counted by its call site.
"""
from __future__ import annotations

import bisect
import collections
import gc
import json
import time
from typing import Any, Dict, List, Optional, Tuple

GPU_CATEGORIES = ('kernel', 'gpu_memcpy', 'gpu_memset')
REGION_PREFIX = 'vora/'

# GPU time of a profiled step by kernel family, for the dense and the MoE benchmarks alike: the first family with a
# key in the lowercased CUDA kernel name wins, so the specific families come before the generic ones.
KERNEL_FAMILIES = [
    ('communication (NCCL)', ('nccl', )),
    # torch._grouped_mm on sm90 is ATen's own CUTLASS 3.x kernel: its (truncated) name shows only
    # `at::cuda::detail::enable_3x_kernel_for_sm9x<... GemmUniversal`, 40 layers x 6 calls a full-depth MoE step.
    # ATen's row-wise FP8 GEMM uses the same wrapper; our FP8 path scales tensor-wise (cuBLAS), so no clash here
    ('grouped GEMM (experts)', ('grouped_mm', 'group_gemm', 'grouped_gemm', 'groupedgemm', 'moe_',
                                'enable_3x_kernel_for_sm9x')),
    ('Gated DeltaNet (fla Triton)', ('chunk_', 'gated_delta', 'recurrent', 'l2norm', 'fused_norm_gate')),
    ('attention', ('flash', 'fmha', 'attention', 'sdpa', 'efficient_attention')),
    ('GEMM (dense, LoRA)', ('gemm', 'sm90_xmma', 'cutlass', 'ampere_', 'sm80_', 'cublas', 'nvjet', 'matmul')),
    ('host<->device copies (inputs, offloaded checkpoints)', ('memcpy', )),
    ('copy / cast / index', ('copy_kernel', 'direct_copy', 'cat_', 'catarray', 'index', 'scatter', 'gather')),
    ('dropout', ('dropout', )),
    ('norm', ('norm', )),
    ('Triton (Liger, compiled, other)', ('triton', 'liger')),
    ('elementwise / reduce (torch)', ('at::native', 'elementwise', 'reduce')),
]


def kernel_family(kernel_name: str) -> str:
    """The KERNEL_FAMILIES name of a CUDA kernel, 'other' when none matches."""
    low = kernel_name.lower()
    return next((family for family, keys in KERNEL_FAMILIES if any(k in low for k in keys)), 'other')


def _merged(intervals: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    out: List[List[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def gpu_idle(trace: Dict[str, Any], min_gap_us: float = 20.0, top: int = 25) -> Dict[str, Any]:
    """GPU idle time of a profiled window: total, by innermost `vora/` region, and the `top` largest gaps.

    Only gaps of at least `min_gap_us` count (a kernel launch's own latency is a few microseconds)."""
    events = [e for e in trace.get('traceEvents', []) if e.get('ph') == 'X' and 'dur' in e]
    busy = _merged([(float(e['ts']), float(e['ts']) + float(e['dur'])) for e in events
                    if e.get('cat') in GPU_CATEGORIES])
    if not busy:
        return {'error': 'no GPU events in the trace'}
    regions = sorted(((float(e['ts']), float(e['ts']) + float(e['dur']), e['name']) for e in events
                      if e.get('cat') == 'user_annotation' and str(e.get('name', '')).startswith(REGION_PREFIX)),
                     key=lambda r: r[0])
    host = sorted(((float(e['ts']), float(e['ts']) + float(e['dur']), e['name'], e.get('cat')) for e in events
                   if e.get('cat') in ('cpu_op', 'cuda_runtime', 'cuda_driver')), key=lambda r: r[0])
    host_starts = [h[0] for h in host]
    gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] >= min_gap_us]
    by_region: Dict[str, float] = collections.defaultdict(float)
    described = []
    for start, end in gaps:
        mid = (start + end) / 2
        inner = [r for r in regions if r[0] <= mid <= r[1]]
        name = min(inner, key=lambda r: r[1] - r[0])[2] if inner else '(no region)'
        by_region[name] += end - start
        described.append((end - start, start, name))
    window = busy[-1][1] - busy[0][0]
    idle = sum(end - start for start, end in gaps)
    largest = []
    for dur, start, name in sorted(described, reverse=True)[:top]:
        lo = bisect.bisect_left(host_starts, start)
        hi = bisect.bisect_right(host_starts, start + dur)
        # The host call running when the GPU ran dry (a sync, a copy) and what the host did during the gap.
        at_start = [h[2] for h in host[max(0, lo - 200):lo] if h[1] >= start and h[3] != 'cpu_op']
        during = collections.Counter(h[2] for h in host[lo:hi] if h[3] == 'cpu_op')
        largest.append({'ms': round(dur / 1e3, 3), 'at_ms': round((start - busy[0][0]) / 1e3, 2), 'region': name,
                        'host_call_when_idle_began': at_start[-1] if at_start else None,
                        'host_ops_during': [f'{k} x{v}' for k, v in during.most_common(8)]})
    return {'window_ms': round(window / 1e3, 3), 'gpu_busy_ms': round(sum(b - a for a, b in busy) / 1e3, 3),
            'gpu_idle_ms': round(idle / 1e3, 3), 'gaps': len(gaps), 'min_gap_us': min_gap_us,
            'idle_ms_by_region': {k: round(v / 1e3, 3) for k, v in sorted(by_region.items(), key=lambda kv: -kv[1])},
            'largest_gaps': largest}


def gpu_idle_from_file(path: str, **kwargs) -> Dict[str, Any]:
    with open(path) as f:
        return gpu_idle(json.load(f), **kwargs)


class GcTimer:
    """Time the interpreter spends in garbage collection (gc.callbacks), per generation."""

    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.count = collections.defaultdict(int)
        self._t0: Optional[float] = None

    def _callback(self, phase, info):
        if phase == 'start':
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            gen = info.get('generation', -1)
            self.seconds[gen] += time.perf_counter() - self._t0
            self.count[gen] += 1
            self._t0 = None

    def start(self):
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def snapshot(self) -> Dict[str, Any]:
        return {'seconds': round(sum(self.seconds.values()), 4), 'collections': dict(self.count),
                'seconds_by_generation': {g: round(s, 4) for g, s in self.seconds.items()}}


class Regions:
    """`record_function` marks around the trainer's phases, so that a trace's gaps can be placed.

    Installed on a trainer once; a mark costs one profiler call and nothing when no profiler runs."""

    def __init__(self, trainer, model=None):
        import torch
        self._rf = torch.autograd.profiler.record_function
        self._open: Dict[int, List[Any]] = collections.defaultdict(list)
        self._wrap(trainer, 'get_batch_samples', 'vora/fetch_batches')
        self._wrap(trainer, 'training_step', 'vora/training_step')
        self._wrap(trainer.accelerator, 'backward', 'vora/backward')
        model = model if model is not None else trainer.model
        for name, module in model.named_modules():
            cls = type(module).__name__
            if cls.endswith('VisionModel'):
                self._hook(module, 'vora/vision_tower')
            elif cls.endswith('TextModel'):
                self._hook(module, 'vora/language_model')
            elif name.endswith('lm_head'):
                self._hook(module, 'vora/lm_head')

    def _wrap(self, owner, attr: str, label: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None or getattr(fn, '_vora_region', False):
            return
        rf = self._rf

        def wrapped(*args, **kwargs):
            with rf(label):
                return fn(*args, **kwargs)

        wrapped._vora_region = True
        setattr(owner, attr, wrapped)

    def _hook(self, module, label: str) -> None:
        rf, opened = self._rf, self._open[id(module)]

        def pre(mod, args):
            mark = rf(label)
            mark.__enter__()
            opened.append(mark)

        def post(mod, args, output):
            if opened:
                opened.pop().__exit__(None, None, None)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
