"""Log lines joined across files (forensics/model/logs.py): hosts, ranks, pids, times, first failure."""
from __future__ import annotations

import json

import pandas as pd

from forensics.analysis import analyze
from forensics.execution.host_reading import read_model
from synthetic_bundle import make_bundle

INIT = "{h}:{p}:{p} [{d}] NCCL INFO comm 0x{c:x} rank {r} nranks 4 cudaDev {d} nvmlDev {d} busId 1000 commId 0xfeed - Init COMPLETE\n"
SOCK = "{h}:{p}:{p} [{d}] NCCL INFO NET/Socket : Using [0]eth0:{ip}<0>\n"
WATCHDOG = ("[rank{r}]:[E1128 03:14:0{r}.123456789 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=60000) ran "
            "for 60010 milliseconds before timing out.\n")
HOSTS = {0: ("node-a", 101, "10.9.0.1"), 1: ("node-a", 102, "10.9.0.1"), 2: ("node-b", 201, "10.9.0.2"),
         3: ("node-b", 202, "10.9.0.2")}


def _init_lines() -> str:
    return "".join(INIT.format(h=h, p=p, d=r % 2, c=0x5000 + r, r=r) + SOCK.format(h=h, p=p, d=r % 2, ip=ip)
                   for r, (h, p, ip) in HOSTS.items())


def test_rows_without_a_host_take_their_ranks_host_from_other_files(tmp_path):
    (tmp_path / "nccl.log").write_text(_init_lines())
    (tmp_path / "stderr.log").write_text("".join(WATCHDOG.format(r=r) for r in (0, 2, 3)))
    (tmp_path / "orphan.log").write_text(WATCHDOG.format(r=9))
    m = read_model([tmp_path])
    wd = m.tables["watchdog_events"]
    got = dict(zip(wd["rank"], wd["host"]))
    assert got == {0: "node-a", 2: "node-b", 3: "node-b", 9: f"unknown:{tmp_path}/orphan.log"}
    assert dict(zip(wd["rank"], wd["pid"]))[2] == 201
    assert m.hosts == ["node-a", "node-b"]                  # the job's hosts, not the laptop's
    assert any("read as UTC" in n for n in m.notes) and any("year" in n for n in m.notes)
    t = wd.loc[wd["rank"] == 2, "time_ns"].iloc[0]         # c10's time, to the second (no year: this one)
    assert pd.Timestamp(int(t), unit="ns").strftime("%m-%d %H:%M:%S.%f") == "11-28 03:14:02.000000"


def test_warn_lines_keep_their_own_host_in_a_bundle_and_name_the_peer(tmp_path):
    """An attached log merged from three hosts: each WARN line's host is the one it names, not
    the capture's; the peer address maps to its host and rank through the NET/Socket lines."""
    log = _init_lines() + "".join(
        f"\n{h}:{p}:{p + 9} [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer "
        f"10.9.0.2<4{r}321>\n" for r, (h, p, _) in HOSTS.items() if h == "node-a")
    b = make_bundle(tmp_path, "capture-host", [], {"logs/job.log": log})
    m = read_model([b])
    w = m.tables["nccl_warnings"]
    assert set(w["host"]) == {"node-a"} and set(w["node"]) == {"capture-host"}
    assert set(w["peer_host"]) == {"node-b"} and set(w["class"]) == {"socket_closed"}
    assert sorted(w["rank"].tolist()) == [0, 1]


def test_the_first_failure_is_the_earliest_cause_not_its_cascade(tmp_path):
    lines = _init_lines() + (
        "\n[2026-03-30 17:02:50] node-b:201:299 [0] transport/net_ib.cc:2244 NCCL WARN NET/IB: Got completion from "
        "peer 10.9.0.1<5000> with status=5 opcode=0 len=0 vendor err 249 (Recv) hca mlx5_0\n"
        "\n[2026-03-30 17:02:44] node-a:101:199 [0] transport/net_ib.cc:2244 NCCL WARN NET/IB: Got completion from "
        "peer 10.9.0.2<5001> with status=12 opcode=0 len=0 vendor err 129 (Send) hca mlx5_0\n"
        "\n[2026-03-30 17:02:43] node-b:202:298 [1] proxy.cc:1519 NCCL WARN [Proxy Service 3] Failed to execute "
        "operation Connect from rank 3, retcode 3\n")
    (tmp_path / "all.log").write_text(lines)
    a = analyze([tmp_path / "all.log"])
    w = a.model.tables["nccl_warnings"].set_index("ib_status")
    first = a.model.tables["nccl_warnings"]
    first = first[first["first"].fillna(False).astype(bool)]
    assert first["host"].tolist() == ["node-a"] and first["ib_status"].tolist() == [12]
    assert bool(w.loc[5, "cascade"]) and w.loc[12, "ib_status_name"] == "RETRY_EXC_ERR"
    top = a.findings[0]
    assert top.kind == "ib_errors" and top.details["ib_status"] == 12 and top.details["first_failure"]
    assert "node-b" in top.summary and top.since_ns == int(pd.Timestamp("2026-03-30 17:02:44").value)
    flush = next(f for f in a.findings if f.kind == "ib_errors" and f.details.get("ib_status") == 5)
    assert flush.severity == "warning"
    a.close()


