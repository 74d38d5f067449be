"""One host's capture bundle, opened safely: typed manifest, files, clock conversion.

A bundle is a ``stallscope-<host>-<UTC>.tar.gz`` (or that archive unpacked into a
folder) holding ``manifest.json`` and the collectors' files (see DESIGN.md). It is
untrusted input: it may come from a broken node, a truncated copy, or someone else.
An archive is unpacked by :func:`forensics.inputs.archive.unpack_archive`, never with
``tarfile.extract*``: a link, device, FIFO or sparse member, a name that climbs out, a
member or a total over its cap (decompression bombs) refuse the whole archive with one
line (``InputError``), and the partly unpacked folder is removed.

A bundle that unpacks but is partly broken (missing pcap, truncated events file, failed
collector, missing clock samples, manifest fields of the wrong type) still loads; each
defect becomes one line in :attr:`Bundle.problems`.

The manifest's schema is ``capture/manifest.py``: each field of the typed records below
(:class:`Manifest`, :class:`ProcessInfo`, ...) is a key of one of its tables, read by the kind
the table gives it (:func:`field_readers`); a field the schema lacks fails at import.

Clock: bpftrace times are CLOCK_MONOTONIC ns; the manifest's ``clock_samples`` pair
them with CLOCK_REALTIME. :class:`ClockMap` converts piecewise linearly between samples
and holds the nearest sample's offset beyond the first and last.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from capture import manifest as schema

from ..coerce import int64
from ..errors import InputError
from .archive import MAX_MEMBER_BYTES, MAX_MEMBERS, MAX_TOTAL_BYTES, safe_relpath, unpack_archive
from .layout import BUNDLE_NAME_RE, bundle_name, find_root, regular as _regular

SUPPORTED_SCHEMA = schema.SCHEMA_VERSION    # the analyzer reads what this capture writes


# --------------------------------------------------------------------------- records

@dataclass(frozen=True)
class ClockSample:
    """One reading of both clocks, taken back to back by the capture."""

    monotonic_ns: int
    realtime_ns: int
    uncertainty_ns: int | None = None


@dataclass(frozen=True)
class SocketInfo:
    """A TCP socket of a traced process at the end of the capture (/proc/PID/net/tcp)."""

    saddr: str
    sport: int
    daddr: str
    dport: int
    state: str | None = None


@dataclass(frozen=True)
class ProcessInfo:
    """A traced process as the manifest lists it (rank fields from its torchrun env)."""

    pid: int
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    comm: str | None = None
    cmdline: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    libnccl: tuple[str, ...] = ()
    netns_inode: int | None = None
    netns: str | None = None
    sockets: tuple[SocketInfo, ...] = ()
    hostname: str | None = None          # the host name the process itself sees (its UTS namespace)
    nccl_version: str | None = None      # the version string its libnccl file carries (capture/libversion.py)


@dataclass(frozen=True)
class CollectorStatus:
    name: str
    status: str                  # ok | skipped | failed (| running, in a bundle cut short)
    reason: str | None = None
    command: str | None = None
    rc: int | None = None
    files: tuple[str, ...] = ()
    # the interval (UTC ns) the collector really covered: the tracer's first and last flush,
    # tcpdump's first and last packet, a snapshot's sample time; None: not recorded
    covered_ns: tuple[int, int] | None = None


@dataclass(frozen=True)
class NetnsInfo:
    """A network namespace the capture saw: ``label`` names its sys/ and pcap/ files."""

    inode: int
    label: str
    name: str | None = None
    pids: tuple[int, ...] = ()
    ifaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class FileEntry:
    path: str
    bytes: int | None = None
    sha256: str | None = None


@dataclass
class Manifest:
    schema_version: int | None
    tool_version: str | None
    host: str
    boot_id: str | None
    kernel: str | None
    started_ns: int | None
    ended_ns: int | None
    clock_samples: list[ClockSample]
    collectors: dict[str, CollectorStatus]
    processes: list[ProcessInfo]
    netns: list[NetnsInfo]
    files: list[FileEntry]
    options: dict[str, Any]
    raw: dict[str, Any]

    def value(self, key: str) -> Any:
        """The value of the top-level key ``key`` as manifest.json has it (None when absent), for
        keys without a typed attribute. KeyError for a key ``capture.manifest.TOP`` lacks."""
        schema.TOP.field(key)
        return self.raw.get(key) if isinstance(self.raw, dict) else None

    def record_values(self, key: str) -> list[tuple[str, Any]]:
        """(collector key, value of ``key``) of every collector record that is an object, as
        manifest.json has it (None when absent). KeyError for a key ``capture.manifest.RECORD`` lacks."""
        schema.RECORD.field(key)
        cols = self.raw.get("collectors") if isinstance(self.raw, dict) else None
        return [(name, c.get(key)) for name, c in cols.items() if isinstance(c, dict)] \
            if isinstance(cols, dict) else []

    def record_value(self, name: str, key: str) -> Any:
        """The value of ``key`` in the record of collector ``name`` (None when absent)."""
        return dict(self.record_values(key)).get(name)

    def user_attached(self) -> list[str]:
        """Bundle paths of the files the user attached by hand (``--attach``): a log of the whole
        job perhaps, not this host's own output, unlike the job's stdout, stderr and
        ``NCCL_DEBUG_FILE`` files the capture found itself."""
        return sorted({str(s.get("path")) for _, srcs in self.record_values("sources") if isinstance(srcs, list)
                       for s in srcs if isinstance(s, dict) and s.get("path")
                       and str(s.get("why") or "").startswith("--attach")})


# --------------------------------------------------------------------------- clock

class ClockMap:
    """CLOCK_MONOTONIC ns -> UTC ns from a host's clock samples.

    Between samples the offset (realtime - monotonic) is interpolated linearly, so a
    clock slewed by NTP during the capture is followed; before the first and after the
    last sample the nearest sample's offset holds. Offsets are interpolated relative to
    the first one, so float64 never carries the 1.8e18-sized epoch values.
    """

    def __init__(self, samples: list[ClockSample]):
        if not samples:
            raise ValueError("no clock samples")
        s = sorted(samples, key=lambda c: c.monotonic_ns)
        self.mono = np.array([c.monotonic_ns for c in s], dtype=np.int64)
        off = np.array([c.realtime_ns - c.monotonic_ns for c in s], dtype=np.int64)
        self.base = int(off[0])
        self.rel = (off - self.base).astype(np.float64)

    def to_utc(self, monotonic_ns) -> np.ndarray:
        """Vectorised; NaN/None inputs are not allowed (mask them first)."""
        m = np.asarray(monotonic_ns, dtype=np.int64)
        if len(self.mono) == 1:
            return m + self.base + int(self.rel[0])
        rel = np.interp(m.astype(np.float64), self.mono.astype(np.float64), self.rel)
        return m + self.base + np.rint(rel).astype(np.int64)

    def offset_at(self, monotonic_ns: int) -> int:
        return int(self.to_utc(np.array([monotonic_ns]))[0]) - int(monotonic_ns)


# --------------------------------------------------------------------------- manifest parsing
# Each field of the records above is read by the kind ``capture.manifest`` gives its key: one
# reader per kind, each returning a value of the record's type or None (an empty sequence or
# mapping) for anything else, so a field of the wrong type is dropped, never raised on.
# Integers: :func:`forensics.coerce.int64`.


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


def _interval(v) -> tuple[int, int] | None:
    """A manifest ``[first_ns, last_ns]`` pair, else None (absent, null or not two ordered ints)."""
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        return None
    a, b = int64(v[0]), int64(v[1])
    return (a, b) if a is not None and b is not None and 0 <= a <= b else None


def _intervals(v) -> tuple[tuple[int, int], ...]:
    """A list of manifest intervals: the well-formed ones."""
    return tuple(i for i in map(_interval, _seq(v)) if i is not None)


def _printable(text: str) -> str:
    """Manifest text inside a problem line: one line, control characters escaped (a hostile
    manifest must not forge lines in the output)."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _seq(v) -> list | tuple:
    """A JSON array as a sequence; anything else (a number, true, an object) as empty."""
    return v if isinstance(v, (list, tuple)) else ()


