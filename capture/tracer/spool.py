"""The tracer's spool: bpftrace's stdout -> raw segment files, during the capture.

:class:`Spool` copies bpftrace's stdout (short positional lines for the hot
path, JSON for rare events) into raw segment files, reading the pipe in big
chunks a few times a second and parsing nothing, so that it takes no CPU per
event from the job. When the raw data outgrow the tracer's byte share the oldest
segment goes, its rare lines kept (``keep.txt``); in ring mode (capture --watch)
segments also age out. :func:`raw_files` lists what was spooled in stream
order: the input of :func:`capture.tracer.events.postprocess`.
"""
from __future__ import annotations

import errno
import json
import fcntl
import os
import re
import threading
import time
from pathlib import Path

# map-dump lines of the hot path, the ones that may be dropped: a flush's records; ring mode's
# records, their count and the calls' state (which the watcher reads as they come)
HOT_TAGS = (b"@e0[", b"@e1[", b"@op[", b"@rg[")
RING_DUMP_TAG = b'{"ev":"ring_dump"'    # a dump's end: goes with its records
LIB_MAP_TAG = b'{"ev":"lib_map"'        # a process mapped a libnccl the program does not trace
# communicator inits entered and returned (capture.watch.init_hang: a rank stuck in its init)
INIT_TAGS = (b'{"ev":"comm_init"', b'{"ev":"ret","k":"init"', b'{"ev":"split_enter"')
KEEP_FILE = "keep.txt"                     # rare lines of dropped segments
PIPE_BYTES = 1 << 20                       # bpftrace's stdout pipe, enlarged so that rare reads suffice
# bpftrace's line that says how many probes it attached (read here and by capture.tracer.events)
ATTACHING_RE = re.compile(rb"Attaching (\d+) probe")


def _is_hot(line: bytes) -> bool:
    return line[:4] in HOT_TAGS or line[:3] == b"@r[" or line.startswith(RING_DUMP_TAG)


