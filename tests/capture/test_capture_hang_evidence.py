"""Hang evidence capture collects on request of the job's state: native stacks only when the
job is hung (and bounded), the PyTorch Flight Recorder dump through its pipe, NCCL RAS.

The parts without root run anywhere: the hung/progressing decision, the bounded runner
against a wedged fake tool, the FIFO trigger, the RAS checks. The captures that take
stacks need root (ptrace of other processes); the one with the tracer also bpftrace."""
from __future__ import annotations

import errno
import json
import os
import pickle
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from capture_helpers import CaptureProc, check_bundle
from conftest import ROOT, require_root, require_tool
from test_capture import _rec, lab_lib  # noqa: F401  (lab_lib is a fixture)

from capture import ncclras, stacks, torchfr

PY = sys.executable
LAB = ROOT / "tests" / "lab" / "build"


# ---------------------------------------------------------------- helpers
def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _fake_tool(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    p = folder / name
    p.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    p.chmod(0o755)
    return p


WEDGED = """\
    # a stack tool that wedges: it stops its target as a ptrace attach does, ignores SIGTERM, never ends
    pid=""
    while [ $# -gt 0 ]; do case "$1" in -p|--pid) pid="$2"; shift;; esac; shift; done
    [ -n "$pid" ] && kill -STOP "$pid"
    trap '' TERM
    while :; do sleep 1; done
"""


def _paused_nccl_process(lib: Path, env=None) -> subprocess.Popen:
    """A process that maps the lab's libnccl (so capture finds it) and blocks in pause()."""
    p = subprocess.Popen([PY, "-c", f"import ctypes, signal; ctypes.CDLL({str(lib)!r}); print('ready', flush=True); "
                                    "signal.pause()"], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, **(env or {})))
    assert p.stdout.readline().strip() == "ready"
    return p


def _bundle(stdout: str) -> tuple[dict, tarfile.TarFile]:
    path = Path(stdout.strip().splitlines()[-1])
    m = check_bundle(path)
    return m, tarfile.open(path)


def _member(t: tarfile.TarFile, suffix: str) -> bytes:
    return t.extractfile(next(x for x in t.getmembers() if x.name.endswith(suffix))).read()


# ---------------------------------------------------------------- the decision (no root)
def _sample(t, tcp=None, ib=None, cpu=None):
    return stacks.Sample(t=t, tcp=tcp, ib=ib, cpu=cpu or {})


def test_decision_tracer_first_then_counters():
    quiet = (_sample(0.0, tcp={}, cpu={1: 1.0}), _sample(5.0, tcp={}, cpu={1: 1.0}))
    hung, why = stacks.decide(5, stacks.TracerActivity(calls=40, completed=12), *quiet, "")
    assert not hung and why.startswith("collectives completed during the first 5s") and "no ptrace stop" in why
    hung, why = stacks.decide(5, stacks.TracerActivity(calls=3, completed=0), *quiet, "")
    assert hung and "none returned" in why
    # the tracer saw nothing (a job hung before the capture): the counters decide
    hung, why = stacks.decide(5, stacks.TracerActivity(), *quiet, "")
    assert hung and "the tracer saw no NCCL call" in why and "CPU +0.00s" in why
    key = (1, "10.0.0.1:1", "10.0.0.2:2")
    moving = (_sample(0, tcp={key: 5 << 20}), _sample(5, tcp={key: 6 << 20}))
    hung, why = stacks.decide(5, None, *moving, "--no-bpf")
    assert not hung and "TCP +1.0 MiB" in why and "(--no-bpf)" in why
    # a data socket that stopped moving, threads spinning: hung (spinning is not progress)
    stuck = (_sample(0, tcp={key: 5 << 20}, cpu={1: 10.0}), _sample(5, tcp={key: (5 << 20) + 600}, cpu={1: 20.0}))
    assert stacks.decide(5, None, *stuck, "--no-bpf")[0]
    # no network to watch at all: CPU time is the only sign of life
    busy = (_sample(0, tcp={}, cpu={1: 1.0}), _sample(5, tcp={}, cpu={1: 2.0}))
    hung, why = stacks.decide(5, None, *busy, "--no-bpf")
    assert not hung and "no network counter" in why
    ib = (_sample(0, tcp={}, ib=0), _sample(5, tcp={}, ib=1 << 20))
    assert not stacks.decide(5, None, *ib, "--no-bpf")[0]