def _strs(v) -> tuple[str, ...]:
    return tuple(x for x in _seq(v) if isinstance(x, str))


def _int_seq(v) -> tuple[int, ...]:
    return tuple(x for x in _seq(v) if isinstance(x, int))


def _argv(v) -> tuple[str, ...]:
    return tuple(str(a) for a in _seq(v) if isinstance(a, (str, int)))


def _str_map(v) -> dict[str, str]:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


def _object(v) -> dict:
    return v if isinstance(v, dict) else {}


_KIND_READERS = {schema.INT: int64, schema.STR: _str, schema.INTERVAL: _interval, schema.INTERVALS: _intervals,
                 schema.STRS: _strs,
                 schema.INTS: _int_seq, schema.ARGV: _argv, schema.MAP: _str_map, schema.OBJECT: _object}


def field_readers(cls, table: schema.Table, derived: tuple[str, ...] = (),
                  nested: tuple[str, ...] = ()) -> tuple[tuple[str, Any], ...]:
    """(field, reader) for each field of the record class ``cls``: the reader of the kind
    ``table`` gives the key of that name. ``derived``: fields not read from a key (the
    collector's name is its key in ``collectors``); ``nested``: fields read from a key of a
    kind of nested objects, by the caller. A field that ``table`` lacks, or of a kind no reader
    reads, raises (at import: the reader reads only what the schema defines)."""
    out = []
    for f in fields(cls):
        if f.name in derived:
            continue
        spec = table.field(f.name)
        if f.name in nested:
            if spec.kind not in (schema.RECORDS, schema.RECORD_MAP):
                raise TypeError(f"{cls.__name__}.{f.name}: {table.name} says {spec.kind}, not nested objects")
            continue
        if spec.kind not in _KIND_READERS:
            raise TypeError(f"{cls.__name__}.{f.name}: no reader of kind {spec.kind!r}")
        out.append((f.name, _KIND_READERS[spec.kind]))
    return tuple(out)


