"""stallscope capture, the parts that need no root: ELF symbols, /proc parsing,
budget arithmetic, bundle naming, tracer rendering and output merging, the
stdlib-only promise, and a real (short) capture with the privileged collectors
skipped."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from capture_helpers import CaptureProc, alive, bundle_manifest, check_bundle, readable_copy
from conftest import ROOT

from capture import bundle_files as bd
from capture import procs
from capture.collectors.specs import SPECS
from capture.elf import ElfError, exported_functions
from capture.tracer import events, program, spool

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
    for name in program.NCCL_SYMBOLS:
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


def test_descendants_from_the_children_files_match_a_walk_of_every_process():
    """The rescan's cheap walk (/proc/PID/task/*/children) finds what the full walk over
    every process's parent finds: a child, a grandchild, and a child of a second thread."""
    script = ("import os, subprocess, sys, threading, time\n"
              "kids = [subprocess.Popen(['sh', '-c', 'sleep 30 & wait'])]\n"
              "t = threading.Thread(target=lambda: kids.append(subprocess.Popen(['sleep', '30'])))\n"
              "t.start(); t.join(); print('up', flush=True); time.sleep(30)\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 10
        while len(procs._descendants_by_parent([p.pid])) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)        # the shell's own child (sleep 30 &) may come a moment later
        full = procs._descendants_by_parent([p.pid])
        assert len(full) == 3
        assert procs.descendants([p.pid]) == full
        assert procs.descendants([os.getppid()]) >= {os.getpid(), p.pid} | full
    finally:
        for c in procs._descendants_by_parent([p.pid]):
            os.kill(c, signal.SIGKILL)
        p.kill()
        p.wait()


