"""``stallscope capture --watch`` (issue 13): the black box.

Unit tests (no root): the hang trigger read from the tracer's spooled lines, the log
trigger, the tracer spool's age ring. Root tests: a real watcher with no job (on-demand
trigger, SIGKILL leaves no child and no ring), and the lab under watch: a watcher started
before each job, ``link-down-hang`` and ``mismatch-hang`` injected at a random time, a
clean job watched for 60 s, twice the shortest automatic --hang-after
(``STALLSCOPE_WATCH_CLEAN_S``; ``make watch-clean-5min`` watches it five), all three at once.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from capture_helpers import send_last_datagrams, udp_payloads_in_bundle, wait_for
from conftest import ROOT, require_root, require_tool
from test_capture import _rec

from capture.watch import monitors, triggers
from capture.tracer import events, program, spool

PY = sys.executable
LAB = ROOT / "tests" / "lab"
S = 1_000_000_000


def _segment(raw: Path, lines: list[str], name: str = "seg-000000.txt", mode: str = "a") -> None:
    raw.mkdir(parents=True, exist_ok=True)
    with open(raw / name, mode) as fh:
        fh.write("".join(line + "\n" for line in lines))


# ---------------------------------------------------------------- the hang trigger
def test_hang_needs_a_collective_in_flight_and_nothing_returned(tmp_path):
    raw = tmp_path / "raw"
    m = monitors.ProgressMonitor(raw)
    _segment(raw, [
        '{"ev":"tracer_start","t":1}',
        f"@e0[7, {1 * S}]: {_rec(0, 5, a=0x55, b=1, t1=1 * S + 1000)}",      # allreduce, launched (returned)
        f"@e1[7, {1 * S + 2000}]: {_rec(32, 5, a=0x77)}",                     # cudaStreamSynchronize, open
        f"@e1[9, {1 * S}]: {_rec(32, 6, a=0x78)}",                            # pid 6: a sync, no collective
    ])
    m.poll()
    assert m.stuck(3 * S, 5 * S) == []                         # not long enough yet
    stuck = m.stuck(7 * S, 5 * S)
    assert [s["pid"] for s in stuck] == [5]                    # pid 6 only computes: no collective in flight
    assert stuck[0]["last_collective_ns"] == 1 * S
    # the synchronize returns: progress, and the collective's time is known
    _segment(raw, [f"@e0[7, {int(1.5 * S)}]: {_rec(255, 5, a=1 * S + 2000)}"])
    m.poll()
    assert m.stuck(9 * S, 5 * S) == [] or [s["pid"] for s in m.stuck(9 * S, 5 * S)] == []
    assert m.slowest_ns(2 * S) == int(1.5 * S) - (1 * S + 2000)    # the synchronize after the collective
    assert m.slowest_ns(400 * S) == 0                          # older than 5 minutes: forgotten


def test_a_collective_call_that_never_returns_is_in_flight(tmp_path):
    raw = tmp_path / "raw"
    m = monitors.ProgressMonitor(raw)
    _segment(raw, [f"@e0[7, {1 * S}]: {_rec(0, 5, a=0x55, b=1)}"])          # blocked inside ncclAllReduce
    m.poll()
    assert [s["pid"] for s in m.stuck(10 * S, 5 * S)] == [5]
    m.forget([5])                                              # the process is gone: not a hang
    assert m.stuck(10 * S, 5 * S) == []


def test_unsorted_flushes_a_return_before_its_entry(tmp_path):
    """bpftrace prints a flush's records unsorted; a flush may be split between two polls."""
    raw = tmp_path / "raw"
    m = monitors.ProgressMonitor(raw)
    _segment(raw, [
        f"@e0[7, {int(1.5 * S)}]: {_rec(255, 5, a=1 * S + 2000)}",            # the sync's return first
        f"@e0[7, {1 * S + 2000}]: {_rec(32, 5, a=0x77)}",                     # then the sync's entry
        f"@e0[7, {1 * S}]: {_rec(0, 5, a=0x55, b=1, t1=1 * S + 1000)}",       # the allreduce before it
        f"@e0[7, {2 * S}]: {_rec(0, 5, a=0x55, b=2, t1=2 * S + 1000)}",       # the next step's allreduce
    ])
    m.poll()
    assert m.open == {} and m.in_flight(5)                     # #2 launched after the last sync returned
    _segment(raw, [f"@e1[7, {int(3.5 * S)}]: {_rec(255, 5, a=3 * S)}"])    # a return, its entry not read yet
    m.poll()
    _segment(raw, [f"@e1[7, {3 * S}]: {_rec(32, 5, a=0x77)}"])            # the entry, in the next poll
    m.poll()
    assert m.open == {} and not m.in_flight(5)
    assert m.stuck(60 * S, 5 * S) == []                        # a long compute after it: not a hang


def test_partial_lines_wait_and_dropped_segments_are_forgotten(tmp_path):
    raw = tmp_path / "raw"
    m = monitors.ProgressMonitor(raw)
    raw.mkdir()
    line = f"@e0[7, {1 * S}]: {_rec(0, 5, a=0x55, b=1)}\n"
    (raw / "seg-000000.txt").write_text(line[:20])            # bpftrace is still writing this line
    assert m.poll() == 0
    with open(raw / "seg-000000.txt", "a") as fh:
        fh.write(line[20:])
    assert m.poll() == 1 and m.poll() == 0                     # read once
    (raw / "seg-000000.txt").unlink()                          # the ring dropped it
    _segment(raw, [f"@e0[7, {2 * S}]: {_rec(255, 5, a=1 * S)}"], name="seg-000001.txt")
    assert m.poll() == 1 and "seg-000000.txt" not in m.pos
    assert m.stuck(10 * S, 5 * S) == []                        # its return came


def test_without_traced_returns_a_collective_is_a_launch(tmp_path):
    raw = tmp_path / "raw"
    m = monitors.ProgressMonitor(raw, call_returns=False)
    _segment(raw, [f"@e0[7, {1 * S}]: {_rec(0, 5, a=0x55, b=1)}",
                   f"@e1[7, {2 * S}]: {_rec(32, 5, a=0x77)}"])
    m.poll()
    assert [s["pid"] for s in m.stuck(10 * S, 5 * S)] == [5]   # the sync after it never returned


