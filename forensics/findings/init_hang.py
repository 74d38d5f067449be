"""``init_hang``: ranks stuck inside a communicator's init (``comm_inits``, forensics/model/inits.py).

A communicator's init returns only once every rank of it arrived: ranks that began
``ncclCommInitRank*`` and never finished, no collective after it, wait for the others. The
finding names the rank they wait for:

- a rank of the communicator that never began its init (its ``Init START`` line or the
  tracer's ``comm_init`` missing) while the others did: the missing rank;
- a rank inside its init whose process tried a connection it never opened (the tracer's
  ``sock_state``: SYN_SENT, never ESTABLISHED): the address it cannot reach (the bootstrap
  root or a peer behind a firewall, a wrong interface, a dropped route);
- otherwise every rank is inside init and the evidence does not say which one holds it
  (a warning naming them all).

Ranks are the communicator's own (``rank`` of the init), which for the world communicator are
the global ranks.
"""
from __future__ import annotations

import pandas as pd

from .base import Context, Finding, detector
from ..wording import ranks_text
from .init import INIT_SCORE

SQL = ("SELECT host, pid, rank, nranks, comm_id, fn, start_ns, end_ns, completed, source, unreached "
       "FROM comm_inits ORDER BY comm_id, rank")


@detector("init_hang", kinds=("init_hang",))
def init_hang(ctx: Context) -> list[Finding]:
    t = ctx.model.tables.get("comm_inits")
    if t is None or t.empty:
        return []
    t = t.assign(rank=pd.to_numeric(t["rank"], errors="coerce"), nranks=pd.to_numeric(t["nranks"], errors="coerce"))
    t = t.dropna(subset=["rank"])
    if t.empty:
        return []
    t = t.assign(key=t["comm_id"].astype("object").where(t["comm_id"].notna(),
                                                         "nranks " + t["nranks"].astype("string").fillna("?")))
    # only the communicators of which a rank entered and never completed (most finished theirs:
    # a job makes thousands)
    done = t.assign(_done=t["completed"].fillna(False).astype(bool)).groupby(["key", "rank"], sort=False)["_done"].any()
    t = t[t["key"].isin(set(done.index[~done.to_numpy()].get_level_values(0)))]
    out = []
    for key, g in t.groupby("key", sort=False):
        f = _one(ctx, str(key), g)
        if f is not None:
            out.append(f)
    return out


