"""JSON on stdout that every JSON parser reads: no `NaN`/`Infinity` (Python's defaults write them).

A non-finite float means "no value" wherever a command could produce one (an empty mean, a ratio of
zeros), so it is written as `null`; `json.dumps(..., allow_nan=False)` then guarantees nothing else slips by.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (dicts, lists and tuples walked)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    """`json.dumps` of `json_safe(value)` with `allow_nan=False` (objects it cannot encode fall back to str)."""
    kwargs.setdefault('default', str)
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


def print_json(value: Any, **kwargs) -> None:
    print(dumps(value, **kwargs), file=sys.stdout)
