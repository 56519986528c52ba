"""Reading answers back: what video LLMs really write, as `[start, end]` windows (`parse_answer`).

`parse_answer(text, duration=None) -> ParseResult` is the one entry point; the answer format itself (how an answer
is written, and the interval arithmetic the repairs use) is swift_vora/intervals.py.

Recognised (first match wins, in this order):

1. Where the answer is. `<answer>...</answer>` (the last one; an unclosed `<answer>` reads to the end).
   Otherwise the text after the last `</think>`. A `<think>` that never closes is a failure
   ('unclosed_think'): the model ran out of tokens while reasoning.
2. Bracketed values in that region, the last one that reads as an answer: the canonical JSON array
   `[[12.0, 20.5], ...]`, `[]`, JSON in a ```json fence or after prose, objects with start/end keys
   (`{"start": 12, "end": 20.5}`, `start_time`/`end_time`, `begin`/`end`, ...), containers such as
   `{"windows": [...]}` / `{"answer": ...}`, score triples `[s, e, score]`, one bare pair
   `[12.0, 20.5]`, and a lenient reading of near-JSON (single quotes, `(s, e)` tuples, trailing
   commas, `mm:ss` / `hh:mm:ss` values, `12s` strings, missing commas).
3. Ranges in prose: `12.0 - 20.5 seconds`, `12s-20s`, `from 12s to 20s`, `between 12 and 20 seconds`,
   `00:12 - 00:20.5`, `1:02:03 to 1:02:10`, `(12.0, 20.5)`, `1.5 - 2 minutes`.

Then `repair_pairs` swaps, clamps, drops, de-duplicates and merges (with `intervals.clip` and `intervals.merge`),
counting each repair.

Failures (`ParseResult.failure`): 'empty', 'too_long', 'unclosed_think', 'repetition' (a loop:
the answer region compresses more than 12x), 'truncated' (a bracket opened and never closed, after
the last complete answer), 'malformed' (an answer-shaped value with no usable pair), 'no_intervals'
(nothing recognisable). A failure always comes with `windows == []`; nothing here raises.

Speed: the text is never searched by a backtracking pattern over unbounded input. The whole text
(at most `MAX_TEXT_CHARS`) only sees `str.find`-style scans; the region the readers look at is capped
at `MAX_ANSWER_CHARS`; every token pattern is bounded, so tokenising is linear; nesting deeper than
`MAX_NESTING` is not decoded.
"""
from __future__ import annotations

import json
import math
import re
import zlib
from bisect import bisect_right
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .intervals import Interval, clip, merge

MAX_TEXT_CHARS = 1_000_000   # longer inputs are refused ('too_long'); a 32k-token response is ~130k chars
MAX_ANSWER_CHARS = 32_768    # the answer region (after <think>, inside <answer>) the readers look at
MAX_NESTING = 32             # bracket depth beyond which a value is not decoded
REPETITION_MIN_CHARS = 512   # loop detection applies to answer regions at least this long...
REPETITION_MAX_RATIO = 1 / 12  # ...whose whitespace-collapsed text compresses below this ratio

FAILURES = ('empty', 'too_long', 'unclosed_think', 'repetition', 'truncated', 'malformed', 'no_intervals')


REPAIR_NAMES = ('swapped', 'clamped', 'dropped_zero', 'dropped_invalid', 'deduplicated', 'merged')