def _one(ctx: Context, key: str, g: pd.DataFrame) -> Finding | None:
    done = {int(r) for r in g.loc[g["completed"].fillna(False).astype(bool), "rank"]}
    entered = {int(r) for r in g["rank"]}
    stuck = sorted(entered - done)
    if not stuck:
        return None
    nranks = int(g["nranks"].max()) if g["nranks"].notna().any() else None
    stuck_pids = set(pd.to_numeric(g.loc[g["rank"].isin(stuck), "pid"], errors="coerce").dropna().astype(int))
    nccl = ctx.model.tables.get("nccl_events")
    if nccl is not None and len(nccl) and nccl["pid"].isin(stuck_pids).any():
        return None              # a collective after it: the init finished (its return not seen)
    logged = ctx.model.tables.get("coll_log_ops")
    if logged is not None and len(logged) and (logged["pid"].isin(stuck_pids).any()
                                               or logged["log_pid"].isin(stuck_pids).any()):
        return None              # its log has COLL lines: it went on past the init (the COMPLETE line cut)
    missing = sorted(set(range(nranks)) - entered) if nranks else []
    bad = g[g["unreached"].notna() & g["rank"].isin(stuck)][["rank", "unreached"]]
    bad = pd.concat([bad, _syn_sent(ctx, g, stuck)], ignore_index=True).drop_duplicates()
    hosts = sorted({str(h) for h in g["host"].dropna()})
    comm = f"communicator {key}" if key.startswith("0x") else f"the communicator of {key.split()[-1]} ranks"
    since = pd.to_numeric(g["start_ns"], errors="coerce")
    fn = str(g["fn"].dropna().iloc[0]) if g["fn"].notna().any() else "ncclCommInitRank"
    addrs = list(dict.fromkeys(str(a) for a in bad["unreached"]))
    if len(bad):
        culprits = sorted({int(r) for r in bad["rank"]})
        summary = (f"{ranks_text(stuck)} of {comm} are stuck inside {fn}: {ranks_text(culprits)} cannot reach "
                   f"{', '.join(addrs[:3])} (its connection never opened: SYN sent, no answer), so "
                   f"the bootstrap never completes and every rank waits"
                   + (f"; {ranks_text(missing)} never began its init" if missing else "") + ".")
        headline = f"Init hang: {ranks_text(culprits)} cannot reach {addrs[0]} ({comm})"
        ranks, peers, confidence, severity = culprits, [r for r in stuck if r not in culprits], 0.85, "error"
    elif missing:
        summary = (f"{ranks_text(stuck)} of {comm} ({nranks} ranks) are stuck inside {fn}, waiting for "
                   f"{ranks_text(missing)}, which never began its init (it hung or failed before, or never "
                   "reached that communicator).")
        headline = f"Init hang: {ranks_text(missing)} never joined {comm}; {ranks_text(stuck)} wait in {fn}"
        ranks, peers, confidence, severity = missing, stuck, 0.85, "error"
    else:
        summary = (f"Every rank of {comm} that the evidence has ({ranks_text(stuck)}) is stuck inside {fn}; "
                   "which one holds the others is not in the evidence (the bootstrap's connections, "
                   "the ranks' own logs).")
        headline = f"Init hang: {ranks_text(stuck)} stuck in {fn} ({comm})"
        ranks, peers, confidence, severity = stuck, [], 0.5, "warning"
    ev = g.drop(columns=["key"]).head(20)
    return Finding(
        kind="init_hang", severity=severity, confidence=confidence, summary=summary, headline=headline,
        ranks=ranks, hosts=hosts, peer_ranks=peers,
        links=[{"rank": int(r.rank), "daddr": str(r.unreached).rsplit(":", 1)[0],
                "dport": str(r.unreached).rsplit(":", 1)[-1]} for r in bad.itertuples()][:8],
        evidence=[{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in ev.to_dict("records")]
        + [{"rank": int(r.rank), "unreached": str(r.unreached)} for r in bad.itertuples()][:8],
        sql=SQL,
        action=("the missing rank's own log and stack (did it start, did it reach this communicator's init?); "
                "for an unreachable address: nc -zv to it from that rank's host, the firewall, "
                "NCCL_SOCKET_IFNAME (the interface the address belongs to)"),
        score=INIT_SCORE, since_ns=int(since.min()) if since.notna().any() else None,
        since_source="tracer" if since.notna().any() else None,
        details={"communicator": key, "nranks": nranks, "stuck": stuck, "missing": missing, "unreached": addrs[:4]})


def _syn_sent(ctx: Context, g: pd.DataFrame, stuck: list[int]) -> pd.DataFrame:
    """(rank, ``addr:port``) of the sockets the stuck ranks' processes had in SYN-SENT (``sockets``:
    ss at the capture's end, or loose ss output): connections they still could not open."""
    s = ctx.model.tables.get("sockets")
    if s is None or s.empty:
        return pd.DataFrame(columns=["rank", "unreached"])
    st = s["state"].astype("string").str.upper().str.replace("_", "-")
    syn = s[(st == "SYN-SENT").fillna(False).to_numpy()]
    pid_rank = {int(p): int(r) for p, r in zip(pd.to_numeric(g["pid"], errors="coerce"), g["rank"])
                if pd.notna(p) and int(r) in stuck}
    rows = []
    for r in syn.itertuples():
        rank = pid_rank.get(int(r.pid)) if pd.notna(r.pid) else None
        if rank is None and pd.notna(r.rank) and int(r.rank) in stuck:
            rank = int(r.rank)
        if rank is not None and pd.notna(r.peer_addr):
            rows.append({"rank": rank, "unreached": f"{r.peer_addr}:{r.peer_port}"})
    return pd.DataFrame(rows, columns=["rank", "unreached"])
