"""No output changes unless on purpose (issue 37): every shipped bundle set gives, byte for
byte, the JSON, Markdown and Perfetto outputs kept in tests/fixtures/golden/. A change that
means to alter them regenerates them with ``make golden`` and says why in its commit."""
from __future__ import annotations

import difflib

import pytest

from tests.golden import GOLDEN, OUTPUTS, cases, render

CASES = cases()


def test_every_shipped_set_has_golden_outputs():
    assert CASES, "no shipped bundle sets"
    have = {p.name for p in GOLDEN.iterdir() if p.is_dir()} if GOLDEN.is_dir() else set()
    assert set(CASES) == have, (sorted(set(CASES) - have), sorted(have - set(CASES)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_are_the_golden_ones(case, tmp_path):
    got = render(CASES[case], tmp_path)
    for name in OUTPUTS.values():
        want = (GOLDEN / case / name).read_bytes()
        if got[name] != want:
            diff = difflib.unified_diff(want.decode(errors="replace").splitlines(),
                                        got[name].decode(errors="replace").splitlines(),
                                        f"golden/{case}/{name}", "now", lineterm="", n=1)
            pytest.fail(f"{case}/{name} differs from its golden file (make golden regenerates them, on purpose "
                        "only):\n" + "\n".join(list(diff)[:40]))