@dataclass
class ParseResult:
    """What `parse_answer` read from one model response.

    `ok` is True when an answer was recognised, including the explicit empty answer `[]`; `windows`
    is then the repaired answer (sorted, non-overlapping, clamped), possibly empty. When `ok` is False
    `windows` is `[]` and `failure` names why (see `FAILURES`).
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


Entry = Tuple[float, float, Optional[float]]

START_KEYS = ('start', 'start_time', 'starttime', 'start_sec', 'start_s', 'start_second', 'start_seconds',
              'start_timestamp', 'begin', 'begin_time', 'from', 't_start', 't-start', 'st', 's', 'onset')
END_KEYS = ('end', 'end_time', 'endtime', 'end_sec', 'end_s', 'end_second', 'end_seconds', 'end_timestamp',
            'stop', 'stop_time', 'finish', 'to', 't_end', 't-end', 'ed', 'e', 'offset')
SCORE_KEYS = ('score', 'confidence', 'conf', 'prob', 'probability', 'saliency', 'relevance')
PAIR_KEYS = ('timestamp', 'timestamps', 'time', 'times', 'range', 'span', 'window', 'interval', 'segment',
             'moment')
CONTAINER_KEYS = ('answer', 'windows', 'intervals', 'relevant_windows', 'pred_relevant_windows', 'moments',
                  'segments', 'timestamps', 'spans', 'ranges', 'times', 'clips', 'events', 'highlights', 'keep',
                  'result', 'results', 'output', 'prediction', 'predictions', 'response', 'intervals_seconds')

SECOND_UNITS = {'s', 'sec', 'secs', 'second', 'seconds', 'seg', 'segs'}
MINUTE_UNITS = {'m', 'min', 'mins', 'minute', 'minutes'}
CONNECTORS = {'to', 'until', 'till', 'through', 'thru'}

# ---- tokenisers (every repetition is bounded, so a failed attempt costs O(1)) --------------------
_TIME = r'\d{1,3}:\d{2}(?::\d{2})?(?:\.\d{1,9})?'
_NUM = r'(?:\d{1,15}(?:\.\d{1,15})?|\.\d{1,15})(?:[eE][-+]?\d{1,3})?'
_TEXT_TOKEN = re.compile(
    rf'(?P<time>{_TIME})|(?P<num>{_NUM})|(?P<word>[A-Za-z]{{1,20}})'
    r'|(?P<dash>-{1,3}>|[-\u2010\u2011\u2012\u2013\u2014\u2212~\u2192])|(?P<other>\S)')
_LENIENT_TOKEN = re.compile(
    r'''(?P<str>"(?:[^"\\\n]|\\.){0,200}"|'(?:[^'\\\n]|\\.){0,200}')'''
    rf'|(?P<time>{_TIME})|(?P<num>{_NUM})|(?P<word>[A-Za-z_][A-Za-z0-9_\-]{{0,40}})'
    r'|(?P<punct>[\[\](){},:\-])|(?P<other>\S)')
_TAG = re.compile(r'<(/?)([A-Za-z_][A-Za-z0-9_\-]{0,30})>')
_WS = re.compile(r'\s+')
_STR_VALUE = re.compile(rf'\s*-?(?:(?P<time>{_TIME})|(?P<num>{_NUM}))\s*(?P<unit>[A-Za-z]{{0,10}})\s*')

_FAIL = object()  # lenient parser: "this is not a value"


def parse_answer(text: Any, duration: Optional[float] = None) -> ParseResult:
    """Read one model response back into `[start, end]` windows; never raises.

    `text`: the raw response (a str; bytes are decoded; an already-decoded JSON value is accepted).
    `duration`: seconds of the clip the model saw; values are clamped to it when given.
    Junk (repetition loops, truncated JSON, tag soup, prose without ranges) gives `ok=False`,
    `windows=[]` and a `failure` name. Inputs longer than `MAX_TEXT_CHARS` are refused ('too_long'); the part the
    format readers look at is capped at `MAX_ANSWER_CHARS`.
    """
    try:
        return _parse(text, duration)
    except Exception as exc:  # never raise on model output; a bug here must not stop an evaluation
        return ParseResult(windows=[], ok=False, failure='no_intervals', flags=[f'internal_error:{type(exc).__name__}'])


def _parse(text: Any, duration: Optional[float]) -> ParseResult:
    flags: List[str] = []
    if isinstance(text, (list, dict)):  # an already-decoded JSON value
        got = _value_to_entries(text, 0, flags)
        return _finish(got, 'json', flags, duration)
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_TEXT_CHARS * 4:
            return _fail('too_long', flags + ['input_capped'])
        text = bytes(text).decode('utf-8', errors='replace')
    if text is None:
        return _fail('empty', flags)
    if not isinstance(text, str):
        text = str(text)
    if len(text) > MAX_TEXT_CHARS:
        return _fail('too_long', flags + ['input_capped'])

    region, failure = _answer_region(text, flags)
    if failure:
        return _fail(failure, flags)
    if len(region) > MAX_ANSWER_CHARS:
        return _fail('too_long', flags + ['input_capped'])
    region = region.strip()
    if not region:
        return _fail('empty', flags)
    if _unbalanced_tags(region):
        flags.append('unbalanced_tags')
    if _is_repetition(region):
        return _fail('repetition', flags + ['repetition'])
    if '```' in region:
        flags.append('fenced')

    spans = _bracket_spans(region)
    malformed = False
    for start, end, closed, depth in reversed(spans):
        if not closed or depth > MAX_NESTING:
            continue
        got = _read_span(region[start:end], flags)
        if got is None:
            continue
        entries, fmt = got
        if entries is None:  # answer-shaped but no usable pair; an earlier span may still be fine
            malformed = True
            continue
        if any(not c and s >= end for s, _, c, _ in spans):
            return _fail('truncated', flags)  # the model started another value and was cut off
        if _has_prose(region[:start] + ' ' + region[end:]):
            flags.append('prose')
        return _finish(entries, fmt, flags, duration)

    if any(not closed for _, _, closed, _ in spans):
        return _fail('truncated', flags)
    ranges = _text_ranges(region, flags)
    if ranges:
        if _has_prose(region):
            flags.append('prose')
        return _finish(ranges, 'text', flags, duration)
    return _fail('malformed' if malformed else 'no_intervals', flags)


def _fail(name: str, flags: List[str]) -> ParseResult:
    return ParseResult(windows=[], ok=False, failure=name, flags=_dedup(flags))


def _finish(entries, fmt: Optional[str], flags: List[str], duration: Optional[float]) -> ParseResult:
    if entries is None or entries is _MALFORMED:
        return _fail('malformed' if entries is _MALFORMED else 'no_intervals', flags)
    res = repair_pairs(entries, duration)
    res.format = fmt
    if res.scores is not None:
        flags.append('scores')
    res.flags = _dedup(flags)
    return res


def _dedup(items: List[str]) -> List[str]:
    return list(dict.fromkeys(items))


# ---- where the answer is ------------------------------------------------------------------------
def _answer_region(text: str, flags: List[str]) -> Tuple[str, Optional[str]]:
    low = text.lower()
    a = low.rfind('<answer>')
    if a >= 0:
        flags.append('answer_tag')
        if '<think>' in low or '</think>' in low:
            flags.append('think')
        b = low.find('</answer>', a)
        if b < 0:
            flags.append('unclosed_answer')
            return text[a + len('<answer>'):], None
        return text[a + len('<answer>'):b], None
    t = low.rfind('</think>')
    if t >= 0:
        flags.append('think')
        return text[t + len('</think>'):], None
    if '<think>' in low:
        flags.append('think')
        return '', 'unclosed_think'
    return text, None


def _unbalanced_tags(region: str) -> bool:
    counts = {}
    for m in _TAG.finditer(region):
        name = m.group(2).lower()
        counts[name] = counts.get(name, 0) + (-1 if m.group(1) else 1)
    return any(counts.values())


def _is_repetition(region: str) -> bool:
    if len(region) < REPETITION_MIN_CHARS:
        return False
    collapsed = _WS.sub(' ', region).encode('utf-8', errors='replace')
    if len(collapsed) < REPETITION_MIN_CHARS:
        return False
    return len(zlib.compress(collapsed, 6)) / len(collapsed) < REPETITION_MAX_RATIO


_WORD = re.compile(r'[A-Za-z]{2,20}')
_NOT_PROSE = SECOND_UNITS | MINUTE_UNITS | CONNECTORS | {'from', 'between', 'and', 'json'}


def _has_prose(text: str) -> bool:
    """Words around the answer other than units, connectors and a fence's language tag."""
    return any(m.group().lower() not in _NOT_PROSE for m in _WORD.finditer(text))


