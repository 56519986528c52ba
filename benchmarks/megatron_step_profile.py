"""Where a profiled `megatron sft` step went: its chrome trace (torch_trace.json.gz, written by
swift_vora/backends/megatron_profile.py) attributed to the parts of the step, every millisecond of it once.

    python benchmarks/megatron_step_profile.py OUTPUT/torch_trace.json.gz [--json out.json] [--md out.md]

The step's wall time (the profiled window) is split into
- **data wait**: the GPU idle while the training loop waited in the data iterator's `next()` (`vora/data`, and torch's
  own `enumerate(DataLoader)#...__next__` range);
- **GPU busy** by part of the model -- vision tower, Gated DeltaNet, attention (projections / core), router, expert
  GEMMs, the experts' activation and other kernels, expert LoRA, permutation / dispatch (the MoE layer outside its
  router, experts and shared expert), shared expert, other LoRA, dense MLP, LM head, the decoder's norms and residuals,
  the loss and the glue outside the model -- forward and backward; then **recompute** (a layer's forward run again
  inside the backward by Megatron's recompute) and the **optimizer** (everything inside the optimizer's step: the
  gradient norm, clipping, Adam, copying the fp32 master back to the bf16 weights);
- **host idle**: the rest of the GPU's idle time, each gap charged to the kernel that ended it (the host was still
  making that kernel's launch: a host-bound part shows here).
Kernels overlapping on several streams (Transformer Engine spreads a grouped GEMM over 4) share their overlap
equally, so the rows sum to the window. A kernel is placed by the `record_function` regions open on the host thread
that launched it (the trace links a kernel to its launch by correlation id); a backward kernel by the autograd node
that launched it, through the forward op that created the node (the trace's sequence numbers) -- the regions open
when that forward op ran. Kernel families (GEMM, Triton, copy, ...) are step_timeline.py's, as in the Unsloth
profiles of docs/runs/h200-moe-full/.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import os
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_timeline  # noqa: E402  (kernel families and the GPU categories, shared with the dense profile)

REGION_PREFIX = 'vora/'  # swift_vora/backends/megatron_profile.py's labels
DATA_REGION = 'vora/data'
OPTIMIZER_REGION = 'vora/optimizer'
DATALOADER_MARK = 'enumerate(DataLoader)#'  # torch's own range around DataLoader.__next__
TORCH_OPTIMIZER_MARK = 'Optimizer.step#'  # torch.optim's range around a torch optimizer's step
BACKWARD_OP = 'autograd::engine::evaluate_function: '
HOST_CATEGORIES = ('cpu_op', 'user_annotation')
LAUNCH_CATEGORIES = ('cuda_runtime', 'cuda_driver')

DATA_WAIT = 'data wait'
RECOMPUTE = 'recompute'
OPTIMIZER = 'optimizer'
HOST_IDLE = 'host idle'
GRAD_ACCUMULATION = 'gradient accumulation (DDP main grads)'
UNPLACED = 'not placed (no launch in the trace)'
# The parts of the model a kernel can belong to, by the regions open when it (or its forward op) was launched;
# the first rule whose labels are all open wins.
PARTS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('vision tower', ('vora/vision_tower', )),
    ('expert LoRA', ('vora/experts', 'vora/lora')),
    ('other LoRA (attention, Gated DeltaNet, shared expert)', ('vora/lora', )),
    ('router', ('vora/router', )),
    ('experts', ('vora/experts', )),
    ('shared expert', ('vora/shared_expert', )),
    ('permutation / dispatch', ('vora/moe_layer', )),
    ('Gated DeltaNet', ('vora/gated_deltanet', )),
    ('attention (core)', ('vora/core_attention', )),
    ('attention (projections, norms)', ('vora/attention', )),
    ('dense MLP', ('vora/mlp', )),
    ('LM head', ('vora/output_layer', )),
    ('embedding', ('vora/embedding', )),
    ('decoder (norms, residuals)', ('vora/decoder', )),
)
OUTSIDE = 'loss and glue (outside the model\'s regions)'
GEMM_FAMILIES = ('grouped GEMM (experts)', 'GEMM (dense, LoRA)')
# the row the experts' GEMM kernels take (their activation / copies stay under 'experts')
EXPERT_GEMMS = 'expert GEMMs'


def load_trace(path: str) -> Dict[str, Any]:
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rt', encoding='utf-8') as f:
        return json.load(f)


def _arg(event: Dict[str, Any], key: str, default=None):
    return (event.get('args') or {}).get(key, default)


def enclosing(ranges: List[Tuple[float, float, Any]], queries: List[Tuple[float, Any]]) -> Dict[Any, Tuple[Any, ...]]:
    """For each (time, id) query, the payloads of the ranges (start, end, payload) of one thread open at that time,
    outermost first (host ranges on one thread nest)."""
    ranges = sorted(ranges, key=lambda r: (r[0], -r[1]))
    out: Dict[Any, Tuple[Any, ...]] = {}
    active: List[Tuple[float, float, Any]] = []
    i = 0
    for t, qid in sorted(queries, key=lambda q: q[0]):
        while i < len(ranges) and ranges[i][0] <= t:
            active.append(ranges[i])
            i += 1
        if any(r[1] <= t for r in active):
            active = [r for r in active if r[1] > t]
        out[qid] = tuple(r[2] for r in active)
    return out


def part_of(labels: Iterable[str]) -> str:
    present = set(labels)
    for name, needed in PARTS:
        if all(label in present for label in needed):
            return name
    return OUTSIDE


def _is_gemm(kernel_name: str) -> bool:
    return step_timeline.kernel_family(kernel_name) in GEMM_FAMILIES


def _forward_tids(backward_ops, forward_ops) -> Dict[int, Any]:
    """The trace's autograd thread number (a backward op's 'Fwd thread id') -> the host thread id its forward ops
    have: the thread whose forward ops carry most of that number's sequence numbers, started before."""
    by_seq: Dict[int, List[Tuple[Any, float]]] = collections.defaultdict(list)
    for tid, seq, start in forward_ops:
        by_seq[seq].append((tid, start))
    votes: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for fwd_thread, seq, start in backward_ops:
        for tid, fstart in by_seq.get(seq, ()):
            if fstart <= start:
                votes[fwd_thread][tid] += 1
    return {k: counter.most_common(1)[0][0] for k, counter in votes.items() if counter}


