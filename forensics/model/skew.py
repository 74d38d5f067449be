"""Residual clock skew between two hosts from the same TCP segments in both hosts' pcaps.

A segment sent from A to B is stamped by A's capture when it leaves and by B's when it
arrives: ``t_B - t_A = skew + delay``; a segment from B to A gives ``t_A - t_B = -skew +
delay``. With a symmetric path, the medians of both directions give
``skew = (d_AB - d_BA) / 2`` and ``delay = (d_AB + d_BA) / 2``. Segments are matched on
(src, sport, dst, dport, raw seq, len, flags), keeping only keys seen once on each
side (a retransmission repeats its key). ``skew_ns`` is B's clock minus A's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

KEY = ["src", "sport", "dst", "dport", "seq_raw", "len", "tcp_flags"]


@dataclass
class SkewEstimate:
    host_a: str
    host_b: str
    skew_ns: int | None
    one_way_delay_ns: int | None
    matched_segments: int
    status: str           # ok | one direction only (delay not separated) | no common segments


def estimate_skew(a: pd.DataFrame, b: pd.DataFrame, a_addrs: set[str], host_a: str = "a",
                  host_b: str = "b") -> SkewEstimate:
    """a, b: fingerprints (KEY + t) of two hosts' captures; a_addrs: host a's own
    addresses (a segment from one of them travels a -> b)."""
    def unique(df):
        return df[~df.duplicated(KEY, keep=False)]
    m = unique(a).merge(unique(b), on=KEY, suffixes=("_a", "_b"))
    if m.empty:
        return SkewEstimate(host_a, host_b, None, None, 0, "no common segments")
    d = (m["t_b"] - m["t_a"]).to_numpy(dtype=np.int64)
    # direction from the sender's address (which side saw it first means nothing under skew)
    ab = m["src"].isin(a_addrs).to_numpy()
    if ab.any() and (~ab).any():
        d_ab = float(np.median(d[ab]))
        d_ba = float(np.median(-d[~ab]))
        return SkewEstimate(host_a, host_b, int(round((d_ab - d_ba) / 2)), int(round((d_ab + d_ba) / 2)), len(m), "ok")
    return SkewEstimate(host_a, host_b, int(np.median(d)), None, len(m),
                        "one direction only: skew includes the one-way delay")

