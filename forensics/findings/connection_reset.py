"""``connection_reset``: a TCP connection between ranks torn down under NCCL.

Every finding of this kind comes from this module, whichever evidence saw the reset:

- the packets (:func:`connection_reset`): a reset between two ranks while collectives were
  in flight, before the job had stalled; forged when the sender's kernel never logged
  sending it;
- what the packets did not see (:func:`reset_state`: a capture that started after the reset,
  or none at all): the state at capture (a reset on a hung communicator's ring,
  :mod:`.state`), then NCCL's WARN lines, by address (:func:`.socket_errors.logged_resets`)
  or as socket errors (:func:`.socket_errors.socket_failures`).

Which of those judges when several saw the reset is the declared precedence of
:mod:`forensics.findings.precedence`: the packets first; behind a hang the tracer saw, the reset is
named by that hang's ``hang_stuck`` finding, as its cause, and the later sources stay silent.
"""
from __future__ import annotations

import numpy as np

from ..coerce import cell_int
from .base import Context, Finding, detector
from ..tcp.classes import LOSS_CLASSES
from ..wording import ms
from .collectives import collective_windows, in_windows
from .ranks import hosts_of, rank_directory
from .trouble import dedup_counts, kernel_logged_reset, trouble_events, trouble_rows, trouble_rows_sql
from .precedence import PACKETS, SOCKET_ERRORS, STATE_RESETS, WARN_RESETS, consult, sees
from .sql import sql_int

KINDS = ("connection_reset",)
MAX_EVIDENCE = 20
# the sources reset_state consults, in this order (each under its precedence)
LATE_SOURCES = (STATE_RESETS, WARN_RESETS, SOCKET_ERRORS)

STALL_MIN_NS = 500_000_000     # a reset this long after the last progress comes from a teardown or a kill
STALL_FACTOR = 5.0             # ... or this many times the p99 collective duration, if larger