def test_tracer_activity_counts_returned_calls(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "seg-000000.txt").write_text("\n".join([
        "Attaching 41 probes...",
        '{"ev":"tracer_start","t":1,"tracer_pid":9}',
        f"@e0[7, 100]: {_rec(0, 5, a=0x55, b=1, t1=0)}",          # an allreduce still inside (no t1)
        f"@e0[7, 200]: {_rec(17, 5, t1=250)}",                   # ncclGroupEnd: neither way
        f"@e1[8, 300]: {_rec(32, 5, a=0x77, t1=0)}",              # a host wait still waiting
    ]) + "\n")
    act = stacks.tracer_activity(raw)
    assert (act.calls, act.completed) == (2, 0)
    with open(raw / "seg-000000.txt", "a") as fh:
        fh.write(f"@e0[8, 400]: {_rec(255, 5, a=300, rc=0)}\n")        # the wait's return record
        fh.write(f"@e1[7, 500]: {_rec(0, 5, a=0x55, b=2, t1=510)}\n")  # a collective that returned in place
    act = stacks.tracer_activity(raw)
    assert (act.calls, act.completed) == (3, 2)
    no_returns = stacks.tracer_activity(raw, call_returns=False)
    assert no_returns.completed == 3        # untraced returns: a collective's entry is its launch


# ---------------------------------------------------------------- the bounded run (no root)
def test_wedged_tool_is_killed_within_its_bound_and_the_target_resumed(tmp_path):
    tool = _fake_tool(tmp_path / "bin", "eu-stack", WEDGED)
    target = subprocess.Popen(["sleep", "120"])
    try:
        t0 = time.monotonic()
        res = stacks.run_bounded([str(tool), "-p", str(target.pid)], 1.5, target.pid)
        took = time.monotonic() - t0
        assert res.killed and res.rc is None
        assert 1.5 <= took < 1.5 + 1.0 + 2.0, took           # timeout, 1 s of SIGTERM grace, then SIGKILL
        assert res.resumed == [target.pid]                      # left stopped by the tool: SIGCONT sent
        assert _state(target.pid) in ("S", "R")
        # a well-behaved tool: nothing killed, nothing resumed, output kept
        ok = _fake_tool(tmp_path / "bin", "good", 'echo "TID $$:"\n')
        res = stacks.run_bounded([str(ok)], 5, target.pid)
        assert not res.killed and res.rc == 0 and res.out.startswith(b"TID ") and res.resumed == []
        # a target stopped on purpose before the tool ran is left stopped
        os.kill(target.pid, signal.SIGSTOP)
        time.sleep(0.1)
        res = stacks.run_bounded([str(tool), "-p", str(target.pid)], 0.5, target.pid)
        assert res.killed and res.resumed == [] and _state(target.pid) == "T"
    finally:
        target.kill()
        target.wait()


def test_render_header_round_trip():
    res = stacks.RunResult(rc=0, out=b"PID 5 - process\nTID 5:\n#0  0x0000000000001000 pause - /lib/libc.so.6\n",
                           err=b"eu-stack: some warning\n")
    blob = stacks.render(5, "hung", "eu-stack", ["eu-stack", "-p", "5", "-s", "-m"], [(5, "S", 'py "x"')],
                         "nothing progressed", res, ["gdb exit code 1: x"])
    text = blob.decode()
    assert text.startswith(stacks.HEADER + "\n# pid: 5\n# phase: hung\n# tool: eu-stack\n")
    assert '# thread: 5 S "py \\"x\\""' in text and text.endswith("# rc: 0\n# stderr: eu-stack: some warning\n")


# ---------------------------------------------------------------- Flight Recorder pipe and dumps (no root)
def test_trigger_never_blocks(tmp_path):
    fifo = tmp_path / "pipe_0.pipe"
    os.mkfifo(fifo, 0o666)
    ok, why = torchfr.trigger(str(fifo))
    assert not ok and "nobody has the pipe open" in why             # ENXIO: no reader, no block
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert torchfr.trigger(str(fifo)) == (True, "1 byte written")
        assert os.read(reader, 128) == b"1"
    finally:
        os.close(reader)
    (tmp_path / "plain").write_text("x")
    assert torchfr.trigger(str(tmp_path / "plain")) == (False, "not a FIFO")
    assert not torchfr.trigger(str(tmp_path / "missing"))[0]


