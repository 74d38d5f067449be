"""forensics/wording.py: durations, shares and rank lists as the findings and the report write them."""
from __future__ import annotations

import numpy as np
import pytest

from forensics.wording import LISTED_RANKS, ms, pct, ranks_text


@pytest.mark.parametrize("ns, text", [
    (None, "n/a"), (float("nan"), "n/a"), (np.float64("nan"), "n/a"),
    (250_000, "0.25 ms"), (3_200_000, "3.2 ms"), (45_000_000, "45 ms"), (999_000_000, "999 ms"),
    (2_500_000_000, "2.50 s"), (12_000_000_000, "12.0 s"), (np.int64(1_000_000_000), "1.00 s"),
])
def test_ms_writes_a_duration_short(ns, text):
    assert ms(ns) == text


def test_pct_keeps_one_decimal_below_one_percent():
    assert [pct(s) for s in (0.004, 0.0, 0.01, 0.25, 1.0)] == ["0.4%", "0.0%", "1%", "25%", "100%"]


def test_ranks_text_short_lists_ranges_and_runs():
    assert ranks_text([]) == "no rank"
    assert ranks_text([3, 3]) == "rank 3"
    assert ranks_text([5, 1, 2]) == "ranks 1, 2, 5"
    assert ranks_text([0, 1]) == "ranks 0, 1"
    assert ranks_text(range(8)) == "ranks 0-7"
    assert ranks_text(range(2, 255, 4)) == "ranks 2-254, every 4th (64 ranks)"
    assert ranks_text(list(range(64)) + list(range(128, 192))) == "ranks 0-63, 128-191 (128 ranks)"


def test_ranks_text_cuts_many_runs_to_the_first_ones_and_the_count():
    ranks = [r for r in range(60) if r % 3 != 2]            # 20 runs of two
    text = ranks_text(ranks)
    assert text.startswith("ranks 0-1, 3-4, ") and text.endswith(", … (40 ranks)")
    assert text.count("-") == LISTED_RANKS - 2
