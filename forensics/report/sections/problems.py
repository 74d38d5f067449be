"""What went wrong while capturing and reading: the collectors that failed or were
skipped and the problems met, each kind once over every host (:func:`gap_lines`).
"""
from __future__ import annotations

import re

from .captures import skew_rows


_HOST_PREFIX = re.compile(r"^([A-Za-z0-9_.:-]+): (.+)$", re.S)
_TARGET = re.compile(r"(@[^\s:]+|:(?:start|end)\b)")
_PARENS = re.compile(r"\s*\([^()]*\)")
_PATHS = re.compile(r"(?<![\w.])/[^\s,;:)'\"]+")
_NUMBERS = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
_NAMED_PIDS = re.compile(r"@pid\d+|\bpid \d+")
REASON_CHARS = 140


def reason_key(text: str) -> str:
    """A failure's reason without what differs from host to host (paths, numbers, pids,
    parenthesised details, everything after the first ';'): what groups it with its likes."""
    t = _NAMED_PIDS.sub("@pid", text.split(";", 1)[0])
    while True:
        u = _PARENS.sub("", t)
        if u == t:
            break
        t = u
    t = _NUMBERS.sub("N", _PATHS.sub("…", t))
    t = " ".join(t.split())
    return t if len(t) <= REASON_CHARS else t[:REASON_CHARS - 1].rsplit(" ", 1)[0] + "…"


def grouped_problems(problems: list[str], hosts) -> list[str]:
    """``problems`` with the ones that differ only by the host they name made one line each:
    "pcap/host-eth0-000.pcap: no packets … (on 4 hosts: node0, node1, node2, node3)". Kept in
    first-seen order; a problem naming no known host stays as it is."""
    known = {str(h) for h in hosts}
    order: dict[str, list] = {}
    for p in problems:
        m = _HOST_PREFIX.match(p)
        rest, host = (m.group(2), m.group(1)) if m and m.group(1) in known else (p, None)
        g = order.setdefault(reason_key(rest) if host is not None else p, [rest, []])
        if host is not None and host not in g[1]:
            g[1].append(host)
    out = []
    for key, (first, on) in order.items():
        if len(on) > 1:
            out.append(f"{key} (on {len(on)} hosts: {', '.join(on[:4])}{' …' if len(on) > 4 else ''}; "
                       "each host's details in the capture section)")
        elif on:
            out.append(f"{on[0]}: {first}")
        else:
            out.append(first)
    return out


def capture_gaps(analysis) -> list[str]:
    """One line per kind of gap in the captures: the collectors that failed or were skipped,
    grouped by status and reason over every host ("skipped on 4 hosts: ibstat, ncclras (not
    found on PATH)"); the per-host details stay in the report's capture section."""
    groups: dict[tuple[str, str], dict] = {}
    for c in analysis.model.captures:
        for k in c.get("collectors", []) or []:
            if k.get("status") in (None, "ok"):
                continue
            base = _TARGET.sub("", str(k.get("name", "")))
            reason = reason_key(str(k.get("reason") or "no reason given").replace(base, "")) or "-"
            g = groups.setdefault((k["status"], reason), {"kinds": [], "hosts": []})
            if base not in g["kinds"]:
                g["kinds"].append(base)
            if c.get("host") not in g["hosts"]:
                g["hosts"].append(c.get("host"))
    n = len(analysis.model.captures)
    out = []
    for (status, reason), g in sorted(groups.items(), key=lambda kv: (kv[0][0] != "failed", kv[0][1])):
        where = "every host" if len(g["hosts"]) == n and n > 1 else ", ".join(str(h) for h in g["hosts"][:4]) \
            + (" …" if len(g["hosts"]) > 4 else "")
        out.append(f"{status} on {where}: {', '.join(sorted(g['kinds']))} ({reason})")
    skew = skew_rows(analysis)
    if skew and all(s["skew_ms"] is None for s in skew):
        why = sorted({str(s["status"]) for s in skew})
        out.append(f"clock skew between hosts not measured ({'; '.join(why)})")
    return out


_COLLECTOR_PROBLEM = re.compile(r"^(?:[A-Za-z0-9_.:-]+: )?collector \S+ (?:failed|skipped)\b")


def gap_lines(analysis) -> list[str]:
    """The capture's gaps (:func:`capture_gaps`), then the problems met, grouped over hosts
    (:func:`grouped_problems`) less the collector failures the gaps already say."""
    rest = [p for p in analysis.problems if not _COLLECTOR_PROBLEM.match(p)]
    return capture_gaps(analysis) + grouped_problems(rest, analysis.model.hosts)
