"""``init_failure``: ranks that never met at the rendezvous or the c10d store (findings/init.py)."""
from __future__ import annotations

from forensics.analysis import analyze

UNIQUE = ("[default1]:[rank1]: torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving "
          "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: wait timeout "
          "after 600000ms\n")
RDZV = ("[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to connect to 10.0.0.1:29400\n"
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
        "failed. See inner exception for details.\n")
AGENT = ('Traceback (most recent call last):\n  File "/opt/conda/bin/torchrun", line 33, in <module>\n'
         '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/launcher/api.py", line 134, in __call__\n'
         "    return launch_agent(self._config, self._entrypoint, list(args))\n")


def _findings(tmp_path, text):
    (tmp_path / "train.log").write_text(text)
    return [f for f in analyze([tmp_path]).findings if f.kind == "init_failure"]


def test_ranks_that_waited_for_the_unique_id_and_the_rank_they_waited_for(tmp_path):
    (f,) = _findings(tmp_path, UNIQUE)
    assert (f.severity, f.ranks, f.peer_ranks) == ("error", [1], [0])
    assert "ncclUniqueId" in f.headline and "600000ms" in f.summary


def test_a_rendezvous_store_nobody_reached_names_its_address(tmp_path):
    (f,) = _findings(tmp_path, RDZV)
    assert f.severity == "error" and "10.0.0.1:29400" in f.headline and f.details["addresses"] == ["10.0.0.1:29400"]


def test_an_agent_traceback_cut_short_is_a_warning_and_nothing_when_workers_failed(tmp_path):
    (f,) = _findings(tmp_path, AGENT)
    assert f.severity == "warning" and f.confidence < 0.5
    summary = ("Root Cause (first observed failure):\n[0]:\n  host      : node1\n  rank      : 0 (local_rank: 0)\n"
               "  exitcode  : 1 (pid: 42)\n")
    (tmp_path / "summary.log").write_text(summary)
    assert _findings(tmp_path, AGENT) == []


def test_a_store_barrier_not_every_rank_reached_names_the_waiters_as_peers(tmp_path):
    line = ("RuntimeError: Timed out initializing process group in store based barrier on rank: {r}, for key: "
            "store_based_barrier_key:32 (world_size=8, worker_count=4, timeout=0:00:30)\n")
    (f,) = _findings(tmp_path, line.format(r=7) + line.format(r=5))
    assert (f.severity, f.ranks, f.peer_ranks) == ("error", [], [5, 7])
    assert f.headline.startswith("Init failed: ranks 5, 7 timed out waiting at a process group's store barrier, "
                                 "4 of 8 ranks arrived"), f.headline
    wait = ("05/10/2023 23:07:45 - INFO - torch.distributed.distributed_c10d - Waiting in store based barrier to "
            "initialize process group for rank: 0, key: store_based_barrier_key:2 (world_size=8, worker_count=1, "
            "timeout=0:30:00)\n")
    (tmp_path / "w").mkdir()
    (f,) = _findings(tmp_path / "w", wait)
    assert f.severity == "warning" and f.headline.startswith("Init stalled: rank 0 waits"), f.headline
