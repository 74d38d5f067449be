"""The NCCL version a library file carries, read from the file itself (standard library only).

NCCL builds its version into one string literal so that ``strings`` reveals it: ``src/init.cc``
defines ``VERSION_STRING`` as ``"NCCL version " MAJOR "." MINOR "." PATCH SUFFIX "+cuda" CUDA_MAJOR
"." CUDA_MINOR`` (``NCCL version 2.21.5+cuda12.4``; ROCm's RCCL: ``RCCL version 2.18.3+hip6.0``
or, in later releases, ``RCCL version : 2.18.3``). The same bytes are what NCCL prints on its
``NCCL version`` log line, so the version read here compares equal with the one a log states
(``forensics/parsers/nccl_debug.py`` keeps ``\\d+.\\d+.\\d+\\S*`` of that line).

A library exporting a statically linked NCCL (``libtorch_cuda.so``) carries the literal too.
Libraries are large (a libnccl is hundreds of MB, mostly GPU code), so only the read-only data
sections are scanned (``.rodata*``, where a C string literal lives), in chunks; a file whose
section headers are gone (``sstrip``) is scanned whole, up to ``MAX_SCAN_BYTES``. Results are
memoised on (device, inode, mtime, size): a watcher asks for the same file again and again.
"""
from __future__ import annotations

import os
import re

from .elf import ElfError, sections

VERSION_RE = re.compile(rb"(?:NCCL|RCCL) version (?:: )?(\d+\.\d+\.\d+[!-~]*)")
CHUNK_BYTES = 4 << 20
OVERLAP_BYTES = 256            # a match straddling two chunks is found in the second
MAX_SCAN_BYTES = 1 << 30       # the most a file without section headers is read
DATA_SECTIONS = (".rodata",)   # and .rodata.* (name prefix)

_CACHE: dict[tuple, str | None] = {}


def scan(path: str | os.PathLike, pattern: re.Pattern, ranges: list[tuple[int, int]],
         chunk: int = CHUNK_BYTES, overlap: int = OVERLAP_BYTES) -> re.Match | None:
    """The first match of ``pattern`` (bytes) in the byte ranges ``(offset, size)`` of ``path``,
    read ``chunk`` bytes at a time; consecutive chunks share ``overlap`` bytes, so a match
    no longer than that is found whole wherever it lies (one that reaches a chunk's end is
    taken from the next chunk, which may extend it). None when there is none."""
    with open(path, "rb") as fh:
        for start, size in ranges:
            pos, end, tail = start, start + size, b""
            while pos < end:
                fh.seek(pos)
                data = fh.read(min(chunk, end - pos))
                if not data:
                    break
                buf = tail + data
                pos += len(data)
                m = pattern.search(buf)
                if m and (m.end() < len(buf) or pos >= end or m.start() < len(buf) - overlap):
                    return m
                tail = buf[-overlap:]
    return None


def data_ranges(path: str | os.PathLike, limit: int = MAX_SCAN_BYTES) -> list[tuple[int, int]]:
    """(offset, size) of ``path``'s read-only data sections; the whole file (at most ``limit``
    bytes) when it has no section headers or none of them is read-only data."""
    try:
        found = [(s.offset, s.size) for s in sections(path)
                 if s.type != 8 and s.size and (s.name in DATA_SECTIONS or s.name.startswith(".rodata."))]
    except ElfError:
        found = []
    return found or [(0, min(os.path.getsize(path), limit))]


def nccl_version(path: str | os.PathLike) -> str | None:
    """The NCCL version ``path`` carries (``2.21.5+cuda12.4``), or None: no version string (a
    stub, a plugin, a library with no NCCL inside) or the file cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        try:
            m = scan(path, VERSION_RE, data_ranges(path))
        except OSError:
            return None
        _CACHE[key] = m.group(1).decode("ascii", "replace") if m else None
    return _CACHE[key]
