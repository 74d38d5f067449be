"""The init's Channel lines read in C (parsers/nccl_topo.py, logscan.c ``logscan_topo``) give
the tables, facts and warnings the regular expressions give, on every fixture log, the init
bench's shape, and lines at the edges of what the C reader takes."""
from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import FIXTURES, ROOT
from forensics.native import topo_lines
from forensics.parsers import nccl_topo
from forensics.parsers.nccl_debug import NcclDebugParser
from forensics.parsers.text import LogText

FOLDERS = ("logs", "realworld", "lab", "parsers/nccl_debug", "golden")
LOGS = sorted(p for d in FOLDERS for p in (FIXTURES / d).rglob("*")
              if p.is_file() and p.suffix != ".json" and b"NCCL INFO" in p.read_bytes())


def both(data: bytes, coll: str = "rows"):
    """The parse with the C readers and with the regular expressions alone."""
    return [NcclDebugParser.parse_text(LogText(data, "x.log"), "x.log", coll=coll, native=n) for n in (True, False)]


def assert_same(data: bytes) -> None:
    """C and the regular expressions agree; and the model's read (``lines=False``, either way)
    is the same with ``nccl_log_lines`` empty."""
    for coll in ("rows", "positions"):
        c, py = both(data, coll)
        assert c.tables.keys() == py.tables.keys()
        for name in c.tables:
            pd.testing.assert_frame_equal(c.tables[name], py.tables[name], check_exact=True, obj=name)
        assert json.dumps(c.facts, default=str) == json.dumps(py.facts, default=str)
        assert c.warnings == py.warnings
        for native in (True, False):
            lean = NcclDebugParser.parse_text(LogText(data, "x.log"), "x.log", coll=coll, native=native, lines=False)
            assert lean.tables.keys() == c.tables.keys() and lean.tables["nccl_log_lines"].empty
            for name in set(lean.tables) - {"nccl_log_lines"}:
                pd.testing.assert_frame_equal(lean.tables[name], c.tables[name], check_exact=True, obj=name)
            assert json.dumps(lean.facts, default=str) == json.dumps(c.facts, default=str)
            assert lean.warnings == c.warnings


def test_fixture_logs_are_many():
    assert len(LOGS) >= 40 and any("lab" in str(p) for p in LOGS) and any("realworld" in str(p) for p in LOGS)


