"""What every renderer shows, computed once from an :class:`~forensics.analysis.Analysis`.

The HTML report, the Markdown summary and the Perfetto trace present the same numbers;
they are computed here as DataFrames (vectorised over the event tables) and small
dataclasses, so each renderer only lays them out. Tables that other parts of
stallscope add over time (``offcpu``, ``nccl_config``, ``nccl_tests``, ``stacks``,
``fr_entries``) are read through :func:`optional_table`: a section whose table is
absent or empty is simply not shown.
"""
from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .. import model as event_model
from ..model.logs import YEAR_ASSUMED, ZONE_ASSUMED
from ..model.nccl import world_ranks
from ..tcp.classes import CLASS_LABEL, DATA_LOSS_CLASSES, EVENT_CLASS, classify, events_of

# TCP events grouped by what they mean (forensics/tcp/classes.py, the findings' table too): the
# per-rank table counts lost data (retransmissions and lost segments, not spurious ones), one
# class per packet (classify: a spurious retransmission's 'retransmission' row is left out)
RETRANSMIT_EVENTS = events_of(*DATA_LOSS_CLASSES)
DUPACK_EVENTS = events_of("duplicate_ack")
RESET_EVENTS = events_of("reset")
MARKER_CLASSES = {e: CLASS_LABEL[c] for e, c in EVENT_CLASS.items()}
TOP_ROWS = 50   # a per-rank, per-flow or per-host table longer than this: its most telling rows and "… and N more"


def marker_labels(t: pd.DataFrame) -> pd.Series:
    """Per tcp_events row: the label of its class (:func:`classify`), "other TCP" for an event
    of no class, None for a row another verdict of its packet overrides (not drawn twice)."""
    cls = classify(t)
    out = cls.map(CLASS_LABEL).astype(object)
    return out.where(cls.notna(), np.where(t["event"].isin(list(EVENT_CLASS)), None, "other TCP"))

DURATION_SOURCES = {
    "gpu": "GPU time (Flight Recorder / profiler)",
    "host_sync": "host wait on the stream (upper bound)",
    "call": "call time only (launch, not the collective)",
}


def optional_table(model, name: str) -> pd.DataFrame | None:
    """``model.tables[name]`` when it exists and has rows, else None."""
    df = model.tables.get(name) if hasattr(model.tables, "get") else None
    if df is None or not isinstance(df, pd.DataFrame) or df.empty:
        return None
    return df


