"""The fuzz counts at the end of a pytest run (visible in CI logs without ``-s``).

``tests/conftest.py`` imports :func:`pytest_terminal_summary` from here; it prints
nothing when no fuzz test ran.
"""
from __future__ import annotations

from .runner import COUNTS

CI_MINIMUM = 10_000


def pytest_terminal_summary(terminalreporter, exitstatus=None, config=None):
    if not COUNTS:
        return
    tr = terminalreporter
    tr.section("fuzz inputs per target (issue 7)")
    width = max(len(k) for k in COUNTS)
    for name in sorted(COUNTS):
        tr.write_line(f"{name:<{width}}  {COUNTS[name]:>8}")
    tr.write_line(f"{'total':<{width}}  {sum(COUNTS.values()):>8}")
