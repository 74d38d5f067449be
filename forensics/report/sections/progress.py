"""How far each rank got: the collectives' per-rank lateness, entries and absences
(global ranks), and each communicator's progress and hang point (:class:`Progress`), read by
the rank tables, the heatmap, the timeline and the hang sections.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...model.progress import hang_frontiers
from .common import memo, utc, with_global_rank


def lateness_long(model) -> pd.DataFrame | None:
    """collectives' per-rank lateness lists, one row per (comm, op_count, rank) with its
    ``lateness_ms`` (ranks as the communicator numbers them); None without collectives. The
    rank tables and the heatmap (:func:`forensics.report.figures.heatmap`) read it."""
    c = model.tables.get("collectives")
    if c is None or c.empty:
        return None
    e = c[["comm_id_hash", "op_count", "op", "ranks", "lateness_ns"]].explode(["ranks", "lateness_ns"])
    # a list's missing rank (a process whose rank no source names) may come back masked, not NaN
    e = e.assign(ranks=pd.to_numeric(e["ranks"].map(lambda v: None if np.ma.is_masked(v) else v), errors="coerce"))
    e = e.dropna(subset=["ranks"])
    return pd.DataFrame({"comm_id_hash": e["comm_id_hash"], "op_count": e["op_count"], "op": e["op"],
                         "rank": e["ranks"].astype("int64"),
                         "lateness_ms": pd.to_numeric(e["lateness_ns"], errors="coerce") / 1e6})


def late_global(model, late: pd.DataFrame) -> pd.DataFrame:
    """Lateness rows (comm ranks) with ``rank`` mapped to the global rank of the process
    that held that comm rank (unchanged when unknown)."""
    n = model.tables["nccl_events"].dropna(subset=["comm_id_hash", "rank", "pid"])
    if n.empty:
        return late
    m = with_global_rank(model, n)[["comm_id_hash", "comm_rank", "rank"]].drop_duplicates(["comm_id_hash", "comm_rank"])
    m = m.astype({"comm_id_hash": str, "comm_rank": "int64", "rank": "int64"})
    out = late.astype({"comm_id_hash": str, "rank": "int64"}).merge(
        m.rename(columns={"rank": "global_rank", "comm_rank": "rank"}), on=["comm_id_hash", "rank"], how="left")
    return out.assign(rank=out["global_rank"].fillna(out["rank"]).astype("int64")).drop(columns="global_rank")


def collective_ranks(model) -> pd.DataFrame | None:
    """One row per (collective, rank that entered it), ranks mapped to global ranks: when the
    collective began (``first_entry_ns``, its first rank's entry), and how late this rank
    entered and finished it after the first rank did, and its duration (ms)."""
    c = model.tables.get("collectives")
    if c is None or c.empty:
        return None
    c = c[c["ranks"].map(_as_list).map(len) > 0]
    if c.empty:
        return None
    # the list cells side by side (one list per collective, ordered by rank; a NULL element, e.g.
    # the end of a call never completed, is a masked one): concatenated, NULL as NaN
    def flat(col: str) -> np.ndarray:
        return np.ma.concatenate([np.ma.asarray(v, dtype="float64") for v in c[col]]).filled(np.nan)
    n = c["ranks"].map(len).to_numpy()
    out = pd.DataFrame({"comm_id_hash": np.repeat(c["comm_id_hash"].to_numpy(), n),
                        "op_count": np.repeat(c["op_count"].to_numpy(), n),
                        "rank": flat("ranks").astype("int64"), "entry_ns": flat("entry_ns"), "end_ns": flat("end_ns")})
    g = out.groupby(["comm_id_hash", "op_count"], sort=False)
    first_entry, first_end = g["entry_ns"].transform("min"), g["end_ns"].transform("min")
    out = out.assign(first_entry_ns=first_entry,
                     entered_late_ms=(out["entry_ns"] - first_entry) / 1e6,
                     finished_late_ms=(out["end_ns"] - first_end) / 1e6,
                     duration_ms=(out["end_ns"] - out["entry_ns"]) / 1e6)
    return late_global(model, out)


def never_entered(model) -> pd.DataFrame | None:
    """One row per (collective, member rank that never entered it), global ranks, with when
    the collective began (its first rank's entry)."""
    c = model.tables.get("collectives")
    if c is None or c.empty:
        return None
    e = c[["comm_id_hash", "op_count", "first_entry_ns"]].assign(rank=c["missing_ranks"].map(_as_list))
    e = e.explode("rank").dropna(subset=["rank"])
    if e.empty:
        return None
    return late_global(model, e.astype({"rank": "int64"}).reset_index(drop=True))


@dataclass
class Progress:
    """Per communicator: how far each rank got, and where the job stopped progressing."""

    comm_id_hash: str
    per_rank: pd.DataFrame            # rank, host, last_entered, last_op, last_completed, in_flight
    stuck_op_count: int | None        # the hang point (model.progress.hang_frontiers), None: not hung
    stuck_op: str | None
    stuck_at_ns: int | None           # last entry into it (the moment progress stopped)
    missing_ranks: list[int] = field(default_factory=list)   # never entered it
    waiting_ranks: list[int] = field(default_factory=list)   # entered it, never completed


def progress_of(analysis) -> list[Progress]:
    """:func:`progress` of the analysis's model, a memo (the timeline, the hang tables and
    the Markdown all read it; :func:`forensics.report.model_steps` makes it beside the detectors)."""
    return memo(analysis, "progress", lambda: progress(analysis.model))


def progress(model) -> list[Progress]:
    """Op counts per rank and the hang point of each hung communicator: the one the hang
    detectors judge (:func:`forensics.model.progress.hang_frontiers`), with the ranks that
    never entered it and those waiting inside; a communicator that is not hung has none.
    Ranks are global ranks (``per_rank.comm_rank`` keeps the rank within the communicator);
    a rank of a sub-communicator that was never traced has no known process and keeps its
    comm rank in ``missing_ranks``."""
    n = model.tables["nccl_events"]
    if n.empty:
        return []
    c = model.tables.get("collectives")
    frontiers = hang_frontiers(model)
    out = []
    ev = n.dropna(subset=["comm_id_hash", "rank", "op_count"]).assign(done=n["completed"].fillna(False).astype(bool))
    if len(ev):
        ev = with_global_rank(model, ev)
    for comm, g in ev.groupby("comm_id_hash", sort=True):
        g = g.sort_values("op_count", kind="stable")
        to_global = dict(zip(g["comm_rank"].astype("int64"), g["rank"].astype("int64")))
        last = g.groupby("rank").tail(1).set_index("rank")
        done = g[g["done"]].groupby("rank")["op_count"].max()
        per = pd.DataFrame({"comm_rank": last["comm_rank"].astype("int64"), "host": last["host"],
                            "last_entered": last["op_count"].astype("int64"),
                            "last_op": last["op"], "last_entry": last["timestamp_ns"].map(utc)})
        per["last_completed"] = done.reindex(per.index).astype("Int64")
        per["in_flight"] = (g[~g["done"]].groupby("rank").size().reindex(per.index).fillna(0).astype(int))
        per = per.reset_index().sort_values("rank")
        p = Progress(str(comm), per, None, None, None)
        hung = frontiers[frontiers["comm_id_hash"] == comm]
        if len(hung):
            # the hang point the detectors judged (forensics.model.progress): never another op
            h = hung.iloc[0]
            p.stuck_op_count, p.stuck_op = int(h["op_count"]), str(h["op"])
            at = c[(c["comm_id_hash"] == comm) & (c["op_count"] == p.stuck_op_count)] if c is not None else None
            entry = at["last_entry_ns"].dropna() if at is not None and len(at) else pd.Series([], dtype="Int64")
            p.stuck_at_ns = int(entry.iloc[0]) if len(entry) else int(h["first_entry_ns"])
            p.missing_ranks = sorted(to_global.get(int(r), int(r)) for r in _as_list(h["missing_ranks"]))
            entered = g[g["op_count"] == p.stuck_op_count]
            p.waiting_ranks = sorted(int(r) for r in entered.loc[~entered["done"], "rank"].unique())
        out.append(p)
    return out


def _as_list(v) -> list:
    """A list cell of ``collectives`` (NULL when nranks is unknown) as a list."""
    return list(v) if isinstance(v, (list, tuple, np.ndarray)) else []
