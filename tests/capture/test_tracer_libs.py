"""The watcher's tracer with no blind window (capture.tracer.libscan, capture.tracer.libs, the spool's
overlap, events.dedup, the lib_map block): unit tests without root. The end-to-end runs
(a watcher before unknown jobs, a library in a container's mount namespace, init hangs) are in
tests/lab_runs/test_watch_blind.py."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT

from capture.tracer import events, libscan, program, spool

LAB = ROOT / "tests" / "lab"


@pytest.fixture(scope="module")
def labnccl(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("labbuild") / "build"
    p = subprocess.run(["make", "-C", str(LAB), "all", f"BUILD={build}"], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        pytest.skip("the lab does not build here: " + p.stderr[-300:])
    return build / "libnccl.so.2"


def test_scan_finds_host_python_and_layer_copies_once_per_file(tmp_path, labnccl):
    root = tmp_path / "root"
    libdir = root / "usr/lib/x86_64-linux-gnu"
    site = root / "usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib"
    layer = tmp_path / "layers/abc/fs/opt/conda/envs/train/lib/python3.11/site-packages/nvidia/nccl/lib"
    for d in (libdir, site, layer):
        d.mkdir(parents=True)
    shutil.copy(labnccl, libdir / "libnccl.so.2")
    os.link(libdir / "libnccl.so.2", site / "libnccl.so.2")          # the same file: once
    shutil.copy(labnccl, layer / "libnccl.so.2")                      # a copy of the same build
    (root / "usr/lib/libnccl.so.2").write_bytes(b"not an ELF")        # no NCCL API: left out
    found = libscan.scan(roots={"host": str(root)}, layers=(str(tmp_path / "layers/*/fs"),), containers=False,
                         ld_cache=str(tmp_path / "none"), wanted=program.NCCL_SYMBOLS)
    assert len(found) == 2, found
    # the wheel in a project's hidden virtual environment, as on a GPU host (/opt/torch/.venv)
    venv = root / "opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib"
    venv.mkdir(parents=True)
    shutil.copy(labnccl, venv / "libnccl.so.2")
    again = libscan.scan(roots={"host": str(root)}, layers=(), containers=False, ld_cache=str(tmp_path / "none"),
                         wanted=program.NCCL_SYMBOLS)
    assert str(venv / "libnccl.so.2") in {f.path for f in again}, again
    assert {f.where for f in found} == {"host", "layer"}
    assert {"ncclAllReduce", "ncclCommInitRank"} <= found[0].symbols
    assert found[0].build_id == found[1].build_id or found[0].build_id is None
    traced, left = libscan.choose(found, 1)
    assert len(traced) == 1 and len(left) == 1
    # a file a process maps goes first, whatever the order
    traced, _ = libscan.choose(found, 1, mapped={found[1].key})
    assert traced == [found[1]]


def test_ld_cache_paths_are_the_libnccl_strings(tmp_path):
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(b"glibc-ld.so.cache1.1\0\0libnccl.so.2\0/usr/lib/x86_64-linux-gnu/libnccl.so.2\0"
                      b"libc.so.6\0/lib/x86_64-linux-gnu/libc.so.6\0/opt/x/lib/librccl.so.1\0")
    assert libscan.ld_cache_paths(str(cache)) == ["/usr/lib/x86_64-linux-gnu/libnccl.so.2",
                                                  "/opt/x/lib/librccl.so.1"]
    assert libscan.ld_cache_paths(str(tmp_path / "missing")) == []


def _coll(t0, t1=None, tid=7, count=1024):
    return {"ev": "coll", "op": "ALL_REDUCE", "fn": "ncclAllReduce", "t0": t0, "t1": t1, "pid": 5, "tid": tid,
            "comm": "0x10", "op_count": 3, "count": count, "returned": t1 is not None}


def test_dedup_keeps_a_call_both_programs_saw_once_inside_the_overlap_only():
    evs = [_coll(1_000_000), _coll(1_002_000, t1=1_500_000),      # one call, both programs: kept once, with t1
           _coll(1_003_000, count=8),                                # another call (other count): kept
           _coll(9_000_000), _coll(9_001_000)]                       # outside the window: both kept
    n = [0]
    out = list(events.dedup(iter(evs), [(900_000, 2_000_000)], n))
    assert n == [1]
    assert [e["t0"] for e in out] == [1_000_000, 1_003_000, 9_000_000, 9_001_000]
    assert out[0]["t1"] == 1_500_000 and out[0]["returned"] is True


def test_postprocess_reads_the_overlap_mark_and_drops_the_twin(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = ['{"ev":"tracer_start","t":100,"tracer_pid":1}',
             '{"ev":"comm_init","fn":"ncclCommInitRank","t0":5000,"pid":5,"tid":7,"nranks":2,"rank":0,'
             '"comm_id_hash":"0x1"}',
             '{"ev":"comm_init","fn":"ncclCommInitRank","t0":5400,"pid":5,"tid":7,"nranks":2,"rank":0,'
             '"comm_id_hash":"0x1"}',
             '{"ev":"tracer_overlap","t0":1000,"t1":9000}']
    (raw / "seg-000000.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "events.jsonl"
    summ = events.postprocess(raw, out, 1 << 20)
    assert summ["overlap_duplicates"] == 1
    assert summ["by_type"].get("comm_init") == 1


def test_the_old_programs_end_inside_the_overlap_does_not_end_the_span(tmp_path):
    # a restart with overlap: the new program started at 3000, the old one ended at 8000, inside
    # the window; the new one traced on to 20000. The span is the new one's (a watcher's bundle of a
    # hang after a restart was judged on a window that closed before the hang: no finding)
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = ['{"ev":"tracer_start","t":100,"tracer_pid":1}',
             '{"ev":"tracer_start","t":3000,"tracer_pid":2}',
             '{"ev":"tracer_end","t":8000}',
             '{"ev":"tracer_overlap","t0":1000,"t1":9000}',
             '{"ev":"host_wait","kind":32,"t0":15000,"pid":5,"tid":7,"obj":"0x1"}',
             '{"ev":"tracer_end","t":20000}']
    (raw / "seg-000000.txt").write_text("\n".join(lines) + "\n")
    summ = events.postprocess(raw, tmp_path / "events.jsonl", 1 << 20)
    assert summ["span_monotonic_ns"] == [100, 20000]
    # no end mark after it (the bundle cut while the program runs): its last event ends it
    (raw / "seg-000000.txt").write_text("\n".join(lines[:-1]) + "\n")
    assert events.postprocess(raw, tmp_path / "e2.jsonl", 1 << 20)["span_monotonic_ns"] == [100, 15000]


def test_spool_overlap_reads_both_programs_until_the_old_one_ends(tmp_path):
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    old, new = os.fdopen(r1, "rb"), os.fdopen(r2, "rb")
    sp = spool.Spool(old, tmp_path / "raw", 1 << 20, poll_s=0.02).start()
    os.write(w1, b'{"ev":"tracer_start","t":1,"tracer_pid":1}\n')
    assert sp.ready.wait(5)
    sp.overlap(new)
    assert not sp.ready.is_set()
    os.write(w2, b'{"ev":"tracer_start","t":2,"tracer_pid":2}\n')
    os.write(w1, b'{"ev":"lib_map","t":3,"pid":42,"ino":9,"name":"libnccl.so.2","held":0}\nold-late\n')
    assert sp.ready.wait(5)
    os.close(w1)
    deadline = time.monotonic() + 5
    while not sp.drained(old) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sp.drained(old)
    assert [e["pid"] for e in sp.lib_maps] == [42]
    os.write(w2, b"new-line\n")
    os.close(w2)
    assert sp.join(5)
    text = b"".join(p.read_bytes() for p in spool.raw_files(tmp_path / "raw"))
    assert b"old-late" in text and b"new-line" in text and text.count(b"tracer_start") == 2


def test_lib_map_block_needs_ring_btf_and_no_pid_and_holds_only_when_asked(labnccl):
    feats = program.KernelFeatures(tracepoints={"syscalls/sys_enter_mmap": ""}, btf=True, cpus=2)
    t = program.TraceTargets()
    t.nccl[str(labnccl)] = set(program.NCCL_SYMBOLS)
    t.stop_lib, t.capture_pid = "/lib/libc.so.6", 1
    t.known_inodes = {12345}
    script, blocks = program.render_script(t, feats, ring=64)
    assert "lib_map" in blocks and "@known[(uint64)12345] = 1;" in script and "$h = 0;" in script
    assert 'signal("SIGSTOP")' not in script     # bpftrace refuses signal() without --unsafe, reached or not
    t.hold, t.hold_cgroup = True, "/sys/fs/cgroup/unified/x"
    script, _ = program.render_script(t, feats, ring=64)
    assert '$h = (cgroup == cgroupid("/sys/fs/cgroup/unified/x") ? 1 : 0);' in script and 'signal("SIGSTOP")' in script
    assert "lib_map" not in program.render_script(t, feats, ring=0)[1]           # a capture: not there
    assert "lib_map" not in program.render_script(t, program.KernelFeatures(btf=False), ring=64)[1]
    t.want_pids = [1]
    assert "lib_map" not in program.render_script(t, feats, ring=64)[1]           # --pid: only those


def test_hold_setting():
    assert program.hold_setting({}) == (False, None)
    assert program.hold_setting({"STALLSCOPE_HOLD": "on"}) == (True, None)
    assert program.hold_setting({"STALLSCOPE_HOLD": "/sys/fs/cgroup/unified/t"}) == (True, "/sys/fs/cgroup/unified/t")


def test_init_watch_reports_an_init_that_never_returns_once():
    from capture.watch.init_hang import InitWatch
    w = InitWatch()
    me = os.getpid()
    w.feed([{"ev": "comm_init", "fn": "ncclCommInitRank", "t0": 1_000, "pid": me, "tid": 1, "rank": 0, "nranks": 2},
            {"ev": "comm_init", "fn": "ncclCommInitRank", "t0": 1_000, "pid": me, "tid": 2, "rank": 1, "nranks": 2},
            {"ev": "ret", "k": "init", "t1": 2_000, "pid": me, "tid": 2, "rc": 0},
            {"ev": "split_enter", "t0": 5_000, "pid": me, "tid": 3},
            {"ev": "comm_init", "fn": "ncclCommSplit", "t0": 5_000, "t1": 6_000, "pid": me, "tid": 3}])
    got = w.stuck(10**10 + 1_000, 10**10)
    assert [(s["tid"], s["rank"]) for s in got] == [(1, 0)]
    w.feed([{"ev": "comm_init", "fn": "ncclCommInitRank", "t0": 1_000, "pid": 999999999, "tid": 9}])
    assert [s["tid"] for s in w.stuck(10**10 + 1_000, 10**10)] == [1]      # a gone process: forgotten
    assert (999999999, 9) not in w.open


def test_blocked_in_socket_sees_a_thread_waiting_in_accept(tmp_path):
    import socket
    import threading
    from capture.watch.init_hang import blocked_in_socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    t = threading.Thread(target=lambda: srv.accept(), daemon=True)
    t.start()
    time.sleep(0.3)
    try:
        assert blocked_in_socket(os.getpid()) in (f"accept() on fd {srv.fileno()}", f"accept4() on fd {srv.fileno()}")
        assert blocked_in_socket(999999999) is None
    finally:
        socket.create_connection(srv.getsockname()).close()
        t.join(2)
        srv.close()


def test_the_watchers_program_without_the_hold_passes_bpftrace_in_safe_mode(labnccl, tmp_path):
    """The program the watcher runs as deployed (ring mode, the lib_map block, no hold) is
    accepted by bpftrace without --unsafe: one unsafe builtin anywhere in it and the watcher
    runs with no tracer at all (it did on a GPU host). A dry run parses and checks it."""
    from conftest import require_root, require_tool
    require_root()
    require_tool("bpftrace")
    feats = program.KernelFeatures.probe()
    if "syscalls/sys_enter_mmap" not in feats.tracepoints or not feats.btf:
        pytest.skip("the lib_map block needs the sys_enter_mmap tracepoint and kernel BTF")
    t = program.TraceTargets()
    t.nccl[str(labnccl)] = set(program.NCCL_SYMBOLS)
    t.stop_lib, t.capture_pid = "/lib/x86_64-linux-gnu/libc.so.6", os.getpid()
    t.resolve() if hasattr(t, "resolve") else None
    script, blocks = program.render_script(t, feats, ring=64)
    assert "lib_map" in blocks
    path = tmp_path / "watch.bt"
    path.write_text(script)
    p = subprocess.run(["bpftrace", "-d", str(path)], capture_output=True, text=True, timeout=120)
    assert "unsafe" not in p.stderr and p.returncode == 0, p.stderr[-2000:]


def test_a_library_traced_before_its_process_brings_its_cuda_runtime(labnccl, tmp_path):
    """A libnccl traced ahead of time or at its mapping gets the libcudart beside it (its folder,
    or the PyPI wheels' nvidia/cuda_runtime/lib): the host waits after a launch are what the
    hang trigger reads. Without them a job from a path the watcher had never seen hung with no
    bundle (tests/lab_runs/test_watch_unknown.py)."""
    from capture.tracer.libs import add_cudart_beside, cudart_beside
    cudart = labnccl.parent / "libcudart.so.12"
    beside = tmp_path / "beside"
    beside.mkdir()
    shutil.copy(labnccl, beside / "libnccl.so.2")
    shutil.copy(cudart, beside / "libcudart.so.12")
    assert cudart_beside(str(beside / "libnccl.so.2")) == [str(beside / "libcudart.so.12")]
    wheel = tmp_path / "site-packages" / "nvidia"
    (wheel / "nccl" / "lib").mkdir(parents=True)
    (wheel / "cuda_runtime" / "lib").mkdir(parents=True)
    shutil.copy(labnccl, wheel / "nccl" / "lib" / "libnccl.so.2")
    shutil.copy(cudart, wheel / "cuda_runtime" / "lib" / "libcudart.so.12")
    t = program.TraceTargets()
    add_cudart_beside(t, str(wheel / "nccl" / "lib" / "libnccl.so.2"))
    assert list(t.cudart) == [str(wheel / "cuda_runtime" / "lib" / "libcudart.so.12")]
    assert t.cudart[str(wheel / "cuda_runtime" / "lib" / "libcudart.so.12")] <= set(program.CUDART_SYMBOLS)
    add_cudart_beside(t, str(wheel / "nccl" / "lib" / "libnccl.so.2"))        # once, however often asked
    assert len(t.cudart) == 1
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(labnccl, lonely / "libnccl.so.2")
    assert cudart_beside(str(lonely / "libnccl.so.2")) == []


def test_the_cuda_runtime_beside_a_library_in_another_mount_namespace(labnccl, tmp_path):
    """A container's libnccl is traced through its process's root (``/proc/PID/root/...``); the
    CUDA runtime beside it is found there too, not in our namespace, where the folder is empty
    (a job in its own mount namespace got no host waits traced and no hang bundle:
    tests/lab_runs/test_watch_blind.py)."""
    from conftest import require_root, require_tool
    require_root()
    require_tool("unshare", "mount")
    from capture.tracer.libs import cudart_beside
    inside = tmp_path / "container-lib"
    inside.mkdir()
    script = (f"mount -t tmpfs tmpfs {inside} && cp {labnccl} {inside}/libnccl.so.2 && "
              f"cp {labnccl.parent / 'libcudart.so.12'} {inside}/libcudart.so.12 && echo ready && exec sleep 60")
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        assert not any(inside.iterdir())                          # not in our namespace
        root = f"/proc/{p.pid}/root"
        assert cudart_beside(f"{root}{inside}/libnccl.so.2") == [f"{root}{inside}/libcudart.so.12"]
    finally:
        p.kill()
        p.wait()


def test_a_collective_marks_its_process_traced_for_its_host_waits(labnccl):
    """The host-wait probes count only traced processes; a program started after a job's
    communicator init (a restart, a late capture) learns the job's processes from their
    collectives, or it never sees the waits a hang sits in."""
    t = program.TraceTargets()
    t.nccl[str(labnccl)] = set(program.NCCL_SYMBOLS)
    t.cudart[str(labnccl.parent / "libcudart.so.12")] = set(program.CUDART_SYMBOLS)
    t.fill_addresses()
    for returns in (False, True):
        script, _ = program.render_script(t, program.KernelFeatures(), call_returns=returns, ring=64)
        blocks = [b.strip() for b in re.split(r"\n\s*\n", script)]
        colls = [b for b in blocks if "ncclAllReduce" in b or "$c = (uint64)" in b and "@opc[$c]" in b]
        assert colls and all("@traced[(uint64)pid] = 1;" in b for b in colls if "@opc[$c] = $n + 1" in b)
        waits = [b for b in blocks if b.startswith("uprobe:") and "libcudart" in b.split("\n")[0]]
        assert waits and all("/@traced[(uint64)pid]/" in b for b in waits)
