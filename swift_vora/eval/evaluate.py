"""Read annotations and predictions, turn predictions into per-video windows, score them.

Prediction rows (JSONL, one object a line; docs/eval.md has examples):

- `id` or `qid`: the annotation the row answers (compared as strings, so 2579 == "2579").
- `pred_relevant_windows`: `[[start, end, score], ...]` (score optional; unscored windows are
  ranked in the order given), used as given (no clamping), or
- `response`: the model's raw text, read with `answer_parser.parse_answer` (repaired; clamped to the
  clip the model saw). A failed parse is a parse failure for that row.
- `clip_start` (aliases `video_start`, `window_start`): where the clip the model saw starts in the
  source video, in seconds. Windows of the row are clip-relative and are shifted by it.
  `clip_end` (`video_end`, `window_end`) or `clip_duration` give the clip's length (to clamp parsed
  answers); without them the rest of the annotated video is assumed.
- `pred_saliency_scores`: one score per 2-s clip (of the clip the model saw when `clip_start` is
  given; placed at clip index `round(clip_start / 2)`).

Several rows with the same id (several windows of one source video) are merged: their windows are
shifted to source time, overlapping or touching windows merged (a merged window keeps the best score),
then ranked by score (ties: earlier first). One row per id is used exactly as written (the official
evaluator's order matters for R1 and the 10-window cut).

A line of `swift-vora predict` (`id`, `clips`: [{`start`, `end`, `response`}, ...]) is read as one row per clip
(`clip_start`, `clip_end`, `response`), so its answers are scored by the same rule that made its `windows`
(`windows_from_clips`).
"""
from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import jsonl
from ..answer_parser import REPAIR_NAMES, parse_answer
from ..intervals import at_milliseconds, merge
from . import metrics as M
from .metrics import id_text

PROBLEM_SAMPLE = 100  # at most this many ids / lines per problem list in the JSON output

OFFSET_KEYS = ('clip_start', 'video_start', 'window_start')
END_KEYS = ('clip_end', 'video_end', 'window_end')
CLIP_LENGTH_KEYS = ('clip_duration', 'window_seconds', 'clip_seconds')


class InputError(Exception):
    """An input file cannot be evaluated (unreadable, mixed formats, invalid annotation lines)."""

    def __init__(self, message: str, problems: Optional[List[dict]] = None):
        super().__init__(message)
        self.problems = problems or []


@dataclass
class Annotation:
    key: str
    windows: List[Tuple[float, float]]
    duration: Optional[float]
    title: str
    query: Optional[str]
    row: dict
    line: int


@dataclass
class VideoPrediction:
    key: str
    windows: List[Tuple[float, float, float]] = field(default_factory=list)  # ranked (start, end, score)
    saliency: Optional[List[float]] = None
    rows: int = 0
    lines: List[int] = field(default_factory=list)
    clips: List[Tuple[float, Optional[float]]] = field(default_factory=list)  # (start, end) in source time
    failures: List[dict] = field(default_factory=list)  # {'line', 'failure', 'flags', 'clip_start'}
    merged_across_rows: int = 0


@dataclass
class EvalResult:
    format: str  # 'qvhighlights' | 'vora'
    metrics: dict  # flat, JSON-ready; what `swift-vora eval --json` prints
    annotations: Dict[str, Annotation]
    predictions: Dict[str, VideoPrediction]
    per_video: Dict[str, dict]


