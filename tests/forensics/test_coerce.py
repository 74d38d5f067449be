"""forensics.coerce: each int reader accepts exactly the values its contract names and never raises."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics import coerce


@pytest.mark.parametrize("v, want", [("12", 12), ("-3", -3), (None, None)])
def test_group_int(v, want):
    assert coerce.group_int(v) == want


@pytest.mark.parametrize("v, want", [("12", 12), (" 7 ", 7), ("x", None), (None, None), ("1.5", None), (3, 3)])
def test_text_int(v, want):
    assert coerce.text_int(v) == want


@pytest.mark.parametrize("v, want", [("0x10", 16), (" 12 ", 12), ("0o7", 7), ("4MB", None), ("", None)])
def test_literal_int(v, want):
    assert coerce.literal_int(v) == want


@pytest.mark.parametrize("v, want", [("rank 7 of 8", 7), ("seq -2", -2), ("none", None), (None, None)])
def test_first_int(v, want):
    assert coerce.first_int(v) == want


@pytest.mark.parametrize("v, want", [(5, 5), (True, None), (5.0, None), ("5", None), (None, None)])
def test_json_int(v, want):
    assert coerce.json_int(v) == want


@pytest.mark.parametrize("v, want", [(np.int64(4), 4), (pd.NA, None), (float("nan"), None), (None, None), (2.0, 2)])
def test_cell_int(v, want):
    assert coerce.cell_int(v) == want


def test_cell_ints_keeps_positions_of_missing_values():
    assert coerce.cell_ints(pd.array([1, None, 3], dtype="Int64")) == [1, None, 3]
    assert coerce.cell_ints(np.ma.masked_array([1, 2], mask=[False, True])) == [1, None]
    assert coerce.cell_ints(["a", 2]) == [None, 2]


@pytest.mark.parametrize("v, want", [(1 << 62, 1 << 62), ("123", 123), (" -5 ", -5), (1 << 63, None),
                                     ("9" * 20, None), (True, None), (1.0, None), ("1e3", None)])
def test_int64(v, want):
    assert coerce.int64(v) == want


@pytest.mark.parametrize("v, want", [(True, 1), (3.0, 3), (3.5, None), (float("inf"), None), (np.int32(9), 9),
                                     ("8", 8), ("x", None), (pd.NA, None), (pd.NaT, None), (-1, -1)])
def test_bounded_int(v, want):
    assert coerce.bounded_int(v) == want


def test_bounded_int_keeps_to_its_range():
    assert coerce.bounded_int(-1, lo=0, hi=1 << 64) is None
    assert coerce.bounded_int((1 << 64) - 1, lo=0, hi=1 << 64) == (1 << 64) - 1
