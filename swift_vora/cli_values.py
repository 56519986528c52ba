"""argparse value types for numeric flags: finite and in range, or a usage error naming the flag (exit 2).

`type=float` accepts `nan`, `inf` and `1e308`; a NaN compares false with every bound, so a plain
`if value < 0` check lets it through and a loop stepping by it never ends. Every numeric flag of the
CLI goes through one of these.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable, Optional

# The output folder's flag, one name for every command that writes one (`eval`, `demo`, `train`): ms-swift's
# `--output_dir` (the parser reads underscores as hyphens), then the names `eval` and `demo` had before (issue #33).
OUTPUT_DIR_FLAGS = ('--output-dir', '--out-dir', '--out')


def number(minimum: Optional[float] = None, maximum: Optional[float] = None, *, above: bool = False,
           integer: bool = False, allow_zero: bool = False) -> Callable[[str], float]:
    """A type for a finite number in range. `above`: strictly greater than `minimum` (0 still allowed with
    `allow_zero`, for flags where 0 means "off"/"whole"); `integer`: parse as int."""
    def parse(text: str):
        try:
            value = int(text) if integer else float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f'{text!r} is not {"an integer" if integer else "a number"}') from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f'{text!r} is not a finite number')
        if allow_zero and value == 0:
            return value
        if minimum is not None and (value <= minimum if above else value < minimum):
            raise argparse.ArgumentTypeError(f'{text} must be {">" if above else ">="} {minimum:g}'
                                             + (' (or 0)' if allow_zero else ''))
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f'{text} must be <= {maximum:g}')
        return value
    parse.__name__ = 'integer' if integer else 'number'  # argparse names the type in its messages
    return parse


def positive_int(maximum: int = 1_000_000) -> Callable[[str], int]:
    return number(0, maximum, above=True, integer=True)


def nonnegative_int(maximum: int = 1_000_000) -> Callable[[str], int]:
    return number(0, maximum, integer=True)


def count_or_auto(count: Callable[[str], int]) -> Callable[[str], object]:
    """`count`, or the word auto (the plan decides: `--checkpoint-layers auto`)."""
    def parse(text: str):
        return 'auto' if text == 'auto' else count(text)
    parse.__name__ = 'count or auto'
    return parse
