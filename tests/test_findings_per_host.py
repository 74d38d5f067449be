"""The shipped per-host bundle sets (tests/fixtures/bundles-per-host/<case>/, made by
tests/lab/make_per_host_bundles.sh): one bundle per host, captured the on-call way (hosts
started seconds apart, stopped while the job or the hang went on, hangs captured 10 s
after they began). Every set analysed together gives the lab's truth as its top finding;
a healthy job gives no warning and no error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.analysis import analyze

SETS = Path(__file__).resolve().parent / "fixtures" / "bundles-per-host"
CASES = sorted(p.name for p in SETS.iterdir() if p.is_dir()) if SETS.is_dir() else []
# the lab's fault kind -> the finding that names it
EXPECTED = {"mismatch-hang": "hang_mismatch", "link-down-hang": "hang_stuck", "gpu-hang": "hang_stuck",
            "reset": "connection_reset", "loss": "network_loss", "slow-link": "slow_link", "straggler": "straggler"}


def test_the_sets_are_shipped():
    assert {"clean", "mismatch-hang-late", "gpu-hang-late", "link-down-hang-late"} <= set(CASES), CASES


@pytest.mark.parametrize("case", CASES)
def test_per_host_set_top_finding(case):
    folder = SETS / case
    truth = json.loads((folder / "scenario.json").read_text())
    bundles = sorted(folder.glob("node*.tar.gz"))
    assert len(bundles) == truth["world_size"] > 1
    caps = truth["captures"]
    # captured one host at a time, the way the set claims to be
    starts = sorted(c["capturing_ns"] for c in caps)
    assert len(set(starts)) == len(starts) and all(c["ok"] for c in caps)
    a = analyze([str(b) for b in bundles])
    try:
        found = [(f.kind, f.severity, f.ranks, f.summary[:200]) for f in a.findings]
        fault = truth["fault"]
        if fault is None or truth["scenario"] == "clean":
            assert not [f for f in a.findings if f.severity in ("warning", "error")], found
            return
        assert starts[0] >= truth["onset_ns"] + 10e9, "a late set starts 10 s after the onset"
        top = a.top
        assert top is not None and top.kind == EXPECTED[fault["kind"]], found
        named = set(top.ranks) | (set(top.peer_ranks or []) if fault.get("link") else set())
        assert set(fault["ranks"]) <= named and (fault.get("link") or top.ranks == fault["ranks"]), found
        assert "before the capture" in top.summary and a.con.execute(top.sql).fetchall()
    finally:
        a.close()