def test_dump_files_rank_prefixes_and_defaults(tmp_path):
    me = os.getpid()
    (tmp_path / "fr_3").write_bytes(b"\x80x")
    (tmp_path / "fr_4").write_bytes(b"\x80y")
    (tmp_path / "fr_3.pipe").touch()
    os.mkfifo(tmp_path / "fr_5")
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "fr_")}
    assert [os.path.basename(p) for p in torchfr.dump_files(me, env, 3)] == ["fr_3"]
    assert [os.path.basename(p) for p in torchfr.dump_files(me, env, None)] == ["fr_3", "fr_4"]   # no FIFO, no .pipe
    # TORCH_FR_DUMP_TEMP_FILE is the newer name and wins in torch; both are looked at
    env2 = {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "new_"), **env}
    assert torchfr.dump_prefixes(me, env2) == [str(tmp_path / "new_"), str(tmp_path / "fr_")]
    defaults = torchfr.dump_prefixes(me, {})
    assert defaults[0] == "/tmp/nccl_trace_rank_" and defaults[-1].endswith("/.cache/torch/comm_lib_trace_rank_")



def test_a_dump_written_in_time_is_taken_when_the_wait_begins_after_its_deadline(tmp_path):
    # capture stops the tracer (seconds: bpftrace detaches uprobe by uprobe) before it waits for
    # the dumps: a dump written meanwhile counts, though the wait's deadline has already passed
    import time
    me = os.getpid()
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "fr_")}
    old = tmp_path / "fr_2"
    old.write_bytes(b"\x80old")
    [seen] = torchfr.dump_files(me, env, 2)          # the path as capture reads it (/proc/<pid>/root/...)
    pending = [torchfr.Pending(key="k", pid=me, rank=2, shown="p", triggered_ns=0, started_ns=0,
                               before={seen: torchfr.file_sig(seen)}, env=env)]
    assert torchfr.wait_dumps(pending, time.monotonic() - 5, poll_s=0.01) == {"k": None}   # unchanged: none
    old.write_bytes(b"\x80new dump")
    assert torchfr.wait_dumps(pending, time.monotonic() - 5, poll_s=0.01) == {"k": seen}

# ---------------------------------------------------------------- NCCL RAS (no root)
def test_ras_checks(lab_lib, tmp_path):
    assert not ncclras.lib_has_ras(str(lab_lib))             # the lab's libnccl predates RAS
    fake = tmp_path / "libnccl.so.2"
    fake.write_bytes(b"\x7fELF" + b"\0" * (9 << 20) + b"NCCL_RAS_ENABLE\0")   # past the first read chunk
    assert ncclras.lib_has_ras(str(fake))
    assert ncclras.split_addr("localhost:28028") == ("localhost", 28028)
    assert ncclras.split_addr("[::1]:12345") == ("::1", 12345) and ncclras.split_addr("10.0.0.1") == ("10.0.0.1", 28028)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        assert ncclras.port_answers("127.0.0.1", port, None, own_ns=True)
    finally:
        srv.close()
    assert not ncclras.port_answers("127.0.0.1", port, None, own_ns=True)
    from capture.procs import MappedLib, ProcInfo
    job = {os.getpid(): ProcInfo(pid=os.getpid(), nccl_libs=[MappedLib(str(lab_lib), str(lab_lib), 0)])}
    with pytest.raises(LookupError, match="has no RAS"):
        ncclras.collect({"procs": job})
    job[os.getpid()].nccl_libs = [MappedLib(str(fake), str(fake), 0)]
    job[os.getpid()].env = {"NCCL_RAS_ADDR": f"127.0.0.1:{port}"}
    with pytest.raises(LookupError, match=f"nothing answers on 127.0.0.1:{port}"):
        ncclras.collect({"procs": job})


