"""``flow_timing``: per directed TCP connection and capture, its ACK round-trip times and how
fast it moved data while busy.

A slow link (a port negotiated down, a rate limiter, an oversubscribed path) queues
instead of dropping: no retransmission tells on it. In a ring, every link moves data at
the pace of the slowest one, so throughput alone does not point at it either; the
*queue* does: segments sent into the bottleneck wait before they are ACKed, so the tail
of that connection's ACK round-trip times (p99, max) is far above the other links'
while their medians stay alike. The ACK RTT of a data segment is the TCP engine's
(tshark's ``tcp.analysis.ack_rtt``), taken on every ACK, not only on flagged packets.

Loss lifts the tail too, and on every connection of a lossy link: the segments sent behind a
hole wait for its retransmission before the cumulative ACK covers them. So the table also
has the *clean* RTT percentiles: only the ACKs whose wait (from the segment they ACK to
themselves) saw no retransmission, out-of-order or lost segment on that connection. A
queue lifts those as well; loss does not (:func:`forensics.findings.link_delays.queue_links`).

Also per connection: the *busy rate*, the payload of the data segments that followed
a short gap (at most ``IDLE_NS`` after the previous one of the same connection) divided
by the sum of those gaps: the sending rate while sending, idle time between collectives
left out.

Cost: no pass of its own: :class:`TimingCollector` rides along the TCP engine's one
pass over each capture; every column numpy; only per-connection aggregates are kept.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..tcp.verdicts import VERDICT_BITS
from .schema import conform, empty
from .tcp_ranks import Addresses

IDLE_NS = 10_000_000      # a longer gap between two data segments of a connection is idle time
# a data segment that tells of a hole in the connection's sequence space: the ACKs of the
# segments in flight with it wait for the repair, not in a queue
HOLE_MASK = sum(1 << VERDICT_BITS[v] for v in ("retransmission", "fast_retransmission", "spurious_retransmission",
                                                 "out_of_order", "lost_segment"))


class TimingCollector:
    """``analyze_file``'s per-batch hook for one capture: keeps the data segments and the
    ACK round-trip times per directed connection, so the timing needs no pass of its own
    over the capture (:func:`forensics.model.tcp_ranks.analyse_pcaps` runs the engine once)."""

    def __init__(self) -> None:
        self.data: list[tuple] = []
        self.acks: list[tuple] = []
        self.conv = None

    def __call__(self, batch, conv) -> None:
        self.conv = conv
        pk, out = batch.pk, batch.out
        # a directed connection: the engine's stream and which side sends
        flow = out["stream"].astype(np.int64) * 2 + out["dir"].astype(np.int64)
        src, dst = conv.address_codes(out["key"], out["dir"])
        d = pk.seglen > 0
        if d.any():
            hole = (out["verdicts"][d].astype(np.int64) & HOLE_MASK) != 0
            self.data.append((flow[d], pk.ts[d], pk.seglen[d], src[d], dst[d], pk.sport[d], pk.dport[d], hole))
        a = out["ack_rtt"] > 0
        if a.any():   # an ACK's RTT belongs to the data flowing the other way
            self.acks.append((flow[a] ^ 1, out["ack_rtt"][a], dst[a], src[a], pk.dport[a], pk.sport[a], pk.ts[a]))

    def aggregate(self, capture: str) -> pd.DataFrame | None:
        if not (self.data or self.acks):
            return None
        return _aggregate(capture, self.data, self.acks, list(self.conv.addresses))


def flow_timing(attr, parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The ``flow_timing`` rows of captures' :class:`TimingCollector` aggregates (each row
    with its host), attributed to processes and ranks."""
    if not parts:
        return empty("flow_timing")
    df = pd.concat(parts, ignore_index=True)
    src = Addresses(df["saddr"])                 # one factorization for both lookups
    own = attr.owner(src, df["sport"])
    df["pid"] = own["pid"].to_numpy()
    df["rank"] = own["rank"].fillna(pd.Series(attr.rank_of_addr(src).to_numpy())).to_numpy()
    df["peer_rank"] = attr.peer_rank(df["daddr"], df["dport"]).to_numpy()
    return conform(df, "flow_timing")


def _cat(parts: list, i: int, dtype) -> np.ndarray:
    return np.concatenate([p[i] for p in parts]).astype(dtype) if parts else np.zeros(0, dtype)


