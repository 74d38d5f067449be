"""What each TCP event means for a diagnosis: one table, shared by the findings and the report.

``tcp_events.event`` comes from the kernel tracer (``tcp_retransmit_skb``, the reset
tracepoints) or from the pcap engine (tshark's ``tcp.analysis`` names, forensics/tcp/verdicts.py).
Classes:

- ``retransmission``: data sent again (the kernel's retransmit, a retransmission or fast
  retransmission seen on the wire): data was lost, or believed lost;
- ``lost_segment``: a gap in the sequence space at the capture point: data lost upstream of
  it (the retransmission may come later, or outside the capture);
- ``duplicate_ack``: the receiver saw out-of-order data: loss, or only reordering or a queue
  (never loss evidence on its own);
- ``spurious``: a retransmission of data the receiver already had (a tail-loss probe, an
  RTO that fired early under CPU load): noise on a busy host, not loss;
- ``reset``: a TCP reset sent or received.

Events of no class (window updates, keep-alives, zero windows) are not trouble here.
"""
from __future__ import annotations

EVENT_CLASS: dict[str, str] = {
    "tcp_retransmit_skb": "retransmission", "retransmission": "retransmission",
    "fast_retransmission": "retransmission",
    "lost_segment": "lost_segment",
    "duplicate_ack": "duplicate_ack",
    "spurious_retransmission": "spurious",
    "rst": "reset", "tcp_send_reset": "reset", "tcp_receive_reset": "reset",
}
DATA_LOSS_CLASSES = ("retransmission", "lost_segment")       # data lost or sent again: loss evidence
LOSS_CLASSES = DATA_LOSS_CLASSES + ("duplicate_ack",)        # trouble inside a collective's window
NOISE_CLASSES = ("spurious",)
# how the report names each class on the timeline and in its tables
CLASS_LABEL = {"retransmission": "retransmission", "lost_segment": "lost segment",
               "duplicate_ack": "duplicate ACK", "spurious": "spurious retransmission", "reset": "reset"}


def events_of(*classes: str) -> tuple[str, ...]:
    """The event names of these classes."""
    return tuple(e for e, c in EVENT_CLASS.items() if c in classes)
