"""``straggler``: one rank enters collectives late, again and again, while the network is clean.

Per collective that every rank entered, each rank's *margin* is its entry time minus the
latest entry among the other ranks: positive only for the rank that came last, and then
by how much it held everyone else up. The jitter of a healthy job is the spread of the
other ranks' entries (second-latest minus earliest); a rank is late in a collective when
its margin is well above that jitter. A straggler is late in many collectives (at least
``MIN_LATE`` and ``MIN_LATE_FRACTION`` of them: one slow collective is an anecdote), far
more often than any other rank (ranks late in turn are noise), and its lateness is a real
share of what its peers spent in those collectives (they waited for it, not for the
network).

Impact: the peers' collectives absorb the wait (their durations grow while the
straggler's stay short). Off-CPU evidence, when the capture sampled the threads'
schedstat (``offcpu`` table): the straggler's run-queue delay (CPU contention) and
off-CPU time against its peers'.

Limit: two ranks late by the same amount hide each other (each one's margin is measured
against the other); the peers' long waits then show in the collectives' durations only.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .base import Context, Finding, detector, impact_severity
from ..tcp.classes import LOSS_CLASSES
from ..wording import ms
from .collectives import ALL_WATCHED_ENTERED_SQL, all_watched_entered, collective_windows, in_windows
from .cpu_contention import cpu_wait
from .impact import clean_baselines, impact
from .ranks import label, rank_directory, world_rank_map
from .sql import sql_int, sql_str
from .trouble import dedup_counts, trouble_events

MIN_LATE = 3
MIN_LATE_FRACTION = 0.10
JITTER_FACTOR = 5.0
# a rank late by less than this waited a turn for a CPU, no more: CFS lets a runnable thread wait
# a scheduling period on a busy CPU (sched_latency: 6 ms x (1 + log2 CPUs), 12 ms on 2 CPUs).
# At 2 ms, CI saw a clean 3-rank job under load with one rank 2-3 ms late in a third of its
# collectives: a ring's fixed completion order made it last, and load stretched the lag
MIN_MARGIN_NS = 10_000_000
DOMINANCE = 2.0                  # late at least twice as often as any other rank
IMPACT_SHARE = 0.25              # its lateness is at least this share of its peers' time in those collectives
OFFCPU_SLACK_NS = 10_000_000_000  # capture samples schedstat every ~2 s: take the interval that covers the end
MAX_EVIDENCE = 20


def _second_max(v: np.ndarray) -> np.ndarray:
    """For each element: the largest of the *other* elements (0 when alone)."""
    if len(v) < 2:
        return np.zeros(len(v))
    order = np.sort(v)
    top, second = order[-1], order[-2]
    return np.where(v == top, second, top)


def entry_margins(ctx) -> pd.DataFrame:
    """One row per (communicator, op_count, rank) of collectives every watched rank entered
    (:func:`.collectives.all_watched_entered`):
    entry_ns, margin_ns (entry minus the latest other entry), spread_ns (the others'
    spread: second-latest minus earliest entry of the collective)."""
    c = ctx.table("collectives")
    if c.empty:
        return pd.DataFrame(columns=["comm_id_hash", "op_count", "op", "rank", "entry_ns", "margin_ns", "spread_ns"])
    full = c[all_watched_entered(c) & (c["ranks_entered"] >= 2)]
    if full.empty:
        return pd.DataFrame(columns=["comm_id_hash", "op_count", "op", "rank", "entry_ns", "margin_ns", "spread_ns"])
    e = full[["comm_id_hash", "op_count", "op", "ranks", "entry_ns"]].explode(["ranks", "entry_ns"])
    e = e.rename(columns={"ranks": "rank"}).dropna(subset=["rank", "entry_ns"])
    e["rank"] = e["rank"].astype("int64")
    e["entry_ns"] = e["entry_ns"].astype("int64")
    keys = ["comm_id_hash", "op_count"]
    e = e[e.groupby(keys)["entry_ns"].transform("size") >= 2]
    # integers throughout: epoch nanoseconds do not survive a float64 (steps of 256 ns),
    # and the evidence rows must equal what the finding's SQL computes
    e = e.sort_values(keys + ["entry_ns"], kind="stable").reset_index(drop=True)
    from_end = e.groupby(keys).cumcount(ascending=False)   # 0: the latest entry, 1: the second-latest
    g = e.groupby(keys)["entry_ns"]
    latest = g.transform("last").to_numpy(dtype=np.int64)
    second = e["entry_ns"].where(from_end == 1, 0).groupby([e[k] for k in keys]).transform("max") \
        .to_numpy(dtype=np.int64)
    others_latest = np.where(from_end.to_numpy() == 0, second, latest)
    e["margin_ns"] = e["entry_ns"].to_numpy(dtype=np.int64) - others_latest
    e["spread_ns"] = second - g.transform("first").to_numpy(dtype=np.int64)
    return e


@detector("straggler", kinds=("straggler",))
def straggler(ctx: Context) -> list[Finding]:
    e = entry_margins(ctx)
    if e.empty:
        return []
    # the others' spread needs two others: a collective seen on two ranks (captures per host
    # apart, the rest unwatched) has none
    three = e.groupby(["comm_id_hash", "op_count"])["rank"].transform("size") >= 3
    spreads = e[three].drop_duplicates(["comm_id_hash", "op_count"])["spread_ns"].to_numpy(dtype=np.float64)
    jitter = float(np.median(spreads)) if len(spreads) else float("nan")
    thr = max(MIN_MARGIN_NS, JITTER_FACTOR * jitter) if not np.isnan(jitter) else MIN_MARGIN_NS
    n_coll = e.drop_duplicates(["comm_id_hash", "op_count"]).shape[0]
    late = e[e["margin_ns"] > thr]
    if late.empty:
        return []
    need = max(MIN_LATE, int(np.ceil(MIN_LATE_FRACTION * n_coll)))
    per_rank = late.groupby(["comm_id_hash", "rank"]).agg(n=("margin_ns", "size"), p50=("margin_ns", "median"),
                                                           p90=("margin_ns", lambda s: s.quantile(0.9)),
                                                           total=("margin_ns", "sum")).reset_index()
    # dominance: a straggler is late far more often than any other rank (ranks late in turn are noise)
    others_max = per_rank.groupby("comm_id_hash")["n"].transform(lambda s: _second_max(s.to_numpy()))
    per_rank = per_rank[(per_rank["n"] >= need) & (per_rank["n"] >= DOMINANCE * others_max)]
    if per_rank.empty:
        return []
    gmap = world_rank_map(ctx)
    directory = rank_directory(ctx)
    ev = trouble_events(ctx)
    loss = ev[ev["cls"].isin(LOSS_CLASSES)]
    windows = collective_windows(ctx)
    windows = windows[windows["complete"]].reset_index(drop=True)
    found = []
    for r in per_rank.sort_values("total", ascending=False).itertuples(index=False):
        if not _peers_waited(ctx, late, r):
            continue
        found.append(_finding(ctx, e, late, r, thr, jitter, n_coll, gmap, directory, loss, windows))
    return found


def _late_impact(windows: pd.DataFrame, late: pd.DataFrame, mine: pd.DataFrame):
    """What the straggler cost: its late collectives' excess over the clean ones of their
    op/size class, as a share of the job's collective time. A collective's window runs from
    the first entry to the last end: it holds the wait. The straggler explains no more of a
    collective's excess than its margin (how long the others waited for it): a collective
    slowed by something else as well (load that also made the rank late, the network) is not
    all its doing.

    Clean: every rank of the communicator entered it and none was late. A collective some
    rank's capture did not see (captures per host that start and stop apart) is not known to
    be clean: the unseen rank may be the late one, and the window of the ranks that waited
    for it holds the wait. With no clean collective at all (the rank was late in every
    collective the captures saw: it straggled before they began), the baseline is what each
    of its late collectives would have taken had it come in time, its window less the wait
    (:func:`.impact.clean_baselines` of those), so the impact is the wait itself."""
    key = pd.MultiIndex.from_frame(windows[["comm_id_hash", "op_count"]].astype(str))
    mkey = pd.MultiIndex.from_frame(mine[["comm_id_hash", "op_count"]].astype(str))
    slow = key.isin(mkey)
    anyone = key.isin(pd.MultiIndex.from_frame(late[["comm_id_hash", "op_count"]].astype(str)))
    seen = (pd.to_numeric(windows["ranks_entered"], errors="coerce")
            >= pd.to_numeric(windows["nranks"], errors="coerce")).fillna(False).to_numpy(dtype=bool)
    clean = seen & ~anyone
    margin = pd.Series(mine["margin_ns"].to_numpy(dtype=np.float64), index=mkey)
    margin = margin[~margin.index.duplicated()]
    cap = margin.reindex(key).to_numpy(dtype=np.float64)
    if clean.any() or not slow.any():
        return impact(windows, slow, clean, cap_ns=cap)
    dur = pd.to_numeric(windows["duration_ns"], errors="coerce").astype("float64").to_numpy()
    in_time = windows.assign(duration_ns=np.where(slow, dur - np.nan_to_num(cap, nan=0.0), dur))
    return impact(windows, slow, clean, cap_ns=cap, base_ns=clean_baselines(in_time, slow))


def _peers_waited(ctx, late: pd.DataFrame, r) -> bool:
    """Impact rule: in the collectives the rank was late for, its lateness is a real part of
    what its peers spent in them (a 5 ms late entry into a 600 ms collective slowed by
    retransmissions is noise, not a straggler). Without completed durations, no veto."""
    mine = late[(late["comm_id_hash"] == r.comm_id_hash) & (late["rank"] == r.rank)]
    n = ctx.table("nccl_events")
    n = n[(n["comm_id_hash"] == r.comm_id_hash) & n["op_count"].isin(mine["op_count"]) & (n["rank"] != r.rank)
          & n["completed"].fillna(False).astype(bool) & n["duration_ns"].notna()]
    if n.empty:
        return True
    return float(r.p50) >= IMPACT_SHARE * float(n["duration_ns"].astype("float64").median())


def _finding(ctx, e, late, r, thr, jitter, n_coll, gmap, directory, loss, windows) -> Finding:
    comm, crank = r.comm_id_hash, int(r.rank)
    g = gmap[(gmap["comm_id_hash"] == comm) & (gmap["rank"] == crank)]["global_rank"]
    rank = int(g.iat[0]) if len(g) and pd.notna(g.iat[0]) else crank
    mine = late[(late["comm_id_hash"] == comm) & (late["rank"] == crank)].sort_values("op_count")
    n_comm = int(e[e["comm_id_hash"] == comm].drop_duplicates("op_count").shape[0])
    # impact: completed durations on the straggler vs its peers, in the collectives it was late for
    n = ctx.table("nccl_events")
    n = n[(n["comm_id_hash"] == comm) & n["completed"].fillna(False).astype(bool) & n["duration_ns"].notna()]
    hit = n[n["op_count"].isin(mine["op_count"])]
    d_me = hit.loc[hit["rank"] == crank, "duration_ns"].astype("float64")
    d_peers = hit.loc[hit["rank"] != crank, "duration_ns"].astype("float64")
    op = mine["op"].mode().iat[0] if len(mine["op"].dropna()) else "collective"
    # the network during those collectives: TCP trouble on the straggler's links
    t0 = mine["entry_ns"].to_numpy(dtype=np.int64) - mine["margin_ns"].to_numpy(dtype=np.int64)
    t1 = mine["entry_ns"].to_numpy(dtype=np.int64)
    mloss = loss[(loss["a"] == rank) | (loss["b"] == rank)]
    n_loss = int(dedup_counts(mloss[in_windows(mloss["timestamp_ns"].to_numpy(), t0, t1)])["n"].sum()) \
        if len(mloss) else 0
    off = _offcpu(ctx, rank, int(mine["entry_ns"].min()), int(mine["entry_ns"].max()))
    peers_txt = ""
    if len(d_me) and len(d_peers):
        peers_txt = (f"; in those collectives its peers waited ({op} p99 {ms(d_peers.quantile(0.99))} vs "
                     f"{ms(d_me.quantile(0.99))} on {label(directory, rank).split(' (')[0]})")
    net_txt = "; the network was clean on its links meanwhile" if n_loss < 3 else \
        f"; {n_loss} TCP retransmissions on its links meanwhile (see the network findings)"
    off_txt = f"; {off['text']}" if off.get("text") else ""
    imp = _late_impact(windows, late, mine)
    summary = (f"{label(directory, rank)} entered {int(r.n)} of {n_comm} collectives last, "
               f"{ms(r.p50)} (p50; p90 {ms(r.p90)}) after the latest of its peers{_spread_text(jitter)}"
               f"{peers_txt}{net_txt}{off_txt}; it explains {imp.text()}.")
    evidence = [{"comm_id_hash": comm, "op_count": int(x.op_count), "op": x.op, "rank": rank,
                 "late_ms": round(float(x.margin_ns) / 1e6, 3), "entry_ns": int(x.entry_ns)}
                for x in mine.sort_values(["margin_ns", "op_count"], ascending=[False, True], kind="stable")
                .head(MAX_EVIDENCE).itertuples(index=False)]
    # the rows above: its comm rank's late entries, named by its global rank
    sql = f"""WITH e AS (
  SELECT comm_id_hash, op_count, op, unnest(ranks) AS rank, unnest(entry_ns) AS entry_ns
  FROM collectives WHERE {ALL_WATCHED_ENTERED_SQL} AND ranks_entered >= 2
    AND comm_id_hash = {sql_str(comm)}
), o AS (
  SELECT comm_id_hash, op_count, max(entry_ns) AS others_latest FROM e WHERE rank <> {sql_int(crank)} GROUP BY ALL
)
SELECT e.comm_id_hash, e.op_count, e.op, {sql_int(rank)} AS rank,
       round((e.entry_ns - o.others_latest) / 1e6, 3) AS late_ms, e.entry_ns