# ---- reading ------------------------------------------------------------------------------------
def read_jsonl(path: str) -> List[Tuple[int, object]]:
    """(1-based line, decoded value or an Exception) for every non-blank line."""
    out = []
    for i, line, unreadable in jsonl.read_lines(path, errors='replace'):
        if line is None:
            out.append((i, ValueError(unreadable)))
            continue
        if not line.strip():
            continue
        try:
            out.append((i, jsonl.loads(line)))
        except RecursionError:
            out.append((i, ValueError('nested too deeply')))
        except ValueError as exc:
            out.append((i, ValueError(str(exc)[:200])))
    return out


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _pred_windows_problem(ws) -> Optional[str]:
    """Why `pred_relevant_windows` cannot be scored, naming the field and the window; None when it can.

    Windows are used as given (no clamping, no swapping: that is for raw model text). A zero-length window
    (`start == end`, e.g. one clipped at the video's end) is scored as the official evaluator scores it: IoU 0 with
    every ground-truth window, in its place in the list (counted as `zero_length_windows`). A reversed window
    (`end < start`) is invalid input: its official IoU divides by a union that may be zero or negative."""
    if not isinstance(ws, list):
        return "field 'pred_relevant_windows': expected [[start, end(, score)], ...]"
    for i, w in enumerate(ws):
        where = f"field 'pred_relevant_windows'[{i}]"
        if not (isinstance(w, (list, tuple)) and len(w) in (2, 3)):
            return f'{where}: expected [start, end] or [start, end, score]'
        if not all(_finite(x) for x in w):
            return f'{where}: start, end and score must be finite numbers'
        if w[1] < w[0]:
            return f'{where}: start {w[0]!r} > end {w[1]!r} (a reversed window; write [{w[1]!r}, {w[0]!r}] if that ' \
                   'is what was meant)'
    return None


def _id_problem(row: dict, names) -> Optional[str]:
    """Why a row's id cannot name a video exactly (None: it can). Ids are compared as text, so an id must be a
    string or an integer that reads back as itself: a NaN, an infinite number or an integer too long for a float
    (`Oversized`, shown shortened) would match another row's or none."""
    name = next((n for n in names if row.get(n) is not None), None)
    if name is None:
        return None
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return f"field '{name}': expected a string or an integer id, got {type(value).__name__}"
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return (f"field '{name}': {value!r} is not an id (a string or an integer"
                + (f' of at most {jsonl.MAX_INT_DIGITS} digits; write a longer one as a string)' if
                   isinstance(value, jsonl.Oversized) else ')'))
    return None


def load_annotations(path: str) -> Tuple[str, Dict[str, Annotation]]:
    """Annotations keyed by id. QVHighlights lines (`qid`, `relevant_windows`, ...) or swift-vora lines
    (`id`, `windows`, optional `duration`). Raises InputError listing every invalid line."""
    from ..data.qvhighlights import is_qvhighlights
    rows = read_jsonl(path)
    problems, anns, formats = [], {}, {}
    for line, row in rows:
        if isinstance(row, Exception):
            problems.append({'line': line, 'reason': f'not JSON: {row}'})
            continue
        if not isinstance(row, dict):
            problems.append({'line': line, 'reason': 'not a JSON object'})
            continue
        if is_qvhighlights(row):  # the rule of `data check`: one verdict for one line
            fmt, key, windows = 'qvhighlights', row.get('qid'), row.get('relevant_windows')
        else:
            fmt, key, windows = 'vora', row.get('id'), row.get('windows')
        if key is None:
            problems.append({'line': line, 'reason': 'no qid' if fmt == 'qvhighlights' else 'no id'})
            continue
        bad_id = _id_problem(row, ('qid',) if fmt == 'qvhighlights' else ('id',))
        if bad_id:
            problems.append({'line': line, 'reason': bad_id})
            continue
        key = id_text(key)
        reason = _annotation_problem(row, fmt, windows)
        if reason:
            problems.append({'line': line, 'id': key, 'reason': reason})
            continue
        duration = row.get('duration')
        if key in anns:
            problems.append({'line': line, 'id': key, 'reason': f'duplicate id (first on line {anns[key].line})'})
            continue
        formats.setdefault(fmt, line)
        anns[key] = Annotation(key=key, windows=[(float(w[0]), float(w[1])) for w in windows],
                               duration=float(duration) if duration is not None else None,
                               title=str(row.get('vid') or row.get('video') or key), query=row.get('query'),
                               row=row, line=line)
    if len(formats) > 1:
        (first, at), (other, line) = sorted(formats.items(), key=lambda f: f[1])
        names = {'qvhighlights': 'a QVHighlights line (qid, relevant_windows)', 'vora': 'a swift-vora line (id, '
                 'windows)'}
        problems.append({'line': line, 'reason': f'{names[other]}, but line {at} is {names[first]}: one format per '
                         'file'})
    if problems:
        raise InputError(f'{path}: {len(problems)} invalid annotation line(s)', problems)
    if not anns:
        raise InputError(f'{path}: no annotations')
    return next(iter(formats)), anns


