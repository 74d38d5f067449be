"""``stallscope capture --watch``: the black box. Runs next to the jobs of a host for days,
keeps the last minutes of every continuous collector in bounded rings, and writes a normal
bundle when a hang starts.

What runs is a :class:`capture.runner.Capture` in ring mode (the tracer's spool drops its
segments by age, tcpdump rotates through ``-C/-W`` files, the ss series and off-CPU samples
keep two files each), in a hidden staging folder in the output folder, with no end. Each
0.2 s tick of its loop the :class:`Watcher` checks its triggers:

- **hang**: :class:`RingMonitor` reads the calls' state the tracer prints every second (its
  records stay in a ring in the kernel, printed at a trigger and at the cut: bpf/README.md,
  "Ring mode"; :class:`ProgressMonitor` reads every record where the ring cannot be used); a process
  with a collective in flight (an NCCL collective entered since its last returned host wait,
  and a call of it still open: the collective or the synchronize after it) and nothing
  returned for ``--hang-after`` (default: the larger of 30 s and 10x the slowest collective
  completed in the last 5 minutes on this host);
- **log**: :class:`LogWatch` tails the job's NCCL_DEBUG_FILE logs and stdout/stderr files for
  ``NCCL WARN`` lines and PyTorch watchdog timeouts;
- **on demand**: SIGUSR1, ``stallscope capture --trigger`` or the trigger file
  (``--trigger-file``, default ``<output>/stallscope.trigger``).

The packet ring runs on trouble (``--pcap-ring on-trouble``, the default): tcpdump taps the
job's interfaces only from TCP trouble the tracer reports in the job's namespaces, or a
trigger, on, until ``--pcap-linger`` passes without either (a tap costs the job's own threads
a copy of every packet; the onset itself is in the tracer's TCP events).

An incident starts at its first trigger. ``--after`` later the watcher cuts the bundle: the
rings' last ``--before`` (and the ``--after`` that followed) are copied into the incident's
own staging folder, the state of the job is taken then (the snapshots of a capture's end,
native stacks for a hang, Flight Recorder dumps through their pipes, the logs), and the
bundle is written with ``"trigger"`` and ``"watch"`` in its manifest; its name carries the
trigger's time, so the bundles of one incident from every host sort together. Triggers
during an incident, and for ``--cooldown`` after it, are folded into it (one bundle per
incident); a hang of the same processes triggers again only after they made progress.

SIGTERM/SIGINT end the watcher: an incident already triggered is written with what the
rings hold, every child stops, the rings are removed. A SIGKILLed watcher's guardian stops
the children and removes the rings as well, unless an incident was pending: then they stay
as a capture's staging folder does (``--recover`` makes a partial bundle of them).
"""
from __future__ import annotations

import collections
import copy
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import bundle as bd
from . import children, procs, tracer
from .runner import (DISK_FULL, STAGED_MANIFEST, Capture, CaptureFailed, CaptureResult, CaptureUsageError,
                     clock_sample, fit_budget, lock_staging, ring_previous, tcpdump_files, utc_span)

PENDING = ".incident-pending"        # in the ring's staging folder while an incident's data are only there
TRIGGER_NAME = "stallscope.trigger"
SLOWEST_WINDOW_S = 300.0             # --hang-after auto: the slowest collective of the last 5 minutes
HANG_AFTER_FLOOR_S = 30.0
WATCH_FLUSH_MS = 1000                # the tracer's call state printed this often (no ring: its records)
HANG_AFTER_FACTOR = 10.0
LOG_PATHS_EVERY_S = 10.0             # the job's log files looked for again this often (and when its processes change)
RING_SLACK_S = 30.0                  # the rings keep --before + --after + this
RING_DUMP_WAIT_S = 10.0              # the cut waits this long for the tracer's ring dump to be spooled
# the tracer's events that start the packet ring (--pcap-ring on-trouble): a kernel retransmission
# (timeout, fast retransmit, tail loss probe) or a reset sent or received
TCP_TROUBLE = (b'{"ev":"tcp_retransmit_skb"', b'{"ev":"tcp_send_reset"', b'{"ev":"tcp_receive_reset"')
MAX_TROUBLE = 1000                   # kept between two polls
# ... this many of them within PCAP_ARM_WINDOW_S: a busy host retransmits now and then with nothing
# wrong (a tail loss probe, a spurious timeout under CPU contention); a dead link or a loss burst
# retransmits again within a second or two (RTO backoff 0.2, 0.4, 0.8 s ...)
PCAP_ARM_EVENTS = 3
PCAP_ARM_WINDOW_S = 10.0


def registry_dir() -> Path:
    """Where running watchers say who they are (``--trigger`` finds them there)."""
    if os.geteuid() == 0:
        return Path("/run/stallscope")
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"stallscope-{os.geteuid()}"


@dataclass
class Trigger:
    kind: str                  # hang | log | on-demand
    reason: str
    realtime_ns: int
    monotonic_ns: int
    pids: list[int] = field(default_factory=list)
    source: str | None = None

    def to_manifest(self) -> dict:
        return {"kind": self.kind, "reason": self.reason, "realtime_ns": self.realtime_ns,
                "monotonic_ns": self.monotonic_ns, "pids": self.pids, "source": self.source}


