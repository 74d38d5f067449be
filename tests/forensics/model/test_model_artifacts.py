"""The artefact tables of the model (nccl_config, nccl_warnings, host_facts, nccl_tests,
stacks, sockets, fr_entries) and GPU durations in nccl_events, on lab output, the
reference samples and the shipped lab bundles (synthetic_bundle.py assembles the folders)."""
from __future__ import annotations

import glob
import json
import pickle
import re

import pytest

from conftest import FIXTURES
from forensics.analysis import analyze
from forensics.inputs.bundle import unpack_archive
from forensics.execution.host_reading import read_model
from synthetic_bundle import LAB, PARSERS, lab_bundle, lab_pids, make_bundle, process

BUNDLES = FIXTURES / "bundles"


def test_nccl_config_merges_lab_logs_with_the_manifest(tmp_path):
    b = lab_bundle(tmp_path, "clean")
    m = read_model([b])
    cfg = m["nccl_config"].set_index("rank")
    pids = lab_pids("clean")
    assert sorted(cfg.index) == [0, 1, 2, 3]
    assert all(cfg.loc[r, "pid"] == pids[r] for r in range(4))
    assert set(cfg["source"]) == {"log+manifest"}
    assert set(cfg["transport"]) == {"Socket"}
    assert set(cfg["socket_ifaces"]) == {"eth0"}
    assert cfg.loc[2, "socket_addrs"] == "10.203.0.12"
    assert set(cfg["nchannels"]) == {2} and set(cfg["ring_channels"]) == {2}
    # Ring 00 : 3 -> 0 -> 1 on rank 0; the ring closes over the four ranks
    assert (cfg.loc[0, "ring_prev"], cfg.loc[0, "ring_next"]) == (3, 1)
    assert [cfg.loc[r, "ring_next"] for r in range(4)] == [1, 2, 3, 0]
    assert cfg.loc[0, "nccl_version"] == "2.21.5+cuda12.4"        # only rank 0 prints it, as NCCL does
    assert set(cfg["channel_transports"]) == {"NET/Socket"}
    assert json.loads(cfg.loc[1, "env"])["NCCL_IB_DISABLE"] == "1"
    assert cfg.loc[3, "artifact"] == "logs/nccl-rank3.log"
    assert m.problems == []
    con = m.connect()
    assert con.execute("SELECT count(*) FROM nccl_config WHERE transport = 'Socket'").fetchone()[0] == 4


def test_log_matched_by_attachment_record_when_pids_differ(tmp_path):
    """A log written in a pid namespace: its pid is not the manifest's; the attachment
    record (NCCL_DEBUG_FILE of pid N) ties it to the process."""
    log = (LAB / "clean" / "logs" / "nccl-rank1.log").read_text()
    pid = lab_pids("clean")[1]
    renamed = log.replace(f":{pid}:", ":77:")
    col = {"attachments:end": {"status": "ok", "files": ["logs/nccl-rank1.log"],
                               "sources": [{"source": "/x/nccl-rank1.log", "path": "logs/nccl-rank1.log",
                                            "why": f"NCCL_DEBUG_FILE of pid {pid}"}]}}
    b = make_bundle(tmp_path, "h", [process(pid, None, {"NCCL_DEBUG": "INFO"})], {"logs/nccl-rank1.log": renamed},
                    collectors=col)
    cfg = read_model([b])["nccl_config"]
    assert len(cfg) == 1
    row = cfg.iloc[0]
    assert (row["pid"], row["log_pid"], row["rank"], row["source"]) == (pid, 77, 1, "log+manifest")


