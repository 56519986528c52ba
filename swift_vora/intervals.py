"""Interval arithmetic and the answer format: the one place that knows how an answer is written.

Intervals are `(start, end)` pairs in seconds, half-open `[start, end)`. An answer is a JSON array of
`[start, end]` pairs relative to the start of the clip the model saw, one decimal, sorted and
non-overlapping; `[]` when nothing in the clip is worth keeping (docs/contract.md). Reading an answer back is
`swift_vora.answer_parser.parse_answer`, which repairs with `clip` and `merge` here, so the parser and the writer
agree on what a well-formed answer is.
"""
from __future__ import annotations

import json
from typing import Iterable, List, Sequence, Tuple

Interval = Tuple[float, float]

ANSWER_DECIMALS = 1


def merge(intervals: Iterable[Sequence[float]]) -> Tuple[List[Interval], int]:
    """Sort and merge overlapping or touching intervals; return them and how many merges happened."""
    ordered = sorted((float(s), float(e)) for s, e in intervals)
    merged: List[Interval] = []
    merges = 0
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            merges += 1
        else:
            merged.append((start, end))
    return merged, merges


def clip(intervals: Iterable[Sequence[float]], lo: float, hi: float, min_length: float = 0.0) -> List[Interval]:
    """Intersect each interval with `[lo, hi)`; drop pieces shorter than `min_length` (and empty ones)."""
    out = []
    for start, end in intervals:
        s, e = max(float(start), lo), min(float(end), hi)
        if e - s > 0 and e - s >= min_length:
            out.append((s, e))
    return out


def rebase(intervals: Iterable[Sequence[float]], origin: float) -> List[Interval]:
    """Shift intervals so that `origin` becomes 0 (source-video time -> clip time)."""
    return [(float(s) - origin, float(e) - origin) for s, e in intervals]


def unbase(intervals: Iterable[Sequence[float]], origin: float) -> List[Interval]:
    """Inverse of `rebase` (clip time -> source-video time)."""
    return [(float(s) + origin, float(e) + origin) for s, e in intervals]


def window_events(intervals: Iterable[Sequence[float]], window_start: float, window_end: float,
                  min_length: float = 0.0) -> List[Interval]:
    """Events of a source video as the clip `[window_start, window_end)` sees them: clipped, rebased."""
    return rebase(clip(intervals, window_start, window_end, min_length), window_start)


def _at_answer_precision(intervals: Iterable[Sequence[float]]) -> List[Interval]:
    return [(round(float(s), ANSWER_DECIMALS), round(float(e), ANSWER_DECIMALS)) for s, e in intervals]


def round_answer(intervals: Iterable[Sequence[float]]) -> List[Interval]:
    """Round to the answer precision, then drop pairs that rounding made empty and re-merge."""
    merged, _ = merge((s, e) for s, e in _at_answer_precision(intervals) if e > s)
    return merged


def rounded_away(intervals: Iterable[Sequence[float]]) -> int:
    """How many pairs rounding to the answer precision makes empty (round_answer drops them): a 0.08 s piece at
    [3.26, 3.34] becomes [3.3, 3.3]."""
    return sum(1 for s, e in _at_answer_precision(intervals) if e <= s)


def at_milliseconds(intervals: Iterable[Sequence[float]]) -> List[Interval]:
    """Sorted windows in seconds to the millisecond, as a prediction line holds them: pairs that rounding makes
    empty are dropped (a clamp at a clip's end leaves slivers like [100.2, 100.2002]) and touching ones merged."""
    merged, _ = merge((s, e) for s, e in ((round(float(s), 3), round(float(e), 3)) for s, e in intervals) if e > s)
    return merged


def rounded_together(intervals: Iterable[Sequence[float]]) -> int:
    """How many pairs rounding to the answer precision joins to a neighbour (round_answer merges them): [2.39, 3.03]
    and [3.05, 26.68] become one [2.4, 26.7]."""
    kept = [(s, e) for s, e in _at_answer_precision(intervals) if e > s]
    return len(kept) - len(merge(kept)[0])


def format_answer(intervals: Iterable[Sequence[float]]) -> str:
    """The exact text the model learns to write, e.g. `[[1.5, 4.0], [7.0, 9.5]]` or `[]`."""
    pairs = round_answer(intervals)
    return json.dumps([[s, e] for s, e in pairs])


def length(intervals: Iterable[Sequence[float]]) -> float:
    """Total covered seconds (intervals are merged first)."""
    merged, _ = merge(intervals)
    return sum(e - s for s, e in merged)


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Temporal IoU of two intervals."""
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(a[1], b[1]) - min(a[0], b[0])
    return inter / union if union > 0 else 0.0


def overlap_seconds(a: Iterable[Sequence[float]], b: Iterable[Sequence[float]]) -> float:
    """Seconds covered by both interval sets."""
    ma, _ = merge(a)
    mb, _ = merge(b)
    total, i, j = 0.0, 0, 0
    while i < len(ma) and j < len(mb):
        total += max(0.0, min(ma[i][1], mb[j][1]) - max(ma[i][0], mb[j][0]))
        if ma[i][1] < mb[j][1]:
            i += 1
        else:
            j += 1
    return total
