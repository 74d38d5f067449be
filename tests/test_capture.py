"""stallscope capture, the parts that need no root: ELF symbols, /proc parsing,
budget arithmetic, bundle naming, tracer rendering and output merging, the
stdlib-only promise, and a real (short) capture with the privileged collectors
skipped."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT

from capture import bundle as bd
from capture import procs, tracer
from capture.collectors import COLLECTORS
from capture.elf import ElfError, exported_functions

LAB_BUILD = ROOT / "tests" / "lab" / "build"


@pytest.fixture(scope="module")
def lab_lib() -> Path:
    lib = LAB_BUILD / "libnccl.so.2"
    if not lib.exists():
        if subprocess.run(["make", "-s", "-C", str(ROOT / "tests" / "lab")], capture_output=True).returncode:
            pytest.skip("the lab's libnccl.so.2 could not be built (make -C tests/lab)")
    return lib


# ---------------------------------------------------------------- ELF
def test_elf_reader_finds_the_nccl_api_of_the_lab_library(lab_lib):
    syms = exported_functions(lab_lib)
    for name in tracer.NCCL_SYMBOLS:
        assert name in syms, name
    assert "comm_init" not in syms  # static (hidden) functions are not exported


def test_elf_reader_on_libc_and_non_elf(tmp_path):
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6", "/lib64/libc.so.6")
                if os.path.exists(p))
    syms = exported_functions(libc)
    assert {"malloc", "printf", "pthread_create"} <= set(syms)
    bad = tmp_path / "x.so"
    bad.write_bytes(b"not an elf at all")
    with pytest.raises(ElfError):
        exported_functions(bad)


# ---------------------------------------------------------------- /proc
def test_proc_parsing_on_this_process(monkeypatch):
    env = procs.read_env(os.getpid())
    assert all(k in procs.RANK_VARS or k.startswith(procs.ENV_PREFIXES) for k in env)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    try:
        socks = procs.tcp_sockets(os.getpid())
        port = srv.getsockname()[1]
        states = {(s["saddr"], s["sport"], s["state"]) for s in socks}
        assert ("127.0.0.1", port, "LISTEN") in states
        est = [s for s in socks if s["state"] == "ESTABLISHED" and s["dport"] == port]
        assert est and est[0]["daddr"] == "127.0.0.1" and est[0]["fd"] == cli.fileno()
    finally:
        for s in (cli, acc, srv):
            s.close()
    assert procs.netns_inode(os.getpid()) == os.stat("/proc/self/ns/net").st_ino
    assert "lo" in procs.netns_interfaces(os.getpid())
    assert os.getpid() in procs.descendants([os.getppid()])


def test_nccl_socket_ifname_semantics():
    avail = ["lo", "eth0", "eth1", "ib0", "docker0"]
    assert procs.select_ifaces("eth", avail) == ["eth0", "eth1"]
    assert procs.select_ifaces("=eth1", avail) == ["eth1"]
    assert procs.select_ifaces("^docker,lo", avail) == ["eth0", "eth1", "ib0"]
    assert procs.select_ifaces("ib0,eth1", avail) == ["eth1", "ib0"]
    assert procs.select_ifaces(None, avail) == []


def test_parse_ss_tinp():
    text = ("ESTAB 0      0      10.203.0.10:41234 10.203.0.11:35000 users:((\"sslab_rank\",pid=4242,fd=9)) "
            "uid:0 ino:1 sk:1 <->\n"
            "\t cubic wscale:7,7 rto:204 rtt:0.05/0.02 mss:1448 cwnd:10 bytes_sent:1000 bytes_retrans:200 "
            "segs_out:12 retrans:0/3 lost:1\n"
            "LISTEN 0 64 0.0.0.0:29500 0.0.0.0:* users:((\"sslab_rank\",pid=4242,fd=3))\n")
    rows = procs.parse_ss_tinp(text)
    assert rows[0]["pids"] == [4242] and rows[0]["retrans_total"] == 3 and rows[0]["bytes_retrans"] == 200
    assert rows[0]["peer"] == "10.203.0.11:35000" and rows[1]["state"] == "LISTEN"


# ---------------------------------------------------------------- budget, naming
def test_sizes_and_durations():
    assert bd.parse_size("2G") == 2 << 30 and bd.parse_size("500M") == 500 << 20 and bd.parse_size("64k") == 65536
    assert bd.parse_duration("2m") == 120 and bd.parse_duration("1h30m") == 5400
    assert bd.parse_duration("500ms") == 0.5 and bd.parse_duration("45") == 45
    for bad in ("", "2x", "m2"):
        with pytest.raises(ValueError):
            bd.parse_duration(bad)
    with pytest.raises(ValueError):
        bd.parse_size("lots")


def test_budget_plan_and_archive_bound(tmp_path):
    b = bd.Budget.plan(2 << 20)
    assert b.pcap + b.tracer + b.other + b.reserve <= 2 << 20
    assert b.take(10 << 20) == b.other and b.take(1) == 0
    # the bound holds for incompressible data, whatever the file sizes
    rng = random.Random(7)
    stage = tmp_path / "s"
    sizes = []
    for i in range(12):
        n = rng.choice([0, 1, 511, 512, 513, 70000, 300001])
        p = stage / f"d{i % 3}" / f"f{i}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(n))
        sizes.append(n)
    dest = tmp_path / "x.tar.gz"
    size = bd.write_archive(stage, dest, "x")
    assert size <= bd.archive_bound(sizes, dirs=4)
    bd.commit_archive(dest)
    with tarfile.open(dest) as t:
        assert len([m for m in t.getmembers() if m.isfile()]) == 12


def test_bundle_names_never_overwrite(tmp_path):
    ns = 1_700_000_000_000_000_000
    first = bd.choose_output(str(tmp_path), "h", ns)
    assert first.name == "stallscope-h-20231114T221320Z.tar.gz"
    first.write_bytes(b"x")
    second = bd.choose_output(str(tmp_path), "h", ns)
    assert second.name == "stallscope-h-20231114T221320Z-1.tar.gz"
    with pytest.raises(FileExistsError):
        bd.choose_output(str(first), "h", ns)
    (tmp_path / "a.partial").write_bytes(b"")
    Path(str(tmp_path / "a") + ".tar.gz.partial").write_bytes(b"y")
    dest = tmp_path / "a.tar.gz"
    dest.write_bytes(b"existing")
    with pytest.raises(FileExistsError):
        bd.commit_archive(dest)          # a bundle that appeared meanwhile is not replaced
    assert dest.read_bytes() == b"existing"


def test_collectors_are_a_table():
    names = [c.name for c in COLLECTORS]
    assert len(names) == len(set(names))
    for c in COLLECTORS:
        assert (c.argv is None) != (c.func is None), c.name
        assert c.scope in ("host", "netns", "iface", "process") and c.out
        assert set(c.when) <= {"start", "end", "continuous"}
    assert {"tracer", "tcpdump", "ss", "ib-counters", "py-spy", "attachments", "dmesg"} <= set(names)


# ---------------------------------------------------------------- tracer script and output
def _features():
    fmt_old = ("field:int state;\tfield:__u16 sport;\tfield:__u16 dport;\tfield:__u16 family;\t"
               "field:__u8 saddr[4];\tfield:__u8 daddr[4];\tfield:__u8 saddr_v6[16];\tfield:__u8 daddr_v6[16];")
    fmt_new = "field:int state;\tfield:enum sk_rst_reason reason;\tfield:__u8 saddr[28];\tfield:__u8 daddr[28];"
    return tracer.KernelFeatures(btf=True, tracepoints={
        "tcp/tcp_retransmit_skb": fmt_old, "tcp/tcp_send_reset": fmt_new, "tcp/tcp_receive_reset": fmt_old,
        "sock/inet_sock_set_state": fmt_old + "field:__u16 protocol;", "sched/sched_switch": "",
        "sched/sched_process_fork": ""})


def test_render_keeps_only_what_exists():
    t = tracer.TraceTargets(nccl={"/opt/a/libnccl.so.2": {"ncclAllReduce", "ncclCommInitRank", "ncclSend"}})
    script, blocks = tracer.render_script(t, _features())
    assert "uprobe:/opt/a/libnccl.so.2:ncclAllReduce" in script
    assert "ncclAllGather" not in script and "cudaStreamSynchronize" not in script
    assert "send_reset_sockaddr" in blocks and "send_reset_ports" not in blocks
    assert "follow_forks" not in blocks and "@want" not in script
    assert "skc_net.net->ns.inum" in script
    # every map that is read is declared in BEGIN
    begin = script.split("BEGIN", 1)[1].split("}", 1)[0]
    for name in set(__import__("re").findall(r"@(\w+)\[", script)) - {"offcpu"}:
        assert f"@{name}[" in begin, name


def test_render_pid_filter_and_two_libraries():
    t = tracer.TraceTargets(nccl={"/a/libnccl.so.2": set(tracer.NCCL_SYMBOLS),
                                  "/b/libtorch_cuda.so": {"ncclAllReduce"}},
                            cudart={"/a/libcudart.so.12": {"cudaStreamSynchronize"}}, want_pids=[11, 12])
    script, blocks = tracer.render_script(t, _features())
    assert "uprobe:/a/libnccl.so.2:ncclAllReduce,\nuprobe:/b/libtorch_cuda.so:ncclAllReduce" in script
    assert "@want[(uint64)11] = 1;" in script and "follow_forks" in blocks
    assert script.count("if (@want[(uint64)pid]) {") >= 10
    assert "PIDFILTER" not in script and "{FN}" not in script


def test_event_writer_merges_names_and_caps(tmp_path):
    w = tracer.EventWriter(tmp_path / "e.jsonl", max_bytes=100_000)
    w.feed('{"ev":"tracer_start","t":1,"tracer_pid":9}')
    w.feed('{"ev":"coll","op":"ALL_REDUCE","t0":10,"pid":5,"tid":6,"comm":"0x1","rank":0,"nranks":2,'
           '"comm_id_hash":"0x00000000000000aa","known":1,"op_count":0}')
    w.feed('{"ev":"ret","k":"coll","t1":20,"pid":5,"tid":6,"rc":0}')
    # a return that overtakes its entry (per-CPU buffers)
    w.feed('{"ev":"ret","k":"host_wait","t1":40,"pid":5,"tid":6,"rc":0}')
    w.feed('{"ev":"host_wait","fn":"cudaStreamSynchronize","t0":30,"pid":5,"tid":6,"stream":"0x2"}')
    w.feed('{"ev":"coll","op":"SEND","t0":50,"pid":5,"tid":6,"comm":"0x3","rank":0,"nranks":0,'
           '"comm_id_hash":"0x0000000000000000","known":0,"op_count":7}')
    w.feed('{"ev":"tcp_retransmit_skb","t":60,"pid":0,"family":4,"saddr":"::ffff:10.0.0.1","daddr":"10.0.0.2",'
           '"sport":1,"dport":2,"state":1,"netns":5}')
    w.feed('{"ev":"tcp_send_reset","t":61,"family":6,"saddr6":"fe800000000000000000000000000001",'
           '"daddr6":"00000000000000000000000000000001","sport":1,"dport":2,"state":7}')
    w.feed('{"ev":"offcpu_dump","t":70}')
    w.feed("@offcpu[5, 6]: 12345")
    w.feed("Attaching 49 probes...")
    w.feed('{"ev": broken')
    w.close()
    ev = [json.loads(l) for l in (tmp_path / "e.jsonl").read_text().splitlines()]
    by = {e["ev"]: e for e in ev}
    by["coll"] = [e for e in ev if e.get("op") == "ALL_REDUCE"][0]
    assert by["coll"]["t1"] == 20 and by["coll"]["rc"] == 0 and "known" not in by["coll"]
    assert by["host_wait"]["t0"] == 30 and by["host_wait"]["t1"] == 40
    never = [e for e in ev if e.get("op") == "SEND"][0]
    assert never["t1"] is None and never["returned"] is False and never["rank"] is None
    assert by["tcp_retransmit_skb"]["saddr"] == "10.0.0.1" and by["tcp_retransmit_skb"]["state"] == "ESTABLISHED"
    assert by["tcp_send_reset"]["saddr"] == "fe80::1" and by["tcp_send_reset"]["daddr"] == "::1"
    assert by["offcpu"] == {"ev": "offcpu", "t": 70, "pid": 5, "tid": 6, "ns": 12345}
    s = w.summary()
    assert s["attached_probes"] == 49 and s["unparsable_lines"] == 1
    small = tracer.EventWriter(tmp_path / "s.jsonl", max_bytes=300)
    for i in range(50):
        small.feed(f'{{"ev":"sock_state","t":{i},"pid":1}}')
    small.close()
    assert (tmp_path / "s.jsonl").stat().st_size <= 300 and small.dropped > 0


# ---------------------------------------------------------------- stdlib only, CLI
def test_capture_package_is_standard_library_only():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import capture, capture.cli, capture.runner, "
            "capture.collectors, capture.tracer, capture.procs, capture.elf, capture.children, capture.bundle; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('numpy', 'pandas', 'forensics', 'dpkt')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-E", "-S", "-m", "capture", "--help"], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0 and "--max-bytes" in p.stdout and "--nccl-tests" in p.stdout


def test_cli_bad_usage_exits_2(tmp_path):
    from forensics.cli import Env, main
    import io
    existing = tmp_path / "b.tar.gz"
    existing.write_bytes(b"x")
    for argv in (["capture", "--duration", "soon"], ["capture", "--max-bytes", "lots"],
                 ["capture", "-o", str(existing), "--duration", "1s"],
                 ["capture", "--nccl-lib", str(tmp_path / "missing.so"), "-o", str(tmp_path)]):
        err = io.StringIO()
        assert main(argv, Env(stdout=io.StringIO(), stderr=err)) == 2, argv
        assert "error" in err.getvalue()
    assert existing.read_bytes() == b"x"


def _check_bundle(path: Path) -> dict:
    with tarfile.open(path) as t:
        members = {m.name.split("/", 1)[1]: m for m in t.getmembers() if m.isfile()}
        manifest = json.load(t.extractfile(members["manifest.json"]))
        listed = {f["path"]: f for f in manifest["files"]}
        assert set(listed) == set(members) - {"manifest.json"}
        for name, f in listed.items():
            data = t.extractfile(members[name]).read()
            assert len(data) == f["bytes"] and hashlib.sha256(data).hexdigest() == f["sha256"], name
    assert manifest["schema_version"] == 1 and manifest["host"] and manifest["kernel"]
    assert manifest["started_ns"] < manifest["ended_ns"]
    for rec in manifest["collectors"].values():
        assert rec["status"] in ("ok", "skipped", "failed")
        assert rec["status"] != "skipped" or rec["reason"]
    samples = manifest["clock_samples"]
    assert len(samples) >= 2 and all(s["monotonic_ns"] > 0 and s["realtime_ns"] > 0 for s in samples)
    return manifest


def test_capture_without_tracer_and_pcap_still_writes_a_bundle(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("NCCL INFO something\n")
    from capture import CaptureOptions, run_capture
    import io
    err = io.StringIO()
    target = subprocess.Popen(["sleep", "30"], env={"RANK": "3", "WORLD_SIZE": "8", "NCCL_SOCKET_IFNAME": "lo"})
    try:
        res = run_capture(CaptureOptions(output=str(tmp_path), duration_s=1.0, bpf=False, pcap=False,
                                         attach=[str(tmp_path / "*.log")], pids=[target.pid], progress="lines"),
                          stderr=err)
    finally:
        target.kill()
        target.wait()
    m = _check_bundle(res.path)
    assert m["collectors"]["tracer"]["status"] == "skipped" and m["collectors"]["tracer"]["reason"] == "--no-bpf"
    assert m["collectors"]["attachments:end"]["status"] == "ok"
    assert any(f["path"] == "logs/x.log" for f in m["files"])
    assert [(p["pid"], p["rank"], p["world_size"]) for p in m["processes"]] == [(target.pid, 3, 8)]
    assert res.exit_code in (0, 3)
    assert not list(tmp_path.glob(".*staging*")) and not list(tmp_path.glob("*.partial"))
