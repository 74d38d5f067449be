"""The shipped per-host bundle sets (tests/fixtures/bundles-per-host/<case>/, made by
tests/lab/make_per_host_bundles.sh): one bundle per host, captured the on-call way (hosts
started seconds apart, stopped while the job or the hang went on, hangs captured 10 s
after they began). Every set analysed together gives the lab's truth as its top finding;
a healthy job gives no warning and no error."""
from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from forensics.analysis import analyze

SETS = FIXTURES / "bundles-per-host"
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
            check_no_hang_marker(a)
            return
        assert starts[0] >= truth["onset_ns"] + 10e9, "a late set starts 10 s after the onset"
        top = a.top
        assert top is not None and top.kind == EXPECTED[fault["kind"]], found
        named = set(top.ranks) | (set(top.peer_ranks or []) if fault.get("link") else set())
        assert set(fault["ranks"]) <= named and (fault.get("link") or top.ranks == fault["ranks"]), found
        assert "before the capture" in top.summary and a.con.execute(top.sql).fetchall()
        check_first_screen_fields(a, truth)
    finally:
        a.close()


def check_first_screen_fields(a, truth: dict) -> None:
    """Issue 36 on the shipped late sets: the verdict is the top finding's one-line headline
    naming the rank with its own host; since_ns within 3 s of the lab's onset; op_count the
    first collective not every rank completed (the lab counts each rank's completed ops from
    0), seq its Flight Recorder sequence id."""
    top = a.top
    r = truth["fault"]["ranks"][0]
    host = next(x["host"] for x in truth["ranks"] if x["rank"] == r)
    assert a.verdict() == top.headline and len(top.headline) <= 200, top.headline
    assert f"rank {r} ({host})" in top.headline and host in top.hosts, (top.headline, top.hosts)
    assert top.since_ns is not None and abs(top.since_ns - truth["onset_ns"]) <= 3e9, \
        (top.since_ns - truth["onset_ns"], top.since_source)
    assert top.since_source and top.since_precision_ns
    assert top.op_count == min(truth["ops_completed"]) and top.seq == top.op_count + 1, (top.op_count, top.seq)


def check_no_hang_marker(a) -> None:
    """A healthy job captured one host at a time: no stop marker on the timeline, no hang
    section, op counts never negative (staggered captures are not a stop)."""
    from forensics.report import figures, html
    fig = figures.timeline(a, a.options.slow_ms)
    assert fig is not None
    assert not [x for x in fig.spec["layout"]["annotations"] if "stopped" in str(x.get("text"))]
    assert not fig.spec["layout"]["shapes"] or all(s.get("type") != "line" for s in fig.spec["layout"]["shapes"])
    n = a.model.tables["nccl_events"]
    assert (n["op_count"].dropna() >= 0).all(), n["op_count"].min()
    assert html.context(a)["show_hang"] is False
