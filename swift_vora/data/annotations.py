"""The annotation file: read it, validate every line, and account for every line.

Format (docs/contract.md), one video per JSONL line:
`{"id": str, "video": path, "duration": seconds (optional, probed if absent), "query": str (optional),
"windows": [[start, end], ...]}` — seconds, half-open, relative to the video file. A relative `video`
is resolved against `video_root` when given, else against the annotation file's directory.
QVHighlights lines (`qid`, `vid`, `relevant_windows`, ...) are read too (see `qvhighlights.py`).

Why it is this strict: bad rows never fail loudly later. ms-swift deletes a row whose preprocessing
raises with one log line, and a window past the end of a video trains the model on frames that do not
exist. So every problem is reported here with the file, the 1-based line and the field, nothing is
dropped without being counted, and `strict=True` stops at the first problem.

What is repaired rather than rejected (and reported): overlapping or touching windows are merged
(`Annotation.merged_overlaps`); a window end up to `WINDOW_TOLERANCE` seconds past the duration is
clamped to the duration (float noise from tools that write `duration` and `end` separately).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .. import intervals, jsonl
from . import qvhighlights
from .probe import VideoInfo, VideoProbeError, check_file, probe_video

# Seconds a window end may exceed the duration before it is an error; such ends are clamped.
WINDOW_TOLERANCE = 1e-3
# A declared duration longer than the decoded file by more than this many seconds is an error: clips past
# the real end would train on frames that do not exist (shorter by up to this much is container noise).
DURATION_MISMATCH_S = 1.0
# Longest duration a line may declare (one week). Windows and saliency arrays are sized from the duration,
# so an absurd value (1e9 s) must be rejected here rather than allocated later.
MAX_DURATION_S = 7 * 24 * 3600.0
# The shortest clip a training sample can be cut from: two frames (the vision tower's temporal patch) of a 20-fps
# video. A declared `1e-300` passed `> 0` and became a sample with no frame to sample.
MIN_DURATION_S = 0.1


@dataclass
class Annotation:
    """One valid line: absolute video path, known duration, merged and sorted windows in seconds."""
    id: str
    video: str
    duration: float
    query: Optional[str]
    windows: List[Tuple[float, float]]
    line: int
    source: str
    merged_overlaps: int = 0


@dataclass
class Invalid:
    """One rejected line; `reason` is the full message, naming file, line and field."""
    line: int
    id: Optional[str]
    field: Optional[str]
    reason: str

    def to_json(self) -> Dict[str, Any]:
        return {'line': self.line, 'id': self.id, 'field': self.field, 'reason': self.reason}


@dataclass
class MergedOverlaps:
    """A valid line whose overlapping or touching windows were merged; `count` merges happened."""
    line: int
    id: str
    count: int
    before: List[Tuple[float, float]]
    after: List[Tuple[float, float]]

    def to_json(self) -> Dict[str, Any]:
        return {'line': self.line, 'id': self.id, 'count': self.count,
                'before': [list(w) for w in self.before], 'after': [list(w) for w in self.after]}


@dataclass
class AnnotationReport:
    """Everything `load_annotations` found. `total` counts non-blank lines: total == valid + invalid."""
    source: str
    total: int = 0
    rows: List[Annotation] = field(default_factory=list)
    invalid: List[Invalid] = field(default_factory=list)
    merged: List[MergedOverlaps] = field(default_factory=list)
    blank_lines: int = 0
    warnings: List[str] = field(default_factory=list)

    @property
    def valid(self) -> int:
        return len(self.rows)

    def to_json(self) -> Dict[str, Any]:
        """docs/contract.md shape `{"rows", "valid", "invalid": [{"line", "id", "reason"}]}` plus extra keys."""
        return {'rows': self.total, 'valid': self.valid, 'invalid': [bad.to_json() for bad in self.invalid],
                'source': self.source, 'blank_lines': self.blank_lines,
                'merged_overlaps': [m.to_json() for m in self.merged], 'warnings': list(self.warnings)}

    def summary(self) -> str:
        """Human-readable report: counts first, then every rejected line and every repair."""
        lines = [f'{self.source}: {self.total} rows, {self.valid} valid, {len(self.invalid)} invalid'
                 + (f', {_plural(self.blank_lines, "blank line")} skipped' if self.blank_lines else '')]
        lines += [f'  invalid: {bad.reason}' for bad in self.invalid]
        if self.merged:
            lines.append(f'merged {_plural(sum(m.count for m in self.merged), "overlapping or touching window")} '
                         f'on {_plural(len(self.merged), "line")}:')
            lines += [f'  {self.source}:{m.line}: id {m.id!r}: {_pairs(m.before)} -> {_pairs(m.after)}'
                      for m in self.merged]
        lines += [f'  warning: {text}' for text in self.warnings]
        return '\n'.join(lines)


class AnnotationError(ValueError):
    """A bad annotation line (raised by `strict` loading and by `validate_line`); carries the `Invalid`."""

    def __init__(self, invalid: Invalid):
        super().__init__(invalid.reason)
        self.invalid = invalid


class _Problem(Exception):
    """What is wrong, and in which field (our name) and window index, before file and line are added."""

    def __init__(self, field_name: Optional[str], message: str, index: Optional[int] = None):
        super().__init__(message)
        self.field_name = field_name
        self.message = message
        self.index = index


# Raised by the public field checks (`check_windows`, `check_duration_value`) that other readers share.
FieldProblem = _Problem


def load_annotations(path: str, video_root: Optional[str] = None, probe: bool = True, strict: bool = False,
                     check_files: bool = True, tolerance: float = WINDOW_TOLERANCE) -> AnnotationReport:
    """Read and validate every line of the JSONL file at `path`.

    `probe`: open every video with decord (duration when absent, and proof that it decodes).
    `check_files`: with `probe=False`, still require that each video exists and is not empty
    (cheap `stat`s); the QVHighlights converter turns this off because videos come later.
    `strict`: raise `AnnotationError` at the first invalid line instead of collecting it.
    Raises `FileNotFoundError` / `IsADirectoryError` when `path` itself cannot be opened.
    """
    source = os.fspath(path)
    base_dir = os.path.dirname(os.path.abspath(source))
    report = AnnotationReport(source=source)
    probes: Dict[str, Any] = {}  # video path -> VideoInfo or VideoProbeError; a video may serve many lines
    first_line_of_id: Dict[str, int] = {}
    for number, text, unreadable in jsonl.read_lines(source):
        if text is not None and not text.strip():
            report.blank_lines += 1
            continue
        report.total += 1
        try:
            if text is None:
                raise _Problem(None, unreadable)
            ann, warning, before = _validate_text(text, number, source, video_root, base_dir, probe,
                                                  check_files, tolerance, probes)
            if ann.id in first_line_of_id:
                raise _Problem('id', f'duplicate id {ann.id!r} (first used on line {first_line_of_id[ann.id]}); '
                                     'ids name samples and predictions, so they must be unique')
        except _Problem as problem:
            bad = _invalid(problem, number, source, _id_of(text))
            if strict:
                raise AnnotationError(bad) from None
            report.invalid.append(bad)
            continue
        first_line_of_id[ann.id] = number
        report.rows.append(ann)
        if ann.merged_overlaps:
            report.merged.append(MergedOverlaps(number, ann.id, ann.merged_overlaps, sorted(before),
                                                list(ann.windows)))
        if warning:
            report.warnings.append(f'{source}:{number}: {warning}')
    return report


def validate_line(text: str, line: int = 1, source: str = '<annotations>', video_root: Optional[str] = None,
                  base_dir: Optional[str] = None, probe: bool = True, check_files: bool = True,
                  tolerance: float = WINDOW_TOLERANCE) -> Annotation:
    """Validate one JSONL line; return the `Annotation` or raise `AnnotationError` (file, line, field).

    `base_dir` resolves relative video paths when `video_root` is not given (default: the directory of
    `source`, or the working directory).
    """
    if base_dir is None:
        base_dir = os.path.dirname(os.path.abspath(source))
    try:
        ann, _, _ = _validate_text(text, line, source, video_root, base_dir, probe, check_files, tolerance, {})
    except _Problem as problem:
        raise AnnotationError(_invalid(problem, line, source, _id_of(text))) from None
    return ann


def validate_record(record: Any, line: int = 0, source: str = '<row>', video_root: Optional[str] = None,
                    base_dir: Optional[str] = None, probe: bool = True, check_files: bool = True,
                    tolerance: float = WINDOW_TOLERANCE) -> Annotation:
    """Validate an already-parsed row (e.g. from a Hugging Face dataset); same rules as `validate_line`.

    Keys whose value is None count as absent (datasets fills missing columns with None). Relative
    video paths resolve against `video_root`, else `base_dir` (default: the working directory).
    """
    if base_dir is None:
        base_dir = os.getcwd()
    try:
        ann, _, _ = _validate_record(record, line, source, video_root, base_dir, probe, check_files, tolerance, {})
    except _Problem as problem:
        raw_id = record.get('id', record.get('qid')) if isinstance(record, dict) else None
        raise AnnotationError(_invalid(problem, line, source, None if raw_id is None else str(raw_id))) from None
    return ann


def write_jsonl(records: Iterable[Dict[str, Any]], out_path: str, inputs: Iterable[Optional[str]] = (),
                stage=None) -> int:
    """Write one JSON object per line atomically (`outputs.Staging`: never over one of `inputs`, never over a
    device or a symlink, no half-written file on failure); return the count. With `stage` (an
    `outputs.Staging`), the file is renamed into place when the caller commits it, else at once."""
    from ..outputs import staged

    count = 0
    with contextlib.ExitStack() as stack:
        if stage is None:
            stage = stack.enter_context(staged())
        with stage.open(os.fspath(out_path), inputs, 'OUT.jsonl') as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + '\n')
                count += 1
    return count


# --- internals -------------------------------------------------------------------------------------

def _validate_text(text, line, source, video_root, base_dir, probe, check_files, tolerance, probes):
    try:
        record = jsonl.loads(text)
    except json.JSONDecodeError as exc:
        raise _Problem(None, f'not valid JSON: {exc.msg} (column {exc.colno})') from None
    except RecursionError:
        raise _Problem(None, 'not valid JSON: nested too deeply') from None
    return _validate_record(record, line, source, video_root, base_dir, probe, check_files, tolerance, probes)


def _validate_record(record, line, source, video_root, base_dir, probe, check_files, tolerance, probes):
    """Return (Annotation, warning or None, windows before merging); raise `_Problem` for the first fault."""
    if not isinstance(record, dict):
        raise _Problem(None, f'expected a JSON object, got {_json_type(record)}')
    if qvhighlights.is_qvhighlights(record):
        fields, names = qvhighlights.to_vora(record), qvhighlights.FIELD_NAMES
    else:
        fields, names = record, {}
    try:
        result = _check_fields(fields, line, source, video_root, base_dir, probe, check_files, tolerance, probes)
        if names:  # a QVHighlights line: its highlight fields are indexed by clip, so they are checked too
            problem = qvhighlights.saliency_problem(record, result[0].duration)
            if problem:
                raise _Problem(*problem)
        return result
    except _Problem as problem:
        if problem.field_name in names:  # report the key the user actually wrote
            problem.field_name = names[problem.field_name]
        raise


def _check_fields(fields, line, source, video_root, base_dir, probe, check_files, tolerance, probes):
    ann_id = _check_id(fields.get('id'))
    video = _check_video(fields.get('video'), video_root, base_dir)
    info = None
    if probe:
        info = _probe_cached(video, probes)
    elif check_files:
        try:
            check_file(video)
        except VideoProbeError as exc:
            raise _Problem('video', f'{video}: {exc.reason}') from None
    duration, warning = _check_duration(fields.get('duration'), info, probe)
    query = fields.get('query')
    if query is not None and not isinstance(query, str):
        raise _Problem('query', f'expected a string, got {_json_type(query)}')
    windows = _check_windows(fields.get('windows'), duration, tolerance)
    merged, merges = intervals.merge(windows)
    return Annotation(id=ann_id, video=video, duration=duration, query=query, windows=merged, line=line,
                      source=source, merged_overlaps=merges), warning, windows


def _check_id(raw) -> str:
    if raw is None:
        raise _Problem('id', 'missing (every line needs a unique id)')
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise _Problem('id', f'expected a string, got {_json_type(raw)}')
    text = str(raw)
    if not text.strip():
        raise _Problem('id', 'empty string')
    return text


def _check_video(raw, video_root, base_dir) -> str:
    if raw is None:
        raise _Problem('video', 'missing')
    if not isinstance(raw, str):
        raise _Problem('video', f'expected a path string, got {_json_type(raw)}')
    if not raw.strip():
        raise _Problem('video', 'empty string')
    path = os.path.expanduser(raw)
    if not os.path.isabs(path):
        path = os.path.join(os.path.expanduser(video_root) if video_root is not None else base_dir, path)
    return os.path.abspath(path)


def _probe_cached(video: str, probes) -> VideoInfo:
    if video not in probes:
        try:
            probes[video] = probe_video(video)
        except VideoProbeError as exc:
            probes[video] = exc
    result = probes[video]
    if isinstance(result, VideoProbeError):
        raise _Problem('video', f'{video}: {result.reason}')
    return result


def _check_duration(raw, info: Optional[VideoInfo], probe: bool) -> Tuple[float, Optional[str]]:
    if raw is None:
        if info is None:
            raise _Problem('duration', 'absent and not probed (probing is off); add "duration" or allow probing'
                           if not probe else 'absent and the video could not be probed')
        return info.duration, None
    value = check_duration_value(raw)
    if info is not None and value > info.duration + DURATION_MISMATCH_S:
        raise _Problem('duration', f'{_num(value)} s is longer than the decoded video ({info.duration:.2f} s); '
                                   'clips past the real end would train on frames that do not exist '
                                   '(omit "duration" to use the decoded one)')
    if info is not None and value < info.duration - DURATION_MISMATCH_S:
        return value, (f'duration {_num(value)} s is shorter than the decoded video ({info.duration:.2f} s): only '
                       f'its first {_num(value)} s are cut into clips and trained (omit "duration" to use the decoded '
                       'one)')
    return value, None


def check_duration_value(raw) -> float:
    """A declared duration: a finite number in [MIN_DURATION_S, MAX_DURATION_S]; raises the field problem otherwise."""
    value = _number(raw, 'duration', 'duration')
    if value <= 0:
        raise _Problem('duration', f'must be > 0, got {_num(value)}')
    if value < MIN_DURATION_S:
        raise _Problem('duration', f'{_num(value)} s is shorter than {MIN_DURATION_S:g} s: too short to sample two '
                                   'frames from (not a clip to train on)')
    if value > MAX_DURATION_S:
        raise _Problem('duration', f'{_num(value)} s is longer than {MAX_DURATION_S:g} s (one week); not a video '
                                   'length')
    return value


def check_windows(raw, duration: float, tolerance: float = WINDOW_TOLERANCE) -> List[Tuple[float, float]]:
    """Validate a `windows` list against `duration` (the rules of `data check`); raises `FieldProblem`."""
    return _check_windows(raw, duration, tolerance)


def _check_windows(raw, duration: float, tolerance: float) -> List[Tuple[float, float]]:
    if raw is None:
        raise _Problem('windows', 'missing (use [] for a video with nothing to keep)')
    if not isinstance(raw, list):
        raise _Problem('windows', f'expected a list of [start, end] pairs, got {_json_type(raw)}')
    windows = []
    for index, pair in enumerate(raw):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise _Problem('windows', f'expected a [start, end] pair, got {_short(pair)}', index)
        start = _number(pair[0], 'windows', 'start', index)
        end = _number(pair[1], 'windows', 'end', index)
        if start < 0:
            raise _Problem('windows', f'start {_num(start)} is negative', index)
        if start >= end:
            raise _Problem('windows', f'start {_num(start)} >= end {_num(end)}', index)
        if end > duration + tolerance:
            raise _Problem('windows', f'end {_num(end)} is past the duration {_num(duration)} '
                                      f'(tolerance {tolerance:g} s)', index)
        if start >= duration:
            raise _Problem('windows', f'start {_num(start)} is at or past the duration {_num(duration)}', index)
        windows.append((start, min(end, duration)))
    return windows


def _number(raw, field_name: str, what: str, index: Optional[int] = None) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise _Problem(field_name, f'{what} is not a number: {_short(raw)}', index)
    try:
        value = float(raw)
    except OverflowError:  # an int past float range (a row built in code; the JSON reader makes it inf)
        value = math.inf
    if not math.isfinite(value):
        raise _Problem(field_name, f'{what} is not a finite number: {_long_number(raw)}', index)
    return value


def _long_number(raw) -> str:
    """A number for a message, shortened: an integer may have hundreds of digits."""
    text = str(raw)  # an oversized float (swift_vora.jsonl.Oversized) is shortened already
    if not isinstance(raw, int) or len(text) <= 24:
        return text
    return f'{text[:12]}...({len(text.lstrip("-"))} digits)'


def _invalid(problem: _Problem, line: int, source: str, ann_id: Optional[str]) -> Invalid:
    where = f'{source}:{line}'
    if problem.field_name is not None:
        where += f": field '{problem.field_name}'"
        if problem.index is not None:
            where += f'[{problem.index}]'
    return Invalid(line=line, id=ann_id, field=problem.field_name, reason=f'{where}: {problem.message}')


def _id_of(text: Optional[str]) -> Optional[str]:
    """Best-effort id of a line for reports (None when the line has none or does not parse)."""
    if text is None:
        return None
    try:
        record = jsonl.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    raw = record.get('id', record.get('qid'))
    if raw is None or isinstance(raw, (dict, list)):
        return None
    return str(raw)


def _json_type(value) -> str:
    names = {dict: 'an object', list: 'a list', str: 'a string', bool: 'a boolean', int: 'a number',
             float: 'a number', type(None): 'null'}
    return names.get(type(value), type(value).__name__)


def _short(value, limit: int = 40) -> str:
    text = json.dumps(value) if isinstance(value, (str, list, dict, bool, type(None))) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + '...'


def _num(value: float) -> str:
    return repr(float(value))


def _plural(count: int, noun: str) -> str:
    return f'{count} {noun}' + ('' if count == 1 else 's')


def _pairs(windows) -> str:
    return '[' + ', '.join(f'[{_num(s)}, {_num(e)}]' for s, e in windows) + ']'