FROM e JOIN o USING (comm_id_hash, op_count)
WHERE e.rank = {sql_int(crank)} AND e.entry_ns - o.others_latest > {sql_int(thr)}
ORDER BY e.entry_ns - o.others_latest DESC, e.op_count LIMIT {sql_int(MAX_EVIDENCE)}"""
    frac = int(r.n) / max(n_comm, 1)
    confidence = min(0.95, 0.55 + 0.4 * frac + (0.05 if off.get("supports") else 0.0)) * (0.7 if n_loss >= 3 else 1)
    per_rank = {}
    for rk, d in n[n["op_count"].isin(mine["op_count"])].groupby("rank")["duration_ns"]:
        v = d.astype("float64")
        per_rank[str(int(rk))] = {"n": int(len(v)), "p50_ns": float(v.median()), "p99_ns": float(v.quantile(0.99))}
    return Finding(
        kind="straggler", severity=impact_severity(imp.share, imp.slow), confidence=confidence, summary=summary,
        headline=f"Straggler: {{who}} enters {int(r.n)} collectives late; it explains {imp.text()}",
        since_ns=int(mine["entry_ns"].min()), since_source="tracer: its first late entry",
        since_precision_ns=1_000_000,
        ranks=[rank], impact_share=imp.share,
        hosts=[directory[rank].host] if rank in directory and directory[rank].host else [],
        evidence=evidence, sql=sql, score=float(r.total) / 1e9,
        layer="host", chain=_chain(label(directory, rank), r, n_comm, jitter, n_loss, off),
        action=(f"Look at what rank {rank} does between collectives: data loading, CPU contention (run-queue "
                "delay), GC or checkpointing, a throttled GPU (nvidia-smi -q clocks/throttle reasons); "
                "py-spy dump its main thread while it is late."),
        details={"late_collectives": int(r.n), "collectives": n_comm, "late_threshold_ns": thr,
                 "jitter_ns": None if np.isnan(jitter) else jitter, "late_p50_ns": float(r.p50),
                 "late_p90_ns": float(r.p90),
                 "late_total_ns": float(r.total), "tcp_trouble_on_its_links": n_loss,
                 "durations_in_late_collectives": per_rank, "offcpu": off.get("per_rank", {}),
                 "excess_ns": imp.excess_ns, "collective_time_ns": imp.total_ns})


def _spread_text(jitter: float) -> str:
    """", whose entries are 0.12 ms apart"; nothing when no collective had two other ranks watched."""
    return "" if np.isnan(jitter) else f", whose entries are {ms(jitter)} apart"


def _chain(who: str, r, n_comm: int, jitter: float, n_loss: int, off: dict) -> list[str]:
    """The straggler's evidence in order (Finding.chain): the late entries, the network on its
    links, the host's CPU where the capture sampled it; its layer is the host (it enqueued late)."""
    return [f"{who} entered {int(r.n)} of {n_comm} collectives last, {ms(r.p50)} (p50) after its peers"
            f"{_spread_text(jitter)}: the collective was enqueued late on its host",
            "its links were clean meanwhile: not the transport" if n_loss < 3 else
            f"{n_loss} TCP retransmissions on its links meanwhile: the network may share the blame",
            (off["text"] if off.get("supports") else
             (off["text"] + " (not more than its peers': the host's CPU does not explain it)") if off.get("text") else
             "no CPU samples of its threads: what held its host (compute, data loading, GC, a busy CPU) is "
             "not in the evidence")]


def _offcpu(ctx, rank: int, t_from: int, t_to: int) -> dict:
    """Per rank: off-CPU and run-queue growth of its threads in the sampling intervals that
    end while it straggled (t_from .. t_to + OFFCPU_SLACK_NS), and whether the straggler's
    stand out (:func:`.cpu_contention.cpu_wait`)."""
    return cpu_wait(ctx, rank, t_from, t_to + OFFCPU_SLACK_NS)