# ---------------------------------------------------------------- captures
def test_flight_recorder_dump_triggered_through_its_pipe(lab_lib, tmp_path):
    """A process that keeps its pipe as torch's DumpPipe does (unlink, mkfifo 0666, open
    O_RDONLY|O_NONBLOCK, poll) and writes a pickled dump when a byte arrives: the capture
    triggers it at its end and attaches the dump under flight-recorder/."""
    out = tmp_path / "bundles"
    out.mkdir()
    fr = tmp_path / "fr"
    fr.mkdir()
    code = textwrap.dedent(f"""
        import ctypes, os, pickle, time
        ctypes.CDLL({str(lab_lib)!r})
        stem, rank = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"], int(os.environ["RANK"])
        name = f"{{stem}}{{rank}}.pipe"
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
        os.mkfifo(name, 0o666)
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
        print("ready", flush=True)
        while True:
            time.sleep(0.1)
            try:
                got = os.read(fd, 128)
            except BlockingIOError:
                got = b""
            if got:
                dump = {{"version": "2.4", "pg_config": {{}}, "entries": [{{"record_id": 0, "collective_seq_id": 7,
                        "profiling_name": "nccl:all_reduce", "state": "scheduled"}}]}}
                with open(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + str(rank), "wb") as fh:
                    fh.write(pickle.dumps(dump))
    """)
    env = dict(os.environ, RANK="3", WORLD_SIZE="4", TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(fr / "pipe_"),
               TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(fr / "dump_"))
    target = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert target.stdout.readline().strip() == "ready"
        assert stat.S_ISFIFO(os.stat(fr / "pipe_3.pipe").st_mode)
        cap = CaptureProc(["--pid", str(target.pid), "--no-bpf", "--no-pcap", "--stacks", "never", "-o", str(out),
                           "--duration", "1s", "--fr-dump-wait", "10s"])
        rc, stdout = cap.finish(timeout=120)
    finally:
        target.kill()
        target.wait()
    assert rc == 0, "".join(cap.err)
    m, t = _bundle(stdout)
    rec = m["collectors"][f"flight-recorder-trigger@pid{target.pid}"]
    assert rec["status"] == "ok" and rec["pipe"] == str(fr / "pipe_3.pipe") and "attached" in rec["reason"]
    assert "flight-recorder/dump_3" in [f["path"] for f in m["files"]]
    dump = pickle.loads(_member(t, "flight-recorder/dump_3"))
    assert dump["entries"][0]["collective_seq_id"] == 7
    assert m["collectors"][f"native-stacks@pid{target.pid}:hung"]["reason"] == "--stacks never"


def test_native_stacks_of_a_hung_process(lab_lib, tmp_path):
    """--stacks auto on a process blocked in pause(): nothing moves during the grace period,
    so its stacks are taken (eu-stack) and show pause() under Python's signal.pause."""
    require_root()
    require_tool("eu-stack")
    out = tmp_path / "bundles"
    out.mkdir()
    target = _paused_nccl_process(lab_lib)
    try:
        cap = CaptureProc(["--pid", str(target.pid), "--no-bpf", "--no-pcap", "-o", str(out), "--duration", "3s",
                           "--stacks-grace", "1s"])
        rc, stdout = cap.finish(timeout=120)
        assert _state(target.pid) in ("S", "R")
    finally:
        target.kill()
        target.wait()
    assert rc == 0, "".join(cap.err)
    m, t = _bundle(stdout)
    rec = m["collectors"][f"native-stacks@pid{target.pid}:hung"]
    assert rec["status"] == "ok" and rec["tool"] == "eu-stack", rec
    assert rec["decision"].startswith("nothing progressed during the first 1s")
    assert rec["files"] == [f"stacks/native-{target.pid}-hung.txt"]
    from forensics.parsers.native_stacks import NativeStacksParser
    r = NativeStacksParser.parse_bytes(_member(t, rec["files"][0]), "x")
    assert r.warnings == [] and r.facts["pid"] == target.pid
    main = r.tables["stacks"][r.tables["stacks"]["os_tid"] == target.pid]
    assert main.iloc[0]["function"] == "pause" and "signal_pause" in main["function"].tolist()
    if not any(os.access(os.path.join(d, "ncclras"), os.X_OK) for d in os.environ["PATH"].split(":")):
        assert m["collectors"]["ncclras:start"]["reason"] == "ncclras not found on PATH"


