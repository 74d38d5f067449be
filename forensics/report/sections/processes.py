"""Inside the processes: each thread's off-CPU time (the ``offcpu`` samples), the
stacks py-spy and the native tools took, and Flight Recorder's last entries per rank.
"""
from __future__ import annotations

import pandas as pd

from .common import optional_table


def offcpu_threads(model) -> pd.DataFrame | None:
    """Off-CPU time per thread over the capture, from the ``offcpu`` samples (cumulative
    counters: last - first sample); ``nccl_thread`` marks the threads that called NCCL."""
    off = optional_table(model, "offcpu")
    if off is None or not {"pid", "tid", "offcpu_ns"} <= set(off.columns):
        return None
    off = off.dropna(subset=["pid", "tid"]).sort_values("timestamp_ns", kind="stable")
    g = off.groupby(["host", "pid", "tid"], dropna=False, sort=True)
    span = lambda c: (g[c].max() - g[c].min()) / 1e6  # noqa: E731 (counter growth, ms)
    out = pd.DataFrame({"rank": g["rank"].first(), "name": g["name"].last(), "samples": g.size(),
                        "offcpu_ms": span("offcpu_ns")})
    for c, name in (("oncpu_ns", "oncpu_ms"), ("runq_ns", "runq_ms")):
        if c in off.columns:
            out[name] = span(c)
    n = model.tables["nccl_events"]
    callers = set(zip(n["pid"].dropna().astype("int64"), n["tid"].dropna().astype("int64"))) if len(n) else set()
    out = out.reset_index()
    out["nccl_thread"] = [(int(p), int(t)) in callers for p, t in zip(out["pid"], out["tid"])]
    return out.sort_values(["rank", "pid", "tid"], kind="stable", na_position="last")


def offcpu_by_rank(model) -> pd.Series | None:
    """Off-CPU ms per rank of the threads that called NCCL (else the main thread)."""
    th = offcpu_threads(model)
    if th is None:
        return None
    th = th.dropna(subset=["rank"])
    main = th["nccl_thread"] if th["nccl_thread"].any() else th["pid"] == th["tid"]
    s = th[main].groupby(th.loc[main, "rank"].astype("int64"))["offcpu_ms"].sum(min_count=1)
    return s


def stacks_text(model) -> pd.DataFrame | None:
    """py-spy frames folded into one stack text per (host, rank, pid, phase, thread)."""
    st = optional_table(model, "stacks")
    if st is None or not {"function", "depth"} <= set(st.columns):
        return None
    keys = [c for c in ("host", "rank", "pid", "phase", "thread_name", "os_tid", "status") if c in st.columns]
    st = st.sort_values(keys + ["depth"], kind="stable")
    loc = st["function"].astype("string").fillna("?")
    if "code_file" in st.columns:
        # native frames (eu-stack, gdb) may have no source file: the function alone
        where = (" (" + st["code_file"].astype("string") + ":"
                 + st.get("lineno", pd.Series(pd.NA, index=st.index)).astype("Int64").astype("string").fillna("?")
                 + ")")
        loc = loc + where.fillna("")
    st = st.assign(frame=loc.astype(str))
    out = st.groupby(keys, dropna=False, sort=True)["frame"].agg("\n".join).reset_index()
    return out.rename(columns={"frame": "stack (innermost first)"})


def fr_tail(model, per_rank: int = 10) -> pd.DataFrame | None:
    """The last Flight Recorder entries of each rank (where a hang shows)."""
    fr = optional_table(model, "fr_entries")
    if fr is None:
        return None
    order = [c for c in ("host", "rank", "pid", "record_id") if c in fr.columns]
    fr = fr.sort_values(order, kind="stable")
    keys = [c for c in ("host", "rank", "pid") if c in fr.columns]
    tail = fr.groupby(keys, dropna=False, sort=False).tail(per_rank) if keys else fr.tail(per_rank)
    cols = [c for c in ("host", "rank", "pg_name", "collective_seq_id", "p2p_seq_id", "profiling_name", "state",
                        "duration_ms", "timeout_ms", "input_numel", "thread_name", "top_frame") if c in tail.columns]
    return tail[cols] if cols else tail
