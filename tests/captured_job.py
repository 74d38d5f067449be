"""Model tables of a synthetic 4-rank job as its captures saw it, one rank per host
(node<r>, pid 100 + r), each host captured over a known window: for the tests of detectors that
judge the state at capture and of what they share with the report
(tests/forensics/findings/test_findings_state.py, tests/forensics/tcp/test_tcp_classes.py).
Its twin for a job traced from its start is traced_job.py.

``context(**rows)`` is a findings :class:`~forensics.findings.Context` over a model whose
tables are empty but for the given rows (a table name -> its rows as dicts, conformed to the
schema); every host captured ``WINDOW`` unless ``caps`` (``captures(...)``) or
``capture_windows`` (``windows(...)``) say otherwise."""
from __future__ import annotations

import pandas as pd

from forensics.findings import Context
from forensics.model import Model
from forensics.model.schema import TABLES, conform, empty

T0 = 1_800_000_000_000_000_000
S = 1_000_000_000
RANKS = 4
WINDOW = (T0, T0 + 15 * S)   # a 15 s capture on every host


def captures(window=WINDOW, world=RANKS):
    return [{"host": f"node{r}", "started_ns": window[0], "ended_ns": window[1],
             "bundle": f"node{r}.tar.gz", "collectors": [], "files": 0, "bytes": 0, "clock_samples": 2,
             "processes": [{"pid": 100 + r, "rank": r, "world_size": world, "comm": "sslab_rank", "cmdline": "",
                            "libnccl": []}]} for r in range(RANKS)]


def windows(spans=None, kind="capture"):
    spans = spans or {r: WINDOW for r in range(RANKS)}
    return [{"host": f"node{r}", "collector": kind, "kind": kind, "first_ns": a, "last_ns": b, "source": "manifest"}
            for r, (a, b) in spans.items()]


def context(caps=None, **rows) -> Context:
    tables = {name: empty(name) for name in TABLES}
    rows.setdefault("capture_windows", windows())
    for name, rs in rows.items():
        if rs:
            tables[name] = conform(pd.DataFrame(list(rs)), name)
    m = Model(tables=tables, hosts=[f"node{r}" for r in range(RANKS)], captures=caps or captures())
    return Context(model=m, con=m.connect())