# --------------------------------------------------------------------------- the hang trigger
class ProgressMonitor:
    """The tracer's raw lines (capture.tracer.Spool's segments), read as they are spooled, into
    what each traced process is doing: its open calls, its last return, and whether a
    collective is in flight (one entered after the last host wait that returned). Times are
    the tracer's CLOCK_MONOTONIC ns. bpftrace prints a flush's records unsorted: each poll's
    records are taken in time order, and a return read before its entry (a flush split
    between two polls) is kept until the entry comes."""

    MAX_EARLY = 100_000

    def __init__(self, raw_dir: Path, call_returns: bool = True, max_read: int = 16 << 20):
        self.raw_dir = Path(raw_dir)
        self.call_returns = call_returns
        self.max_read = max_read
        self.pos: dict[str, int] = {}
        self.open: dict[tuple[int, int], tuple[int, int]] = {}     # (tid, t0) -> (pid, kind)
        self.early: dict[tuple[int, int], int] = {}                # (tid, t0) -> t1: a return before its entry
        self.last_return: dict[int, int] = {}                      # pid -> t1 of its last returned call
        self.last_coll: dict[int, int] = {}                        # pid -> t0 of its last collective
        self.last_wait: dict[int, int] = {}                        # pid -> t0 of its last returned host wait
        # (t1, ns) of host waits after collectives, the window's maximum in front: each entry is
        # longer than every later one (one that is not can never be the slowest again), so the
        # deque stays short where it held every wait of 5 minutes (300k at 1,000 steps/s)
        self.durations: collections.deque = collections.deque()
        self.lines = 0
        self.trouble: list[dict] = []                              # TCP trouble events since take_trouble

    def scan(self, data: bytes) -> list[tuple[bytes, ...]]:
        from .tracer import PROGRESS_RE
        return PROGRESS_RE.findall(data)

    def poll(self) -> int:
        """Read what was spooled since the last call; returns the hot-path records read."""
        segs = sorted(self.raw_dir.glob("seg-*.txt"))
        names = {p.name for p in segs}
        for gone in [n for n in self.pos if n not in names]:
            del self.pos[gone]
        budget, found = self.max_read, []
        for p in segs:
            off = self.pos.get(p.name, 0)
            try:
                size = p.stat().st_size
                if size <= off:
                    continue
                with open(p, "rb") as fh:
                    fh.seek(off)
                    data = fh.read(min(size - off, budget))
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1
            if not cut:
                continue
            self.pos[p.name] = off + cut
            budget -= cut
            data = data[:cut]
            # the hot path's records, several thousand a second: one regular-expression pass
            # over the chunk (the watcher's main cost), fields converted where they are used
            found += self.scan(data)
            if b'{"ev":"tcp_' in data:
                for line in data.split(b"\n"):
                    if line.startswith(TCP_TROUBLE) and len(self.trouble) < MAX_TROUBLE:
                        try:
                            self.trouble.append(json.loads(line))
                        except ValueError:
                            pass
            if budget <= 0:
                break
        self._records(found)
        self.lines += len(found)
        return len(found)

    def _records(self, found: list[tuple[bytes, ...]]) -> None:
        """A poll's records (tid, key, kind, pid, slot a, t1 of bpf/nccl.bt's tuple, as bytes),
        in time order: the key (an entry's t0, a return record's t1), as bpftrace prints a flush
        unsorted. A return read before its entry waits in ``early`` for it."""
        from .tracer import RET_KIND
        recs = sorted((int(k), t, kd, pid, a, t1) for t, k, kd, pid, a, t1 in found)
        lc, lr, opn, early = self.last_coll, self.last_return, self.open, self.early
        returns = self.call_returns
        for key2, tid, kind, pid, a, t1 in recs:
            kind = int(kind)
            if kind == RET_KIND:                  # a return: (tid, t0 in slot a), t1 the key
                tid, t0 = int(tid), int(a)
                entry = opn.pop((tid, t0), None)
                if entry is None:
                    if len(early) < self.MAX_EARLY:
                        early[(tid, t0)] = key2
                    pid = int(pid)
                    if key2 > lr.get(pid, 0):
                        lr[pid] = key2
                else:
                    self._returned(entry[0], entry[1], t0, key2)
                continue
            if 16 <= kind < 32:                   # ncclGroupStart/End: not evidence either way
                continue
            pid, t0 = int(pid), key2
            if kind < 16:
                if t0 > lc.get(pid, -1):
                    lc[pid] = t0
                if not returns:                   # no return traced: the call is a launch, done
                    continue
            t1 = int(t1) or (early.pop((int(tid), t0), 0) if early else 0)
            if not t1:
                opn[(int(tid), t0)] = (pid, kind)
            elif kind < 32:                       # a collective that returned within the flush
                if t1 > lr.get(pid, 0):
                    lr[pid] = t1
            else:
                self._returned(pid, kind, t0, t1)

    def _returned(self, pid: int, kind: int, t0: int, t1: int) -> None:
        if t1 > self.last_return.get(pid, 0):
            self.last_return[pid] = t1
        if kind >= 32:                            # a host wait: what was launched before it is done
            if self.last_coll.get(pid, -1) < t0 and t1 >= t0 and self.in_flight(pid):
                d, q = t1 - t0, self.durations
                while q and q[-1][1] <= d:
                    q.pop()
                q.append((t1, d))
            if t0 > self.last_wait.get(pid, 0):
                self.last_wait[pid] = t0

    def in_flight(self, pid: int) -> bool:
        """A collective entered after the last host wait that returned was entered."""
        return self.last_coll.get(pid, -1) > self.last_wait.get(pid, -1)

    def slowest_ns(self, now_ns: int, window_s: float = SLOWEST_WINDOW_S) -> int:
        q = self.durations
        while q and q[0][0] < now_ns - window_s * 1e9:
            q.popleft()
        return q[0][1] if q else 0

    def stuck(self, now_ns: int, after_ns: int) -> list[dict]:
        """Processes with a collective in flight and nothing returned for after_ns: each with
        its oldest open call and the time since it last made progress."""
        oldest: dict[int, tuple[int, int]] = {}
        for (tid, t0), (pid, kind) in self.open.items():
            if pid not in oldest or t0 < oldest[pid][0]:
                oldest[pid] = (t0, kind)
        out = []
        for pid, (t0, kind) in sorted(oldest.items()):
            if kind >= 16 and not self.in_flight(pid):
                continue                          # a synchronize with no collective before it: compute
            since = max(t0, self.last_return.get(pid, 0))
            if now_ns - since >= after_ns:
                out.append({"pid": pid, "open_since_ns": t0, "quiet_ns": now_ns - since, "kind": kind,
                            "last_collective_ns": self.last_coll.get(pid)})
        return out

    def take_trouble(self) -> list[dict]:
        """The tracer's TCP trouble events (retransmissions, resets) read since the last call."""
        out, self.trouble = self.trouble, []
        return out

    def forget(self, pids) -> None:
        """Processes that are gone: their open calls will never return."""
        dead = set(pids)
        for k in [k for k, v in self.open.items() if v[0] in dead]:
            del self.open[k]
        for d in (self.last_return, self.last_coll, self.last_wait):
            for p in dead:
                d.pop(p, None)


# @op[tid, class]: (t0 of the open call or 0, slot, pid, t0 and t1 of the last return, its second,
# the second's longest host wait after a collective, a launched collective's entry stack pointer and
# return address); see bpf/nccl.bt, block state
STATE_RE = re.compile(rb"^@op\[(\d+), (\d+)\]: \((\d+), \d+, (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\)"
                      rb"[ \t\r]*$", re.M)
KIND_OF_CLASS = {0: 0, 1: 32, 2: 16}      # a class's kind as ProgressMonitor knows it (collective, wait, group)


