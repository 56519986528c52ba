"""Reading JSON a user wrote, with bounded memory and time: the one reader of annotation and prediction lines.

Python's `json` module reads `1e400` as `inf`, and an integer of 5000 digits either raises `ValueError`
(int_max_str_digits: the whole file was reported as an internal error) or, below that limit, makes an int that
`float()` cannot convert (OverflowError). Here a number too large for a float becomes `Oversized`, a float that
is infinite and remembers what the file wrote, so the field checks that already refuse non-finite numbers name
the line and the field (`a.jsonl:3: field 'duration': duration is not a finite number: 99999...(5000 digits)`)
and the other lines are still read. A line longer than `MAX_LINE_BYTES` is one invalid line, read past in chunks
(never held whole). JSON nested deeper than the interpreter's recursion limit raises `RecursionError`, which the
callers report as the line's problem.

A leaf: imports nothing of swift-vora.
"""
from __future__ import annotations

import json
import math
from typing import Any, BinaryIO, Iterator, NamedTuple, Optional

MAX_LINE_BYTES = 16 * 1024 * 1024  # an annotation or prediction line is a few hundred bytes; 16 MiB is absurd
MAX_INT_DIGITS = 308  # the most digits an integer may have and still convert to a (finite) float
_CHUNK = 1024 * 1024


class Oversized(float):
    """A JSON number too large for a float: infinite, and shown as the file wrote it (shortened)."""

    text: str

    def __new__(cls, text: str) -> 'Oversized':
        value = super().__new__(cls, '-inf' if text.lstrip().startswith('-') else 'inf')
        value.text = text
        return value

    def __repr__(self) -> str:
        digits = len(self.text.lstrip('-'))
        return self.text if len(self.text) <= 24 else f'{self.text[:12]}...({digits} digits)'

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self) if not spec else float.__format__(self, spec)


def _parse_int(text: str) -> Any:
    return Oversized(text) if len(text.lstrip('-')) > MAX_INT_DIGITS else int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else Oversized(text)


def loads(text: str) -> Any:
    """`json.loads` with numbers too large for a float read as `Oversized` (never an exception for a big number).

    Raises `json.JSONDecodeError` (a ValueError) for text that is not JSON, also for a string that holds a lone
    UTF-16 surrogate (`"\\ud800"` is valid JSON but not text: it cannot be printed, written or drawn, and failed
    later with an encoding error naming nothing), and `RecursionError` for nesting deeper than the interpreter
    allows."""
    value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float)
    if '\\u' in text:  # only an escape makes a surrogate (UTF-8 text decodes to none)
        _check_text(value, text)
    return value


def _check_text(value: Any, doc: str) -> None:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and not is_text(node):
            where = max(doc.lower().find('\\ud'), 0)
            raise json.JSONDecodeError('a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not '
                                       'text', doc, where)


def is_text(value: str) -> bool:
    """Whether `value` is text (encodes as UTF-8): a lone UTF-16 surrogate is not, and no file, argv or environment
    can carry it."""
    try:
        value.encode('utf-8')
    except UnicodeEncodeError:
        return False
    return True


class Line(NamedTuple):
    number: int  # 1-based
    text: Optional[str]  # None when the line cannot be read (see `problem`)
    problem: Optional[str] = None  # 'not valid UTF-8 text', 'longer than ... bytes'


def read_lines(path: str, max_bytes: Optional[int] = None, errors: str = 'strict') -> Iterator[Line]:
    """Every line of the file at `path` (a UTF-8 byte-order mark on line 1 is ignored), at most `max_bytes` of any
    one line held in memory. `errors='replace'` decodes bytes that are not UTF-8 as U+FFFD instead of giving up
    the line."""
    with open(path, 'rb') as handle:
        try:
            yield from read_stream(handle, max_bytes, errors)
        except OSError as exc:  # an I/O error while reading carries no file name: name it
            if exc.filename is not None:
                raise
            raise OSError(exc.errno, exc.strerror or str(exc), path) from None


def read_stream(handle: BinaryIO, max_bytes: Optional[int] = None, errors: str = 'strict') -> Iterator[Line]:
    """`read_lines` for an open binary stream (stdin included); `max_bytes` None: MAX_LINE_BYTES."""
    max_bytes = MAX_LINE_BYTES if max_bytes is None else max_bytes
    number = 0
    while True:
        raw = handle.readline(max_bytes + 1)
        if not raw:
            return
        number += 1
        if len(raw) > max_bytes and not raw.endswith(b'\n'):
            while raw and not raw.endswith(b'\n'):  # skip the rest of the line without holding it
                raw = handle.readline(_CHUNK)
            yield Line(number, None, f'longer than {max_bytes} bytes; not read')
            continue
        if number == 1 and raw.startswith(b'\xef\xbb\xbf'):
            raw = raw[3:]
        try:
            yield Line(number, raw.decode('utf-8', errors))
        except UnicodeDecodeError:
            yield Line(number, None, 'not valid UTF-8 text')