def _read(readers, obj: dict) -> dict:
    """The fields of one manifest object, each read by its kind."""
    return {name: read(obj.get(name)) for name, read in readers}


def read_key(table: schema.Table, obj: dict, key: str):
    """One key of a manifest object, read by the kind ``table`` gives it (KeyError: not in the schema)."""
    return _KIND_READERS[table.field(key).kind](obj.get(key))


_CLOCK = field_readers(ClockSample, schema.CLOCK_SAMPLE)
_SOCKET = field_readers(SocketInfo, schema.SOCKET)
_PROCESS = field_readers(ProcessInfo, schema.PROCESS, nested=("sockets",))
_RECORD = field_readers(CollectorStatus, schema.RECORD, derived=("name",))
_NETNS = field_readers(NetnsInfo, schema.NETNS)
_FILE = field_readers(FileEntry, schema.FILE)
_TOP = field_readers(Manifest, schema.TOP, derived=("raw",),
                     nested=("clock_samples", "collectors", "processes", "netns", "files"))


def _sockets(v) -> tuple[SocketInfo, ...]:
    out = []
    for s in _seq(v):
        if not isinstance(s, dict):
            continue
        d = _read(_SOCKET, s)
        if d["saddr"] and d["sport"] is not None:
            out.append(SocketInfo(**dict(d, daddr=d["daddr"] or "", dport=d["dport"] or 0)))
    return tuple(out)


