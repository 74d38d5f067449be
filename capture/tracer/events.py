"""The tracer's events: raw bpftrace lines -> ``bpf/events.jsonl``, at the end of a capture.

:func:`postprocess` reads the spooled lines (:func:`capture.tracer.spool.raw_files`)
and writes one JSON event a line, in time order: entry and return merged per
thread and kind, the communicator's rank, nranks and id joined from its init by
the comm pointer, TCP states named, the off-CPU samples merged in, the oldest
hot-path events dropped if the result would exceed the byte share. Ring mode's
dumps (capture --watch) are read the same way. :func:`parse_record` and
:data:`PROGRESS_RE` read one hot-path record line for those who count records
while the capture runs (capture.stacks, capture.watch).
"""
from __future__ import annotations

import array
import heapq
import itertools
import ipaddress
import json
import os
import re
from pathlib import Path

from .program import COLLECTIVES, GROUP, HOST_WAITS
from .spool import ATTACHING_RE, Spool, raw_files

RET_KIND = 255   # the return record of a call (bpf/nccl.bt)
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
              7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV"}
_LOST_RE = re.compile(rb"Lost (\d+) events")
_REC_RE = re.compile(rb"^@(e0|e1)\[(\d+), (\d+)\]: \(([-\d, ]+)\)\s*$")
# the same records, for the watcher's progress monitor (capture.watch.monitors) (all of a chunk's in one pass): tid,
# key, and kind, pid, a, t1 of the tuple (kind, pid, a, b, c, d, e, f, g, t1, rc)
PROGRESS_RE = re.compile(rb"^@e[01]\[(\d+), (\d+)\]: \((\d+), (\d+), (\d+), -?\d+, -?\d+, -?\d+, -?\d+, "
                         rb"-?\d+, -?\d+, (\d+), -?\d+\)[ \t\r]*$", re.M)

_NE_RE = re.compile(rb"^@ne: (\d+)")
# ring mode (capture --watch): a dump's records, (t0 or a return's t1, tid, then the 11 fields of a
# flush's record) keyed by their slot; the count of records ever made; the calls' state (the
# watcher's, nothing for the events)
_RING_RE = re.compile(rb"^@r\[\d+\]: \(([-\d, ]+)\)\s*$")
_RG_RE = re.compile(rb"^@rg\[0\]: (\d+)")
STATE_TAG = b"@op["
COLL_BY_KIND = {r["KIND"]: (r["OP"], r["FN"]) for r in COLLECTIVES}
GROUP_BY_KIND = {r["KIND"]: r["FN"] for r in GROUP}
WAIT_BY_KIND = {r["KIND"]: (r["FN"], r["OBJ"]) for r in HOST_WAITS}
OPEN_KINDS = {"comm_init": "init", "comm_destroy": "destroy"}   # JSON entry events merged with a JSON "ret"
HOT_KINDS = ("coll", "host_wait", "group", "offcpu")   # events of the hot path (already normal, droppable)
DROPPABLE = tuple(f'{{"ev":"{k}"'.encode() for k in HOT_KINDS)
DUP_NS = 50_000         # a restart's overlap: the same call's record from both programs is this close
OVERLAP_TAG = b'{"ev":"tracer_overlap"'     # capture.tracer.libs: the window two programs both traced
# what may differ between two programs' records of one call: the times, what the new program
# did not know yet (the communicator's init, its op count), whether the return was seen
VOLATILE = frozenset({"t", "t0", "t1", "rc", "returned", "op_count", "rank", "nranks", "comm_id_hash",
                      "comm_id_source"})
REORDER_WINDOW = 40000   # > the records of one flush (the maps print unsorted)


def parse_record(line: bytes) -> tuple[int, int, list[int]] | None:
    """One hot-path record line (``@e0[tid, key]: (11 fields)``) -> (tid, key, fields); None
    for anything else. key is t0 of an entry, t1 of a return record (fields[0] == RET_KIND)."""
    if line[:2] != b"@e":
        return None
    m = _REC_RE.match(line)
    if not m:
        return None
    try:
        f = [int(x) for x in m.group(4).split(b",")]
    except ValueError:
        return None
    return (int(m.group(2)), int(m.group(3)), f) if len(f) == 11 else None


