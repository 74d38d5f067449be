"""The findings contract, completed once for every detector (docs/DESIGN.md, findings).

Detectors say what they know; :func:`complete` then gives every finding the fields the
report's first screen and the ``--json`` contract promise, the same way for all:

- ``hosts``: the name each blamed rank's own process uses (its UTS hostname, as NCCL's log
  prefix prints it: what an on-call engineer searches for), and ``nodes``: the captures
  that held those ranks, only where they differ (several ranks' pods captured on one
  node, or a lab's namespaces captured from the machine), as
  :func:`forensics.findings.ranks.rank_hosts` knows them;
- ``headline``: the verdict in at most HEADLINE_CHARS, from the detector's own, else the
  summary's first clause. A detector's headline may hold the placeholders ``{who}`` (the
  blamed ranks with their hosts), ``{peers}`` (the peer ranks) and ``{since}`` ("since
  09:55:53 UTC"): they are filled here, once the hosts are known.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone

import pandas as pd

from ..model.logs import ZONE_ASSUMED, host_text, hosts_in_text
from .base import HEADLINE_CHARS, Context, Finding
from ..wording import ranks_text
from .ranks import rank_hosts

def complete(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """``findings`` with hosts, nodes and headline completed (in place; returned)."""
    try:
        where = rank_hosts(ctx)
    except Exception:   # noqa: BLE001 - a model without these tables: the detectors' own names stay
        where = {}
    logs_only = ctx.model.logs_only
    # the logs alone, their times printed without a zone: what they say is the hosts' local time
    zone_assumed = logs_only and any(ZONE_ASSUMED in n for n in ctx.model.notes)
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
        f.headline = shorten(hosts_in_text(fill(f.headline, f, where, logs_only, zone_assumed)))
        f.summary = hosts_in_text(f.summary)
        f.action = hosts_in_text(f.action) if f.action else f.action
        f.hosts = [host_text(h) for h in f.hosts]
    return findings


def fill(text: str, f: Finding, where: dict, logs_only: bool = False, zone_assumed: bool = False) -> str:
    """``text`` with ``{who}``, ``{peers}`` and ``{since}`` filled from ``f`` (an undated
    finding of the logs alone is "time not in the logs", of a capture "since before it";
    ``zone_assumed``: its time was printed without a zone and read as UTC, which it says)."""
    if "{" not in text:
        return text
    since = since_text(f.since_ns, zone_assumed) if f.since_ns is not None or not logs_only \
        else "time not in the logs"
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


def since_text(ns, zone_assumed: bool = False) -> str:
    """"since 09:55:53 UTC"; ``zone_assumed``: "since 09:55:53, zone assumed UTC" (the logs
    print the host's local time without its zone)."""
    if ns is None or pd.isna(ns):
        return "since before the capture"
    return "since " + datetime.fromtimestamp(int(ns) / 1e9, tz=timezone.utc).strftime(
        "%H:%M:%S, zone assumed UTC" if zone_assumed else "%H:%M:%S UTC")


_CLAUSE = re.compile(r"(?<=[.;:])\s")                 # where a clause ends
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")     # where a sentence ends


def headline_of(summary: str) -> str:
    """A summary's first sentence, or as many of its first clauses as fit in HEADLINE_CHARS,
    ending on no dangling ';' or ':' and with no parenthesis or quotation left open (a sentence
    end inside a quoted log line, "Heartbeat monitor timed out! Process…", is not the summary's)."""
    text = " ".join(summary.split())
    first = _SENTENCE.split(text, maxsplit=1)[0]
    if len(first) <= HEADLINE_CHARS and first.count("(") <= first.count(")") and first.count('"') % 2 == 0:
        return first
    out = ""
    for part in _CLAUSE.split(first):
        nxt = f"{out} {part}".strip()
        if len(nxt) > HEADLINE_CHARS:
            break
        out = nxt
    out = (out or first).rstrip(" ;:,")
    while out.count("(") > out.count(")") or out.count('"') % 2:
        out = out[:out.rindex("(" if out.count("(") > out.count(")") else '"')].rstrip(" ;:,")
    return out or first


def shorten(text: str, limit: int = HEADLINE_CHARS) -> str:
    """``text`` cut at a word before ``limit`` characters, with an ellipsis, when longer."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


__all__ = ["complete", "fill", "headline_of", "shorten", "since_text", "who"]