def parse_manifest(raw: Any, problems: list[str], fallback_host: str) -> Manifest:
    """Typed view of manifest.json; what does not validate is dropped with a problem line."""
    if not isinstance(raw, dict):
        problems.append("manifest.json: not a JSON object; using defaults")
        raw = {}
    top = _read(_TOP, raw)
    schema_version = top["schema_version"]
    if schema_version is None:
        problems.append("manifest.json: schema_version missing or not an integer")
    elif schema_version > SUPPORTED_SCHEMA:
        problems.append(f"manifest.json: schema_version {schema_version} is newer than this stallscope reads "
                        f"({SUPPORTED_SCHEMA}); reading what it can")
    host = top["host"] or read_key(schema.TOP, raw, "hostname")
    if not host:
        problems.append(f"manifest.json: no host name; using {fallback_host!r}")
        host = fallback_host
    elif not host.isprintable():
        problems.append(f"manifest.json: host name {host!r} has control characters; escaped")
        host = _printable(host)
    top["host"] = host

    samples = []
    cs = raw.get("clock_samples")
    if not isinstance(cs, list):
        cs = []
    for i, s in enumerate(cs):
        d = _read(_CLOCK, s) if isinstance(s, dict) else {}
        mono, real = d.get("monotonic_ns"), d.get("realtime_ns")
        if mono is None or real is None or mono < 0 or real < 0:   # (both >= 0: their difference fits int64)
            problems.append(f"manifest.json: clock_samples[{i}] is not a {{monotonic_ns, realtime_ns}} pair; ignored")
            continue
        samples.append(ClockSample(**d))
    if not samples:
        problems.append("manifest.json: no clock samples; tracer times cannot be put on the UTC timeline exactly")

    collectors = {}
    cols = raw.get("collectors")
    if isinstance(cols, dict):
        for name, c in cols.items():
            if not isinstance(c, dict):
                problems.append(f"manifest.json: collector {name!r} is not an object; ignored")
                continue
            d = _read(_RECORD, c)
            collectors[name] = CollectorStatus(name=name, **dict(d, status=d["status"] or "unknown"))
    elif cols is not None:
        problems.append("manifest.json: collectors is not an object; ignored")

    processes = []
    for i, p in enumerate(raw.get("processes") if isinstance(raw.get("processes"), list) else []):
        d = _read(_PROCESS, p) if isinstance(p, dict) else {}
        if d.get("pid") is None:
            problems.append(f"manifest.json: processes[{i}] has no pid; ignored")
            continue
        processes.append(ProcessInfo(**d, sockets=_sockets(p.get("sockets"))))

    netns = []
    for n in raw.get("netns") if isinstance(raw.get("netns"), list) else []:
        d = _read(_NETNS, n) if isinstance(n, dict) else {}
        if d.get("inode") is not None:
            netns.append(NetnsInfo(**dict(d, label=d["label"] or str(n["inode"]))))

    files = []
    for f in raw.get("files") if isinstance(raw.get("files"), list) else []:
        d = _read(_FILE, f) if isinstance(f, dict) else {}
        if d.get("path"):
            files.append(FileEntry(**d))

    return Manifest(**top, clock_samples=samples, collectors=collectors, processes=processes, netns=netns,
                    files=files, raw=raw)


# --------------------------------------------------------------------------- the bundle


class EventLog(list):
    """Tracer events in file order (a list of dicts) with a per-kind index built on first
    use: the model asks for each kind (coll, comm_init, host_wait, offcpu, TCP
    tracepoints, ...) several times, and a scan of the whole log per question is what
    dominated reading a big bundle. The log is read once and not changed afterwards."""

    _index: dict[str, list[dict]] | None = None

    @classmethod
    def of(cls, events) -> "EventLog":
        return events if isinstance(events, EventLog) else cls(events)

    def kind(self, ev: str) -> list[dict]:
        if self._index is None:
            index: dict[str, list[dict]] = {}
            for e in self:
                index.setdefault(e.get("ev"), []).append(e)
            self._index = index
        return self._index.get(ev, [])


