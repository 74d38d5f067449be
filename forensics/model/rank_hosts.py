"""Who each rank is, from the model alone: its own host name and the capture node holding its evidence.

:func:`rank_hosts_of` reads the names from the process facts first (the capture asked each
process's UTS namespace), then the logs (their prefix names the rank's own host), then the
capture's tables. The findings keep it as a memo of the analysis
(:func:`forensics.findings.ranks.rank_hosts`); the report's lanes name ranks the same way.
"""
from __future__ import annotations

import pandas as pd

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


def rank_hosts_of(model) -> dict[int, tuple[str | None, str | None]]:
    """Global rank -> (its own host name, the capture node holding its evidence); either may
    be None."""
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


__all__ = ["HOST_SOURCES", "rank_hosts_of"]