def _aggregate(capture: str, data: list, acks: list, addresses: list[str]) -> pd.DataFrame:
    dflow, aflow = _cat(data, 0, np.int64), _cat(acks, 0, np.int64)
    # directed connection ids are small (2 x the engine's stream number): a dense lookup, no sort
    both = np.concatenate([dflow, aflow])
    present = np.bincount(both) > 0
    lookup = np.cumsum(present) - 1
    n, nd = int(present.sum()), len(dflow)
    code = lookup[both]
    dcode, acode = code[:nd], code[nd:]
    # one address/port row per directed connection: from its first data segment, else its first ACK
    meta = np.full((n, 4), -1, dtype=np.int64)
    for part, c in ((acks, acode), (data, dcode)):   # data last: it wins
        if not len(c):
            continue
        cols = (2, 3, 4, 5) if part is acks else (3, 4, 5, 6)
        first = np.full(n, -1, dtype=np.int64)
        first[c[::-1]] = np.arange(len(c) - 1, -1, -1)    # the last write wins: each code's first row
        which = np.flatnonzero(first >= 0)
        for j, col in enumerate(cols):
            meta[which, j] = _cat(part, col, np.int64)[first[which]]
    addr = np.array(addresses, dtype=object)
    out = {"capture": capture, "saddr": addr[meta[:, 0]], "sport": meta[:, 2], "daddr": addr[meta[:, 1]],
           "dport": meta[:, 3]}
    # data: busy rate
    data_ts, seglen = _cat(data, 1, np.int64), _cat(data, 2, np.int64)
    # file order (time order) within each connection; a stable sort of 16-bit codes is a radix sort
    order = np.argsort(dcode.astype(np.uint16) if n < 1 << 16 else dcode, kind="stable")
    ts, dc, seglen = data_ts[order], dcode[order], seglen[order]
    dt = np.diff(ts)
    busy = (dc[1:] == dc[:-1]) & (dt >= 0) & (dt <= IDLE_NS)
    k = dc[1:][busy]
    busy_ns = np.bincount(k, weights=dt[busy], minlength=n)
    busy_bytes = np.bincount(k, weights=seglen[1:][busy], minlength=n)
    out["data_packets"] = np.bincount(dc, minlength=n)
    out["data_bytes"] = np.bincount(dc, weights=seglen, minlength=n).astype(np.int64)
    out["busy_bytes"], out["busy_ns"] = busy_bytes.astype(np.int64), busy_ns.astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["busy_rate_bps"] = np.where(busy_ns > 0, busy_bytes * 8e9 / busy_ns, np.nan)
    # ACK RTT percentiles per connection, of every ACK and of the clean ones
    rtt = _cat(acks, 1, np.int64)
    out["rtt_samples"] = np.bincount(acode, minlength=n)
    for name, v in zip(("rtt_p50_ns", "rtt_p90_ns", "rtt_p99_ns", "rtt_max_ns"),
                       _percentiles(acode, rtt, n, (0.5, 0.9, 0.99, 1.0))):
        out[name] = v
    clean = _clean_acks(acode, _cat(acks, 6, np.int64), rtt, dcode, data_ts, _cat(data, 7, bool))
    out["rtt_clean_samples"] = np.bincount(acode[clean], minlength=n)
    out["rtt_clean_p50_ns"], out["rtt_clean_p90_ns"] = _percentiles(acode[clean], rtt[clean], n, (0.5, 0.9))
    return pd.DataFrame(out)


def _percentiles(code: np.ndarray, rtt: np.ndarray, n: int, qs) -> list[np.ndarray]:
    """Per connection code (0..n-1): the RTT at each quantile of ``qs`` (the lower sample, NaN
    where the connection has none); one int64 sort of (code, rtt) packed, RTTs in 40 bits
    (18 minutes)."""
    cnt = np.bincount(code, minlength=n)
    if not len(rtt):
        return [np.full(n, np.nan) for _ in qs]
    rtt = np.clip(rtt, 0, (1 << 40) - 1)
    rtt_sorted = np.sort((code.astype(np.int64) << 40) | rtt) & ((1 << 40) - 1)
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]]).astype(np.int64)
    return [np.where(cnt > 0, rtt_sorted[np.minimum(start + np.floor(q * np.maximum(cnt - 1, 0)).astype(np.int64),
                                                    len(rtt_sorted) - 1)], np.nan) for q in qs]


def _clean_acks(acode, ack_ts, rtt, dcode, data_ts, hole) -> np.ndarray:
    """Per ACK sample: True when no data segment of its connection that tells of a hole
    (HOLE_MASK) was seen from the segment the ACK covers (ack time - RTT) to the ACK."""
    clean = np.ones(len(acode), dtype=bool)
    if not len(acode) or not hole.any():
        return clean
    hc, ht = dcode[hole], data_ts[hole]
    t0 = int(min(ht.min(), (ack_ts - rtt).min()))
    span = int(max(ht.max(), ack_ts.max())) - t0 + 2
    unit = 1
    # (code, time) packed in one int64 key, coarser time units for very long captures
    while (int(max(hc.max(), acode.max())) + 1) * (span // unit + 1) >= 1 << 62:
        unit *= 1000
    key = np.sort(hc.astype(np.int64) * (span // unit + 1) + (ht - t0) // unit)
    base = acode.astype(np.int64) * (span // unit + 1)
    lo = np.searchsorted(key, base + (ack_ts - rtt - t0) // unit, side="left")
    hi = np.searchsorted(key, base + (ack_ts - t0) // unit, side="right")
    return hi == lo