def _annotation_problem(row: dict, fmt: str, windows) -> Optional[str]:
    """Why an annotation line cannot be scored (the rules of `swift-vora data check`), or None.

    Shared with the data pipeline so that `eval` never scores ground truth that `data check` rejects
    (`[[10, 5]]`, negative times, windows past the duration, an absurd duration)."""
    from ..data.annotations import MAX_DURATION_S, FieldProblem, check_duration_value, check_windows
    names = {'windows': 'relevant_windows'} if fmt == 'qvhighlights' else {}
    duration = row.get('duration')
    try:
        if duration is not None:
            duration = check_duration_value(duration)
        elif fmt == 'qvhighlights':
            return "field 'duration': missing (QVHighlights lines carry the clip length)"
        check_windows(windows, duration if duration is not None else MAX_DURATION_S)
        if fmt == 'qvhighlights':
            _check_saliency_fields(row, duration)
    except FieldProblem as problem:
        name = names.get(problem.field_name, problem.field_name)
        where = f"field '{name}'" + (f'[{problem.index}]' if problem.index is not None else '')
        return f'{where}: {problem.message}'
    return None


def _check_saliency_fields(row: dict, duration: float) -> None:
    from ..data.annotations import FieldProblem
    from ..data.qvhighlights import saliency_problem
    problem = saliency_problem(row, duration)
    if problem:
        raise FieldProblem(*problem)


def _first(row: dict, keys) -> Optional[float]:
    for k in keys:
        v = row.get(k)
        if v is not None:
            return v
    return None


def load_predictions(path: str, anns: Dict[str, Annotation]):
    """-> (predictions by id, invalid lines, unknown ids, stats)."""
    invalid, unknown = [], {}
    stats = {'rows': 0, 'parsed_rows': 0, 'repairs': {k: 0 for k in REPAIR_NAMES}, 'parse_formats': {},
             'parse_failure_kinds': {}, 'zero_length_windows': []}
    raw: Dict[str, List[tuple]] = {}
    for line, row in read_jsonl(path):
        rows, problem = _clip_rows(line, row)
        if problem is not None:
            stats['rows'] += 1
            invalid.append(problem)
            continue
        for row in rows:
            stats['rows'] += 1
            key, problem, clip = _checked_row(line, row, anns)
            if problem == UNKNOWN_ID:
                unknown.setdefault(key, line)
            elif problem is not None:
                invalid.append(problem)
            else:
                raw.setdefault(key, []).append((line, row, *clip))
    preds = {key: _video_prediction(key, rows, anns[key], stats) for key, rows in raw.items()}
    return preds, invalid, unknown, stats


UNKNOWN_ID = 'unknown id'  # a row for a video the annotations do not have (reported apart from invalid lines)
PREDICTION_KEYS = ('pred_relevant_windows', 'response', 'pred_saliency_scores')


