"""The timeline's calls: each collective call as an interval of its process, in the
lane it occupies (queued calls overlap), for the HTML timeline and the Perfetto trace.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .common import memo, time_span, with_global_rank


def lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Greedy interval-to-lane assignment (intervals sorted by start): lane k holds the k-th
    collective still outstanding. Queued NCCL calls overlap (the host waits once for
    several); separate lanes keep each one visible and properly nested in a trace."""
    lane_end: list[int] = []
    out = np.zeros(len(starts), dtype=np.int64)
    # a per-rank loop over calls (not packets): thousands at most per rank
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        for k, le in enumerate(lane_end):
            if s >= le:
                lane_end[k] = e
                out[i] = k
                break
        else:
            lane_end.append(e)
            out[i] = len(lane_end) - 1
    return out


def intervals(analysis) -> pd.DataFrame:
    """Collective intervals per (host, global rank) with the lane each occupies; a call never
    completed runs to the end of the capture (``open`` True)."""
    return memo(analysis, "intervals", lambda: _intervals(analysis))


def _intervals(analysis) -> pd.DataFrame:
    n = analysis.model.tables["nccl_events"]
    if n.empty:
        return n.assign(start=pd.Series(dtype="int64"), end=pd.Series(dtype="int64"), open=pd.Series(dtype=bool),
                        lane=pd.Series(dtype="int64"))
    span = time_span(analysis)
    # lanes per process: by global rank (comm_rank keeps the rank within the communicator)
    n = with_global_rank(analysis.model, n.dropna(subset=["timestamp_ns", "rank"]))
    start = n["timestamp_ns"].astype("int64")
    end = pd.to_numeric(n["end_ns"], errors="coerce")
    open_ = end.isna() | ~n["completed"].fillna(False).astype(bool)
    end = end.fillna(span.end_ns if span.end_ns is not None else start.max()).astype("int64")
    end = np.maximum(end, start)
    df = n.assign(start=start, end=end, open=open_, host=n["host"].fillna("?").astype(str))
    df = df.sort_values(["host", "rank", "start", "end"], kind="stable")
    lane = np.zeros(len(df), dtype=np.int64)
    pos = 0
    for _, g in df.groupby(["host", "rank"], sort=False):
        k = len(g)
        lane[pos:pos + k] = lanes(g["start"].to_numpy(), g["end"].to_numpy())
        pos += k
    return df.assign(lane=lane)
