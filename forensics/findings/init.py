"""``init_failure``: the job never started: its ranks never met (``init_errors``).

Before the first collective the ranks meet at a store: torchrun's agents at the rendezvous
endpoint, each process group's ranks at ``MASTER_ADDR:MASTER_PORT`` where rank 0 publishes the
``ncclUniqueId`` (:mod:`forensics.parsers.torch_init`). One finding for the job, naming what the
logs say: the ranks that waited for the unique id and the rank they waited for (which never
reached that communicator's init, or whose store they could not reach), the store address no
client reached, the rendezvous that timed out (a node never joined), a new process group's
store-based barrier that not every rank reached (torch <= 1.13: the ranks missing are the cause,
the ones waiting are named as peers; only waiting, no timeout yet, is a warning). A traceback of the torchrun
agent cut before its error is a warning: the agent failed before any worker, the reason is not
in the log.
"""
from __future__ import annotations

import pandas as pd

from .base import Context, Finding, detector
from ..wording import ranks_text

INIT_SCORE = 2.5e6            # above a hang (the job never started: nothing else can follow it), below a first NCCL failure
COLS = ["host", "rank", "root_rank", "kind", "address", "timeout_ms", "error", "message", "time_ns", "artifact",
        "log_line"]
SQL = ("SELECT host, rank, root_rank, kind, address, timeout_ms, error, message, time_ns, artifact, log_line "
       "FROM init_errors WHERE kind <> 'rdzv_endpoint' ORDER BY time_ns NULLS LAST, artifact, log_line")
WHAT = {"store_connect": "no connection to the store", "rdzv_connection": "the rendezvous store unreachable",
        "rdzv_timeout": "the rendezvous timed out (a node never joined)", "rdzv_closed": "the rendezvous was closed",
        "rdzv_keepalive": "the agent lost the rendezvous store (keep-alive failed)"}


@detector("init_failure", kinds=("init_failure",))
def init_failure(ctx: Context) -> list[Finding]:
    t = ctx.model.tables.get("init_errors")
    if t is None or t.empty:
        return []
    errs = t[t["kind"] != "rdzv_endpoint"]
    if errs.empty:
        return []
    real = errs[errs["kind"] != "agent_traceback"]
    ex = ctx.model.tables.get("process_exits")
    if real.empty and ex is not None and len(ex):
        return []           # the agent's traceback is its workers' failure, reported there
    g = real if len(real) else errs
    hosts = sorted({h for h in g["host"].dropna().astype(str) if not h.startswith("unknown:")})
    addrs = list(dict.fromkeys(a for a in t["address"].dropna().astype(str)))
    tns = pd.to_numeric(g["time_ns"], errors="coerce")
    on = f" on {', '.join(hosts[:3])}" if hosts else ""
    uid = g[g["kind"] == "unique_id"]
    waited = sorted({int(r) for r in pd.to_numeric(uid["rank"], errors="coerce").dropna()})
    roots = sorted({int(r) for r in pd.to_numeric(uid["root_rank"], errors="coerce").dropna()})
    if len(real) == 0:
        summary = ("torchrun's agent failed before any worker started" + on + ": its traceback (torch's launcher "
                   "api) is in the log, the error it raised is not; at start-up that is most often the rendezvous.")
        headline = "torchrun's agent failed at start-up" + on + " (its error is cut from the log)"
        severity, confidence = "warning", 0.4
    elif (bar := g[g["kind"].isin(("barrier_timeout", "barrier_wait"))]).shape[0] == len(g):
        timed = bar["kind"].eq("barrier_timeout").any()
        waited = sorted({int(r) for r in pd.to_numeric(bar["rank"], errors="coerce").dropna()})
        err = str(bar["error"].dropna().iloc[-1]) if bar["error"].notna().any() else "the others never arrived"
        verb = "timed out waiting" if timed else "waits"
        summary = (f"{ranks_text(waited)}{on} {verb} at a new process group's store-based barrier: {err}. The ranks "
                   "missing never reached that new_group/init call (still busy before it, hung or dead), or they "
                   "used another store.")
        headline = (f"Init {'failed' if timed else 'stalled'}: {ranks_text(waited)} {verb} at a process group's "
                    f"store barrier, {err.split(' (key')[0]}" + on)
        severity, confidence = ("error", 0.75) if timed else ("warning", 0.6)
        waited, roots = [], waited      # the ranks missing are the cause; which ones the lines do not say
    elif len(uid):
        err = str(uid["error"].dropna().iloc[0]) if uid["error"].notna().any() else "no answer"
        summary = (f"{ranks_text(waited)} never got the ncclUniqueId from {ranks_text(roots)} through the c10d store"
                   f"{on} ({err[:80]}): {ranks_text(roots)} never reached that communicator's init (it failed, "
                   "hung or took another path), or the store"
                   + (f" at {addrs[0]}" if addrs else " (MASTER_ADDR:MASTER_PORT)") + " was unreachable.")
        headline = f"Init failed: {ranks_text(waited)} never got the ncclUniqueId from {ranks_text(roots)}" + on
        severity, confidence = "error", 0.8
    else:
        kinds = list(dict.fromkeys(real["kind"]))
        what = "; ".join(WHAT.get(k, k) for k in kinds[:2])
        where = f" at {addrs[0]}" if addrs else ""
        summary = (f"The ranks never met: torchrun's rendezvous failed{on} ({what}){where}: \""
                   + str(real["message"].dropna().iloc[0] if real["message"].notna().any() else "")[:140] + "\".")
        headline = f"Init failed: rendezvous{where} {'timed out' if 'rdzv_timeout' in kinds else 'unreachable'}" + on
        severity, confidence = "error", 0.75
    return [Finding(
        kind="init_failure", severity=severity, confidence=confidence, summary=summary, headline=headline,
        ranks=waited, hosts=hosts, peer_ranks=roots,
        evidence=[{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in
                  g.reindex(columns=COLS).head(20).to_dict("records")],
        sql=SQL,
        action=("that every node started its launcher with the same --rdzv_endpoint / MASTER_ADDR:MASTER_PORT and "
                "--nnodes; from each node: nc -zv on that address and port (firewall, the interface the name "
                "resolves to); the waited-for rank's own log for why it never arrived (it crashed or hung earlier)"),
        score=INIT_SCORE, since_ns=int(tns.min()) if tns.notna().any() else None,
        since_source="launcher time" if tns.notna().any() else None,
        details={"rule": "init_errors", "lines": int(len(g)), "kinds": sorted(set(g["kind"])),
                 "addresses": addrs[:4]})]