def test_the_slowest_collective_is_the_windows_longest_as_older_ones_expire(tmp_path):
    """--hang-after's 10x rule: the slowest host wait after a collective in the last 5
    minutes; a shorter wait that a longer later one hides is never needed again."""
    raw = tmp_path / "raw"
    m = monitors.ProgressMonitor(raw)
    lines, t = [], 10 * S
    for i, d in enumerate((5 * S, 1 * S, 2 * S, S // 2)):   # each step: a collective, a sync of d
        lines += [f"@e0[7, {t}]: {_rec(0, 5, a=0x55, b=i, t1=t + 1000)}",
                  f"@e0[7, {t + 2000}]: {_rec(32, 5, a=0x77, t1=t + 2000 + d)}"]
        t += 2000 + d + 1000
    _segment(raw, lines)
    m.poll()
    assert m.slowest_ns(t) == 5 * S
    assert len(m.durations) == 3                               # the 1 s wait can never be the slowest again
    assert m.slowest_ns(316 * S) == 2 * S                      # the 5 s one (ended at 15 s) left the window
    assert m.slowest_ns(t + 301 * S) == 0


def _op(tid, cls, pid, t0=0, last_t0=0, last_t1=0, sec=0, longest=0, sp=0, ret=0):
    return f"@op[{tid}, {cls}]: ({t0}, 17, {pid}, {last_t0}, {last_t1}, {sec}, {longest}, {sp}, {ret})"


def test_ring_monitor_reads_the_calls_state(tmp_path):
    """Ring mode: the tracer prints each thread's call state every second, not its records; a
    line replaces what its thread and class said before."""
    raw = tmp_path / "raw"
    m = monitors.RingMonitor(raw)
    _segment(raw, [_op(7, 0, 5, last_t0=1 * S, last_t1=1 * S + 1000),      # allreduce launched, returned
                   _op(7, 1, 5, t0=1 * S + 2000),                           # its sync, open
                   _op(9, 1, 6, t0=1 * S), _op(0, 0, 0),                    # pid 6 computes; the declaration
                   "", '{"ev":"tcp_retransmit_skb","t":1,"saddr":"10.0.0.1"}'])
    assert m.poll() == 4 and 0 not in {v[0] for v in m.open.values()}
    assert m.stuck(3 * S, 5 * S) == []
    stuck = m.stuck(7 * S, 5 * S)
    assert [s["pid"] for s in stuck] == [5] and stuck[0]["last_collective_ns"] == 1 * S
    assert [e["saddr"] for e in m.take_trouble()] == ["10.0.0.1"]
    # the next print: the sync returned (1.5 s, the second's longest), the next collective launched
    _segment(raw, [_op(7, 0, 5, last_t0=2 * S, last_t1=2 * S + 1000),
                   _op(7, 1, 5, last_t0=1 * S + 2000, last_t1=int(2.5 * S), sec=2, longest=int(1.5 * S) - 2000),
                   _op(9, 1, 6, t0=1 * S)])
    m.poll()
    assert m.stuck(60 * S, 5 * S) == [] and m.in_flight(5) and list(m.open.values()) == [(6, 32)]
    assert m.slowest_ns(3 * S) == int(1.5 * S) - 2000
    _segment(raw, [_op(7, 1, 5, t0=3 * S, last_t0=1 * S + 2000, last_t1=int(2.5 * S), sec=2,
                       longest=int(1.5 * S) - 2000)])                    # the same second again: counted once
    m.poll()
    assert len(m.durations) == 1 and [s["pid"] for s in m.stuck(9 * S, 5 * S)] == [5]
    m.forget([5])
    assert m.stuck(9 * S, 5 * S) == [] and (7, 1) not in m.cls_open
    # a dump's end marks are counted (the cut waits for its own)
    _segment(raw, ["@r[3]: (1, 2, 3)", '{"ev":"ring_dump","t":9,"slots":16}'])
    m.poll()
    assert m.ring_dumps == 1


def test_ring_monitor_without_traced_returns(tmp_path):
    raw = tmp_path / "raw"
    m = monitors.RingMonitor(raw, call_returns=False)
    _segment(raw, [_op(7, 0, 5, last_t0=1 * S, sp=0x7000, ret=0x4242), _op(7, 1, 5, t0=2 * S)])
    m.poll()
    assert [s["pid"] for s in m.stuck(10 * S, 5 * S)] == [5]   # the sync after the launch never returned


def test_ring_monitor_asks_whether_a_quiet_thread_is_inside_its_last_launch(tmp_path):
    """Without the collectives' returns a thread blocked inside one shows no open call: its last
    call was a launch. It is stuck when the kernel says it is still inside that call (asked with
    the entry's stack pointer and return address), not when it returned to compute, and not
    when it called anything since."""
    raw = tmp_path / "raw"
    m = monitors.RingMonitor(raw, call_returns=False)
    _segment(raw, [_op(7, 1, 5, last_t0=int(0.5 * S), last_t1=int(0.6 * S)),       # a sync before it
                   _op(7, 0, 5, last_t0=1 * S, sp=0x7FF0, ret=0x4242),             # then a launch, quiet since
                   _op(8, 0, 6, last_t0=1 * S, sp=0x6FF0, ret=0x4343),             # pid 6: a launch ...
                   _op(8, 1, 6, last_t0=2 * S, last_t1=3 * S)])                    # ... and a sync after it
    m.poll()
    asked = []

    def inside(pid, tid, sp, ret):
        asked.append((pid, tid, sp, ret))
        return verdict

    verdict = True
    assert m.stuck(3 * S, 5 * S, inside=inside) == [] and asked == []      # not quiet long enough: not asked
    stuck = m.stuck(7 * S, 5 * S, inside=inside)
    assert asked == [(5, 7, 0x7FF0, 0x4242)]                                # pid 6 is not in flight
    assert [(s["pid"], s["tid"], s["open_since_ns"], s["kind"]) for s in stuck] == [(5, 7, 1 * S, 0)]
    # asked again only after ASK_AGAIN_S while it is inside or cannot be told, never once it returned
    verdict = None                                                           # running or unreadable: not a hang
    assert m.stuck(13 * S, 5 * S, inside=inside) == [] and len(asked) == 2
    assert m.stuck(14 * S, 5 * S, inside=inside) == [] and len(asked) == 2
    verdict = False                                                          # it returned: compute, not a hang
    assert m.stuck(19 * S, 5 * S, inside=inside) == [] and len(asked) == 3
    verdict = True
    assert m.stuck(40 * S, 5 * S, inside=inside) == [] and len(asked) == 3
    m.asked.clear()
    _segment(raw, [_op(7, 2, 5, last_t0=int(8.1 * S), last_t1=int(8.2 * S))])   # a group call since
    m.poll()
    assert m.stuck(20 * S, 5 * S, inside=inside) == []
    m.forget([5, 6])
    assert m.launches == {} and m.thread_last == {}


INSIDE_C = r"""
#include <stdio.h>
#include <unistd.h>
/* blocked in read(0) inside inner(), called from outer(): prints inner's entry stack pointer and
   return address; a line on stdin returns from inner, then deeper() blocks reading again */
__attribute__((noinline)) void deeper(int d) { char b[256]; b[0] = 0; if (d) deeper(d - 1); else read(0, b, 1); }
__attribute__((noinline)) void inner(void) {
  printf("%lu %lu\n", (unsigned long)__builtin_frame_address(0) + 8, (unsigned long)__builtin_return_address(0));
  fflush(stdout);
  char c; read(0, &c, 1);
}
__attribute__((noinline)) void outer(void) { inner(); deeper(8); }
int main(void) { outer(); return 0; }
"""


def test_inside_call_reads_the_threads_stack(tmp_path):
    """capture.procs.inside_call on a real blocked process: inside the call while it blocks in it,
    not once it returned and blocks deeper in the stack in another call."""
    require_tool("gcc")
    from capture import procs
    src = tmp_path / "inside.c"
    src.write_text(INSIDE_C)
    exe = tmp_path / "inside"
    subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", "-o", str(exe), str(src)], check=True)
    p = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        sp, ret = (int(x) for x in p.stdout.readline().split())
        wait_for(lambda: procs.blocked_sp(p.pid, p.pid) is not None, 10, "the helper to block")
        assert procs.inside_call(p.pid, p.pid, sp, ret) is True
        assert procs.inside_call(p.pid, p.pid, sp, ret + 1) is False      # another call's slot
        p.stdin.write(b"x")
        p.stdin.flush()
        time.sleep(0.3)
        assert procs.blocked_sp(p.pid, p.pid) < sp                         # deeper than the call was
        assert procs.inside_call(p.pid, p.pid, sp, ret) is False
    finally:
        p.kill()
        p.wait()
    assert procs.inside_call(p.pid, p.pid, sp, ret) is None                # gone


# ---------------------------------------------------------------- the log trigger
def test_log_watch_reports_new_warn_and_watchdog_lines_only(tmp_path):
    log = tmp_path / "nccl-rank0.log"
    log.write_text("node0:1:1 [0] NCCL WARN an old warning, before the watcher looked\n")
    lw = monitors.LogWatch()
    paths = [(str(log), "NCCL_DEBUG_FILE of pid 1")]
    assert lw.poll(paths) == []                                # what was there is not news
    with open(log, "a") as fh:
        fh.write("node0:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[0] via NET/Socket/0\n")
        fh.write("node0:1:1 [0] NCCL WARN NET/Socket : peer 10.0.0.2<35121> shutdown\n")
        fh.write("[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=18, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n")
        fh.write("node0:1:1 [0] NCCL WARN half a li")
    hits = lw.poll(paths)
    assert [h[1] for h in hits] == ["NCCL WARN", "PyTorch watchdog timeout"]
    assert "peer 10.0.0.2" in hits[0][2]
    assert lw.poll(paths) == []
    with open(log, "a") as fh:
        fh.write("ne\n")
    assert [h[1] for h in lw.poll(paths)] == ["NCCL WARN"]    # the line once it is whole


# ---------------------------------------------------------------- the tracer's ring
def test_spool_ring_drops_old_segments_and_compacts_the_kept_lines(tmp_path):
    r, w = os.pipe()
    raw = tmp_path / "raw"
    sp = spool.Spool(os.fdopen(r, "rb"), raw, max_bytes=1 << 20, max_age_s=8.0)
    sp._append(b'{"ev":"comm_init","t0":1,"pid":5}\n' + b"@e0[7, 1]: (0, 5, 1, 1, 0, 0, 0, 0, 0, 0, 0)\n")
    old = sp._segments[0]
    os.utime(old, (time.time() - 60, time.time() - 60))       # a minute old: out of the ring
    sp._seg_opened -= 2                                         # past max_age_s / 8: a new segment
    sp._append(b"@e0[7, 2]: (0, 5, 1, 2, 0, 0, 0, 0, 0, 0, 0)\n")
    assert not old.exists() and len(sp._segments) == 1
    keep = (raw / spool.KEEP_FILE).read_bytes()
    assert b"comm_init" in keep and b"@e0" not in keep         # the rare line kept, the hot one gone
    assert sp.dropped_lines == 1
    # a long watch: old TCP events of the kept lines go, what joins later events stays
    (raw / spool.KEEP_FILE).write_bytes(keep + b'{"ev":"tcp_retransmit_skb","t":3}\n' * 5000)
    sp._drop_aged()
    kept = (raw / spool.KEEP_FILE).read_bytes()
    assert b"tcp_retransmit_skb" not in kept and b"comm_init" in kept
    os.close(w)


def test_spool_follows_a_restarted_tracer_into_the_same_segments(tmp_path):
    """A tracer restarted on other libraries (capture.collectors.tracer) goes on into the same
    spool: the same segments, one stream; the new program's start mark makes it ready again."""
    raw = tmp_path / "raw"
    r1, w1 = os.pipe()
    sp = spool.Spool(os.fdopen(r1, "rb"), raw, max_bytes=1 << 20, poll_s=0.01).start()
    os.write(w1, b'{"ev":"tracer_start","t":100,"tracer_pid":1}\n{"ev":"ring_dump","t":150,"slots":4}\n'
                 b'{"ev":"tracer_end","t":200}\n')
    os.close(w1)
    assert sp.join(5) and sp.ready.is_set() and sp.ended.is_set() and sp.ring_dumps == 1
    r2, w2 = os.pipe()
    sp.follow(os.fdopen(r2, "rb"))
    assert not sp.ready.is_set() and not sp.ended.is_set()
    os.write(w2, b'{"ev":"tracer_start","t":300,"tracer_pid":2}\n{"ev":"tracer_end","t":400}\n')
    os.close(w2)
    assert sp.join(5) and sp.ready.is_set() and sp.ended.is_set()
    text = b"".join(p.read_bytes() for p in spool.raw_files(raw))
    assert text.count(b"tracer_start") == 2 and text.index(b'"t":100') < text.index(b'"t":300')
    assert sp.lines == 5
    # the events it becomes cover both programs: from the first start to the last one's end
    out = tmp_path / "events.jsonl"
    summ = events.postprocess(raw, out, 1 << 20)
    assert summ["span_monotonic_ns"] == [100, 400], summ.get("span_monotonic_ns")


def _ss_text(rows):
    """ss -tinpeH lines for (local, peer, pid, acked, received, unacked, send_q, recv_q)."""
    out = []
    for local, peer, pid, acked, rcvd, unacked, sq, rq in rows:
        out.append(f'ESTAB {rq} {sq} {local} {peer} users:(("rank",pid={pid},fd=5)) ino:1\n'
                   f"\t cubic bytes_acked:{acked} bytes_received:{rcvd} unacked:{unacked}\n")
    return "".join(out).encode()


def test_quiet_jobs_tell_a_stalled_collective_from_a_job_between_steps():
    """The tracer-free trigger: connections that stopped moving with data waiting are a hang;
    the same silence with empty queues (a job between steps, a launcher) is not."""
    q = monitors.QuietJobs()
    S = 10**9
    big = 50 << 20
    a, b = "10.0.0.1:5000", "10.0.0.2:6000"
    # t=0..4 s: moving; then frozen from t=4 s with 3 bytes unacknowledged on pid 7's connection
    for i, t in enumerate((0, 2, 4)):
        q.feed({1: (t * S, _ss_text([(a, b, 7, big + i * S, big, 0, 0, 0), (b, a, 8, big, big + i * S, 0, 0, 0)]))},
               {7, 8})
    for t in (6, 8, 40):
        q.feed({1: (t * S, _ss_text([(a, b, 7, big + 2 * S, big, 3, 65536, 0),
                                     (b, a, 8, big, big + 2 * S, 0, 0, 0)]))}, {7, 8})
    stuck = q.stuck(40 * S, 30 * S)
    assert [st["pid"] for st in stuck] == [7] and stuck[0]["quiet_ns"] == 36 * S and stuck[0]["waiting"] == 1
    assert q.stuck(20 * S, 30 * S) == []                       # not quiet long enough yet
    # a sample already read is not read again; a process not asked about is not judged
    q.feed({1: (40 * S, b"")}, {7, 8})
    assert [st["pid"] for st in q.stuck(40 * S, 30 * S)] == [7]
    # idle between steps: quiet, queues empty -> no hang; a small control connection -> no data socket
    idle = monitors.QuietJobs()
    for t in (0, 40):
        idle.feed({1: (t * S, _ss_text([(a, b, 9, big, big, 0, 0, 0), (a, b, 10, 100, 100, 5, 5, 0)]))}, {9, 10})
    assert idle.stuck(40 * S, 30 * S) == []
    q.forget([7])
    assert q.stuck(40 * S, 30 * S) == []


def test_the_tracer_free_trigger_judges_live_processes_only():
    """A followed process is kept a while after it ends, and the hang monitor forgets it at
    once: it read as untraced, with its last ss samples (data waiting, no progress), and a job
    torn down after its hang's incident opened a second one (make watch-align). Only a live
    process is judged; the same samples on a live one still fire."""
    from types import SimpleNamespace
    from capture.watch import watcher
    S = 10**9
    big = 50 << 20
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        fired = []
        for pid in (dead.pid, live.pid):
            w = watcher.Watcher.__new__(watcher.Watcher)
            info = SimpleNamespace(rank_facts=lambda: {"rank": 1}, job_reasons=["libnccl"])
            w.s = SimpleNamespace(procs={pid: info})
            w.o = SimpleNamespace(hang_after_s=5)
            w.tracing, w.monitor = SimpleNamespace(alive=lambda: False), None
            w.quiet, w.quiet_cleared = monitors.QuietJobs(), {}
            w.fire = lambda trig, stuck=None: fired.append(trig.pids)
            rows = [("10.0.0.1:5000", "10.0.0.2:6000", pid, big, big, 3, 65536, 0)]
            for t in (now - 40 * S, now - 30 * S):
                w.ss = SimpleNamespace(latest={1: (t, _ss_text(rows))})
                w.check_quiet()
        assert fired == [[live.pid]]
    finally:
        live.kill()
        live.wait()


# ---------------------------------------------------------------- a real watcher (root)
def _watcher(out: Path, *args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "forensics", "capture", "--watch", "-o", str(out), "--status-every", "30s",
                             *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True)


def _ring(out: Path) -> list[Path]:
    return sorted(out.glob(".stallscope-*-watch.staging-*"))


def _children_of_ring(ring: Path) -> list[int]:
    """Processes whose command line names the ring folder (its bpftrace script, tcpdump files)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(ring).encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def _manifest(bundle: Path) -> dict:
    with tarfile.open(bundle) as t:
        name = next(n for n in t.getnames() if n.endswith("/manifest.json"))
        return json.load(t.extractfile(name))


def test_on_demand_trigger_then_sigkill_leaves_nothing_behind(tmp_path):
    require_root()
    require_tool("bpftrace")
    out = tmp_path / "bundles"
    out.mkdir()
    # no hang trigger (1 h): the watcher follows every NCCL job of the host, and a shared test
    # machine may run another's hung lab job, whose incident would fold these triggers into it
    w = _watcher(out, "--before", "30s", "--after", "1s", "--hang-after", "1h", log=tmp_path / "w.err")
    try:
        wait_for(lambda: b"capturing:" in (tmp_path / "w.err").read_bytes(), 90, "the watcher to start")
        ring = _ring(out)
        assert len(ring) == 1
        assert _children_of_ring(ring[0]), "the tracer runs from the ring"
        p = subprocess.run([PY, "-m", "forensics", "capture", "--trigger", "test: on demand"], cwd=ROOT,
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        assert f"triggered watcher {w.pid}" in p.stderr
        bundle = wait_for(lambda: sorted(out.glob("stallscope-*.tar.gz")), 60, "the incident's bundle")[0]
        m = _manifest(bundle)
        assert m["trigger"]["kind"] == "on-demand" and m["trigger"]["reason"] == "test: on demand"
        assert m["watch"]["before_s"] == 30 and not m["partial"]
        assert m["watch"]["stage"] in ("first", "complete") and "stall" not in m["watch"]   # no hang: no stall
        # the bundle is written at the trigger and completed --after later, in place: every file kept
        wait_for(lambda: _manifest(bundle)["watch"]["stage"] == "complete", 60, "the bundle's completion")
        m2 = _manifest(bundle)
        assert m2["watch"]["first_written_ns"] <= m2["ended_ns"]
        assert {f["path"] for f in m["files"]} <= {f["path"] for f in m2["files"]}
        # a second one by the trigger file (no cooldown for on-demand triggers)
        (out / triggers.TRIGGER_NAME).write_text("by the file\n")
        wait_for(lambda: len(list(out.glob("stallscope-*.tar.gz"))) == 2, 60, "the second bundle")
        second = [b for b in out.glob("stallscope-*.tar.gz") if b != bundle][0]
        wait_for(lambda: _manifest(second)["watch"]["stage"] == "complete" and not (ring[0] / triggers.PENDING).exists(),
                 60, "the second bundle's completion")
        assert not (out / triggers.TRIGGER_NAME).exists()
        w.send_signal(signal.SIGKILL)
        w.wait(timeout=10)
        wait_for(lambda: not _children_of_ring(ring[0]), 15, "the watcher's children to be stopped")
        wait_for(lambda: not ring[0].exists(), 15, "the guardian to remove the rings")
        assert not list(out.glob(".*staging*")), "nothing left for --recover: no incident was pending"
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


FAKE_NCCL_C = r"""
/* a libnccl with one collective: with a communicator it blocks inside the call (reading stdin),
   as a lazy connection to a dead peer does; without one it returns at once */
#include <stddef.h>
#include <unistd.h>
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *comm, void *stream) {
  char c;
  if (comm) read(0, &c, 1);
  return 0;
}
"""
LAUNCHER_C = r"""
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>
typedef int (*ar_t)(const void *, void *, size_t, int, int, void *, void *);
/* argv: libnccl, inside (1: block inside the collective; 0: return, then block in main) */
int main(int argc, char **argv) {
  void *h = dlopen(argv[1], RTLD_NOW);
  if (!h) return 2;
  ar_t ar = (ar_t)dlsym(h, "ncclAllReduce");
  char c;
  if (read(0, &c, 1) != 1) return 3;           /* the gate: the watcher is up */
  float x = 1;
  ar(&x, &x, 1, 7, 0, argv[2][0] == '1' ? (void *)&x : NULL, NULL);
  read(0, &c, 1);                              /* a data loader, say: not inside a collective */
  return 0;
}
"""


def _fake_nccl_and(tmp_path: Path, name: str, source: str, *libs: str) -> tuple[Path, Path]:
    """(FAKE_NCCL_C built as lib/libnccl.so.2, the program ``source`` built as ``name``, which
    dlopens it) under tmp_path."""
    lib, exe = tmp_path / "lib" / "libnccl.so.2", tmp_path / name
    lib.parent.mkdir()
    (tmp_path / "nccl.c").write_text(FAKE_NCCL_C)
    (tmp_path / f"{name}.c").write_text(source)
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "nccl.c")], check=True)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(tmp_path / f"{name}.c"), "-ldl", *libs], check=True)
    return lib, exe


def test_a_thread_blocked_inside_a_collective_triggers_without_its_return(tmp_path):
    """The watcher leaves the collectives' returns out: a thread blocked inside one is found by
    its stack (still below the call's entry, the return address in place), and one that returned
    and blocks elsewhere is not a hang."""
    require_root()
    require_tool("bpftrace", "gcc")
    lib, exe = _fake_nccl_and(tmp_path, "launcher", LAUNCHER_C)
    procs = {mode: subprocess.Popen([str(exe), str(lib), mode], stdin=subprocess.PIPE) for mode in ("1", "0")}
    out = tmp_path / "bundles"
    out.mkdir()
    w = None
    try:
        pids = [str(p.pid) for p in procs.values()]
        w = _watcher(out, "--pid", pids[0], "--pid", pids[1], "--nccl-lib", str(lib), "--no-pcap",
                     "--hang-after", "3s", "--before", "30s", "--after", "1s", log=tmp_path / "w.err")
        wait_for(lambda: b"capturing:" in (tmp_path / "w.err").read_bytes() or w.poll() is not None, 90,
                  "the watcher to start")
        assert w.poll() is None, (tmp_path / "w.err").read_text()
        for p in procs.values():
            p.stdin.write(b"g")
            p.stdin.flush()
        bundle = wait_for(lambda: sorted(out.glob("stallscope-*.tar.gz")), 60, "the incident's bundle")[0]
        m = _manifest(bundle)
        assert m["trigger"]["kind"] == "hang", m["trigger"]
        assert m["trigger"]["pids"] == [procs["1"].pid], (m["trigger"], procs["0"].pid)
        assert m["options"]["call_returns"] is False
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        if w is not None:
            w.terminate()
            try:
                w.wait(timeout=90)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()


THREADS_C = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>
typedef int (*ar_t)(const void *, void *, size_t, int, int, void *, void *);
static ar_t ar;
static pthread_barrier_t bar;
static void *body(void *a) {
  float x = 1;
  ar(&x, &x, 1, 7, 0, NULL, NULL);             /* returns at once: the thread has call state */
  pthread_barrier_wait(&bar);
  pause();
  return a;
}
/* argv: libnccl, threads[, stay]. Each thread makes one collective call; once they all have,
   the process exits and its threads end together, on every CPU (with "stay": it never ends) */
int main(int argc, char **argv) {
  void *h = dlopen(argv[1], RTLD_NOW);
  if (!h) return 2;
  ar = (ar_t)dlsym(h, "ncclAllReduce");
  int n = atoi(argv[2]);
  char c;
  if (read(0, &c, 1) != 1) return 3;           /* the gate: the tracer is up */
  pthread_barrier_init(&bar, NULL, n + 1);
  for (int i = 0; i < n; i++) { pthread_t t; pthread_create(&t, NULL, body, NULL); }
  pthread_barrier_wait(&bar);
  if (argc > 3) pause();
  usleep(1200000);                             /* one state print with all of them */
  exit(0);
}
"""


def test_threads_that_end_together_are_all_forgotten(tmp_path):
    """Ring mode: the tracer forgets the call state of every thread that ends, also when a
    process's threads end at the same moment on all CPUs (the exit queue is per CPU: with one
    count shared by all CPUs, one of two threads that ended at once was lost and its state
    stayed for good)."""
    require_root()
    require_tool("bpftrace", "gcc")
    lib, exe = _fake_nccl_and(tmp_path, "threads", THREADS_C, "-lpthread")
    n = 48
    procs = [subprocess.Popen([str(exe), str(lib), str(n)], stdin=subprocess.PIPE) for _ in range(3)]
    pids = [p.pid for p in procs]
    # one that stays: its thread's state is printed throughout (the tracer did not just stop)
    stays = subprocess.Popen([str(exe), str(lib), "1", "stay"], stdin=subprocess.PIPE)
    t = program.TraceTargets(nccl={str(lib): {"ncclAllReduce"}}, want_pids=pids + [stays.pid],
                            traced_pids=pids + [stays.pid],
                            stop_lib=program.own_libc(), capture_pid=os.getpid())
    t.fill_addresses()
    feats = program.KernelFeatures.probe()
    script, blocks = program.render_script(t, feats, call_returns=False, flush_ms=1000, ring=4096)
    assert "thread_exit" in blocks and f"% {feats.cpus};" in script
    (tmp_path / "gen.bt").write_text(script)
    out = tmp_path / "bt.out"
    with open(out, "wb") as fh:
        bt = subprocess.Popen(["bpftrace", "-B", "line", str(tmp_path / "gen.bt")], stdout=fh,
                              stderr=subprocess.STDOUT, env=dict(os.environ, BPFTRACE_MAP_KEYS_MAX="16384"))
    try:
        wait_for(lambda: b"tracer_start" in out.read_bytes() or bt.poll() is not None, 60, "bpftrace to start")
        assert bt.poll() is None, out.read_text()[-2000:]
        for p in procs + [stays]:
            p.stdin.write(b"g")
            p.stdin.flush()
        for p in procs:
            assert p.wait(timeout=30) == 0

        def ours_printed(wait_s: float) -> list[str]:
            """The state lines of the ended threads that the tracer prints (every second) in
            wait_s; the one that stays is in them."""
            size = out.stat().st_size
            time.sleep(wait_s)
            new = [l for l in out.read_bytes()[size:].decode(errors="replace").splitlines() if l.startswith("@op[")]
            assert any(f", {stays.pid}, " in l for l in new), (bt.poll(), new[:3])
            return [l for l in new if any(f", {p}, " in l for p in pids)]

        text = out.read_text(errors="replace")
        assert all(f", {pid}, " in text for pid in pids), "every process's threads had call state"
        assert len({l.split("]")[0] for l in text.splitlines() if l.startswith("@op[")}) >= 3 * n
        # the state block forgets up to 32 threads a second
        deadline = time.monotonic() + 3 * n / 32 + 10
        stale = ours_printed(2.5)
        while stale and time.monotonic() < deadline:
            stale = ours_printed(2.5)
        assert bt.poll() is None, out.read_text()[-2000:]
        assert stale == [], stale[:5]
    finally:
        for p in procs + [stays]:
            if p.poll() is None:
                p.kill()
                p.wait()
        bt.terminate()
        bt.wait(timeout=30)


def test_the_packets_just_before_the_cut_are_in_the_incident_bundle(tmp_path):
    """The watcher's tcpdump ring is buffered (no wake-up per packet, see capture.collectors):
    the cut flushes it, so what was sent a moment before the bundle is cut is in it."""
    require_root()
    require_tool("tcpdump")
    out = tmp_path / "bundles"
    out.mkdir()
    w = _watcher(out, "--iface", "lo", "--no-bpf", "--pcap-ring", "always", "--before", "30s", "--after", "0.1s",
                 log=tmp_path / "w.err")
    try:
        wait_for(lambda: b"capturing:" in (tmp_path / "w.err").read_bytes(), 90, "the watcher to start")
        port, sent = send_last_datagrams()
        (out / triggers.TRIGGER_NAME).write_text("now\n")
        bundle = wait_for(lambda: sorted(out.glob("stallscope-*.tar.gz")), 60, "the incident's bundle")[0]
    finally:
        w.terminate()
        w.wait(timeout=60)
    seen = udp_payloads_in_bundle(bundle, port)
    assert seen == sent, (seen, (tmp_path / "w.err").read_text()[-2000:])


def _tcpdumps_of(ring: Path) -> list[int]:
    out = []
    for pid in _children_of_ring(ring):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "tcpdump":
                out.append(pid)
        except OSError:
            pass
    return out


def _tcp_segments_to(bundle: Path, port: int) -> int:
    import dpkt
    n = 0
    with tarfile.open(bundle) as t:
        for m in t.getmembers():
            if "/pcap/" in m.name and m.name.endswith(".pcap") and m.isfile():
                for _, buf in dpkt.pcap.Reader(t.extractfile(m)):
                    ip = dpkt.ethernet.Ethernet(buf).data
                    n += isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP) and ip.data.dport == port
    return n


def test_the_packet_ring_starts_on_tcp_trouble_and_stops_after_the_linger(tmp_path):
    """--pcap-ring on-trouble (the default): no tcpdump taps the job's packets until the tracer
    sees TCP retransmissions; then the ring runs, the incident's bundle holds the packets from
    then on (and none from before), and it stops once --pcap-linger passed without trouble."""
    require_root()
    require_tool("bpftrace", "tcpdump", "nft")
    out = tmp_path / "bundles"
    out.mkdir()
    err = tmp_path / "w.err"
    table = f"stallscope_test_{os.getpid()}"
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    # no hang trigger (1 h): a host-wide watcher on a shared machine follows others' hung lab jobs
    w = _watcher(out, "--iface", "lo", "--before", "4s", "--after", "0.5s", "--pcap-linger", "1s", "--hang-after", "1h",
                 log=err)
    try:
        wait_for(lambda: b"capturing:" in err.read_bytes(), 90, "the watcher to start")
        ring = _ring(out)[0]
        early_port, _early = send_last_datagrams()
        time.sleep(1.5)
        assert not _tcpdumps_of(ring), "no TCP trouble yet: nothing taps the packets"
        for cmd in (["add", "table", "inet", table],
                    ["add", "chain", "inet", table, "inp", "{ type filter hook input priority 0 ; }"],
                    ["add", "rule", "inet", table, "inp", "tcp", "dport", str(port), "drop"]):
            subprocess.run(["nft", *cmd], check=True, timeout=10)
        cli.send(b"x" * 100)                    # dropped: the kernel retransmits it (RTO)
        wait_for(lambda: b"packet ring on (" in err.read_bytes(), 30, "the packet ring to start")
        assert _tcpdumps_of(ring)
        late_port, late = send_last_datagrams()
        (out / triggers.TRIGGER_NAME).write_text("now\n")
        bundle = wait_for(lambda: sorted(out.glob("stallscope-*.tar.gz")), 60, "the incident's bundle")[0]
        subprocess.run(["nft", "delete", "table", "inet", table], check=True, timeout=10)
        runs = _manifest(bundle)["watch"]["pcap_ring"]
        assert runs["mode"] == "on-trouble" and "tcp_retransmit_skb" in runs["runs"][0]["why"], runs
        assert udp_payloads_in_bundle(bundle, late_port) == late
        assert udp_payloads_in_bundle(bundle, early_port) == [], "sent before the trouble: not tapped"
        assert _tcp_segments_to(bundle, port) >= 1, "the retransmissions after the ring started"
        # --pcap-linger is at least --before + --after + 30 s: then tcpdump stops
        wait_for(lambda: b"packet ring off:" in err.read_bytes(), 90, "the packet ring to stop")
        wait_for(lambda: not _tcpdumps_of(ring), 10, "tcpdump to end")
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, timeout=10)
        for s in (cli, conn, srv):
            s.close()
        w.terminate()
        w.wait(timeout=60)