def test_wedged_stack_tool_is_killed_and_the_capture_ends_in_time(lab_lib, tmp_path):
    """A stack tool that never ends (and stops its target): the capture kills it after
    --stacks-timeout, says so (failed, "still running after 2s: killed"), resumes the target
    and ends within its duration + the bound + a small margin."""
    require_root()
    bin_dir = tmp_path / "bin"
    _fake_tool(bin_dir, "eu-stack", WEDGED)
    out = tmp_path / "bundles"
    out.mkdir()
    target = _paused_nccl_process(lab_lib)
    try:
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
        t0 = time.monotonic()
        cap = CaptureProc(["--pid", str(target.pid), "--no-bpf", "--no-pcap", "-o", str(out), "--duration", "2s",
                           "--stacks-grace", "1s", "--stacks-timeout", "2s"], env=env)
        rc, stdout = cap.finish(timeout=120)
        took = time.monotonic() - t0
        state = _state(target.pid)
    finally:
        target.kill()
        target.wait()
    assert rc == 3, "".join(cap.err)          # a failed collector
    # 1 s grace + 2 s bound + 1 s SIGTERM grace ends inside the 2 s capture's own start/finish time
    assert took < 2 + 2 + 1 + 8, took
    rec = _bundle(stdout)[0]["collectors"][f"native-stacks@pid{target.pid}:hung"]
    assert rec["status"] == "failed" and rec["reason"].startswith("still running after 2s: killed"), rec
    assert "SIGCONT sent" in rec["reason"] and rec["resumed_threads"] == [target.pid]
    assert state in ("S", "R")               # not left stopped


def _single_rank_job(tmp_path, extra_env=None) -> subprocess.Popen:
    """One lab rank training on and on: collectives complete all the time."""
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", **(extra_env or {}))
    p = subprocess.Popen([str(LAB / "sslab_rank"), "--steps", "1000000", "--compute-ms", "2", "--buckets", "65536"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    for _ in range(50):
        line = p.stdout.readline()
        if '"ev":"step"' in line:
            break
    else:
        p.kill()
        pytest.fail("the lab rank did not start training")
    threading_drain(p)
    return p


def threading_drain(p: subprocess.Popen) -> None:
    import threading
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()


@pytest.mark.parametrize("tracer", [True, False], ids=["tracer", "no-bpf"])
def test_stacks_never_taken_while_collectives_complete(lab_lib, tmp_path, tracer):
    """--stacks auto on a job whose collectives keep completing: no stack tool ever runs (a
    fake eu-stack first on PATH would leave a marker), the reason says why."""
    require_root()
    if tracer:
        require_tool("bpftrace")
    bin_dir = tmp_path / "bin"
    marker = tmp_path / "stack-tool-ran"
    _fake_tool(bin_dir, "eu-stack", f'touch "{marker}"\necho "TID $$:"\n')
    _fake_tool(bin_dir, "gdb", f'touch "{marker}"\n')
    out = tmp_path / "bundles"
    out.mkdir()
    job = _single_rank_job(tmp_path)
    try:
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
        args = ["--pid", str(job.pid), "--nccl-lib", str(LAB / "libnccl.so.2"), "--no-pcap", "-o", str(out),
                "--duration", "4s", "--stacks-grace", "2s"] + ([] if tracer else ["--no-bpf"])
        cap = CaptureProc(args, env=env)
        rc, stdout = cap.finish(timeout=180)
        assert job.poll() is None, "the job died during the capture"
    finally:
        job.kill()
        job.wait()
    assert rc == 0, "".join(cap.err)
    assert not marker.exists(), "a stack tool ran against a progressing job"
    m = _bundle(stdout)[0]
    rec = m["collectors"][f"native-stacks@pid{job.pid}:hung"]
    assert rec["status"] == "skipped", rec
    if tracer:
        assert rec["reason"].startswith("collectives completed during the first 2s"), rec
    else:
        assert "no ptrace stop" in rec["reason"] and "(--no-bpf)" in rec["reason"], rec
    assert not any(f["path"].startswith("stacks/native-") for f in m["files"])
