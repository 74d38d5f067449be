"""Rendezvous and c10d store failures: ranks that never met (forensics/parsers/torch_init.py)."""
from __future__ import annotations

import pandas as pd

from conftest import FIXTURES
from forensics.parsers.torch_init import TorchInitParser

D = FIXTURES / "parsers" / "torch_init"


def test_every_wording_of_a_store_or_rendezvous_failure():
    r = TorchInitParser.parse(D / "never_met.log")
    assert r.warnings == []
    t = r.tables["init_errors"]
    assert t["kind"].tolist() == ["rdzv_endpoint", "store_connect", "rdzv_connection", "rdzv_timeout",
                                  "rdzv_keepalive", "unique_id", "unique_id"]
    assert t["address"].tolist()[:2] == ["node-0:29400", "node-0:29400"]
    assert t["timeout_ms"].iloc[1] == 60000 and t["error"].iloc[2].startswith("RendezvousConnectionError: The")
    assert t["error"].iloc[4] == "RendezvousConnectionError"
    uid = t[t["kind"] == "unique_id"]
    assert uid["rank"].tolist() == [1, 3] and uid["root_rank"].tolist() == [0, 0]
    assert uid["timeout_ms"].tolist()[0] == 600000 and uid["error"].tolist()[1] == "Socket Timeout"
    assert uid["ctx_rank"].tolist()[0] == 1 and uid["ctx_local_rank"].tolist()[0] == 1
    assert pd.isna(uid["ctx_host"].tolist()[1])             # "RuntimeError: " is no host's tag


def test_an_agent_traceback_cut_before_its_error_is_a_row_and_one_with_its_error_is_not():
    t = TorchInitParser.parse(D / "agent_traceback.log").tables["init_errors"]
    assert t["kind"].tolist() == ["agent_traceback"] and t["line"].tolist() == [7]
    explained = (D / "agent_traceback.log").read_text() + \
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    t = TorchInitParser.parse(explained.encode()).tables.get("init_errors")
    assert t is None or t.empty or "agent_traceback" not in set(t["kind"])


def test_a_log_without_any_is_a_warning():
    r = TorchInitParser.parse(b"all good\n")
    assert r.warnings and (r.tables.get("init_errors") is None or pd.DataFrame(r.tables["init_errors"]).empty)


def test_store_based_barrier_timeouts_and_waits_of_torch_1x():
    """torch <= 1.13: a new process group's ranks meet at a store-based barrier; the line says
    who waited and how many of the world arrived (more than the world: two jobs on one store)."""
    r = TorchInitParser.parse(
        b"RuntimeError: Timed out initializing process group in store based barrier on rank: 7, for key: "
        b"store_based_barrier_key:32 (world_size=8, worker_count=4, timeout=0:00:30)\n"
        b"05/10/2023 23:07:45 - INFO - torch.distributed.distributed_c10d - Waiting in store based barrier to "
        b"initialize process group for rank: 0, key: store_based_barrier_key:1 (world_size=4, worker_count=8, "
        b"timeout=0:30:00)\n")
    t = r.tables["init_errors"]
    assert r.warnings == [] and t["kind"].tolist() == ["barrier_timeout", "barrier_wait"]
    assert t["rank"].tolist() == [7, 0] and t["timeout_ms"].tolist() == [30000, 1800000]
    assert t["error"].tolist()[0] == "4 of 8 ranks arrived (key store_based_barrier_key:32)"
    assert t["error"].tolist()[1].startswith("8 workers for a world of 4: a rank started twice")
    assert pd.isna(t["ctx_host"].tolist()[0])
