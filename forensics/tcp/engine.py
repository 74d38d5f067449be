"""Per-packet TCP analysis of a capture file, Wireshark 4.0 semantics.

Pipeline per batch of records: the C walker finds the records, numpy decodes
the headers (``forensics.pcap.decode``), and the C kernel finds conversations
and runs the per-flow state machine in file order; :class:`ConversationTable`
turns the kernel's endpoint pairs into address text. Batches stream through with bounded memory; the caller chooses what to
keep (every packet, flagged packets only, or only counts and flows).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Literal

import numpy as np

from ..native import TcpKernel
from ..pcap.decode import STATUS_BOGUS_HLEN, SkipCounts, TcpDecoder, TcpPackets
from ..pcap.linktypes import NOT_A_PACKET
from ..pcap.reader import CaptureReader, ReadReport
from .conversations import ConversationTable
from .flows import flow_table
from .verdicts import CSV_VERDICTS, HIDDEN_BIT, VERDICT_BITS, printed

if TYPE_CHECKING:
    import pandas as pd

Keep = Literal["all", "flagged", "none"]

# Column order of the packet table (and of the CSV): the columns first.
PACKET_COLUMNS = [
    "frame", "stream", "time_epoch_ns", "src", "sport", "dst", "dport", "seq_rel", "ack_rel", "len",
    *CSV_VERDICTS,
    "duplicate_ack_frame", "zero_window_probe_ack", "reused_ports", "acks_frame", "ack_rtt_ns",
    "rto_ns", "seq_raw", "ack_raw", "tcp_flags", "window", "analysis_hidden",
]


@dataclass
class CaptureStats:
    """What the capture held, so a report can say what the verdicts rest on."""

    path: str
    format: str = ""
    file_bytes: int = 0
    frames: int = 0
    tcp_packets: int = 0
    streams: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    hidden_frames: int = 0          # options cut by snaplen: verdicts not printed (as tshark)
    skipped: SkipCounts = field(default_factory=SkipCounts)
    verdict_counts: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)    # damaged input: the result is partial


@dataclass
class PacketBatch:
    """One batch's decoded packets and kernel results (numpy, no strings).

    Public columns are derived on demand by :meth:`columns`, so runs that only
    count verdicts never pay for them.
    """

    pk: TcpPackets
    out: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.pk)

    def columns(self, conversations: ConversationTable) -> dict[str, np.ndarray]:
        pk, out = self.pk, self.out
        hidden = ((out["verdicts"] >> HIDDEN_BIT) & 1).astype(bool)
        bogus = pk.status == STATUS_BOGUS_HLEN     # tshark prints no ack, flags or window
        src, dst = conversations.address_codes(out["key"], out["dir"])
        return {
            "frame": pk.frame, "stream": out["stream"], "time_epoch_ns": pk.ts,
            "src": src, "sport": pk.sport, "dst": dst, "dport": pk.dport,
            "seq_rel": out["seq_rel"], "ack_rel": out["ack_rel"], "len": pk.seglen,
            "verdicts": printed(out["verdicts"]),
            "duplicate_ack_num": np.where(hidden, 0, out["dupack_num"]),
            "duplicate_ack_frame": np.where(hidden, 0, out["dupack_frame"]),
            "acks_frame": np.where(hidden, 0, out["acks_frame"]),
            "ack_rtt_ns": np.where(hidden, 0, out["ack_rtt"]), "rto_ns": np.where(hidden, 0, out["rto"]),
            "seq_raw": pk.seq, "ack_raw": np.where(bogus, 0, pk.ack),
            "tcp_flags": np.where(bogus, 0, pk.flags), "window": np.where(bogus, 0, pk.win),
            "analysis_hidden": hidden.astype(np.uint8),
        }

    def flagged(self) -> np.ndarray:
        """Indices of packets with any printed verdict or a RST."""
        return np.flatnonzero((printed(self.out["verdicts"]) != 0) | (self.pk.flags & 0x04))


@dataclass
class TcpAnalysis:
    packets: "pd.DataFrame | None"
    flows: "pd.DataFrame"
    stats: CaptureStats


class TcpAnalyzer:
    """Streams a capture through the engine; see :func:`analyze_file`."""

    def __init__(self, path: str | os.PathLike, **reader_opts):
        self.reader = CaptureReader(path, **reader_opts)
        self.decoder = TcpDecoder()
        self.kernel = TcpKernel()
        self.conversations = ConversationTable(self.kernel)
        self.stats = CaptureStats(path=os.fspath(path))
        self._bit_counts = np.zeros(32, np.int64)
        self._rst = 0

    def batches(self) -> Iterator[PacketBatch]:
        with self.reader:
            for records in self.reader.batches():
                pk, skips = self.decoder.decode(records)
                self.stats.skipped.add(skips)
                stamped = records.ts_ns[records.linktype != NOT_A_PACKET]
                if len(stamped):
                    first, last = int(stamped.min()), int(stamped.max())
                    s = self.stats
                    s.first_ns = first if s.first_ns is None else min(s.first_ns, first)
                    s.last_ns = last if s.last_ns is None else max(s.last_ns, last)
                if not len(pk):
                    continue
                out = self.kernel.run({
                    "frame": pk.frame, "ts": pk.ts, "ipver": pk.ipver, "src": pk.src, "dst": pk.dst,
                    "sport": pk.sport, "dport": pk.dport, "seq": pk.seq, "ack": pk.ack,
                    "seglen": pk.seglen, "win": pk.win, "flags": pk.flags,
                    "wscale": pk.wscale, "status": pk.status,
                })
                self.conversations.sync()
                self._count(out["verdicts"], pk.flags)
                yield PacketBatch(pk, out)
        self._finish()

    def _count(self, raw: np.ndarray, flags: np.ndarray) -> None:
        shown = printed(raw)
        for bit in VERDICT_BITS.values():
            self._bit_counts[bit] += np.count_nonzero(shown & np.uint32(1 << bit))
        self._rst += int(np.count_nonzero(flags & 0x04))
        self.stats.tcp_packets += len(raw)
        self.stats.hidden_frames += int(np.count_nonzero((raw >> HIDDEN_BIT) & 1))

    def _finish(self) -> None:
        rep: ReadReport = self.reader.report
        s = self.stats
        s.format, s.file_bytes, s.frames = rep.format, rep.file_bytes, rep.records
        s.warnings.extend(rep.warnings)
        s.defects.extend(rep.defects)
        s.streams = self.kernel.nconv()
        s.verdict_counts = {name: int(self._bit_counts[bit]) for name, bit in VERDICT_BITS.items()}
        s.verdict_counts["rst"] = self._rst
        if s.skipped.unknown_linktype:
            kinds = ", ".join(f"{lt} ({n} frames)" for lt, n in sorted(s.skipped.unknown_linktype.items()))
            s.warnings.append(f"{s.path}: unsupported link types skipped: {kinds}")
        if s.hidden_frames:
            s.warnings.append(
                f"{s.path}: {s.hidden_frames} frames had their TCP options cut by the snaplen; "
                "like tshark, no verdicts are shown for them (state is still tracked)")

    def flows(self) -> "pd.DataFrame":
        return flow_table(self.kernel.conversations(), self.conversations)


def columns_frame(cols: dict[str, np.ndarray], addresses: list[str]) -> "pd.DataFrame":
    """Packet columns as a DataFrame with the public names (verdicts as 0/1)."""
    import pandas as pd   # not needed for counts-only runs; importing it costs ~0.2 s
    cols = dict(cols)
    verdicts = cols.pop("verdicts")
    for name, bit in VERDICT_BITS.items():
        cols[name] = ((verdicts >> bit) & 1).astype(np.uint8)
    cols["rst"] = ((cols["tcp_flags"] >> 2) & 1).astype(np.uint8)
    cats = pd.Index(addresses)
    cols["src"] = pd.Categorical.from_codes(cols["src"], categories=cats)
    cols["dst"] = pd.Categorical.from_codes(cols["dst"], categories=cats)
    return pd.DataFrame({c: cols[c] for c in PACKET_COLUMNS}, copy=False)


def analyze_file(path: str | os.PathLike, keep: Keep = "all", on_batch=None, **reader_opts) -> TcpAnalysis:
    """Analyse every TCP packet of a pcap/pcapng file like tshark 4.0 does.

    ``keep`` selects the packet rows returned: ``"all"``, only ``"flagged"``
    ones (any verdict or RST), or ``"none"`` (counts and flows only).
    ``on_batch(batch, conversations)``, when given, sees every analysed batch: a
    caller that aggregates something else per packet does it in the same pass.
    """
    analyzer = TcpAnalyzer(path, **reader_opts)
    kept: list[dict[str, np.ndarray]] = []
    for batch in analyzer.batches():
        if on_batch is not None:
            on_batch(batch, analyzer.conversations)
        if keep == "all":
            kept.append(batch.columns(analyzer.conversations))
        elif keep == "flagged":
            sel = batch.flagged()
            if len(sel):
                kept.append({k: v[sel] for k, v in batch.columns(analyzer.conversations).items()})
    packets = None
    if keep != "none":
        merged = {k: np.concatenate([c[k] for c in kept]) for k in kept[0]} if kept else _empty_cols()
        packets = columns_frame(merged, analyzer.conversations.addresses)
    return TcpAnalysis(packets=packets, flows=analyzer.flows(), stats=analyzer.stats)


def _empty_cols() -> dict[str, np.ndarray]:
    u32 = ("frame", "stream", "seq_rel", "ack_rel", "len", "verdicts", "duplicate_ack_num",
           "duplicate_ack_frame", "acks_frame", "seq_raw", "ack_raw")
    cols = {k: np.zeros(0, np.uint32) for k in u32}
    cols.update({k: np.zeros(0, np.int64) for k in ("time_epoch_ns", "ack_rtt_ns", "rto_ns")})
    cols.update({k: np.zeros(0, np.uint16) for k in ("sport", "dport", "tcp_flags", "window")})
    cols.update({"src": np.zeros(0, np.int32), "dst": np.zeros(0, np.int32),
                 "analysis_hidden": np.zeros(0, np.uint8)})
    return cols
