"""``offcpu``: the capture's per-thread scheduler samples, one row per sample.

capture samples ``/proc/PID/task/TID/schedstat`` of the job's threads every few seconds
(bpf/README.md, ``offcpu`` events): ``ns`` is the thread's off-CPU time since capture
first saw it (blocked, or waiting for a CPU), ``oncpu_ns`` and ``runq_ns`` the kernel's
totals since the thread started. Times are tracer (monotonic) times: converted to UTC
with the bundle's :class:`~forensics.inputs.bundle.ClockMap`. The ``*_delta_ns`` columns are the
growth since the thread's previous sample (NULL on its first), so "how long was rank 3's
main thread off-CPU between two samples" is one column, not a window query.
"""
from __future__ import annotations

import pandas as pd

from .events import events_frame, utc_of
from .nccl import process_ranks
from .schema import conform, empty


def offcpu_samples(bundle, events, ranks: dict[int, int] | None = None) -> pd.DataFrame:
    ev = events_frame(events, "offcpu")
    if ev.empty or not {"t", "pid", "tid"} <= set(ev.columns):
        return empty("offcpu")
    for c in ("name", "state", "ns", "oncpu_ns", "runq_ns"):
        if c not in ev.columns:
            ev[c] = None
    ev = ev.dropna(subset=["t", "pid", "tid"]).copy()
    if ev.empty:
        return empty("offcpu")
    for c in ("pid", "tid", "ns", "oncpu_ns", "runq_ns"):
        ev[c] = pd.to_numeric(ev[c], errors="coerce")
    ev["timestamp_ns"] = utc_of(bundle.clock, ev["t"])
    ev = ev.sort_values(["pid", "tid", "t"], kind="stable")
    g = ev.groupby(["pid", "tid"], sort=False)
    ranks = process_ranks(bundle, events) if ranks is None else ranks
    out = pd.DataFrame({
        "timestamp_ns": ev["timestamp_ns"], "host": bundle.host, "pid": ev["pid"], "tid": ev["tid"],
        "rank": ev["pid"].map(ranks), "name": ev["name"], "state": ev["state"],
        "offcpu_ns": ev["ns"], "oncpu_ns": ev["oncpu_ns"], "runq_ns": ev["runq_ns"],
        "offcpu_delta_ns": g["ns"].diff(), "oncpu_delta_ns": g["oncpu_ns"].diff(),
        "runq_delta_ns": g["runq_ns"].diff(),
    })
    out = conform(out, "offcpu")
    return out.sort_values(["timestamp_ns", "pid", "tid"], kind="stable", na_position="last").reset_index(drop=True)
