"""``connection_reset`` from NCCL's socket errors in the logs, when no capture saw the wire.

NCCL says why a connection between ranks failed: reset by the peer, closed by it, a broken
pipe, a timeout, a connect that found nobody listening (:mod:`forensics.model.nccl_errors`).
Most of these lines are the cascade of one process going away: every peer of a rank that
died logs "Connection closed by remote peer <that rank's host>". So the verdict names the
peer most lines point at (the host that went away, or whose link did), and the first such
line in time. No detector here: the owner of the kind, :mod:`forensics.findings.connection_reset`
(``reset_state``), consults :func:`socket_failures` when neither the state at capture nor the
address-level reading (:func:`logged_resets`) judged the reset, and :func:`logged_resets` when
the packets show none (:mod:`forensics.findings.precedence`).

:func:`logged_resets` and :func:`reset_warnings` read the same WARN lines by address: the
rank that logged "Connection reset by peer" and the peer whose address its line names.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import warns
from .base import Finding
from ..wording import ranks_text
from .ranks import label, rank_directory
from .sql import model_table as table, sql_evidence, sql_str
from .onset import ONSET_UNKNOWN
from .precedence import SOCKET_ERRORS, WARN_RESETS, finds
from .timeouts import abort_cascade

MAX_EVIDENCE = 20

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


@finds(SOCKET_ERRORS)
def socket_failures(ctx) -> list[Finding]:
    rows = warns.rows_of(ctx, list(CLASSES))
    # a connection to the reporter's own host is NCCL's own plumbing (its proxy thread, a local
    # rank): no link between hosts failed there
    rows = rows[rows["peer_host"].isna() | (rows["peer_host"].astype("string") != rows["host"].astype("string"))] \
        if len(rows) else rows
    if rows.empty:
        return []
    # the abort cascade of a hang (both ends timed out in their watchdog, then aborted): the
    # hang's consequence, said at info below the hang's finding
    cascade = pd.Series(abort_cascade(ctx, rows["rank"], rows["peer_rank"]), index=rows.index, dtype=bool)
    if cascade.all():
        return [_cascade_finding(ctx, rows, sql=warns.sql(list(CLASSES)))]
    rows = rows[~cascade]
    # lines that only follow another class's first failure (the proxy giving up after a memlock
    # error, peers closing after a rank died of a CUDA fault) are its cascade, not a finding; a
    # first line that is itself a consequence (the proxy giving up, where the logs hold no cause)
    # explains nothing, and the socket lines say more: whose connection went
    w = ctx.table("nccl_warnings")
    first_elsewhere = (w["first"].fillna(False).astype(bool) & ~w["class"].isin(CLASSES)
                       & ~w["cascade"].fillna(True).astype(bool))
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
        headline=(f"NCCL connections failed ({cls.replace('_', ' ')})"
                  + (f"; the peers on {gone} went first" if gone else f" on {warns.hosts_text(reporters, total)}")
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


# NCCL's socket errors, the cause first: a reset; then what a peer's exit leaves behind
RESET_WARN_KINDS = ("(?i:reset by peer)", "(?i:broken pipe)", "(?i:closed by remote peer)")
RESET_WARN_RE = "|".join(RESET_WARN_KINDS)


def reset_warnings(ctx, members: set[int]) -> pd.DataFrame:
    """NCCL WARN lines about a connection reset or closed by the peer, with the peer's rank
    (from its address: the line's peer, else the ``from``/``to <addr><port>`` of NCCL's socket
    errors), the cause first: a reset before a broken pipe before a close (what a peer's exit
    leaves behind); then by time when the log has timestamps (NCCL >= 2.26); then a failed
    *send* before a failed receive (a reset forged on the way hits the side that sends; a
    peer that aborts resets the connections it was receiving on)."""
    cols = ["rank", "peer_rank", "message", "how"]
    w = table(ctx, "nccl_warnings")
    if w.empty:
        return pd.DataFrame(columns=cols)
    msg = w["message"].astype("string")
    w = w[msg.str.contains(RESET_WARN_RE, regex=True).fillna(False).to_numpy()].dropna(subset=["rank"])
    if w.empty:
        return pd.DataFrame(columns=cols)
    msg = w["message"].astype("string")
    by_addr = rank_addresses(ctx)
    named = msg.str.extract(r"\b(?:from|to) \[?([0-9a-fA-F:.]+?)\]?<\d+>")[0]
    peer = w["peer"].astype("string").str.extract(r"^\[?([0-9a-fA-F:.]+?)\]?(?:[<:]\d+>?)?$")[0]
    how = pd.Series(len(RESET_WARN_KINDS), index=w.index)
    for i, pat in reversed(list(enumerate(RESET_WARN_KINDS))):
        how = how.mask(msg.str.contains(pat, regex=True).fillna(False), i)
    w = w.assign(peer_rank=peer.fillna(named).map(by_addr), how=how,
                 recv=msg.str.contains(r"(?i)\brecv|receive", regex=True).fillna(False).astype(int),
                 ts=w["ts"].astype("string") if "ts" in w else pd.NA)
    w = w.dropna(subset=["peer_rank"])
    w = w[w["rank"].astype("int64").isin(members) & w["peer_rank"].astype("int64").isin(members)]
    w = w.assign(rank=w["rank"].astype("int64"), peer_rank=w["peer_rank"].astype("int64"))
    # Without timestamps (NCCL < 2.26) the first failure is told by its shape: the ranks that
    # abort on an error reset their other connections too, so a broken link shows as resets
    # seen at both of its ends (each aborting end resets the other), the rest as one-sided
    # resets fanning out of the aborting ranks; of a mutual pair, the end more of the reset
    # lines touch is named first
    # Better still, each rank's *first* socket error (its log's order) is what made it abort:
    # the two ends of the broken link each failed first on the other, every other rank first
    # on a peer that had aborted before it
    pairs = set(zip(w["rank"], w["peer_rank"], w["how"]))
    mutual = [(p, r, h) in pairs for r, p, h in zip(w["rank"], w["peer_rank"], w["how"])]
    order = pd.to_numeric(w["log_line"], errors="coerce") if "log_line" in w else pd.Series(np.nan, index=w.index)
    first = w.assign(_o=order).sort_values(["_o"], kind="stable").drop_duplicates("rank")
    first_peer = dict(zip(first["rank"], first["peer_rank"]))
    mutual_first = [first_peer.get(r) == p and first_peer.get(p) == r for r, p in zip(w["rank"], w["peer_rank"])]
    touch = pd.concat([w["rank"], w["peer_rank"]]).value_counts()
    w = w.assign(not_first=~pd.Series(mutual_first, index=w.index), one_sided=~pd.Series(mutual, index=w.index),
                 peer_touch=-w["peer_rank"].map(touch))
    return w.sort_values(["how", "ts", "not_first", "one_sided", "peer_touch", "recv", "rank"], kind="stable",
                         na_position="last")[cols].reset_index(drop=True)


def rank_addresses(ctx) -> dict[str, int]:
    """Address -> global rank: the connections seen (rank_directory), else the NCCL logs'
    socket interfaces (a capture whose ranks had exited has no packets)."""
    out: dict[str, int] = {}
    cfg = table(ctx, "nccl_config").dropna(subset=["rank", "socket_addrs"])
    for r, addrs in zip(cfg["rank"], cfg["socket_addrs"]):
        for a in str(addrs).split(","):
            if a.strip():
                out.setdefault(a.strip(), int(r))
    out.update({info.addr: r for r, info in rank_directory(ctx).items() if info.addr})
    return out


@finds(WARN_RESETS)
def logged_resets(ctx) -> list[Finding]:
    """A reset that broke the ring before the capture, from NCCL's own WARN lines (the capture
    started after it; the ranks may have exited since, their logs attached): the rank that
    logged "Connection reset by peer" names the sender. Consulted only when the packets show
    no reset (:data:`forensics.findings.precedence.PRECEDENCE`)."""
    directory = rank_directory(ctx)
    w = reset_warnings(ctx, set(rank_addresses(ctx).values()) | set(directory))
    w = w[w["how"] == 0] if len(w) else w
    if w.empty:
        return []
    sql = f"""SELECT rank, host, pid, message, peer FROM nccl_warnings
