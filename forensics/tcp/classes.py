"""What each TCP event means for a diagnosis: one table, shared by the findings and the report.

``tcp_events.event`` comes from the kernel tracer (``tcp_retransmit_skb``, the reset
tracepoints) or from the pcap engine (tshark's ``tcp.analysis`` names, forensics/tcp/verdicts.py).
:data:`TCP_CLASSES` is the table: each class, the group it belongs to, how the report names
it, and its event names. Groups (what a class says about the network):

- ``data_lost``: data lost or sent again, the only loss evidence: ``retransmission`` (the
  kernel's retransmit, a retransmission or fast retransmission on the wire) and
  ``lost_segment`` (a gap in the sequence space at the capture point: data lost upstream of
  it, the retransmission may come later or outside the capture);
- ``reordering``: the receiver saw data out of order (``duplicate_ack``, ``out_of_order``):
  loss, or only reordering or a queue; never loss evidence on its own;
- ``noise``: a busy host's or a capture's artefacts: ``spurious`` (a retransmission of data
  the receiver already had: a tail-loss probe, an RTO that fired early under CPU load),
  ``capture_gap`` (the peer ACKed a segment the capture missed), ``probe`` (keep-alives,
  window updates);
- ``flow_control``: the receiver's window (``zero_window``: a slow reader, not the network);
- ``reset``: a TCP reset sent or received.

One packet, one class: tshark (and the engine, whose oracle it is) flags a fast or spurious
retransmission as a ``retransmission`` too, so such a packet has two ``tcp_events`` rows;
:func:`classify` keeps the most specific (:data:`SUBSUMED_BY`), and :func:`subsumed_sql` is
the same rule in SQL. Per connection, ``flows`` keeps tshark's counters:
:data:`FLOW_DATA_LOST_SQL` / :func:`flow_data_lost` take the data lost out of them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

DATA_LOST, REORDERING, NOISE, FLOW_CONTROL, RESET = "data_lost", "reordering", "noise", "flow_control", "reset"


@dataclass(frozen=True)
class TcpClass:
    name: str
    group: str                  # DATA_LOST, REORDERING, NOISE, FLOW_CONTROL or RESET
    label: str                  # how the report names it (timeline markers, tables)
    events: tuple[str, ...]     # tcp_events.event values: tracer tracepoints, pcap verdicts


TCP_CLASSES: tuple[TcpClass, ...] = (
    TcpClass("retransmission", DATA_LOST, "retransmission",
             ("tcp_retransmit_skb", "retransmission", "fast_retransmission")),
    TcpClass("lost_segment", DATA_LOST, "lost segment", ("lost_segment",)),
    TcpClass("duplicate_ack", REORDERING, "duplicate ACK", ("duplicate_ack",)),
    TcpClass("out_of_order", REORDERING, "out-of-order segment", ("out_of_order",)),
    TcpClass("spurious", NOISE, "spurious retransmission", ("spurious_retransmission",)),
    TcpClass("capture_gap", NOISE, "ACKed unseen segment", ("ack_lost_segment",)),
    TcpClass("probe", NOISE, "keep-alive or window update",
             ("keep_alive", "keep_alive_ack", "window_update", "zero_window_probe_ack")),
    TcpClass("zero_window", FLOW_CONTROL, "zero window", ("zero_window", "zero_window_probe", "window_full")),
    TcpClass("reset", RESET, "reset", ("rst", "tcp_send_reset", "tcp_receive_reset")),
)

EVENT_CLASS: dict[str, str] = {e: c.name for c in TCP_CLASSES for e in c.events}
CLASS_GROUP: dict[str, str] = {c.name: c.group for c in TCP_CLASSES}
# how the report names each class on the timeline and in its tables
CLASS_LABEL: dict[str, str] = {c.name: c.label for c in TCP_CLASSES}


def classes_in(*groups: str) -> tuple[str, ...]:
    """The classes of these groups, in table order."""
    return tuple(c.name for c in TCP_CLASSES if c.group in groups)


DATA_LOSS_CLASSES = classes_in(DATA_LOST)                    # data lost or sent again: loss evidence
REORDERING_CLASSES = classes_in(REORDERING)                  # never loss on their own
LOSS_CLASSES = DATA_LOSS_CLASSES + REORDERING_CLASSES        # trouble inside a collective's window
NOISE_CLASSES = classes_in(NOISE)

# one packet, one class: tshark flags a fast or spurious retransmission as a retransmission
# too; such a packet's ``retransmission`` row is left out (the other row carries its class)
SUBSUMED_BY: dict[str, tuple[str, ...]] = {"retransmission": ("fast_retransmission", "spurious_retransmission")}
PACKET_KEY = ("host", "capture", "frame")


def events_of(*classes: str) -> tuple[str, ...]:
    """The event names of these classes."""
    return tuple(e for e, c in EVENT_CLASS.items() if c in classes)


# the events that resend data: a resend the peer D-SACKed (``tcp_events.dsacked``, from the
# sender's socket counters: forensics.model.tcp_ranks.mark_dsacked) is ``spurious``
RESEND_EVENTS = events_of("retransmission")


def classify(t: pd.DataFrame) -> pd.Series:
    """The class of each ``tcp_events`` row: None for an event of no class and for a pcap row
    that another verdict of the same packet overrides (:data:`SUBSUMED_BY`); ``spurious`` for
    a resend its peer D-SACKed (``dsacked``), whatever its source called it."""
    cls = t["event"].map(EVENT_CLASS).astype(object)
    if "dsacked" in t.columns and len(t):
        dsacked = t["dsacked"].astype("boolean").fillna(False).to_numpy(dtype=bool)
        cls = cls.where(~(dsacked & t["event"].isin(RESEND_EVENTS).to_numpy()), "spurious")
    if t.empty or not set(PACKET_KEY) <= set(t.columns):
        return cls.where(cls.notna(), None)
    framed = t["frame"].notna().to_numpy()
    key = None
    for event, over in SUBSUMED_BY.items():
        mine = (t["event"] == event).to_numpy() & framed
        other = t["event"].isin(over).to_numpy() & framed
        if not (mine.any() and other.any()):
            continue
        if key is None:
            key = packet_codes(t)
        gone = mine & np.isin(key, key[other])
        cls = cls.where(~gone, None)
    return cls.where(cls.notna(), None)


def packet_codes(t: pd.DataFrame) -> np.ndarray:
    """One integer per row for its :data:`PACKET_KEY` (equal for the rows of one packet; a
    missing host or capture equals another missing one, as ``IS NOT DISTINCT FROM``): each
    column's distinct values numbered, the numbers combined (no text made per row)."""
    parts = []
    for c in PACKET_KEY:
        codes, values = pd.factorize(t[c], use_na_sentinel=False)
        parts.append((codes, len(values)))
    return dense_codes(parts, len(t))


