"""Where each communicator stopped: the hang point, computed once for the detectors and the report.

From the tracer's calls (``nccl_events``), per communicator: the last op each rank entered
and completed, the first it entered and never completed (it is *stuck* inside it), and, when
nothing completed on the communicator for a while before the capture stopped looking, the
hang point (:func:`hang_frontiers`): its kind (some ranks never entered it: a mismatch;
every rank waits inside: stuck), its op, the ranks inside it and those behind. The hang
detectors (``forensics/findings/hang.py``) judge and word it; the report
(``forensics/report/sections/progress.py``) marks the same op on the timeline and the
progress tables, so the two can never name different collectives.

Inputs: the model's ``nccl_events`` and ``capture_windows`` tables and its captures'
``ended_ns``. Outputs: DataFrames, no database.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .windows import common_end

HANG_MIN_NS = 500_000_000      # a collective open this long at the end of the capture is a hang ...
HANG_DURATION_FACTOR = 5.0     # ... when it is also this many times the comm's p99 duration
MAX_TRUSTED_NRANKS = 65_536    # a claimed communicator size is trusted up to max(this, 4 x the ranks seen)


FRONTIER_COLUMNS = ["comm_id_hash", "kind", "op_count", "op", "nranks", "members", "ranks", "missing_ranks",
                    "stuck_at", "first_entry_ns", "waited_ns", "last_progress_ns", "p99_ns", "nranks_claimed"]


def is_per_process(comm_id_hash: pd.Series) -> pd.Series:
    """Collectives keyed by one process (``host:pid:comm_ptr``, COLLECTIVES_SQL's fallback when
    the communicator's id is unknown): they cannot be matched across ranks."""
    return comm_id_hash.astype("string").str.contains(":", regex=False).fillna(False).astype(bool)


def capture_end_ns(model) -> int | None:
    """When the capture stopped looking (latest manifest end), else the last event seen."""
    ends = [c.get("ended_ns") for c in getattr(model, "captures", []) or [] if c.get("ended_ns")]
    last = []
    for name, col in (("nccl_events", "timestamp_ns"), ("nccl_events", "end_ns"), ("tcp_events", "timestamp_ns")):
        t = model.tables.get(name)
        s = t[col].dropna() if t is not None and len(t) else []
        if len(s):
            last.append(int(s.max()))
    if ends:
        return max(int(e) for e in ends + last)
    return max(last) if last else None


def hang_frontiers(model) -> pd.DataFrame:
    """Per hung communicator: what kind of hang, and at which collective.

    Per rank: the last op it entered, the last it completed, and the first op after that
    it entered and never completed (it is *stuck* inside it; a rank with none is *idle*).
    A communicator is hung when some rank is stuck and nothing completed on it for
    ``HANG_MIN_NS`` (or HANG_DURATION_FACTOR x its p99) before the capture ended. Then:

    - idle ranks *behind* a stuck one (they never entered an op a stuck rank waits in)
      make a mismatch at #n = their last op + 1 (ranks never traced count as behind);
    - otherwise every rank is stuck, or the stuck ones wait in an op their idle peers
      completed: a stuck hang at the earliest op any rank is stuck in.

    Columns: FRONTIER_COLUMNS; ``ranks`` are the ranks inside #n, ``missing_ranks`` the
    ranks behind, ``stuck_at`` {rank: first op it is stuck in}, ``members`` every rank of
    the communicator (comm ranks: 0..nranks-1, or the ranks seen when the claimed size is
    not believable, see :func:`communicator_members`; ``nranks_claimed`` is then the claim, else None)."""
    n = model.tables["nccl_events"]
    capture_end = capture_end_ns(model)
    if n.empty or capture_end is None:
        return pd.DataFrame(columns=FRONTIER_COLUMNS)
    windows = model.tables.get("capture_windows")
    n = n[n["op_count"].notna() & n["rank"].notna() & n["comm_id_hash"].notna()]
    n = n[~is_per_process(n["comm_id_hash"])]
    if n.empty:
        return pd.DataFrame(columns=FRONTIER_COLUMNS)
    n = n.assign(done=n["completed"].fillna(False).astype(bool), op_count=n["op_count"].astype("int64"),
                 rank=n["rank"].astype("int64"))
    key = ["comm_id_hash", "rank"]
    per = n.groupby(key).agg(last_entered=("op_count", "max"))
    per["last_done"] = n[n["done"]].groupby(key)["op_count"].max()
    per["last_done"] = per["last_done"].fillna(-1).astype("int64")
    m = n.merge(per["last_done"].reset_index(), on=key)
    open_ops = m[~m["done"] & (m["op_count"] > m["last_done"])]
    per["stuck_at"] = open_ops.groupby(key)["op_count"].min()
    done = n[n["done"] & n["duration_ns"].notna()]
    stats = done.assign(d=done["duration_ns"].astype("float64")).groupby("comm_id_hash").agg(
        p99_ns=("d", lambda x: float(x.quantile(0.99))), last_progress_ns=("end_ns", "max"))
    nranks = n.groupby("comm_id_hash")["nranks"].max()
    rows = []
    for comm, p in per.groupby(level=0):
        p = p.droplevel(0)
        # judged inside the window every host of the communicator watched: a collective still
        # open when one host's capture ended is unknown there, never a hang by itself
        hosts = n.loc[n["comm_id_hash"] == comm, "host"].unique()
        end = common_end(windows, hosts) if windows is not None else None
        end = capture_end if end is None else min(end, capture_end)
        opened = open_ops[(open_ops["comm_id_hash"] == comm) & (open_ops["timestamp_ns"] <= end)]
        p = p.assign(stuck_at=opened.groupby("rank")["op_count"].min().reindex(p.index),
                     last_entered=n[(n["comm_id_hash"] == comm) & (n["timestamp_ns"] <= end)]
                     .groupby("rank")["op_count"].max().reindex(p.index).fillna(-1).astype("int64"))
        stuck = p[p["stuck_at"].notna()]
        if stuck.empty:
            continue
        p99 = float(stats["p99_ns"].get(comm, np.nan)) if comm in stats.index else np.nan
        progress = stats["last_progress_ns"].get(comm) if comm in stats.index else None
        need = max(HANG_MIN_NS, HANG_DURATION_FACTOR * (0.0 if np.isnan(p99) else p99))
        if progress is not None and pd.notna(progress) and end - int(progress) < need:
            continue   # the communicator was still completing collectives shortly before the end
        members, claimed = communicator_members(nranks.get(comm), p.index)
        last_entered = {r: int(p["last_entered"].get(r, -1)) if r in p.index else -1 for r in members}
        idle = [r for r in members if r not in stuck.index]
        top = int(stuck["last_entered"].max())
        behind = sorted(r for r in idle if last_entered[r] < top)
        if behind:
            kind, op_n = "mismatch", min(last_entered[r] for r in behind) + 1
            inside = sorted(int(r) for r in stuck.index if last_entered[int(r)] >= op_n)
        else:
            kind, op_n = "stuck", int(stuck["stuck_at"].min())
            inside = sorted(int(r) for r in stuck.index)
        at = n[(n["comm_id_hash"] == comm) & (n["op_count"] == op_n)]
        if at.empty:
            continue
        first_entry = int(at["timestamp_ns"].min())
        waited = end - first_entry
        if waited < need:
            continue
        rows.append({"comm_id_hash": comm, "kind": kind, "op_count": op_n, "op": at["op"].mode().iat[0],
                     "nranks": len(members), "members": members, "ranks": inside, "missing_ranks": behind,
                     "stuck_at": {int(r): int(v) for r, v in stuck["stuck_at"].items()},
                     "first_entry_ns": first_entry, "waited_ns": waited,
                     "last_progress_ns": None if progress is None or pd.isna(progress) else int(progress),
                     "p99_ns": p99, "nranks_claimed": claimed})
    return pd.DataFrame(rows, columns=FRONTIER_COLUMNS)


def communicator_members(size, seen) -> tuple[list[int], int | None]:
    """The comm ranks of a communicator: 0..size-1 when the claimed size (nranks, from the
    bundle) is believable, i.e. at most max(MAX_TRUSTED_NRANKS, 4 x the ranks seen); else the
    ranks seen, and the claim is returned so the finding can say so (a hostile or corrupt
    nranks must not make a list of billions)."""
    observed = sorted(int(r) for r in seen)
    if size is None or pd.isna(size) or int(size) <= 0:
        return observed, None
    size = int(size)
    if size > max(MAX_TRUSTED_NRANKS, 4 * len(observed)) or (observed and observed[-1] >= size):
        return observed, size
    return list(range(size)), None


__all__ = ["FRONTIER_COLUMNS", "HANG_DURATION_FACTOR", "HANG_MIN_NS", "MAX_TRUSTED_NRANKS", "capture_end_ns",
           "communicator_members", "hang_frontiers", "is_per_process"]
