"""The report's first screen under the headline: *Where*, *Since*, *Stuck at*,
*Evidence* and *Next* for the most important finding (:func:`first_screen`).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ...wording import ms
from ...model.windows import capture_start_ns
from ...model.logs import YEAR_ASSUMED, ZONE_ASSUMED, host_text
from .common import utc


@dataclass
class Field:
    """One line of the report's first screen: a label and its text."""

    label: str
    text: str


HANG_KINDS = ("hang_mismatch", "hang_host", "hang_stuck", "connection_reset")


def first_screen(analysis, f) -> list[Field]:
    """The fixed fields under the headline, for the most important finding ``f``: *Where*
    (ranks, their hosts, addresses or links, the capture nodes where they differ), *Since*
    (UTC, how long before the capture, from what, how precisely), *Stuck at* (hangs: the
    communicator, the collective, NCCL's opCount and PyTorch's SeqNum), *Evidence* (the
    sources the verdict rests on) and *Next* (the check to make, naming the host)."""
    out: list[Field] = []
    where = []
    if f.ranks:
        where.append(("rank " if len(f.ranks) == 1 else "ranks ") + ", ".join(map(str, f.ranks[:8]))
                     + (f" … ({len(f.ranks)})" if len(f.ranks) > 8 else ""))
    if f.hosts:
        where.append("on " + ", ".join(f.hosts[:6]) + (f" … ({len(f.hosts)} hosts)" if len(f.hosts) > 6 else ""))
    addrs = sorted({str(a) for lk in f.links for r, a in ((lk.get("rank"), lk.get("saddr")),
                                                         (lk.get("peer_rank"), lk.get("daddr")))
                    if a and r is not None and r in f.ranks})
    if addrs:
        where.append("address " + ", ".join(addrs[:3]))
    links = [lk for lk in f.links if lk.get("rank") is not None and lk.get("peer_rank") is not None][:3]
    if links:
        where.append("links " + ", ".join(f"{lk['rank']} ↔ {lk['peer_rank']}" for lk in links)
                     + (" …" if len(f.links) > 3 else ""))
    elif f.peer_ranks:
        waiting = f.kind in HANG_KINDS
        listed = ", ".join(map(str, f.peer_ranks[:8])) + (" …" if len(f.peer_ranks) > 8 else "")
        if waiting and not f.ranks:
            where.append(f"no rank named behind; ranks {listed} waiting")
        else:
            where.append(("waiting: ranks " if waiting else "peers ") + listed)
    if f.nodes:
        where.append("captured on " + ", ".join(f.nodes[:4]))
    if not where:
        where = _where_from_evidence(f)
    if where:
        out.append(Field("Where", "; ".join(where)))
    out.append(Field("Since", since_field(analysis, f)))
    if f.kind in HANG_KINDS or f.op_count is not None or f.seq is not None:
        at = []
        comm = f.details.get("comm_id_hash") or f.details.get("comm") or f.details.get("pg_desc")
        if comm:
            at.append(f"communicator {comm}")
        op = f.details.get("op")
        if f.op_count is not None:
            at.append(f"{op + ' ' if op else ''}NCCL opCount {f.op_count}")
        if f.seq is not None:
            at.append(f"PyTorch SeqNum {f.seq}")
        if at:
            out.append(Field("Stuck at", ", ".join(at)))
    sources = f.details.get("sources") or f.since_source
    if sources:
        out.append(Field("Evidence", str(sources)))
    if f.action:
        out.append(Field("Next", f.action))
    return out


def _where_from_evidence(f) -> list[str]:
    """*Where* for a finding that names no rank, host or link (an init failure read from a file
    that prints no host): the hosts of its evidence rows as a person reads them ("host unknown
    (node0.log)": the file, never its path) and the addresses it names."""
    hosts: list[str] = []
    for row in f.evidence if isinstance(f.evidence, list) else []:
        h = row.get("host") if isinstance(row, dict) else None
        if h and (t := host_text(h)) not in hosts:
            hosts.append(t)
    out = []
    if hosts:
        named = [h for h in hosts if not h.startswith("host unknown")]
        out.append(("on " + ", ".join(named[:6]) if named else ", ".join(hosts[:3]))
                   + (f" … ({len(hosts)})" if len(hosts) > (6 if named else 3) else ""))
    addrs = [str(a) for a in f.details.get("addresses") or [] if a]
    if addrs:
        out.append(("address " if len(addrs) == 1 else "addresses ") + ", ".join(addrs[:3]))
    return out


def since_field(analysis, f) -> str:
    """"09:55:53 UTC, 28.1 s before the capture (Flight Recorder, within 100 ms)"."""
    logs_only = analysis.model.logs_only
    if f.since_ns is None:
        return "not dated: the lines it rests on carry no time" if logs_only else \
            "not dated by this evidence (it began before the capture, or the evidence has no times)"
    start = capture_start_ns(analysis.model)
    when = utc(f.since_ns)[:23] + " UTC"
    if any(YEAR_ASSUMED in n for n in analysis.model.notes):     # c10's prefix prints no year
        when = dt.datetime.fromtimestamp(f.since_ns / 1e9, tz=dt.timezone.utc).strftime("%b %d %H:%M:%S") \
            + " UTC (the logs print no year)"
    if logs_only and any(ZONE_ASSUMED in n for n in analysis.model.notes):   # the hosts' local time
        when = when.replace(" UTC", ", zone assumed UTC", 1)
    parts = []
    if start is not None and f.since_ns < start and f.kind in HANG_KINDS:
        parts.append(f"{ms(start - f.since_ns)} before the capture")
    how = f.since_source or "the evidence"
    if f.since_precision_ns:
        how += f", within {ms(f.since_precision_ns)}"
    return f"{when}" + (", " + ", ".join(parts) if parts else "") + f" ({how})"
