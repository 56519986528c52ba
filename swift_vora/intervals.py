"""Interval arithmetic and the answer format: the one place that knows how an answer is written.

Intervals are `(start, end)` pairs in seconds, half-open `[start, end)`. An answer is a JSON array of
`[start, end]` pairs relative to the start of the clip the model saw, one decimal, sorted and
non-overlapping; `[]` when nothing in the clip is worth keeping (docs/contract.md).
"""
from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

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


def round_answer(intervals: Iterable[Sequence[float]]) -> List[Interval]:
    """Round to the answer precision, then drop pairs that rounding made empty and re-merge."""
    rounded = [(round(float(s), ANSWER_DECIMALS), round(float(e), ANSWER_DECIMALS)) for s, e in intervals]
    merged, _ = merge((s, e) for s, e in rounded if e > s)
    return merged


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


# --------------------------------------------------------------------------------------------------
# Reading answers back: `parse_answer` (issue 6).
#
# The recognition of what video LLMs actually write (JSON, fenced JSON, objects, "12.0 - 20.5 seconds",
# "from 12s to 20s", mm:ss / hh:mm:ss, <think>/<answer> tags, [s, e, score] triples) lives in
# `answer_parser.py`; this section holds the result type, the repair step and the one public entry
# point. Repairs reuse `clip` and `merge` above, so the parser and the writer agree on what a
# well-formed answer is.
# --------------------------------------------------------------------------------------------------
REPAIR_NAMES = ('swapped', 'clamped', 'dropped_zero', 'dropped_invalid', 'deduplicated', 'merged')


@dataclass
class ParseResult:
    """What `parse_answer` read from one model response.

    `ok` is True when an answer was recognised, including the explicit empty answer `[]`; `windows`
    is then the repaired answer (sorted, non-overlapping, clamped), possibly empty. When `ok` is False
    `windows` is `[]` and `failure` names why (see `answer_parser.FAILURES`).
    """
    windows: List[Interval]
    ok: bool
    failure: Optional[str] = None
    # How the answer was written: 'json', 'json_lenient' (single quotes, tuples, mm:ss inside
    # brackets, trailing commas...), 'text' (ranges in prose), or None on failure.
    format: Optional[str] = None
    # One score per window when the answer carried scores ([s, e, score] triples or a score key);
    # a merged window keeps the highest score of the pairs it absorbed. None when no scores.
    scores: Optional[List[float]] = None
    # Repair counts (pairs affected).
    swapped: int = 0          # end before start: the two values were swapped
    clamped: int = 0          # a value lay outside [0, duration] and was clamped
    dropped_zero: int = 0     # zero length (after swapping and clamping): dropped
    dropped_invalid: int = 0  # an entry that was not a pair of finite numbers: dropped
    deduplicated: int = 0     # exact duplicates removed
    merged: int = 0           # overlapping or touching pairs merged (`merge`)
    # Observations that are not repairs: 'think', 'answer_tag', 'unclosed_answer', 'fenced', 'prose',
    # 'objects', 'timecode', 'units', 'scores', 'unbalanced_tags', 'repetition', 'input_capped'.
    flags: List[str] = field(default_factory=list)

    @property
    def repairs(self) -> Dict[str, int]:
        return {name: getattr(self, name) for name in REPAIR_NAMES}

    @property
    def repaired(self) -> bool:
        return any(self.repairs.values())

    def to_dict(self) -> dict:
        d = asdict(self)
        d['windows'] = [[s, e] for s, e in self.windows]
        return d


def repair_pairs(entries: Iterable[Sequence], duration: Optional[float] = None) -> ParseResult:
    """Turn raw `(start, end[, score])` entries into a well-formed answer and count every repair.

    Order: drop non-finite -> swap reversed -> clamp to `[0, duration]` (`[0, inf)` without a
    duration) -> drop zero-length -> remove exact duplicates -> merge overlapping/touching (`merge`).
    Returns an `ok` result (the caller sets format and flags).
    """
    res = ParseResult(windows=[], ok=True)
    hi = float(duration) if duration is not None and math.isfinite(float(duration)) and float(duration) > 0 \
        else math.inf
    kept: List[Tuple[float, float, Optional[float]]] = []
    seen = set()
    for entry in entries:
        try:
            s, e = float(entry[0]), float(entry[1])
            score = float(entry[2]) if len(entry) > 2 and entry[2] is not None else None
        except (TypeError, ValueError, IndexError):
            res.dropped_invalid += 1
            continue
        if not (math.isfinite(s) and math.isfinite(e)):
            res.dropped_invalid += 1
            continue
        if score is not None and not math.isfinite(score):
            score = None
        if s > e:
            s, e = e, s
            res.swapped += 1
        if s == e:
            res.dropped_zero += 1
            continue
        pieces = clip([(s, e)], 0.0, hi)
        if not pieces or pieces[0] != (s, e):
            res.clamped += 1
        if not pieces:
            res.dropped_zero += 1
            continue
        s, e = pieces[0]
        if (s, e) in seen:
            res.deduplicated += 1
            # keep the best score of duplicates
            if score is not None:
                for i, (ks, ke, kscore) in enumerate(kept):
                    if (ks, ke) == (s, e) and (kscore is None or score > kscore):
                        kept[i] = (ks, ke, score)
            continue
        seen.add((s, e))
        kept.append((s, e, score))
    windows, res.merged = merge((s, e) for s, e, _ in kept)
    res.windows = windows
    if any(score is not None for _, _, score in kept):
        starts = [w[0] for w in windows]
        scores: List[float] = [-math.inf] * len(windows)
        for s, _, score in kept:
            i = bisect_right(starts, s) - 1  # the merged window that contains this pair
            if score is not None and score > scores[i]:
                scores[i] = score
        res.scores = [sc if math.isfinite(sc) else 0.0 for sc in scores]
    return res


def parse_answer(text, duration: Optional[float] = None) -> ParseResult:
    """Read one model response back into `[start, end]` windows; never raises.

    `text`: the raw response (a str; bytes are decoded; an already-decoded JSON value is accepted).
    `duration`: seconds of the clip the model saw; values are clamped to it when given.
    Junk (repetition loops, truncated JSON, tag soup, prose without ranges) gives `ok=False`,
    `windows=[]` and a `failure` name. Inputs longer than `answer_parser.MAX_TEXT_CHARS` are refused
    ('too_long'); the part the format readers look at is capped at `answer_parser.MAX_ANSWER_CHARS`.
    """
    from .answer_parser import parse_answer as _parse  # lazy: answer_parser imports this module
    return _parse(text, duration)
