"""One pid -> global rank rule (forensics.model.nccl.process_ranks) for every table."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from forensics.execution.host_reading import read_model
from forensics.model.nccl import process_ranks
from shipped import shipped


def bundle(*procs):
    return SimpleNamespace(manifest=SimpleNamespace(processes=[SimpleNamespace(pid=p, rank=r) for p, r in procs]))


def init(pid, rank, nranks):
    return {"ev": "comm_init", "pid": pid, "rank": rank, "nranks": nranks, "t0": 1}


def comms(*rows):
    return pd.DataFrame(rows, columns=["pid", "rank", "nranks"])


def test_manifest_rank_when_nothing_else_knows():
    assert process_ranks(bundle((10, 3)), []) == {10: 3}


def test_nccl_world_rank_beats_the_environment():
    # RANK=3 in the environment, but NCCL numbers the process 1 on the 4-rank world
    assert process_ranks(bundle((10, 3)), [init(10, 1, 4)]) == {10: 1}
    assert process_ranks(bundle((10, 3)), [], comms((10, 1, 4))) == {10: 1}


def test_the_largest_communicator_wins_and_unknown_sizes_count_least():
    ev = [init(10, 0, 2), init(10, 5, 8), init(10, 7, None)]   # a TP pair, the world, a split child
    assert process_ranks(bundle(), ev) == {10: 5}
    # the log knows a larger communicator than the tracer saw
    assert process_ranks(bundle(), [init(10, 0, 2)], comms((10, 6, 8))) == {10: 6}


def test_tracer_wins_a_tie_with_the_log():
    assert process_ranks(bundle(), [init(10, 2, 4)], comms((10, 1, 4))) == {10: 2}


@pytest.mark.parametrize("scenario", ["loss", "mismatch-hang"])
def test_every_table_names_a_process_by_the_same_rank(scenario):
    m = read_model([shipped(scenario)])
    ranks = {}
    for name in ("tcp_events", "stacks", "sockets", "nccl_config", "offcpu", "coll_log_ops", "fr_entries"):
        t = m.tables[name]
        if t.empty or "rank" not in t or "pid" not in t:
            continue
        t = t.dropna(subset=["pid", "rank"])
        for (h, p), r in t.groupby(["host", "pid"])["rank"].agg(lambda s: set(s.astype(int))).items():
            ranks.setdefault((h, int(p)), {})[name] = r
    assert ranks
    for key, per in ranks.items():
        seen = set().union(*per.values())
        assert len(seen) == 1, (key, per)