class Bundle:
    """An opened bundle. Use as a context manager (or call :meth:`close`) so the
    temporary folder an archive was unpacked into is removed."""

    loose = None     # the LooseSet a forensics.inputs.loose.LooseBundle reads; a capture's bundle has none

    def __init__(self, source: Path, root: Path, manifest: Manifest, problems: list[str],
                 tmpdir: Path | None = None):
        self.source = source
        self.root = root
        self.manifest = manifest
        self.problems = problems
        self._tmpdir = tmpdir
        self._closed = False
        self.clock: ClockMap | None = None
        if manifest.clock_samples:
            self.clock = ClockMap(manifest.clock_samples)
        else:
            self.clock = self._fallback_clock()

    # ---- opening
    @classmethod
    def open(cls, path: str | os.PathLike, *, workdir: str | os.PathLike | None = None,
             max_member_bytes: int = MAX_MEMBER_BYTES, max_total_bytes: int = MAX_TOTAL_BYTES,
             max_members: int = MAX_MEMBERS) -> "Bundle":
        src = Path(path)
        if not src.exists():
            raise InputError(f"{src}: no such bundle")
        tmp = None
        if src.is_dir():
            folder = src
        else:
            tmp = Path(tempfile.mkdtemp(prefix="stallscope-bundle-", dir=workdir))
            try:
                unpack_archive(src, tmp, max_member_bytes=max_member_bytes, max_total_bytes=max_total_bytes,
                               max_members=max_members)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            folder = tmp
        try:
            return cls._load(src, folder, tmp)
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def _load(cls, src: Path, folder: Path, tmp: Path | None) -> "Bundle":
        root = find_root(folder)
        if root is None:
            raise InputError(f"{src}: not a stallscope bundle (no manifest.json, bpf/ or pcap/ inside)")
        problems: list[str] = []
        m = BUNDLE_NAME_RE.match(src.name) or BUNDLE_NAME_RE.match(root.name)
        fallback_host = m.group("host") if m else (src.name.split(".")[0] or "host")
        mpath = root / "manifest.json"
        raw: Any = {}
        if _regular(mpath):
            try:
                raw = json.loads(mpath.read_text(errors="replace"))
            except ValueError as e:
                problems.append(f"manifest.json: not valid JSON ({str(e).splitlines()[0]}); using defaults")
        else:
            problems.append("manifest.json: missing; host, clock and processes unknown")
        manifest = parse_manifest(raw, problems, fallback_host)
        b = cls(src, root, manifest, problems, tmp)
        b._check_files()
        return b

    def close(self) -> None:
        """Remove the unpacked copy. The manifest, clock and problems stay; reading a file
        of a closed bundle raises (the model's per-host stage closes each bundle once it
        has read everything it needs, :mod:`forensics.model.hosts`)."""
        self._closed = True
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- contents
    @property
    def host(self) -> str:
        return self.manifest.host

    @property
    def node(self) -> str | None:
        """The host this bundle captured; None for loose evidence (its lines name their hosts)."""
        return None if self.loose is not None else self.host

    def path(self, rel: str) -> Path | None:
        """A regular file inside the bundle (never through a symlink), or None."""
        self._check_open()
        try:
            parts = safe_relpath(rel).parts
        except InputError:
            return None
        p = self.root.joinpath(*parts)
        cur = self.root
        for part in parts:      # no component may be a link (an unpacked folder is not ours)
            cur = cur / part
            if cur.is_symlink():
                return None
        return p if _regular(p) else None

    def files(self, pattern: str = "**/*") -> Iterator[tuple[str, Path]]:
        """(relative path, path) of the regular files matching a glob, sorted; links skipped."""
        self._check_open()
        for p in sorted(self.root.glob(pattern)):
            rel = p.relative_to(self.root).as_posix()
            if self.path(rel) is not None:
                yield rel, p

    def pcaps(self) -> list[tuple[str, Path]]:
        return [(r, p) for r, p in self.files("pcap/*") if r.endswith((".pcap", ".pcapng", ".cap"))]

    def read_bpf_events(self) -> EventLog:
        """bpf/events.jsonl as dicts; a cut last line or garbage lines are skipped with a problem."""
        p = self.path("bpf/events.jsonl")
        if p is None:
            if self.manifest.collectors.get("tracer", CollectorStatus("tracer", "skipped")).status != "skipped":
                self.problems.append("bpf/events.jsonl: missing; no NCCL calls or kernel TCP events")
            return EventLog()
        out, bad, first_bad = [], 0, None
        typed, first_typed = 0, None
        with open(p, "rb") as fh:
            for ln, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError):
                    obj = None
                if not isinstance(obj, dict) or not isinstance(obj.get("ev"), str):
                    bad += 1
                    first_bad = first_bad or ln
                    continue
                wrong = _event_defect(obj)
                if wrong is not None:
                    typed += 1
                    first_typed = first_typed or (ln, wrong)
                    continue
                out.append(obj)
        if bad:
            self.problems.append(f"bpf/events.jsonl: {bad} unreadable line(s) skipped (first at line {first_bad}; "
                                 "a cut last line means the tracer was killed)")
        if typed:
            self.problems.append(f"bpf/events.jsonl: {typed} event(s) with a field of the wrong type or size skipped "
                                 f"(first at line {first_typed[0]}: {first_typed[1][:40]!r})")
        return EventLog(out)

    def process(self, pid: int) -> ProcessInfo | None:
        return next((p for p in self.manifest.processes if p.pid == pid), None)

    # ---- checks
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.source}: bundle closed, its files are no longer readable")

    def _check_files(self) -> None:
        for name, c in sorted(self.manifest.collectors.items()):
            if c.status == "failed":
                self.problems.append(f"collector {_printable(name)} failed: {_printable(c.reason or 'no reason given')}")
            elif c.status == "running":
                self.problems.append(f"collector {_printable(name)} was still running when the bundle was written")
        for f in self.manifest.files:
            p = self.path(f.path)
            if p is None:
                self.problems.append(f"{_printable(f.path)}: listed in the manifest but missing from the bundle")
            elif f.bytes is not None and p.stat().st_size != f.bytes:
                self.problems.append(f"{_printable(f.path)}: {p.stat().st_size} bytes, the manifest says {f.bytes} (truncated?)")
        if self.manifest.options.get("pcap", True) and not self.pcaps():
            self.problems.append("pcap/: no packet capture in the bundle")

    def _fallback_clock(self) -> ClockMap | None:
        """Without clock samples: place the tracer's times by UTC times the manifest has.

        The tracer's BEGIN record (``tracer_start``, monotonic) fired after the tracer was
        spawned at ``collectors.tracer.started_ns`` (UTC), so pairing them gives the smallest
        possible offset; every event happened before the capture ended (``ended_ns``), which
        bounds the offset from above. Without a ``tracer_start``, the events' span must lie
        inside ``started_ns..ended_ns``: the midpoint is used. The problem line gives the
        bound, so each finding's timing can be judged against it."""
        spawned = int64(self.manifest.record_value("tracer", "started_ns"))
        start_ns, end_ns = self.manifest.started_ns, self.manifest.ended_ns
        p = self.path("bpf/events.jsonl")
        if p is None:
            return None
        begin, first, last = None, None, None
        with open(p, "rb") as fh:
            for line in fh:
                try:
                    e = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if not isinstance(e, dict):
                    continue
                t = int64(e.get("t0", e.get("t")))
                if t is None or not _I64[0] <= t <= _I64[1]:
                    continue
                first = t if first is None else min(first, t)
                last = t if last is None else max(last, t)
                if begin is None and e.get("ev") == "tracer_start":
                    begin = t
        if first is None:
            return None
        hi = end_ns - last if end_ns is not None else None          # largest offset the events allow
        if begin is not None and spawned is not None:
            off = spawned - begin
            if hi is not None and hi >= off:
                err = f"up to +{(hi - off) / 1e9:.3g} s (tracer attach time; bounded by the capture's end)"
            else:
                err = ("of the tracer's attach time (" + ("no capture end time" if hi is None else
                       "the capture's end time contradicts the events") + " to bound it)")
            how = "the tracer's start paired with the time it was launched"
        elif start_ns is not None and hi is not None and hi >= start_ns - first:
            lo = start_ns - first
            off = (lo + hi) // 2
            err = f"±{(hi - lo) / 2e9:.3g} s (the events' span placed inside the capture's start..end)"
            how = "the capture's start and end times"
        else:
            return None
        if not all(_I64[0] <= v <= _I64[1] for v in (off, first + off, last + off)):
            return None
        self.problems.append(f"clock: no clock samples; tracer times approximated, placed by {how}, error {err}")
        return ClockMap([ClockSample(first, first + off)])


