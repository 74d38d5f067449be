"""Archives from untrusted hands, unpacked safely: bundles (strict) and loose evidence (lenient).

A bundle is a tar.gz the capture wrote; loose evidence is whatever the user has (a tarball of
a Slurm job's output folder, a zip of torchrun logs, a gzipped log). Both come from a broken
node, a truncated copy or someone else, so neither is given to ``tarfile.extract*``:

- member names must be relative, without ``..``, NUL or backslash tricks, and land inside the
  destination folder (checked after normalisation); files are created with
  ``O_EXCL | O_NOFOLLOW``;
- only regular files and folders are written: a symbolic or hard link, a device, a FIFO or a
  sparse member is never created;
- the bytes actually decompressed are counted (a header's size field is not trusted).

:func:`unpack_archive` (a bundle) refuses the whole archive on the first such defect, with one
line (:class:`InputError`): a bundle holds nothing else. :func:`unpack_loose` (loose evidence)
keeps going: a member it will not write is skipped and said, a member or archive that would
unpack past the shared :class:`Budget` is cut there and said (a zip bomb costs its share of the
budget, nothing more), and an archive cut short keeps the members read before the cut.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import InputError

MAX_MEMBER_BYTES = 8 << 30       # one file inside a bundle (pcaps are capped by --max-bytes anyway)
MAX_TOTAL_BYTES = 32 << 30       # everything unpacked from one archive
MAX_MEMBERS = 200_000
LOOSE_BUDGET = 8 << 30           # everything unpacked from loose archives in one analysis
_CHUNK = 1 << 20

_BAD_NAME = re.compile(r"[\x00]")
TAR_MAGIC_AT = 257


# --------------------------------------------------------------------------- shared rules

def safe_relpath(name: str) -> PurePosixPath:
    """The member name as a relative path that stays inside the destination, or raise."""
    if not name or _BAD_NAME.search(name):
        raise InputError(f"refusing archive member with an empty or NUL name: {name!r}")
    if name.startswith("/") or name.startswith("\\") or re.match(r"^[A-Za-z]:", name):
        raise InputError(f"refusing archive member with an absolute path: {name!r}")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise InputError(f"refusing archive member that climbs out of its archive: {name!r}")
    if not parts:
        raise InputError(f"refusing archive member with an empty name: {name!r}")
    return PurePosixPath(*parts)


def member_kind(m: tarfile.TarInfo) -> str:
    if m.issym():
        return "symbolic link"
    if m.islnk():
        return "hard link"
    if m.ischr() or m.isblk():
        return "device node"
    if m.isfifo():
        return "FIFO"
    if m.issparse():
        return "sparse file"
    if m.isdir():
        return "dir"
    if m.isreg():
        return "file"
    return f"member of type {m.type!r}"


def make_dirs(dest: Path, parts: tuple[str, ...]) -> None:
    """The folders ``parts`` below ``dest``; a file or link where one is needed is refused."""
    cur = dest
    for p in parts:
        cur = cur / p
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):   # a file or link where a folder is needed
            raise InputError(f"archive member path {cur.relative_to(dest)!s} is both a file and a folder")


def _inside(dest: Path, rel: PurePosixPath) -> Path | None:
    """``dest``/``rel``, or None when it would leave ``dest`` (normalised by safe_relpath;
    this is the belt to those braces)."""
    target = dest.joinpath(*rel.parts)
    return target if os.path.commonpath([str(dest), str(target)]) == str(dest) else None


def _create(target: Path):
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "wb")


# --------------------------------------------------------------------------- bundles: strict

def unpack_archive(path: Path, dest: Path, *, max_member_bytes: int = MAX_MEMBER_BYTES,
                   max_total_bytes: int = MAX_TOTAL_BYTES, max_members: int = MAX_MEMBERS) -> None:
    """Unpack a bundle's .tar.gz/.tar into the empty folder ``dest`` with the rules of the
    module docstring, refusing the whole archive at the first defect. Raises ``InputError``
    (one line); ``dest`` may then hold a partial tree, which the caller removes."""
    dest = dest.resolve()
    total = 0
    count = 0
    label = path.name
    try:
        with open(path, "rb") as raw:
            head = raw.read(2)
            raw.seek(0)
            # GzipFile (not tarfile's own r|gz) checks the trailer's CRC and length
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if head == b"\x1f\x8b" else raw
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for m in tar:
                    count += 1
                    if count > max_members:
                        raise InputError(f"{label}: more than {max_members} archive members; refusing (not a bundle?)")
                    kind = member_kind(m)
                    try:
                        rel = safe_relpath(m.name)
                    except InputError as e:
                        raise InputError(f"{label}: {e}") from None
                    if kind not in ("file", "dir"):
                        raise InputError(f"{label}: refusing {kind} {m.name!r} in the archive "
                                         "(a bundle holds only regular files and folders)")
                    target = _inside(dest, rel)
                    if target is None:
                        raise InputError(f"{label}: refusing archive member outside the bundle: {m.name!r}")
                    make_dirs(dest, rel.parts if kind == "dir" else rel.parts[:-1])
                    if kind == "dir":
                        continue
                    if m.size > max_member_bytes:
                        raise InputError(f"{label}: member {m.name!r} is {m.size} bytes, over the "
                                         f"{max_member_bytes}-byte limit per file")
                    src = tar.extractfile(m)
                    written = 0
                    with _create(target) as out:
                        while True:
                            chunk = src.read(_CHUNK)
                            if not chunk:
                                break
                            written += len(chunk)
                            total += len(chunk)
                            if written > max_member_bytes:
                                raise InputError(f"{label}: member {m.name!r} exceeds the {max_member_bytes}-byte "
                                                 "limit per file")
                            if total > max_total_bytes:
                                raise InputError(f"{label}: unpacks to more than {max_total_bytes} bytes; "
                                                 "refusing (decompression bomb?)")
                            out.write(chunk)
                    if written != m.size:
                        raise InputError(f"{label}: member {m.name!r} is cut short (archive truncated)")
            # past the end-of-archive blocks: the rest must still decompress (a cut
            # trailer means a truncated copy, even when every member came out whole)
            while stream.read(_CHUNK):
                pass
    except InputError:
        raise
    except FileExistsError as e:
        raise InputError(f"{label}: archive member {e.filename!r} appears twice or collides with a folder") from None
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
        what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, (EOFError, zlib.error, gzip.BadGzipFile)) or "end of file" in what.lower() or "unexpected end" in what.lower():
            raise InputError(f"{label}: corrupt or truncated archive ({what})") from None
        if isinstance(e, OSError) and not isinstance(e, (tarfile.TarError,)) and e.filename:
            raise InputError(f"{label}: cannot unpack: {e.strerror or what}") from None
        raise InputError(f"{label}: not a readable tar.gz bundle ({what})") from None
    if count == 0:
        raise InputError(f"{label}: empty archive")


# --------------------------------------------------------------------------- what a file is

CONTAINERS = ("tar", "zip", "gzip", "bzip2", "xz")
_MAGIC = ((b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"), (b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"),
          (b"\xfd7zXZ\x00", "xz"))
_OPENERS = {"gzip": gzip.open, "bzip2": bz2.open, "xz": lzma.open}


def container_kind(path: str | os.PathLike) -> str | None:
    """``tar`` (plain or compressed), ``zip``, ``gzip``/``bzip2``/``xz`` (one compressed
    file), or None (not an archive), from the file's first bytes."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(TAR_MAGIC_AT + 8)
    except OSError:
        return None
    if _is_tar_header(head):
        return "tar"
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            if kind in _OPENERS:
                try:
                    with _OPENERS[kind](path, "rb") as z:
                        inner = z.read(TAR_MAGIC_AT + 8)
                except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError):
                    return kind            # a damaged stream: the reader says so
                return "tar" if _is_tar_header(inner) else kind
            return kind
    return None