def test_log_times_are_read_in_the_capture_hosts_zone(tmp_path):
    log = _init_lines() + ("\n[2026-03-30 19:02:44] node-a:101:199 [0] misc/socket.cc:49 NCCL WARN socketProgress: "
                           "Connection closed by remote peer 10.9.0.2<4321>\n")
    b = make_bundle(tmp_path, "node-a", [], {"logs/job.log": log})
    man = json.loads((b / "manifest.json").read_text())
    man["timezone"] = {"name": "CEST", "utc_offset_s": 7200}
    (b / "manifest.json").write_text(json.dumps(man))
    m = read_model([b])
    t = int(m.tables["nccl_warnings"]["time_ns"].iloc[0])
    assert t == int(pd.Timestamp("2026-03-30 17:02:44").value)
    assert any("zone (CEST)" in n for n in m.notes)


SUMMARY = ("Root Cause (first observed failure):\n[0]:\n  time      : 2023-06-03_22:45:52\n  host      : {h}\n"
           "  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 19414)\n  error_file: <N/A>\n")


def test_a_summary_host_stays_as_printed_unless_nccl_names_it_short(tmp_path):
    (tmp_path / "slurm.out").write_text(SUMMARY.format(h="gpu187.cluster.local"))
    assert list(read_model([tmp_path]).tables["process_exits"]["host"]) == ["gpu187.cluster.local"]
    (tmp_path / "nccl.log").write_text("gpu187:19414:19414 [0] NCCL INFO comm 0x5000 rank 0 nranks 4 cudaDev 0 "
                                       "nvmlDev 0 busId 1000 commId 0xfeed - Init COMPLETE\n")
    assert list(read_model([tmp_path]).tables["process_exits"]["host"]) == ["gpu187"]


def test_warn_lines_prefixed_by_a_bare_rank_are_read(tmp_path):
    (tmp_path / "rank0.log").write_text("[0] misc/socket.cc:71 NCCL WARN socketProgress: Connection closed by remote "
                                        "peer 10.10.1.3<36138>\n[0] NCCL INFO misc/socket.cc:80 -> 6\n")
    w = read_model([tmp_path]).tables["nccl_warnings"]
    assert len(w) == 1 and w["class"].iloc[0] == "socket_closed"


def test_a_launcher_line_without_a_time_of_its_own_takes_its_shippers_clock(tmp_path):
    (tmp_path / "trial.log").write_text(
        "[2024-02-27T21:35:32.106517Z] fa88a9df || WARNING: torch.distributed.elastic.multiprocessing.api:Sending "
        "process 165 closing signal SIGTERM\n")
    ex = read_model([tmp_path]).tables["process_exits"]
    t = ex["time_ns"].iloc[0]
    assert pd.Timestamp(int(t), unit="ns").strftime("%Y-%m-%d %H:%M:%S") == "2024-02-27 21:35:32"


def test_a_torch_error_tagged_rankN_takes_that_rank_and_so_does_its_last_error(tmp_path):
    """``[rank3]: torch.distributed.DistBackendError: ...`` names no rank in its own text: the
    ``[rank3]:`` tag gives it, and the quoted ``Last error:`` WARN it carries is rank 3's too."""
    (tmp_path / "out.log").write_text(
        _init_lines() + "[rank3]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3763, remote "
        "process exited or there was a network error, NCCL version 2.28.8\n[rank3]: ncclRemoteError: A call failed "
        "possibly due to a network error or a remote process exiting prematurely.\n[rank3]: Last error:\n[rank3]: "
        "NET/OFI Request 0x7f14cc5b60c0 completed with error. RC: 113. Error: 2 (UNDELIVERABLE). Completed length: 0\n")
    m = read_model([tmp_path])
    wd = m.tables["watchdog_events"]
    assert set(wd["rank"].dropna().astype(int)) == {3} and set(wd["host"]) == {"node-b"}
    w = m.tables["nccl_warnings"]
    assert w[["rank", "host", "class"]].values.tolist() == [[3, "node-b", "ofi_completion"]]
