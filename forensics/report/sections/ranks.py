"""The per-rank table (one row per process, by global rank) and its totals row, which
ranks a table or plot shows first when it cannot show them all, ranks as text, and how many
ranks the evidence knows.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ...tcp.classes import DATA_LOSS_CLASSES, classify
from .common import memo, with_global_rank
from .processes import offcpu_by_rank
from .progress import late_global, lateness_long


DURATION_SOURCES = {
    "gpu": "GPU time (Flight Recorder / profiler)",
    "host_sync": "host wait on the stream (upper bound)",
    "call": "call time only (launch, not the collective)",
}


def rank_table(analysis) -> pd.DataFrame:
    """One row per process, by its global rank (a rank on a sub-communicator is mapped to its
    process's world rank, the rank TCP events carry): calls, durations (p50/p99/max ms),
    lateness, TCP trouble, off-CPU time."""
    return memo(analysis, "rank_table", lambda: _rank_table(analysis.model))


def _rank_table(model) -> pd.DataFrame:
    n = model.tables["nccl_events"]
    t = model.tables["tcp_events"]
    if len(n):
        n = with_global_rank(model, n)
    ranks = set(pd.to_numeric(n["rank"], errors="coerce").dropna().astype(int)) if len(n) else set()
    ranks |= set(pd.to_numeric(t["rank"], errors="coerce").dropna().astype(int)) if len(t) else set()
    if not ranks:
        return pd.DataFrame()
    late = lateness_long(model)
    if late is not None and len(late):
        late = late_global(model, late)
    t = t.dropna(subset=["rank"]).astype({"rank": "int64"}) if len(t) else t
    return _rank_stats(sorted(ranks), n, late, t, offcpu_by_rank(model)).reset_index()


def rank_totals(analysis, ranks: pd.DataFrame) -> dict[str, Any]:
    """The per-rank table's statistics over every rank at once (the totals row of a table
    that shows only some ranks): counts summed, percentiles over every call. ``ranks``:
    :func:`rank_table` of the same analysis."""
    return memo(analysis, "rank_totals", lambda: _rank_totals(analysis.model, ranks))


def _rank_totals(model, ranks: pd.DataFrame) -> dict[str, Any]:
    if ranks.empty:
        return {}
    n = model.tables["nccl_events"]
    t = model.tables["tcp_events"]
    t = t.dropna(subset=["rank"]) if len(t) else t
    late = lateness_long(model)

    def one(df):   # every row in one group
        return df.assign(rank=0) if df is not None and len(df) else df
    off = ranks.set_index("rank")["offcpu_ms"].sum(min_count=1) if "offcpu_ms" in ranks else None
    row = _rank_stats([0], one(n), one(late), one(t), None if off is None else pd.Series({0: off}))
    out = row.reset_index().iloc[0].to_dict()
    hosts = {h for v in ranks.get("host", pd.Series(dtype=object)).dropna() for h in str(v).split(", ")}
    out.update({"rank": f"all {len(ranks)}", "host": f"{len(hosts)} host{'' if len(hosts) == 1 else 's'}",
                "pid": "-"})
    return out


def _joined(keys: pd.Series, values: pd.Series, fmt=str, unique: bool = True) -> pd.Series:
    """Per key, its values joined with ", " (distinct and sorted with ``unique``, else in the
    order given), NaN left out: a groupby-join without a Python call per group."""
    d = pd.DataFrame({"k": keys.to_numpy(), "v": values.to_numpy()}).dropna()
    if unique:
        d = d.drop_duplicates().sort_values(["k", "v"], kind="stable")
    out: dict = {}
    for k, v in zip(d["k"].to_numpy(), d["v"].to_numpy()):
        out.setdefault(k, []).append(fmt(v))
    return pd.Series({k: ", ".join(v) for k, v in out.items()}, dtype=object)


def _rank_stats(ranks: list[int], n: pd.DataFrame, late: pd.DataFrame | None, t: pd.DataFrame,
                off: pd.Series | None) -> pd.DataFrame:
    """The per-rank statistics of :func:`rank_table`, grouped by the frames' ``rank`` column."""
    out = pd.DataFrame({"rank": ranks}).set_index("rank")
    if len(n):
        g = n.assign(dur_ms=pd.to_numeric(n["duration_ns"], errors="coerce") / 1e6,
                     open=~n["completed"].fillna(False).astype(bool)).groupby("rank")
        out["host"] = _joined(n["rank"], n["host"].astype("string").astype(object))
        out["pid"] = _joined(n["rank"], pd.to_numeric(n["pid"], errors="coerce"), lambda v: str(int(v)))
        out["calls"] = g.size()
        out["not_completed"] = g["open"].sum()
        out["p50_ms"] = g["dur_ms"].quantile(0.5)          # linear, NaN left out: numpy's percentile
        out["p99_ms"] = g["dur_ms"].quantile(0.99)
        out["max_ms"] = g["dur_ms"].max()
        src = n.groupby(["rank", "duration_source"]).size().rename("k").reset_index()
        src = src.sort_values(["rank", "k", "duration_source"], ascending=[True, False, True], kind="stable")
        out["duration_source"] = _joined(src["rank"], src["duration_source"].astype(str) + " " + src["k"].astype(str),
                                         unique=False)
    if late is not None and len(late):
        lg = late.groupby("rank")["lateness_ms"]
        out["lateness_p50_ms"] = lg.quantile(0.5)
        out["lateness_p99_ms"] = lg.quantile(0.99)
    if len(t):
        kern = t["source"].eq("bpf")
        cls = classify(t)
        lost = cls.isin(DATA_LOSS_CLASSES)
        out["retx_kernel"] = t[kern & lost].groupby("rank").size()
        out["retx_pcap"] = t[~kern & lost].groupby("rank").size()
        out["dup_acks"] = t[cls.eq("duplicate_ack")].groupby("rank").size()
        out["resets"] = t[cls.eq("reset")].groupby("rank").size()
    for c in ("retx_kernel", "retx_pcap", "dup_acks", "resets"):
        if c in out:
            out[c] = out[c].fillna(0).astype(int)
    if off is not None:
        out["offcpu_ms"] = off
    return out


