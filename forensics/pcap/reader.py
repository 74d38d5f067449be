"""Capture files (pcap, pcapng) read as batches of packet-record columns.

The file is read a window at a time into one reusable buffer, so memory stays
bounded however large the capture is. Each batch is a :class:`RecordBatch`:
the buffer and per-record columns (offset, lengths, time, link type) for the
records fully inside it, numbered like tshark numbers frames.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

import numpy as np

from ..errors import CaptureFormatError, InputError
from ..native import FORMAT_PCAP, FORMAT_PCAPNG, RecordWalker

DEFAULT_WINDOW = 16 << 20       # bytes of file per read
DEFAULT_BATCH = 1 << 17         # records per batch
PAD = 128                       # zero bytes after the data: header gathers never leave the buffer


@dataclass(frozen=True)
class CaptureFormat:
    """A capture container recognised by its magic number (dpkt style: data, not code)."""

    name: str
    walker_format: int
    header_len: int
    swapped: bool = False
    nsec: bool = False


# magic (as the first four bytes read little-endian) -> format
FORMATS: dict[int, CaptureFormat] = {
    0xA1B2C3D4: CaptureFormat("pcap", FORMAT_PCAP, 24),
    0xD4C3B2A1: CaptureFormat("pcap", FORMAT_PCAP, 24, swapped=True),
    0xA1B23C4D: CaptureFormat("pcap-ns", FORMAT_PCAP, 24, nsec=True),
    0x4D3CB2A1: CaptureFormat("pcap-ns", FORMAT_PCAP, 24, swapped=True, nsec=True),
    0x0A0D0D0A: CaptureFormat("pcapng", FORMAT_PCAPNG, 0),
}


@dataclass
class RecordBatch:
    buf: np.ndarray          # uint8 window of the file (plus zero padding)
    data_off: np.ndarray     # int64, offsets of packet bytes within ``buf``
    caplen: np.ndarray       # uint32
    origlen: np.ndarray      # uint32
    ts_ns: np.ndarray        # int64, UTC
    linktype: np.ndarray     # int32
    first_frame: int         # frame number of the first record (1-based)

    def __len__(self) -> int:
        return len(self.data_off)


@dataclass
class ReadReport:
    """What reading the container found besides packets."""

    format: str = ""
    file_bytes: int = 0
    records: int = 0
    warnings: list[str] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)   # the input is damaged: data was lost
    counters: dict[str, int] = field(default_factory=dict)


def detect_format(head: bytes, path: str) -> CaptureFormat:
    if len(head) < 4:
        raise CaptureFormatError(f"{path}: empty or too short to be a capture file")
    (magic,) = struct.unpack("<I", head[:4])
    fmt = FORMATS.get(magic)
    if fmt is None:
        raise CaptureFormatError(
            f"{path}: not a pcap or pcapng file (magic 0x{head[:4].hex()})")
    return fmt


class CaptureReader:
    """Iterate a capture's records in file order, in bounded-memory batches."""

    def __init__(self, path: str | os.PathLike, window: int = DEFAULT_WINDOW,
                 batch: int = DEFAULT_BATCH):
        self.path = os.fspath(path)
        self.window = window
        self.batch = batch
        self.report = ReadReport()
        try:
            self._fh: BinaryIO = open(self.path, "rb")
        except OSError as exc:
            raise InputError(f"{self.path}: cannot open: {exc.strerror}") from None
        self.report.file_bytes = os.fstat(self._fh.fileno()).st_size
        head = self._fh.read(24)
        self.format = detect_format(head, self.path)
        self.report.format = self.format.name
        linktype = snaplen = 0
        if self.format.walker_format == FORMAT_PCAP:
            if len(head) < 24:
                raise CaptureFormatError(f"{self.path}: truncated pcap file header")
            e = ">" if self.format.swapped else "<"
            _, _, _, _, snaplen, linktype = struct.unpack(e + "HHiIII", head[4:24])
            linktype &= 0x0FFFFFFF  # upper bits: FCS length flags
        self.linktype = linktype
        self._walker = RecordWalker(self.format.walker_format, self.format.swapped,
                                    self.format.nsec, linktype, snaplen)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "CaptureReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def batches(self) -> Iterator[RecordBatch]:
        fh, window = self._fh, self.window
        pos = self.format.header_len
        fh.seek(pos)
        buf = np.zeros(window + PAD, np.uint8)
        have = 0          # valid bytes at the start of buf
        frame = 1
        eof = False
        while True:
            if not eof and have < window:
                got = fh.readinto(memoryview(buf)[have:window])
                eof = got == 0
                have += got
            start = 0
            progressed = False
            while True:
                buf[have:have + PAD] = 0
                try:
                    cols, consumed = self._walker.walk(buf[start:], have - start, pos, self.batch)
                except CaptureFormatError as exc:
                    if frame == 1:
                        raise CaptureFormatError(f"{self.path}: {exc}") from None
                    self.report.defects.append(
                        f"{self.path}: {exc}; the {frame - 1} frames before it were analysed")
                    eof, have, start = True, 0, 0
                    break
                n = len(cols["data_off"])
                if n:
                    progressed = True
                    yield RecordBatch(buf, cols["data_off"] - (pos - start), cols["caplen"],
                                      cols["origlen"], cols["ts_ns"], cols["linktype"], frame)
                    frame += n
                start += consumed
                pos += consumed
                if consumed == 0 or n < self.batch:
                    break
                progressed = True
            # keep the incomplete tail, then refill
            tail = have - start
            if start:
                buf[:tail] = buf[start:have]
            have = tail
            if eof and not progressed:
                if have:
                    self.report.defects.append(
                        f"{self.path}: file ends inside a record ({have} bytes at offset {pos} "
                        "ignored); the capture was probably cut short")
                break
            if not eof and have >= window and not progressed:
                # one record larger than the window: grow it (bounded by the walker's limit)
                window *= 2
                bigger = np.zeros(window + PAD, np.uint8)
                bigger[:have] = buf[:have]
                buf = bigger
        self.report.records = frame - 1
        self.report.counters = self._walker.counters()
        if self.report.counters.get("blocks_unknown"):
            self.report.defects.append(
                f"{self.path}: {self.report.counters['blocks_unknown']} pcapng blocks of unknown "
                "type skipped")