class Spool:
    """bpftrace's stdout -> raw segment files, at a low rate and without parsing.

    The reader thread drains the pipe (non-blocking, 1 MiB reads) every
    ``poll_s`` seconds and goes back to sleep, so bpftrace's writes wake nobody
    and capture takes no CPU per event. Lines are written whole to
    ``raw_dir/seg-NNNNNN.txt``; when the segments outgrow ``max_bytes`` the
    oldest goes, its rare (non hot-path) lines appended to ``keep.txt`` first.
    ``ready`` is set when the program's BEGIN line arrives; ``lines`` counts
    lines for the progress display.
    """

    def __init__(self, stream, raw_dir: Path, max_bytes: int, poll_s: float = 0.1,
                 segment_bytes: int | None = None, max_age_s: float | None = None):
        self.stream = stream
        self.fd = stream.fileno()
        self.raw_dir = Path(raw_dir)
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max(0, int(max_bytes))
        self.poll_s = poll_s
        self.segment_bytes = segment_bytes or min(64 << 20, max(256 << 10, self.max_bytes // 8))
        # ring mode (capture.watch): segments also end every max_age_s / 8 and go once all their
        # lines are older than max_age_s; the rare lines kept of them are compacted (see _compact)
        self.max_age_s = max_age_s
        self._seg_opened = 0.0
        self.ready = threading.Event()
        self.ended = threading.Event()    # the END probe's last line arrived: all records are out
        self.stopped = threading.Event()  # the stop trigger's flush arrived: recording is off
        self.done = threading.Event()
        self.lines = 0
        self.bytes = 0            # raw bytes kept now (segments + keep file)
        self.dropped_lines = 0    # hot-path records of dropped segments
        self.dropped_segments = 0
        self.attached_probes: int | None = None
        self.ring_dumps = 0       # ring mode: dumps of the record ring read (their end marks)
        self._segments: list[Path] = []
        self._seg_fh = None
        self._seg_size = 0
        self._carry = b""
        self._seq = 0
        self._thread: threading.Thread | None = None
        # a restart with overlap (:meth:`overlap`): the programs still running beside the current
        # one, each (stream, fd, its unfinished line), read until their end of file
        self._old: list[list] = []
        self._lock = threading.Lock()
        self.lib_maps: list[dict] = []    # ring mode: the lib_map events read (bpf/nccl.bt), taken by the tracer
        self.inits: list[dict] = []       # comm_init / init return / split_enter events, taken by watch.init_hang
        self._nonblocking()

    def overlap(self, stream) -> "Spool":
        """A restart with overlap: a new bpftrace's stdout becomes the current stream while the
        old program runs on (its lines still spooled, until its end of file: :meth:`drained`);
        ``ready``, ``ended``, ``stopped`` and ``attached_probes`` are the new program's from now."""
        if self._thread is None or self.done.is_set():
            return self.follow(stream)
        with self._lock:
            self._old.append([self.stream, self.fd, self._carry])
            self._carry = b""
            self.stream = stream
            self.fd = stream.fileno()
            self._nonblocking()
            for ev in (self.ready, self.ended, self.stopped):
                ev.clear()
            self.attached_probes = None
        return self

    def mark(self, line: str) -> None:
        """A line of capture's own into the spooled stream (a restart's overlap window)."""
        with self._lock:
            self._append(line.encode() + b"\n")

    def drained(self, stream) -> bool:
        """Whether an old program's stream (:meth:`overlap`) was read to its end."""
        with self._lock:
            return not any(o[0] is stream for o in self._old)

    def _nonblocking(self) -> None:
        try:
            os.set_blocking(self.fd, False)
            fcntl.fcntl(self.fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
        except OSError:
            pass

    def follow(self, stream) -> "Spool":
        """Go on with a new bpftrace's stdout (the tracer restarted on other libraries): the
        reader of the old one is done (its end of file read), the same segments, byte share
        and counters go on; ``ready``, ``ended`` and ``stopped`` are the new program's."""
        self.join(timeout=30)
        self.stream = stream
        self.fd = stream.fileno()
        self._nonblocking()
        for ev in (self.ready, self.ended, self.stopped, self.done):
            ev.clear()
        self.attached_probes = None
        return self.start()

    # -- the reader
    def start(self) -> "Spool":
        self._thread = threading.Thread(target=self._run, name="tracer-spool", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    got, eof = self._drain()
                    got += self._drain_old()
                    if eof and not self._old:
                        break
                if eof:
                    time.sleep(self.poll_s)
                    continue
                if got < PIPE_BYTES // 4:
                    time.sleep(self.poll_s)
        finally:
            if self._carry:
                self._append(self._carry + b"\n")
                self._carry = b""
            if self._seg_fh:
                self._seg_fh.close()
                self._seg_fh = None
            self.done.set()

    def _drain(self) -> tuple[int, bool]:
        got = 0
        while True:
            try:
                data = os.read(self.fd, PIPE_BYTES)
            except BlockingIOError:
                return got, False
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                return got, True
            if not data:
                return got, True
            got += len(data)
            self._feed(data)

    def _drain_old(self) -> int:
        """The old programs' streams of a restart with overlap: their whole lines spooled as the
        current one's (lines of two programs interleave: each line is whole), a stream at its end
        of file dropped."""
        got = 0
        for old in list(self._old):
            stream, fd, carry = old
            eof = False
            while True:
                try:
                    data = os.read(fd, PIPE_BYTES)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno == errno.EINTR:
                        continue
                    eof = True
                    break
                if not data:
                    eof = True
                    break
                got += len(data)
                data = carry + data
                cut = data.rfind(b"\n") + 1
                carry = data[cut:]
                if cut:
                    self._lines_seen(data[:cut], current=False)
                    self._append(data[:cut])
            old[2] = carry
            if eof:
                if carry:
                    self._append(carry + b"\n")
                self._old.remove(old)
        return got

    def _lines_seen(self, whole: bytes, current: bool = True) -> None:
        """What every stream's lines tell: the dumps' end marks, the lib_map and init events."""
        if RING_DUMP_TAG in whole:
            self.ring_dumps += whole.count(RING_DUMP_TAG)
        lib_map = LIB_MAP_TAG in whole
        init = any(t in whole for t in INIT_TAGS)
        if lib_map or init:
            for line in whole.split(b"\n"):
                into = (self.lib_maps if lib_map and line.startswith(LIB_MAP_TAG) else
                        self.inits if init and line.startswith(INIT_TAGS) else None)
                if into is not None and len(into) < 100000:
                    try:
                        into.append(json.loads(line))
                    except ValueError:
                        pass

    def _feed(self, data: bytes) -> None:
        data = self._carry + data
        cut = data.rfind(b"\n") + 1
        self._carry = data[cut:]
        if not cut:
            return
        whole = data[:cut]
        self.lines += whole.count(b"\n")
        if not self.ready.is_set():
            m = ATTACHING_RE.search(whole)
            if m:
                self.attached_probes = int(m.group(1))
            if b'"tracer_start"' in whole:
                self.ready.set()
        if b'"tracer_end"' in whole:
            self.ended.set()
        if b'"tracer_stopped"' in whole:
            self.stopped.set()
        self._lines_seen(whole)
        self._append(whole)

    def _append(self, whole: bytes) -> None:
        """Whole lines into segments of about segment_bytes (a big chunk is split at lines)."""
        while whole:
            now = time.monotonic()
            if self._seg_fh is None or self._seg_size >= self.segment_bytes or (
                    self.max_age_s and now - self._seg_opened > self.max_age_s / 8):
                if self._seg_fh:
                    self._seg_fh.close()
                path = self.raw_dir / f"seg-{self._seq:06d}.txt"
                self._seq += 1
                self._segments.append(path)
                self._seg_fh = open(path, "ab")
                self._seg_size = 0
                self._seg_opened = now
            room = self.segment_bytes - self._seg_size
            cut = len(whole) if len(whole) <= room else (whole.rfind(b"\n", 0, room) + 1 or
                                                         whole.find(b"\n", room) + 1 or len(whole))
            part, whole = whole[:cut], whole[cut:]
            self._seg_fh.write(part)
            self._seg_fh.flush()   # the data survive a killed capture
            self._seg_size += len(part)
            self.bytes += len(part)
            if whole:
                self._seg_size = self.segment_bytes   # full: the rest goes to a new segment
            while self.bytes > self.max_bytes and len(self._segments) > 1:
                self._drop_oldest()
            if self.max_age_s:
                self._drop_aged()

    def _drop_aged(self) -> None:
        """Ring mode: the segments whose last line is older than max_age_s (the current one stays)."""
        limit = time.time() - self.max_age_s
        while len(self._segments) > 1:
            try:
                if self._segments[0].stat().st_mtime >= limit:
                    break
            except OSError:
                self._segments.pop(0)
                continue
            self._drop_oldest()
        keep = self.raw_dir / KEEP_FILE
        try:
            if keep.stat().st_size > max(64 << 10, self.max_bytes // 8):
                self._compact(keep)
        except OSError:
            pass

    def _compact(self, keep: Path) -> None:
        """The kept rare lines of a long ring: what joins later events stays (communicator inits,
        ids, destroys, tracer marks); old TCP and socket events, long out of the window, go."""
        before = keep.stat().st_size
        tmp = keep.with_name(keep.name + ".tmp")
        with open(keep, "rb") as src, open(tmp, "wb") as dst:
            for line in src:
                if not line.startswith((b'{"ev":"tcp_', b'{"ev":"sock_state')):
                    dst.write(line)
        os.replace(tmp, keep)
        self.bytes += keep.stat().st_size - before

    def _drop_oldest(self) -> None:
        old = self._segments.pop(0)
        size = old.stat().st_size
        keep, hot = [], 0
        with open(old, "rb") as fh:
            for line in fh:
                if _is_hot(line):
                    hot += 1
                elif line.strip():            # (a map's print ends with an empty line)
                    keep.append(line)
        kept = b"".join(keep)
        with open(self.raw_dir / KEEP_FILE, "ab") as fh:
            fh.write(kept)
        old.unlink()
        self.bytes += len(kept) - size
        self.dropped_lines += hot
        self.dropped_segments += 1

    def join(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


def raw_files(raw_dir: Path) -> list[Path]:
    """The spooled files in stream order: the kept rare lines of dropped segments first."""
    raw_dir = Path(raw_dir)
    keep = raw_dir / KEEP_FILE
    return ([keep] if keep.exists() else []) + sorted(raw_dir.glob("seg-*.txt"))