def _ipv6_from_hex(h: str) -> str:
    try:
        return str(ipaddress.IPv6Address(bytes.fromhex(h)))
    except ValueError:
        return h


def _normalize(ev: dict) -> dict:
    """Rare (JSON) events: names for numbers, nulls for what the tracer could not know."""
    known = ev.pop("known", None)
    if known is not None:
        if known == 0:  # communicator created before the tracer attached
            ev["rank"] = ev["nranks"] = None
            ev["comm_id_hash"] = None
        elif known == 2:  # ncclCommSplit child: rank known only across ranks
            ev["rank"] = ev["nranks"] = None
            ev["comm_id_source"] = "split"
    for key in ("state", "oldstate", "newstate"):
        if isinstance(ev.get(key), int):
            ev[key] = TCP_STATES.get(ev[key], str(ev[key]))
    for key in ("saddr6", "daddr6"):
        if key in ev:
            ev[key[:5]] = _ipv6_from_hex(ev.pop(key))
    for key in ("saddr", "daddr"):  # IPv4-mapped IPv6 -> the IPv4 address
        v = ev.get(key)
        if isinstance(v, str) and v.startswith("::ffff:") and "." in v:
            ev[key] = v[7:]
    if ev.get("ev") == "comm_init" and ev.get("fn") == "ncclCommSplit":
        ev["comm_id_source"] = "split"
        if not ev.get("parent_known"):
            ev["parent_rank"] = ev["parent_nranks"] = ev["parent_comm_id_hash"] = None
            ev["comm_id_hash"] = None
        ev.pop("parent_known", None)
        ev["rank"] = ev["nranks"] = None
    return ev


def _time_of(ev: dict) -> int:
    t = ev.get("t0")
    if t is None:
        t = ev.get("t")
    return t if isinstance(t, int) else 0


def _take(store: dict, key, fits, order, pick):
    """Remove and return from ``store[key]`` the fitting item ``pick`` (min or max) chooses
    by ``order``; drop the key once its list is empty. None when nothing fits."""
    items = store.get(key)
    cands = [x for x in items if fits(x)] if items else []
    if not cands:
        return None
    item = pick(cands, key=order)
    items.remove(item)
    if not items:
        del store[key]
    return item