class RingMonitor(ProgressMonitor):
    """The same questions answered from the tracer's ring mode (``capture --watch``): the
    records stay in the kernel, and every second the tracer prints each thread's call state
    instead (a few lines a thread, however many calls it made): its open call of each class,
    its last returned one, and the longest host wait after a collective of that second. A
    line replaces what the thread's class said before. ``ring_dumps`` counts the dumps of the
    record ring read (the watcher waits for one at the cut).

    Without the collectives' returns (the watcher's default: a uretprobe is the costliest part
    of the tracer) a collective is a launch; a thread whose last call was one, in a process with
    a collective in flight and quiet for --hang-after, is stuck when it is still inside that
    call: ``stuck(..., inside=capture.procs.inside_call)`` asks with the stack pointer at the
    call's entry and the return address there."""

    ASK_AGAIN_S = 5.0          # a thread that could not be told (running) is asked again this much later

    def __init__(self, raw_dir: Path, call_returns: bool = True, max_read: int = 16 << 20):
        super().__init__(raw_dir, call_returns, max_read)
        self.cls_open: dict[tuple[int, int], int] = {}     # (tid, class) -> t0 of its open call
        self.seen_longest: dict[int, tuple[bytes, bytes]] = {}
        self.ring_dumps = 0
        self.launches: dict[int, tuple[int, int, int, int]] = {}   # tid -> (pid, t0, entry sp, return address)
        self.thread_last: dict[int, int] = {}                      # tid -> its latest entry or return
        self.asked: dict[tuple[int, int], tuple[bool | None, int]] = {}   # (tid, t0) -> (inside?, when)

    def scan(self, data: bytes) -> list[tuple[bytes, ...]]:
        from .tracer import RING_DUMP_TAG
        self.ring_dumps += data.count(RING_DUMP_TAG)
        return STATE_RE.findall(data)

    def _records(self, found: list[tuple[bytes, ...]]) -> None:
        lc, lr, lw, opn, cls_open = self.last_coll, self.last_return, self.last_wait, self.open, self.cls_open
        last = self.thread_last
        for tid, cls, t0, pid, lt0, lt1, sec, longest, sp, ret in found:
            pid = int(pid)
            if not pid:
                continue
            tid, cls, t0, lt0, lt1 = int(tid), int(cls), int(t0), int(lt0), int(lt1)
            newest = max(t0, lt0, lt1)
            if newest > last.get(tid, 0):
                last[tid] = newest
            if sp != b"0" and not self.call_returns:
                self.launches[tid] = (pid, lt0, int(sp), int(ret))
            prev = cls_open.get((tid, cls))
            if prev is not None and prev != t0:
                opn.pop((tid, prev), None)
                del cls_open[(tid, cls)]
            if t0:
                opn[(tid, t0)] = (pid, KIND_OF_CLASS.get(cls, 16))
                cls_open[(tid, cls)] = t0
            if lt1 > lr.get(pid, 0):
                lr[pid] = lt1
            if cls == 0:
                c = max(t0, lt0)
                if c > lc.get(pid, -1):
                    lc[pid] = c
            elif cls == 1:
                if lt0 > lw.get(pid, 0):
                    lw[pid] = lt0
                if longest != b"0" and self.seen_longest.get(tid) != (sec, longest):
                    self.seen_longest[tid] = (sec, longest)
                    d, q = int(longest), self.durations
                    while q and q[-1][1] <= d:
                        q.pop()
                    q.append((lt1, d))

    def stuck(self, now_ns: int, after_ns: int, inside=None) -> list[dict]:
        out = super().stuck(now_ns, after_ns)
        if inside is None:
            return out
        seen = {s["pid"] for s in out}
        for tid, (pid, t0, sp, ret) in sorted(self.launches.items()):
            if pid in seen or self.thread_last.get(tid) != t0 or not self.in_flight(pid):
                continue                          # the thread called something since, or nothing is in flight
            since = max(t0, self.last_return.get(pid, 0))
            if now_ns - since < after_ns or not self._inside(inside, now_ns, pid, tid, t0, sp, ret):
                continue
            seen.add(pid)
            out.append({"pid": pid, "open_since_ns": t0, "quiet_ns": now_ns - since, "kind": 0,
                        "last_collective_ns": self.last_coll.get(pid), "tid": tid, "inside_launch": True})
        return out

    def _inside(self, inside, now_ns: int, pid: int, tid: int, t0: int, sp: int, ret: int) -> bool:
        """inside(), remembered: a thread that returned from a launch stays returned from it; one that
        could not be told (running) is asked again after ASK_AGAIN_S."""
        key = (tid, t0)
        known = self.asked.get(key)
        if known is not None and (known[0] is False or now_ns - known[1] < self.ASK_AGAIN_S * 1e9):
            return bool(known[0])
        verdict = inside(pid, tid, sp, ret)
        if len(self.asked) > 10_000:
            self.asked.clear()
        self.asked[key] = (verdict, now_ns)
        return bool(verdict)

    def forget(self, pids) -> None:
        super().forget(pids)
        opn, dead = self.open, set(pids)
        for k in [k for k, t0 in self.cls_open.items() if (k[0], t0) not in opn]:
            del self.cls_open[k]
        for tid in [t for t, v in self.launches.items() if v[0] in dead]:
            del self.launches[tid]
            self.thread_last.pop(tid, None)


# --------------------------------------------------------------------------- the log trigger
# each starts with a literal, which re finds at memchr speed: an alternation, or a leading
# character class ("[Cc]ollective"), makes re try every byte of a chatty job's logs (60x slower:
# a third of the watcher's CPU with the lab's per-step log lines)
LOG_PATTERNS = (
    (re.compile(rb" NCCL WARN "), "NCCL WARN"),
    (re.compile(rb"ProcessGroupNCCL.{0,80}[Tt]imeout"), "PyTorch watchdog timeout"),
    # "Watchdog caught collective operation timeout", "Collective operation timeout" ...
    (re.compile(rb"ollective operation timeout"), "PyTorch watchdog timeout"),
)