# ---- bracketed values ---------------------------------------------------------------------------
def _bracket_spans(region: str) -> List[Tuple[int, int, bool, int]]:
    """Top-level `[...]` / `{...}` spans: (start, end, closed, max_depth). Linear; strings inside spans
    (double-quoted) are skipped; a mismatched closer abandons the span."""
    spans = []
    stack: List[str] = []
    start = 0
    max_depth = 0
    in_str = esc = False
    pairs = {']': '[', '}': '{'}
    for i, ch in enumerate(region):
        if stack:
            if in_str:
                if esc:
                    esc = False
                elif ch == '\\':
                    esc = True
                elif ch == '"' or ch == '\n':
                    in_str = False
                continue
            if ch == '"':
                in_str = True
            elif ch in '[{':
                stack.append(ch)
                max_depth = max(max_depth, len(stack))
            elif ch in ']}':
                if stack[-1] != pairs[ch]:
                    stack.clear()  # mismatched: not a value
                    continue
                stack.pop()
                if not stack:
                    spans.append((start, i + 1, True, max_depth))
        elif ch in '[{':
            stack.append(ch)
            start, max_depth, in_str, esc = i, 1, False, False
    if stack:
        spans.append((start, len(region), False, max_depth))
    return spans


def _read_span(span: str, flags: List[str]):
    """(entries or None when answer-shaped but unusable, format) for a span that reads as an answer;
    None when it does not (a citation `[1]`, an unrelated object...)."""
    local: List[str] = []
    try:
        value = json.loads(span)
        fmt = 'json'
    except (ValueError, RecursionError):
        value = _lenient(span)
        fmt = 'json_lenient'
    if value is not _FAIL:
        got = _value_to_entries(value, 0, local)
        if got is not None:
            flags.extend(local)
            return (None if got is _MALFORMED else got), fmt
    # a bracketed range such as "[12.0 - 20.5]" or "[00:12 to 00:20]"
    local = []
    ranges = _text_ranges(span, local)
    if ranges:
        flags.extend(local)
        return ranges, 'json_lenient'
    return None


