"""``connection_reset`` from NCCL's socket errors in the logs, when no capture saw the wire.

NCCL says why a connection between ranks failed: reset by the peer, closed by it, a broken
pipe, a timeout, a connect that found nobody listening (:mod:`forensics.model.nccl_errors`).
Most of these lines are the cascade of one process going away: every peer of a rank that
died logs "Connection closed by remote peer <that rank's host>". So the verdict names the
peer most lines point at (the host that went away, or whose link did), and the first such
line in time; the detector that owns the kind from the state at capture,
:func:`forensics.findings.state.hang_state`, calls this when neither the packets nor the
address-level reset logic (:func:`forensics.findings.state.logged_resets`) judged it.
"""
from __future__ import annotations

from . import warns
from .base import Finding

CLASSES = ("socket_reset", "socket_closed", "socket_broken_pipe", "socket_timeout", "connect_failed", "socket_other")
ACTIONS = {
    "socket_reset": "the peer's own log for its first error (did it die? OOM kill, segfault, Xid), then firewall or "
                    "conntrack rules between the two hosts",
    "socket_closed": "the peer's own log and exit status (torchrun's summary, dmesg for an OOM kill or Xid on that "
                     "host): its process went away first",
    "socket_broken_pipe": "the peer's own log: it closed the connection first",
    "socket_timeout": "whether the peer host is up, the route and firewall on the interface NCCL uses "
                      "(NCCL_SOCKET_IFNAME)",
    "connect_failed": "that every rank started and listens; NCCL_SOCKET_IFNAME picks a routable interface; "
                      "the firewall",
    "socket_other": "the peer's own log for its first error",
}


def socket_failures(ctx) -> list[Finding]:
    rows = warns.rows_of(ctx, list(CLASSES))
    # a connection to the reporter's own host is NCCL's own plumbing (its proxy thread, a local
    # rank): no link between hosts failed there
    rows = rows[rows["peer_host"].isna() | (rows["peer_host"].astype("string") != rows["host"].astype("string"))] \
        if len(rows) else rows
    if rows.empty:
        return []
    # lines that only follow another class's first failure (the proxy giving up after a memlock
    # error, peers closing after a rank died of a CUDA fault) are its cascade, not a finding
    w = ctx.table("nccl_warnings")
    first_elsewhere = w["first"].fillna(False).astype(bool) & ~w["class"].isin(CLASSES)
    if first_elsewhere.any() and rows["cascade"].fillna(True).astype(bool).all():
        return []
    total = len(warns.job_hosts(ctx))
    peers = rows["peer_host"].dropna().astype(str)
    gone = peers.value_counts().index[0] if len(peers) else None
    reporters = sorted(set(rows["host"].dropna().astype(str)) - ({gone} if gone else set()))
    head = rows.iloc[0]
    cls = str(head["class"])
    first = bool(rows["first"].fillna(False).any())
    n_gone = int((peers == gone).sum()) if gone else 0
    if gone:
        where = (f"{n_gone} of {len(rows)} line(s), from {warns.hosts_text(reporters, total)}, name peers on {gone}: "
                 f"{gone}'s process exited or its link failed first")
    else:
        where = f"{len(rows)} line(s) on {warns.hosts_text(reporters, total)}"
    summary = (f"NCCL connections between ranks failed ({cls.replace('_', ' ')}): {where}; first: {warns.first_text(rows)} "
               f"\"{str(head['message'])[:120]}\"" + (" - the first failure in the logs" if first else "") + ".")
    blamed = [gone] if gone else sorted(set(rows["host"].dropna().astype(str)))[:1]
    since_ns, src = warns.since(rows)
    return [Finding(
        headline=(f"NCCL connections failed ({cls.replace('_', ' ')}): "
                  + (f"the peers on {gone} went first" if gone else f"on {warns.hosts_text(reporters, total)}")
                  + " ({since})"),
        kind="connection_reset", severity="error", confidence=0.75 if gone else 0.55, summary=summary,
        ranks=warns.ranks_of_hosts(ctx, blamed), hosts=blamed,
        peer_ranks=warns.ranks_of_hosts(ctx, reporters),
        links=warns.links(rows),
        evidence=warns.evidence(rows), sql=warns.sql(list(CLASSES)),
        action=(f"Look at {gone} first: " if gone else "") + ACTIONS.get(cls, ACTIONS["socket_other"]),
        score=warns.FIRST_FAILURE_SCORE if first else 2e6, since_ns=since_ns, since_source=src,
        details={"sources": "NCCL WARN lines", "lines": int(len(rows)), "peer_host": gone, "class": cls,
                 "first_failure": first})]


__all__ = ["socket_failures"]
