"""Chrome trace event JSON for ui.perfetto.dev (``stallscope analyze --perfetto trace.json``).

One process per host and one thread (track) per rank, named with ``M`` metadata events;
collectives are complete ``X`` slices, TCP events thread-scoped instants ``i`` on the
track of the rank that owns the flow; timestamps in microseconds since the start of
the capture. Two adjustments keep the trace faithful in Perfetto:

- ids start at 1 (pid = host index + 1, tid = rank + 1): Perfetto treats pid/tid 0 as
  the kernel's idle task and merges such tracks.
- NCCL calls overlap on a rank (several are queued, then one host wait completes them
  all), and slices on one track must nest. The k-th call still outstanding goes to
  sub-track k of the rank ("rank 3 · queued +k", tid = rank + 1 + k * LANE_STRIDE), so
  each track's slices are disjoint and its timestamps increase.
TCP events of no known rank go on a per-host "TCP (no rank)" track.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from . import data
from ..coerce import cell_int

LANE_STRIDE = 100_000       # tid offset of a rank's sub-tracks (ranks < LANE_STRIDE)
UNATTRIBUTED_TID = 99_999   # per host: TCP events with no rank


def _us(ns: pd.Series | np.ndarray, t0: int) -> np.ndarray:
    return np.round((np.asarray(ns, dtype="int64") - t0) / 1e3, 3)


def trace(analysis) -> dict:
    model = analysis.model
    span = data.time_span(analysis)
    t0 = span.start_ns or 0
    iv = data.intervals(analysis)
    tcp = model.tables["tcp_events"].dropna(subset=["timestamp_ns"])
    hosts = list(dict.fromkeys(list(model.hosts) + [str(h) for h in iv["host"].dropna().unique()]
                               + [str(h) for h in tcp["host"].dropna().unique()]))
    pid_of = {h: i + 1 for i, h in enumerate(hosts)}
    events: list[dict] = []
    meta: list[dict] = []
    for h, pid in pid_of.items():
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": h}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                     "args": {"sort_index": pid}})
    tracks: set[tuple[int, int, str, int]] = set()

    if len(iv):
        iv = iv.assign(pid=iv["host"].astype(str).map(pid_of),
                       tid=iv["rank"].astype("int64") + 1 + iv["lane"] * LANE_STRIDE)
        ts = _us(iv["start"], t0)
        dur = np.round((iv["end"].to_numpy("int64") - iv["start"].to_numpy("int64")) / 1e3, 3)
        for row, t, d in zip(iv.itertuples(index=False), ts.tolist(), dur.tolist()):
            events.append({
                "ph": "X", "name": str(row.op), "cat": f"nccl,{row.duration_source}", "pid": int(row.pid),
                "tid": int(row.tid), "ts": t, "dur": d,
                "args": {"op_count": cell_int(row.op_count), "comm": str(row.comm_id_hash), "bytes": cell_int(row.bytes),
                         "duration_source": str(row.duration_source), "completed": not bool(row.open),
                         "rank": int(row.rank), "datatype": _str(row.datatype), "count": cell_int(row.count)},
            })
        for (pid, tid, rank, lane) in iv[["pid", "tid", "rank", "lane"]].drop_duplicates().itertuples(index=False):
            tracks.add((int(pid), int(tid), f"rank {int(rank)}" + (f" · queued +{int(lane)}" if lane else ""),
                        int(rank) * 1000 + int(lane)))

    if len(tcp):
        has_rank = tcp["rank"].notna()
        tid = np.where(has_rank, pd.to_numeric(tcp["rank"], errors="coerce").fillna(0).astype("int64") + 1,
                       UNATTRIBUTED_TID)
        tcp = tcp.assign(pid=tcp["host"].astype(str).map(pid_of), tid=tid, ts=_us(tcp["timestamp_ns"], t0))
        for row in tcp.itertuples(index=False):
            events.append({
                "ph": "i", "s": "t", "name": str(row.event), "cat": f"tcp,{row.source}", "pid": int(row.pid),
                "tid": int(row.tid), "ts": float(row.ts),
                "args": {"flow": f"{row.saddr}:{cell_int(row.sport)} -> {row.daddr}:{cell_int(row.dport)}",
                         "rank": cell_int(row.rank), "peer_rank": cell_int(row.peer_rank), "source": str(row.source),
                         "collective": (f"{row.coll_op} #{cell_int(row.coll_op_count)}"
                                        if pd.notna(row.coll_op) else None)},
            })
        for pid, tid, rank in tcp[["pid", "tid", "rank"]].drop_duplicates().itertuples(index=False):
            if tid == UNATTRIBUTED_TID:
                tracks.add((int(pid), UNATTRIBUTED_TID, "TCP (no rank)", 10 ** 9))
            else:
                tracks.add((int(pid), int(tid), f"rank {int(rank)}", int(rank) * 1000))

    for pid, tid, name, order in sorted(tracks):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0,
                     "args": {"sort_index": order}})
    # per track in time order; a slice before an instant at the same time (the instant lies inside it)
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], 0 if e["ph"] == "X" else 1, -e.get("dur", 0)))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"generator": "stallscope", "verdict": analysis.verdict(),
                          "time_origin_utc": data.utc(t0), "time_origin_ns": t0}}


def _str(v):
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)


def write(analysis, fh) -> None:
    json.dump(trace(analysis), fh, separators=(",", ":"))
    fh.write("\n")