def test_nccl_config_of_reference_logs_of_several_versions(tmp_path):
    b = make_bundle(tmp_path, "ref", [], {"logs/nccl.log": PARSERS / "nccl_debug" / "nccl_debug_info_init.log"})
    m = read_model([b])
    cfg = m["nccl_config"]
    assert set(cfg["source"]) == {"log"}
    by = {(r.log_host, r.pid): r for r in cfg.itertuples()}
    roce = by[("hostname1", 25668)]          # NCCL 2.19+: RoCE, GDR disabled on both HCAs
    assert (roce.transport, roce.ib_devices, roce.link_layers, roce.gdr) == \
        ("IB", "mlx5_0:1/RoCE,mlx5_1:1/RoCE", "RoCE", False)
    old = by[("master_node", 24570)]         # NCCL 2.5.6: old NET/IB line, OOB ib0
    assert (old.transport, old.ib_devices, old.oob_iface) == ("IB", "mlx5_0:1/IB", "ib0")
    sock = by[("axa", 3048391)]
    assert (sock.transport, sock.socket_ifaces, sock.socket_addrs) == ("Socket", "lo", "127.0.0.1")
    assert json.loads(sock.env)["NCCL_IB_DISABLE"] == "1"
    gdr = by[("10-90-43-152", 120890)]       # only GDRDMA channel lines
    assert (gdr.transport, gdr.gdr) == ("IB", True)
    assert by[("hostname-test", 983)].nchannels == 16
    hf = m["host_facts"].iloc[0]
    assert hf["ib_present"] == True and "mlx5_0" in hf["ib_devices"]  # noqa: E712 (NCCL saw the HCAs)


def test_nccl_warnings_from_the_lab_reset_logs(tmp_path):
    b = lab_bundle(tmp_path, "reset")
    m = read_model([b])
    w = m["nccl_warnings"]
    expected = sum(len(re.findall(r" NCCL WARN ", (LAB / "reset" / "logs" / f"nccl-rank{r}.log").read_text()))
                   for r in range(4))
    assert len(w) == expected > 0
    pids = lab_pids("reset")
    assert set(zip(w["rank"], w["pid"])) <= {(r, p) for r, p in pids.items()}
    assert w["src_file"].str.contains("socket").any()
    cfg = m["nccl_config"].set_index("rank")
    assert cfg["warnings"].sum() == expected


def test_sockets_from_lab_ss_snapshots_attributed_to_ranks(tmp_path):
    extra = {f"sys/netns-r{r}/ss-tinp-end.txt": LAB / "mismatch-hang" / "sys" / f"ss-rank{r}.txt" for r in range(4)}
    b = lab_bundle(tmp_path, "mismatch-hang", extra=extra)
    s = read_model([b])["sockets"]
    n = sum(len(re.findall(r"(?m)^ESTAB", (LAB / "mismatch-hang" / "sys" / f"ss-rank{r}.txt").read_text()))
            for r in range(4))
    assert len(s) == n > 0
    assert set(s["rank"].dropna()) == {0, 1, 2, 3}
    assert s["rank"].notna().all()
    # every peer is a lab rank: the peer address maps to its owner
    assert s["peer_rank"].notna().all() and (s["peer_rank"] != s["rank"]).all()
    assert set(s["phase"]) == {"end"} and set(s["netns"]) == {f"netns-r{r}" for r in range(4)}


def test_sockets_retransmits_and_owner(tmp_path):
    b = make_bundle(tmp_path, "h", [process(4242, 3)],
                    {"sys/host/ss-tinp-start.txt": PARSERS / "ss" / "ss_tainp_crafted_ipv6_retrans.txt"})
    s = read_model([b])["sockets"]
    row = s[s["local_port"] == 43712].iloc[0]
    assert (row["pid"], row["rank"], row["retrans_cur"], row["retrans_total"], row["phase"]) == (4242, 3, 1, 13792,
                                                                                                "start")


def test_stacks_from_pyspy_dumps(tmp_path):
    b = make_bundle(tmp_path, "h", [process(48213, 0)],
                    {"stacks/py-spy-48213-end.txt": PARSERS / "pyspy" / "pyspy_dump_rank0.txt"})
    st = read_model([b])["stacks"]
    main = st[(st["thread_name"] == "MainThread")].sort_values("depth")
    assert list(main["function"][:2]) == ["synchronize", "train_step"]
    assert set(st["rank"]) == {0} and set(st["phase"]) == {"end"}
    assert main.iloc[0]["code_file"] == "torch/cuda/__init__.py"


def test_nccl_tests_tables_keep_every_row_and_the_average(tmp_path):
    from forensics.parsers import get
    src = PARSERS / "nccl_tests" / "nccl_tests_output_mixed.txt"
    b = make_bundle(tmp_path, "h", [], {"nccl-tests/output.txt": src,
                                        "nccl-tests/all_reduce_perf.json": PARSERS / "nccl_tests" / "all_reduce_perf.json"})
    m = read_model([b])
    t = m["nccl_tests"]
    assert len(t) == len(get("nccl_tests").parse(src).tables["nccl_tests"]) + 2
    assert set(t["placement"]) == {"out", "in"}
    runs = m["nccl_tests_runs"].set_index("artifact")
    assert runs.loc["nccl-tests/output.txt", "avg_busbw_gbps"] == pytest.approx(142.652)
    assert runs.loc["nccl-tests/all_reduce_perf.json", "avg_busbw_gbps"] == pytest.approx(92.3405)
    assert runs.loc["nccl-tests/output.txt", "max_busbw_gbps"] == pytest.approx(359.98)
    assert runs.loc["nccl-tests/output.txt", "failures"] == 1       # the "Test NCCL failure" line


