"""Capture keeps the state of a hang: per-thread waits resolved to sockets, ss samples over
time (capture/threads.py, the ss series of capture/collectors/ss_series.py, parsers proc_threads and ss)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from capture.threads import RESTART_SYSCALL, restarted_call, thread_states
from conftest import ROOT
from forensics.parsers import get

# a process whose main thread polls one socket for input, a second thread blocked in
# recv() on another, a third in poll() for output on a full socketpair
BLOCKED = r'''
import select, socket, sys, threading
a, b = socket.socketpair()
c, d = socket.socketpair()
e, f = socket.socketpair()
e.setblocking(False)
try:
    while True:
        e.send(b"x" * 65536)
except BlockingIOError:
    pass
def full():
    p = select.poll(); p.register(e, select.POLLOUT); p.poll()
threading.Thread(target=lambda: c.recv(10), name="receiver", daemon=True).start()
threading.Thread(target=full, name="sender", daemon=True).start()
print(a.fileno(), c.fileno(), e.fileno(), flush=True)
p = select.poll(); p.register(a, select.POLLIN); p.poll()
'''


@pytest.fixture
def blocked():
    p = subprocess.Popen([sys.executable, "-c", BLOCKED], stdout=subprocess.PIPE, text=True)
    try:
        fds = [int(x) for x in p.stdout.readline().split()]
        time.sleep(0.5)     # the threads reach their calls
        yield p, {fd: os.stat(f"/proc/{p.pid}/fd/{fd}").st_ino for fd in fds}, fds
    finally:
        p.kill()
        p.wait()


def test_thread_waits_name_the_sockets_and_directions(blocked):
    p, inode, (fa, fc, fe) = blocked
    s = thread_states(p.pid, "end")
    assert s["pid"] == p.pid and s["phase"] == "end" and s["sample_ns"] > 1.6e18
    main = next(t for t in s["threads"] if t["tid"] == p.pid)
    assert main["syscall_name"] in ("poll", "ppoll") and main["state"] == "S"
    assert main["waits"] == [{"fd": fa, "events": "in", "socket_inode": inode[fa]}]
    others = {t["waits"][0]["fd"]: t for t in s["threads"] if t["tid"] != p.pid and t["waits"]}
    assert others[fc]["syscall_name"] in ("recvfrom", "read", "recvmsg")            # the receiver
    assert others[fc]["waits"] == [{"fd": fc, "events": "in", "socket_inode": inode[fc]}]
    assert others[fe]["syscall_name"] in ("poll", "ppoll")                           # the sender
    assert others[fe]["waits"] == [{"fd": fe, "events": "out", "socket_inode": inode[fe]}]


# a poll with a timeout, as NCCL's threads wait: a stop (a debugger, eu-stack) makes it go on
# as restart_syscall
TIMED = r'''
import select, socket
a, b = socket.socketpair()
print(a.fileno(), flush=True)
p = select.poll(); p.register(a, select.POLLIN)
while True:
    p.poll(5000)
'''


def test_a_timed_poll_resumed_after_a_stop_is_read_as_the_poll_it_is():
    p = subprocess.Popen([sys.executable, "-c", TIMED], stdout=subprocess.PIPE, text=True)
    try:
        fd = int(p.stdout.readline())
        time.sleep(0.3)
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(0.1)
        os.kill(p.pid, signal.SIGCONT)
        time.sleep(0.3)
        raw = open(f"/proc/{p.pid}/syscall").read().split()[0]
        s = thread_states(p.pid, "end")
        (main,) = [t for t in s["threads"] if t["tid"] == p.pid]
        assert main["syscall_nr"] == int(raw)
        if int(raw) != RESTART_SYSCALL.get(s["arch"]):
            pytest.skip(f"this kernel resumed the poll as syscall {raw}, not restart_syscall")
        assert main["syscall_name"] == "poll" and "restart_syscall" in main["note"]
        assert main["waits"] == [{"fd": fd, "events": "in", "socket_inode": os.stat(f"/proc/{p.pid}/fd/{fd}").st_ino}]
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("wchan,args,call", [
    ("poll_schedule_timeout.constprop.0", [0x7f0000, 3, 1000], "poll"),
    ("poll_schedule_timeout.constprop.0", [12, 0x7f0000, 0x7f1000, 0], "select"),
    ("hrtimer_nanosleep", [0, 0], "clock_nanosleep"),
    ("futex_wait_queue", [0x7f0000, 0x189], "futex"),
    ("ep_poll", [5, 0x7f0000], None),
    (None, [], None)])
def test_the_call_a_restart_resumed_is_told_by_where_it_sleeps(wchan, args, call):
    assert restarted_call(wchan, args) == call


def test_parser_makes_one_row_per_thread_and_wait(blocked, tmp_path):
    p, inode, (fa, _, _) = blocked
    f = tmp_path / "proc" / f"{p.pid}-threads-end.json"
    f.parent.mkdir()
    f.write_text(json.dumps(thread_states(p.pid, "end")))
    r = get("proc_threads").parse(f)
    t = r.tables["threads"]
    assert not r.warnings and r.facts["threads"] == 3
    main = t[t["tid"] == p.pid].iloc[0]
    assert (main["socket_inode"], main["wait_events"], main["phase"]) == (inode[fa], "in", "end")
    assert set(t["wait_events"].dropna()) == {"in", "out"}


def test_parser_says_what_is_wrong_with_a_broken_sample(tmp_path):
    bad = tmp_path / "x-threads-end.json"
    for text, why in (("", "empty file"), ("{not json", "not JSON"), ('{"pid": 1}', "no threads list")):
        bad.write_text(text)
        r = get("proc_threads").parse(bad)
        assert r.tables["threads"].empty and any(why in w for w in r.warnings), r.warnings
    bad.write_text(json.dumps({"pid": 1, "phase": "end", "threads": [{"name": "x"}, {"tid": 5, "waits": "?"}]}))
    r = get("proc_threads").parse(bad)
    assert list(r.tables["threads"]["tid"]) == [5] and any("no tid" in w for w in r.warnings)


SERVER = r'''
import socket, time
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
c = socket.create_connection(l.getsockname()); a, _ = l.accept()
print(c.fileno(), flush=True)
while True:
    c.sendall(b"x" * 4000); a.recv(100000); time.sleep(0.1)
'''


def test_capture_samples_ss_every_interval_and_records_what_it_covered(tmp_path):
    if subprocess.run(["sh", "-c", "command -v ss"], capture_output=True).returncode:
        pytest.skip("needs ss (iproute2)")
    p = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        fd = int(p.stdout.readline())
        ino = os.stat(f"/proc/{p.pid}/fd/{fd}").st_ino
        r = subprocess.run([sys.executable, "-m", "capture", "--pid", str(p.pid), "--duration", "5s", "--no-bpf",
                            "--no-pcap", "--ss-every", "1", "-o", f"{tmp_path}/", "--progress", "off"],
                           capture_output=True, text=True, cwd=ROOT, timeout=120)
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 0, r.stderr
    out = tmp_path / "x"
    with tarfile.open(r.stdout.strip()) as t:
        t.extractall(out)
    root = next(out.iterdir())
    m = json.loads((root / "manifest.json").read_text())
    series = m["collectors"]["ss-series@host"]
    first, last = series["covered_ns"]
    assert series["status"] == "ok" and series["samples"] >= 4 and 3e9 <= last - first <= 6e9, series
    res = get("ss").parse(root / "sys" / "host" / "ss-series.txt")
    s = res.tables["sockets"]
    assert res.facts["phase"] == "series" and res.facts["samples"] == series["samples"]
    mine = s[s["inode"] == ino]
    # the connection in every sample, its bytes acknowledged growing
    assert mine["sample_ns"].nunique() == series["samples"]
    acked = mine.sort_values("sample_ns")["bytes_acked"].astype(int).tolist()
    assert acked == sorted(acked) and acked[-1] > acked[0]
    assert (root / "proc" / f"{p.pid}-threads-start.json").exists()
    assert m["collectors"][f"threads@pid{p.pid}:end"]["status"] == "ok"