def _clip_rows(line: int, row: Any) -> Tuple[List[Any], Optional[dict]]:
    """The rows one line stands for: a `swift-vora predict` line (`clips`, no row keys of its own) is one row per
    clip it answered -- the answers its `windows` were made from, with their order of confidence -- as long as its
    `windows` are still theirs; a predict line without `clips` is its `windows` (source seconds, ranked in time
    order); any other line is itself. (rows, None), or ([], the invalid line's entry)."""
    predict_line = isinstance(row, dict) and not any(k in row for k in PREDICTION_KEYS)
    if predict_line and 'clips' not in row and 'windows' in row and 'duration' in row:
        return [{'id': row.get('id'), 'pred_relevant_windows': row['windows']}], None
    if not (predict_line and 'clips' in row):
        return [row], None
    key, clips = row.get('id'), row['clips']
    where = {'line': line, **({'id': str(key)} if key is not None else {})}
    if not isinstance(clips, list) or not clips:
        return [], {**where, 'reason': "field 'clips': expected a non-empty list of {start, end, response}"}
    rows = []
    for i, clip in enumerate(clips):
        if not (isinstance(clip, dict) and isinstance(clip.get('response'), str) and _finite(clip.get('start'))
                and _finite(clip.get('end'))):
            return [], {**where, 'reason': f"field 'clips'[{i}]: expected {{start, end (seconds), response (text)}}"}
        rows.append({'id': key, 'clip_start': clip['start'], 'clip_end': clip['end'], 'response': clip['response']})
    edited = _windows_not_from_clips(key, row, rows)
    if edited:
        return [], {**where, 'reason': edited}
    return rows, None


def _windows_not_from_clips(key: Any, row: dict, rows: List[dict]) -> Optional[str]:
    """Why a predict line's `windows` (what `cut` cuts) are not the ones its clips' answers give (what eval would
    score), or None: a line edited by hand is scored as it reads, never by the answers it no longer shows."""
    windows, duration = row.get('windows'), row.get('duration')
    if windows is None or not _finite(duration) or not isinstance(windows, list):
        return None
    try:
        given = sorted((float(w[0]), float(w[1])) for w in windows)
    except (TypeError, ValueError, IndexError):
        return "field 'windows': expected [start, end] pairs in seconds"
    # the line holds seconds to the millisecond (predict/lines.py)
    from_clips = at_milliseconds((s, e) for s, e, _ in windows_from_clips(str(key), rows, float(duration)).windows)
    if len(given) == len(from_clips) and all(abs(a - b) <= 1.5e-3 for g, c in zip(given, from_clips)
                                             for a, b in zip(g, c)):
        return None
    return ("field 'windows': not the windows its 'clips' answer (" + json.dumps([[round(s, 3), round(e, 3)]
                                                                                 for s, e in from_clips]) +
            '), edited after predict? eval scores what cut cuts: drop the line\'s \'clips\' to score the '
            'edited windows, or run predict again')


def _checked_row(line: int, row: Any, anns: Dict[str, Annotation]):
    """(id, problem, (clip_start, clip_end, clip_duration)) of one prediction line: `problem` is the invalid line's
    entry, UNKNOWN_ID, or None for a row to use."""
    def bad(reason, key=None):
        return key, {'line': line, **({'id': key} if key is not None else {}), 'reason': reason}, None

    if isinstance(row, Exception):
        return bad(f'not JSON: {row}')
    if not isinstance(row, dict):
        return bad('not a JSON object')
    key = row.get('id', row.get('qid'))
    if key is None:
        return bad('no id/qid')
    bad_id = _id_problem(row, ('id', 'qid'))
    if bad_id:
        return bad(bad_id)
    key = id_text(key)
    if 'pred_relevant_windows' not in row and 'response' not in row and 'pred_saliency_scores' not in row:
        return bad('needs pred_relevant_windows, response or pred_saliency_scores', key)
    problem = _pred_windows_problem(row['pred_relevant_windows']) if 'pred_relevant_windows' in row else None
    if problem:
        return bad(problem, key)
    sal = row.get('pred_saliency_scores')
    if sal is not None and not (isinstance(sal, list) and all(_finite(x) for x in sal)):
        return bad("field 'pred_saliency_scores': expected a list of finite numbers", key)
    for keys in (OFFSET_KEYS, END_KEYS, CLIP_LENGTH_KEYS):
        name = next((k for k in keys if row.get(k) is not None), None)
        if name is not None and not _finite(row[name]):
            return bad(f"field '{name}': expected a finite number of seconds", key)
    offset, end, clip_len = _first(row, OFFSET_KEYS), _first(row, END_KEYS), _first(row, CLIP_LENGTH_KEYS)
    if key not in anns:
        return key, UNKNOWN_ID, None
    reason = _clip_problem(offset, end, clip_len, anns[key].duration)
    if reason:  # saliency is placed by clip_start: an offset of 1e9 s must not size an array
        return bad(reason, key)
    return key, None, (offset, end, clip_len)