@pytest.mark.parametrize("path", LOGS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_same_tables_on_fixture_logs(path):
    assert_same(path.read_bytes())


def test_same_tables_on_the_init_bench_shape(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import logs as bench_logs
    finally:
        sys.path.remove(str(ROOT / "bench"))
    merged, _ = bench_logs.generate_init(tmp_path, 1, 16, comms=3)
    data = merged.read_bytes()
    c, _ = both(data)
    # nearly every line is read in C: 16 ranks x 3 comms x 32 Channel lines
    assert len(c.tables["nccl_channels"]) >= 16 * 3 * 16 and len(c.tables["nccl_rings"]) >= 16 * 3 * 16
    assert_same(data)


@pytest.mark.parametrize("stretch", [1, 7, 64])
def test_same_tables_read_a_stretch_at_a_time(tmp_path, monkeypatch, stretch):
    """C reads the hits a bounded stretch at a time; lines, Trees items and the lines left to
    Python that straddle stretches give the tables one stretch gives."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import logs as bench_logs
    finally:
        sys.path.remove(str(ROOT / "bench"))
    merged, _ = bench_logs.generate_init(tmp_path, 1, 4, comms=2)
    data = merged.read_bytes() + (FIXTURES / "parsers" / "nccl_debug" / "nccl_debug_info_init.log").read_bytes()
    whole = NcclDebugParser.parse_text(LogText(data, "x.log"), "x.log", coll="rows")
    monkeypatch.setattr(nccl_topo, "STRETCH", stretch)
    parts = NcclDebugParser.parse_text(LogText(data, "x.log"), "x.log", coll="rows")
    assert len(whole.tables["nccl_channels"]) > 8 * stretch and len(whole.tables["nccl_rings"]) > 8 * stretch
    assert whole.tables.keys() == parts.tables.keys()
    for name in whole.tables:
        pd.testing.assert_frame_equal(parts.tables[name], whole.tables[name], check_exact=True, obj=name)
    assert json.dumps(parts.facts, default=str) == json.dumps(whole.facts, default=str)
    assert parts.warnings == whole.warnings


PRE = "gpu-1:4242:4250 [3] NCCL INFO "
EDGES = [
    PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P/IPC/read",
    PRE + "Channel 01/1 : 3[c000] -> 4[d000] [send] via NET/IB/1/GDRDMA",
    PRE + "Channel 02 : 3[3] -> 4[4] [receive] via NET/Socket/0",
    PRE + "Channel 03/0 : 3[3] -> 4[4] via SHM/direct/direct   \t",
    PRE + "Channel 04/0 : 3[3] -> 4[4] via  P2P",                      # a blank after "via ": Python's
    PRE + "Channel 05/0 : 3[3] -> 4[4] [sendx] via P2P",
    PRE + "Channel 06/0 : 3[3] -> 4[4] via P2P - Init START",          # read as a malformed Init line
    PRE + "Channel 07/0 : 3[3] -> 4[4] via P2P/CUMEM\x1c",
    PRE + "Channel 00/16 :    0   1   2   3",
    PRE + "Channel 01/16 :\t0\x0b1 2",
    PRE + "Channel 02 : 0 1 2",
    PRE + "Channel 03/16 :",
    PRE + "Channel 04/16 : 0 1 x",
    PRE + "Channel 99999999999999999999/2 : 0 1",                     # past 18 digits: Python's
    PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P/IPC caf\u00e9",
    "12: " + PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P/IPC/read",
    "[1,3]<stdout>:" + PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P/IPC/read",
    "[2025-01-02 03:04:05] " + PRE + "Channel 00/16 : 0 1",
    "[2025-01-02T03:04:05.123] " + PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P",
    "[Jan 02 03:04:05 2025] " + PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P",
    "[Abc [2025-01-02 03:04:05] " + PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P",
    "[2025-01-02 03:04:05 x]y] " + PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P",
    "[not a time] " + PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P",
    "<redacted>:4242:4250 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P",
    ":4242:4250 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P",
    "gpu-1:4242:4250 [-1] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P",
    "gpu-1:4242:4250 NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P",
    "gpu-1:4242:4250 [3] init.cc:12 NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P",
    "gpu-1 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P",
    "gpu-0:1:2 [0] NCCL WARN x " + PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P",
    PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P NCCL WARN no",
    PRE + "Channel 00/0 : 3[3] -> 4[4] via P2P WARN init.cc:3 old",
    "\ufeff" + PRE + "Channel 00/16 : 0 1",
    PRE + "Channel 00/0 : 3[3] -> 4[4] via " + "P" * 5000,
    PRE + "Ring 00 : 2 -> 3 -> 4",
    PRE + "Trees [0] 4/-1/-1->3->2",
    PRE + "Using network IB",
    PRE + "Trees [0] 4/-1/-1->3->2 [1] 4/-1/-1->3->-1 [2] -1/-1/-1->3->2",
    PRE + "Trees",
    PRE + "Trees [0] 4/-1/-1->3->2x",
    PRE + "Trees [0] -1->3->2",
    PRE + "Trees [0] 4/-1/-1 ->3->2",
    PRE + "Trees [0] ->3->2",
    PRE + "Trees [0] --->3->2",
    PRE + "Trees [0] 4/-1/-1->3->2  [1] 5->3->2",
    PRE + "Trees [0] 4/-1/-1->-3->-2",
    PRE + "Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/18446744073709551616/GDRDMA",   # NA net_dev
    "(RayTrainWorker pid=99999999999999999999) " + PRE + "Channel 00/16 : 0 1",                   # NA ctx_pid
]


# the EDGES the C reader takes (the others go to the regular expressions)
READ_IN_C = {0, 1, 2, 3, 7, 8, 9, 10, 15, 16, 17, 18, 19, 30, 31, 35, 37, 40, 43, 45, 46, 47}


def test_which_edges_c_reads():
    for i, line in enumerate(EDGES):
        data = line.encode()
        cols, rest = topo_lines(data, len(data), np.array([data.find(b"NCCL INFO ")], np.int64))
        assert (len(cols["start"]), len(rest)) == ((1, 0) if i in READ_IN_C else (0, 1)), line


def test_same_tables_at_the_edges():
    for sep in ("\n", "\r\n", "\r"):
        assert_same(sep.join(EDGES).encode() + b"\n")


def test_offsets_not_at_the_marker_go_to_python():
    data = (PRE + "Channel 00/16 : 0 1\n").encode()
    cols, rest = topo_lines(data, len(data), np.array([-5, 3, len(data) - 2, 1 << 40], np.int64))
    assert len(cols["start"]) == 0 and rest.tolist() == [-5, 3, len(data) - 2, 1 << 40]


def test_line_by_line_edges_alone():
    for line in EDGES:
        assert_same(line.encode())
        assert_same((line + "\n" + PRE + "Channel 01/0 : 3[3] -> 4[4] via P2P\n").encode())


# INFO lines C reads the prefix of, of every kind the parser's passes read or take from the
# message alone (nccl_debug._kind_alone): each INFO_FACTS entry, text an entry needs without
# its form, Init and COLL lines well formed and not, error returns, messages no pass reads
KINDS = [
    "NCCL version 2.21.5+cuda12.4", "NCCL version",
    "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>",
    "NET/IB : Using [RO]; OOB eth0:10.0.0.1<0>", "NET/IB : No device found.", "NET/Socket : Using [0]eth0:10.0.0.1<0>",
    "NET/Socket : Using nothing", "Using network IB", "Using network Socket", "Using network",
    "Bootstrap : Using eth0:10.0.0.1<0>",
    "Bootstrap: nothing", "GPU Direct RDMA Enabled for HCA 0 'mlx5_0'", "GPU Direct RDMA Disabled for HCA 1",
    "NCCL_IB_HCA set by environment to mlx5_0.", "NCCL_DEBUG set to INFO", "NCCL_FOO is unset",
    "16 coll channels, 16 collnet channels, 0 nvls channels, 16 p2p channels", "x coll channels",
    "comm 0x55d4a0c0 rank 3 nRanks 8 nNodes 1 localRanks 8 localRank 3 MNNVL 0", "comm 0x55d4 rank x",
    "init.cc:1200 -> 2 (ncclSystemError)", "misc/socket.cc:484 -> 6", "a -> b", "x->y",
    "ncclCommInitRank comm 0x55d4a0c0 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 48000 commId 0x7d1e - Init START",
    "ncclCommInitRank comm 0x55d4a0c0 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 48000 commId 0x7d1e - Init COMPLETE",
    "comm 0x55d4a0c0 rank 3 nranks 8 cudaDev 3 busId 48000 - Init COMPLETE", "something - Init START broken",
    "AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 3 datatype 7 op 0 root 0 comm 0x55d4 [nranks=8] stream 0x9",
    "AllReduce: opCount zz broken", "Connected all rings", "threadThresholds 8/8/64 | 512/8/64 | 512 | 512",
    "Init timings: rank 3 nranks 8 total 0.52", "Ring 00 : 2 -> 3 -> 4", "Tree 0 : 2 -> 3 -> 4/-1/-1", "Treex",
]


def test_same_tables_for_every_kind_of_info_line_repeated_across_processes():
    lines = []
    for rep in range(3):             # repeated, interleaved across two processes, in changing order
        for i, msg in enumerate(KINDS if rep != 1 else KINDS[::-1]):
            lines.append(f"gpu-{i % 2}:{4242 + (i + rep) % 2}:4250 [3] NCCL INFO {msg}")
    assert_same(("\n".join(lines) + "\n").encode())
    for msg in KINDS:                # each alone, and twice in one process around another process's line
        assert_same(f"{PRE}{msg}\ngpu-2:7:7 [0] NCCL INFO Using network Socket\n{PRE}{msg}\n".encode())
    # facts a later line overwrites (read once: nccl_debug._drop_overwritten), between other facts
    seq = ["Using network IB", "NET/Socket : Using [0]eth0:10.0.0.1<0>", "Using network Socket", "16 coll channels",
           "Using network IB", "NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>", "8 coll channels",
           "Using network IB -> x", "4 coll channels"]
    for order in (seq, seq[::-1], seq[1:] + seq[:1]):
        assert_same("".join(f"{PRE}{m}\n" for m in order).encode())
        assert_same(("".join(f"{PRE}{m}\n" for m in order) + "gpu-1:4242:4250 NCCL INFO 2 coll channels\n").encode())