def test_host_facts_ib_peermem_xid_interfaces(tmp_path):
    ip_link = json.dumps([{"ifname": "lo", "link_type": "loopback"}, {"ifname": "eth0", "link_type": "ether"},
                          {"ifname": "ib0", "link_type": "infiniband"}])
    xid = "2026-11-22T10:00:00+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    b = make_bundle(tmp_path, "h", [], {
        "ib/start/sysfs.txt": PARSERS / "ib_counters" / "sysfs_grep_start.txt",
        "ib/end/sysfs.txt": PARSERS / "ib_counters" / "sysfs_grep_end.txt",
        "sys/lsmod.txt": "Module Size Used by\nnvidia_peermem 16384 0\nnvidia 56623104 2 nvidia_peermem\n",
        "sys/host/ip-link-start.json": ip_link, "logs/dmesg-end-xid.txt": xid, "logs/dmesg-end.txt": "x\n" + xid,
        "sys/nvidia-smi-start.txt": "==============NVSMI LOG==============\nAttached GPUs                  : 8\n"})
    hf = read_model([b])["host_facts"].iloc[0]
    assert hf["ib_present"] == True and hf["ib_devices"] == "mlx4_0,mlx5_0"  # noqa: E712
    assert (hf["ib_ports"], hf["ib_ports_active"], hf["ib_rate_gbps"]) == (2, 2, 40.0)
    assert hf["nvidia_peermem"] == True and hf["gpus"] == 8  # noqa: E712
    assert hf["xid_count"] == 1 and "Xid" in hf["xid_first"] and hf["kernel_alerts"] == 1
    assert hf["interfaces"] == "eth0,ib0" and "infiniband" in hf["link_types"]


def test_host_facts_of_a_shipped_lab_bundle_say_no_ib():
    m = read_model(glob.glob(str(BUNDLES / "clean" / "*.tar.gz")), skew=False)
    hf = m["host_facts"].iloc[0]
    assert hf["ib_present"] == False  # noqa: E712 (the ib-counters collector found /sys/class/infiniband empty)


@pytest.mark.parametrize("scenario", sorted(p.name for p in BUNDLES.iterdir() if p.is_dir()))
def test_shipped_bundles_have_a_config_row_per_rank(scenario):
    truth = json.loads((BUNDLES / scenario / "scenario.json").read_text())
    m = read_model(glob.glob(str(BUNDLES / scenario / "*.tar.gz")), skew=False)
    cfg = m["nccl_config"]
    assert sorted(cfg["rank"]) == list(range(truth["world_size"]))
    assert cfg["libnccl"].str.endswith("libnccl.so.2").all()
    assert cfg["env"].map(lambda e: json.loads(e).get("NCCL_SOCKET_IFNAME")).eq("eth0").all()


# --------------------------------------------------------------------------- GPU durations

def _unpacked_clean(tmp_path):
    dest = tmp_path / "clean"
    dest.mkdir()
    unpack_archive(next(iter(sorted((BUNDLES / "clean").glob("*.tar.gz")))), dest)
    return next(p for p in dest.iterdir() if p.is_dir())


def _fr_dump(rank: int, ops: list[str], duration_ms: float, bad_seq: int) -> bytes:
    entries = []
    for i, op in enumerate(ops):
        seq = i + 1
        name = "nccl:all_gather" if seq == bad_seq else f"nccl:{op.lower()}"
        entries.append({"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                        "p2p_seq_id": 0, "op_id": seq, "profiling_name": name, "time_created_ns": 1,
                        "input_sizes": [[8]], "input_dtypes": ["Float"], "output_sizes": [[8]],
                        "output_dtypes": ["Float"], "state": "completed", "time_discovered_started_ns": None,
                        "time_discovered_completed_ns": None, "duration_ms": duration_ms, "retired": True,
                        "timeout_ms": 600000, "is_p2p": False, "frames": []})
    return pickle.dumps({"version": "2.5", "rank": rank, "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                                               "ranks": "[0, 1, 2, 3]"}},
                         "pg_status": {"0": {"last_enqueued_collective": len(ops), "last_started_collective": -1,
                                             "last_completed_collective": len(ops)}}, "entries": entries}, protocol=2)


