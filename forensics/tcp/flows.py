"""Per-flow (per ``tcp.stream``) summaries built from the kernel's counters."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .conversations import ConversationTable

FLOW_COUNTERS = {
    # output column -> kernel counter (summed over both directions)
    "retransmissions": "retrans",
    "fast_retransmissions": "fast",
    "spurious_retransmissions": "spurious",
    "out_of_order": "ooo",
    "lost_segments": "lost",
    "duplicate_acks": "dupack",
    "zero_windows": "zero_window",
    "rsts": "rst",
    "keep_alives": "keep_alive",
}


def flow_table(convs: np.ndarray, table: ConversationTable) -> pd.DataFrame:
    """One row per stream: endpoints (originator first), volumes, problems, RTT, history.

    The originator is the side that sent the first packet (or the SYN, when the
    capture begins with the SYN/ACK). Counters split by direction keep the
    ``_orig``/``_resp`` suffix; the problem counters are totals.
    """
    n = len(convs)
    key = convs["key"].astype(np.int64)
    ends = table.endpoints(key)
    orig = convs["orig_flow"].astype(np.int64)       # 0: flow1 opened it, 1: flow2
    o, r = orig, 1 - orig
    rows = np.arange(n)

    def side(arr, which):
        return arr[rows, which] if n else np.zeros(0, arr.dtype)

    addresses = pd.Index(table.addresses)
    orig_is_f1 = orig == 0
    cols = {
        "stream": rows.astype(np.uint32),
        "orig_addr": pd.Categorical.from_codes(np.where(orig_is_f1, ends["flow1_addr"], ends["flow2_addr"]), categories=addresses),
        "orig_port": np.where(orig_is_f1, ends["flow1_port"], ends["flow2_port"]),
        "resp_addr": pd.Categorical.from_codes(np.where(orig_is_f1, ends["flow2_addr"], ends["flow1_addr"]), categories=addresses),
        "resp_port": np.where(orig_is_f1, ends["flow2_port"], ends["flow1_port"]),
        "first_frame": convs["first_frame"],
        "first_ns": convs["first_ts"],
        "last_ns": convs["last_ts"],
        "packets_orig": side(convs["packets"], o),
        "packets_resp": side(convs["packets"], r),
        "bytes_orig": side(convs["bytes"], o),
        "bytes_resp": side(convs["bytes"], r),
    }
    for out, src in FLOW_COUNTERS.items():
        cols[out] = convs[src].sum(axis=1).astype(np.int64) if n else np.zeros(0, np.int64)
    cols["retransmissions_orig"] = side(convs["retrans"], o)
    cols["retransmissions_resp"] = side(convs["retrans"], r)
    rtt_n = convs["rtt_n"].sum(axis=1) if n else np.zeros(0)
    rtt_sum = convs["rtt_sum"].sum(axis=1) if n else np.zeros(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["rtt_mean_ns"] = np.where(rtt_n > 0, rtt_sum / np.maximum(rtt_n, 1), np.nan)
    mins = convs["rtt_min"].astype(np.float64) if n else np.zeros((0, 2))
    mins[mins < 0] = np.nan
    cols["rtt_min_ns"] = np.fmin(mins[:, 0], mins[:, 1]) if n else np.zeros(0)
    cols["irtt_ns"] = np.where(convs["irtt"] > 0, convs["irtt"], 0) if n else np.zeros(0, np.int64)
    cols["history"] = [h.decode("ascii", "replace") for h in convs["history"]] if n else []
    return pd.DataFrame(cols)
