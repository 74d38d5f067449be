"""How a finding is checked against the lab's truth (``scenario.json``): one rule for the
end-to-end tests (tests/lab_runs/) and for the accuracy campaign (bench/accuracy.py).

A finding is either a :class:`forensics.findings.base.Finding` or its JSON form (``stallscope
analyze --json``: a dict with the same names); the truth is the dict the launcher writes.
Standard library only; nothing here starts a process.
"""
from __future__ import annotations

from typing import Any

SERIOUS = ("error", "warning")


def field(finding: Any, name: str, default: Any = None) -> Any:
    """``finding.name`` for a Finding, ``finding[name]`` for its JSON form."""
    if isinstance(finding, dict):
        return finding.get(name, default)
    return getattr(finding, name, default)


def serious(findings: list) -> list:
    """The findings with severity warning or error, in the analysis's order (its first one is
    the verdict's)."""
    return [f for f in findings if field(f, "severity") in SERIOUS]


def names_fault(top: Any, truth: dict, link: bool) -> bool:
    """Whether ``top`` names the faulted rank(s) of ``truth``. A hang or a host fault: its ranks
    are exactly the faulted ones. A link's fault (``link`` and the truth has a link): a link's
    finding names one end and the other as its peer, so the faulted rank must be among ranks
    and peer ranks, and the ranks must touch the faulted rank, one of the peers or the faulted
    link's other end (a reset seen from the rank whose connection was reset names that rank)."""
    want = set(truth["fault"]["ranks"])
    ranks = set(field(top, "ranks") or [])
    peers = set(field(top, "peer_ranks") or [])
    if link and truth["fault"].get("link"):
        return want <= (ranks | peers) and bool(ranks & (want | peers | link_ends(truth)))
    return sorted(field(top, "ranks") or []) == sorted(want)


def link_ends(truth: dict) -> set[int]:
    """The ranks at the ends of the faulted link: the faulted rank, and for a reset the peer
    whose connection was reset (the lab records it); empty when the fault has no link."""
    fault = truth["fault"]
    if not fault.get("link"):
        return set()
    ends = {fault["link"]["rank"]}
    if fault.get("peer_rank") is not None:
        ends.add(fault["peer_rank"])
    return ends


def names_link(top: Any, truth: dict) -> bool:
    """Whether one of ``top``'s links has the faulted link's ends (:func:`link_ends`), by rank
    or by address (the truth's rank addresses); False when the fault has no link or the
    finding names none."""
    want = link_ends(truth)
    if not want:
        return False
    addr_rank = {r["addr"]: r["rank"] for r in truth.get("ranks") or [] if r.get("addr")}
    for lk in field(top, "links") or []:
        ends = {lk.get("rank"), lk.get("peer_rank"), addr_rank.get(lk.get("saddr")), addr_rank.get(lk.get("daddr"))}
        if want <= ends:
            return True
    return False