def _inspector(pid: int, rank: int, ops: list[str], exec_us: float) -> str:
    names = {"ALL_REDUCE": "AllReduce", "BROADCAST": "Broadcast"}
    seen: dict[str, int] = {}
    lines = []
    for op in ops:
        sn = seen.get(op, 0)
        seen[op] = sn + 1
        lines.append(json.dumps({"header": {"id": "0x243b73edfcca8f96", "rank": rank, "n_ranks": 4, "nnodes": 1},
                                 "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "",
                                              "rec_mechanism": "nccl_profiler_interface",
                                              "dump_timestamp_us": 1, "hostname": "vm", "pid": pid},
                                 "coll_perf": {"coll": names[op], "coll_sn": sn, "coll_msg_size_bytes": 4,
                                               "coll_exec_time_us": exec_us, "coll_timing_source": "kernel_gpu",
                                               "coll_algobw_gbs": 1.0, "coll_busbw_gbs": 1.5}},
                                separators=(",", ":")))
    return "\n".join(lines) + "\n"


def _profiler_trace(pid: int, rank: int, ops: list[str]) -> str:
    """The example profiler plugin's event shapes (its README): per collective a COLL b
    with SeqNum (per type), then one KernelCh per channel with GPU clocks, then COLL e."""
    names = {"ALL_REDUCE": "AllReduce", "BROADCAST": "Broadcast"}
    seen: dict[str, int] = {}
    ev, clk = [], 1_795_375_000_000_000_000
    for i, op in enumerate(ops):
        sn = seen.get(op, 0)
        seen[op] = sn + 1
        base = {"pid": pid, "tid": 1}
        ev.append({"name": names[op], "cat": "COLL", "ph": "b", "id": i, "ts": 100.0 * i, **base,
                   "args": {"SeqNum": sn, "CommHash": 1493613951195738943, "Rank": rank, "Count": 4,
                            "Datatype": "ncclFloat32", "Algorithm": "RING", "Protocol": "SIMPLE", "nChannels": 2}})
        for ch, (start, stop) in enumerate(((0, 2_000_000), (500_000, 2_500_000))):
            ev.append({"name": "KernelCh", "cat": "GPU", "ph": "b", "id": 2 * i + ch, "ts": 100.0 * i + 1, **base,
                       "args": {"Channel": ch, "StartGpuClk": clk + start, "StopGpuClk": clk + stop}})
            ev.append({"name": "KernelCh", "cat": "GPU", "ph": "e", "id": 2 * i + ch, "ts": 100.0 * i + 2, **base})
        ev.append({"name": names[op], "cat": "COLL", "ph": "e", "id": i, "ts": 100.0 * i + 3, **base})
        clk += 10_000_000
    return "[\n" + ",\n".join(json.dumps(e) for e in ev) + "\n]\n"


