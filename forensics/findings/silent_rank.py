"""The rank a stuck collective waits on, from the threads sampled at the end of a capture.

In a collective that every rank entered and none completed, with no TCP trouble between them
(``hang_stuck``'s "TCP shows no cause"), the ranks whose GPU work is still progressing sit in
NCCL's network code: a thread blocked in ``poll``/``recv`` on a socket to a ring neighbour, waiting
for data that never comes. The rank whose own part never runs (its GPU stream hung, its kernel
spinning, its process stopped) has no thread waiting on the network at all. The threads table
(``/proc/<pid>/task/*`` sampled by the capture: each thread's syscall, its fd, the socket that fd
is, what it waits for) tells them apart; the sockets table (``ss -e``, joined by inode) says
whose connection each waiter reads from.

:func:`silent_rank` names that rank only when the evidence is whole and unambiguous: every rank
of the communicator sampled during the hang, exactly one of them with no thread waiting to
receive on a socket, and at least one other waiting on a socket to it. Anything less (an
RDMA job, whose waits are not on sockets; two silent ranks; a rank not sampled) names nobody.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..wording import ranks_text

MAX_THREADS = 3


@dataclass(frozen=True)
class SilentRank:
    """``rank``: the one rank with no thread waiting on the network; ``threads``: what its
    threads were doing (name, tid, syscall or kernel wait), the idle ones (futex) last;
    ``waiters``: the other ranks, each with a thread waiting to receive on a socket;
    ``waiting_on_it``: those among them whose waited socket's peer is ``rank``;
    ``sample_ns``: when the threads were sampled (the latest sample)."""

    rank: int
    threads: list[str]
    waiters: list[int]
    waiting_on_it: list[int]
    sample_ns: int | None

    def text(self) -> str:
        """A clause for a finding's summary."""
        return (f"; at the end of the capture {ranks_text(self.waiters)} each had a thread waiting to receive on a "
                f"socket ({ranks_text(self.waiting_on_it)} on {'its' if len(self.waiting_on_it) == 1 else 'their'} "
                f"socket(s) to rank {self.rank}), while rank {self.rank} had none waiting on the network ("
                + "; ".join(self.threads) + f"): rank {self.rank}'s own part of the collective never ran, its peers "
                "wait for it: its GPU stream or its process is stuck")


def silent_rank(ctx, members: list[int], since_ns: int | None) -> SilentRank | None:
    """The one rank of ``members`` (global ranks of a stuck communicator) that no thread of its
    process waits on the network for, while the others wait on sockets, one of them to it
    (module docstring); ``since_ns``: the hang's start, the threads must be sampled after it.
    None when the threads do not say so unambiguously."""
    th = ctx.model.tables.get("threads")
    if th is None or th.empty or len(members) < 2:
        return None
    th = th[(th["phase"].astype("string") == "end").fillna(False).to_numpy()]
    th = th[pd.to_numeric(th["rank"], errors="coerce").isin(members).to_numpy()]
    if since_ns is not None:
        t = pd.to_numeric(th["sample_ns"], errors="coerce")
        th = th[(t.isna() | (t >= since_ns)).to_numpy()]
    if th.empty:
        return None
    th = th.assign(_r=pd.to_numeric(th["rank"]).astype("int64"))
    if set(th["_r"]) != set(members):
        return None
    ev = th["wait_events"].astype("string").fillna("")
    waits = th[(th["socket_inode"].notna() & ev.str.contains("in", regex=False)).to_numpy()]
    waiters = sorted(set(waits["_r"]))
    silent = sorted(set(members) - set(waiters))
    if len(silent) != 1:
        return None
    rank = silent[0]
    on_it = sorted(set(waits.loc[_peer_of(ctx, waits["socket_inode"]).to_numpy() == rank, "_r"]))
    if not on_it:
        return None
    mine = th[th["_r"] == rank]
    idle = (mine["wchan"].astype("string").str.contains("futex", regex=False).fillna(False)
            | (mine["syscall_name"].astype("string") == "futex").fillna(False))
    mine = pd.concat([mine[~idle.to_numpy()], mine[idle.to_numpy()]]).drop_duplicates("tid")
    threads = [f"{n} (tid {int(t)}) in {s if isinstance(s, str) else w if isinstance(w, str) else 'running'}"
               for n, t, s, w in zip(mine["name"], mine["tid"], mine["syscall_name"].astype("object"),
                                     mine["wchan"].astype("object"))][:MAX_THREADS]
    t = pd.to_numeric(th["sample_ns"], errors="coerce")
    return SilentRank(rank=rank, threads=threads, waiters=waiters, waiting_on_it=on_it,
                      sample_ns=int(t.max()) if t.notna().any() else None)


def _peer_of(ctx, inodes: pd.Series) -> pd.Series:
    """Per socket inode, the rank at the other end (the sockets table's ``peer_rank``), -1 unknown."""
    s = ctx.model.tables.get("sockets")
    if s is None or s.empty or "inode" not in s:
        return pd.Series(-1, index=inodes.index)
    s = s.dropna(subset=["inode", "peer_rank"]).drop_duplicates("inode")
    peer = dict(zip(pd.to_numeric(s["inode"]).astype("int64"), pd.to_numeric(s["peer_rank"]).astype("int64")))
    return pd.Series([peer.get(int(i), -1) for i in inodes], index=inodes.index)


__all__ = ["SilentRank", "silent_rank"]