def trouble_order(ranks: pd.DataFrame, blamed) -> np.ndarray:
    """Positions of the per-rank table's rows, most telling first: the ranks a finding blames,
    then the latest (lateness p99), then those with the most trouble (calls not completed,
    lost data, resets), then by rank. What a table or plot shows when it cannot show every rank."""
    if ranks.empty:
        return np.arange(0)
    zero = pd.Series(0.0, index=ranks.index)
    num = lambda c: pd.to_numeric(ranks[c], errors="coerce").fillna(0) if c in ranks else zero  # noqa: E731
    key = pd.DataFrame({"blamed": ranks["rank"].isin(list(blamed)).to_numpy(),
                        "late": num("lateness_p99_ms").to_numpy(),
                        "trouble": (num("not_completed") + num("retx_kernel") + num("retx_pcap")
                                    + num("resets")).to_numpy(),
                        "rank": pd.to_numeric(ranks["rank"], errors="coerce").to_numpy()})
    key = key.sort_values(["blamed", "late", "trouble", "rank"], ascending=[False, False, False, True],
                          kind="stable")
    return key.index.to_numpy()


def outlier_ranks(ranks: pd.DataFrame, every, blamed, latest: int, max_blamed: int) -> tuple[list[int], list[int]]:
    """The ranks worth a lane when not each of ``every`` rank gets one: (blamed, latest): the
    ranks a finding blames (at most ``max_blamed``, lowest first) and the ``latest`` others of
    the per-rank table ``ranks`` first in :func:`trouble_order` (the latest by lateness p99,
    then the most trouble)."""
    every = {int(r) for r in every}
    named = sorted({int(r) for r in blamed} & every)[:max_blamed]
    if ranks.empty:
        return named, []
    rank = pd.to_numeric(ranks["rank"], errors="coerce")
    others = ranks[rank.isin(list(every)) & ~rank.isin(named)].reset_index(drop=True)
    pick = others.iloc[trouble_order(others, ())[:latest]]
    return named, [int(r) for r in pick["rank"]]


def rank_ranges(ranks, few: int = 16) -> str:
    """A list of ranks as text: '2, 6' for up to ``few`` of them (as joined today), else runs
    of consecutive ranks as 'a-b' and the count: '0-255, 300 (257 ranks)'."""
    r = np.unique(np.asarray([int(x) for x in ranks], dtype=np.int64))
    if len(r) <= few:
        return ", ".join(map(str, r.tolist()))
    runs = np.split(r, np.flatnonzero(np.diff(r) != 1) + 1)
    parts = [f"{g[0]}-{g[-1]}" if len(g) > 2 else ", ".join(map(str, g.tolist())) for g in runs]
    if len(parts) > few:
        return ", ".join(parts[:few]) + f", … ({len(r)} ranks)"
    return ", ".join(parts) + f" ({len(r)} ranks)"


RANK_TABLES = ("coll_log_ops", "nccl_config", "fr_pg_status", "nccl_warnings", "watchdog_events", "sockets")


def known_ranks(analysis, ranks: pd.DataFrame | None = None) -> int:
    """How many ranks the evidence knows, from every source: the traced calls' ranks, the
    logs', Flight Recorder's, the sockets' and the processes' RANK."""
    seen: set[int] = set()
    if ranks is not None and len(ranks) and "rank" in ranks:
        seen |= set(pd.to_numeric(ranks["rank"], errors="coerce").dropna().astype("int64").tolist())
    for name in RANK_TABLES:
        t = analysis.model.tables.get(name)
        if t is not None and len(t) and "rank" in t:
            seen |= set(pd.to_numeric(t["rank"], errors="coerce").dropna().astype("int64").tolist())
    for c in analysis.model.captures:
        seen |= {int(p["rank"]) for p in c.get("processes", []) or [] if p.get("rank") is not None}
    return len(seen)