def _video_prediction(key: str, rows: List[tuple], ann: Annotation, stats: Dict[str, Any]) -> VideoPrediction:
    """One video's prediction from its rows: windows in source time (answers parsed, clips placed), merged across
    rows, and its saliency; parse outcomes are counted into `stats`."""
    vp = VideoPrediction(key=key, rows=len(rows), lines=[r[0] for r in rows])
    collected: List[Tuple[float, float, float]] = []
    sal_parts = []
    for line, row, offset, end, clip_len in rows:
        off = float(offset or 0.0)
        if clip_len is not None:
            clip_dur = float(clip_len)
        elif end is not None:
            clip_dur = float(end) - off
        elif ann.duration is not None:
            clip_dur = ann.duration - off
        else:
            clip_dur = None
        if offset is not None or end is not None:
            vp.clips.append((off, off + clip_dur if clip_dur is not None else None))
        if 'pred_relevant_windows' in row:
            ws = row['pred_relevant_windows']
            n = len(ws)
            stats['zero_length_windows'] += [{'line': line, 'id': key, 'index': i} for i, w in enumerate(ws)
                                             if w[0] == w[1]]
            collected.extend((float(w[0]) + off, float(w[1]) + off,
                              float(w[2]) if len(w) > 2 and _finite(w[2]) else (n - i) / n)
                             for i, w in enumerate(ws))
        elif 'response' in row:
            collected.extend(_parsed_windows(vp, line, row['response'], offset, off, clip_dur, stats))
        if row.get('pred_saliency_scores') is not None:
            sal_parts.append((off, row['pred_saliency_scores'], offset is not None))
    if len(rows) == 1 and 'pred_relevant_windows' in rows[0][1]:
        vp.windows = collected  # submitted windows: their order is the submitter's ranking (R1 takes the first)
    elif len(rows) == 1:  # a response's windows come back in time order: ranked by the scores it wrote
        vp.windows = sorted(collected, key=lambda w: (-w[2], w[0]))
    else:
        vp.windows, vp.merged_across_rows = _merge_scored(collected)
    vp.saliency = _place_saliency(sal_parts)
    return vp


def windows_from_clips(key: str, clips: Sequence[Dict[str, Any]], duration: float) -> VideoPrediction:
    """One video's windows in source time from the answers of its clips (`clip_start`, `clip_end`, `response`,
    seconds of a video `duration` long): each answer parsed and clamped to its clip, shifted by the clip's start,
    and, for several clips, overlapping or touching windows merged (the merged window keeps the best score).
    The rule `eval` scores by; `swift-vora predict` writes its lines with it. A failure's `line` is the clip's
    1-based position in `clips`."""
    ann = Annotation(key=key, windows=[], duration=float(duration), title=key, query=None, row={}, line=0)
    stats: Dict[str, Any] = {'parsed_rows': 0, 'repairs': {k: 0 for k in REPAIR_NAMES}, 'parse_formats': {},
                             'parse_failure_kinds': {}}
    rows = [(i + 1, clip, clip.get('clip_start'), clip.get('clip_end'), None) for i, clip in enumerate(clips)]
    return _video_prediction(key, rows, ann, stats)