WHERE regexp_matches(message, {sql_str(RESET_WARN_KINDS[0])}) ORDER BY rank LIMIT {MAX_EVIDENCE}"""
    cascade = pd.Series(abort_cascade(ctx, w["rank"], w["peer_rank"]), index=w.index, dtype=bool)
    if cascade.all():
        return [_cascade_finding(ctx, w, sql=sql)]
    w = w[~cascade]
    w0 = w.iloc[0]
    snd, rcv = int(w0["peer_rank"]), int(w0["rank"])
    links = w[["peer_rank", "rank"]].drop_duplicates()
    summary = (f"A TCP reset broke NCCL's connection {label(directory, snd)} -> {label(directory, rcv)} before the "
               f"capture: rank {rcv}'s NCCL logged \"{str(w0['message'])[:160]}\""
               + (f" ({len(links)} connection(s) reset in all)" if len(links) > 1 else "")
               + ". NCCL cannot recover a reset connection; the job fails or hangs from there. Evidence: NCCL WARN "
               "lines." + ONSET_UNKNOWN)
    return [Finding(
        headline="A TCP reset broke NCCL's connection {who} -> {peers} ({since})",
        kind="connection_reset", severity="error", confidence=0.75, summary=summary, ranks=[snd],
        hosts=[directory[snd].host] if snd in directory and directory[snd].host else warns.hosts_of_ranks(ctx, [snd]),
        peer_ranks=[rcv],
        links=[{"rank": snd, "peer_rank": rcv, "event": "reset"}], evidence=sql_evidence(ctx, sql, MAX_EVIDENCE), sql=sql,
        score=2e6,
        action=("Find who reset the connection on that host: firewall/conntrack rules (nft/iptables REJECT, "
                "conntrack table full), a NIC or host reboot, a process closing its socket; restart the job from "
                "the last checkpoint."),
        details={"state_at_capture": True, "sources": "NCCL WARN lines", "warnings": int(len(w))})]


def _cascade_finding(ctx, rows: pd.DataFrame, *, sql: str) -> Finding:
    """``connection_reset`` at info: every failed connection joins two ranks that had both
    timed out in their watchdog (:func:`forensics.findings.timeouts.abort_cascade`): the first
    rank to abort closed its sockets under the peers still waiting. The hang's finding leads."""
    pairs = rows[["rank", "peer_rank"]].dropna().astype("int64").drop_duplicates()
    senders = sorted(set(pairs["peer_rank"]))
    reporters = sorted(set(pairs["rank"]))
    head = rows.iloc[0]
    return Finding(
        headline="NCCL connections closed after the watchdog's timeouts: the hang's abort cascade ({since})",
        kind="connection_reset", severity="info", confidence=0.8,
        summary=(f"{len(rows)} NCCL socket failure line(s) on {ranks_text(reporters)} name peers {ranks_text(senders)}"
                 f" (first: \"{str(head['message'])[:120]}\"); every one joins two ranks whose PyTorch watchdog had "
                 "timed out in a collective, so the connection failed after the hang, when a rank aborted its "
                 "communicator: a consequence of the hang, not its cause (a connection that failed first fails its "
                 "ranks' collectives with an NCCL error instead of a timeout)."),
        ranks=senders, hosts=warns.hosts_of_ranks(ctx, senders), peer_ranks=reporters,
        links=[{"rank": int(s), "peer_rank": int(r), "event": "closed after abort"}
               for r, s in zip(pairs["rank"], pairs["peer_rank"])][:MAX_EVIDENCE],
        evidence=sql_evidence(ctx, sql, MAX_EVIDENCE), sql=sql, score=0.0,
        action="Follow the hang's finding: these connections closed when its ranks aborted.",
        details={"sources": "NCCL WARN lines, PyTorch watchdog lines", "lines": int(len(rows)), "abort_cascade": True})


__all__ = ["RESET_WARN_KINDS", "RESET_WARN_RE", "logged_resets", "rank_addresses", "reset_warnings", "socket_failures"]