class _Builder:
    """Raw lines -> complete events, in stream order (see postprocess)."""

    def __init__(self, call_returns: bool = True):
        self.call_returns = call_returns
        self.pending: dict[tuple, list[dict]] = {}   # (tid, kind) -> JSON entries awaiting their "ret"
        self.orphans: dict[tuple, list[dict]] = {}   # returns that overtook their entry (per-CPU buffers)
        self.open: dict[tuple, dict] = {}            # (tid, t0) -> hot-path entry awaiting its return record
        self.early: dict[tuple, tuple] = {}          # (tid, t0) -> (t1, rc): a return record before its entry
        self.orphan_returns = 0
        self.records = 0
        self.records_made: int | None = None         # @ne: records the probes made
        self.bad_lines = 0
        self.lost_events = 0
        self.attached_probes: int | None = None
        self.other_lines: list[str] = []
        # ring mode: (tid, key) -> (fields, the dump it was last seen in); its dumps; @rg
        self.ring: dict[tuple[int, int], tuple[list[int], int]] = {}
        self.dumps = 0
        self.ring_slots: int | None = None
        self.ring_made: int | None = None
        self.ring_oldest: list[int] = []              # per dump: its oldest record's time
        self._dump_oldest: int | None = None

    def returned(self, kind: int) -> bool | None:
        """What a record's t1/rc mean: True (the return was traced) or None (not traced)."""
        if kind >= 32 or GROUP_BY_KIND.get(kind) == "ncclGroupEnd":
            return True
        return True if self.call_returns else None

    def record(self, tid: int, t0: int, f: list[int], returned: bool | None) -> dict:
        kind, pid, a, b, c, d, e, g_root, stream, t1, rc = f
        done = returned is True
        if kind < 16:   # returned False: awaiting its return record (t1/rc filled in then)
            op, fn = COLL_BY_KIND[kind]
            return {"ev": "coll", "op": op, "fn": fn, "t0": t0, "t1": t1 if done else None, "pid": pid, "tid": tid,
                    "comm": f"0x{a:x}", "rank": None, "nranks": None, "comm_id_hash": None, "op_count": b,
                    "count": c, "datatype": d, "red_op": e, "root": g_root, "stream": f"0x{stream:x}",
                    "rc": rc if done else None, "returned": returned}
        if kind < 32:
            return {"ev": "group", "fn": GROUP_BY_KIND[kind], "t0": t0, "t1": t1 if done else None, "pid": pid,
                    "tid": tid, "rc": rc if done else None, "returned": returned}
        fn, obj = WAIT_BY_KIND[kind]
        return {"ev": "host_wait", "fn": fn, "t0": t0, "t1": t1 if done else None, "pid": pid, "tid": tid,
                obj: f"0x{a:x}", "rc": rc if done else None, "returned": returned}

    def parse(self, line: bytes):
        """One raw line -> (what, kind, event) or None; what: None (complete), 'entry' or 'ret'."""
        if line[:1] == b"@":
            m = _REC_RE.match(line)
            if m is None:
                if line[:3] == b"@r[":
                    self.ring_record(line)
                elif line[:4] == STATE_TAG:
                    pass
                elif (m := _NE_RE.match(line)):
                    self.records_made = max(self.records_made or 0, int(m.group(1)))
                elif (m := _RG_RE.match(line)):
                    self.ring_made = max(self.ring_made or 0, int(m.group(1)))
                elif line.strip():
                    self.bad_lines += 1
                return None
            try:
                tid, key2 = int(m.group(2)), int(m.group(3))
                f = [int(x) for x in m.group(4).split(b",")]
                if len(f) != 11:
                    raise ValueError
                self.records += 1
                if f[0] == RET_KIND:       # a return: key (tid, t1), t0 in slot a
                    t0, t1, rc = f[2], key2, f[10]
                    entry = self.open.pop((tid, t0), None)
                    if entry is None:
                        self.early[(tid, t0)] = (t1, rc)
                        return None
                    entry.update(t1=t1, rc=rc, returned=True)
                    return None, "hot", entry
                returned = self.returned(f[0])
                if returned is None:       # no return traced: complete now
                    return None, "hot", self.record(tid, key2, f, None)
                ev = self.record(tid, key2, f, False)
                if f[9]:                   # completed in place: t1, rc in the record
                    self.open.pop((tid, key2), None)
                    ev.update(t1=f[9], rc=f[10], returned=True)
                    return None, "hot", ev
                early = self.early.pop((tid, key2), None)
                if early is not None:
                    ev.update(t1=early[0], rc=early[1], returned=True)
                    return None, "hot", ev
                self.open[(tid, key2)] = ev
                return None
            except (ValueError, KeyError):
                self.bad_lines += 1
                return None
        if line[:1] == b"{":
            try:
                ev = json.loads(line)
            except ValueError:
                self.bad_lines += 1
                return None
            kind = ev.get("ev")
            if kind == "ret":
                return "ret", ev.get("k"), ev
            if kind == "ring_dump":           # the end of a dump: its records are those read since the last
                self.dumps += 1
                self.ring_slots = ev.get("slots")
                if self._dump_oldest is not None:
                    self.ring_oldest.append(self._dump_oldest)
                self._dump_oldest = None
            open_kind = OPEN_KINDS.get(kind)
            if open_kind and "t1" not in ev:
                return "entry", open_kind, ev
            return None, kind, ev
        text = line.decode("utf-8", "replace").strip()
        if not text:
            return None
        m = ATTACHING_RE.search(line)
        if m:
            self.attached_probes = int(m.group(1))
        m = _LOST_RE.search(line)
        if m:
            self.lost_events += int(m.group(1))
        if len(self.other_lines) < 200:
            self.other_lines.append(text)
        return None

    @staticmethod
    def merge(entry: dict, ret: dict) -> dict:
        entry["t1"] = ret["t1"]
        entry["rc"] = ret.get("rc")
        entry["returned"] = True
        if ret.get("comm") and ret["comm"] != "0x0":
            entry["comm"] = ret["comm"]
        return entry

    def feed(self, line: bytes):
        """Complete events made by this line (0, 1 or more)."""
        parsed = self.parse(line)
        if parsed is None:
            return ()
        what, kind, ev = parsed
        if what is None:
            return (ev,)
        key = (ev.get("tid"), kind)
        if what == "ret":
            # calls of one thread and kind do not overlap: the latest entry before the return
            entry = _take(self.pending, key, lambda e: e.get("t0", 0) <= ev["t1"], lambda e: e.get("t0", 0), max)
            if entry is not None:
                return (self.merge(entry, ev),)
            self.orphans.setdefault(key, []).append(ev)
            return ()
        # a return that was read before its entry
        ret = _take(self.orphans, key, lambda r: r.get("t1", 0) >= ev.get("t0", 0), lambda r: r["t1"], min)
        if ret is not None:
            return (self.merge(ev, ret),)
        self.pending.setdefault(key, []).append(ev)
        return ()

    def ring_record(self, line: bytes) -> None:
        """A ring dump's record: the newest dump's copy of a record wins (it may have been completed
        since); a record is the same in every dump it is in, or overwritten by another one."""
        m = _RING_RE.match(line)
        try:
            f = [int(x) for x in m.group(1).split(b",")] if m else []
        except ValueError:
            f = []
        if len(f) != 13 or f[0] <= 0:
            if not (len(f) == 13 and f[0] == 0):   # an empty slot (the declaration's): nothing
                self.bad_lines += 1
            return
        if (f[1], f[0]) not in self.ring:
            self.records += 1
        self.ring[(f[1], f[0])] = (f[2:], self.dumps)
        if self._dump_oldest is None or f[0] < self._dump_oldest:
            self._dump_oldest = f[0]

    def ring_events(self):
        """The ring's records as events, once the last dump was read. A call with no return in
        the last dump that holds it was still inside then if that dump is the last one (the
        hang); a call seen open only in an earlier dump had its return overwritten since:
        unknown (t1 null, ``returned`` null), never a hang."""
        ring, self.ring = self.ring, {}
        last = self.dumps - 1
        done: dict[tuple[int, int], tuple[int, int]] = {}
        for (tid, key), (f, _) in ring.items():
            if f[0] == RET_KIND:
                done[(tid, f[2])] = (key, f[10])
        for (tid, key), (f, seen) in sorted(ring.items(), key=lambda kv: kv[0][1]):
            if f[0] == RET_KIND:
                if (tid, f[2]) not in ring:
                    self.orphan_returns += 1
                continue
            returned = self.returned(f[0])
            if returned is None:
                yield self.record(tid, key, f, None)
                continue
            ev = self.record(tid, key, f, False)
            ret = (f[9], f[10]) if f[9] else done.get((tid, key))
            if ret is not None:
                ev.update(t1=ret[0], rc=ret[1], returned=True)
            elif seen != last:
                ev.update(returned=None)
            yield ev

    def unfinished(self):
        """Calls still inside at the end (t1 null, returned false): entries without a return."""
        for stack in self.pending.values():
            for entry in stack:
                entry["t1"] = None
                entry["rc"] = None
                entry["returned"] = False
                yield entry
        self.pending.clear()
        yield from self.open.values()
        self.open = {}
        self.orphan_returns += len(self.early)
        self.early = {}