def _parsed_windows(vp: VideoPrediction, line: int, response: Any, offset, off: float, clip_dur: Optional[float],
                    stats: Dict[str, Any]) -> List[Tuple[float, float, float]]:
    """A model's raw answer read back (`parse_answer`), in source time with its scores; a failure is kept on `vp`."""
    stats['parsed_rows'] += 1
    res = parse_answer(response, duration=clip_dur if clip_dur and clip_dur > 0 else None)
    for k, v in res.repairs.items():
        stats['repairs'][k] += v
    if not res.ok:
        stats['parse_failure_kinds'][res.failure] = stats['parse_failure_kinds'].get(res.failure, 0) + 1
        vp.failures.append({'line': line, 'failure': res.failure, 'flags': res.flags,
                            'clip_start': offset, 'clip_end': off + clip_dur if clip_dur else None})
        return []
    stats['parse_formats'][res.format] = stats['parse_formats'].get(res.format, 0) + 1
    n = len(res.windows)
    scores = res.scores or [(n - i) / n for i in range(n)]
    return [(s + off, e + off, sc) for (s, e), sc in zip(res.windows, scores)]


def _clip_problem(offset, end, clip_len, duration: Optional[float]) -> Optional[str]:
    from ..data.annotations import MAX_DURATION_S
    limit = duration if duration is not None else MAX_DURATION_S
    if offset is not None and not 0 <= offset < limit:
        return f'clip_start {offset!r} is outside the video [0, {limit:g}) s'
    if end is not None and not (offset or 0) < end <= limit + 1.0:
        return f'clip_end {end!r} must be after clip_start and within the video ({limit:g} s)'
    if clip_len is not None and not 0 < clip_len <= limit:
        return f'clip_duration {clip_len!r} must be in (0, {limit:g}] s'
    return None


def _merge_scored(windows: Sequence[Tuple[float, float, float]]):
    merged, count = merge((s, e) for s, e, _ in windows)
    best = [-math.inf] * len(merged)
    starts = [m[0] for m in merged]
    for s, _, sc in windows:
        i = bisect.bisect_right(starts, s) - 1
        best[i] = max(best[i], sc)
    ranked = sorted(((s, e, sc) for (s, e), sc in zip(merged, best)), key=lambda w: (-w[2], w[0]))
    return ranked, count


def _place_saliency(parts) -> Optional[List[float]]:
    if not parts:
        return None
    if len(parts) == 1 and not parts[0][2]:
        return [float(x) for x in parts[0][1]]
    placed: Dict[int, float] = {}
    for off, scores, _ in parts:
        base = int(round(off / M.CLIP_SECONDS))
        for i, x in enumerate(scores):
            placed[base + i] = max(placed.get(base + i, -math.inf), float(x))
    n = max(placed) + 1 if placed else 0
    return [placed.get(i, 0.0) for i in range(n)]


def _within_durations(anns: Dict[str, Annotation], windows: Dict[str, List[Tuple[float, float, float]]]):
    """(each video's windows clamped to its annotated duration, for the kept seconds -- seconds past a video's end
    cannot be cut; the windows that ran past it as {'id', 'index', 'window'}). Moment retrieval scores the windows
    as submitted, as the official evaluator does."""
    kept: Dict[str, List[Tuple[float, float]]] = {}
    past: List[dict] = []
    for key, ws in windows.items():
        duration = anns[key].duration
        kept[key] = []
        for i, (s, e, _) in enumerate(ws):
            if duration is not None and e > duration:
                past.append({'id': key, 'index': i, 'window': [s, e]})
                s, e = min(s, duration), duration
            kept[key].append((s, e))
    return kept, past


# ---- scoring ------------------------------------------------------------------------------------
def evaluate(annotations_path: str, predictions_path: str) -> Tuple[EvalResult, List[dict]]:
    """Score a prediction file against an annotation file. Returns (result, invalid prediction lines).
    Raises InputError when the annotations cannot be used."""
    fmt, anns = load_annotations(annotations_path)
    preds, invalid, unknown, stats = load_predictions(predictions_path, anns)
    return score(fmt, anns, preds, invalid, unknown, stats), invalid