class LogWatch:
    """Tails the job's log files (appended lines only: what a file held when first seen is
    not news) for the lines of LOG_PATTERNS."""

    def __init__(self, max_read: int = 1 << 20):
        self.pos: dict[tuple[int, int], int] = {}
        self.max_read = max_read

    def poll(self, paths: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
        """(path, why) -> matches (path, what, line) in the lines appended since the last call."""
        hits, seen = [], set()
        for path, why in paths:
            try:
                st = os.stat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            off = self.pos.get(key)
            if off is None or st.st_size < off:          # new (or truncated): from its end now
                self.pos[key] = st.st_size if off is None else 0
                if off is None:
                    continue
                off = 0
            if st.st_size == off:
                continue
            start = max(off, st.st_size - self.max_read)
            try:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    data = fh.read(st.st_size - start)
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1
            self.pos[key] = start + cut
            data = data[:cut]
            # a chunk at a time (a chatty job logs a line per step): the lines a pattern matched
            found: dict[int, str] = {}
            for rx, what in LOG_PATTERNS:
                for m in rx.finditer(data):
                    found.setdefault(data.rfind(b"\n", 0, m.start()) + 1, what)
            for s0 in sorted(found):
                line = data[s0:data.find(b"\n", s0)]
                hits.append((path, found[s0], line.decode("utf-8", "replace").strip()[:300]))
        return hits


# --------------------------------------------------------------------------- the watcher
class Watcher(Capture):
    """A Capture in ring mode with triggers; see the module's text."""

    def __init__(self, opts, stderr=None):
        super().__init__(opts, stderr=stderr)
        o = self.o
        self.ring = True
        self.ring_age_s = o.before_s + o.after_s + RING_SLACK_S
        self.tracer_flush_ms = WATCH_FLUSH_MS
        self.tracer_ring = True
        self.monitor: ProgressMonitor | None = None
        self.stuck_kw: dict = {}
        self.logwatch = LogWatch()
        self.logs_found: tuple[float, frozenset, list] | None = None    # (when, pids, log_paths())
        self.incident: dict | None = None           # the open incident: triggers, due time
        self.last_incident_end = -1e18              # monotonic s
        self.cleared: dict[int, int] = {}           # pid -> last_return when its hang was reported
        self.bundles: list[Path] = []
        self.usr1 = False
        self.next_check = 0.0
        self.next_logs = 0.0
        self.next_prune = 0.0
        self.last_status = time.monotonic()
        self.dead_since: dict[int, float] = {}
        self.registry: Path | None = None
        self.folder: Path | None = None
        self.trigger_path: Path | None = None
        self.incident_window0 = 0
        # the packet ring (--pcap-ring): on-trouble runs tcpdump only from TCP trouble or a trigger on
        self.pcap_on_trouble = o.pcap and o.bpf and o.pcap_ring == "on-trouble"
        self.pcap_linger_s = max(o.pcap_linger_s, self.ring_age_s)
        self.pcap_armed = False
        self.pcap_gen = 1                            # the ring's runs: the second one's files are -r2...
        self.pcap_last_trouble = -1e18               # monotonic s
        self.pcap_wanted: dict = {}                  # (netns inode, iface) -> (NetNs, iface): the job's
        self.pcap_done: list[dict] = []              # tcpdumps of earlier runs, their files still in the ring
        self.pcap_runs: list[dict] = []              # when each run started and stopped, and why
        self.pcap_trouble: collections.deque = collections.deque()   # (monotonic s, event) lately

    # ---------------------------------------------------------------- lifecycle
    def run(self) -> CaptureResult:
        o = self.o
        folder = Path(o.output or ".")
        if o.output and (o.output.endswith(".tar.gz") or o.output.endswith(".tgz")):
            raise CaptureUsageError("--watch writes one bundle per incident: -o takes a folder")
        if not folder.is_dir():
            raise CaptureUsageError(f"output folder {folder} does not exist")
        self.check_targets()
        if o.ring_bytes < 8 * bd.MIN_BUDGET:
            raise CaptureUsageError(f"--ring-bytes must be at least {8 * bd.MIN_BUDGET // 1024}k")
        self.folder = folder.resolve()
        self.trigger_path = Path(o.trigger_file) if o.trigger_file else self.folder / TRIGGER_NAME
        self.arcroot = f"stallscope-{self.host}-{bd.utc_stamp(self.started_ns)}-watch"
        self.out_path = self.folder / f"{self.arcroot}.tar.gz"     # never written: the rings' name
        self.staging = self.folder / f".{self.arcroot}.staging-{os.getpid()}"
        self.staging.mkdir(parents=True)
        self.lock_fh = lock_staging(self.staging)
        self.budget = bd.Budget.plan(o.ring_bytes, pcap=o.pcap, tracer=o.bpf)
        self.yield_cpu()
        old = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        old[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self.on_usr1)
        try:
            try:
                self.guardian = children.Guardian(self.staging, ring_marker=PENDING)
                children.set_guardian(self.guardian)
            except OSError as e:
                self.notes.append(f"no guardian process ({e}): children other than the direct ones may "
                                  "outlive a killed watcher")
            self.register()
            self.log(f"watching: rings in {self.staging.name} (at most {o.ring_bytes >> 20} MiB), bundles into "
                     f"{self.folder}; packets: "
                     f"{'from TCP trouble on' if self.pcap_on_trouble else 'always' if o.pcap else 'off'}; "
                     f"hang after {self.hang_after_text()}, {o.before_s:g}s before and "
                     f"{o.after_s:g}s after a trigger; on demand: stallscope capture --trigger, SIGUSR1 "
                     f"(pid {os.getpid()}) or touch {self.trigger_path}")
            self.capture()
            self.log("stopping the watcher")
            if self.incident is not None:        # triggered, not yet written: write it with what is there
                self.cut()
        finally:
            self.stop_all()
            for s, h in old.items():
                signal.signal(s, h)
            self.pool.shutdown(wait=False, cancel_futures=True)
            children.set_guardian(None)
            if self.guardian is not None:
                self.guardian.close()
            if not (self.staging / PENDING).exists():
                shutil.rmtree(self.staging, ignore_errors=True)
            if self.lock_fh is not None:
                self.lock_fh.close()
            if self.registry is not None:
                self.registry.unlink(missing_ok=True)
        code = 3 if any(b is None for b in self.bundles) else 0
        return CaptureResult(path=self.folder, exit_code=code, manifest={"bundles": [str(b) for b in self.bundles]})

    def register(self) -> None:
        try:
            d = registry_dir()
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.registry = d / f"watch-{os.getpid()}.json"
            self.registry.write_text(json.dumps({"pid": os.getpid(), "output": str(self.folder),
                                                 "trigger_file": str(self.trigger_path),
                                                 "started_ns": self.started_ns}))
        except OSError as e:
            self.registry = None
            self.notes.append(f"not registered for --trigger ({e}): SIGUSR1 or the trigger file still work")

    def on_usr1(self, signum, frame) -> None:
        self.usr1 = True

    def stop_all(self) -> None:
        """The children, as a capture's end stops them (no bundle of the rings themselves)."""
        self.stacks_cancel.set()
        self.stop_nccl_tests()
        self.stop_tracer_quiet()
        for t in self.tcpdumps.values():
            if t.get("proc") is not None:
                children.stop(t["proc"], signal.SIGINT, grace_s=3)
                t["fh"].close()
                t["proc"] = None

    def stop_tracer_quiet(self) -> None:
        if self.tracer_proc is not None and self.tracer_proc.poll() is None:
            children.stop(self.tracer_proc, signal.SIGINT, grace_s=10)
            if self.spool is not None:
                self.spool.join(timeout=10)
            self.tracer_stderr.close()

    def start_tracer(self) -> None:
        super().start_tracer()
        if self.tracer_proc is not None:
            ring = (self.collectors.get("tracer") or {}).get("ring_slots")
            self.monitor = (RingMonitor if ring else ProgressMonitor)(self.raw_dir, call_returns=self.o.call_returns)
            if ring and not self.o.call_returns:      # a launched collective: is the thread still inside it?
                self.stuck_kw = {"inside": procs.inside_call}
            if not ring:
                self.notes.append("the tracer prints every record (no libc to attach its ring dump to): the watch "
                                  "costs the job more")
        elif self.pcap_on_trouble:
            self.pcap_on_trouble = False
            self.notes.append("--pcap-ring on-trouble: no tracer to see TCP trouble, the packet ring runs all "
                              "the time")

    # ---------------------------------------------------------------- the packet ring
    def start_tcpdumps(self, pairs) -> None:
        """The job's interfaces are remembered; tcpdump starts on them now only when the packet
        ring runs (--pcap-ring always, or TCP trouble since --pcap-linger)."""
        for ns, iface in pairs:
            self.pcap_wanted.setdefault((ns.inode, iface), (ns, iface))
        if not self.pcap_on_trouble or self.pcap_armed:
            super().start_tcpdumps(pairs)
        elif pairs and not (self.collectors.get("tcpdump") or {}).get("waiting"):
            self.pcap_waiting("no TCP trouble seen yet")

    def pcap_waiting(self, why: str) -> None:
        self.record("tcpdump", status="skipped", waiting=True,
                    reason=f"--pcap-ring on-trouble: {why}; the packet ring starts when the tracer sees "
                           f"{PCAP_ARM_EVENTS} TCP retransmissions or resets within {PCAP_ARM_WINDOW_S:g}s in the "
                           "job's namespaces, or at a trigger")

    def tcpdump_tag(self) -> str:
        return f"-r{self.pcap_gen}" if self.pcap_gen > 1 else ""

    def ring_plan(self) -> list[str]:
        """--pcap-ring on-trouble: each run of the ring gets half the interface's share. A run
        lasts at least --pcap-linger (no shorter than the rings' age), so when one starts only the
        run before it can still have files in the ring: the two stay within the share."""
        if not self.pcap_on_trouble:
            return super().ring_plan()
        full = self.pcap_slot_bytes
        self.pcap_slot_bytes = full // 2
        try:
            return super().ring_plan()
        finally:
            self.pcap_slot_bytes = full

    def arm_pcap(self, why: str) -> None:
        """TCP trouble or a trigger: the packet ring runs (again) for --pcap-linger from now."""
        self.pcap_last_trouble = time.monotonic()
        if not self.pcap_on_trouble or self.pcap_armed:
            return
        self.pcap_armed = True
        with self.lock:
            if (self.collectors.get("tcpdump") or {}).get("waiting"):
                del self.collectors["tcpdump"]
        self.pcap_runs = self.pcap_runs[-19:] + [{"started_ns": time.time_ns(), "why": why}]
        self.start_tcpdumps(list(self.pcap_wanted.values()))     # returns once they listen
        self.log(f"packet ring on ({why})")

    def disarm_pcap(self) -> None:
        """--pcap-linger without TCP trouble or a trigger: tcpdump stops; the files of its run
        stay in the ring until they are older than the rings keep."""
        self.pcap_armed = False
        for k, t in list(self.tcpdumps.items()):
            if t.get("proc") is None:
                continue                  # skipped (its reason stands): not a run of the ring
            children.stop(t["proc"], signal.SIGINT, grace_s=3)
            t["fh"].close()
            del self.tcpdumps[k]
            self.pcap_done.append(t)
        self.pcap_gen += 1
        if self.pcap_runs:
            self.pcap_runs[-1]["stopped_ns"] = time.time_ns()
        self.pcap_waiting(f"stopped after {self.pcap_linger_s:g}s without TCP trouble")
        self.log(f"packet ring off: no TCP trouble for {self.pcap_linger_s:g}s")

    def check_pcap(self) -> None:
        if not self.pcap_on_trouble or self.monitor is None:
            return
        ours = {ns.inode for ns in self.netns.values()}
        now = time.monotonic()
        recent = self.pcap_trouble
        for e in self.monitor.take_trouble():
            if not e.get("netns") or e.get("netns") in ours:
                recent.append((now, e))
        while recent and (recent[0][0] < now - PCAP_ARM_WINDOW_S or len(recent) > MAX_TROUBLE):
            recent.popleft()
        if len(recent) >= PCAP_ARM_EVENTS:
            e = recent[0][1]
            self.arm_pcap(f"{len(recent)} TCP trouble events within {PCAP_ARM_WINDOW_S:g}s, the first "
                          f"{e.get('ev')} {e.get('saddr') or e.get('saddr6')}:{e.get('sport')} > "
                          f"{e.get('daddr') or e.get('daddr6')}:{e.get('dport')}")
        elif (self.pcap_armed and self.incident is None
              and time.monotonic() - self.pcap_last_trouble > self.pcap_linger_s):
            self.disarm_pcap()

    def start_native_stacks(self) -> None:
        """No stacks at the start of a watch: they are taken at an incident (capture.watch.cut)."""

    def progress(self, t_capture0: float, force: bool = False) -> None:
        """A status line every --status-every s (a watcher runs for days: not every 5 s)."""
        now = time.monotonic()
        if self.o.progress == "off" or (not force and now - self.last_status < self.o.status_every_s):
            return
        self.last_status = now
        self.log(f"watching {len(self.procs)} NCCL process(es); tracer lines {self.spool.lines if self.spool else 0}"
                 f"; packets {self.tcpdump_packets()}"
                 + ("" if not self.pcap_on_trouble else f" (packet ring {'on' if self.pcap_armed else 'off'})")
                 + f"; rings {self.staged_bytes() >> 20} MiB; bundles written "
                 f"{len([b for b in self.bundles if b])}")

    # ---------------------------------------------------------------- triggers
    def hang_after_ns(self, now_ns: int) -> int:
        if self.o.hang_after_s:
            return int(self.o.hang_after_s * 1e9)
        slowest = self.monitor.slowest_ns(now_ns) if self.monitor else 0
        return int(max(HANG_AFTER_FLOOR_S * 1e9, HANG_AFTER_FACTOR * slowest))

    def hang_after_text(self) -> str:
        if self.o.hang_after_s:
            return f"{self.o.hang_after_s:g}s"
        return f"max({HANG_AFTER_FLOOR_S:g}s, {HANG_AFTER_FACTOR:g}x the slowest collective of the last 5 min)"

    def tick(self, now: float) -> None:
        if now >= self.next_check:
            self.next_check = now + 0.5
            self.check_hang()
            self.check_on_demand()
        if now >= self.next_logs:
            self.next_logs = now + 2.0
            self.check_logs()
        if now >= self.next_prune:
            self.next_prune = now + 10.0
            self.prune()
        if self.incident is not None and time.monotonic() >= self.incident["due"]:
            self.cut()

    def fire(self, trig: Trigger) -> None:
        self.arm_pcap(f"{trig.kind} trigger")       # the packets of the --after window
        now = time.monotonic()
        if self.incident is not None:
            self.incident["triggers"].append(trig)
            return
        if trig.kind != "on-demand" and now - self.last_incident_end < self.o.cooldown_s:
            self.notes.append(f"{bd.utc_stamp(trig.realtime_ns)}: {trig.kind} trigger within --cooldown of the "
                              f"last incident, not a new bundle: {trig.reason}")
            return
        self.incident = {"first": trig, "triggers": [trig], "due": now + self.o.after_s}
        self.dump_ring()                             # the records before the trigger, before the ring goes round
        try:
            (self.staging / PENDING).write_text(json.dumps(trig.to_manifest()))
        except OSError:
            pass
        self.log(f"TRIGGER ({trig.kind}): {trig.reason}; writing the bundle in {self.o.after_s:g}s")

    def check_hang(self) -> None:
        if self.monitor is None:
            return
        self.monitor.poll()
        self.check_pcap()
        gone = [p for p in set(self.monitor.last_return) | {v[0] for v in self.monitor.open.values()}
                if not os.path.isdir(f"/proc/{p}")]
        if gone:                 # a job that ended or was killed mid-collective is not a hang
            self.monitor.forget(gone)
        now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        after = self.hang_after_ns(now_ns)
        stuck = [s for s in self.monitor.stuck(now_ns, after, **self.stuck_kw)
                 if self.cleared.get(s["pid"], -1) != self.monitor.last_return.get(s["pid"], 0)]
        if not stuck:
            return
        for s in stuck:   # this hang is reported once: again only after the process made progress
            self.cleared[s["pid"]] = self.monitor.last_return.get(s["pid"], 0)
        pids = [s["pid"] for s in stuck]
        quiet = max(s["quiet_ns"] for s in stuck) / 1e9
        ranks = []
        for p in pids:
            info = self.procs.get(p)
            r = info.rank_facts().get("rank") if info else None
            ranks.append(f"pid {p}" + (f" (rank {r})" if r is not None else ""))
        self.fire(Trigger("hang", f"collective in flight with nothing returned for {quiet:.0f}s (hang after "
                          f"{after / 1e9:g}s) in {', '.join(ranks)}", time.time_ns(), now_ns, pids=pids,
                          source="tracer"))

    def log_paths(self) -> list[tuple[str, str]]:
        """The job's logs to tail, found again when its processes change or every
        LOG_PATHS_EVERY_S (a log file NCCL creates later); a glob per process every 2 s was a
        fifth of the watcher's CPU."""
        now, pids = time.monotonic(), frozenset(self.procs)
        if self.logs_found is not None and self.logs_found[1] == pids and now - self.logs_found[0] < LOG_PATHS_EVERY_S:
            return self.logs_found[2]
        # --attach's files, NCCL_DEBUG_FILE and the processes' stdout/stderr files, each once
        paths = self.attachment_sources(dumps=False)[0]
        self.logs_found = (now, pids, paths)
        return paths

    def check_logs(self) -> None:
        try:
            hits = self.logwatch.poll(self.log_paths())
        except Exception as e:  # noqa: BLE001 - a log we cannot read is no reason to stop watching
            self.notes.append(f"log watch: {type(e).__name__}: {e}")
            return
        if hits:
            path, what, line = hits[0]
            more = f" (+{len(hits) - 1} more)" if len(hits) > 1 else ""
            self.fire(Trigger("log", f"{what} in {path}: {line}{more}", time.time_ns(),
                              time.clock_gettime_ns(time.CLOCK_MONOTONIC), source=path))

    def check_on_demand(self) -> None:
        reason = None
        tp = self.trigger_path
        if tp is not None and tp.exists():
            try:
                reason = tp.read_text(errors="replace").strip()[:300] or f"trigger file {tp}"
                tp.unlink()
            except OSError:
                reason = f"trigger file {tp}"
        if self.usr1:
            self.usr1 = False
            reason = reason or "SIGUSR1"
        if reason:
            self.fire(Trigger("on-demand", reason, time.time_ns(), time.clock_gettime_ns(time.CLOCK_MONOTONIC),
                              source="trigger"))

    def prune(self) -> None:
        """Jobs come and go: processes gone longer than the rings keep are forgotten, the files
        of tcpdumps whose interface went with them removed (their slot serves the next job)."""
        now = time.monotonic()
        keep_s = self.ring_age_s
        gone = []
        for pid in list(self.procs):
            if os.path.isdir(f"/proc/{pid}"):
                self.dead_since.pop(pid, None)
                continue
            t = self.dead_since.setdefault(pid, now)
            if now - t > keep_s:
                gone.append(pid)
        for pid in gone:
            info = self.procs.pop(pid)
            self.dead_since.pop(pid, None)
            ns = self.netns.get(info.netns_inode or self.own_ns)
            if ns is not None and pid in ns.pids:
                ns.pids.remove(pid)
        if gone and self.monitor is not None:
            self.monitor.forget(gone)
        for k, (ns, _iface) in list(self.pcap_wanted.items()):
            if not ns.own and not ns.pids and k not in self.tcpdumps:
                del self.pcap_wanted[k]           # a job's namespace, its processes gone
        for t in list(self.pcap_done):         # earlier runs of the packet ring: their files age out
            left = []
            for f in tcpdump_files(t["out"]):
                try:
                    if time.time() - f.stat().st_mtime > keep_s:
                        f.unlink()
                    else:
                        left.append(f)
                except OSError:
                    pass
            if not left:
                self.pcap_done.remove(t)
                with self.lock:
                    self.collectors.pop(t["key"], None)
        for k, t in list(self.tcpdumps.items()):
            p = t.get("proc")
            if p is None or p.poll() is None:
                continue
            files = tcpdump_files(t["out"])
            try:
                idle = all(time.time() - f.stat().st_mtime > keep_s for f in files)
            except OSError:
                idle = False
            if idle:
                for f in files:
                    f.unlink(missing_ok=True)
                t["fh"].close()
                del self.tcpdumps[k]
                self.pcap_wanted.pop(k, None)
                ns = t["ns"]
                if t["iface"] in ns.ifaces:
                    ns.ifaces.remove(t["iface"])

    # ---------------------------------------------------------------- the incident's bundle
    def cut(self) -> None:
        inc, self.incident = self.incident, None
        first: Trigger = inc["first"]
        w0_real = first.realtime_ns - int(self.o.before_s * 1e9)
        self.incident_window0 = w0_real
        w0_epoch_s = w0_real / 1e9
        try:
            out = bd.choose_output(str(self.folder) + os.sep, self.host, first.realtime_ns)
        except (FileExistsError, FileNotFoundError) as e:
            self.log(f"incident not written: {e}")
            self.bundles.append(None)
            return
        arcroot = out.name[: -len(".tar.gz")]
        dest = self.folder / f".{arcroot}.staging-{os.getpid()}"
        saved = (self.staging, self.collectors, self.snapshots_started, self.budget, self.notes, self.futures)
        lock = None
        try:
            dest.mkdir(parents=True)
            lock = lock_staging(dest)
            collectors = copy.deepcopy(self.collectors)
            self.dump_ring(wait_s=RING_DUMP_WAIT_S)  # the records up to now
            self.flush_tcpdumps()          # the packets up to now onto the ring files
            pcap_files = self.copy_rings(dest, w0_epoch_s)
            self.staging, self.collectors, self.snapshots_started = dest, collectors, set()
            self.budget = bd.Budget.plan(self.o.max_bytes, pcap=self.o.pcap, tracer=self.o.bpf)
            self.notes, self.futures = list(saved[4]), []
            self.state_at_trigger(first)
            self.finish_copied(dest, pcap_files, saved[0])
            self.clock.append(clock_sample())
            for rec in self.collectors.values():
                if rec.get("status") == "running":
                    rec["status"] = "ok"
            manifest = self.manifest_dict(time.time_ns(), self.process_facts(), partial=False)
            manifest["trigger"] = dict(first.to_manifest(),
                                       also=[t.to_manifest() for t in inc["triggers"][1:]][:50])
            manifest["watch"] = {"started_ns": self.started_ns, "before_s": self.o.before_s,
                                 "after_s": self.o.after_s, "hang_after": self.hang_after_text(),
                                 "ring_bytes": self.o.ring_bytes, "window_ns": [w0_real, time.time_ns()],
                                 "watcher_pid": os.getpid(),
                                 "pcap_ring": {"mode": "on-trouble" if self.pcap_on_trouble else
                                               "always" if self.o.pcap else "off",
                                               "linger_s": self.pcap_linger_s,
                                               "runs": [r for r in self.pcap_runs
                                                        if r.get("stopped_ns", time.time_ns()) >= w0_real]}}
            manifest["options"]["watch"] = True
            try:
                fit_budget(dest, out, arcroot, manifest, self.o.max_bytes)
            except OSError as e:
                if e.errno not in DISK_FULL:
                    raise
                raise CaptureFailed(f"cannot write {out}: {e.strerror}; kept in {dest}") from None
            shutil.rmtree(dest, ignore_errors=True)
            self.bundles.append(out)
            self.log(f"incident bundle {out} ({out.stat().st_size} bytes): {first.kind}: {first.reason}")
        except Exception as e:  # noqa: BLE001 - the watcher goes on; what was copied stays for --recover
            self.bundles.append(None)
            self.log(f"incident bundle not written ({type(e).__name__}: {e}); what was copied is kept in {dest}")
        finally:
            if lock is not None:
                lock.close()
            self.staging, self.collectors, self.snapshots_started, self.budget, self.notes, self.futures = saved
            self.last_incident_end = time.monotonic()
            (self.staging / PENDING).unlink(missing_ok=True)

    def dump_ring(self, wait_s: float = 0.0) -> bool:
        """Ring mode: the tracer prints its record ring (its lines go to the spool's segments,
        which the cut copies); with ``wait_s``, until the dump's end mark is spooled."""
        mon = self.monitor
        if not isinstance(mon, RingMonitor) or self.tracer_proc is None or self.tracer_proc.poll() is not None:
            return False
        mon.poll()
        before = mon.ring_dumps
        tracer.trigger_dump()
        deadline = time.monotonic() + wait_s
        while wait_s and mon.ring_dumps == before and time.monotonic() < deadline:
            time.sleep(0.05)
            mon.poll()
        return mon.ring_dumps > before

    def copy_rings(self, dest: Path, w0: float) -> list[tuple[dict, list[Path]]]:
        """The rings' files that hold data from w0 (epoch s) on, copied into dest; the start
        snapshots and logs of the watch copied whole. Returns each tcpdump's copies, oldest first."""
        src = self.staging
        skip = {STAGED_MANIFEST, ".lock", PENDING, ".manifest.staged.tmp"}
        ring_pcaps = set()
        pcaps = []
        for t in list(self.tcpdumps.values()) + self.pcap_done:
            if not t.get("out"):
                continue
            files = [f for f in tcpdump_files(t["out"])
                     if re.fullmatch(re.escape(t["out"].name) + r"\d*", f.name)]
            ring_pcaps.update(files)
            live = []
            for f in files:
                try:
                    st = f.stat()
                except OSError:
                    continue
                if st.st_mtime >= w0:
                    live.append((st.st_mtime_ns, f))
            copies = []
            stem = t["out"].name[:-5] if t["out"].name.endswith(".pcap") else t["out"].name
            for i, (_, f) in enumerate(sorted(live)):
                name = f"{stem}-{i:03d}.pcap" if len(live) > 1 else f"{stem}.pcap"
                d = dest / t["out"].parent.relative_to(src) / name
                d.parent.mkdir(parents=True, exist_ok=True)
                try:
                    shutil.copyfile(f, d)
                    copies.append(d)
                except OSError:
                    pass
            pcaps.append((t, copies))
        raw = self.raw_dir
        for p in sorted(src.rglob("*")):
            if not p.is_file() or p.name in skip or p in ring_pcaps:
                continue
            rel = p.relative_to(src)
            if raw in p.parents:
                if p.name.startswith("seg-"):
                    try:
                        if p.stat().st_mtime < w0:
                            continue
                    except OSError:
                        continue
            elif p.name == ring_previous(Path("ss-series.txt")).name:
                continue                         # the older half of an ss series: joined below
            d = dest / rel
            d.parent.mkdir(parents=True, exist_ok=True)
            try:
                if p.name == "ss-series.txt":
                    older = ring_previous(p)
                    with open(d, "wb") as out:
                        for part in (older, p):
                            if part.exists():
                                with open(part, "rb") as fh:
                                    shutil.copyfileobj(fh, out)
                else:
                    shutil.copyfile(p, d)
            except OSError:
                pass
        return pcaps

    def state_at_trigger(self, first: Trigger) -> None:
        """What a capture takes at its end, into the incident's folder: native stacks (a hang:
        with --stacks auto; always with --stacks always), Flight Recorder dumps through their
        pipes, the end snapshots (ss, thread states, counters), the logs."""
        mode = self.o.stacks
        if mode == "always" or (mode == "auto" and first.kind == "hang"):
            if self.is_root:
                for pid in sorted(self.procs):
                    if os.path.isdir(f"/proc/{pid}"):
                        self.take_native_stack(pid, "hung", f"watch trigger: {first.reason}")
            else:
                self.record("native-stacks:hung", status="skipped", reason="needs root")
        pending = self.trigger_flight_recorders()
        self.submit_snapshots(self.snapshot_jobs("end"))
        self.wait_flight_recorders(pending)
        self.collect_attachments()
        self.wait_snapshots(timeout=120)

    def finish_copied(self, dest: Path, pcaps: list[tuple[dict, list[Path]]], ring: Path) -> None:
        """events.jsonl from the copied tracer lines; the copied pcaps' collectors say what they hold."""
        raw = dest / "bpf" / "raw"
        if raw.is_dir():
            extra = [raw / n for n in ("offcpu.1.jsonl", "offcpu.jsonl") if (raw / n).exists()]
            try:
                summ = tracer.postprocess(raw, dest / "bpf" / "events.jsonl", self.budget.tracer, extra=extra,
                                          call_returns=self.o.call_returns)
                shutil.rmtree(raw, ignore_errors=True)
                if "tracer" in self.collectors:
                    self.record("tracer", status="ok", summary={k: v for k, v in summ.items() if k != "messages"},
                                tracer_messages=summ.get("messages", []), ended_ns=time.time_ns(),
                                covered_ns=utc_span(self.clock + [clock_sample()], summ.get("span_monotonic_ns")))
            except Exception as e:  # noqa: BLE001 - the raw lines stay in the bundle
                self.record("tracer", status="failed", reason=f"building bpf/events.jsonl failed: "
                            f"{type(e).__name__}: {e}; the raw tracer output is kept in bpf/raw/")
        w0 = int(self.incident_window0)
        for key, rec in self.collectors.items():
            cov = rec.get("covered_ns")
            if not cov or not key.startswith(("ss-series", "offcpu")):
                continue
            first = None                           # what the copied rings hold, not the watch's start
            for f in rec.get("files") or ():
                try:
                    with open(dest / f, "rb") as fh:
                        m = re.match(rb"# stallscope-sample realtime_ns=(\d+)", fh.readline())
                    first = int(m.group(1)) if m else None
                except OSError:
                    pass
            rec["covered_ns"] = [first if first is not None else max(cov[0], w0), cov[1]]
        for t, copies in pcaps:
            if not copies and t in self.pcap_done:    # an earlier run of the packet ring, before the window
                self.collectors.pop(t["key"], None)
                continue
            spans = [sp for f in copies if (sp := bd.pcap_span(f))]
            err = dest / t["err"].relative_to(ring)
            files = [self.rel(f) for f in copies] + ([self.rel(err)] if err.exists() else [])
            self.record(t["key"], status="ok", files=files,
                        packets=sum(bd.pcap_records(f) for f in copies), ended_ns=time.time_ns(),
                        covered_ns=[min(a for a, _ in spans), max(b for _, b in spans)] if spans else None,
                        netns=t["ns"].label, iface=t["iface"], ring=True)


# --------------------------------------------------------------------------- --trigger
def live_watchers() -> list[dict]:
    """The watchers running on this host, from their registry files (those of dead ones are
    removed: a SIGKILLed watcher cannot remove its own)."""
    out = []
    d = registry_dir()
    for f in sorted(d.glob("watch-*.json")) if d.is_dir() else []:
        try:
            info = json.loads(f.read_text())
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            f.unlink(missing_ok=True)          # that watcher is gone
            continue
        if b"capture" not in cmd and b"forensics" not in cmd:
            f.unlink(missing_ok=True)          # the pid was reused
            continue
        out.append(dict(info, pid=pid))
    return out


def trigger_watchers(reason: str, stderr=None) -> int:
    """``stallscope capture --trigger``: every watcher running on this host writes a bundle.
    The reason goes through each one's trigger file; SIGUSR1 wakes it. Returns how many."""
    err = stderr or sys.stderr
    n = 0
    for info in live_watchers():
        pid = info["pid"]
        try:
            tp = Path(info["trigger_file"])
            tmp = tp.with_name(f".{tp.name}.{os.getpid()}")
            tmp.write_text(reason + "\n")
            os.replace(tmp, tp)
            os.kill(pid, signal.SIGUSR1)
        except OSError as e:
            print(f"stallscope capture: watcher {pid}: {e}", file=err)
            continue
        print(f"stallscope capture: triggered watcher {pid} (bundles into {info.get('output')})", file=err)
        n += 1
    return n


def run_watch(opts, stderr=None) -> CaptureResult:
    return Watcher(opts, stderr=stderr).run()
