"""A text log's bytes and the line selection every text parser shares.

Job logs are the largest artefacts an incident leaves (every rank's stdout merged by the
launcher, NCCL INFO with a line per collective) and mostly hold lines no parser wants. A
parser therefore never walks a log line by line in Python: :class:`LogText` finds the lines
that hold one of its literal markers with ``memmem`` (``forensics/native/logscan.c``), gets
their bounds and line numbers in one pass, and decodes only those. The file is mapped, not
read: a 512 MB log costs no copy.

Line numbers are 1-based and count ``\\n``, ``\\r\\n`` and a lone ``\\r`` (a progress
bar's rewrite) as line ends, as :func:`.registry.split_lines` does.

Text as pasted (hard-wrapped, joined onto one line, Markdown-quoted, in docker JSON...) is
repaired here, once, before any parser sees it: every :class:`LogText` holds the text
:func:`.normalize.normalize` made of its bytes (``data``; the bytes themselves, mapped, when
they need no repair) beside the bytes as read (``raw``, for structured formats). Where a repair
joined or split lines, line numbers count the lines of the repaired text (``repairs`` names
what was done).
"""
from __future__ import annotations

import mmap
import os
import re
import stat
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from ..errors import InputError
from ..native import first_offsets, line_hits, line_spans
from .normalize import normalize as normalize_text
from .registry import SNIFF_BYTES, Parser, WarningLog, decode_text, looks_binary, read_source

MAP_MIN_BYTES = 1 << 20       # smaller files are read (a map costs more than it saves)
_NON_BLANK = re.compile(rb"\S")


@dataclass(frozen=True)
class Lines:
    """Selected lines of a :class:`LogText`, in file order: byte bounds and line numbers."""

    start: np.ndarray
    end: np.ndarray
    line: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    @classmethod
    def none(cls) -> "Lines":
        e = np.empty(0, np.int64)
        return cls(e, e, e)


