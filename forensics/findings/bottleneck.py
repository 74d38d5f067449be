"""What a slow link's *rate* costs each collective that crosses it, when no fast collective is
left to compare with.

A capture that started after a link slowed down (one per host, started apart: the common
window of their tracers) holds only collectives that all paid the slow link, so their spread
is small and the fastest decile is no clean baseline: :func:`forensics.findings.impact.impact`
then finds nothing slow, and the queueing delay alone (its RTT above the other links', per
round trip) is a poor lower bound on a link that is slow because of its *rate*: every byte a
collective moves over it takes longer, not just one round trip.

:func:`transfer_excess` is that lower bound from the packets: a ring collective of ``n`` ranks
moves at least ``(n-1)/n`` of its bytes over each of its links (an all-reduce twice that), so
over the slow link it takes at least ``bits / slow_rate`` where the other links carry the same
in ``bits / fast_rate``; the difference, never more than the collective's own duration, is
time the collective spent waiting for that link. The rates are what the links' bulk data
connections delivered while busy (``flow_timing.busy_rate_bps``, the medians): the slow
link's plateau at the bottleneck's pace against the others'.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..model.progress import is_per_process

MIN_RATE_RATIO = 2.0    # the slow link's rate at most half the others': a bottleneck of rate


def link_rates(ctx, slow_links, bulk_share: float) -> tuple[float, float] | None:
    """(slow rate, fast rate) in bit/s: the median busy rate of the bulk data connections on
    ``slow_links`` (pairs (low rank, high rank)) and on the other links; a connection is bulk
    when it carried ``bulk_share`` of the busiest connections' bytes. None when either is missing."""
    t = ctx.model.tables.get("flow_timing")
    if t is None or t.empty or "busy_rate_bps" not in t.columns:
        return None
    t = t.dropna(subset=["rank", "peer_rank", "busy_rate_bps"])
    if t.empty:
        return None
    vol = pd.to_numeric(t["data_bytes"], errors="coerce").fillna(0)
    bulk = (vol >= bulk_share * float(vol.quantile(0.9))).to_numpy()
    key = set(slow_links)
    on = np.array([(min(int(r), int(p)), max(int(r), int(p))) in key for r, p in zip(t["rank"], t["peer_rank"])],
                  dtype=bool)
    rate = pd.to_numeric(t["busy_rate_bps"], errors="coerce").to_numpy(dtype=np.float64)
    slow, fast = rate[on & bulk], rate[~on & bulk]
    slow, fast = slow[slow > 0], fast[fast > 0]
    if not len(slow) or not len(fast):
        return None
    return float(np.median(slow)), float(np.median(fast))


def transfer_excess(ctx, done: pd.DataFrame, slow_links, bulk_share: float) -> np.ndarray | None:
    """Per completed collective of ``done`` (rows of :func:`~.collectives.collective_windows`), the
    least time in ns it waited for the slow link's rate (module docstring): 0 for a collective
    of a communicator without both ends of a slow link, or without a byte count. None when the
    rates show no bottleneck of rate (the slow links deliver more than 1/MIN_RATE_RATIO of the
    others' rate, or a rate is unknown)."""
    rates = link_rates(ctx, slow_links, bulk_share)
    if rates is None or rates[0] * MIN_RATE_RATIO > rates[1]:
        return None
    slow_bps, fast_bps = rates
    members = _members(ctx)
    crosses = np.array([any(a in members.get(c, set()) and b in members.get(c, set()) for a, b in slow_links)
                        for c in done["comm_id_hash"].astype(object)], dtype=bool)
    n = pd.to_numeric(done["nranks"], errors="coerce").to_numpy(dtype=np.float64)
    nbytes = pd.to_numeric(done["bytes"], errors="coerce").to_numpy(dtype=np.float64)
    factor = np.where(done["op"].astype(str).str.upper().str.replace("_", "").to_numpy() == "ALLREDUCE", 2.0, 1.0)
    bits = np.nan_to_num(nbytes * 8 * factor * (n - 1) / np.where(n > 0, n, np.nan), nan=0.0)
    excess = bits / slow_bps * 1e9 - bits / fast_bps * 1e9
    dur = pd.to_numeric(done["duration_ns"], errors="coerce").to_numpy(dtype=np.float64)
    return np.where(crosses & (n >= 2), np.clip(np.minimum(excess, np.nan_to_num(dur, nan=0.0)), 0, None), 0.0)


def _members(ctx) -> dict:
    """Communicator -> the ranks its collectives name (the ``collectives`` table's ``ranks``).
    A communicator the tracer saw only from one process (created before it attached: keyed
    ``host:pid:comm``, one rank's calls) whose size is the job's largest is the world's: its
    members are every rank the table names, not just the process's own."""
    c = ctx.table("collectives")
    out: dict = {}
    if c.empty or "ranks" not in c.columns:
        return out
    for comm, ranks in zip(c["comm_id_hash"].astype(object), c["ranks"]):
        if ranks is None or (not hasattr(ranks, "__len__")):
            continue
        out.setdefault(comm, set()).update(int(r) for r in ranks if pd.notna(r))
    n = pd.to_numeric(c["nranks"], errors="coerce")
    world = set().union(*out.values()) if out else set()
    if n.notna().any() and len(world) >= 2:
        whole = c.loc[(is_per_process(c["comm_id_hash"]) & (n >= n.max())).to_numpy(bool), "comm_id_hash"]
        for comm in whole.astype(object).unique():
            out[comm] = set(world)
    return out


__all__ = ["MIN_RATE_RATIO", "link_rates", "transfer_excess"]