class _Malformed(list):
    """Answer-shaped value without one usable pair."""


_MALFORMED = _Malformed()


def _value_to_entries(value: Any, depth: int, flags: List[str]):
    """Entries from a decoded value; [] for the empty answer; _MALFORMED or None (not an answer)."""
    if depth > MAX_NESTING:
        return None
    if isinstance(value, dict):
        pair = _dict_pair(value, flags)
        if pair is not None:
            return [pair]
        low = {str(k).strip().lower(): v for k, v in value.items()}
        for key in CONTAINER_KEYS:
            if key in low:
                got = _value_to_entries(low[key], depth + 1, flags)
                if got is not None:
                    return got
        lists = [v for v in value.values() if isinstance(v, (list, dict, str))]
        if len(value) == 1 and lists:
            return _value_to_entries(lists[0], depth + 1, flags)
        return None
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in '[{' and depth < 4:
            try:
                inner = json.loads(stripped)
            except (ValueError, RecursionError):
                inner = _lenient(stripped)
            if inner is not _FAIL and not isinstance(inner, str):
                return _value_to_entries(inner, depth + 1, flags)
        ranges = _text_ranges(value[:MAX_ANSWER_CHARS], flags)
        return ranges or None
    if not isinstance(value, list):
        return None
    if not value:
        return []
    nums = [_number(v, flags) for v in value]
    if all(n is not None for n in nums) and all(not isinstance(v, (list, dict)) for v in value):
        if len(value) == 2:
            return [(nums[0], nums[1], None)]
        if len(value) == 3:
            return [(nums[0], nums[1], nums[2])]
        return None  # a flat list of numbers that is not a pair: not an answer
    entries: List[Optional[Entry]] = []
    structured = False
    for item in value:
        if isinstance(item, (list, tuple)):
            structured = True
            inner = [_number(v, flags) for v in item]
            if len(item) in (2, 3) and all(n is not None for n in inner[:2]) and \
                    not any(isinstance(v, (list, dict)) for v in item):
                entries.append((inner[0], inner[1], inner[2] if len(item) == 3 else None))
            elif len(item) >= 1 and all(isinstance(v, (list, dict)) for v in item):
                got = _value_to_entries(item, depth + 1, flags)  # one extra level of nesting
                entries.extend(got if got else [None])
            else:
                entries.append(None)
        elif isinstance(item, dict):
            structured = True
            pair = _dict_pair(item, flags)
            if pair is None:
                got = _value_to_entries(item, depth + 1, flags)
                entries.extend(got if got else [None])
            else:
                entries.append(pair)
        elif isinstance(item, str):
            got = _text_ranges(item[:1000], flags)
            if got:
                structured = True
                entries.extend(got)
            else:
                entries.append(None)
        else:
            entries.append(None)
    if not structured:
        return None
    if not any(e is not None for e in entries):
        return _MALFORMED
    return entries


