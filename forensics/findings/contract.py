"""The findings contract, completed once for every detector (docs/DESIGN.md, findings).

Detectors say what they know; :func:`complete` then gives every finding the fields the
report's first screen and the ``--json`` contract promise, the same way for all:

- ``hosts``: the name each blamed rank's own process uses (its UTS hostname, as NCCL's log
  prefix prints it: what an on-call engineer searches for), and ``nodes``: the captures
  that held those ranks, only where they differ (several ranks' pods captured on one
  node, or a lab's namespaces captured from the machine). :func:`rank_hosts` reads them
  from the process facts first (the capture asked each process's UTS namespace), then the
  logs (their prefix names the rank's own host), then the capture's tables;
- ``headline``: the verdict in at most HEADLINE_CHARS, from the detector's own, else the
  summary's first clause. A detector's headline may hold the placeholders ``{who}`` (the
  blamed ranks with their hosts), ``{peers}`` (the peer ranks) and ``{since}`` ("since
  09:55:53 UTC"): they are filled here, once the hosts are known.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone

import pandas as pd

from ..model.logs import host_text, hosts_in_text
from .base import HEADLINE_CHARS, Context, Finding
from .evidence import ranks_text

# (table, column naming the rank's own host, column naming the capture) in order of trust:
# a log line's prefix names the host its process runs on; a capture's tables name the capture
HOST_SOURCES = (
    ("coll_log_ops", "log_host", "node"),
    ("nccl_config", "log_host", "node"),
    ("nccl_warnings", "log_host", "node"),
    ("watchdog_events", "ctx_host", "node"),
    ("nccl_config", "host", "node"),
    ("nccl_warnings", "host", "node"),
    ("watchdog_events", "host", "node"),
    ("coll_log_ops", "host", "node"),
    ("nccl_events", "host", "host"),
    ("fr_pg_status", "host", "host"),
    ("sockets", "host", "host"),
)


def rank_hosts(ctx: Context) -> dict[int, tuple[str | None, str | None]]:
    """Global rank -> (its own host name, the capture node holding its evidence); either
    may be None. A memo of the analysis (:meth:`Context.memo`)."""
    return ctx.memo("rank_hosts", lambda: rank_hosts_of(ctx.model))


def rank_hosts_of(model) -> dict[int, tuple[str | None, str | None]]:
    """:func:`rank_hosts` of a model (the report's lanes name ranks the same way)."""
    own: dict[int, str] = {}
    node: dict[int, str] = {}
    for c in model.captures:                     # the process's own UTS host name: what NCCL prints
        for p in c.get("processes", []) or []:
            if p.get("rank") is not None and p.get("hostname"):
                own.setdefault(int(p["rank"]), str(p["hostname"]))
    for table, host_col, node_col in HOST_SOURCES:
        t = model.tables.get(table)
        if t is None or t.empty or host_col not in t or "rank" not in t:
            continue
        ranks = pd.to_numeric(t["rank"], errors="coerce")
        for col, into in ((host_col, own), (node_col, node)):
            if col not in t:
                continue
            v = t[col].astype("string")
            ok = ranks.notna().to_numpy() & v.notna().to_numpy() & ~v.str.startswith("unknown:").fillna(True)
            pairs = pd.DataFrame({"rank": ranks[ok].astype("int64"), "h": v[ok]}).drop_duplicates("rank")
            for r, h in zip(pairs["rank"].tolist(), pairs["h"].tolist()):
                into.setdefault(r, h)
    for c in model.captures:                     # process facts: RANK in the environment
        if c.get("kind") == "loose":
            continue
        for p in c.get("processes", []) or []:
            if p.get("rank") is not None:
                node.setdefault(int(p["rank"]), c.get("host"))
    return {r: (own.get(r), node.get(r)) for r in sorted(set(own) | set(node))}


def complete(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """``findings`` with hosts, nodes and headline completed (in place; returned)."""
    try:
        where = rank_hosts(ctx)
    except Exception:   # noqa: BLE001 - a model without these tables: the detectors' own names stay
        where = {}
    logs_only = ctx.model.logs_only
    for f in findings:
        blamed = [int(r) for r in f.ranks if int(r) in where]
        own = sorted({where[r][0] for r in blamed if where[r][0]})
        nodes = sorted({where[r][1] for r in blamed if where[r][1]})
        if own and (not f.hosts or set(f.hosts) <= set(nodes) | set(own)):
            f.hosts = own
        if nodes and set(nodes) != set(f.hosts):
            f.nodes = nodes
        if not f.headline:
            f.headline = headline_of(f.summary)
        f.headline = shorten(hosts_in_text(fill(f.headline, f, where, logs_only)))
        f.summary = hosts_in_text(f.summary)
        f.action = hosts_in_text(f.action) if f.action else f.action
        f.hosts = [host_text(h) for h in f.hosts]
    return findings


def fill(text: str, f: Finding, where: dict, logs_only: bool = False) -> str:
    """``text`` with ``{who}``, ``{peers}`` and ``{since}`` filled from ``f`` (an undated
    finding of the logs alone is "time not in the logs", of a capture "since before it")."""
    if "{" not in text:
        return text
    since = since_text(f.since_ns) if f.since_ns is not None or not logs_only else "time not in the logs"
    peers = ranks_text(f.peer_ranks) if len(f.peer_ranks) else "the other ranks"
    return text.replace("{who}", who(f.ranks, where)).replace("{peers}", peers).replace("{since}", since)


def who(ranks, where: dict) -> str:
    """"rank 3 (node3)", "ranks 1 (node1) and 2 (node2)"; more than three ranks as a range."""
    rs = sorted({int(r) for r in ranks})
    if not rs:
        return "no single rank"
    if len(rs) > 3:
        return ranks_text(rs)
    named = [f"{r} ({where[r][0] or where[r][1]})" if r in where and (where[r][0] or where[r][1]) else str(r)
             for r in rs]
    return ("rank " if len(rs) == 1 else "ranks ") + (", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1
                                                     else named[0])


def since_text(ns) -> str:
    if ns is None or pd.isna(ns):
        return "since before the capture"
    return "since " + datetime.fromtimestamp(int(ns) / 1e9, tz=timezone.utc).strftime("%H:%M:%S UTC")


_CLAUSE = re.compile(r"(?<=[.;:])\s")                 # where a clause ends
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")     # where a sentence ends


def headline_of(summary: str) -> str:
    """A summary's first sentence, or as many of its first clauses as fit in HEADLINE_CHARS,
    ending on no dangling ';' or ':' and with no parenthesis left open."""
    text = " ".join(summary.split())
    first = _SENTENCE.split(text, maxsplit=1)[0]
    if len(first) <= HEADLINE_CHARS:
        return first
    out = ""
    for part in _CLAUSE.split(first):
        nxt = f"{out} {part}".strip()
        if len(nxt) > HEADLINE_CHARS:
            break
        out = nxt
    out = (out or first).rstrip(" ;:,")
    while out.count("(") > out.count(")"):
        out = out[:out.rindex("(")].rstrip(" ;:,")
    return out or first


def shorten(text: str, limit: int = HEADLINE_CHARS) -> str:
    """``text`` cut at a word before ``limit`` characters, with an ellipsis, when longer."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


__all__ = ["HOST_SOURCES", "complete", "fill", "headline_of", "rank_hosts", "rank_hosts_of", "shorten", "since_text", "who"]
