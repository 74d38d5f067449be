"""Words and numbers as stallscope writes them: durations, shares, lists of ranks.

One module for what the findings and the report both print, so that a duration or a rank
list reads the same in a finding's summary and on the report's pages. Standard library
only; nothing here reads a table.
"""
from __future__ import annotations

import math

LISTED_RANKS = 12      # a longer rank list is written compactly (a job of hundreds of ranks)


def ranks_text(ranks) -> str:
    """"rank 3", "ranks 1, 2, 5", "ranks 0-7"; a list longer than LISTED_RANKS as runs
    ("ranks 0-63, 128-191 (128 ranks)"), a regular stride ("ranks 2-254, every 4th (64
    ranks)"), or its first ones and the count."""
    rs = sorted({int(r) for r in ranks})
    if not rs:
        return "no rank"
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    if len(rs) <= LISTED_RANKS:
        return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))
    steps = {b - a for a, b in zip(rs, rs[1:])}
    if len(steps) == 1:
        k = steps.pop()
        nth = {2: "2nd", 3: "3rd"}.get(k, f"{k}th")
        return f"ranks {rs[0]}-{rs[-1]}, every {nth} ({len(rs)} ranks)"
    runs, start = [], rs[0]
    for a, b in zip(rs, rs[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a > start else str(start))
            start = b
    if len(runs) <= LISTED_RANKS:
        return f"ranks {', '.join(runs)} ({len(rs)} ranks)"
    return f"ranks {', '.join(runs[:LISTED_RANKS - 2])}, … ({len(rs)} ranks)"


def ms(ns) -> str:
    """A duration in ns as a short human number of milliseconds."""
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return "n/a"
    v = float(ns) / 1e6
    if v >= 1000:
        return f"{v / 1e3:.2f} s" if v < 10_000 else f"{v / 1e3:.1f} s"
    return f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms" if v >= 1 else f"{v:.2f} ms"


def pct(share: float) -> str:
    """A share as a short percentage (below 1% with one decimal, so 0.4% does not read 0%)."""
    return f"{100 * share:.1f}%" if share < 0.01 else f"{share:.0%}"


__all__ = ["LISTED_RANKS", "ms", "pct", "ranks_text"]