def test_gpu_durations_from_flight_recorder_and_inspector_win(tmp_path):
    root = _unpacked_clean(tmp_path)
    base = read_model([root], skew=False)["nccl_events"]
    assert set(base["duration_source"]) == {"host_sync"}
    ops = {r: list(g.sort_values("op_count")["op"]) for r, g in base.groupby("rank")}
    pid = {int(r): int(g["pid"].iloc[0]) for r, g in base.groupby("rank")}
    (root / "flight-recorder").mkdir()
    (root / "flight-recorder" / "nccl_trace_rank_1").write_bytes(_fr_dump(1, ops[1], 3.25, bad_seq=6))
    (root / "logs" / "nccl-inspector").mkdir()
    (root / "logs" / "nccl-inspector" / f"vm-pid{pid[2]}.log").write_text(_inspector(pid[2], 2, ops[2], 1234.0))
    (root / "logs" / "nccl-profile_0x14ba61f9a096f33f_3.json").write_text(_profiler_trace(pid[3], 3, ops[3]))
    m = read_model([root], skew=False)
    n = m["nccl_events"]
    r1 = n[n["rank"] == 1].sort_values("op_count")
    gpu1 = r1[r1["duration_source"] == "gpu"]
    assert len(gpu1) == len(r1) - 1                       # entry seq 6 claims all_gather: op disagrees, unmapped
    assert r1[r1["op_count"] == 5]["duration_source"].iloc[0] == "host_sync"
    assert set(gpu1["duration_ns"]) == {3_250_000} and set(gpu1["gpu_source"]) == {"flight_recorder"}
    assert (gpu1["end_ns"] >= gpu1["timestamp_ns"] + gpu1["duration_ns"]).all() and gpu1["completed"].all()
    r2 = n[n["rank"] == 2]
    assert set(r2["duration_source"]) == {"gpu"} and set(r2["duration_ns"]) == {1_234_000}
    assert set(r2["gpu_source"]) == {"inspector"}
    r3 = n[n["rank"] == 3]                                # kernels span 0 .. 2.5 ms on the GPU clock
    assert set(r3["duration_source"]) == {"gpu"} and set(r3["duration_ns"]) == {2_500_000}
    assert set(r3["gpu_source"]) == {"profiler"}
    assert set(n[n["rank"] == 0]["duration_source"]) == {"host_sync"}   # untouched: host-wait durations
    assert len(n) == len(base)
    fr = m["fr_entries"]
    assert len(fr) == len(ops[1]) and set(fr["rank"]) == {1} and set(fr["pid"]) == {pid[1]}
    assert set(fr["state"]) == {"completed"}
    st = m["fr_pg_status"].iloc[0]
    assert (st["rank"], st["pid"], st["pg_id"], st["last_completed_collective"]) == (1, pid[1], "0", len(ops[1]))
    con = m.connect()
    q = "SELECT count(*) FROM nccl_events WHERE duration_source = 'gpu' AND gpu_source = 'inspector'"
    assert con.execute(q).fetchone()[0] == len(r2)


def test_gpu_source_precedence_and_watchdog_discovery_times(tmp_path):
    """Rank 1 has both an Inspector record and a Flight Recorder duration: the Inspector's
    kernel timing wins. Rank 0's dump has no duration_ms (timing off) but discovery times:
    their difference is used and the discovered completion bounds end_ns."""
    root = _unpacked_clean(tmp_path)
    base = read_model([root], skew=False)["nccl_events"]
    ops = {r: list(g.sort_values("op_count")["op"]) for r, g in base.groupby("rank")}
    pid = {int(r): int(g["pid"].iloc[0]) for r, g in base.groupby("rank")}
    r0 = base[base["rank"] == 0].sort_values("op_count")
    dump = pickle.loads(_fr_dump(0, ops[0], 1.0, bad_seq=-1))
    for e, (_, row) in zip(dump["entries"], r0.iterrows()):
        e["duration_ms"] = None
        e["time_discovered_started_ns"] = int(row["timestamp_ns"]) + 1_000
        e["time_discovered_completed_ns"] = int(row["timestamp_ns"]) + 901_000 + 10**9   # watchdog: late
    (root / "flight-recorder").mkdir()
    (root / "flight-recorder" / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump, protocol=2))
    (root / "flight-recorder" / "nccl_trace_rank_1").write_bytes(_fr_dump(1, ops[1], 3.25, bad_seq=-1))
    (root / "logs" / "insp").mkdir()
    (root / "logs" / "insp" / f"vm-pid{pid[1]}.log").write_text(_inspector(pid[1], 1, ops[1], 77.0))
    n = read_model([root], skew=False)["nccl_events"]
    one = n[n["rank"] == 1]
    assert set(one["gpu_source"]) == {"inspector"} and set(one["duration_ns"]) == {77_000}
    zero = n[n["rank"] == 0].sort_values("op_count")
    assert set(zero["gpu_source"]) == {"flight_recorder"}
    assert set(zero["duration_ns"]) == {900_000 + 10**9}
    assert (zero["end_ns"].to_numpy() == r0["timestamp_ns"].to_numpy() + 901_000 + 10**9).all()