class LogText:
    """The bytes of one text log (``bytes`` or a read-only map of the file)."""

    def __init__(self, data, label: str, normalize: bool = True):
        self.raw = data
        self.repairs: tuple[str, ...] = ()
        if normalize:
            fixed = normalize_text(data)
            data, self.repairs = fixed.data, fixed.repairs
        self.data = data
        self.label = label
        self.size = len(data)
        self._first: dict[bytes, int] = {}        # needle -> its first offset (-1: absent)

    @classmethod
    def of(cls, data, label: str) -> "LogText":
        return data if isinstance(data, LogText) else cls(data, label)

    @classmethod
    def open(cls, path: str | os.PathLike, label: str | None = None) -> "LogText":
        """Map (or, when small, read) the regular file at ``path``; InputError if unreadable."""
        label = label or str(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"{path}: not a regular file (FIFO, device or socket); not read")
            if st.st_size < MAP_MIN_BYTES:
                os.close(fd)
                fd = -1
                data, _ = read_source(path)
                return cls(data, label)
            return cls(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), label)
        except OSError as e:
            raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
        finally:
            if fd >= 0:
                os.close(fd)

    # ---- whole-file questions
    def head(self, n: int = SNIFF_BYTES) -> bytes:
        return bytes(self.data[:n])

    def blank(self) -> bool:
        return _NON_BLANK.search(self.data) is None

    def first(self, needles: Iterable[bytes]) -> dict[bytes, int]:
        """The first offset of each needle (-1: absent); the ones not asked before are found
        together in one pass over the bytes (``logscan.c``), then remembered."""
        needles = [n for n in dict.fromkeys(needles) if n]
        todo = [n for n in needles if n not in self._first]
        if todo:
            short = [n for n in todo if len(n) < 2]
            for n in short:
                self._first[n] = self.data.find(n)
            long = [n for n in todo if len(n) >= 2]
            if long:
                self._first.update(zip(long, first_offsets(self.data, self.size, long)))
        return {n: self._first[n] for n in needles}

    def holds_any(self, needles: Iterable[bytes]) -> bool:
        return any(v >= 0 for v in self.first(needles).values())

    # ---- line selection
    def lines_with(self, needles: Iterable[bytes], also: Iterable[np.ndarray] = ()) -> Lines:
        """The lines holding any of ``needles`` (and the lines at the offsets ``also``)."""
        firsts = self.first(needles)
        hits = [line_hits(self.data, self.size, n, start=at) for n, at in firsts.items() if at >= 0]
        hits += [np.asarray(a, np.int64) for a in also]
        hits = [h for h in hits if len(h)]
        if not hits:
            return Lines.none()
        pos = np.concatenate(hits)
        pos.sort(kind="stable")
        start, end, line = line_spans(self.data, self.size, pos)
        keep = np.ones(len(start), bool)
        keep[1:] = start[1:] != start[:-1]         # one entry per line
        return Lines(start[keep], end[keep], line[keep])

    def line_numbers(self, offsets: np.ndarray) -> np.ndarray:
        """The 1-based line number of each sorted byte offset."""
        return self.line_numbers_and_ends(offsets)[2]

    def line_numbers_and_ends(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(line start, line end, 1-based line number) of each sorted byte offset."""
        return line_spans(self.data, self.size, np.asarray(offsets, np.int64))

    def text(self, start: int, end: int) -> str:
        """Decoded bytes (undecodable ones as U+FFFD; a byte-order mark at the file's start dropped)."""
        return decode_text(bytes(self.data[start:end]))

    def iter(self, lines: Lines) -> Iterator[tuple[int, str, int]]:
        """(line number, text, end offset) of each selected line."""
        for ln, text, _, e in self.iter_spans(lines):
            yield ln, text, e

    def texts(self, lines: Lines) -> list[str]:
        """The text of each selected line, as :meth:`iter` gives it, decoded in one call."""
        if not len(lines):
            return []
        data = self.data
        joined = b"\n".join([data[s:e] for s, e in zip(lines.start.tolist(), lines.end.tolist())])
        out = joined.decode("utf-8", errors="replace").split("\n")
        if b"\xef\xbb\xbf" in joined:
            out = [t[1:] if t.startswith("\ufeff") else t for t in out]     # each line's byte-order mark
        return out

    def iter_spans(self, lines: Lines) -> Iterator[tuple[int, str, int, int]]:
        """(line number, text, start offset, end offset) of each selected line."""
        data = self.data
        for s, e, ln in zip(lines.start.tolist(), lines.end.tolist(), lines.line.tolist()):
            yield ln, decode_text(bytes(data[s:e])), s, e

    def following(self, end: int, n: int, limit: int = 64 << 10) -> list[str]:
        """Up to ``n`` lines after the line ending at byte ``end`` (for wrapped lines and
        blocks that continue below their marker), read from at most ``limit`` bytes."""
        stop = min(self.size, end + limit)
        chunk = bytes(self.data[end:stop])
        if chunk.startswith(b"\r\n"):
            chunk = chunk[2:]
        elif chunk[:1] in (b"\n", b"\r"):
            chunk = chunk[1:]
        else:
            return []                              # the end of the file
        parts = re.split(rb"\r\n|\r|\n", chunk)
        if stop < self.size:
            parts = parts[:-1]                     # cut by the limit
        return [decode_text(p) for p in parts[:n]]

    def preceding(self, start: int, n: int, limit: int = 64 << 10) -> list[str]:
        """Up to ``n`` lines before the line starting at byte ``start``, nearest last."""
        lo = max(0, start - limit)
        chunk = bytes(self.data[lo:start])
        if chunk.endswith(b"\r\n"):
            chunk = chunk[:-2]
        elif chunk[-1:] in (b"\n", b"\r"):
            chunk = chunk[:-1]
        else:
            return []                              # the start of the file
        parts = re.split(rb"\r\n|\r|\n", chunk)
        if lo > 0:
            parts = parts[1:]                      # cut by the limit
        return [decode_text(p) for p in parts[-n:]] if n else []

    def region(self, a: int, b: int) -> list[str]:
        """The lines between byte offsets ``a`` and ``b`` (widened to whole lines)."""
        a = max(0, a)
        b = min(self.size, b)
        while a > 0 and self.data[a - 1:a] not in (b"\n", b"\r"):
            a -= 1
        return re.split(r"\r\n|\r|\n", decode_text(bytes(self.data[a:b])))

    def close(self) -> None:
        for d in (self.data, self.raw):
            if isinstance(d, mmap.mmap) and not d.closed:
                d.close()


class TextParser(Parser):
    """A text format whose lines may stand anywhere in a job's log, among other formats' lines
    and megabytes of the job's own output. It reads a :class:`LogText`: ``MARKERS`` (literal
    bytes) say whether the file holds anything of it at all (:meth:`claims`, answered for every
    parser in one pass), ``NEEDLES`` which lines to read (:meth:`LogText.lines_with`)."""

    MARKERS: tuple[bytes, ...] = ()
    NEEDLES: tuple[bytes, ...] = ()

    @classmethod
    def claims(cls, text: LogText) -> bool:
        return cls.sniff(text.head()) or text.holds_any(cls.MARKERS)

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        return cls.parse_text(LogText.of(data, label), label)

    @classmethod
    def parse_text(cls, text: LogText, label: str):  # pragma: no cover - each format's own
        raise NotImplementedError

    @classmethod
    def parse_region(cls, text: LogText, label: str, min_bytes: int, needles: tuple[bytes, ...]):
        """``parse_bytes(data, label, first_line=)`` of the whole text when it is at most
        ``min_bytes``, else of the lines from 64 KiB before the first line holding one of
        ``needles`` to 256 KiB after the last (a report or a table is a few hundred lines in a log
        of gigabytes); of nothing when no line holds one."""
        if text.size <= min_bytes:
            return cls.parse_bytes(bytes(text.data), label)
        hits = text.lines_with(needles)
        if not len(hits):
            return cls.parse_bytes(b"", label)
        a, b = max(0, int(hits.start[0]) - (64 << 10)), min(text.size, int(hits.end[-1]) + (256 << 10))
        lines = text.region(a, b)
        first = int(text.line_numbers(np.array([a]))[0]) if a else 1
        return cls.parse_bytes("\n".join(lines).encode(), label, first_line=first)

    @staticmethod
    def unreadable(text: LogText, log: WarningLog, what: str) -> bool:
        """True, with the warning said, for an empty or binary file (``what``: the format)."""
        if text.size == 0 or text.blank():
            log.add(None, "empty file")
            return True
        if looks_binary(text.head()):
            log.add(None, f"binary data, not {what}")
            return True
        return False


__all__ = ["LogText", "Lines", "MAP_MIN_BYTES", "TextParser"]