# Field types of bpf/events.jsonl as capture/tracer/events.py writes them. A record whose known
# field holds another type (or any int beyond int64, a non-finite float, a nested object)
# is corrupt: it is skipped with a problem line rather than handed to the model, whose
# vectorised columns would fail on it.
_EVENT_INT = frozenset({"t", "t0", "t1", "pid", "tid", "count", "datatype", "dport", "sport", "family", "netns",
                        "nranks", "ns", "oncpu_ns", "runq_ns", "op_count", "rank", "rc", "reason", "red_op", "root",
                        "tracer_pid", "parent_rank", "parent_nranks"})
_EVENT_STR = frozenset({"ev", "comm", "comm_id_hash", "daddr", "saddr", "fn", "name", "newstate", "oldstate", "op",
                        "sk", "state", "stream", "event", "comm_id_source", "parent_comm_id_hash"})
_I64 = (-(1 << 63), (1 << 63) - 1)


def _scalar_ok(v) -> bool:
    t = type(v)
    if t is int:
        return _I64[0] <= v <= _I64[1]
    if t is float:
        return v == v and v not in (float("inf"), float("-inf"))
    return v is None or t is str or t is bool


# keys every record of a kind carries (the tracer writes them, null where unknown); the
# call events are timed by t0 (entry) and t1, every other event by t
_EVENT_KEYS = {"coll": ("t0", "pid", "fn", "op", "comm", "stream"), "group": ("t0", "pid", "fn"),
               "host_wait": ("t0", "pid", "fn"), "comm_init": ("t0", "pid"), "comm_destroy": ("t0", "pid"),
               "sock_state": ("t", "pid"), "offcpu": ("t", "pid"), "tcp_retransmit_skb": ("t",),
               "tcp_send_reset": ("t",), "tcp_receive_reset": ("t",)}


def _event_defect(obj: dict) -> str | None:
    """The first field of an event that is missing or whose type does not fit, or None."""
    need = _EVENT_KEYS.get(obj["ev"])
    if need is None:
        if obj.get("t") is None and obj.get("t0") is None:
            return "t"
    else:
        for k in need:
            if k not in obj or (k in ("t", "t0", "pid") and obj[k] is None):
                return k
    for k, v in obj.items():
        if v is None:
            continue
        t = type(v)
        if k in _EVENT_INT:
            if t is not int or not _I64[0] <= v <= _I64[1]:
                return k
        elif k in _EVENT_STR:
            if t is not str:
                return k
        elif t is list:
            if not all(_scalar_ok(x) for x in v):
                return k
        elif not _scalar_ok(v):
            return k
    return None


def open_bundle(path: str | os.PathLike, **kw) -> Bundle:
    return Bundle.open(path, **kw)


__all__ = ["bundle_name", "find_root", "Bundle", "Manifest", "ClockSample", "ClockMap", "ProcessInfo", "SocketInfo", "CollectorStatus",
           "NetnsInfo", "FileEntry", "open_bundle", "unpack_archive", "parse_manifest", "field_readers", "read_key"]
