"""The verdict columns: one table mapping kernel bits to tshark field names.

Column names are tshark's ``tcp.analysis.*`` field names without the prefix,
so a CSV column lines up with ``tshark -e tcp.analysis.<name>``. Bits must
match ``forensics/native/tcpkernel.h``.
"""
from __future__ import annotations

import numpy as np

# name -> bit in the kernel's verdict word (tcpkernel.h V_*)
VERDICT_BITS: dict[str, int] = {
    "retransmission": 0,
    "fast_retransmission": 1,
    "spurious_retransmission": 2,
    "out_of_order": 3,
    "lost_segment": 4,
    "ack_lost_segment": 5,
    "duplicate_ack": 6,
    "zero_window": 7,
    "zero_window_probe": 8,
    "zero_window_probe_ack": 9,
    "window_full": 10,
    "window_update": 11,
    "keep_alive": 12,
    "keep_alive_ack": 13,
    "reused_ports": 14,
}
HIDDEN_BIT = 15        # TCP options cut by snaplen: tshark prints no analysis for the frame
NOT_ANALYZED_BIT = 16  # segment shorter than its header: no analysis

# The verdicts the issue and the CSV name, in CSV order (rst is tcp.flags.reset).
CSV_VERDICTS = [
    "retransmission", "fast_retransmission", "spurious_retransmission", "out_of_order",
    "lost_segment", "ack_lost_segment", "duplicate_ack", "duplicate_ack_num", "zero_window",
    "zero_window_probe", "window_full", "window_update", "keep_alive", "keep_alive_ack", "rst",
]

# Verdicts that mean "the network lost or reordered something" (for summaries).
LOSS_VERDICTS = ["retransmission", "fast_retransmission", "spurious_retransmission",
                 "out_of_order", "lost_segment", "ack_lost_segment", "duplicate_ack"]

ANY_VERDICT_MASK = (1 << (max(VERDICT_BITS.values()) + 1)) - 1


def printed(verdicts: np.ndarray) -> np.ndarray:
    """Verdict words as tshark prints them: nothing on frames it hides."""
    hidden = (verdicts >> HIDDEN_BIT) & 1
    return np.where(hidden.astype(bool), 0, verdicts & ANY_VERDICT_MASK).astype(np.uint32)


def verdict_column(verdicts: np.ndarray, name: str) -> np.ndarray:
    return ((verdicts >> VERDICT_BITS[name]) & 1).astype(np.uint8)