def test_inspector_without_matching_calls_is_a_problem_not_a_crash(tmp_path):
    root = _unpacked_clean(tmp_path)
    base = read_model([root], skew=False)["nccl_events"]
    pid2 = int(base.loc[base["rank"] == 2, "pid"].iloc[0])
    (root / "logs" / "insp").mkdir()
    # sequence numbers far beyond what the tracer saw (tracer attached late)
    text = _inspector(pid2, 2, ["ALL_REDUCE"], 10.0).replace('"coll_sn":0', '"coll_sn":9000')
    (root / "logs" / "insp" / f"vm-pid{pid2}.log").write_text(text)
    m = read_model([root], skew=False)
    assert set(m["nccl_events"]["duration_source"]) == {"host_sync"}
    assert any("Inspector records of pid" in p for p in m.problems)


# --------------------------------------------------------------------------- malformed input

def test_malformed_artifacts_become_warnings(tmp_path):
    b = lab_bundle(tmp_path, "clean", extra={
        "flight-recorder/nccl_trace_rank_0": PARSERS / "flight_recorder" / "truncated_nccl_trace_rank_0",
        "flight-recorder/evil.pkl": PARSERS / "flight_recorder" / "malicious_os_system.pkl",
        "nccl-tests/output.txt": "# nThread 1 nGpus 1\n#  size count type redop root time algbw busbw #wrong\n"
                                 "  8 2 float sum -1 12.9 0.00 nope 0 12.8 0.00 0.00 0\n",
        "stacks/py-spy-1-end.txt": b"\x00\x01\x02\x03" * 100,
        "sys/host/ss-tinp-end.txt": "ESTAB 0 0 10.0.0.1:1 garbage\n",
        "sys/lsmod.txt": "", "sys/host/ip-link-end.json": "{not json",
    }, logs={2: "node2:1:1 [0] NCCL INFO comm 0xabc rank x nranks 4 - Init COMPLETE\n"})
    a = analyze([b])
    probs = "\n".join(a.problems)
    assert "node: flight-recorder/nccl_trace_rank_0: unreadable pickle" in probs
    assert "node: flight-recorder/evil.pkl: refused pickle" in probs
    assert "node: nccl-tests/output.txt:3: non-numeric busbw" in probs
    assert "node: stacks/py-spy-1-end.txt: binary data" in probs
    assert "node: sys/host/ss-tinp-end.txt:1:" in probs
    assert "node: sys/host/ip-link-end.json: not valid JSON" in probs
    assert "node: logs/nccl-rank2.log:1: malformed Init line" in probs
    assert not any("detector" in p and "failed" in p for p in a.problems)
    cfg = a.model["nccl_config"]
    assert sorted(cfg["rank"].dropna()) == [0, 1, 2, 3]
    # the broken log's process (pid 1) is in no manifest: a log-only row; rank 2 keeps its manifest row
    assert cfg.loc[cfg["pid"] == 1, "source"].tolist() == ["log"]
    assert cfg.loc[cfg["rank"] == 2, "source"].tolist() == ["manifest"]
    a.close()


def test_bundle_without_artifacts_gets_empty_tables(tmp_path):
    b = make_bundle(tmp_path, "bare", [], {})
    m = read_model([b])
    for t in ("nccl_config", "nccl_warnings", "nccl_tests", "nccl_tests_runs", "stacks", "sockets", "fr_entries",
              "fr_pg_status"):
        assert m[t].empty, t
    assert len(m["host_facts"]) == 1 and m.problems == []
    con = m.connect()
    assert con.execute("SELECT count(*) FROM host_facts").fetchone()[0] == 1


def test_profiler_kernel_times_of_the_readme_trace(tmp_path):
    """The example plugin's README trace (not strict JSON: repaired with warnings): its one
    AllReduce ran 8159.232 us on the GPU (KernelCh StopGpuClk - StartGpuClk)."""
    from forensics.inputs.bundle import Bundle
    from forensics.model.artifacts import read_artifacts
    from forensics.model.gpu_times import profiler_records
    d = make_bundle(tmp_path, "h", [], {"logs/nccl-profile-h-1.txt":
                                        PARSERS / "nccl_profiler_trace" / "example_readme_trace.json"})
    with Bundle.open(d) as b:
        rec = profiler_records(b, read_artifacts(b))
        assert any("repaired" in p for p in b.problems)
    assert len(rec) == 1
    r = rec.iloc[0]
    assert (r["pid"], r["op"], r["seq"], r["comm_id"]) == (225798, "ALL_REDUCE", 0, "0x14ba61f9a096f33f")
    assert r["exec_time_us"] == pytest.approx(8159.232)