def test_trigger_without_a_watcher_is_a_clear_error(tmp_path):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    if os.geteuid() == 0 and triggers.live_watchers():
        pytest.skip("a watcher runs on this host")
    p = subprocess.run([PY, "-m", "forensics", "capture", "--trigger"], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=30)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "no stallscope watcher" in p.stderr


# ---------------------------------------------------------------- the lab under watch (root)
# make test watches the clean job 90 s (CI's 30-minute budget); make watch-clean-5min, 5 minutes
CLEAN_S = float(os.environ.get("STALLSCOPE_WATCH_CLEAN_S", "60"))
HANG_AFTER_S, AFTER_S = 5, 5
SMALL = ["--compute-ms", "30", "--buckets", "131072,65536"]


class WatchedRun:
    """A lab job with its own watcher, started before the job: the launcher waits at a gate
    (a shell blocked on a FIFO) while the watcher starts on its pid (--pid: the job's ranks
    are its descendants), then execs."""

    def __init__(self, name: str, base: Path, build: Path, lab_args: list[str], watch_args: list[str]):
        self.name, self.out = name, base / name
        self.bundles = self.out / "bundles"
        self.bundles.mkdir(parents=True)
        gate = base / f"{name}.gate"
        os.mkfifo(gate)
        self.launcher = subprocess.Popen(
            ["sh", "-c", 'read x < "$0"; exec "$@"', str(gate), PY, "-m", "tests.lab.launcher", "--build", str(build),
             "--out", str(self.out / "lab"), *lab_args], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=open(base / f"{name}.launcher.err", "wb"))
        self.err = base / f"{name}.watch.err"
        self.watcher = _watcher(self.bundles, "--pid", str(self.launcher.pid), "--nccl-lib",
                                str(build / "libnccl.so.2"), *watch_args, log=self.err)
        wait_for(lambda: b"capturing:" in self.err.read_bytes() or self.watcher.poll() is not None, 120,
                  f"{name}'s watcher to start")
        assert self.watcher.poll() is None, self.err.read_text()
        self.ring = _ring(self.bundles)[0]
        with open(gate, "w") as fh:
            fh.write("go\n")

    def bundle_list(self) -> list[Path]:
        return sorted(self.bundles.glob("stallscope-*.tar.gz"))

    def truth(self) -> dict:
        return json.loads((self.out / "lab" / "scenario.json").read_text())

    def close(self) -> None:
        for p in (self.watcher, self.launcher):
            if p.poll() is None:
                p.terminate()       # the launcher tears its namespaces down on SIGTERM
        for p in (self.watcher, self.launcher):
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    require_root()
    require_tool("gcc", "make", "ip", "unshare", "bridge", "ss", "nsenter", "tcpdump", "bpftrace", "nft", "tc")
    from tests.lab import netns
    build = tmp_path_factory.mktemp("labbuild") / "build"
    p = subprocess.run(["make", "-C", str(LAB), "all", f"BUILD={build}"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    netns.sweep()
    base = tmp_path_factory.mktemp("watch")
    rng = random.Random(int(os.environ.get("STALLSCOPE_WATCH_SEED", str(int(time.time())))))
    hang_watch = ["--hang-after", f"{HANG_AFTER_S}s", "--after", f"{AFTER_S}s", "--before", "60s"]
    runs = {}
    try:
        # the clean job first: it is watched the longest, with the defaults an operator keeps
        runs["clean"] = WatchedRun("clean", base, build, ["--scenario", "clean", "--ranks", "4", "--steps", "1000000",
                                                          "--run-timeout-s", str(CLEAN_S + 300)] + SMALL,
                                   ["--duration", f"{CLEAN_S:g}s"])
        runs["link-down-hang"] = WatchedRun(
            "link-down-hang", base, build, ["--scenario", "link-down-hang", "--rank", "2", "--ranks", "3",
                                            "--start-s", f"{rng.uniform(4, 15):.1f}", "--hold-s", "35"] + SMALL,
            hang_watch)
        runs["mismatch-hang"] = WatchedRun(
            "mismatch-hang", base, build, ["--scenario", "mismatch-hang", "--rank", "1", "--ranks", "3",
                                           "--at-op", str(rng.randint(120, 450)), "--hold-s", "35"] + SMALL,
            hang_watch)
        yield runs
    finally:
        for r in runs.values():
            r.close()
        assert netns.leftovers() == {"namespaces": [], "pids": [], "links": []}


def _check_hang_bundle(run: WatchedRun, kind: str, link: bool, tmp_path: Path):
    from forensics.analysis import analyze
    run.launcher.wait(timeout=200)
    truth = run.truth()
    onset = truth["fault"]["start_time_ns"]
    bundles = run.bundle_list()
    assert len(bundles) == 1, (bundles, run.err.read_text()[-3000:])   # one bundle per incident
    m = _manifest(bundles[0])
    assert m["trigger"]["kind"] == "hang", m["trigger"]
    # the first archive within --hang-after + 10 s of the onset, its completion --after later
    first = m["watch"].get("first_written_ns", m["ended_ns"])
    assert first - onset <= (HANG_AFTER_S + 10) * S, (first - onset) / S
    assert m["ended_ns"] - onset <= (HANG_AFTER_S + AFTER_S + 20) * S, (m["ended_ns"] - onset) / S
    assert m["watch"]["window_ns"][0] <= onset - 30 * S        # the minutes before the hang are in it
    res = analyze([str(bundles[0])])
    top = res.findings[0]
    assert top.kind == kind, [(f.kind, f.summary) for f in res.findings[:3]]
    assert set(truth["fault"]["ranks"]) <= set(top.ranks), (top.ranks, top.summary)
    assert "hung since" in top.summary, top.summary             # when the hang started
    last = top.details.get("last_progress_ns") if kind == "hang_stuck" else None
    if kind == "hang_stuck":   # the last completed collective before the hang is in the bundle
        assert last is not None and onset - 5 * S <= last <= onset + 2 * S, ((last or 0) - onset) / S
    if link:
        addr = truth["fault"]["link"]["addr"]
        assert any(addr in (lk.get("saddr"), lk.get("daddr")) for lk in top.links), top.links
        retx = [e["timestamp_ns"] for e in top.evidence if "retrans" in str(e.get("event"))]
        assert retx and onset <= min(retx) <= onset + 5 * S, [(t - onset) / S for t in retx[:5]]
    return m


def _state_lines_after(ring: Path, wait_s: float) -> list[str]:
    """The tracer's call-state lines (ring mode) spooled during the next wait_s seconds."""
    segs = lambda: sorted((ring / "bpf" / "raw").glob("seg-*.txt"))   # noqa: E731
    start = {p: p.stat().st_size for p in segs()}
    time.sleep(wait_s)
    out = []
    for p in segs():
        with open(p, "rb") as fh:
            fh.seek(start.get(p, 0))
            out += [l for l in fh.read().decode().splitlines() if l.startswith("@op[")]
    return out


def test_link_down_hang_under_watch(watched, tmp_path):
    run = watched["link-down-hang"]
    _check_hang_bundle(run, "hang_stuck", True, tmp_path)
    # the job is gone: the tracer forgot its threads' call state (ring mode prints it every second)
    time.sleep(2)
    state = _state_lines_after(run.ring, 3)
    assert [l for l in state if not l.endswith(", 0, 0, 0, 0, 0, 0)")] == [], state[:5]
    # SIGTERM: the watcher ends, its children stop, the rings go, no bundle of its own
    run.watcher.send_signal(signal.SIGTERM)
    assert run.watcher.wait(timeout=90) == 0, run.err.read_text()[-2000:]
    assert not run.ring.exists() and not _children_of_ring(run.ring)
    assert len(run.bundle_list()) == 1 and not list(run.bundles.glob(".*staging*"))
    assert not (triggers.registry_dir() / f"watch-{run.watcher.pid}.json").exists()


def test_mismatch_hang_under_watch(watched, tmp_path):
    run = watched["mismatch-hang"]
    m = _check_hang_bundle(run, "hang_mismatch", False, tmp_path)
    stuck = set(m["trigger"]["pids"])
    ranks = {p["pid"]: p.get("rank") for p in m["processes"]}
    assert 1 not in {ranks.get(p) for p in stuck}, "the rank that skipped is not inside a collective"
    run.watcher.send_signal(signal.SIGKILL)
    run.watcher.wait(timeout=10)
    wait_for(lambda: not _children_of_ring(run.ring), 15, "the watcher's children to stop")
    wait_for(lambda: not run.ring.exists(), 15, "the guardian to remove the rings")


def test_clean_job_under_watch_writes_no_bundle(watched):
    run = watched["clean"]
    rc = run.watcher.wait(timeout=CLEAN_S + 240)
    err = run.err.read_text()
    assert rc == 0, err[-3000:]
    assert run.bundle_list() == [], err[-3000:]
    assert "TRIGGER" not in err
    assert run.launcher.poll() is None, "the job outlived its watcher"
    assert not run.ring.exists() and not list(run.bundles.glob(".*staging*"))