def utc(ns: Any) -> str:
    """UTC ns -> '2026-11-22 19:22:07.123456Z' ('-' when unknown)."""
    if ns is None or (isinstance(ns, float) and np.isnan(ns)) or pd.isna(ns):
        return "-"
    t = dt.datetime.fromtimestamp(int(ns) / 1e9, tz=dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{(int(ns) // 1000) % 1_000_000:06d}Z"


@dataclass
class TimeSpan:
    start_ns: int | None
    end_ns: int | None

    @property
    def seconds(self) -> float | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return (self.end_ns - self.start_ns) / 1e9


def time_span(analysis) -> TimeSpan:
    """The capture window (manifests), widened to every event seen."""
    model = analysis.model
    starts = [c.get("started_ns") for c in model.captures if c.get("started_ns")]
    ends = [c.get("ended_ns") for c in model.captures if c.get("ended_ns")]
    n = model.tables["nccl_events"]
    for col in (n["timestamp_ns"], n["end_ns"], model.tables["tcp_events"]["timestamp_ns"]):
        col = pd.to_numeric(col, errors="coerce").dropna()
        if len(col):
            starts.append(int(col.min()))
            ends.append(int(col.max()))
    return TimeSpan(min(starts) if starts else None, max(ends) if ends else None)


def with_global_rank(model, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (nccl_events rows) with ``comm_rank`` (the original ``rank``) and ``rank``
    replaced by the process's global rank (the comm rank when the process is unknown), as
    the findings name ranks (:func:`forensics.model.nccl.world_ranks`)."""
    w = world_ranks(model.tables["nccl_events"])
    key = pd.MultiIndex.from_frame(w[["host", "pid"]].astype({"pid": "int64"}).astype(object)) if len(w) else None
    g = pd.Series(np.nan, index=df.index, dtype="float64")
    ok = df["pid"].notna().to_numpy()
    if key is not None and ok.any():
        look = pd.Series(pd.to_numeric(w["global_rank"]).to_numpy(dtype="float64"), index=key)
        q = pd.MultiIndex.from_arrays([df.loc[ok, "host"].astype(object).to_numpy(),
                                       df.loc[ok, "pid"].astype("int64").astype(object).to_numpy()])
        g[ok] = look.reindex(q).to_numpy()
    rank = pd.to_numeric(df["rank"], errors="coerce")
    # float64 both (rank may be Int64 with NA: a nullable fill value into float64 is deprecated)
    return df.assign(comm_rank=rank, rank=g.fillna(rank.astype("float64")).astype("Int64"))


def memo(analysis, key: str, compute):
    """``compute()`` computed once per analysis and kept in ``analysis.memos``
    (:func:`forensics.model.memo`; :func:`forensics.report.model_steps` may have put it there
    already, made in another process); each caller gets its own copy to change. An analysis
    without memos (a test's stand-in) computes it each time."""
    memos = getattr(analysis, "memos", None)
    return compute() if memos is None else event_model.memo(memos, key, compute)


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
        late = _late_global(model, late)
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


def lateness_long(model) -> pd.DataFrame | None:
    """collectives' per-rank lateness lists, one row per (comm, op_count, rank) with its
    ``lateness_ms`` (ranks as the communicator numbers them); None without collectives. The
    rank tables and the heatmap (:func:`.figures.heatmap`) read it."""
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


def _late_global(model, late: pd.DataFrame) -> pd.DataFrame:
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
    return _late_global(model, out)


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
    return _late_global(model, e.astype({"rank": "int64"}).reset_index(drop=True))


def link_matrix(model) -> pd.DataFrame | None:
    """One row per (rank, peer rank) link with TCP flows: flows, retransmissions (the flows
    table: rank owns the originator, peer_rank the responder) and the worst ACK round-trip
    p99 of its data (``flow_timing``: rank sends, peer_rank ACKs), in ms."""
    f = model.tables["flows"]
    parts = []
    if len(f):
        f = f.dropna(subset=["rank", "peer_rank"])
        if len(f):
            parts.append(f.assign(rank=f["rank"].astype("int64"), peer_rank=f["peer_rank"].astype("int64"),
                                  retx=pd.to_numeric(f["retransmissions"], errors="coerce").fillna(0))
                         .groupby(["rank", "peer_rank"]).agg(flows=("retx", "size"), retransmissions=("retx", "sum")))
    ft = optional_table(model, "flow_timing")
    if ft is not None and {"rank", "peer_rank", "rtt_p99_ns"} <= set(ft.columns):
        ft = ft.dropna(subset=["rank", "peer_rank"])
        if len(ft):
            parts.append(ft.assign(rank=ft["rank"].astype("int64"), peer_rank=ft["peer_rank"].astype("int64"),
                                   rtt=pd.to_numeric(ft["rtt_p99_ns"], errors="coerce") / 1e6)
                         .groupby(["rank", "peer_rank"]).agg(rtt_p99_ms=("rtt", "max")))
    if not parts:
        return None
    out = pd.concat(parts, axis=1).reset_index()
    for c in ("flows", "retransmissions", "rtt_p99_ms"):
        if c not in out:
            out[c] = np.nan
    return out


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


FLOW_COLUMNS = ["host", "rank", "peer_rank", "orig_addr", "orig_port", "resp_addr", "resp_port", "packets", "bytes",
                "retransmissions", "duplicate_acks", "lost_segments", "rsts", "zero_windows", "rtt_ms", "history"]
FLOW_SUMS = ["packets", "bytes", "retransmissions", "duplicate_acks", "lost_segments", "rsts", "zero_windows"]


def flow_table(model, limit: int = 200) -> tuple[pd.DataFrame, int, dict[str, Any]]:
    """Flows, the troubled ones first (when there are more than ``limit``: the most
    retransmissions first); (rows shown, total flows, the totals row: sums over every flow)."""
    f = model.tables["flows"]
    if f.empty:
        return f, 0, {}
    trouble = f[["retransmissions", "duplicate_acks", "rsts", "lost_segments", "zero_windows"]].fillna(0).sum(axis=1)
    f = f.assign(_trouble=trouble, bytes=f["bytes_orig"].fillna(0) + f["bytes_resp"].fillna(0),
                 packets=f["packets_orig"].fillna(0) + f["packets_resp"].fillna(0),
                 rtt_ms=pd.to_numeric(f["rtt_mean_ns"], errors="coerce") / 1e6)
    order = ["_trouble", "bytes"] if len(f) <= limit else ["retransmissions", "_trouble", "bytes"]
    f = f.sort_values(order, ascending=False, kind="stable")
    totals = {c: f[c].fillna(0).sum() for c in FLOW_SUMS}
    totals["host"] = f"all {len(f)}"
    return f[FLOW_COLUMNS].head(limit), len(f), totals


@dataclass
class Progress:
    """Per communicator: how far each rank got, and where the job stopped progressing."""

    comm_id_hash: str
    per_rank: pd.DataFrame            # rank, host, last_entered, last_op, last_completed, in_flight
    stuck_op_count: int | None        # first collective not completed by every rank
    stuck_op: str | None
    stuck_at_ns: int | None           # last entry into it (the moment progress stopped)
    missing_ranks: list[int] = field(default_factory=list)   # never entered it
    waiting_ranks: list[int] = field(default_factory=list)   # entered it, never completed


def progress_of(analysis) -> list[Progress]:
    """:func:`progress` of the analysis's model, a memo (the timeline, the hang tables and
    the Markdown all read it; :func:`forensics.report.model_steps` makes it beside the detectors)."""
    return memo(analysis, "progress", lambda: progress(analysis.model))


def progress(model) -> list[Progress]:
    """Op counts per rank and the hang point of each communicator (the first collective that
    not every rank completed). Ranks are global ranks (``per_rank.comm_rank`` keeps the rank
    within the communicator); a rank of a sub-communicator that was never traced has no known
    process and keeps its comm rank in ``missing_ranks``."""
    n = model.tables["nccl_events"]
    if n.empty:
        return []
    c = model.tables.get("collectives")
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
        if c is not None and len(c):
            cc = c[c["comm_id_hash"] == comm]
            # the hang point: the first collective some rank never entered, or that every rank
            # entered and none completed; else the first not completed by every rank (a rank's
            # last call may simply have had no host wait after it, so that alone is weaker)
            missing = cc["missing_ranks"].map(lambda v: len(_as_list(v))) > 0
            none_done = (cc["ranks_completed"] == 0) & (cc["ranks_entered"] >= cc["nranks"])
            bad = cc[missing | none_done]
            if bad.empty:
                bad = cc[cc["ranks_completed"] < cc["nranks"]]
            if len(bad):
                row = bad.sort_values("op_count").iloc[0]
                p.stuck_op_count = int(row["op_count"])
                p.stuck_op = str(row["op"])
                p.stuck_at_ns = int(row["last_entry_ns"]) if pd.notna(row["last_entry_ns"]) else None
                p.missing_ranks = sorted(to_global.get(int(r), int(r)) for r in _as_list(row["missing_ranks"]))
                entered = g[g["op_count"] == p.stuck_op_count]
                p.waiting_ranks = sorted(int(r) for r in entered.loc[~entered["done"], "rank"].unique())
        out.append(p)
    return out


def _as_list(v) -> list:
    """A list cell of ``collectives`` (NULL when nranks is unknown) as a list."""
    return list(v) if isinstance(v, (list, tuple, np.ndarray)) else []


def ib_table(model) -> pd.DataFrame | None:
    ib = optional_table(model, "ib_counters")
    if ib is None:
        return None
    ib = ib.sort_values(["problem", "delta"], ascending=[False, False], kind="stable")
    return ib[["host", "device", "port", "counter", "start", "end", "delta", "problem", "meaning", "action"]]


def highlight_rows(df: pd.DataFrame, findings, kinds=("misconfiguration",)) -> list[bool]:
    """Rows to highlight in a table another module supplies: a truthy problem-like column,
    or a rank/host that a finding of ``kinds`` blames."""
    flag = np.zeros(len(df), dtype=bool)
    for col in ("problem", "problems", "misconfigured", "misconfiguration", "issue", "warning", "warnings",
                "severity"):
        if col in df.columns:
            v = df[col]
            if pd.api.types.is_bool_dtype(v):
                flag |= v.fillna(False).to_numpy(dtype=bool)
            else:
                flag |= v.notna().to_numpy() & ~v.astype(str).isin(["", "False", "false", "0", "ok", "none", "None",
                                                                    "info", "[]"]).to_numpy()
    blamed = [f for f in findings if f.kind in kinds]
    if blamed:
        if "rank" in df.columns:
            ranks = {r for f in blamed for r in f.ranks}
            flag |= pd.to_numeric(df["rank"], errors="coerce").isin(ranks).to_numpy()
        elif "host" in df.columns:
            hosts = {h for f in blamed for h in f.hosts}
            flag |= df["host"].astype(str).isin(hosts).to_numpy()
    return flag.tolist()


def capture_view(analysis) -> list[dict]:
    """Per bundle: time covered, collectors grouped by status, processes, problems."""
    out = []
    for c in analysis.model.captures:
        collectors = sorted(c.get("collectors", []), key=lambda k: ({"failed": 0, "skipped": 1}.get(k["status"], 2),
                                                                    k["name"]))
        # what each collector really covered (per-host captures start and stop apart)
        collectors = [{**k, "covered": " → ".join(utc(t) for t in k["covered_ns"]) if k.get("covered_ns") else None}
                      for k in collectors]
        counts = pd.Series([k["status"] for k in collectors], dtype="object").value_counts().to_dict()
        span = TimeSpan(c.get("started_ns"), c.get("ended_ns"))
        out.append({**c, "collectors": collectors, "status_counts": counts, "start_utc": utc(span.start_ns),
                    "end_utc": utc(span.end_ns), "seconds": span.seconds})
    return out


def skew_rows(analysis) -> list[dict]:
    return [{"host_a": s.host_a, "host_b": s.host_b,
             "skew_ms": None if s.skew_ns is None else s.skew_ns / 1e6,
             "one_way_delay_ms": None if s.one_way_delay_ns is None else s.one_way_delay_ns / 1e6,
             "matched_segments": s.matched_segments, "status": s.status} for s in analysis.model.skew]


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


def evidence_columns(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def finite(o):
    """NaN and infinities (not JSON) -> None, through dicts and lists."""
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o


@dataclass
class Field:
    """One line of the report's first screen: a label and its text."""

    label: str
    text: str


HANG_KINDS = ("hang_mismatch", "hang_host", "hang_stuck", "connection_reset")


def first_screen(analysis, f) -> list[Field]:
    """The fixed fields under the headline, for the most important finding ``f``: *Where*
    (ranks, their hosts, addresses or links, the capture nodes where they differ), *Since*
    (UTC, how long before the capture, from what, how precisely), *Stuck at* (hangs: the
    communicator, the collective, NCCL's opCount and PyTorch's SeqNum), *Evidence* (the
    sources the verdict rests on) and *Next* (the check to make, naming the host)."""
    out: list[Field] = []
    where = []
    if f.ranks:
        where.append(("rank " if len(f.ranks) == 1 else "ranks ") + ", ".join(map(str, f.ranks[:8]))
                     + (f" … ({len(f.ranks)})" if len(f.ranks) > 8 else ""))
    if f.hosts:
        where.append("on " + ", ".join(f.hosts[:6]) + (f" … ({len(f.hosts)} hosts)" if len(f.hosts) > 6 else ""))
    addrs = sorted({str(a) for lk in f.links for r, a in ((lk.get("rank"), lk.get("saddr")),
                                                         (lk.get("peer_rank"), lk.get("daddr")))
                    if a and r is not None and r in f.ranks})
    if addrs:
        where.append("address " + ", ".join(addrs[:3]))
    links = [lk for lk in f.links if lk.get("rank") is not None and lk.get("peer_rank") is not None][:3]
    if links:
        where.append("links " + ", ".join(f"{lk['rank']} ↔ {lk['peer_rank']}" for lk in links)
                     + (" …" if len(f.links) > 3 else ""))
    elif f.peer_ranks:
        waiting = f.kind in HANG_KINDS
        listed = ", ".join(map(str, f.peer_ranks[:8])) + (" …" if len(f.peer_ranks) > 8 else "")
        if waiting and not f.ranks:
            where.append(f"no rank named behind; ranks {listed} waiting")
        else:
            where.append(("waiting: ranks " if waiting else "peers ") + listed)
    if f.nodes:
        where.append("captured on " + ", ".join(f.nodes[:4]))
    if where:
        out.append(Field("Where", "; ".join(where)))
    out.append(Field("Since", since_field(analysis, f)))
    if f.kind in HANG_KINDS or f.op_count is not None or f.seq is not None:
        at = []
        comm = f.details.get("comm_id_hash") or f.details.get("comm") or f.details.get("pg_desc")
        if comm:
            at.append(f"communicator {comm}")
        op = f.details.get("op")
        if f.op_count is not None:
            at.append(f"{op + ' ' if op else ''}NCCL opCount {f.op_count}")
        if f.seq is not None:
            at.append(f"PyTorch SeqNum {f.seq}")
        if at:
            out.append(Field("Stuck at", ", ".join(at)))
    sources = f.details.get("sources") or f.since_source
    if sources:
        out.append(Field("Evidence", str(sources)))
    if f.action:
        out.append(Field("Next", f.action))
    return out


def since_field(analysis, f) -> str:
    """"09:55:53 UTC, 28.1 s before the capture (Flight Recorder, within 100 ms)"."""
    logs_only = analysis.model.logs_only
    if f.since_ns is None:
        return "not dated: the lines it rests on carry no time" if logs_only else \
            "not dated by this evidence (it began before the capture, or the evidence has no times)"
    from ..wording import ms
    from ..model.windows import capture_start_ns
    start = capture_start_ns(analysis.model)
    when = utc(f.since_ns)[:23] + " UTC"
    if any(YEAR_ASSUMED in n for n in analysis.model.notes):     # c10's prefix prints no year
        when = dt.datetime.fromtimestamp(f.since_ns / 1e9, tz=dt.timezone.utc).strftime("%b %d %H:%M:%S") \
            + " UTC (the logs print no year)"
    if logs_only and any(ZONE_ASSUMED in n for n in analysis.model.notes):   # the hosts' local time
        when = when.replace(" UTC", ", zone assumed UTC", 1)
    parts = []
    if start is not None and f.since_ns < start and f.kind in HANG_KINDS:
        parts.append(f"{ms(start - f.since_ns)} before the capture")
    how = f.since_source or "the evidence"
    if f.since_precision_ns:
        how += f", within {ms(f.since_precision_ns)}"
    return f"{when}" + (", " + ", ".join(parts) if parts else "") + f" ({how})"


_HOST_PREFIX = re.compile(r"^([A-Za-z0-9_.:-]+): (.+)$", re.S)
_TARGET = re.compile(r"(@[^\s:]+|:(?:start|end)\b)")
_PARENS = re.compile(r"\s*\([^()]*\)")
_PATHS = re.compile(r"(?<![\w.])/[^\s,;:)'\"]+")
_NUMBERS = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
_NAMED_PIDS = re.compile(r"@pid\d+|\bpid \d+")
REASON_CHARS = 140


def reason_key(text: str) -> str:
    """A failure's reason without what differs from host to host (paths, numbers, pids,
    parenthesised details, everything after the first ';'): what groups it with its likes."""
    t = _NAMED_PIDS.sub("@pid", text.split(";", 1)[0])
    while True:
        u = _PARENS.sub("", t)
        if u == t:
            break
        t = u
    t = _NUMBERS.sub("N", _PATHS.sub("…", t))
    t = " ".join(t.split())
    return t if len(t) <= REASON_CHARS else t[:REASON_CHARS - 1].rsplit(" ", 1)[0] + "…"


def grouped_problems(problems: list[str], hosts) -> list[str]:
    """``problems`` with the ones that differ only by the host they name made one line each:
    "pcap/host-eth0-000.pcap: no packets … (on 4 hosts: node0, node1, node2, node3)". Kept in
    first-seen order; a problem naming no known host stays as it is."""
    known = {str(h) for h in hosts}
    order: dict[str, list] = {}
    for p in problems:
        m = _HOST_PREFIX.match(p)
        rest, host = (m.group(2), m.group(1)) if m and m.group(1) in known else (p, None)
        g = order.setdefault(reason_key(rest) if host is not None else p, [rest, []])
        if host is not None and host not in g[1]:
            g[1].append(host)
    out = []
    for key, (first, on) in order.items():
        if len(on) > 1:
            out.append(f"{key} (on {len(on)} hosts: {', '.join(on[:4])}{' …' if len(on) > 4 else ''}; "
                       "each host's details in the capture section)")
        elif on:
            out.append(f"{on[0]}: {first}")
        else:
            out.append(first)
    return out


def capture_gaps(analysis) -> list[str]:
    """One line per kind of gap in the captures: the collectors that failed or were skipped,
    grouped by status and reason over every host ("skipped on 4 hosts: ibstat, ncclras (not
    found on PATH)"); the per-host details stay in the report's capture section."""
    groups: dict[tuple[str, str], dict] = {}
    for c in analysis.model.captures:
        for k in c.get("collectors", []) or []:
            if k.get("status") in (None, "ok"):
                continue
            base = _TARGET.sub("", str(k.get("name", "")))
            reason = reason_key(str(k.get("reason") or "no reason given").replace(base, "")) or "-"
            g = groups.setdefault((k["status"], reason), {"kinds": [], "hosts": []})
            if base not in g["kinds"]:
                g["kinds"].append(base)
            if c.get("host") not in g["hosts"]:
                g["hosts"].append(c.get("host"))
    n = len(analysis.model.captures)
    out = []
    for (status, reason), g in sorted(groups.items(), key=lambda kv: (kv[0][0] != "failed", kv[0][1])):
        where = "every host" if len(g["hosts"]) == n and n > 1 else ", ".join(str(h) for h in g["hosts"][:4]) \
            + (" …" if len(g["hosts"]) > 4 else "")
        out.append(f"{status} on {where}: {', '.join(sorted(g['kinds']))} ({reason})")
    skew = skew_rows(analysis)
    if skew and all(s["skew_ms"] is None for s in skew):
        why = sorted({str(s["status"]) for s in skew})
        out.append(f"clock skew between hosts not measured ({'; '.join(why)})")
    return out


def common_window_s(analysis) -> float | None:
    """Seconds every host's capture watched together (the latest start to the earliest end
    of the hosts' windows): what the state-at-capture verdicts judge silence over; 0 when
    they never overlapped, None with one host or no windows."""
    from ..model.windows import host_windows
    w = host_windows(analysis.model.tables.get("capture_windows"))
    if len(w) < 2:
        return None
    return max(0.0, (min(b for _, b in w.values()) - max(a for a, _ in w.values())) / 1e9)


def span_text(analysis) -> str:
    """"09:01:43 → 09:02:42 UTC (59.0 s; every host at once: 10.5 s)": the captures' span, and
    the window they shared where it is shorter (per-host captures start and stop apart)."""
    span = time_span(analysis)
    if span.start_ns is None:
        return "-"
    out = f"{utc(span.start_ns)[:19]} → {utc(span.end_ns)[11:19]} UTC"
    parts = [f"{span.seconds:.1f} s"] if span.seconds is not None else []
    both = common_window_s(analysis)
    if both is not None and span.seconds is not None and span.seconds - both > 1.0:
        parts.append(f"every host at once: {both:.1f} s" if both > 0 else "the hosts' captures never overlapped")
    return out + (f" ({'; '.join(parts)})" if parts else "")


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


def calls_text(analysis) -> str:
    """"363 NCCL calls traced", or where the tracer saw none, what the verdicts rest on
    instead ("no NCCL call traced; positions from NCCL_DEBUG COLL lines, Flight Recorder")."""
    n = len(analysis.model.tables["nccl_events"])
    if n:
        return f"{n} NCCL calls traced"
    have = [label for name, label in (("coll_log_ops", "NCCL_DEBUG COLL lines"), ("fr_pg_status", "Flight Recorder"),
                                      ("watchdog_events", "PyTorch watchdog lines"), ("stacks", "stacks"))
            if len(analysis.model.tables.get(name, ())) > 0]
    return "no NCCL call traced" + (f"; positions from {', '.join(have)}" if have else "")


_COLLECTOR_PROBLEM = re.compile(r"^(?:[A-Za-z0-9_.:-]+: )?collector \S+ (?:failed|skipped)\b")


def gap_lines(analysis) -> list[str]:
    """The capture's gaps (:func:`capture_gaps`), then the problems met, grouped over hosts
    (:func:`grouped_problems`) less the collector failures the gaps already say."""
    rest = [p for p in analysis.problems if not _COLLECTOR_PROBLEM.match(p)]
    return capture_gaps(analysis) + grouped_problems(rest, analysis.model.hosts)


DEFAULT_STORE_PORT = 29500     # torch.distributed's default MASTER_PORT (TCPStore)


def store_ports(model) -> set[int]:
    """The rendezvous store's ports: every rank process's MASTER_PORT, else torch's default
    when the processes known hold ranks but name no port."""
    ports, ranked = set(), False
    for c in model.captures:
        for p in c.get("processes", []) or []:
            ranked |= p.get("rank") is not None
            if p.get("master_port"):
                try:
                    ports.add(int(p["master_port"]))
                except (TypeError, ValueError):
                    pass
    return ports or ({DEFAULT_STORE_PORT} if ranked else set())


def store_traffic(model, tcp: pd.DataFrame) -> pd.Series:
    """Which of ``tcp``'s events (tcp_events rows) are on a rendezvous store connection."""
    ports = store_ports(model)
    if not ports or tcp.empty:
        return pd.Series(False, index=tcp.index)
    sport = pd.to_numeric(tcp["sport"], errors="coerce")
    dport = pd.to_numeric(tcp["dport"], errors="coerce")
    return (sport.isin(ports) | dport.isin(ports)).fillna(False)