def classify(trace: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Every GPU event of the trace with its phase (forward | backward | recompute | optimizer | data | other) and part;
    and what the placing found (regions seen, backward kernels linked to a forward op)."""
    events = [e for e in trace.get('traceEvents', []) if e.get('ph') == 'X' and 'dur' in e]
    gpu = [e for e in events if e.get('cat') in step_timeline.GPU_CATEGORIES]
    launches = {_arg(e, 'correlation'): e for e in events if e.get('cat') in LAUNCH_CATEGORIES
                and _arg(e, 'correlation') is not None}
    ranges: Dict[Any, List[Tuple[float, float, Any]]] = collections.defaultdict(list)
    forward_queries: Dict[Any, List[Tuple[float, Any]]] = collections.defaultdict(list)
    backward_ops = []
    regions_seen: collections.Counter = collections.Counter()
    for e in events:
        if e.get('cat') not in HOST_CATEGORIES:
            continue
        name, tid = str(e.get('name', '')), e.get('tid')
        start, end = float(e['ts']), float(e['ts']) + float(e['dur'])
        if name.startswith(REGION_PREFIX):
            ranges[tid].append((start, end, ('L', name)))
            regions_seen[name] += 1
        elif name.startswith(DATALOADER_MARK):
            ranges[tid].append((start, end, ('L', DATA_REGION)))
        elif name.startswith(TORCH_OPTIMIZER_MARK):
            ranges[tid].append((start, end, ('L', OPTIMIZER_REGION)))
        elif name.startswith(BACKWARD_OP):
            seq, fwd = _arg(e, 'Sequence number'), _arg(e, 'Fwd thread id')
            ranges[tid].append((start, end, ('B', name[len(BACKWARD_OP):], seq, fwd)))
            if seq is not None and fwd:
                backward_ops.append((fwd, seq, start))
        elif e.get('cat') == 'cpu_op' and _arg(e, 'Sequence number') is not None and not _arg(e, 'Fwd thread id'):
            forward_queries[tid].append((start, (tid, _arg(e, 'Sequence number'), start)))
    # the regions open when each forward op that made an autograd node ran
    forward_labels: Dict[Tuple[Any, int], Tuple[str, ...]] = {}
    forward_ops = []
    for tid, queries in forward_queries.items():
        for (tid_, seq, start), stack in enclosing(ranges[tid], queries).items():
            forward_labels.setdefault((tid_, seq), tuple(p[1] for p in stack if p[0] == 'L'))
            forward_ops.append((tid_, seq, start))
    thread_of = _forward_tids(backward_ops, forward_ops)
    # the host ranges open at each kernel's launch
    launch_queries: Dict[Any, List[Tuple[float, Any]]] = collections.defaultdict(list)
    for index, kernel in enumerate(gpu):
        launch = launches.get(_arg(kernel, 'correlation'))
        if launch is not None:
            launch_queries[launch.get('tid')].append((float(launch['ts']), index))
    stacks: Dict[int, Tuple[Any, ...]] = {}
    for tid, queries in launch_queries.items():
        stacks.update(enclosing(ranges[tid], queries))
    out, linked, backward_total = [], 0.0, 0.0
    for index, kernel in enumerate(gpu):
        dur = float(kernel['dur'])
        row = {'name': str(kernel.get('name', '')), 'start': float(kernel['ts']), 'end': float(kernel['ts']) + dur,
               'dur': dur, 'stream': kernel.get('tid')}
        if index not in stacks:
            row.update(phase='other', part=UNPLACED)
            out.append(row)
            continue
        stack = stacks[index]
        labels = [p[1] for p in stack if p[0] == 'L']
        inner_backward = max((i for i, p in enumerate(stack) if p[0] == 'B'), default=None)
        if OPTIMIZER_REGION in labels:
            row.update(phase='optimizer', part=OPTIMIZER)
        elif inner_backward is not None:
            deeper = [p[1] for p in stack[inner_backward + 1:] if p[0] == 'L']
            if deeper:  # a forward run inside the backward: recomputed
                row.update(phase='recompute', part=part_of(deeper))
            else:
                _, node, seq, fwd = stack[inner_backward]
                found = forward_labels.get((thread_of.get(fwd), seq))
                backward_total += dur
                if found is not None:
                    linked += dur
                    row.update(phase='backward', part=part_of(found))
                elif 'AccumulateGrad' in node:
                    row.update(phase='backward', part=GRAD_ACCUMULATION)
                else:
                    row.update(phase='backward', part=OUTSIDE)
        elif DATA_REGION in labels:
            row.update(phase='data', part=DATA_WAIT)
        elif labels:
            row.update(phase='forward', part=part_of(labels))
        else:
            row.update(phase='other', part=OUTSIDE)
        if row['part'] == 'experts' and _is_gemm(row['name']):
            row['part'] = EXPERT_GEMMS
        out.append(row)
    data_ranges = step_timeline._merged([(s, e) for rs in ranges.values() for s, e, p in rs if p == ('L', DATA_REGION)])
    info = {'regions_seen': dict(regions_seen), 'backward_linked_fraction':
            round(linked / backward_total, 4) if backward_total else None, 'data_ranges': data_ranges,
            'host_window': _host_window(events)}
    return out, info


def _host_window(events) -> Optional[Tuple[float, float]]:
    host = [(float(e['ts']), float(e['ts']) + float(e['dur'])) for e in events
            if e.get('cat') in HOST_CATEGORIES + LAUNCH_CATEGORIES]
    return (min(s for s, _ in host), max(e for _, e in host)) if host else None


def _shares(kernels: Sequence[Dict[str, Any]]) -> List[float]:
    """Each kernel's share of the GPU's busy time: overlapping kernels split their overlap equally."""
    points = sorted([(k['start'], 1, i) for i, k in enumerate(kernels)] + [(k['end'], 0, i) for i, k in
                                                                            enumerate(kernels)])
    share = [0.0] * len(kernels)
    active: set = set()
    last = None
    for t, kind, i in points:
        if active and last is not None and t > last:
            piece = (t - last) / len(active)
            for j in active:
                share[j] += piece
        last = t
        if kind:
            active.add(i)
        else:
            active.discard(i)
    return share


def _overlap(a: Tuple[float, float], ranges: Sequence[Tuple[float, float]]) -> float:
    return sum(max(0.0, min(a[1], e) - max(a[0], s)) for s, e in ranges)


def attribute(trace: Dict[str, Any], top_gaps: int = 15) -> Dict[str, Any]:
    """The step's window split into data wait, GPU busy by part, recompute, optimizer and host idle (module
    docstring); every row in milliseconds and as a share of the window."""
    kernels, info = classify(trace)
    if not kernels:
        return {'error': 'no GPU events in the trace (a CPU-only profile?)'}
    kernels.sort(key=lambda k: k['start'])
    shares = _shares(kernels)
    busy = step_timeline._merged([(k['start'], k['end']) for k in kernels])
    host = info['host_window']
    start = min(busy[0][0], host[0]) if host else busy[0][0]
    end = max(busy[-1][1], host[1]) if host else busy[-1][1]
    window = end - start
    rows: Dict[str, Dict[str, Any]] = {}

    def row(name: str) -> Dict[str, Any]:
        return rows.setdefault(name, {'busy_us': 0.0, 'idle_us': 0.0, 'kernels': 0, 'kernel_us': 0.0,
                                      'phases_us': collections.Counter(), 'families_us': collections.Counter(),
                                      'recomputed_parts_us': collections.Counter()})

    for k, share in zip(kernels, shares):
        name = {'recompute': RECOMPUTE, 'optimizer': OPTIMIZER}.get(k['phase'], k['part'])
        r = row(name)
        r['busy_us'] += share
        r['kernels'] += 1
        r['kernel_us'] += k['dur']
        r['phases_us'][k['phase']] += share
        r['families_us'][step_timeline.kernel_family(k['name'])] += share
        if k['phase'] == 'recompute':
            r['recomputed_parts_us'][k['part']] += share
    # the idle gaps: before the first kernel, between kernels, after the last one
    gaps = []
    edges = [start] + [b for a, b in busy]
    nexts = [a for a, b in busy] + [end]
    starts = [k['start'] for k in kernels]
    for gap_start, gap_end in zip(edges, nexts):
        if gap_end <= gap_start:
            continue
        waited = _overlap((gap_start, gap_end), info['data_ranges'])
        if waited:
            row(DATA_WAIT)['idle_us'] += waited
        rest = gap_end - gap_start - waited
        following = bisect.bisect_left(starts, gap_end)
        charged = kernels[following] if following < len(kernels) else None
        if rest > 0:
            r = row(HOST_IDLE)
            r['idle_us'] += rest
            before = 'after the last kernel' if charged is None else f'{charged["phase"]}: {charged["part"]}'
            r['phases_us'][before] += rest
        gaps.append((gap_end - gap_start, gap_start, waited, charged))
    table = []
    for name, r in rows.items():
        total = r['busy_us'] + r['idle_us']
        table.append({'part': name, 'ms': round(total / 1e3, 3), 'share': round(total / window, 4),
                      'busy_ms': round(r['busy_us'] / 1e3, 3), 'idle_ms': round(r['idle_us'] / 1e3, 3),
                      'kernels': r['kernels'],
                      'mean_kernel_us': round(r['kernel_us'] / r['kernels'], 1) if r['kernels'] else None,
                      'phases_ms': _ms(r['phases_us']), 'families_ms': _ms(r['families_us']),
                      **({'recomputed_parts_ms': _ms(r['recomputed_parts_us'])} if r['recomputed_parts_us'] else {})})
    table.sort(key=lambda t: -t['ms'])
    largest = [{'ms': round(d / 1e3, 3), 'at_ms': round((s - start) / 1e3, 2), 'data_wait_ms': round(w / 1e3, 3),
                'before': None if k is None else f'{k["phase"]}: {k["part"]} ({k["name"][:80]})'}
               for d, s, w, k in sorted(gaps, key=lambda g: -g[0])[:top_gaps]]
    busy_us = sum(b - a for a, b in busy)
    return {'window_ms': round(window / 1e3, 3), 'gpu_busy_ms': round(busy_us / 1e3, 3),
            'gpu_busy_fraction': round(busy_us / window, 4), 'kernels': len(kernels),
            'kernel_sum_ms': round(sum(k['dur'] for k in kernels) / 1e3, 3),
            'data_wait_fraction': round(rows.get(DATA_WAIT, {}).get('idle_us', 0.0) / window, 4),
            'rows': table, 'largest_gaps': largest, 'optimizer_host_ops': optimizer_host_ops(trace),
            'regions_seen': info['regions_seen'],
            'backward_linked_fraction': info['backward_linked_fraction']}


def optimizer_host_ops(trace: Dict[str, Any], top: int = 8) -> List[Dict[str, Any]]:
    """What the host ran inside the optimizer's step (the `vora/optimizer` range on its thread): each host op's name
    with its count and inclusive milliseconds, the longest first. Where the optimizer's GPU work is small and its host
    idle large, this says which Python step held the host (an op nested in another counts in both)."""
    events = [e for e in trace.get('traceEvents', []) if e.get('ph') == 'X' and 'dur' in e
              and e.get('cat') in HOST_CATEGORIES]
    spans = [(float(e['ts']), float(e['ts']) + float(e['dur']), e.get('tid')) for e in events
             if e.get('name') == OPTIMIZER_REGION]
    inclusive: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for e in events:
        name, tid, start = str(e.get('name', '')), e.get('tid'), float(e['ts'])
        if name == OPTIMIZER_REGION:
            continue
        if any(t == tid and a <= start and start + float(e['dur']) <= b for a, b, t in spans):
            inclusive[name] += float(e['dur'])
            count[name] += 1
    return [{'op': name, 'count': count[name], 'ms': round(us / 1e3, 3)} for name, us in inclusive.most_common(top)]


def _ms(counter) -> Dict[str, float]:
    return {k: round(v / 1e3, 3) for k, v in sorted(counter.items(), key=lambda kv: -kv[1]) if v > 0}


def render(result: Dict[str, Any]) -> str:
    if 'error' in result:
        return result['error']
    lines = [f'Profiled step: {result["window_ms"]:,.1f} ms; GPU busy {result["gpu_busy_ms"]:,.1f} ms '
             f'({100 * result["gpu_busy_fraction"]:.1f} %), {result["kernels"]:,} kernels; data wait '
             f'{100 * result["data_wait_fraction"]:.2f} %; backward kernels placed through their forward op: '
             f'{_pct(result["backward_linked_fraction"])}.', '',
             '| part | ms | share | GPU busy ms | idle ms | kernels | mean kernel µs | forward / backward ms |',
             '|---|---|---|---|---|---|---|---|']
    for r in result['rows']:
        ph = r['phases_ms']
        split = (f'{ph.get("forward", 0):,.1f} / {ph.get("backward", 0):,.1f}'
                 if 'forward' in ph or 'backward' in ph else '')
        lines.append(f'| {r["part"]} | {r["ms"]:,.1f} | {100 * r["share"]:.1f} % | {r["busy_ms"]:,.1f} | '
                     f'{r["idle_ms"]:,.1f} | {r["kernels"]:,} | {r["mean_kernel_us"] or ""} | {split} |')
    for r in result['rows']:
        if r['part'] == RECOMPUTE and r.get('recomputed_parts_ms'):
            lines.append('\nRecomputed, by part (ms): ' + ', '.join(f'{k} {v:,.1f}' for k, v in
                                                                    r['recomputed_parts_ms'].items()))
        if r['part'] == HOST_IDLE:
            lines.append('\nHost idle, by the kernel each gap waited for (ms): ' + ', '.join(
                f'{k} {v:,.1f}' for k, v in list(r['phases_ms'].items())[:10]))
    if result.get('optimizer_host_ops'):
        lines.append('\nOn the host inside the optimizer\'s step (inclusive ms, count): ' + ', '.join(
            f'{o["op"][:60]} {o["ms"]:,.1f} ({o["count"]:,})' for o in result['optimizer_host_ops']))
    return '\n'.join(lines)


def _pct(x: Optional[float]) -> str:
    return 'n/a' if x is None else f'{100 * x:.1f} %'


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('trace', help='torch_trace.json.gz (or a plain chrome trace)')
    ap.add_argument('--json', default=None, help='write the attribution here')
    ap.add_argument('--md', default=None, help='write the table here')
    args = ap.parse_args(argv)
    result = attribute(load_trace(args.trace))
    text = render(result)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)
            f.write('\n')
    if args.md:
        with open(args.md, 'w') as f:
            f.write(text + '\n')
    print(text)
    return 0 if 'error' not in result else 1


if __name__ == '__main__':
    sys.exit(main())
