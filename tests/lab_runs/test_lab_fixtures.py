"""The committed lab fixtures (tests/fixtures/lab/<scenario>/, made by
tests/lab/make_fixtures.sh) are complete and say what they claim. No root."""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from tests.lab.ids import comm_id_fold, nccl_comm_hash

FIX = ROOT / "tests" / "fixtures" / "lab"

SCENARIOS = ["clean", "loss", "slow-link", "straggler", "mismatch-hang", "link-down-hang", "reset"]
COLL_RE = re.compile(r"^(?P<host>[^\s:]*):(?P<pid>\d+):(?P<tid>\d+) \[\d+\] NCCL INFO "
                     r"(?P<op>AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|Send|Recv): opCount (?P<oc>[0-9a-f]+) "
                     r"sendbuff (?:0x[0-9a-f]+|\(nil\)) recvbuff (?:0x[0-9a-f]+|\(nil\)) count \d+ datatype \d+ op \d+ "
                     r"root \d+ comm 0x[0-9a-f]+ \[nranks=(?P<nranks>\d+)\] stream 0x[0-9a-f]+$")
COMPLETE_RE = re.compile(r"NCCL INFO ncclCommInitRank comm 0x[0-9a-f]+ rank (\d+) nranks (\d+) cudaDev \d+ "
                         r"nvmlDev \d+ busId [0-9a-f]+ commId 0x([0-9a-f]+) - Init COMPLETE$")
PCAP_NS_MAGIC = 0xA1B23C4D


def load(sc: str) -> dict:
    path = FIX / sc / "scenario.json"
    if not path.exists():
        pytest.fail(f"missing fixture {path}: run tests/lab/make_fixtures.sh (root)")
    return json.loads(path.read_text())


