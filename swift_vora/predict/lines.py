"""The prediction line: one video's answer, written by `swift-vora predict` and read by `predict` (to resume) and
by `swift-vora cut` (docs/contract.md).

    {"id": "day1/cam_a", "video": "/abs/day1/cam_a.mp4", "duration": 600.0,
     "windows": [[12.0, 20.5], [61.0, 64.0]], "kept_seconds": 11.5, "parse_failures": 0,
     "clips": [{"start": 0.0, "end": 60.0, "response": "[[12.0, 20.5]]", "failure": null}, ...],
     "query": "moments worth keeping", "checkpoint": "/abs/output/v0-.../checkpoint-100"}

`windows`: seconds of the source video, sorted, merged by eval's rule (`windows_from_clips`: each clip's answer
parsed and clamped to the clip, shifted to source time; overlapping or touching windows of overlapping clips
joined). `clips`: every clip the model saw, in source seconds, with its raw response and, when the response did
not parse, the kind of failure (`parse_failures` counts them; such a clip keeps nothing).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import jsonl

DECIMALS = 3  # seconds in a line: milliseconds (answers have one decimal; a clip's start is added to them)
REQUIRED = ('id', 'video', 'duration', 'windows')


def make_line(video_id: str, video_path: str, duration: float, clips: Sequence[Dict[str, Any]],
              query: Optional[str], checkpoint: Optional[str]) -> Dict[str, Any]:
    """A video's line from its answered clips (`clip_start`, `clip_end`, `response`, as eval's inference writes
    them), by eval's rule."""
    from ..eval.evaluate import windows_from_clips
    from ..intervals import at_milliseconds
    # the clips as the line holds them (to the millisecond), so that its windows are those its clips give when
    # eval reads the line back
    ordered = sorted(({**c, 'clip_start': _seconds(c['clip_start']), 'clip_end': _seconds(c['clip_end'])}
                      for c in clips), key=lambda c: (c['clip_start'], c['clip_end']))
    prediction = windows_from_clips(video_id, ordered, _seconds(duration))
    failed = {f['line']: f['failure'] for f in prediction.failures}
    windows = at_milliseconds((s, e) for s, e, _ in prediction.windows)
    return {
        'id': video_id, 'video': video_path, 'duration': _seconds(duration),
        'windows': [[s, e] for s, e in windows],
        'kept_seconds': _seconds(sum(e - s for s, e in windows)),
        'parse_failures': len(failed),
        'clips': [{'start': _seconds(c['clip_start']), 'end': _seconds(c['clip_end']), 'response': c['response'],
                   'failure': failed.get(i + 1)} for i, c in enumerate(ordered)],
        'query': query, 'checkpoint': checkpoint,
    }


def _seconds(value: float) -> float:
    return round(float(value), DECIMALS)


def video_path(row: Dict[str, Any], lines_file: str) -> str:
    """The absolute path of a line's video: a relative `video` is read from the folder of the file holding the
    line (docs/contract.md), whatever the current directory."""
    base = os.path.dirname(os.path.abspath(lines_file))
    return os.path.normpath(os.path.join(base, os.path.expanduser(row['video'])))  # an absolute path stays


def check_line(row: Any) -> Optional[str]:
    """Why a line cannot be used (naming the field, as `data check` names an annotation's), or None."""
    from ..data.annotations import FieldProblem, check_duration_value, check_windows
    if not isinstance(row, dict):
        return 'expected a JSON object'
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        return f"field '{missing[0]}': missing (a prediction line has {', '.join(REQUIRED)})"
    if isinstance(row['id'], bool) or not isinstance(row['id'], (str, int)) or not str(row['id']).strip():
        return "field 'id': expected a non-empty string"
    if not isinstance(row['video'], str) or not row['video'].strip():
        return "field 'video': expected the path of the video file"
    try:
        duration = check_duration_value(row['duration'])
        check_windows(row['windows'], duration)
    except FieldProblem as problem:
        index = f'[{problem.index}]' if problem.index is not None else ''
        return f"field '{problem.field_name}'{index}: {problem.message}"
    return None


def read_lines(path: str) -> Tuple[List[Tuple[int, Dict[str, Any]]], List[Dict[str, Any]]]:
    """(every usable line as (1-based line, row); every other line as {'line', 'id', 'reason'}) of the file at
    `path`, blank lines skipped. A second line for an id is a problem naming the first."""
    rows: List[Tuple[int, Dict[str, Any]]] = []
    problems: List[Dict[str, Any]] = []
    first: Dict[str, int] = {}
    for number, text, unreadable in jsonl.read_lines(path, errors='replace'):
        if text is not None and not text.strip():
            continue
        if text is None:
            problems.append({'line': number, 'id': None, 'reason': unreadable})
            continue
        try:
            row = jsonl.loads(text)
        except RecursionError:
            problems.append({'line': number, 'id': None, 'reason': 'not valid JSON: nested too deeply'})
            continue
        except ValueError as exc:
            problems.append({'line': number, 'id': None, 'reason': f'not valid JSON: {str(exc)[:200]}'})
            continue
        reason = check_line(row)
        key = str(row['id']) if isinstance(row, dict) and isinstance(row.get('id'), (str, int)) else None
        if reason is None and key in first:
            reason = f"field 'id': {key!r} again (first on line {first[key]}); one line per video"
        if reason is not None:
            problems.append({'line': number, 'id': key, 'reason': reason})
            continue
        first[key] = number
        rows.append((number, row))
    return rows, problems


def describe_problems(path: str, problems: Sequence[Dict[str, Any]], limit: int = 20) -> str:
    """`PATH:LINE: reason` for each problem (the first `limit`, then how many more)."""
    shown = [f"{path}:{p['line']}: {p['reason']}" for p in problems[:limit]]
    if len(problems) > limit:
        shown.append(f'... and {len(problems) - limit} more')
    return '\n'.join(shown)