@detector("connection_reset", kinds=KINDS)
def connection_reset(ctx: Context) -> list[Finding]:
    """A TCP reset between two ranks while collectives were in flight, before the job had
    stalled: the connection NCCL used was torn down under it. Resets at start-up (no
    collective in flight: the rendezvous store's probes), after the last collective, or
    long after the job stopped progressing (the processes being killed) are left out."""
    ev = trouble_events(ctx)
    rst = ev[ev["cls"] == "reset"]
    w = collective_windows(ctx)
    if rst.empty or w.empty:
        return []
    t = rst["timestamp_ns"].to_numpy(dtype=np.int64)
    t0 = w["t0"].to_numpy(dtype=np.int64)
    t1 = w["t1"].fillna(np.iinfo(np.int64).max).to_numpy(dtype=np.int64)
    in_flight = in_windows(t, t0, t1)
    done_end = np.sort(w.loc[w["complete"], "t1"].to_numpy(dtype=np.int64))
    i = np.searchsorted(done_end, t, side="right") - 1
    first = t0.min() if len(t0) else 0
    # nothing completed at all (no returns traced: the watcher; a job hung before the capture)
    last_progress = np.where(i >= 0, done_end[np.maximum(i, 0)], first) if len(done_end) else np.full(len(t), first)
    dur = w.loc[w["complete"], "duration_ns"].to_numpy(dtype=np.float64)
    stall = max(STALL_MIN_NS, STALL_FACTOR * float(np.quantile(dur, 0.99))) if len(dur) else STALL_MIN_NS
    # trouble before the reset since the last progress: the reset is then a consequence
    loss_t = np.sort(ev.loc[ev["cls"].isin(LOSS_CLASSES), "timestamp_ns"].to_numpy(dtype=np.int64))
    loss_before = np.searchsorted(loss_t, t, side="left") - np.searchsorted(loss_t, last_progress, side="left")
    causal = in_flight & (t - last_progress < stall) & (loss_before == 0)
    if not causal.any():
        return []
    first = rst[causal].iloc[0]
    tr = int(first["timestamp_ns"])
    snd, rcv = int(first["sender"]), int(first["receiver"])
    directory = rank_directory(ctx)
    after = rst[rst["timestamp_ns"] >= tr]
    follow = dedup_counts(after)
    n_links = follow[["a", "b"]].drop_duplicates().shape[0]
    # what was in flight, and did it ever complete?
    open_w = w[(w["t0"].to_numpy(dtype=np.int64) <= tr) & (t1 >= tr)]
    failed = w[(~w["complete"]) & (w["t0"].to_numpy(dtype=np.int64) >= open_w["t0"].min() if len(open_w) else False)]
    op_txt = ""
    if len(open_w):
        o = open_w.sort_values("op_count").iloc[0]
        op_txt = f", while {o['op']} #{int(o['op_count'])} was in flight"
    n_failed = int(len(failed))
    forged = not kernel_logged_reset(ctx, first)
    gap = tr - int(last_progress[causal][0])
    summary = (f"TCP reset from {_endpoint(directory, snd, first['saddr'], first['sport'])} to "
               f"{_endpoint(directory, rcv, first['daddr'], first['dport'])}"
               + (f", not logged by rank {snd}'s kernel (a firewall or middlebox forged it)" if forged else "")
               + f", {ms(gap)} after the last completed collective{op_txt}; "
               + (f"{n_failed} collective(s) then never completed on every rank" if n_failed else
                  "the collectives went on")
               + (f"; {int(follow['n'].sum()) - 1} more reset(s) followed on {n_links} link(s)."
                  if int(follow['n'].sum()) > 1 else "."))
    severity = "error" if n_failed else "warning"
    evidence = trouble_rows(after, limit=MAX_EVIDENCE)
    sql = trouble_rows_sql(f"timestamp_ns >= {sql_int(tr)}", classes=("reset",), limit=MAX_EVIDENCE)
    return [Finding(
        kind="connection_reset", severity=severity, confidence=0.9 if n_failed else 0.7, summary=summary,
        headline=("TCP reset from {who} to {peers}" + (" (forged: its kernel never sent it)" if forged else "")
                  + (f"; {n_failed} collective(s) never completed" if n_failed else "; the job went on")
                  + " ({since})"),
        since_ns=tr, since_source="packets", since_precision_ns=1_000_000,
        op_count=int(open_w.sort_values("op_count").iloc[0]["op_count"]) if n_failed and len(open_w) else None,
        ranks=[snd], hosts=hosts_of(directory, [snd]), peer_ranks=[rcv],
        links=[{"rank": snd, "peer_rank": rcv, "saddr": first["saddr"], "sport": cell_int(first["sport"]),
                "daddr": first["daddr"], "dport": cell_int(first["dport"]), "first_reset_ns": tr, "forged": forged}],
        evidence=evidence, sql=sql, score=2e6 if n_failed else 10.0,
        action=("Find who reset the connection on that host: firewall/conntrack rules (nft/iptables REJECT, "
                "conntrack table full), a NIC or bond failover, a process closing the socket; NCCL cannot "
                "recover a reset socket: fix it and restart the job from the last checkpoint."),
        details={"first_reset_ns": tr, "since_last_progress_ns": gap, "resets_after": int(follow["n"].sum()),
                 "links_reset": n_links, "collectives_failed": n_failed, "forged": forged})]


@sees(PACKETS)
def packets_saw(ctx: Context) -> bool:
    """The witness ``packets`` of :mod:`.precedence`: a reset between ranks in the TCP trouble."""
    t = trouble_events(ctx)
    return bool(len(t) and (t["cls"] == "reset").any())


def _endpoint(directory, rank: int, addr, port) -> str:
    host = directory[rank].host if rank in directory else None
    return f"rank {rank} ({host + ', ' if host else ''}{addr}:{port})"


@detector("reset_state", kinds=KINDS, queries=True)
def reset_state(ctx: Context) -> list[Finding]:
    """Resets the packets did not show: from the state at capture (a hung communicator whose
    ring holds a reset), else from NCCL's WARN lines (:data:`LATE_SOURCES`, each consulted
    under :data:`forensics.findings.precedence.PRECEDENCE`)."""
    return [f for source in LATE_SOURCES for f in consult(ctx, source)]