def _is_tar_header(block: bytes) -> bool:
    if len(block) >= TAR_MAGIC_AT + 5 and block[TAR_MAGIC_AT:TAR_MAGIC_AT + 5] == b"ustar":
        return True
    if len(block) < 512:
        return False
    try:                                   # a v7 tar: no magic, but a valid header checksum
        tarfile.TarInfo.frombuf(block[:512], "utf-8", "surrogateescape")
        return True
    except (tarfile.HeaderError, ValueError):
        return False


def tar_looks_like_bundle(path: str | os.PathLike, max_members: int = 400, max_bytes: int = 64 << 20) -> bool | None:
    """Whether a tar archive's first members show a bundle's layout (``manifest.json``, ``bpf/``
    or ``pcap/`` at its top or in its one top folder); None when its first ``max_members``
    members (``max_bytes`` of data) do not tell."""
    seen = 0
    try:
        with tarfile.open(path, mode="r|*") as tar:
            for m in tar:
                parts = [p for p in m.name.replace("\\", "/").split("/") if p not in ("", ".")]
                if parts and len(parts) <= 2:
                    last = parts[-1]
                    if (last == "manifest.json" and m.isreg()) or (last in ("bpf", "pcap") and m.isdir()):
                        return True
                if len(parts) >= 2 and len(parts) <= 3 and parts[-2] in ("bpf", "pcap"):
                    return True
                seen += 1
                if seen >= max_members or (m.offset_data or 0) > max_bytes:
                    return None
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError):
        return None
    return False


# --------------------------------------------------------------------------- loose evidence: lenient