def dense_codes(parts: list[tuple[np.ndarray, int]], n: int) -> np.ndarray:
    """One integer per row (of n) for its combination of the parts' codes (each part: codes
    in 0..size-1, and size), numbered 0..k-1 over the k combinations present; renumbered
    after each part, so the product never overflows."""
    combo = np.zeros(n, dtype=np.int64)
    for codes, size in parts:
        combo = combo * size + codes
        _, combo = np.unique(combo, return_inverse=True)
    return combo


def class_sql(alias: str, classes: tuple[str, ...] | None = None) -> str:
    """SQL expression over ``tcp_events AS alias``: the row's class as :func:`classify` gives
    it before its subsumed rule (:func:`subsumed_sql`); NULL for an event of no class, or of a
    class not in ``classes`` (all when None)."""
    cases = " ".join(f"WHEN '{e}' THEN '{c}'" for e, c in EVENT_CLASS.items() if classes is None or c in classes)
    resends = ", ".join(f"'{e}'" for e in RESEND_EVENTS)
    return (f"CASE WHEN coalesce({alias}.dsacked, false) AND {alias}.event IN ({resends}) THEN 'spurious' "
            f"ELSE CASE {alias}.event {cases} END END")


def subsumed_sql(alias: str) -> str:
    """SQL predicate over ``tcp_events AS alias``: the row is one :func:`classify` leaves out."""
    parts = [f"({alias}.event = '{event}' AND {alias}.frame IS NOT NULL AND EXISTS (SELECT 1 FROM tcp_events o "
             f"WHERE o.event IN ({', '.join(repr(e) for e in over)}) AND o.frame = {alias}.frame "
             f"AND o.capture IS NOT DISTINCT FROM {alias}.capture AND o.host IS NOT DISTINCT FROM {alias}.host))"
             for event, over in SUBSUMED_BY.items()]
    return "(" + " OR ".join(parts) + ")"


# flows keep tshark's per-connection counters, whose retransmissions include fast and spurious
# ones: the data lost on a connection (DATA_LOSS_CLASSES) is this
FLOW_DATA_LOST_SQL = ("(coalesce(retransmissions, 0) - coalesce(spurious_retransmissions, 0) "
                      "+ coalesce(lost_segments, 0))")


def flow_data_lost(f: pd.DataFrame) -> pd.Series:
    """:data:`FLOW_DATA_LOST_SQL` over a ``flows`` frame."""
    num = lambda c: pd.to_numeric(f[c], errors="coerce").fillna(0) if c in f.columns else 0  # noqa: E731
    return num("retransmissions") - num("spurious_retransmissions") + num("lost_segments")
