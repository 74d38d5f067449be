"""Integers out of what the inputs hold: one named reader per kind of source.

Every parser and finding that turns a value into ``int | None`` uses one of these, so
that "an int" means the same thing wherever the same kind of value is read. Each reader
returns ``None`` for a value it does not accept and never raises; which values it accepts
is its contract:

- :func:`group_int`: a regex group of digits (``None`` where the group took no part);
- :func:`text_int`: a token of text, ``int()``'s syntax (sign, surrounding blanks);
- :func:`literal_int`: a configuration literal (``0x10``, ``0o7``, ``12``);
- :func:`first_int`: the first integer written anywhere in free text;
- :func:`json_int`: a decoded JSON value that is an integer (not a bool, not a float);
- :func:`cell_int`: one cell of a pandas column (``None``, NaN and ``pd.NA`` are missing);
- :func:`cell_ints`: a list-valued cell, element by element;
- :func:`int64`: a manifest number, an int or a decimal string that fits int64;
- :func:`bounded_int`: any scalar that is a whole number within ``[lo, hi)`` (column builders).

This module imports nothing of stallscope's, so every layer may use it.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

INT64_MIN = -(1 << 63)
INT64_END = 1 << 63

_FIRST_INT = re.compile(r"-?\d+")
_DECIMAL = re.compile(r"-?\d{1,19}")


def group_int(v: str | None) -> int | None:
    """``int(v)`` for a regex group that matched digits; ``None`` where it took no part."""
    return None if v is None else int(v)


def text_int(v) -> int | None:
    """``int(v)`` (a token, a number), ``None`` where ``int()`` refuses it."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def literal_int(v) -> int | None:
    """An integer literal in any base Python writes (``0x1f``, ``0o7``, ``12``) after ``str().strip()``."""
    try:
        return int(str(v).strip(), 0)
    except ValueError:
        return None


def first_int(text: str | None) -> int | None:
    """The first (optionally negative) integer written in ``text``, ``None`` when there is none."""
    m = _FIRST_INT.search(text or "")
    return int(m[0]) if m else None


def json_int(v) -> int | None:
    """``v`` when a JSON decoder made it an ``int`` (``true``/``false`` and floats are not)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def cell_int(v) -> int | None:
    """One pandas cell as an int; ``None`` for any missing value (``None``, NaN, ``pd.NA``)."""
    return None if v is None or pd.isna(v) else int(v)


def cell_ints(values) -> list[int | None]:
    """The elements of one list-valued cell as ints, ``None`` where missing (NA, None, masked) or not a number."""
    out: list[int | None] = []
    for v in np.ma.asarray(values).tolist(None):
        try:
            out.append(None if v is None or pd.isna(v) else int(v))
        except (TypeError, ValueError):
            out.append(None)
    return out


def int64(v) -> int | None:
    """An integer that fits int64, given as an int or a decimal string; ``None`` otherwise (bools too)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str) and _DECIMAL.fullmatch(v.strip()):
        v = int(v)
    if isinstance(v, int) and INT64_MIN <= v < INT64_END:
        return v
    return None


def is_missing(v) -> bool:
    """``None``, ``pd.NA``, ``pd.NaT`` or a float NaN (a scalar test, cheaper than ``pd.isna``)."""
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    return isinstance(v, float) and v != v


def bounded_int(v, lo: int = INT64_MIN, hi: int = INT64_END) -> int | None:
    """A whole number in ``[lo, hi)`` from any scalar: bools as 0/1, integral floats, numpy integers."""
    if is_missing(v):
        return None
    if isinstance(v, (bool, np.bool_)):
        v = int(v)
    elif isinstance(v, (float, np.floating)):
        if v in (float("inf"), float("-inf")) or v != int(v):
            return None
        v = int(v)
    elif not isinstance(v, int):
        try:
            v = int(v)          # numpy integers
        except (TypeError, ValueError):
            return None
    return v if lo <= v < hi else None


__all__ = ["bounded_int", "cell_int", "cell_ints", "first_int", "group_int", "int64", "is_missing", "json_int",
           "literal_int", "text_int"]