def _dict_pair(d: dict, flags: List[str]) -> Optional[Entry]:
    low = {str(k).strip().lower().replace(' ', '_'): v for k, v in d.items()}
    start = next((low[k] for k in START_KEYS if k in low), None)
    end = next((low[k] for k in END_KEYS if k in low), None)
    score = next((low[k] for k in SCORE_KEYS if k in low), None)
    score_n = _number(score, flags) if score is not None else None
    if start is not None and end is not None:
        s, e = _number(start, flags), _number(end, flags)
        if s is not None and e is not None:
            flags.append('objects')
            return (s, e, score_n)
        return None
    for key in PAIR_KEYS:
        v = low.get(key)
        if isinstance(v, list) and len(v) in (2, 3) and not any(isinstance(x, (list, dict)) for x in v):
            s, e = _number(v[0], flags), _number(v[1], flags)
            if s is not None and e is not None:
                flags.append('objects')
                return (s, e, score_n)
        if isinstance(v, str):
            ranges = _text_ranges(v[:1000], flags)
            if len(ranges) == 1:
                flags.append('objects')
                return (ranges[0][0], ranges[0][1], score_n)
    return None


def _number(v: Any, flags: List[str]) -> Optional[float]:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        try:
            return float(v)
        except OverflowError:
            return math.inf
    if isinstance(v, str) and len(v) <= 40:
        m = _STR_VALUE.fullmatch(v)
        if not m:
            return None
        neg = v.strip().startswith('-')
        unit = m.group('unit').lower()
        if m.group('time'):
            val = _timecode(m.group('time'))
            if val is None:
                return None
            flags.append('timecode')
        else:
            val = float(m.group('num'))
        if unit in MINUTE_UNITS:
            val *= 60.0
            flags.append('units')
        elif unit in SECOND_UNITS:
            flags.append('units')
        elif unit:
            return None
        return -val if neg else val
    return None


def _timecode(tok: str) -> Optional[float]:
    """'mm:ss(.ff)' or 'hh:mm:ss(.ff)' -> seconds; None when a field is out of range."""
    parts = tok.split(':')
    try:
        sec = float(parts[-1])
        whole = [int(p) for p in parts[:-1]]
    except ValueError:
        return None
    if sec >= 60:
        return None
    if len(whole) == 2:
        if whole[1] >= 60:
            return None
        return whole[0] * 3600.0 + whole[1] * 60.0 + sec
    return whole[0] * 60.0 + sec


# ---- lenient near-JSON --------------------------------------------------------------------------
def _lenient(span: str):
    """Decode near-JSON (single quotes, tuples, trailing or missing commas, bare words, mm:ss values).
    Returns the value or _FAIL."""
    toks = []
    for m in _LENIENT_TOKEN.finditer(span):
        kind = m.lastgroup
        tok = m.group()
        if kind == 'other':
            return _FAIL
        toks.append((kind, tok))
    pos = 0

    def value(depth):
        nonlocal pos
        if pos >= len(toks) or depth > MAX_NESTING:
            return _FAIL
        kind, tok = toks[pos]
        pos += 1
        if kind == 'punct':
            if tok in '[(':
                out = []
                while pos < len(toks):
                    k2, t2 = toks[pos]
                    if k2 == 'punct' and t2 in '])':  # either closer: '[(1, 2]' happens
                        pos += 1
                        return out
                    if k2 == 'punct' and t2 == ',':
                        pos += 1
                        continue
                    v = value(depth + 1)
                    if v is _FAIL:
                        return _FAIL
                    out.append(v)
                return _FAIL
            if tok == '{':
                out = {}
                while pos < len(toks):
                    k2, t2 = toks[pos]
                    if k2 == 'punct' and t2 == '}':
                        pos += 1
                        return out
                    if k2 == 'punct' and t2 == ',':
                        pos += 1
                        continue
                    key = value(depth + 1)
                    if key is _FAIL or isinstance(key, (list, dict)) or pos >= len(toks) \
                            or toks[pos] != ('punct', ':'):
                        return _FAIL
                    pos += 1
                    v = value(depth + 1)
                    if v is _FAIL:
                        return _FAIL
                    out[str(key)] = v
                return _FAIL
            signed = pos == 1 or toks[pos - 2] in (('punct', '['), ('punct', '('), ('punct', ','), ('punct', ':'))
            if tok == '-' and signed and pos < len(toks) and toks[pos][0] in ('num', 'time'):
                v = value(depth + 1)
                return -v if isinstance(v, float) else _FAIL
            return _FAIL
        if kind == 'num':
            return float(tok)
        if kind == 'time':
            return tok  # kept as a string: _number converts it (and flags the timecode)
        if kind == 'str':
            return tok[1:-1]
        low = tok.lower()
        if low in ('null', 'none'):
            return None
        if low in ('nan', 'inf', 'infinity'):
            return math.nan if low == 'nan' else math.inf
        return tok  # a bare word: a key, or a unit glued to a number ('12s' is num + word)
    try:
        v = value(0)
    except RecursionError:
        return _FAIL
    if v is _FAIL or pos != len(toks):
        return _FAIL
    return _glue_units(v)


