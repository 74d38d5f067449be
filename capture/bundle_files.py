"""The bundle on disk: a staging folder, the byte budget, the manifest, the tar.gz.

Budget arithmetic works on the *uncompressed tar size* (512-byte header per
member, data padded to 512, end blocks, 10 KiB record rounding) plus a bound on
gzip's worst-case expansion, so a bundle planned within ``--max-bytes`` is
within it once compressed, whatever the data. The archive is checked after
writing anyway; should it still be over, the largest capped files are cut and
it is written again.
"""
from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import os
import re
import socket
import struct
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import manifest as schema

TAR_BLOCK = 512
TAR_RECORD = 10240
MIN_BUDGET = 256 * 1024


def tar_member_bytes(size: int) -> int:
    return TAR_BLOCK + (size + TAR_BLOCK - 1) // TAR_BLOCK * TAR_BLOCK


def tar_total_bytes(sizes: list[int], dirs: int = 0) -> int:
    raw = sum(tar_member_bytes(s) for s in sizes) + TAR_BLOCK * dirs + 2 * TAR_BLOCK
    return (raw + TAR_RECORD - 1) // TAR_RECORD * TAR_RECORD


def gzip_bound(n: int) -> int:
    """Worst-case gzip size of n bytes: stored blocks (5 bytes per 16 KiB at most) + header/trailer."""
    return n + 5 * (n // 16384 + 1) + 64


def archive_bound(sizes: list[int], dirs: int = 0) -> int:
    return gzip_bound(tar_total_bytes(sizes, dirs))


@dataclass
class Budget:
    """Shares of --max-bytes, in uncompressed bytes. ``take`` is thread-safe.

    ``other`` (snapshots, logs, attachments) keeps ``attach`` bytes of it for the files
    attached at the end (NCCL_DEBUG logs, Flight Recorder dumps, nccl-tests output): the
    snapshots of many namespaces taken at the start must not leave the most telling
    evidence of a hang no room at all. Attachments may use the rest of the pool as well."""

    max_bytes: int
    pcap: int = 0
    tracer: int = 0
    other: int = 0
    reserve: int = 0
    attach: int = 0
    _other_used: int = field(default=0, init=False)
    _attach_used: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    ATTACH_SHARE = 0.35     # of the 'other' pool, kept for attachments

    @classmethod
    def plan(cls, max_bytes: int, pcap: bool = True, tracer: bool = True) -> "Budget":
        # reserve: manifest, tar headers of a few hundred files, gzip expansion
        reserve = 96 * 1024 + max_bytes // 50
        usable = max(0, max_bytes - reserve)
        weights = {"pcap": 55 if pcap else 0, "tracer": 25 if tracer else 0, "other": 20}
        total = sum(weights.values())
        shares = {k: usable * w // total for k, w in weights.items()}
        return cls(max_bytes=max_bytes, reserve=reserve, attach=int(shares["other"] * cls.ATTACH_SHARE), **shares)

    def take(self, wanted: int, pool: str = "other") -> int:
        """Grant up to ``wanted`` bytes: ``pool="other"`` (snapshots) from the shared pool minus
        the attachments' part; ``pool="attach"`` from the attachments' part first, then the rest."""
        with self._lock:
            shared_room = max(0, self.other - self.attach - self._other_used)
            if pool == "attach":
                own = max(0, min(wanted, self.attach - self._attach_used))
                self._attach_used += own
                more = max(0, min(wanted - own, shared_room))
                self._other_used += more
                return own + more
            grant = max(0, min(wanted, shared_room))
            self._other_used += grant
            return grant

    def room(self, pool: str = "other") -> int:
        """Bytes ``take(.., pool)`` could grant now."""
        with self._lock:
            shared_room = max(0, self.other - self.attach - self._other_used)
            return shared_room + (max(0, self.attach - self._attach_used) if pool == "attach" else 0)

    def give_back(self, n: int, pool: str = "other") -> None:
        with self._lock:
            if pool == "attach":   # the shared part goes back first (it was taken last)
                back = min(n, self._other_used)
                self._other_used -= back
                self._attach_used = max(0, self._attach_used - (n - back))
            else:
                self._other_used = max(0, self._other_used - n)

    def to_manifest(self) -> dict:
        return schema.BUDGET.make(max_bytes=self.max_bytes, pcap=self.pcap, tracer=self.tracer, other=self.other,
                                  attach=self.attach, reserve=self.reserve, other_used=self._other_used,
                                  attach_used=self._attach_used)


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)
_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", re.I)


def parse_size(text: str) -> int:
    """'2G', '500M', '64k', '1048576' -> bytes (binary multiples: 2G = 2 GiB)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"bad size {text!r} (examples: 2G, 500M, 64k)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def parse_duration(text: str) -> float:
    """'2m', '90s', '1h30m', '500ms', '45' (seconds) -> seconds."""
    s = str(text).strip().lower()
    pos, total = 0, 0.0
    if not s:
        raise ValueError("empty duration")
    for m in _DUR_RE.finditer(s):
        if m.start() != pos:
            raise ValueError(f"bad duration {text!r} (examples: 2m, 90s, 1h30m)")
        unit = m.group(2) or "s"
        total += float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"bad duration {text!r} (examples: 2m, 90s, 1h30m)")
    return total


def utc_stamp(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def short_host() -> str:
    host = socket.gethostname().split(".")[0] or "host"
    return re.sub(r"[^A-Za-z0-9_-]", "-", host)


def choose_output(output: str | None, host: str, started_ns: int) -> Path:
    """Where the bundle goes. A folder (or nothing: the current folder) gets the
    standard name, suffixed -1, -2, ... when taken; an explicit file name that
    exists is refused (never overwrite a bundle)."""
    name = f"stallscope-{host}-{utc_stamp(started_ns)}"
    if output is None or output == "" or Path(output).is_dir() or output.endswith(os.sep):
        folder = Path(output or ".")
        if not folder.is_dir():
            raise FileNotFoundError(f"output folder {folder} does not exist")
        for i in range(0, 1000):
            cand = folder / (f"{name}.tar.gz" if i == 0 else f"{name}-{i}.tar.gz")
            if not cand.exists() and not Path(str(cand) + ".partial").exists():
                return cand.resolve()
        raise FileExistsError(f"no free bundle name in {folder}")
    path = Path(output)
    if path.exists():
        raise FileExistsError(f"{path} exists; stallscope never overwrites a bundle")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"output folder {path.parent} does not exist")
    if not path.name.endswith((".tar.gz", ".tgz")):
        path = path.with_name(path.name + ".tar.gz")
        if path.exists():
            raise FileExistsError(f"{path} exists; stallscope never overwrites a bundle")
    return path.resolve()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def list_files(staging: Path) -> list[Path]:
    """The files of the bundle: hidden names (the staging folder's lock, the staged manifest) stay out."""
    return sorted(p for p in staging.rglob("*") if p.is_file() and not p.is_symlink()
                  and not any(part.startswith(".") for part in p.relative_to(staging).parts))


def file_entries(staging: Path, exclude: tuple[str, ...] = ("manifest.json",)) -> list[dict]:
    out = []
    for p in list_files(staging):
        rel = p.relative_to(staging).as_posix()
        if rel in exclude:
            continue
        out.append(schema.FILE.make(path=rel, bytes=p.stat().st_size, sha256=sha256_file(p)))
    return out


def truncate_file(path: Path, keep: int, from_end: bool = True) -> None:
    """Cut path to keep bytes: the tail of a log (latest is most useful), the head otherwise."""
    size = path.stat().st_size
    if size <= keep:
        return
    if from_end:
        with open(path, "rb") as fh:
            fh.seek(size - keep)
            data = fh.read()
        with open(path, "wb") as fh:
            fh.write(data)
    else:
        os.truncate(path, keep)


def write_archive(staging: Path, dest: Path, arcroot: str, level: int = 6) -> int:
    """tar.gz of staging under folder arcroot (gzip ``level``); written to dest.partial, linked to
    dest without ever replacing an existing file. Returns the archive size."""
    tmp = Path(str(dest) + ".partial")

    def visible(info: tarfile.TarInfo):
        rel = info.name.split("/")[1:]
        return None if any(part.startswith(".") for part in rel) else info
    with open(tmp, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=level, mtime=0) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                tar.add(staging, arcname=arcroot, recursive=True, filter=visible)
    size = tmp.stat().st_size
    return size


def commit_archive(dest: Path) -> Path:
    tmp = Path(str(dest) + ".partial")
    os.link(tmp, dest)  # fails if dest appeared meanwhile: never overwrite
    os.unlink(tmp)
    return dest


def dumps_manifest(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1, sort_keys=False, default=str) + "\n").encode()


def timezone_facts() -> dict:
    """This host's time zone (the job's logs print local times without a zone): its name and
    its offset east of UTC now, in seconds."""
    t = time.localtime()
    return schema.TIMEZONE.make(name=t.tm_zone, utc_offset_s=int(t.tm_gmtoff))


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def stream_copy(src, dst_path: Path, limit: int, errors: list[str] | None = None) -> tuple[int, bool]:
    """Copy a binary stream into dst_path as it comes (each read written at once, unbuffered,
    so a killed capture keeps what arrived), at most limit bytes; (bytes, truncated).

    A write error (a full disk) ends the copying but not the reading: the pipe is drained
    so the writer never blocks; the error goes to ``errors``."""
    n, truncated = 0, False
    fd = src.fileno()
    with open(dst_path, "wb", buffering=0) as out:
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except InterruptedError:
                continue
            if not chunk:
                break
            room = limit - n
            if room <= 0:
                truncated = True
                continue
            view = memoryview(chunk)[:room]
            try:
                while view:
                    w = out.write(view)
                    n += w
                    view = view[w:]
            except OSError as e:
                truncated, limit = True, n
                if errors is not None:
                    errors.append(f"writing {dst_path.name} failed after {n} bytes: {e.strerror or e}")
                continue
            if len(chunk) > room:
                truncated = True
    return n, truncated


def write_capped(path: Path, data: bytes, budget: Budget, per_file_max: int, *, pool: str = "other",
                 keep_head: bool = False) -> tuple[int, bool]:
    """Write data within the budget's ``pool``; (bytes, truncated). Too big: its tail is kept
    (the newest lines), or with ``keep_head`` its first quarter and its tail (a log's start
    says how the job was configured, its end how it failed), with a marker where it was cut."""
    want = min(len(data), per_file_max)
    grant = budget.take(want + TAR_BLOCK * 2, pool)  # count the tar header and padding too
    room = max(0, grant - TAR_BLOCK * 2)
    if room < len(data):
        note = b"\n[truncated by stallscope: byte budget]\n"
        avail = room - len(note)
        if avail <= 0:
            data = b""
        elif keep_head:
            head = data[:avail // 4]
            head = head[:head.rfind(b"\n") + 1] if b"\n" in head else head
            tail = data[len(data) - (avail - len(head)):]
            data = head + note.lstrip(b"\n") + tail
        else:
            data = note.lstrip(b"\n") + data[len(data) - avail:]
        truncated = True
    else:
        truncated = False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    budget.give_back(max(0, room - len(data)), pool)
    return len(data), truncated


_PCAP_MAGIC = {b"\xd4\xc3\xb2\xa1": "<", b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",
               b"\xa1\xb2\x3c\x4d": ">"}


_PCAP_SEEN: dict[str, tuple[int, int, int]] = {}   # path -> (inode, offset, records) for incremental counts


def pcap_records(path: Path) -> int:
    """Complete records in a classic pcap file (a record cut by a kill is not counted).
    Incremental: a file that only grew is walked from where the last call stopped."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            head = fh.read(24)
            bo = _PCAP_MAGIC.get(head[:4])
            if bo is None or len(head) < 24:
                return 0
            ino, off, n = _PCAP_SEEN.get(str(path), (st.st_ino, 24, 0))
            if ino != st.st_ino or off > st.st_size:
                off, n = 24, 0
            rec = struct.Struct(bo + "IIII")
            fh.seek(off)
            while off + 16 <= st.st_size:
                h = fh.read(16)
                if len(h) < 16:
                    break
                incl = rec.unpack(h)[2]
                if off + 16 + incl > st.st_size:
                    break
                off += 16 + incl
                fh.seek(off)
                n += 1
            _PCAP_SEEN[str(path)] = (st.st_ino, off, n)
            return n
    except OSError:
        return 0


_PCAP_NANO = (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")


def pcap_span(path: Path) -> tuple[int, int] | None:
    """UTC ns of the first and last complete record of a classic pcap file (tcpdump
    ``--time-stamp-precision nano`` writes nanosecond pcap; microsecond files are read too),
    None when it has none. Reads the record headers only, from the start to the end."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(24)
            bo = _PCAP_MAGIC.get(head[:4])
            if bo is None or len(head) < 24:
                return None
            scale = 1 if head[:4] in _PCAP_NANO else 1000
            rec = struct.Struct(bo + "IIII")
            off, first, last = 24, None, None
            while off + 16 <= size:
                fh.seek(off)
                h = fh.read(16)
                if len(h) < 16:
                    break
                sec, frac, incl, _ = rec.unpack(h)
                if off + 16 + incl > size:
                    break            # cut by a kill: not a complete record
                t = sec * 1_000_000_000 + frac * scale
                first = t if first is None else first
                last = t
                off += 16 + incl
            return (first, last) if first is not None else None
    except OSError:
        return None


def gz_ok(path: Path) -> bool:
    try:
        with tarfile.open(path, "r:gz") as tar:
            tar.getmembers()
        return True
    except (tarfile.TarError, OSError, EOFError):
        return False


__all__ = ["Budget", "parse_size", "parse_duration", "choose_output", "write_archive", "commit_archive",
           "file_entries", "archive_bound", "tar_total_bytes", "gzip_bound", "truncate_file", "utc_stamp",
           "short_host", "boot_id", "timezone_facts", "dumps_manifest", "write_capped", "stream_copy",
           "MIN_BUDGET"]