def test_discover_reads_a_process_without_nccl_again_only_once_it_changed(lab_lib, monkeypatch):
    """An always-on watcher rescans the host every few seconds: a process found without NCCL
    is not inspected again until its size changes; when it then loads libnccl
    (``import torch`` minutes after start-up), the next rescan finds it."""
    script = ("import ctypes, sys, time\n"
              "print('up', flush=True); sys.stdin.readline()\n"
              f"ctypes.CDLL({str(lab_lib)!r}); print('loaded', flush=True); time.sleep(30)\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    inspected = []
    real = procs.inspect
    monkeypatch.setattr(procs, "inspect", lambda pid, *a, **k: inspected.append(pid) or real(pid, *a, **k))
    try:
        assert p.stdout.readline() == b"up\n"
        cache: dict = {}
        found = procs.discover(program.NCCL_SYMBOLS, skip={os.getpid()}, not_nccl=cache)
        assert p.pid not in [i.pid for i in found] and p.pid in cache and inspected.count(p.pid) == 1
        procs.discover(program.NCCL_SYMBOLS, skip={os.getpid()}, not_nccl=cache)
        assert inspected.count(p.pid) == 1          # unchanged: its maps are not read again
        p.stdin.write(b"go\n")
        p.stdin.flush()
        assert p.stdout.readline() == b"loaded\n"
        found = procs.discover(program.NCCL_SYMBOLS, skip={os.getpid()}, not_nccl=cache)
        assert [i.pid for i in found if i.pid == p.pid] == [p.pid] and p.pid not in cache
        assert found[[i.pid for i in found].index(p.pid)].nccl_libs
    finally:
        p.kill()
        p.wait()
    procs.discover(program.NCCL_SYMBOLS, skip={os.getpid()}, not_nccl=cache)
    assert p.pid not in cache                        # gone: forgotten (a reused pid is a new process)


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
    # snapshots cannot eat the part kept for attachments; attachments can use everything left
    assert 0 < b.attach < b.other
    assert b.take(10 << 20) == b.other - b.attach and b.take(1) == 0
    assert b.take(10 << 20, "attach") == b.attach and b.take(1, "attach") == 0
    b.give_back(100, "attach")
    assert b.take(1000, "attach") == 100
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


def test_write_capped_keeps_a_logs_start_and_end(tmp_path):
    b = bd.Budget.plan(4 << 20)
    b.take(b.other)                    # the snapshots used every shared byte...
    log = b"".join(b"host:1:1 [0] NCCL INFO line %06d\n" % i for i in range(200_000))
    n, trunc = bd.write_capped(tmp_path / "log", log, b, 64 << 20, pool="attach", keep_head=True)
    out = (tmp_path / "log").read_bytes()
    assert trunc and 0 < n == len(out) <= b.attach     # ...the attachment still got its part
    assert out.startswith(b"host:1:1 [0] NCCL INFO line 000000\n")
    assert out.endswith(b"line 199999\n") and b"[truncated by stallscope: byte budget]\n" in out
    head, tail = out.split(b"[truncated by stallscope: byte budget]\n")
    assert head.endswith(b"\n") and len(head) < len(tail)
    # a snapshot keeps its tail only
    b2 = bd.Budget.plan(1 << 20)
    n, trunc = bd.write_capped(tmp_path / "snap", log, b2, 64 << 20)
    snap = (tmp_path / "snap").read_bytes()
    assert trunc and snap.startswith(b"[truncated by stallscope") and snap.endswith(b"line 199999\n")


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
    names = [c.name for c in SPECS]
    assert len(names) == len(set(names))
    for c in SPECS:
        assert (c.argv is None) != (c.func is None), c.name
        assert c.scope in ("host", "netns", "iface", "process") and c.out
        assert set(c.when) <= {"start", "end", "continuous"}
    assert {"tracer", "tcpdump", "ss", "ib-counters", "py-spy", "attachments", "dmesg"} <= set(names)


# ---------------------------------------------------------------- tracer script and output
def _features():
    fmt_old = ("field:int state;\tfield:__u16 sport;\tfield:__u16 dport;\tfield:__u16 family;\t"
               "field:__u8 saddr[4];\tfield:__u8 daddr[4];\tfield:__u8 saddr_v6[16];\tfield:__u8 daddr_v6[16];")
    fmt_new = "field:int state;\tfield:enum sk_rst_reason reason;\tfield:__u8 saddr[28];\tfield:__u8 daddr[28];"
    return program.KernelFeatures(btf=True, tracepoints={
        "tcp/tcp_retransmit_skb": fmt_old, "tcp/tcp_send_reset": fmt_new, "tcp/tcp_receive_reset": fmt_old,
        "sock/inet_sock_set_state": fmt_old + "field:__u16 protocol;", "sched/sched_switch": "",
        "sched/sched_process_fork": "", "sched/sched_process_exit": ""})


def test_possible_cpus_counts_the_highest_cpu_number(tmp_path):
    """bpftrace's cpu runs up to the highest possible CPU number, offline ones too."""
    f = tmp_path / "possible"
    for text, want in (("0-1\n", 2), ("0-3,8-11\n", 12), ("0\n", 1), ("5\n", 6)):
        f.write_text(text)
        assert program.possible_cpus(str(f)) == want, text
    f.write_text("garbage")
    assert program.possible_cpus(str(f)) == (os.cpu_count() or 1)
    assert program.possible_cpus(str(tmp_path / "absent")) == (os.cpu_count() or 1)


def test_render_keeps_only_what_exists():
    t = program.TraceTargets(nccl={"/opt/a/libnccl.so.2": {"ncclAllReduce", "ncclCommInitRank", "ncclSend"}})
    script, blocks = program.render_script(t, _features(), call_returns=False)
    assert "uprobe:/opt/a/libnccl.so.2:ncclAllReduce" in script
    assert "ncclAllGather" not in script and "cudaStreamSynchronize" not in script
    assert "send_reset_sockaddr" in blocks and "send_reset_ports" not in blocks
    assert "follow_forks" not in blocks and "@want" not in script
    assert "skc_net.net->ns.inum" in script
    # the hot path records into the double-buffered maps; no sched_switch probe, no printf per call
    assert "flush" in blocks and "sched_switch" not in script and "uretprobe:/opt/a/libnccl.so.2:ncclAllReduce" not in script
    body = script.split("uprobe:/opt/a/libnccl.so.2:ncclAllReduce", 1)[1].split("\n}\n", 1)[0]
    assert "printf" not in body and "@e0[(int32)tid, $t] = $r" in body and "@e1[" in body
    assert "stop" not in blocks   # no trigger without capture's libc
    # every map that is read is declared in BEGIN
    begin = script.split("BEGIN", 1)[1].split("}", 1)[0]
    for name in set(__import__("re").findall(r"@(\w+)\[", script)):
        assert f"@{name}[" in begin, name


def test_render_pid_filter_and_two_libraries():
    t = program.TraceTargets(nccl={"/a/libnccl.so.2": set(program.NCCL_SYMBOLS),
                                  "/b/libtorch_cuda.so": {"ncclAllReduce"}},
                            cudart={"/a/libcudart.so.12": {"cudaStreamSynchronize"}}, want_pids=[11, 12],
                            stop_lib="/lib/libc.so.6", capture_pid=77)
    script, blocks = program.render_script(t, _features(), call_returns=False)
    assert "uprobe:/a/libnccl.so.2:ncclAllReduce,\nuprobe:/b/libtorch_cuda.so:ncclAllReduce" in script
    assert "@want[(uint64)11] = 1;" in script and "follow_forks" in blocks
    assert script.count("if (@want[(uint64)pid]) {") >= 10
    assert "PIDFILTER" not in script and "{FN}" not in script and "{KIND}" not in script
    assert "uprobe:/lib/libc.so.6:sched_get_priority_max\n/pid == 77 && @ep[0] != 2/" in script
    # returns traced for ncclGroupEnd and the host waits only; ncclBcast keeps its nesting guard
    assert "uretprobe:/a/libnccl.so.2:ncclGroupEnd" in script and "uretprobe:/a/libnccl.so.2:ncclGroupStart" not in script
    assert "uretprobe:/a/libcudart.so.12:cudaStreamSynchronize" in script
    assert "uretprobe:/a/libnccl.so.2:ncclBcast" in script and "uretprobe:/a/libnccl.so.2:ncclAllReduce" not in script
    assert "group_entry:ncclGroupStart" in blocks and "group_call:ncclGroupEnd" in blocks


def test_render_call_returns_by_default():
    t = program.TraceTargets(nccl={"/a/libnccl.so.2": set(program.NCCL_SYMBOLS)})
    script, blocks = program.render_script(t, _features())
    assert "coll_call:ncclAllReduce" in blocks and "coll_return" in blocks and "coll_entry:ncclAllReduce" not in blocks
    assert "uretprobe:/a/libnccl.so.2:ncclAllReduce" in script and "group_call:ncclGroupStart" in blocks
    # the return completes the call's record in place while it is in the current buffer
    ret = script.split("uretprobe:/a/libnccl.so.2:ncclRecv", 1)[1].split("\n}\n", 1)[0]
    assert "@e0[(int32)tid, $o.0] = ($x.0," in ret and "(int32)255" in ret and "delete(@op[" in ret
    assert "printf" not in ret
    lean, _ = program.render_script(t, _features(), call_returns=False)
    assert "(--no-call-returns)" in lean.splitlines()[0] and "uretprobe:/a/libnccl.so.2:ncclAllReduce" not in lean
    # the flush interval: capture's, and the watcher's longer one (each flush costs the job)
    assert f"interval:ms:{program.FLUSH_MS}\n" in script
    from capture.policy import RingPolicy
    ring_ms = RingPolicy().tracer_flush_ms
    slow, _ = program.render_script(t, _features(), flush_ms=ring_ms)
    assert f"interval:ms:{ring_ms}\n" in slow and "interval:ms:500\n" not in slow


def test_render_ring_mode_keeps_the_records_in_the_kernel():
    """capture --watch: the records go into a ring (@r) that is printed only when the watcher
    asks (the dump probe on its libc); every second the tracer prints the calls' state (@op),
    which only the state block deletes from, just before its print."""
    t = program.TraceTargets(nccl={"/a/libnccl.so.2": set(program.NCCL_SYMBOLS)},
                            cudart={"/a/libcudart.so.12": set(program.CUDART_SYMBOLS)},
                            stop_lib="/lib/libc.so.6", capture_pid=42)
    script, blocks = program.render_script(t, _features(), flush_ms=1000, ring=4096)
    assert {"state", "dump", "thread_exit"} <= set(blocks) and not {"flush", "stop"} & set(blocks)
    assert "@e0" not in script and "@e1" not in script and "@ne" not in script and "print(@r)" in script
    assert f"uprobe:/lib/libc.so.6:{program.DUMP_SYMBOL}\n/pid == 42/" in script
    assert script.count("$s % 4096;") >= 3 and "(ring mode, 4096 records)" in script.splitlines()[0]
    state = script.split("interval:ms:1000\n", 1)[1].split("\n}\n", 1)[0]
    # @op is deleted from in the state block only, right before its print (and after its declaration)
    assert state.count("delete(@op[") == 3 and state.rstrip().endswith("print(@op);")
    # threads that ended queue per CPU (one writer a queue); the state block goes round the CPUs
    feats = _features()
    assert f"@xc[0] = ($q + 1) % {feats.cpus};" in state
    ended = script.split("tracepoint:sched:sched_process_exit", 1)[1].split("\n}\n", 1)[0]
    assert "$q = (uint64)cpu;" in ended and "@xw[$q] = $i + 1;" in ended and "@xw[0]" not in script
    wide = program.render_script(t, program.KernelFeatures(btf=True, tracepoints=feats.tracepoints, cpus=96),
                                flush_ms=1000, ring=4096)[0]
    assert "@xc[0] = ($q + 1) % 96;" in wide
    others = [l.strip() for l in script.replace(state, "").splitlines() if "delete(@op[" in l]
    assert len(others) == 1 and others[0].startswith(program.RING_OP_DECL), others
    # a host wait's return keeps the second's longest wait after a collective; others do not
    wait_ret = script.split("uretprobe:/a/libcudart.so.12:cudaStreamSynchronize", 1)[1].split("\n}\n", 1)[0]
    coll_ret = script.split("uretprobe:/a/libnccl.so.2:ncclRecv", 1)[1].split("\n}\n", 1)[0]
    assert "$lc > $o.3" in wait_ret and "$lc" not in coll_ret and "(int32)255" in coll_ret
    # no returns traced: a collective's launch is its class's last t0
    lean, _ = program.render_script(t, _features(), call_returns=False, ring=4096)
    entry = lean.split("uprobe:/a/libnccl.so.2:ncclAllReduce", 1)[1].split("\n}\n", 1)[0]
    assert "@op[(int32)tid, (int32)0] = ((uint64)0, (uint64)0, (int32)pid, (uint64)$t, $p.4" in entry
    # without the libc to attach the dump to, no ring
    t.stop_lib = None
    assert "dump" not in program.render_script(t, _features(), ring=4096)[1]


def _rec(kind, pid, a=0, b=0, c=0, d=0, e=0, f=0, g=0, t1=0, rc=0):
    return f"({kind}, {pid}, {a}, {b}, {c}, {d}, {e}, {f}, {g}, {t1}, {rc})"


def test_the_progress_monitor_reads_the_fields_parse_record_reads():
    """capture.watch reads the hot-path records with events.PROGRESS_RE, a chunk at a time:
    the same fields as events.parse_record, line by line, and nothing that is not a record."""
    lines = [f"@e0[101, 5000]: {_rec(0, 7, a=0xdead, b=3, c=1024, d=7, f=-1, g=99, t1=5300)}",
             f"@e1[102, 6000]: {_rec(255, 7, a=5500, t1=6000, rc=-2)}",
             f"@e1[103, 7000]: {_rec(32, 8, a=4)}",
             "@ne: 3", '{"ev":"tcp_retransmit_skb","t":1}', "@e0[1, 2]: (1, 2)"]
    data = ("\n".join(lines) + "\n").encode()
    got = [tuple(int(x) for x in g) for g in events.PROGRESS_RE.findall(data)]
    want = []
    for line in data.split(b"\n"):
        rec = events.parse_record(line)
        if rec is not None:
            tid, key, f = rec
            want.append((tid, key, f[0], f[1], f[2], f[9]))
    assert got == want and len(got) == 3


def test_postprocess_records_joins_names_and_open_calls(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    comm, stream = 0x55AA00, 0x77BB00
    lines = [
        "Attaching 41 probes...",
        '{"ev":"tracer_start","t":1,"tracer_pid":9}',
        '{"ev":"comm_init","fn":"ncclCommInitRank","t0":5,"pid":5,"tid":6,"nranks":2,"rank":1,'
        '"comm_id_hash":"0x00000000000000aa","unique_id":["0x1"]}',
        f'{{"ev":"ret","k":"init","t1":8,"pid":5,"tid":6,"rc":0,"comm":"0x{comm:x}"}}',
        # a collective (no return traced), a host wait (entry, return record keyed by t1 with t0 in slot a),
        # ncclGroupStart (no return traced) and ncclGroupEnd (its return printed before its entry),
        # a communicator nobody saw created, a host wait still inside at the end
        f"@e0[6, 20]: {_rec(0, 5, comm, 0, 1024, 7, 0, -1, stream)}",
        f"@e0[6, 30]: {_rec(32, 5, stream)}",
        f"@e0[6, 40]: {_rec(255, 5, 30, t1=40, rc=0)}",
        f"@e0[6, 12]: {_rec(16, 5)}",
        f"@e0[6, 15]: {_rec(255, 5, 14, t1=15, rc=3)}",
        f"@e0[6, 14]: {_rec(17, 5)}",
        f"@e1[7, 50]: {_rec(6, 5, 0x999, 7, 10, 2, -1, 1, stream)}",
        f"@e1[6, 45]: {_rec(32, 5, stream)}",
        '{"ev":"tcp_retransmit_skb","t":60,"pid":0,"family":4,"saddr":"::ffff:10.0.0.1","daddr":"10.0.0.2",'
        '"sport":1,"dport":2,"state":1,"netns":5}',
        '{"ev":"tcp_send_reset","t":61,"family":6,"saddr6":"fe800000000000000000000000000001",'
        '"daddr6":"00000000000000000000000000000001","sport":1,"dport":2,"state":7}',
        "@ne: 9",
        '{"ev":"tracer_end","t":70}',
        '{"ev": broken',
        "@e0[6, bad]: (1)",
    ]
    (raw / "seg-000000.txt").write_text("\n".join(lines) + "\n")
    off = tmp_path / "offcpu.jsonl"
    off.write_text('{"ev":"offcpu","t":35,"pid":5,"tid":6,"name":"x","state":"S","ns":3,"oncpu_ns":1,"runq_ns":0}\n')
    out = tmp_path / "events.jsonl"
    s = events.postprocess(raw, out, 1 << 20, extra=[off], call_returns=False)
    ev = [json.loads(l) for l in out.read_text().splitlines()]
    times = [e.get("t0", e.get("t")) for e in ev]
    assert times == sorted(times)
    init = next(e for e in ev if e["ev"] == "comm_init")
    assert init["t1"] == 8 and init["rc"] == 0 and init["returned"] is True and init["comm"] == f"0x{comm:x}"
    coll = next(e for e in ev if e["ev"] == "coll" and e["op"] == "ALL_REDUCE")
    assert coll == {"ev": "coll", "op": "ALL_REDUCE", "fn": "ncclAllReduce", "t0": 20, "t1": None, "pid": 5, "tid": 6,
                    "comm": f"0x{comm:x}", "rank": 1, "nranks": 2, "comm_id_hash": "0x00000000000000aa",
                    "op_count": 0, "count": 1024, "datatype": 7, "red_op": 0, "root": -1,
                    "stream": f"0x{stream:x}", "rc": None, "returned": None}
    send = next(e for e in ev if e["ev"] == "coll" and e["op"] == "SEND")
    assert send["rank"] is None and send["comm_id_hash"] is None and send["root"] == 1 and send["op_count"] == 7
    waits = [e for e in ev if e["ev"] == "host_wait"]
    assert [(w["t0"], w["t1"], w["returned"]) for w in waits] == [(30, 40, True), (45, None, False)]
    assert waits[0]["stream"] == f"0x{stream:x}" and waits[0]["fn"] == "cudaStreamSynchronize"
    groups = {e["fn"]: e for e in ev if e["ev"] == "group"}
    assert groups["ncclGroupStart"]["returned"] is None and groups["ncclGroupEnd"]["t1"] == 15
    assert groups["ncclGroupEnd"]["rc"] == 3 and groups["ncclGroupEnd"]["returned"] is True
    retx = next(e for e in ev if e["ev"] == "tcp_retransmit_skb")
    assert retx["saddr"] == "10.0.0.1" and retx["state"] == "ESTABLISHED"
    rst = next(e for e in ev if e["ev"] == "tcp_send_reset")
    assert rst["saddr"] == "fe80::1" and rst["daddr"] == "::1"
    assert next(e for e in ev if e["ev"] == "offcpu")["ns"] == 3
    assert s["attached_probes"] == 41 and s["unparsable_lines"] == 2 and s["hot_records"] == 8
    assert s["hot_records_made"] == 9 and s["lost_events"] == 1     # one record never reached the output
    assert s["orphan_returns"] == 0
    assert s["by_type"]["coll"] == 2 and s["by_type"]["host_wait"] == 2


def test_postprocess_keeps_rare_events_and_the_newest_within_the_cap(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = ['{"ev":"tracer_start","t":1,"tracer_pid":9}',
             '{"ev":"unique_id","t":2,"pid":5,"tid":5,"comm_id_hash":"0x1","unique_id":[]}']
    lines += [f"@e0[6, {100 + i}]: {_rec(0, 5, 0xA, i, 8, 7, 0, -1, 0xB)}" for i in range(400)]
    lines += ['{"ev":"tracer_end","t":9999}']
    (raw / "seg-000000.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "e.jsonl"
    s = events.postprocess(raw, out, 20_000, call_returns=False)
    assert out.stat().st_size <= 20_000 and s["dropped_for_budget"] > 0
    ev = [json.loads(l) for l in out.read_text().splitlines()]
    assert {"tracer_start", "unique_id", "tracer_end"} <= {e["ev"] for e in ev}
    counts = [e["op_count"] for e in ev if e["ev"] == "coll"]
    assert counts == list(range(400 - len(counts), 400))       # the oldest went, the newest stayed
    # the summary counts what the file holds, dropped events taken off
    kinds = {}
    for e in ev:
        kinds[e["ev"]] = kinds.get(e["ev"], 0) + 1
    assert s["by_type"] == kinds and s["events"] == len(ev) and s["dropped_for_budget"] == 400 - len(counts)


def test_spool_segments_drop_oldest_keep_rare(tmp_path):
    r, w = os.pipe()
    rf = os.fdopen(r, "rb")
    sp = spool.Spool(rf, tmp_path / "raw", max_bytes=6000, poll_s=0.01, segment_bytes=1500).start()
    os.write(w, b'Attaching 7 probes...\n{"ev":"tracer_start","t":1}\n')
    assert sp.ready.wait(5) and sp.attached_probes == 7
    for i in range(200):
        os.write(w, f"@e0[6, {i}]: {_rec(0, 5)}\n".encode())
        if i == 5:
            os.write(w, b'{"ev":"comm_init","t0":3}\n@e0[6, 99')   # a line cut across writes
            os.write(w, b'99]: (0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0)\n')
    os.write(w, b'{"ev":"tracer_stopped","t":8}\n{"ev":"tracer_end","t":9}\n')
    os.close(w)
    assert sp.join(5) and sp.ended.is_set() and sp.stopped.is_set()
    files = spool.raw_files(tmp_path / "raw")
    assert files[0].name == "keep.txt" and sp.dropped_segments > 0 and sp.dropped_lines > 0
    data = b"".join(f.read_bytes() for f in files)
    assert sum(f.stat().st_size for f in files) <= 6000 + 1500
    assert b'"tracer_start"' in data and b'"comm_init"' in data and b"@e0[6, 199]" in data
    assert all(l.endswith(b")") or l.startswith((b"{", b"Attaching")) for l in data.splitlines())
    assert sp.lines == 200 + 6


def test_offcpu_sampler_reads_schedstat(tmp_path):
    from capture.offcpu import OffCpuSampler, thread_times
    rows = thread_times(os.getpid())
    assert any(tid == os.getpid() and run > 0 for tid, _, _, run, _ in rows)
    s = OffCpuSampler(tmp_path / "o.jsonl", 1 << 20)
    s.sample([os.getpid()])
    __import__("time").sleep(0.05)
    s.sample([os.getpid()], final=True)
    ev = [json.loads(l) for l in (tmp_path / "o.jsonl").read_text().splitlines()]
    mine = [e for e in ev if e["tid"] == os.getpid()]
    assert len(mine) == 2 and mine[1]["ns"] >= 40_000_000 and mine[1]["name"] and mine[1]["oncpu_ns"] > 0
    tiny = OffCpuSampler(tmp_path / "t.jsonl", 10)
    tiny.sample([os.getpid()])
    tiny.sample([os.getpid()], final=True)   # the last sample is always kept
    assert tiny.skipped == 1 and tiny.samples == 1


# ---------------------------------------------------------------- stdlib only, CLI
def test_capture_package_is_standard_library_only():
    # every module of the package, found by walking it (a new module is covered without a line here)
    code = ("import sys, importlib, pkgutil; sys.path.insert(0, sys.argv[1]); import capture; "
            "mods = [m.name for m in pkgutil.walk_packages(capture.__path__, 'capture.') "
            "if not m.name.endswith('__main__')]; [importlib.import_module(m) for m in mods]; "
            "assert {'capture.watch.watcher', 'capture.tracer.events', 'capture.collectors.tracer'} <= set(mods), "
            "mods; "
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


def test_capture_without_tracer_and_pcap_still_writes_a_bundle(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("NCCL INFO something\n")
    from capture.options import CaptureOptions
    from capture.runner import run_capture
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
    m = check_bundle(res.path)
    assert m["collectors"]["tracer"]["status"] == "skipped" and m["collectors"]["tracer"]["reason"] == "--no-bpf"
    assert m["collectors"]["attachments:end"]["status"] == "ok"
    assert any(f["path"] == "logs/x.log" for f in m["files"])
    assert [(p["pid"], p["rank"], p["world_size"]) for p in m["processes"]] == [(target.pid, 3, 8)]
    assert res.exit_code in (0, 3)
    assert not list(tmp_path.glob(".*staging*")) and not list(tmp_path.glob("*.partial"))
    if shutil.which("ip"):
        # the interfaces' counters keep carrier_changes: a link that went down and up shows there
        with tarfile.open(res.path) as t:
            link = next(mb for mb in t.getmembers() if mb.name.endswith("/ip-link-start.json"))
            ifaces = json.load(t.extractfile(link))
        lo = next(i for i in ifaces if i["ifname"] == "lo")
        assert "carrier_changes" in lo["stats64"]["tx"], lo["stats64"]


# ---------------------------------------------------------------- killed captures, no root
PY = sys.executable


def _kill_and_check(cap: CaptureProc, extra_pids=()) -> None:
    """SIGKILL capture: within a few seconds nothing it started is left."""
    import signal
    import time
    tree = procs.descendants([cap.p.pid]) | set(extra_pids)
    assert tree, "capture has no children?"
    os.kill(cap.p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and any(alive(p) for p in tree):
        time.sleep(0.1)
    left = [p for p in tree if alive(p)]
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes() for p in left]


def test_sigkill_stops_nccl_tests_children_and_keeps_the_data(tmp_path):
    """--nccl-tests starts a shell whose children the death signal does not reach: the
    guardian stops their process group. The staging folder stays; the next capture into the
    same folder, or --recover, turns it into a bundle marked partial."""
    import time
    out = tmp_path / "bundles"
    out.mkdir()
    pidfile = tmp_path / "grandchild.pid"
    cmd = f"echo nccl-tests started; sleep 300 & echo $! > {pidfile}; sleep 300 & wait"
    base = ["--no-bpf", "--no-pcap", "-o", str(out), "--duration", "5m"]
    for round_ in (1, 2):
        cap = CaptureProc(base + ["--nccl-tests", cmd])
        cap.wait_capturing()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (pidfile.exists() and pidfile.read_text().strip()):
            time.sleep(0.05)
        grandchild = int(pidfile.read_text())
        time.sleep(0.5)   # the output is copied
        _kill_and_check(cap, [grandchild])
        rc, _ = cap.finish()
        assert rc == -9
        err = "".join(cap.err)
        assert "died before writing its bundle" in err and "--recover" in err, err
        staged = [d for d in out.iterdir() if d.name.startswith(".") and ".staging-" in d.name]
        assert len(staged) == 1 and (staged[0] / ".capture-died.json").exists()
        assert not list(out.glob("*.tar.gz"))
        pidfile.unlink()
        if round_ == 1:
            # the next capture into the folder recovers it, at its end
            nxt = CaptureProc(["--no-bpf", "--no-pcap", "-o", str(out), "--duration", "1s"])
            rc, stdout = nxt.finish()
            assert rc == 0, "".join(nxt.err)
            own = Path(stdout.strip())
            recovered = [b for b in out.glob("*.tar.gz") if b != own]
            assert "recovered a partial bundle" in "".join(nxt.err) and len(recovered) == 1
            assert bundle_manifest(own)["partial"] is False
        else:
            p = subprocess.run([PY, "-m", "capture", "--recover", "-o", str(out)], cwd=ROOT, capture_output=True,
                               text=True, timeout=120)
            assert p.returncode == 0, p.stderr
            recovered = [Path(p.stdout.strip())]
        assert not [d for d in out.iterdir() if d.name.startswith(".")]
        m = check_bundle(recovered[0])
        assert m["partial"] is True and "killed" in m["partial_reason"]
        assert m["recovered"]["died"]["capture_pid"] == cap.p.pid
        rec = m["collectors"]["nccl-tests"]
        assert rec["status"] == "failed" and "killed" in rec["reason"]
        with tarfile.open(recovered[0]) as t:
            data = t.extractfile(next(x for x in t.getmembers() if x.name.endswith("nccl-tests/output.txt"))).read()
        assert b"nccl-tests started" in data
        for f in out.glob("*.tar.gz"):
            f.unlink()
    p = subprocess.run([PY, "-m", "capture", "--recover", "-o", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == "" and "nothing to recover" in p.stderr


def test_without_root_the_privileged_collectors_are_skipped(lab_lib, tmp_path):
    """Run as nobody with the tracer and tcpdump asked for (the defaults): the bundle is
    written, both say skipped "needs root", and the exit code is 0 (skipped by design is not
    a failure; stderr says what did not run)."""
    from conftest import require_root
    require_root()
    import shutil
    import tempfile
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    # what the unprivileged processes read (the lab's libnccl and the libcudart it loads from
    # $ORIGIN, capture's code) is copied into a folder every user can read: the checkout may
    # live where nobody cannot (a clone under a 0700 folder)
    base = Path(tempfile.mkdtemp(prefix="ss-nobody-"))
    try:
        readable_copy(base, {**{f"lib/{p.name}": p for p in lab_lib.parent.glob("*.so*") if p.is_file()},
                             "code/capture": ROOT / "capture", "code/bpf": ROOT / "bpf"})
        lib = base / "lib" / lab_lib.name
        out = base / "out"
        out.mkdir()
        os.chown(out, 65534, 65534)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NCCL_SOCKET_IFNAME": "lo", "RANK": "0",
               "WORLD_SIZE": "1"}
        target = subprocess.Popen(nobody + [PY, "-c", f"import ctypes, time; ctypes.CDLL({str(lib)!r}); "
                                            "print('ready', flush=True); time.sleep(60)"],
                                  env=env, stdout=subprocess.PIPE, text=True, cwd=base)
        try:
            assert target.stdout.readline().strip() == "ready"
            cap = CaptureProc(["--pid", str(target.pid), "-o", str(out), "--duration", "2s"], user=nobody,
                              env=dict(env, HOME=str(out)), cwd=base / "code")
            rc, stdout = cap.finish()
        finally:
            target.kill()
            target.wait()
        err = "".join(cap.err)
        assert rc == 0, err
        m = check_bundle(Path(stdout.strip()))
        assert m["root"] is False and m["partial"] is False
        col = m["collectors"]
        assert col["tracer"]["status"] == "skipped" and col["tracer"]["reason"] == "needs root"
        dumps = {k: v for k, v in col.items() if k.startswith("tcpdump")}
        assert dumps and all(v["status"] == "skipped" and v["reason"] == "needs root" for v in dumps.values()), dumps
        assert not [k for k, v in col.items() if v["status"] == "failed"]
        assert "not run without root" in err and "tracer" in err and "tcpdump" in err
        assert [p["pid"] for p in m["processes"]] == [target.pid]
        assert any(p["path"] == "bpf/events.jsonl" for p in m["files"])   # off-CPU samples need no root
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_postprocess_call_returns_in_place_and_across_buffers(tmp_path):
    """With returns traced (the default) a collective's record carries t1/rc when it returned
    within the same flush interval; otherwise a return record (kind 255) completes it; an entry
    that never got either was still inside at the end."""
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = [f"@e0[6, 20]: {_rec(0, 5, 0xA, 0, 8, 7, 0, -1, 0xB, t1=25, rc=0)}",      # returned in place
             f"@e0[6, 30]: {_rec(0, 5, 0xA, 1, 8, 7, 0, -1, 0xB)}",                  # entry; buffers switched
             f"@e1[6, 31]: {_rec(255, 5, 30, t1=31, rc=5)}",                         # ... its return record
             f"@e1[6, 40]: {_rec(0, 5, 0xA, 2, 8, 7, 0, -1, 0xB)}"]                  # never returned
    (raw / "seg-000000.txt").write_text("\n".join(lines) + "\n")
    events.postprocess(raw, tmp_path / "e.jsonl", 1 << 20)
    ev = [json.loads(l) for l in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [(e["op_count"], e["t1"], e["rc"], e["returned"]) for e in ev] == \
        [(0, 25, 0, True), (1, 31, 5, True), (2, None, None, False)]


def _ring(key, tid, kind, pid, a=0, b=0, t1=0, rc=0, slot=None):
    """A ring dump's line: @r[slot]: (t0 or a return's t1, tid, then a flush record's fields)."""
    return f"@r[{key % 97 if slot is None else slot}]: ({key}, {tid}, " + _rec(kind, pid, a, b, t1=t1, rc=rc)[1:]


def test_postprocess_ring_dumps(tmp_path):
    """Ring mode (capture --watch): the records come in dumps, the same record in several; the
    newest dump's copy wins; a call open in the last dump that holds it was still inside if that
    is the last dump (the hang), unknown if a later dump no longer has it (overwritten); a
    return record completes its entry; the tracer's span starts at the oldest record of the
    first dump when the ring went round."""
    raw = tmp_path / "raw"
    raw.mkdir()
    dump1 = [_ring(100, 6, 0, 5, a=0xA, b=1),                     # collective 1, open at the first dump
             _ring(200, 6, 0, 5, a=0xA, b=2),                     # collective 2, open, overwritten later
             _ring(300, 7, 32, 5, a=0x77),                        # a sync whose entry is in dump 1 only
             "@rg[0]: 5000", "", '{"ev":"ring_dump","t":350,"slots":4096}']
    dump2 = [_ring(100, 6, 0, 5, a=0xA, b=1, t1=110, rc=0),       # collective 1, completed in place
             _ring(400, 7, 255, 5, a=300, t1=400, rc=3),          # the sync's return record
             _ring(500, 8, 32, 5, a=0x78),                        # a sync still inside at the end
             _ring(600, 9, 255, 5, a=50, t1=600),                 # a return whose entry is gone
             "@op[6, 0]: (0, 0, 5, 100, 110, 3, 0)",              # the watcher's state: no event
             "@rg[0]: 5004", "", '{"ev":"ring_dump","t":650,"slots":4096}']
    (raw / "keep.txt").write_text('{"ev":"tracer_start","t":10}\n')
    (raw / "seg-000000.txt").write_text("\n".join(dump1 + dump2) + "\n")
    summ = events.postprocess(raw, tmp_path / "e.jsonl", 1 << 20)
    ev = [json.loads(l) for l in (tmp_path / "e.jsonl").read_text().splitlines()]
    hot = [(e["ev"], e["t0"], e["t1"], e["rc"], e["returned"]) for e in ev if e["ev"] in ("coll", "host_wait")]
    assert hot == [("coll", 100, 110, 0, True), ("coll", 200, None, None, None),
                   ("host_wait", 300, 400, 3, True), ("host_wait", 500, None, None, False)]
    assert summ["unparsable_lines"] == 0 and summ["orphan_returns"] == 1 and summ["hot_records"] == 6
    assert summ["lost_events"] == 0 and summ["by_type"]["ring_dump"] == 2
    assert summ["ring"] == {"dumps": 2, "slots": 4096, "records_made": 5004, "oldest_monotonic_ns": 100,
                            "wrapped": True}
    assert summ["span_monotonic_ns"] == [100, 650]


def test_attach_points_by_address(lab_lib):
    """bpftrace 0.17 attaches a uprobe given by name also to C++ functions whose demangled
    name starts with it (NCCL 2.28: ncclCommInitRank -> ncclCommInitRankDev(...) too): the
    rendered program attaches by the symbol's address and says which is which."""
    syms = exported_functions(lab_lib)
    t = program.TraceTargets(nccl={str(lab_lib): set(program.NCCL_SYMBOLS)}, stop_lib=str(lab_lib), capture_pid=5)
    t.fill_addresses()
    script, _ = program.render_script(t, _features())
    addr = syms["ncclCommInitRank"].value
    assert f"uprobe:{lab_lib}:0x{addr:x}\n" in script and f"uretprobe:{lab_lib}:0x{addr:x}" in script
    assert f"// {lab_lib}: ncclCommInitRank = 0x{addr:x}" in script
    assert ":ncclAllReduce\n" not in script and "ncclCommInitRank,\n" not in script


def test_postprocess_a_return_read_before_its_entry_completes_the_call_it_follows(tmp_path):
    """Rare calls print entry and return as they happen; when returns of one thread come out
    ahead of an entry, the entry takes the first return at or after its start (calls of one
    thread do not overlap), neither an earlier one nor a later one."""
    raw = tmp_path / "raw"
    raw.mkdir()
    ret = '{{"ev":"ret","k":"init","t1":{t1},"pid":5,"tid":6,"rc":{rc},"comm":"0x55aa00"}}'
    lines = [ret.format(t1=50, rc=1), ret.format(t1=300, rc=3), ret.format(t1=150, rc=2),
             '{"ev":"comm_init","fn":"ncclCommInitRank","t0":100,"pid":5,"tid":6,"nranks":2,"rank":1,'
             '"comm_id_hash":"0x00000000000000aa","unique_id":["0x1"]}']
    (raw / "seg-000000.txt").write_text("\n".join(lines) + "\n")
    events.postprocess(raw, tmp_path / "e.jsonl", 1 << 20)
    ev = [json.loads(l) for l in (tmp_path / "e.jsonl").read_text().splitlines()]
    init = [e for e in ev if e.get("ev") == "comm_init"]
    assert [(e["t0"], e["t1"], e["rc"], e["returned"]) for e in init] == [(100, 150, 2, True)], ev


def test_tcpdump_ring_files_are_renamed_oldest_first(tmp_path):
    """tcpdump -W reuses x.pcap0, x.pcap1, ... in a ring: after a wrap the oldest data sit in
    a higher number. Renamed by age to x-000.pcap...; a single file (no ring) stays as it is."""
    from capture.staging import finish_rings, rename_ring
    pcap = tmp_path / "pcap"
    pcap.mkdir()
    for name, age in (("a.pcap0", 10), ("a.pcap1", 30), ("a.pcap2", 20), ("b.pcap0", 5), ("c.pcap", 1)):
        (pcap / name).write_text(name)
        os.utime(pcap / name, ns=(10**18 - age * 10**9,) * 2)
    got = rename_ring(pcap / "a.pcap")
    assert [p.name for p in got] == ["a-000.pcap", "a-001.pcap", "a-002.pcap"]
    assert [p.read_text() for p in got] == ["a.pcap1", "a.pcap2", "a.pcap0"]
    assert rename_ring(pcap / "c.pcap") == []
    (pcap / "a-000.pcap").rename(pcap / "d.pcap7")      # a killed capture's staging folder: every ring
    finish_rings(tmp_path)
    assert sorted(p.name for p in pcap.iterdir()) == ["a-001.pcap", "a-002.pcap", "b-000.pcap", "c.pcap",
                                                      "d-000.pcap"]


# ---------------------------------------------------------------- covered_ns
def test_pcap_span_reads_the_first_and_last_record_times(tmp_path):
    """tcpdump's covered interval: the first and last complete record of a pcap (nanosecond
    pcap as capture writes it, microsecond pcap too; a record cut by a kill is not counted)."""
    import struct
    nano = tmp_path / "n.pcap"
    recs = [(1_700_000_000, 5), (1_700_000_001, 999_999_999), (1_700_000_003, 42)]
    body = b"".join(struct.pack("<IIII", s, f, 4, 60) + b"abcd" for s, f in recs)
    nano.write_bytes(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 128, 1) + body + struct.pack("<IIII", 9, 9, 99, 99))
    assert bd.pcap_span(nano) == (1_700_000_000_000_000_005, 1_700_000_003_000_000_042)
    micro = tmp_path / "u.pcap"
    micro.write_bytes(struct.pack(">IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 128, 1) +
                      struct.pack(">IIII", 10, 7, 0, 0) + struct.pack(">IIII", 12, 8, 0, 0))
    assert bd.pcap_span(micro) == (10_000_007_000, 12_000_008_000)
    empty = tmp_path / "e.pcap"
    empty.write_bytes(nano.read_bytes()[:24])
    assert bd.pcap_span(empty) is None and bd.pcap_span(tmp_path / "missing.pcap") is None


def test_tracer_span_from_its_marks_else_its_events_and_in_utc(tmp_path):
    """The tracer's covered interval: its start mark to its stop mark (else the first and last
    event times, returns included; off-CPU samples are not the tracer's), as UTC through the
    nearest clock sample."""
    from capture.session import utc_span
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "seg-000000.txt").write_text("\n".join([
        '{"ev":"tracer_start","t":100,"tracer_pid":9}',
        f"@e0[6, 200]: {_rec(0, 5, 0xA, 0, 8, 7, 0, -1, 0xB, t1=250, rc=0)}",
        '{"ev":"tracer_stopped","t":900}']) + "\n")
    off = tmp_path / "offcpu.jsonl"
    off.write_text('{"ev":"offcpu","t":5000,"pid":5,"tid":5,"ns":0}\n')
    s = events.postprocess(raw, tmp_path / "e.jsonl", 1 << 20, extra=[off])
    assert s["span_monotonic_ns"] == [100, 900]
    (raw / "seg-000000.txt").write_text(f"@e0[6, 200]: {_rec(0, 5, 0xA, 0, 8, 7, 0, -1, 0xB, t1=250, rc=0)}\n")
    assert events.postprocess(raw, tmp_path / "e.jsonl", 1 << 20, extra=[off])["span_monotonic_ns"] == [200, 250]
    samples = [{"monotonic_ns": 0, "realtime_ns": 10**18}, {"monotonic_ns": 1000, "realtime_ns": 10**18 + 1003}]
    assert utc_span(samples, [100, 900]) == [10**18 + 100, 10**18 + 903]
    assert utc_span(samples, None) is None and utc_span([], [1, 2]) is None


def test_the_jobs_own_output_file_is_attached_and_read_as_its_log(tmp_path):
    """A traced process whose stderr is a file (a launcher's log): its tail comes along
    (named after the stream and pid), with the host's zone in the manifest; analyze reads
    the watchdog timeout in it."""
    from capture.options import CaptureOptions
    from capture.runner import run_capture
    import io
    out = tmp_path / "slurm-77.out"
    line = ("[rank3]:[E1128 03:14:07.123456789 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran "
            "for 600020 milliseconds before timing out.\n")
    out.write_text("epoch 1\n" + line)
    with open(out, "ab") as fh:
        target = subprocess.Popen(["sleep", "30"], stdout=fh, stderr=fh,
                                  env={"RANK": "3", "WORLD_SIZE": "8", "NCCL_SOCKET_IFNAME": "lo"})
    try:
        res = run_capture(CaptureOptions(output=str(tmp_path / "b"), duration_s=1.0, bpf=False, pcap=False,
                                         pids=[target.pid], progress="lines"), stderr=io.StringIO())
    finally:
        target.kill()
        target.wait()
    m = check_bundle(res.path)
    files = [f["path"] for f in m["files"] if f["path"].startswith("logs/job-")]
    assert files == [f"logs/job-stdout-{target.pid}-slurm-77.out"], files     # stdout and stderr: one file, once
    src = m["collectors"]["attachments:end"]["sources"]
    assert any(s["why"].startswith(f"stdout of pid {target.pid}") for s in src)
    assert isinstance(m["timezone"]["utc_offset_s"], int) and m["timezone"]["name"]
    from forensics.execution.host_reading import read_model
    wd = read_model([res.path]).tables["watchdog_events"]
    assert wd["rank"].tolist() == [3] and wd["seq_num"].tolist() == [5]


@pytest.mark.root
def test_a_process_in_its_own_uts_namespace_is_named_by_its_own_host_name():
    """What NCCL prints is gethostname() inside the process's UTS namespace (a pod's or a
    container's name): the capture records that, not the node's name."""
    from conftest import require_root, require_tool
    require_root()
    require_tool("unshare", "nsenter")
    assert procs.uts_hostname(os.getpid()) == os.uname().nodename
    name = f"pod-{os.getpid()}"
    p = subprocess.Popen(["unshare", "--uts", "sh", "-c", f"hostname {name} && exec sleep 30"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = procs.uts_hostname(p.pid)
            # sh sets the name, then execs sleep in the same namespace; the cache is per namespace,
            # so ask again only until the name is set
            if got == name:
                break
            procs._UTS_NAMES.clear()
            time.sleep(0.05)
        assert procs.uts_hostname(p.pid) == name
        assert procs.uts_hostname(p.pid) != os.uname().nodename
    finally:
        p.kill()
        p.wait()
    assert procs.uts_hostname(p.pid) is None       # gone: unknown, never the node's name