class _Comms:
    """Communicator facts by (pid, comm pointer), applied in time order."""

    def __init__(self):
        self.by_ptr: dict[tuple[int, str], tuple] = {}

    def apply(self, ev: dict) -> dict:
        kind = ev.get("ev")
        if kind == "coll":
            info = self.by_ptr.get((ev["pid"], ev["comm"]))
            if info is not None:
                ev["rank"], ev["nranks"], ev["comm_id_hash"], source = info
                if source:
                    ev["comm_id_source"] = source
        elif kind == "comm_init":
            comm = ev.get("comm")
            if comm and comm != "0x0" and ev.get("rc") in (0, 7):
                self.by_ptr[(ev.get("pid"), comm)] = (ev.get("rank"), ev.get("nranks"), ev.get("comm_id_hash"),
                                                      ev.get("comm_id_source"))
        elif kind == "comm_destroy":
            self.by_ptr.pop((ev.get("pid"), ev.get("comm")), None)
        return ev


def _ordered(builder: _Builder, paths, window: int = REORDER_WINDOW):
    """Complete events in time order (a window of ``window`` events evens out the per-CPU
    buffers' disorder; a call merged late, e.g. a long host wait, comes out when complete)."""
    heap: list = []
    seq = 0
    for path in paths:
        with open(path, "rb") as fh:
            for line in fh:
                for ev in builder.feed(line):
                    if ev.get("ev") not in HOT_KINDS:
                        ev = _normalize(ev)
                    heapq.heappush(heap, (_time_of(ev), seq, ev))
                    seq += 1
                    if len(heap) > window:
                        yield heapq.heappop(heap)[2]
    for ev in itertools.chain(builder.ring_events(), builder.unfinished()):
        heapq.heappush(heap, (_time_of(ev), seq, ev))
        seq += 1
    while heap:
        yield heapq.heappop(heap)[2]


