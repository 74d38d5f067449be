"""What the watcher (``capture.watch.watcher``) watches for a hang without stopping anything: the calls'
state the tracer prints (:class:`ProgressMonitor`, :class:`RingMonitor`) and the job's own logs
(:class:`LogWatch`). Each is polled from the watcher's loop and keeps bounded state.

Standard library only."""
from __future__ import annotations

import collections
import json
import os
import re
import stat
from pathlib import Path

from ..procs import parse_ss_tinp
from ..tracer.events import PROGRESS_RE, RET_KIND
from ..tracer.spool import RING_DUMP_TAG

SLOWEST_WINDOW_S = 300.0             # --hang-after auto: the slowest collective of the last 5 minutes
# the tracer's events that start the packet ring (--pcap-ring on-trouble): a kernel retransmission
# (timeout, fast retransmit, tail loss probe) or a reset sent or received
TCP_TROUBLE = (b'{"ev":"tcp_retransmit_skb"', b'{"ev":"tcp_send_reset"', b'{"ev":"tcp_receive_reset"')
MAX_TROUBLE = 1000                   # kept between two polls


# --------------------------------------------------------------------------- the hang trigger
class ProgressMonitor:
    """The tracer's raw lines (capture.tracer.spool.Spool's segments), read as they are spooled, into
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


# --------------------------------------------------------------------------- the tracer-free trigger
class QuietJobs:
    """A hang seen without the tracer, for the jobs it does not cover (NCCL linked statically or
    with its symbols hidden, an untraceable build, a tracer that failed or cannot run): from the
    ss series the watcher samples anyway (``capture.collectors.ss_series``: every --ss-every s,
    each namespace of the job), per process, the bytes its TCP connections had acknowledged and
    received. A process is quiet when none of that moved for ``after`` while data waited on one
    of its connections (bytes unacknowledged, or queued to send or to be read): a stalled
    collective, not a job between steps, whose queues are empty. Only processes with a data
    connection (one that carried ``DATA_BYTES``) count: a launcher or a shell that carries NCCL_*
    variables never looks hung."""

    DATA_BYTES = 1 << 20

    def __init__(self):
        self.seen: dict[int, int] = {}                  # netns inode -> time of the sample read
        self.procs: dict[int, dict] = {}               # pid -> its counters and times

    def feed(self, latest: dict[int, tuple[int, bytes]], pids: set[int]) -> None:
        """Read the samples not read yet (``latest``: netns inode -> (CLOCK_MONOTONIC ns, ss
        text)) for the processes ``pids``."""
        for inode, (t, text) in list(latest.items()):
            if self.seen.get(inode) == t:
                continue
            self.seen[inode] = t
            per: dict[int, list[dict]] = {}
            for row in parse_ss_tinp(text.decode("utf-8", "replace")):
                if row.get("state") != "ESTAB":
                    continue
                for pid in set(row.get("pids") or ()) & pids:
                    per.setdefault(pid, []).append(row)
            for pid, rows in per.items():
                self._sample(pid, t, rows)

    def _sample(self, pid: int, t: int, rows: list[dict]) -> None:
        st = self.procs.setdefault(pid, {"moved": None, "last_move": t, "data": False, "waiting": 0,
                                         "sockets": 0})
        moved = sum(r.get("bytes_acked", 0) + r.get("bytes_received", 0) for r in rows)
        if st["moved"] is None or moved > st["moved"]:
            st["last_move"] = t
        st["moved"] = moved
        st["data"] |= any(r.get("bytes_acked", 0) + r.get("bytes_received", 0) >= self.DATA_BYTES for r in rows)
        st["waiting"] = sum(1 for r in rows if r.get("unacked", 0) or r.get("send_q", 0) or r.get("recv_q", 0))
        st["sockets"] = len(rows)

    def stuck(self, now_ns: int, after_ns: int) -> list[dict]:
        """The quiet processes: {pid, quiet_ns, waiting (connections with data waiting), sockets}."""
        return [{"pid": pid, "quiet_ns": now_ns - st["last_move"], "waiting": st["waiting"], "sockets": st["sockets"],
                 "last_move_ns": st["last_move"]}
                for pid, st in sorted(self.procs.items())
                if st["data"] and st["waiting"] and now_ns - st["last_move"] >= after_ns]

    def forget(self, pids) -> None:
        for pid in pids:
            self.procs.pop(pid, None)


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