@dataclass
class Budget:
    """Bytes loose archives may still unpack to, shared by every archive of one analysis; one
    member may take at most half of it (a bomb cannot starve the members after it)."""

    left: int = LOOSE_BUDGET
    total: int = LOOSE_BUDGET

    @classmethod
    def of(cls, total: int) -> "Budget":
        return cls(total, total)

    @property
    def member_cap(self) -> int:
        return max(1 << 20, self.total // 2)


@dataclass
class Unpacked:
    """What :func:`unpack_loose` wrote (member name -> file) and what it said."""

    files: list[tuple[str, Path]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)     # (member or "", what happened)


def unpack_loose(path: Path, dest: Path, budget: Budget, kind: str | None = None,
                 max_members: int = MAX_MEMBERS) -> Unpacked:
    """Unpack the archive at ``path`` (``kind`` from :func:`container_kind`) into the empty
    folder ``dest`` under the lenient rules of the module docstring; never raises for its
    content (a note says what was skipped, cut or unreadable)."""
    kind = kind or container_kind(path)
    dest = dest.resolve()
    out = Unpacked()
    try:
        if kind == "tar":
            _untar(path, dest, budget, out, max_members)
        elif kind == "zip":
            _unzip(path, dest, budget, out, max_members)
        elif kind in _OPENERS:
            name = re.sub(r"\.(?:gz|gzip|bz2|xz)$", "", path.name, flags=re.I) or "content"
            with _OPENERS[kind](path, "rb") as src:
                _write(src, name, dest, budget, out)
        else:
            out.notes.append(("", "not an archive"))
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, OSError, ValueError) as e:
        what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        read = f"; the {len(out.files)} member(s) before it are read" if out.files else ""
        out.notes.append(("", f"archive corrupt or cut short ({what}){read}"))
    return out


def _untar(path: Path, dest: Path, budget: Budget, out: Unpacked, max_members: int) -> None:
    count = 0
    with tarfile.open(path, mode="r|*") as tar:
        for m in tar:
            count += 1
            if count > max_members:
                out.notes.append(("", f"more than {max_members} members: the rest not unpacked"))
                return
            kind = member_kind(m)
            if kind == "dir":
                continue
            if kind != "file":
                out.notes.append((m.name, f"{kind}: not unpacked (only regular files are read)"))
                continue
            if budget.left <= 0:
                out.notes.append((m.name, _spent(budget)))
                continue
            src = tar.extractfile(m)
            if src is not None:
                _write(src, m.name, dest, budget, out, declared=m.size)


def _unzip(path: Path, dest: Path, budget: Budget, out: Unpacked, max_members: int) -> None:
    with zipfile.ZipFile(path) as z:
        for count, info in enumerate(z.infolist(), 1):
            if count > max_members:
                out.notes.append(("", f"more than {max_members} members: the rest not unpacked"))
                return
            if info.is_dir():
                continue
            mode = info.external_attr >> 16
            if stat.S_IFMT(mode) and not stat.S_ISREG(mode):     # a type given, and not a file
                what = "symbolic link" if stat.S_ISLNK(mode) else "special file"
                out.notes.append((info.filename, f"{what}: not unpacked (only regular files are read)"))
                continue
            if info.flag_bits & 0x1:
                out.notes.append((info.filename, "encrypted: not unpacked"))
                continue
            if budget.left <= 0:
                out.notes.append((info.filename, _spent(budget)))
                continue
            try:
                with z.open(info) as src:
                    _write(src, info.filename, dest, budget, out, declared=info.file_size)
            except (zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError, ValueError) as e:
                out.notes.append((info.filename, f"unreadable member ({e})"))


def _write(src, name: str, dest: Path, budget: Budget, out: Unpacked, declared: int | None = None) -> None:
    try:
        rel = safe_relpath(name)
    except InputError as e:
        out.notes.append((name, str(e).replace("refusing archive member", "not unpacked: member")))
        return
    target = _inside(dest, rel)
    if target is None:
        out.notes.append((name, "not unpacked: its path leaves the archive's folder"))
        return
    try:
        make_dirs(dest, rel.parts[:-1])
        fh = _create(target)
    except (InputError, FileExistsError, OSError) as e:
        why = "appears twice (the first kept)" if isinstance(e, FileExistsError) else str(e)
        out.notes.append((name, f"not unpacked: {why}"))
        return
    written, cut = 0, False
    with fh:
        while True:
            want = min(_CHUNK, budget.left, budget.member_cap - written)
            if want <= 0:
                cut = bool(src.read(1))
                break
            chunk = src.read(want)
            if not chunk:
                break
            fh.write(chunk)
            written += len(chunk)
            budget.left -= len(chunk)
    out.files.append((name, target))
    if cut:
        why = _spent(budget) if budget.left <= 0 else f"one member may unpack to {budget.member_cap} bytes"
        out.notes.append((name, f"cut after {written} bytes: {why} (decompression bomb?); what was unpacked is read"))
    elif declared is not None and written < declared:
        out.notes.append((name, f"cut short: {written} of {declared} bytes (archive truncated)"))


def _spent(budget: Budget) -> str:
    return f"the {budget.total} bytes allowed for unpacked evidence are spent"


__all__ = ["MAX_MEMBER_BYTES", "MAX_TOTAL_BYTES", "MAX_MEMBERS", "LOOSE_BUDGET", "Budget", "Unpacked",
           "container_kind", "make_dirs", "member_kind", "safe_relpath", "tar_looks_like_bundle", "unpack_archive",
           "unpack_loose"]
