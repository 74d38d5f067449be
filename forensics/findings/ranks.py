"""Who each rank is: its host, its address, its global rank, and how a finding names it.

One answer for the whole analysis, read by the contract (a finding's ``hosts`` and ``nodes``:
:mod:`.contract`) and by the detectors: :func:`rank_hosts` (a rank's own host name and its
capture node, a memo of the analysis; :func:`rank_hosts_of` of a model for the report's lanes),
:func:`rank_directory` (host and TCP address per rank) with the labels findings write
(:func:`label`, :func:`who_text`), and :func:`world_rank_map` (a communicator's ranks as
global ranks; :data:`WORLD_RANK_SQL` in SQL). Everything is a DataFrame operation over the
model's tables.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..model.nccl import world_ranks
from ..wording import ranks_text
from .base import Context

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


@dataclass
class RankInfo:
    host: str | None
    addr: str | None

    def label(self, rank: int) -> str:
        parts = [p for p in (self.host, self.addr) if p]
        return f"rank {rank} ({', '.join(parts)})" if parts else f"rank {rank}"


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


def rank_directory(ctx) -> dict[int, RankInfo]:
    """Global rank -> host (its own name where the logs say it, else its capture's) and the
    address its TCP connections use (the most frequent one)."""
    return ctx.memo("rank_directory", lambda: _rank_directory(ctx))


def _rank_directory(ctx) -> dict[int, RankInfo]:
    n = ctx.table("nccl_events")
    hosts: dict[int, str] = {}
    if len(n):
        # per rank its most frequent host (the first by name of equals, as Series.mode): counted,
        # not a Python function per rank (512 ranks: half a second)
        h = n.dropna(subset=["rank", "host"])[["rank", "host"]].astype({"rank": "int64", "host": str})
        h = h.groupby(["rank", "host"]).size().reset_index(name="n")
        h = h.sort_values(["rank", "n", "host"], ascending=[True, False, True]).drop_duplicates("rank")
        hosts = dict.fromkeys(n["rank"].dropna().astype("int64").unique().tolist())
        hosts.update(zip(h["rank"].tolist(), h["host"].tolist()))
    addr_parts = []
    f = ctx.table("flows")
    if len(f):
        addr_parts.append(pd.DataFrame({"rank": f["rank"], "addr": f["orig_addr"]}))
        addr_parts.append(pd.DataFrame({"rank": f["peer_rank"], "addr": f["resp_addr"]}))
    t = ctx.table("tcp_events")
    if len(t):
        addr_parts.append(pd.DataFrame({"rank": t["rank"], "addr": t["saddr"]}))
    addrs: dict[int, str] = {}
    if addr_parts:
        a = pd.concat(addr_parts, ignore_index=True).dropna()
        if len(a):
            a = a.astype({"rank": "int64", "addr": str})
            top = a.groupby(["rank", "addr"]).size().reset_index(name="n").sort_values(["rank", "n"],
                                                                                      ascending=[True, False])
            addrs = dict(zip(top.drop_duplicates("rank")["rank"], top.drop_duplicates("rank")["addr"]))
    # a rank's own host name (NCCL's log prefix) over the capture's: several ranks' pods or
    # namespaces captured on one node keep their names (findings.ranks.rank_hosts)
    own = {r: h for r, (h, _) in rank_hosts(ctx).items() if h}
    return {r: RankInfo(own.get(r) or hosts.get(r), addrs.get(r)) for r in sorted(set(hosts) | set(addrs) | set(own))}


def label(directory: dict[int, RankInfo], rank) -> str:
    r = int(rank)
    return directory.get(r, RankInfo(None, None)).label(r)


def hosts_of(directory: dict[int, RankInfo], ranks) -> list[str]:
    """The hosts of ``ranks`` the directory knows, sorted, once each."""
    return sorted({directory[r].host for r in ranks if r in directory and directory[r].host})


def who_text(directory: dict[int, RankInfo], ranks, limit: int = 3) -> str:
    """The blamed ranks with host and address ("rank 2 (node1, 10.0.0.2) or rank 5 (...)"),
    or, beyond ``limit`` of them, the first ones labelled and the rest as :func:`ranks_text`."""
    given = list(dict.fromkeys(int(r) for r in ranks))
    if len(given) <= limit:
        return " or ".join(label(directory, r) for r in given)
    rs = sorted(given)
    return (f"one of {len(rs)} ranks, {', '.join(label(directory, r) for r in rs[:2])}, … "
            f"({ranks_text(rs)})")


def world_rank_map(ctx) -> pd.DataFrame:
    """(comm_id_hash, comm rank) -> global rank: a process's rank on the largest
    communicator it belongs to (the world, :func:`forensics.model.nccl.world_ranks`), so
    sub-communicators' ranks map back."""
    return ctx.memo("world_rank_map", lambda: _world_rank_map(ctx))


def _world_rank_map(ctx) -> pd.DataFrame:
    n = ctx.table("nccl_events").dropna(subset=["rank", "pid"])
    if n.empty:
        return pd.DataFrame(columns=["comm_id_hash", "rank", "global_rank"])
    k = n[["comm_id_hash", "rank", "host", "pid"]].drop_duplicates()
    m = k.merge(world_ranks(n), on=["host", "pid"], how="left")
    return m[["comm_id_hash", "rank", "global_rank"]].drop_duplicates(["comm_id_hash", "rank"])


# world_rank_map as SQL: CTE ``w`` (host, pid, global_rank) for the findings' runnable SQL
WORLD_RANK_SQL = """seen AS (
  SELECT comm_id_hash, count(DISTINCT rank) AS seen FROM nccl_events WHERE rank IS NOT NULL GROUP BY comm_id_hash
), w AS (
  SELECT host, pid, arg_max(rank, coalesce(nranks, seen)) AS global_rank
  FROM nccl_events LEFT JOIN seen USING (comm_id_hash)
  WHERE rank IS NOT NULL AND pid IS NOT NULL GROUP BY host, pid
)"""


__all__ = ["HOST_SOURCES", "RankInfo", "WORLD_RANK_SQL", "hosts_of", "label", "rank_directory", "rank_hosts", "rank_hosts_of", "who_text",
           "world_rank_map"]
