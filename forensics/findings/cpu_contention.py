"""Whose host kept its threads waiting for a CPU: the run-queue delay the capture sampled.

The capture samples each traced thread's schedstat every ~2 s (``offcpu``: time on a CPU,
time runnable but waiting for one, time asleep, the thread's state). A rank whose threads
waited in the run queue far longer than its peers' was starved of CPU on its host (a
cgroup's quota, a noisy neighbour, too few cores for its loaders): it enqueues its
collectives late (``straggler``), and it answers its peers' packets late too, because the
kernel ACKs a segment that arrives while the process holds its socket only once it lets go
(its TCP backlog). So its links' ACK round-trip rises and its peers' retransmission timers
fire early: a network finding on such a rank's links may be its host's doing, not the
link's. Off-CPU time alone says nothing here (waiting inside a collective is off-CPU too);
the uninterruptible sleep (``D``) count marks a thread blocked on I/O.

:func:`cpu_wait` is the one reading: per rank, what its threads spent in the sampling
intervals that end in a time range, and whether one rank stands out; :func:`starved_ends` asks
it of the ends of the links a network finding blames. No detector of its own: ``straggler`` and
``network`` (network_loss, slow_link) read it.
"""
from __future__ import annotations

import pandas as pd

from ..wording import ms

RUNQ_FACTOR = 2.0          # its threads waited for a CPU at least this many times its peers' median ...
RUNQ_MIN_NS = 50_000_000   # ... and at least this long: a turn or two of a busy CPU is no starvation


def cpu_wait(ctx, rank: int, t_from: int | None = None, t_to: int | None = None) -> dict:
    """What the ``offcpu`` samples taken in [t_from, t_to] (either end open when None) say of
    ``rank``'s host against its peers'. Returns {} without samples of any rank; else
    ``per_rank`` (str(rank) -> offcpu_ns, runq_ns, oncpu_ns, samples, d_state) and, when the
    rank and a peer were sampled, ``text`` (why it stands out, "" when it does not),
    ``supports`` (it stands out: run-queue delay, else D state) and ``contended`` (its
    threads waited for a CPU at least RUNQ_FACTOR times its peers' median and RUNQ_MIN_NS),
    ``runq_ns`` and ``peers_runq_ns``."""
    agg = _per_rank(ctx, t_from, t_to)
    if agg is None:
        return {}
    return _judge(agg, rank) if len(agg) else {"per_rank": {}, "text": ""}


def _per_rank(ctx, t_from: int | None, t_to: int | None) -> pd.DataFrame | None:
    """The ``offcpu`` samples in [t_from, t_to] summed per rank (offcpu_ns, runq_ns, oncpu_ns,
    samples, d_state), computed once per range and analysis (the network findings ask it of
    the whole capture, each for its links' ends): None without samples of any rank, no rows
    when none fall in the range."""
    return ctx.memo(f"cpu_per_rank:{t_from}:{t_to}", lambda: _sum_per_rank(ctx, t_from, t_to))


def _sum_per_rank(ctx, t_from: int | None, t_to: int | None) -> pd.DataFrame | None:
    o = ctx.table("offcpu") if "offcpu" in ctx.model.tables else pd.DataFrame()
    if o.empty or o["rank"].isna().all():
        return None
    o = o.dropna(subset=["rank", "timestamp_ns"])
    if t_from is not None:
        o = o[o["timestamp_ns"] >= t_from]
    if t_to is not None:
        o = o[o["timestamp_ns"] <= t_to]
    return o.groupby("rank").agg(offcpu_ns=("offcpu_delta_ns", "sum"), runq_ns=("runq_delta_ns", "sum"),
                                 oncpu_ns=("oncpu_delta_ns", "sum"), samples=("timestamp_ns", "size"),
                                 d_state=("state", lambda s: int((s == "D").sum())))


def _judge(agg: pd.DataFrame, rank: int) -> dict:
    """:func:`cpu_wait`'s answer for ``rank`` from the per-rank sums (:func:`_per_rank`)."""
    per_rank = {str(int(k)): {c: (int(v) if pd.notna(v) else None) for c, v in row.items()}
                for k, row in agg.iterrows()}
    if rank not in agg.index or len(agg) < 2:
        return {"per_rank": per_rank}
    me, peers = agg.loc[rank], agg.drop(index=rank)
    runq_peer = float(peers["runq_ns"].median())
    contended = bool(me["runq_ns"] >= max(RUNQ_FACTOR * runq_peer, RUNQ_MIN_NS))
    text, supports = "", False
    if contended:
        text = (f"its threads waited {ms(me['runq_ns'])} for a CPU (run queue) vs {ms(runq_peer)} on peers: "
                "CPU contention on its host")
        supports = True
    elif me["d_state"] > peers["d_state"].max():
        text = f"its threads were sampled in uninterruptible sleep (D) {int(me['d_state'])} times: blocked on I/O"
        supports = True
    return {"per_rank": per_rank, "text": text, "supports": supports, "contended": contended,
            "runq_ns": float(me["runq_ns"]), "peers_runq_ns": runq_peer}


def starved_ends(ctx, links) -> tuple[str, dict]:
    """When every one of ``links`` ((rank, rank) pairs) has an end whose host was starved of
    CPU over the whole capture (:func:`cpu_wait` ``contended``): the clause a network finding
    on those links adds ("but the host of rank 2 was starved of CPU ...") and its details
    (str(rank) -> runq_ns, peers_runq_ns of each starved end); ("", {}) otherwise. One starved
    end explains a link's late ACKs. The samples are summed once for all the ends."""
    links = [(int(a), int(b)) for a, b in links]
    agg = _per_rank(ctx, None, None) if links else None
    if agg is None or not len(agg):
        return "", {}
    waits = {r: _judge(agg, r) for r in sorted({r for lk in links for r in lk})}
    starved = {r: w for r, w in waits.items() if w.get("contended")}
    if not all(set(lk) & set(starved) for lk in links):
        return "", {}
    who = " and ".join(f"rank {r}" for r in starved)
    runq = ", ".join(ms(w["runq_ns"]) for w in starved.values())
    peers = max(w["peers_runq_ns"] for w in starved.values())
    text = (f"but the host of {who} was starved of CPU (its threads waited {runq} for a CPU vs {ms(peers)} on "
            "peers): a starved host ACKs late, so its peers' timers fire and the ACK round-trip grows "
            "without the link being at fault")
    return text, {str(r): {"runq_ns": w["runq_ns"], "peers_runq_ns": w["peers_runq_ns"]} for r, w in starved.items()}
