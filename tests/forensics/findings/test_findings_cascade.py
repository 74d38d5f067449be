"""A socket failure that follows a hang is its consequence, never its cause: once the first
rank's watchdog times out and aborts, its peers still waiting in the collective log "Connection
reset by peer" / "closed by remote peer"; those lines must not lead the verdict over the hang.

Fixture: tests/fixtures/lab_logs/mismatch-hang-6/ (the lab's mismatch-hang, 6 ranks, rank 3
never issues SeqNum 19, watchdog 5 s, the ranks' logs and NCCL_DEBUG files alone;
``python -m tests.lab.launcher --scenario mismatch-hang --ranks 6 --rank 3 --watchdog-timeout-s 5
--hold-s 12``). tests/fixtures/lab/reset/ is the counterpart: a reset that came first."""
from __future__ import annotations

import json

from conftest import ROOT
from report_helpers import findings_doc

FIX = ROOT / "tests" / "fixtures"


def _analyze(tmp_path, path) -> dict:
    return findings_doc(tmp_path, path)


def _serious(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] in ("error", "warning")]


def test_reset_after_the_watchdog_aborts_ranks_below_the_hang(tmp_path):
    truth = json.loads((FIX / "lab_logs" / "mismatch-hang-6" / "scenario.json").read_text())
    logs = FIX / "lab_logs" / "mismatch-hang-6" / "logs"
    assert any("Connection reset by peer" in p.read_text() for p in logs.glob("nccl-rank*.log"))
    doc = _analyze(tmp_path, logs)
    top = _serious(doc)[0]
    assert top["kind"] == "hang_mismatch" and top["ranks"] == truth["fault"]["ranks"], top["headline"]
    assert not [f for f in _serious(doc) if f["kind"] == "connection_reset"]
    # the reset is still said, as the hang's abort cascade
    cascade = [f for f in doc["findings"] if f["kind"] == "connection_reset"]
    assert len(cascade) == 1 and cascade[0]["severity"] == "info", cascade
    assert "abort cascade" in cascade[0]["headline"] and cascade[0]["details"]["abort_cascade"] is True


def test_reset_that_came_first_still_leads(tmp_path):
    # the lab's reset: the ranks' watchdogs report the NCCL error, none timed out
    truth = json.loads((FIX / "lab" / "reset" / "scenario.json").read_text())
    doc = _analyze(tmp_path, FIX / "lab" / "reset" / "logs")
    top = _serious(doc)[0]
    assert top["kind"] == "connection_reset" and top["severity"] == "error", top["headline"]
    link = truth["fault"]["link"] or {}
    ends = set(truth["fault"]["ranks"]) | {link.get("peer_rank"), link.get("rank")} - {None}
    assert set(top["ranks"]) & ends, (top["ranks"], truth["fault"])


def test_cascade_needs_both_ends_timed_out(tmp_path):
    # one end timed out, the other logged no timeout (it died or failed on an NCCL error):
    # the reset may be the cause and stays serious
    text = ("[rank0]:[E1128 21:29:18.573459000 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=19, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=5000) ran "
            "for 5046 milliseconds before timing out.\n")
    nccl0 = ("node0:100:101 [0] NCCL INFO NET/Socket : Using [0]eth0:10.9.0.10<0>\n"
             "node0:100:101 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
             "node0:100:105 [0] misc/socket.cc:54 NCCL WARN socketProgressOpt: Call to recv from 10.9.0.11<4242> "
             "failed : Connection reset by peer\n")
    nccl1 = ("node1:200:201 [0] NCCL INFO NET/Socket : Using [0]eth0:10.9.0.11<0>\n"
             "node1:200:201 [0] NCCL INFO comm 0x2 rank 1 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n")
    d = tmp_path / "logs"
    d.mkdir()
    (d / "rank0.err").write_text(text)
    (d / "nccl-rank0.log").write_text(nccl0)
    (d / "nccl-rank1.log").write_text(nccl1)
    doc = _analyze(tmp_path, d)
    resets = [f for f in doc["findings"] if f["kind"] == "connection_reset"]
    assert resets and resets[0]["severity"] == "error", [(f["kind"], f["severity"]) for f in doc["findings"]]
    assert resets[0]["ranks"] == [1]
