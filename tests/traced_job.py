"""Model tables of a synthetic 4-rank job traced from its start: ``job`` gives the
nccl_events of every collective (op k entered by every rank at T0 + k*100 ms, one rank per host,
node<r>, pid 100 + r, ranks linked in a ring), ``tcp`` one tcp_events row between two ranks,
``subcomm_job`` a world communicator and a sub-communicator of chosen global ranks, and
``context`` a findings :class:`~forensics.findings.Context` over those tables (the others empty;
the capture ended at ``ended_ns``). For the detector tests
(tests/forensics/findings/test_findings_synthetic.py) and the report's
(tests/forensics/report/test_report.py). Its twin for a job seen only at capture is captured_job.py."""
from __future__ import annotations

import pandas as pd

from forensics.findings import Context
from forensics.model import Model
from forensics.model.schema import TABLES, conform, empty

T0 = 1_800_000_000_000_000_000
MS = 1_000_000
COMM = "0xc0ffee"
RANKS = 4


def addr(r: int) -> str:
    return f"10.9.0.{10 + r}"


def job(n_ops: int = 40, dur_ms=lambda k: 5.0, late=None, completed=lambda k, r: True, entered=lambda k, r: True):
    """nccl_events rows: op k entered by every rank at T0 + k*100 ms (+ late(k, r) ms)."""
    rows = []
    for k in range(n_ops):
        for r in range(RANKS):
            if not entered(k, r):
                continue
            ent = T0 + k * 100 * MS + int((late(k, r) if late else 0.0) * MS)
            start = T0 + k * 100 * MS + int(max((late(k, q) if late else 0.0) for q in range(RANKS)) * MS)
            done = completed(k, r)
            end = start + int(dur_ms(k) * MS) if done else None
            rows.append({"timestamp_ns": ent, "duration_ns": end - ent if done else None,
                         "duration_source": "host_sync", "end_ns": end, "op": "ALL_REDUCE", "rank": r,
                         "nranks": RANKS, "comm_id_hash": COMM, "comm_ptr": f"0x{r}", "op_count": k, "count": 1024,
                         "bytes": 4096, "host": f"node{r}", "pid": 100 + r, "tid": 100 + r, "completed": done})
    return rows


def window(rank: int, first_op: int, last_op: int, kind: str = "tracer") -> dict:
    """A capture_windows row: rank's host watched from op ``first_op``'s slot to the end of
    op ``last_op``'s (each op owns 100 ms from T0 + op * 100 ms)."""
    return {"host": f"node{rank}", "collector": kind, "kind": kind, "first_ns": T0 + first_op * 100 * MS - MS,
            "last_ns": T0 + (last_op + 1) * 100 * MS - MS, "source": "manifest"}


def tcp(t_ns: int, sender: int, receiver: int, event: str = "tcp_retransmit_skb", source: str = "bpf") -> dict:
    return {"timestamp_ns": t_ns, "event": event, "source": source, "saddr": addr(sender), "daddr": addr(receiver),
            "sport": 40000 + sender, "dport": 50000 + receiver, "host": f"node{sender}", "pid": 100 + sender,
            "rank": sender, "peer_rank": receiver, "capture": f"ns-r{sender}"}


def context(nccl, tcp_rows=(), flows=(), ib=(), ended_ns=None, offcpu=(), stacks=(), windows=()) -> Context:
    """A Context over these tables' rows (``windows``: capture_windows rows, :func:`window`)."""
    tables = {name: empty(name) for name in TABLES}
    for name, rows in (("nccl_events", nccl), ("tcp_events", tcp_rows), ("flows", flows), ("ib_counters", ib),
                       ("offcpu", offcpu), ("stacks", stacks), ("capture_windows", windows)):
        if rows:
            tables[name] = conform(pd.DataFrame(list(rows)), name)
    m = Model(tables=tables, hosts=[f"node{r}" for r in range(RANKS)], captures=[{"ended_ns": ended_ns}])
    return Context(model=m, con=m.connect())


def subcomm_job(n_ops=30, skip_at=25, members=(1, 3), nranks=None, world_ops=5):
    """A world communicator (4 ranks, a few completed ops) and a sub-communicator of the
    given global ranks (comm ranks 0..), on which the last member skips #skip_at."""
    rows = job(n_ops=world_ops)
    sub = "0xbeef"
    for i, g in enumerate(members):
        for k in range(n_ops):
            if i == len(members) - 1 and k >= skip_at:
                continue
            t = T0 + (world_ops + k) * 100 * MS
            done = k < skip_at
            rows.append({"timestamp_ns": t, "duration_ns": 5 * MS if done else None, "duration_source": "host_sync",
                         "end_ns": t + 5 * MS if done else None, "op": "ALL_GATHER", "rank": i,
                         "nranks": nranks or len(members), "comm_id_hash": sub, "comm_ptr": "0x9", "op_count": k,
                         "count": 16, "bytes": 64, "host": f"node{g}", "pid": 100 + g, "tid": 100 + g,
                         "completed": done})
    return rows
