"""Who each rank is: its host, its address, its global rank, and how a finding names it.

One answer for the whole analysis, read by the contract (a finding's ``hosts`` and ``nodes``:
:mod:`.contract`) and by the detectors: :func:`rank_hosts` (a rank's own host name and its
capture node, :func:`forensics.model.rank_hosts.rank_hosts_of` kept as a memo),
:func:`rank_directory` (host and TCP address per rank) with the labels findings write
(:func:`label`, :func:`who_text`), and :func:`world_rank_map` (a communicator's ranks as
global ranks; :data:`WORLD_RANK_SQL` in SQL). Everything is a DataFrame operation over the
model's tables.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..model.nccl import world_ranks
from ..model.rank_hosts import rank_hosts_of
from ..wording import ranks_text
from .base import Context


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


__all__ = ["RankInfo", "WORLD_RANK_SQL", "hosts_of", "label", "rank_directory", "rank_hosts", "who_text",
           "world_rank_map"]
