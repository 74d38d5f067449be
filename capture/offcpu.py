"""Off-CPU time of the job's threads, sampled from /proc at no cost to the job.

A bpftrace ``sched_switch`` probe would run on every context switch of the
machine (the job's, and everyone else's) and cost the job several percent;
the kernel already keeps what is needed per thread:
``/proc/PID/task/TID/schedstat`` = time on the CPU, time waiting on a run
queue, timeslices (ns, since the thread started). Sampled every few seconds,
``elapsed - on-CPU`` is the thread's off-CPU time (blocked, or runnable but
waiting), and the run-queue part separates "waiting for something" from "the
CPU was taken". Readable without root for everyone's threads.

Each sample is one ``offcpu`` event a thread: ``t`` (CLOCK_MONOTONIC ns, like
the tracer's), ``pid``, ``tid``, ``name``, ``state`` (R, S, D, ...), ``ns``
(off-CPU since the thread was first sampled), ``oncpu_ns`` and ``runq_ns``
(the kernel's totals since the thread started).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def thread_times(pid: int) -> list[tuple[int, str, str, int, int]]:
    """(tid, name, state, on_cpu_ns, runqueue_ns) of every thread of pid."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        if not t.isdigit():
            continue
        sched = _read(f"/proc/{pid}/task/{t}/schedstat")
        stat = _read(f"/proc/{pid}/task/{t}/stat")
        if not sched or not stat:
            continue
        try:
            run, wait = (int(x) for x in sched.split()[:2])
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            state = stat[stat.rindex(")") + 2:].split(" ", 1)[0]
        except (ValueError, IndexError):
            continue
        out.append((int(t), name, state, run, wait))
    return out


class OffCpuSampler:
    """Appends ``offcpu`` samples to a JSONL file, within max_bytes (the last sample always)."""

    def __init__(self, path: Path, max_bytes: int, ring: bool = False):
        self.path = Path(path)
        self.ring = ring          # watch: past max_bytes / 2 the file becomes <name>.1 (the older half)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max(0, int(max_bytes))
        self.bytes = 0
        self.samples = 0
        self.skipped = 0          # periodic samples left out: byte share used
        self.first: dict[tuple[int, int], tuple[int, int]] = {}   # (pid, tid) -> (t, on_cpu) first seen

    def sample(self, pids, final: bool = False) -> int:
        t = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        lines = []
        for pid in pids:
            for tid, name, state, run, wait in thread_times(pid):
                t0, run0 = self.first.setdefault((pid, tid), (t, run))
                off = max(0, (t - t0) - (run - run0))
                lines.append(json.dumps({"ev": "offcpu", "t": t, "pid": pid, "tid": tid, "name": name,
                                         "state": state, "ns": off, "oncpu_ns": run, "runq_ns": wait},
                                        separators=(",", ":")))
        if not lines:
            return 0
        blob = ("\n".join(lines) + "\n").encode()
        if self.ring and self.bytes + len(blob) > self.max_bytes // 2:
            try:
                os.replace(self.path, self.path.with_name(f"{self.path.stem}.1{self.path.suffix}"))
            except OSError:
                pass
            self.bytes = 0
        elif not final and self.bytes + len(blob) > self.max_bytes:
            self.skipped += 1
            return 0
        with open(self.path, "ab") as fh:
            fh.write(blob)
        self.bytes += len(blob)
        self.samples += 1
        return len(lines)
