"""Hangs from PyTorch's watchdog lines alone (forensics/findings/timeouts.py): a rank left behind
in a ring collective names the ring link it waits on.

Fixture: tests/fixtures/lab_logs/link-down-hang-4/ (the lab's link-down-hang, 4 ranks, rank 0's
link down 1.1 s into training, watchdog 5 s, the ranks' logs and NCCL_DEBUG files alone: accuracy
campaign seed 46, case 9; ``python -m tests.lab.launcher --scenario link-down-hang --ranks 4
--rank 0 --seed 704982784 --start-s 1.1 --watchdog-timeout-s 5 --hold-s 12``), cut to the init
lines, the last COLL lines and the abort. Rank 1 timed out in SeqNum 86 (its last completed work
85), ranks 0, 2 and 3 in SeqNum 87 (last completed 86); the Ring lines say rank 1 receives from
rank 0. The twins: the same logs without the Ring lines, every rank in one SeqNum, and a broadcast
(whose root finishes first by design) name no link."""
from __future__ import annotations

import json
import re
import shutil

from conftest import ROOT
from report_helpers import findings_doc

FIX = ROOT / "tests" / "fixtures" / "lab_logs" / "link-down-hang-4"


def _analyze(tmp_path, path) -> dict:
    return findings_doc(tmp_path, path)


def _top(doc: dict) -> dict:
    return next(f for f in doc["findings"] if f["severity"] in ("error", "warning"))


def _copy(tmp_path, edit=None):
    """The fixture's logs in tmp_path/logs, each file's text passed through ``edit(name, text)``."""
    d = tmp_path / "logs"
    shutil.copytree(FIX / "logs", d)
    if edit is not None:
        for p in d.iterdir():
            p.write_text(edit(p.name, p.read_text()))
    return d


def test_a_rank_behind_in_an_all_reduce_names_the_ring_link_from_its_predecessor(tmp_path):
    truth = json.loads((FIX / "scenario.json").read_text())
    assert truth["fault"]["kind"] == "link-down-hang" and truth["fault"]["ranks"] == [0]
    top = _top(_analyze(tmp_path, FIX / "logs"))
    assert top["kind"] == "hang_stuck" and top["severity"] == "error", top["headline"]
    assert top["ranks"] == [0, 1] and top["peer_ranks"] == [2, 3], top
    assert top["seq"] == 86 and top["details"]["lagging"] == [1] and top["details"]["completed"] == [0, 2, 3]
    assert [(lk["rank"], lk["peer_rank"], lk["saddr"], lk["daddr"]) for lk in top["links"]] == [
        (0, 1, "10.203.0.10", "10.203.0.11")], top["links"]
    assert top["headline"].startswith("Hang: ring link rank 0 -> rank 1 stalled: rank 1 still waits in SeqNum 86 "
                                      "(ALL_REDUCE), which ranks 0, 2, 3 completed"), top["headline"]
    assert top["layer"] == "peer" and len(top["chain"]) == 4


def test_without_the_ring_lines_no_link_is_named(tmp_path):
    logs = _copy(tmp_path, lambda name, text: re.sub(r"(?m)^.*NCCL INFO (Ring|Channel) .*\n", "", text))
    top = _top(_analyze(tmp_path, logs))
    assert top["kind"] == "hang_stuck" and top["links"] == [] and top["ranks"] == [], top


def test_every_rank_in_one_seqnum_names_no_link(tmp_path):
    # rank 1 as far as the others: its timeout in SeqNum 87, its last completed work 86
    def edit(name, text):
        if name != "rank1.err":
            return text
        return (text.replace("SeqNum=86, OpType=ALLREDUCE, NumelIn=131072, NumelOut=131072",
                             "SeqNum=87, OpType=ALLREDUCE, NumelIn=65536, NumelOut=65536")
                .replace("at work: 86, last enqueued NCCL work: 88, last completed NCCL work: 85",
                         "at work: 87, last enqueued NCCL work: 88, last completed NCCL work: 86"))
    top = _top(_analyze(tmp_path, _copy(tmp_path, edit)))
    assert top["kind"] == "hang_stuck" and top["links"] == [], top
    assert top["headline"].startswith("Hang: every rank timed out in collective SeqNum 87"), top["headline"]


def test_a_rank_behind_in_a_broadcast_names_no_link(tmp_path):
    # a broadcast's root completes once it sent: the ranks past it say nothing of the data a receiver lacks
    def edit(name, text):
        return text.replace("OpType=ALLREDUCE", "OpType=BROADCAST") if name.endswith(".err") else text
    top = _top(_analyze(tmp_path, _copy(tmp_path, edit)))
    assert not top["links"] and 0 not in top["ranks"], top


def test_ring_lines_of_a_process_with_several_communicators_name_no_link(tmp_path):
    # a Ring line prints its own communicator's ranks: with a second communicator in the
    # process, whose ring it is (and whether its ranks are the global ones) is unknown
    def edit(name, text):
        if not name.startswith("nccl-rank"):
            return text
        line = next(ln for ln in text.splitlines() if ln.endswith("- Init START"))
        return text + line.replace("commId 0x67406aa3871bdb38", "commId 0x1111111111111111").replace(
            "comm 0x", "comm 0x7") + "\n"
    top = _top(_analyze(tmp_path, _copy(tmp_path, edit)))
    assert top["kind"] == "hang_stuck" and top["links"] == [], top


def test_one_ranks_init_of_four_is_not_every_rank(tmp_path):
    """An excerpt holding one rank's Init COMPLETE line (nranks 4, its START cut off) and that
    rank's timeout: the headline names the rank that timed out, not "every rank"; with all four
    ranks' Init lines it says every rank."""
    def log(ranks):
        init = "".join(f"node1:{100 + r}:{200 + r} [{r}] NCCL INFO ncclCommInitRank comm 0x55{r} rank {r} nranks 4 "
                       f"cudaDev {r} nvmlDev {r} busId e1000 commId 0xb886 - Init COMPLETE\n" for r in ranks)
        return init + "".join(
            f"[rank{r}]:[E1119 13:21:12.512781555 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran "
            f"for 1800000 milliseconds before timing out.\n" for r in ranks)
    for ranks, want in (([3], "Hang: rank 3 timed out in collective SeqNum 1"),
                        ([0, 1, 2, 3], "Hang: every rank timed out in collective SeqNum 1")):
        d = tmp_path / f"n{len(ranks)}"
        d.mkdir()
        (d / "slurm.out").write_text(log(ranks))
        top = _top(_analyze(d, d / "slurm.out"))
        assert top["kind"] == "hang_stuck" and top["headline"].startswith(want), top["headline"]
