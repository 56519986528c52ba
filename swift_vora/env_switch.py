"""The speed levers' environment switches, read one way: on/off flags, whole-number counts and named choices.

Each lever module names its variable and default; a bad value raises an error that quotes `NAME=value`."""
from __future__ import annotations

import os
from typing import Mapping, Optional, Sequence

OFF = ('0', 'false', 'no', 'off')


def flag(name: str, environ: Optional[Mapping[str, str]] = None, default: bool = True) -> bool:
    """On unless the variable says 0/false/no/off (or, with default False, unless it is set to anything else)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return default
    return raw.strip().lower() not in OFF


def count(name: str, environ: Optional[Mapping[str, str]] = None, default: int = 0, unit: str = 'items') -> int:
    """A whole number >= 0 (`unit` names what is counted in the error message)."""
    environ = os.environ if environ is None else environ
    raw = (environ.get(name) or '').strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f'{name}={raw!r}: expected a whole number of {unit}') from None
    if value < 0:
        raise ValueError(f'{name}={raw!r}: expected 0 or more {unit}')
    return value


def choice(name: str, choices: Sequence[str], environ: Optional[Mapping[str, str]] = None,
           default: Optional[str] = None, aliases: Optional[Mapping[str, str]] = None) -> str:
    """One of `choices` (case-insensitive; unset or empty gives `default`, the first choice if None); `aliases` map
    other spellings to a choice."""
    environ = os.environ if environ is None else environ
    default = choices[0] if default is None else default
    value = (environ.get(name) or '').strip().lower() or default
    value = (aliases or {}).get(value, value)
    if value not in choices:
        raise ValueError(f'{name}={value!r}: expected one of {", ".join(choices)}')
    return value