def test_nccl_tests_footer_alone_is_a_failed_run(tmp_path):
    """A paste that kept only the command and the footer (no table, no devices) is still a run
    whose out-of-bounds count reaches the runs table, so a FAILED footer is never silent."""
    b = make_bundle(tmp_path, "h", [], {"nccl-tests/out.txt": "./hypercube_perf -b 8 -e 8g -g 4\n"
                                        "Out of bounds values : 56 FAILED\n"})
    runs = read_model([b])["nccl_tests_runs"]
    assert runs["out_of_bounds"].tolist() == [56] and runs["rows"].tolist() == [0]


def test_nccl_tests_output_attached_in_logs_with_its_nccl_lines(tmp_path):
    """An attached benchmark log (logs/): its result rows and the NCCL init lines it printed."""
    nccl = [ln for ln in (PARSERS / "nccl_debug" / "nccl_debug_info_init.log").read_text().splitlines()
            if ln.startswith("axa:")]
    bench = (PARSERS / "nccl_tests" / "nccl_tests_output_mixed.txt").read_text().splitlines()[:15]
    b = make_bundle(tmp_path, "axa", [], {"logs/bench.log": "\n".join(bench[:3] + nccl + bench[3:]) + "\n"})
    m = read_model([b])
    assert len(m["nccl_tests"]) == 8 and m["nccl_tests_runs"]["test_hosts"].tolist() == ["spark-d708,spark-dbf4"]
    cfg = m["nccl_config"]
    assert cfg[["pid", "transport", "socket_ifaces"]].values.tolist() == [[3048391, "Socket", "lo"]]
    assert cfg["artifact"].tolist() == ["logs/bench.log"]


def test_no_gpu_times_on_a_communicator_the_tracer_joined_late(tmp_path):
    """The tracer attached after init and after the first 5 calls: its op counts restart at
    0, so Inspector record n is not the tracer's call n. No GPU time may be mapped (a
    silent shift would time every call with its neighbour's kernel), and a problem says why."""
    root = _unpacked_clean(tmp_path)
    base = read_model([root], skew=False)["nccl_events"]
    ops2 = list(base[base["rank"] == 2].sort_values("op_count")["op"])
    pid2 = int(base.loc[base["rank"] == 2, "pid"].iloc[0])
    ev_path = root / "bpf" / "events.jsonl"
    kept = []
    for line in ev_path.read_text().splitlines():
        e = json.loads(line)
        if e.get("pid") == pid2 and e.get("ev") in ("comm_init", "unique_id"):
            continue                                   # init happened before the tracer
        if e.get("pid") == pid2 and e.get("ev") == "coll":
            if e["op_count"] < 5:
                continue                               # so did the first five calls
            e["op_count"] -= 5                         # the tracer counts from what it saw
            e["comm_id_hash"] = None
        kept.append(json.dumps(e))
    ev_path.write_text("\n".join(kept) + "\n")
    man = json.loads((root / "manifest.json").read_text())
    man["files"] = [f for f in man["files"] if f["path"] != "bpf/events.jsonl"]
    (root / "manifest.json").write_text(json.dumps(man))
    (root / "logs" / "nccl-inspector").mkdir()
    (root / "logs" / "nccl-inspector" / f"vm-pid{pid2}.log").write_text(_inspector(pid2, 2, ops2, 1234.0))
    m = read_model([root], skew=False)
    r2 = m["nccl_events"][m["nccl_events"]["rank"] == 2]
    assert len(r2) == len(ops2) - 5
    assert "gpu" not in set(r2["duration_source"])
    assert any(f"pid {pid2}: communicator(s) created before the tracer attached" in p for p in m.problems), m.problems


def test_nccl_config_counts_warn_lines_without_a_pid(tmp_path):
    """A WARN line pasted without its host:pid:tid beside a process's lines: its pid is NA
    (nullable), it is counted under no process, and the model is built."""
    log = tmp_path / "pasted.log"
    log.write_text("vm:17:17 [0] NCCL INFO Bootstrap : Using eth0:192.0.2.2<0>\n"
                   "misc/argcheck.cc:30 NCCL WARN AllReduce : comm argument is NULL\n")
    m = read_model([log])
    cfg = m["nccl_config"]
    assert cfg["pid"].tolist() == [17] and cfg["warnings"].tolist() == [0]
    assert len(m["nccl_warnings"]) == 1
