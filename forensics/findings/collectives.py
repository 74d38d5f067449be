"""Collective windows: when each collective began and ended across its ranks.

Everything here is a vectorized operation over the model's tables (``collectives`` above
all; no per-event Python loop): :func:`collective_windows` (one row per communicator and
op_count), which of them every watched rank entered (:func:`all_watched_entered`,
:data:`ALL_WATCHED_ENTERED_SQL` in SQL) and times inside a union of windows (:func:`in_windows`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..model.progress import is_per_process


def collective_windows(ctx) -> pd.DataFrame:
    """One row per (communicator, op_count): t0 = first rank's entry, t1 = last rank's
    end (NA unless every rank that should take part completed), duration, complete. The
    ranks that should take part are those a capture watched then (:func:`all_watched_entered`)."""
    c = ctx.table("collectives")
    if c.empty:
        return pd.DataFrame(columns=["comm_id_hash", "op_count", "op", "bytes", "nranks", "t0", "t1", "duration_ns",
                                     "complete", "ranks_entered", "ranks_completed"])
    nranks = c["nranks"].fillna(c["ranks_entered"])
    # a communicator created before the tracer attached has no id: its rows are one process's
    # calls (key host:pid:comm), complete when that process completed them
    complete = (c["ranks_completed"] == c["ranks_entered"]) & (all_watched_entered(c)
                                                              | is_per_process(c["comm_id_hash"]))
    w = pd.DataFrame({"comm_id_hash": c["comm_id_hash"], "op_count": c["op_count"], "op": c["op"],
                      "bytes": c["bytes"] if "bytes" in c.columns else pd.NA, "nranks": nranks, "t0": c["first_entry_ns"].astype("Int64"),
                      "t1": c["last_end_ns"].astype("Int64").where(complete.fillna(False).astype(bool)),
                      "ranks_entered": c["ranks_entered"], "ranks_completed": c["ranks_completed"]})
    w["complete"] = w["t1"].notna()
    w["duration_ns"] = (w["t1"] - w["t0"]).astype("Float64")
    return w.reset_index(drop=True)


def all_watched_entered(c: pd.DataFrame) -> pd.Series:
    """Per ``collectives`` row: every rank of its communicator entered it, less those absent
    because no capture watched them then (``ranks_unwatched``: per-host captures that start
    and stop apart see each collective on the hosts watching at the time, and what those
    ranks did is the whole of what there is to judge). A rank never seen, or on a host with
    no capture window, still counts as absent. :data:`ALL_WATCHED_ENTERED_SQL` in SQL."""
    unwatched = c["ranks_unwatched"].fillna(0) if "ranks_unwatched" in c else 0
    return (c["ranks_entered"] + unwatched >= c["nranks"].fillna(c["ranks_entered"])).fillna(False).astype(bool)


ALL_WATCHED_ENTERED_SQL = "ranks_entered + coalesce(ranks_unwatched, 0) >= coalesce(nranks, ranks_entered)"


def in_windows(t: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """For each time in ``t``: inside the union of the closed intervals [t0, t1]?"""
    t = np.asarray(t, dtype=np.int64)
    if len(t0) == 0 or len(t) == 0:
        return np.zeros(len(t), dtype=bool)
    order = np.argsort(t0, kind="stable")
    s, e = np.asarray(t0, dtype=np.int64)[order], np.asarray(t1, dtype=np.int64)[order]
    e = np.maximum.accumulate(e)   # running end: an interval nested in an earlier one adds nothing
    i = np.searchsorted(s, t, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(t), dtype=bool)
    out[ok] = t[ok] <= e[i[ok]]
    return out


__all__ = ["ALL_WATCHED_ENTERED_SQL", "all_watched_entered", "collective_windows", "in_windows"]