def tshark(pcap: Path, flt: str, tmp_path: Path) -> int:
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed")
    env = dict(os.environ, WIRESHARK_CONFIG_DIR=str(tmp_path))
    p = subprocess.run(["tshark", "-r", str(pcap), "-Y", flt, "-T", "fields", "-e", "frame.number"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return len(p.stdout.split())


@pytest.mark.parametrize("sc", SCENARIOS)
def test_fixture_complete_and_consistent(sc):
    d = load(sc)
    assert d["scenario"] == sc and d["world_size"] == 4 and len(d["ranks"]) == 4
    assert d["started_ns"] < d["ended_ns"]
    f = d["fault"]
    assert set(f) >= {"kind", "ranks", "link", "start_time_ns"}
    if sc == "clean":
        assert f["kind"] == "none" and f["ranks"] == []
    else:
        assert f["kind"] == sc and len(f["ranks"]) == 1 and d["started_ns"] < f["start_time_ns"] < d["ended_ns"]
    size = sum(p.stat().st_size for p in (FIX / sc).rglob("*") if p.is_file())
    assert size < 1_500_000, size
    comm_ids = set()
    for r, info in enumerate(d["ranks"]):
        assert info["rank"] == r and info["host"] == f"node{r}" and info["addr"] == f"10.203.0.{10 + r}"
        assert info["iface"] == "eth0" and info["pid"] > 0
        # pcap: nanosecond pcap, Ethernet, snaplen 128, not empty
        raw = (FIX / sc / info["pcap"]).read_bytes()
        magic, _, _, _, _, snaplen, linktype = struct.unpack("<IHHiIII", raw[:24])
        assert magic == PCAP_NS_MAGIC and linktype == 1 and snaplen == 128 and len(raw) > 10_000
        # NCCL log: NCCL's line formats; opCounts from 0; Init COMPLETE commId == NCCL's hash of the id
        lines = (FIX / sc / info["nccl_log"]).read_text().splitlines()
        colls = [m for m in map(COLL_RE.match, lines) if m]
        assert colls and colls[0]["oc"] == "0" and all(m["nranks"] == "4" for m in colls)
        assert all(m["host"] == f"node{r}" and int(m["pid"]) == info["pid"] for m in colls)
        assert len(colls) == info["ops_issued"] == d["ops_issued"][r]
        assert max(int(m["oc"], 16) for m in colls) == info["last_op_count_issued"]
        done = [m for m in map(COMPLETE_RE.search, lines) if m]
        assert len(done) == 1 and int(done[0][1]) == r and done[0][2] == "4" and done[0][3] == d["nccl_comm_id"][2:]
        # ground truth: comm_id_hash is the fold of the unique id
        init = json.loads((FIX / sc / "truth" / f"rank{r}.jsonl").read_text().splitlines()[0])
        uid = bytes.fromhex(init["unique_id"])
        assert int(init["comm_id_hash"], 16) == comm_id_fold(uid) == int(d["comm_id_hash"], 16)
        assert int(init["nccl_comm_id"], 16) == nccl_comm_hash(uid)
        comm_ids.add(init["comm_id_hash"])
    assert len(comm_ids) == 1


def test_fixture_faults_visible(tmp_path):
    """Each fixture shows its fault where the analyzer must find it."""
    d = load("clean")
    assert all(r["state"] == "exited" and r["exit_code"] == 0 and r["check_failures"] == 0 for r in d["ranks"])
    assert d["ops_issued"] == d["ops_completed"]
    for r in range(4):
        assert tshark(FIX / "clean" / "pcap" / f"rank{r}.pcap", "tcp.analysis.retransmission", tmp_path) == 0

    d = load("loss")
    r = d["fault"]["ranks"][0]
    assert tshark(FIX / "loss" / "pcap" / f"rank{r}.pcap", "tcp.analysis.retransmission", tmp_path) > 0
    far = (r + 2) % 4   # exchanges no ring data with the lossy rank
    assert tshark(FIX / "loss" / "pcap" / f"rank{far}.pcap", "tcp.analysis.retransmission", tmp_path) == 0

    d = load("mismatch-hang")
    r, k = d["fault"]["ranks"][0], d["fault"]["op_index"]
    assert d["ops_issued"][r] == k and all(n > k for i, n in enumerate(d["ops_issued"]) if i != r)
    assert max(d["ops_completed"]) <= k and all(x["state"] == "killed" for x in d["ranks"])

    d = load("link-down-hang")
    assert all(c < i for c, i in zip(d["ops_completed"], d["ops_issued"]))
    assert all(x["state"] == "killed" for x in d["ranks"])

    d = load("straggler")
    r = d["fault"]["ranks"][0]
    steps = {i: [json.loads(l) for l in (FIX / "straggler" / "logs" / f"rank{i}.out").read_text().splitlines()
                 if '"ev":"step"' in l] for i in range(4)}
    after = lambda i: [e for e in steps[i] if e["enter_ns"] > d["fault"]["start_time_ns"]]  # noqa: E731
    other = (r + 1) % 4
    assert after(r) and after(other)
    # the straggler computes longer; the others wait for it inside the collectives
    assert min(e["compute_ms"] for e in after(r)) > max(e["compute_ms"] for e in after(other))
    assert sorted(e["wait_ms"] for e in after(other))[len(after(other)) // 2] > 100

    d = load("reset")
    p = d["fault"]["peer_rank"]
    assert d["ranks"][p]["exit_code"] not in (0, None)
    assert tshark(FIX / "reset" / "pcap" / f"rank{p}.pcap", "tcp.flags.reset == 1 && tcp.srcport == "
                  f"{d['fault']['tuple']['dport']}", tmp_path) > 0
    assert "Connection reset by peer" in (FIX / "reset" / "logs" / f"nccl-rank{p}.log").read_text()

    d = load("slow-link")
    r = d["fault"]["ranks"][0]
    t = d["fault"]["start_time_ns"]
    ev = [json.loads(l) for l in (FIX / "slow-link" / "logs" / f"rank{r}.out").read_text().splitlines()
          if '"ev":"step"' in l]
    before = [e["wait_ms"] for e in ev if e["t_ns"] < t]
    slow = [e["wait_ms"] for e in ev if e["enter_ns"] > t]
    assert slow and (not before or min(slow) > 3 * max(before))
