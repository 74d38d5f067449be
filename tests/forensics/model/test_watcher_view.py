"""A capture's bundle seen as the watcher sees the same incident (issue 43, item 4): the ring
began mid-job (the calls before it gone), the tracer restarted mid-job (every rank's count from 0
again, the communicator's id still joined from the init the first program saw, a gap untraced),
no call returns. The verdict must stay the capture's and the lab's truth: the same kind, rank and,
with NCCL's COLL lines, op number; without them the op number is an estimate and says so.

Before op_align, such a bundle said "every rank stuck inside ALL_REDUCE #0" with no rank."""
from __future__ import annotations

import json
import shutil

import pytest

from forensics.analysis import analyze
from forensics.inputs.bundle import Bundle
from shipped import BUNDLES, SCENARIOS, shipped

needs_bundles = pytest.mark.skipif(not SCENARIOS, reason="no shipped bundles (tests/lab/make_bundles.sh)")


def watcher_view(scenario: str, tmp_path, logs: bool):
    """The shipped bundle of ``scenario`` rewritten as a watcher's ring holds it (module doc):
    the first 20% of the job's calls gone, a restart at 55% after an untraced 8%."""
    (tmp_path / "w").mkdir(parents=True)
    with Bundle.open(shipped(scenario), workdir=tmp_path / "w") as b:
        folder = tmp_path / b.root.name
        shutil.copytree(b.root, folder)
    ev_path = folder / "bpf" / "events.jsonl"
    events = [json.loads(ln) for ln in ev_path.read_text().splitlines()]
    t0s = sorted(e["t0"] for e in events if e["ev"] == "coll")
    span = t0s[-1] - t0s[0]
    ring, restart, resumed = (t0s[0] + int(span * f) for f in (0.20, 0.55, 0.63))
    first_after: dict = {}
    for e in events:
        if e["ev"] == "coll" and e["t0"] >= resumed:
            k = (e["pid"], e["comm"])
            first_after[k] = min(first_after.get(k, e["op_count"]), e["op_count"])
    out = []
    for e in events:
        if e["ev"] in ("coll", "host_wait") and (e["t0"] < ring or restart <= e["t0"] < resumed):
            continue
        if e["ev"] == "coll":
            e = dict(e, t1=None, rc=None, returned=None)            # no call returns
            if e["t0"] >= resumed:                                   # the restarted program's count
                e["op_count"] -= first_after[(e["pid"], e["comm"])]
        out.append(e)
    out.append({"ev": "tracer_start", "t": restart})
    out.sort(key=lambda e: e.get("t0", e.get("t", 0)))
    ev_path.write_text("".join(json.dumps(e) + "\n" for e in out))
    if not logs:
        for f in (folder / "logs").glob("nccl-rank*.log"):
            f.unlink()
    man = json.loads((folder / "manifest.json").read_text())
    man["files"] = [f for f in man["files"] if (folder / f["path"]).exists() and f["path"] != "bpf/events.jsonl"]
    (folder / "manifest.json").write_text(json.dumps(man))
    return folder


def truth(scenario: str) -> dict:
    return json.loads((BUNDLES / scenario / "scenario.json").read_text())


@needs_bundles
@pytest.mark.parametrize("logs", [True, False], ids=["coll-lines", "tracer-only"])
def test_a_mismatch_seen_by_the_watcher_gets_the_captures_verdict(tmp_path, logs):
    capture = analyze([str(shipped("mismatch-hang"))]).findings[0]
    res = analyze([str(watcher_view("mismatch-hang", tmp_path, logs))])
    top, fault = res.findings[0], truth("mismatch-hang")["fault"]
    assert (capture.kind, capture.ranks, capture.op_count) == ("hang_mismatch", fault["ranks"], fault["op_index"])
    assert (top.kind, top.ranks) == (capture.kind, capture.ranks), top.summary
    nccl = res.model.tables["nccl_events"]
    if logs:        # NCCL's COLL lines: the job's own number, exactly
        assert top.op_count == capture.op_count, top.summary
        assert "log" in set(nccl["op_count_source"].dropna())
    else:           # across the restart by the call rate: an estimate, said as one
        assert abs(top.op_count - capture.op_count) <= 2, top.summary
        assert "estimated across a restart of the tracer" in top.summary
        assert top.details["op_numbering"]["estimated"]


@needs_bundles
@pytest.mark.parametrize("logs", [True, False], ids=["coll-lines", "tracer-only"])
def test_a_link_down_seen_by_the_watcher_gets_the_captures_verdict(tmp_path, logs):
    capture = analyze([str(shipped("link-down-hang"))]).findings[0]
    res = analyze([str(watcher_view("link-down-hang", tmp_path, logs))])
    top, fault = res.findings[0], truth("link-down-hang")["fault"]
    assert capture.kind == "hang_stuck" and set(fault["ranks"]) <= set(capture.ranks)
    assert (top.kind, top.ranks) == (capture.kind, capture.ranks), top.summary
    assert [lk.get("daddr") for lk in top.links] == [lk.get("daddr") for lk in capture.links]
    assert top.op_count == capture.op_count, top.summary