def _jsonl_events(path: Path):
    try:
        fh = open(path, "rb")
    except OSError:
        return
    with fh:
        for line in fh:
            try:
                yield json.loads(line)
            except ValueError:
                continue


def postprocess(raw_dir: Path | None, out: Path, max_bytes: int, extra: list[Path] = (),
                call_returns: bool = True, spool: Spool | None = None) -> dict:
    """Raw tracer lines (and extra JSONL events, e.g. off-CPU samples) -> ``out`` (JSONL).

    Events come out in time order (``t0``, else ``t``). Should the file exceed
    ``max_bytes``, the oldest hot-path events (coll, host_wait, group, offcpu)
    are left out until it fits; rare events (inits, ids, destroys, TCP, tracer
    start/end) are always kept. Returns the summary recorded in the manifest."""
    out = Path(out)
    builder = _Builder(call_returns)
    comms = _Comms()
    paths = raw_files(raw_dir) if raw_dir is not None and Path(raw_dir).is_dir() else []
    streams = [_ordered(builder, paths)] + [_jsonl_events(Path(p)) for p in extra]
    windows = overlap_windows(paths)
    dups = [0]
    counts: dict[str, int] = {}
    hot_sizes = array.array("Q")
    total = 0
    span = _Span(windows)
    with open(out, "wb") as fh:
        merged = heapq.merge(*streams, key=_time_of)
        for ev in (dedup(merged, windows, dups) if windows else merged):
            ev = comms.apply(ev)
            line = (json.dumps(ev, separators=(",", ":")) + "\n").encode()
            fh.write(line)
            total += len(line)
            kind = ev.get("ev", "?")
            counts[kind] = counts.get(kind, 0) + 1
            span.add(kind, ev)
            if line.startswith(DROPPABLE):
                hot_sizes.append(len(line))
    dropped = 0
    if total > max_bytes:
        excess, n = total - max_bytes, 0
        for size in hot_sizes:
            if excess <= 0:
                break
            excess -= size
            n += 1
        tmp = out.with_name(out.name + ".tmp")
        skip = n
        with open(out, "rb") as src, open(tmp, "wb") as dst:
            for line in src:
                if skip and line.startswith(DROPPABLE):
                    skip -= 1
                    counts[line[7:line.index(b'"', 7)].decode()] -= 1   # the kind: the prefix matched
                    continue
                dst.write(line)
        os.replace(tmp, out)
        dropped = n
        if out.stat().st_size > max_bytes:   # rare events alone exceed the share: keep whole lines from the start
            with open(out, "rb") as fh:
                head = fh.read(max_bytes)
            os.truncate(out, head.rfind(b"\n") + 1)
    spool_dropped = spool.dropped_lines if spool else 0
    lost_records = 0
    if builder.records_made is not None:   # records the probes made that never reached the output: map full
        lost_records = max(0, builder.records_made - builder.records - spool_dropped)
    summary = {"events": sum(counts.values()), "bytes": out.stat().st_size,
               "dropped_for_budget": dropped + spool_dropped,
               "unparsable_lines": builder.bad_lines, "lost_events": builder.lost_events + lost_records,
               "hot_records": builder.records, "hot_records_made": builder.records_made,
               "orphan_returns": builder.orphan_returns, "overlap_duplicates": dups[0],
               "attached_probes": builder.attached_probes, "call_returns": call_returns,
               "by_type": dict(sorted((k, v) for k, v in counts.items() if v))}
    if spool is not None and spool.dropped_segments:
        summary["raw_segments_dropped"] = spool.dropped_segments
    if builder.dumps:
        # ring mode: the hot path is complete from the oldest record of the first dump on (the
        # records before it were overwritten), when the ring went round at all
        wrapped = bool(builder.ring_made and builder.ring_slots and builder.ring_made > builder.ring_slots)
        summary["ring"] = {"dumps": builder.dumps, "slots": builder.ring_slots, "records_made": builder.ring_made,
                           "oldest_monotonic_ns": builder.ring_oldest[0] if builder.ring_oldest else None,
                           "wrapped": wrapped}
        if wrapped and builder.ring_oldest and span.start is not None:
            span.start = max(span.start, builder.ring_oldest[0])
    summary["span_monotonic_ns"] = span.result()
    summary["messages"] = builder.other_lines[:20]
    return summary


