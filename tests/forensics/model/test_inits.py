"""``comm_inits`` (forensics/model/inits.py) from the tracer: a rank stuck in its init names the
address it could not reach, from its process's socket transitions (``sock_state``)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from forensics.model.inits import comm_inits


class _Clock:
    """Monotonic ns read as UTC ns as they are."""

    def to_utc(self, mono):
        return np.asarray(mono, np.int64)


class _Bundle:
    host, clock = "node1", _Clock()


def _init(pid, rank, t0, t1=None):
    return {"ev": "comm_init", "fn": "ncclCommInitRank", "t0": t0, "t1": t1, "pid": pid, "tid": pid, "rank": rank,
            "nranks": 2, "comm_id_hash": "0xabc", "returned": t1 is not None}


def _sock(pid, t, sk, old, new, daddr="10.0.0.1", dport=29500):
    return {"ev": "sock_state", "t": t, "pid": pid, "family": 4, "saddr": "10.0.0.2", "daddr": daddr, "sport": 0,
            "dport": dport, "oldstate": old, "newstate": new, "netns": 1, "sk": sk}


def _unreached(events):
    rows = comm_inits(_Bundle(), events, None)
    return {int(r.rank): (None if pd.isna(r.unreached) else str(r.unreached))
            for r in rows.itertuples()}


def test_a_connection_still_unopened_at_the_end_is_the_address_it_cannot_reach():
    """Packets dropped: the SYNs go unanswered, the kernel retries for minutes, and the record
    ends with the socket in SYN_SENT (no CLOSE yet)."""
    ev = [_init(11, 1, 100), _sock(11, 150, "0xa", "CLOSE", "SYN_SENT")]
    assert _unreached(ev) == {1: "10.0.0.1:29500"}


def test_a_refused_connection_is_named_too():
    ev = [_init(11, 1, 100), _sock(11, 150, "0xa", "CLOSE", "SYN_SENT"), _sock(11, 160, "0xa", "SYN_SENT", "CLOSE")]
    assert _unreached(ev) == {1: "10.0.0.1:29500"}


def test_a_connection_that_opened_or_came_before_the_init_is_not():
    ev = [_init(11, 1, 100), _init(12, 0, 100, 400),
          _sock(11, 150, "0xa", "CLOSE", "SYN_SENT"), _sock(11, 151, "0xa", "SYN_SENT", "ESTABLISHED"),
          _sock(11, 90, "0xb", "CLOSE", "SYN_SENT", daddr="10.0.0.9"),        # before its init began
          _sock(12, 150, "0xc", "CLOSE", "SYN_SENT", daddr="10.0.0.7")]       # a completed init's
    assert _unreached(ev) == {1: None, 0: None}