def _glue_units(v):
    """[12, 's', 20, 's'] (from `[12s, 20s]`) -> [12.0, 20.0]; minutes scale."""
    if isinstance(v, list):
        out = []
        for item in v:
            if isinstance(item, str) and out and isinstance(out[-1], float):
                u = item.lower()
                if u in SECOND_UNITS:
                    continue
                if u in MINUTE_UNITS:
                    out[-1] *= 60.0
                    continue
            out.append(_glue_units(item))
        return out
    if isinstance(v, dict):
        return {k: _glue_units(x) for k, x in v.items()}
    return v


# ---- ranges in prose ----------------------------------------------------------------------------
def _text_ranges(text: str, flags: List[str]) -> List[Entry]:
    """`12.0 - 20.5 seconds`, `from 12s to 20s`, `between 12 and 20`, `00:12-00:20`, `(12.0, 20.5)`."""
    toks: List[Tuple[str, Any]] = []
    for m in _TEXT_TOKEN.finditer(text):
        kind = m.lastgroup
        tok = m.group()
        if kind == 'time':
            val = _timecode(tok)
            toks.append(('num', val, True) if val is not None else ('other', tok, False))
        elif kind == 'num':
            toks.append(('num', float(tok), False))
        elif kind == 'word':
            toks.append(('word', tok.lower(), False))
        else:
            toks.append((kind, tok, False))
    out: List[Entry] = []
    used_time = used_units = False
    i, n = 0, len(toks)

    def unit_at(j):
        if j < n and toks[j][0] == 'word':
            if toks[j][1] in SECOND_UNITS:
                return 1.0, j + 1
            if toks[j][1] in MINUTE_UNITS:
                return 60.0, j + 1
        return None, j

    while i < n:
        kind, val, is_time = toks[i]
        # (s, e) / (s, e, score) tuples written in prose
        if kind == 'other' and val == '(' and i + 4 < n and toks[i + 1][0] == 'num' and toks[i + 2][1] == ',' \
                and toks[i + 3][0] == 'num':
            if toks[i + 4][1] == ')':
                out.append((toks[i + 1][1], toks[i + 3][1], None))
                i += 5
                continue
            if i + 6 < n and toks[i + 4][1] == ',' and toks[i + 5][0] == 'num' and toks[i + 6][1] == ')':
                out.append((toks[i + 1][1], toks[i + 3][1], toks[i + 5][1]))
                i += 7
                continue
        between = kind == 'word' and val == 'between'
        j = i + 1 if kind == 'word' and val in ('from', 'between') else i
        if j < n and toks[j][0] == 'num':
            a, a_time = toks[j][1], toks[j][2]
            ua, k = unit_at(j + 1)
            if k < n and (toks[k][0] == 'dash' or (toks[k][0] == 'word' and
                                                    (toks[k][1] in CONNECTORS or (between and toks[k][1] == 'and')))):
                if k + 1 < n and toks[k + 1][0] == 'num':
                    b, b_time = toks[k + 1][1], toks[k + 1][2]
                    ub, nxt = unit_at(k + 2)
                    if ua is None:
                        ua = ub
                    out.append((a * (ua or 1.0), b * (ub or 1.0), None))
                    used_time = used_time or a_time or b_time
                    used_units = used_units or ua is not None or ub is not None
                    i = nxt
                    continue
        i += 1
    if used_time:
        flags.append('timecode')
    if used_units:
        flags.append('units')
    return out