def overlap_windows(paths) -> list[tuple[int, int]]:
    """The restarts' overlap windows (CLOCK_MONOTONIC ns) marked in the spooled lines."""
    out = []
    for p in paths:
        try:
            data = Path(p).read_bytes()
        except OSError:
            continue
        i = data.find(OVERLAP_TAG)
        while i >= 0:
            end = data.find(b"\n", i)
            try:
                ev = json.loads(data[i:end if end >= 0 else len(data)])
                out.append((int(ev["t0"]), int(ev["t1"])))
            except (ValueError, KeyError, TypeError):
                pass
            i = data.find(OVERLAP_TAG, i + 1)
    return sorted(set(out))


def _signature(ev: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in ev.items() if k not in VOLATILE))


def dedup(events, windows: list[tuple[int, int]], counter: list[int] | None = None, dup_ns: int = DUP_NS):
    """Events in time order -> the same, an event inside an overlap window kept once when both
    programs recorded it: same thread, kind and fields but for ``VOLATILE``, entry times at most
    ``dup_ns`` apart. The copy that saw the call return gives the kept one its t1 and rc."""
    recent: list[tuple[int, tuple, dict]] = []
    for ev in events:
        t = _time_of(ev)
        while recent and recent[0][0] < t - dup_ns:
            yield recent.pop(0)[2]
        if not any(lo - dup_ns <= t <= hi + dup_ns for lo, hi in windows) or ev.get("ev") in (
                "tracer_start", "tracer_end", "tracer_overlap", "ring_dump", "lib_map"):
            recent.append((t, (), ev))
            continue
        sig = _signature(ev)
        twin = next((r for r in recent if r[1] == sig and abs(r[0] - t) <= dup_ns), None)
        if twin is None:
            recent.append((t, sig, ev))
            continue
        if counter is not None:
            counter[0] += 1
        kept = twin[2]
        if kept.get("t1") is None and ev.get("t1") is not None:
            kept.update(t1=ev["t1"], rc=ev.get("rc"), returned=ev.get("returned"))
    for r in recent:
        yield r[2]


class _Span:
    """CLOCK_MONOTONIC [first, last] the tracer covered: from its start mark (else its first
    event) to its stop or end mark (else its last event time, returns included). Off-CPU
    samples come from capture's /proc reads, not the tracer: left out. A stop or end mark
    inside a restart's overlap window (``windows``, [the new program's launch, the old one's
    end]) is the old program's: the new one traced on past it."""

    def __init__(self, windows=()):
        self.start = self.stop = self.lo = self.hi = None
        self.last_start = None
        self.stops: list[int] = []
        self.windows = list(windows or ())

    def add(self, kind: str, ev: dict) -> None:
        if kind == "offcpu":
            return
        t = ev.get("t")
        if kind == "tracer_start" and isinstance(t, int):
            self.start = t if self.start is None else min(self.start, t)
            self.last_start = t if self.last_start is None else max(self.last_start, t)
        elif kind in ("tracer_stopped", "tracer_end") and isinstance(t, int) and not any(
                lo <= t <= hi for lo, hi in self.windows):
            self.stops.append(t)
        for k in ("t0", "t", "t1"):
            v = ev.get(k)
            if isinstance(v, int) and v > 0:
                self.lo = v if self.lo is None else min(self.lo, v)
                self.hi = v if self.hi is None else max(self.hi, v)

    def result(self) -> list[int] | None:
        # a tracer restarted (capture.collectors.tracer) ran several programs: the span ends
        # with the last one's stop (or end) mark, the first mark after its start
        last_run = [t for t in self.stops if self.last_start is None or t >= self.last_start]
        self.stop = min(last_run) if last_run else None
        first = self.start if self.start is not None else self.lo
        last = self.stop if self.stop is not None else self.hi
        return [first, last] if first is not None and last is not None and first <= last else None
