"""``hang_stuck`` names the rank a stuck collective waits on from the threads sampled at the end
of the capture (forensics/findings/silent_rank.py): the lab's gpu-hang with a capture attached
before the fault, every rank inside #n, no TCP trouble, the peers' stream threads in poll on
their ring sockets, the hung rank's stream thread in nanosleep. Synthetic tables of the 4-rank
job of tests/traced_job.py (ring r -> r+1); each negative case has its positive twin."""
from __future__ import annotations

import pandas as pd

from forensics.findings import Context
from forensics.findings.hang import hang_stuck
from forensics.model import Model
from forensics.model.schema import TABLES, conform, empty
from traced_job import MS, RANKS, T0, job

STUCK_AT = 25
END = T0 + 6000 * MS


def _inode(r: int, peer: int) -> int:
    return 1000 + 10 * r + peer


def _threads(hung: set[int], ranks=range(RANKS), phase: str = "end") -> list[dict]:
    rows = []
    for r in ranks:
        base = {"host": f"node{r}", "pid": 100 + r, "rank": r, "phase": phase, "sample_ns": END - 100 * MS,
                "state": "S"}
        rows.append({**base, "tid": 100 + r, "name": "python", "wchan": "futex_do_wait", "syscall_name": "futex"})
        if r in hung:
            rows.append({**base, "tid": 200 + r, "name": "cuda-stream", "wchan": "hrtimer_nanosleep",
                         "syscall_name": "clock_nanosleep"})
        else:       # waits to receive from its ring predecessor
            prev = (r - 1) % RANKS
            rows.append({**base, "tid": 200 + r, "name": "cuda-stream", "wchan": "poll_schedule_timeout",
                         "syscall_name": "poll", "fd": 11, "socket_inode": _inode(r, prev), "wait_events": "in"})
    return rows


def _sockets() -> list[dict]:
    return [{"host": f"node{r}", "phase": "end", "pid": 100 + r, "rank": r, "peer_rank": p, "state": "ESTAB",
             "inode": _inode(r, p), "recv_q": 0, "send_q": 0}
            for r in range(RANKS) for p in ((r - 1) % RANKS, (r + 1) % RANKS)]


def _context(threads=(), sockets=()) -> Context:
    n = job(n_ops=30, completed=lambda k, r: k < STUCK_AT)
    tables = {name: empty(name) for name in TABLES}
    for name, rows in (("nccl_events", n), ("threads", threads), ("sockets", sockets)):
        if rows:
            tables[name] = conform(pd.DataFrame(list(rows)), name)
    m = Model(tables=tables, hosts=[f"node{r}" for r in range(RANKS)], captures=[{"ended_ns": END}])
    return Context(model=m, con=m.connect())


def test_the_rank_whose_peers_wait_on_it_is_named():
    f = hang_stuck(_context(_threads({2}), _sockets()))
    assert len(f) == 1 and f[0].severity == "error"
    assert f[0].ranks == [2] and f[0].peer_ranks == [3], (f[0].ranks, f[0].peer_ranks)
    assert "rank 2 had none waiting on the network" in f[0].summary and "clock_nanosleep" in f[0].summary
    assert "never ran its part" in f[0].headline


def test_no_threads_names_nobody():
    f = hang_stuck(_context())
    assert len(f) == 1 and f[0].ranks == [] and "no TCP retransmission" in f[0].summary


def test_two_silent_ranks_name_nobody():
    f = hang_stuck(_context(_threads({1, 2}), _sockets()))
    assert f[0].ranks == []


def test_a_rank_not_sampled_names_nobody():
    # rank 2 has no threads sampled at all: its silence is not evidence
    f = hang_stuck(_context(_threads(set(), ranks=(0, 1, 3)), _sockets()))
    assert f[0].ranks == []


def test_waits_on_sockets_to_someone_else_name_nobody():
    # every waiter reads from a socket whose peer is not the silent rank: no one waits on it
    socks = [{**s, "peer_rank": 0} for s in _sockets()]
    f = hang_stuck(_context(_threads({2}), socks))
    assert f[0].ranks == []


def test_threads_sampled_before_the_hang_name_nobody():
    f = hang_stuck(_context(_threads({2}, phase="start"), _sockets()))
    assert f[0].ranks == []