def score(fmt: str, anns: Dict[str, Annotation], preds: Dict[str, VideoPrediction], invalid=(), unknown=None,
          stats=None) -> EvalResult:
    unknown = unknown or {}
    stats = stats or {}
    windows = {k: (preds[k].windows if k in preds else []) for k in anns}
    gt = {k: a.windows for k, a in anns.items()}
    unanswered = [k for k in anns if k not in preds or len(preds[k].failures) >= max(1, preds[k].rows)]
    kept, past_end = _within_durations(anns, windows)
    keep = M.keep_metrics(gt, kept, unanswered)
    per_keep = keep.pop('per_video')
    if fmt == 'qvhighlights':
        want_hl = any(p.saliency is not None for p in preds.values())
        sal = {k: preds[k].saliency if k in preds else None for k in anns} if want_hl else None
        out = M.qvhighlights_metrics([a.row for a in anns.values()], windows, sal)
        detail = out.pop('detail')
        for k in ('kept-precision', 'kept-recall', 'kept-F1', 'kept-IoU'):
            out[k] = keep[k]
        if want_hl:
            out['missing_saliency'] = sum(1 for k in anns if (preds.get(k) is None or preds[k].saliency is None))
    else:
        out = {k: v for k, v in keep.items()}
        detail = {}
    missing = [k for k in anns if k not in preds]
    failures = [dict(id=k, **f) for k, p in preds.items() for f in p.failures]
    zero_length = stats.get('zero_length_windows', [])
    out.update({
        'format': fmt,
        'queries': len(anns),
        'prediction_rows': stats.get('rows', 0),
        'parse_failures': len(failures),
        'missing_predictions': len(missing),
        'unknown_ids': len(unknown),
        'invalid_prediction_lines': len(invalid),
        'zero_length_windows': len(zero_length),
        'windows_past_duration': len(past_end),
        'empty_predictions': sum(1 for k in anns if not windows[k]),
        'parsed_rows': stats.get('parsed_rows', 0),
        'parse_failure_kinds': stats.get('parse_failure_kinds', {}),
        'parse_formats': stats.get('parse_formats', {}),
        'repairs': stats.get('repairs', {}),
        'merged_across_rows': sum(p.merged_across_rows for p in preds.values()),
        'detail': detail,
        'problems': {
            'missing': missing[:PROBLEM_SAMPLE],
            'unknown': list(unknown)[:PROBLEM_SAMPLE],
            'unknown_lines': [{'id': k, 'line': v} for k, v in list(unknown.items())[:PROBLEM_SAMPLE]],
            'parse_failures': failures[:PROBLEM_SAMPLE],
            'invalid_lines': list(invalid)[:PROBLEM_SAMPLE],
            'zero_length_windows': zero_length[:PROBLEM_SAMPLE],
            'windows_past_duration': past_end[:PROBLEM_SAMPLE],
        },
    })
    per_video = {}
    for k, a in anns.items():
        pv = dict(per_keep[k])
        if fmt == 'qvhighlights':
            pv['top1_iou'] = M.top1_iou(a.windows, windows[k])
        pv['missing'] = k not in preds
        pv['failures'] = len(preds[k].failures) if k in preds else 0
        per_video[k] = pv
    return EvalResult(format=fmt, metrics=out, annotations=anns, predictions=preds, per_video=per_video)


SUMMARY_KEYS = {
    'qvhighlights': M.MR_KEYS + ('MR-full-R1@0.3', 'mIoU') + M.HL_KEYS +
    ('kept-precision', 'kept-recall', 'kept-F1', 'kept-IoU'),
    'vora': ('kept-precision', 'kept-recall', 'kept-F1', 'kept-IoU', 'mIoU', 'mean-F1'),
}
COUNT_KEYS = ('queries', 'prediction_rows', 'parse_failures', 'missing_predictions', 'unknown_ids',
              'invalid_prediction_lines', 'zero_length_windows', 'windows_past_duration', 'empty_predictions')
