"""Nothing serious goes unsaid: each kind of failure evidence, alone in a loose file, gives a
finding and never the verdict "No failure" (the command line run in-process, as a user would)."""
from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from forensics.cli import Env, main
from forensics.model.nccl_errors import classify

EVIDENCE = {
    "warn_unknown": ("node3:1234:1300 [2] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via P2P/IPC\n"
                     "node3:1234:1300 [2] NCCL WARN Something entirely new went wrong here\n", "nccl_error"),
    "error_return": ("node3:1234:1300 [2] NCCL INFO transport/net.cc:700 -> 2\n"
                     "node3:1234:1300 [2] NCCL INFO init.cc:1200 -> 2\n", "nccl_error"),
    "nccl_error_in": ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, "
                      "unhandled system error, NCCL version 2.14.3\nncclSystemError: System call (e.g. socket, "
                      "malloc) or external library call failed or device error.\n", "nccl_error"),
    "watchdog": ("[rank3]:[E ProcessGroupNCCL.cpp:563] [Rank 3] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 "
                 "milliseconds before timing out.\n", "hang_stuck"),
    "dump_signal": ("[rank0]:[E1011 10:00:00.000000000 ProcessGroupNCCL.cpp:1500] [PG ID 0 PG GUID 0(default_pg) "
                    "Rank 0] Received a dump signal due to a collective timeout from rank 7 and we will try our "
                    "best to dump the debug info. Last enqueued NCCL work: 100, last completed NCCL work: 99.\n",
                    "nccl_error"),
    "heartbeat": ("[rank2]:[E1011 10:00:00.000000000 ProcessGroupNCCL.cpp:1423] [PG ID 0 PG GUID 0(default_pg) "
                  "Rank 2] Heartbeat monitor timed out! Process will be terminated after dumping debug info. "
                  "workMetaList_.size()=1\n", "gpu_error"),
    "childfailed_sigkill": ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 60 +
                            "\ntrain.py FAILED\n" + "-" * 60 + "\nRoot Cause (first observed failure):\n[0]:\n"
                            "  time      : 2024-05-01_10:11:12\n  host      : node7\n  rank      : 3 (local_rank: 3)\n"
                            "  exitcode  : -9 (pid: 4242)\n  error_file: <N/A>\n"
                            "  traceback : Signal 9 (SIGKILL) received by PID 4242\n" + "=" * 60 + "\n",
                            "process_exit"),
    "agent_sigsegv": ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) local_rank: 2 "
                      "(pid: 777) of binary: /usr/bin/python3\n", "process_exit"),
    "srun_killed": ("srun: error: node7: task 3: Killed\n", "process_exit"),
    "slurm_oom": ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=1234.0 cgroup. Some of your processes "
                  "may have been killed by the cgroup out-of-memory handler.\n", "process_exit"),
    "mpirun_signal": ("mpirun noticed that process rank 3 with PID 4242 on node node7 exited on signal 9 (Killed).\n",
                      "process_exit"),
    "launch_signal": ("subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', "
                      "'--local_rank=3']' died with <Signals.SIGKILL: 9>.\n", "process_exit"),
    "nccl_tests_failure": ("# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 "
                           "iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n"
                           "#  Rank  0 Group  0 Pid  12345 on     node1 device  0 [0x1b] NVIDIA A100-SXM4-80GB\n"
                           "node1: Test NCCL failure common.cu:958 'unhandled system error / '\n"
                           " .. node1 pid 12345: Test failure common.cu:842\n", None),
    "ib_port_down": ("CA 'mlx5_0'\n\tCA type: MT4123\n\tNumber of ports: 1\n\tPort 1:\n\t\tState: Down\n"
                     "\t\tPhysical state: Disabled\n\t\tRate: 10\n\t\tLink layer: InfiniBand\n", "ib_errors"),
    "xid": ("[Mon Oct 14 10:11:12 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n",
            "gpu_error"),
    "oom_killer": ("[Mon Oct 14 10:11:12 2024] Out of memory: Killed process 4242 (python) total-vm:123456kB, "
                   "anon-rss:98765kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:1234kB oom_score_adj:0\n",
                   "process_exit"),
    "mlx5_link_down": ("Oct 14 10:11:12 node7 kernel: mlx5_core 0000:5e:00.0 ib0: Link down\n", "ib_errors"),
    # NCCL's own word for a collective mismatch: the IB transport's size check (2.14), init's (2.4)
    "collective_mismatch_warn": ("node3:1234:1300 [0] transport/net_ib.cc:1038 NCCL WARN NET/IB : req 0/1 tag 0 peer "
                                 "10.0.0.6<58683> collective mismatch error, local size 496640 remote size 65536\n",
                                 "hang_mismatch"),
    "mismatched_collective_warn": ("node3:39719:39719 [3] init.cu:1197 NCCL WARN Mismatched collective detected, "
                                   "please check your collective calls at and around rank 11.\n", "hang_mismatch"),
    "ofi_warn": ("ip-10-0-1-5:1234:1300 [0] NCCL WARN NET/OFI Couldn't open AV. RC: -22, ERROR: Invalid argument\n",
                 "misconfiguration"),
    "libfabric": ("libfabric:12345:1700000000::efa:cq:efa_rdm_cq_readerr():123<warn> Error reading from CQ: "
                  "Input/output error\n", "ib_errors"),
    # only consequences: the proxy giving up, then the peer closing (no cause in the logs)
    "proxy_then_closed": ("node3:922:1158 [3] proxy.cc:1485 NCCL WARN [Service thread] Error encountered progressing "
                          "operation=Connect, res=2, closing connection\n"
                          "node3:922:1149 [3] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote "
                          "peer node4.ibnet<53735>\n", "connection_reset"),
    "ray_actor_died": ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
                       "\tclass_name: WorkerDict\n\tactor_id: d9cc4672\n\tpid: 20174\n\tip: 10.1.2.3\n", "process_exit"),
    "deepspeed_kills_only": ("".join(f"[2021-11-21 08:32:07,148] [INFO] [launch.py:131:sigkill_handler] Killing "
                                     f"subprocess {p}\n" for p in (250621, 250622)), "process_exit"),
    "agent_death_signal": ("WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting down "
                           "workers\nWARNING:torch.distributed.elastic.multiprocessing.api:Sending process 165 closing "
                           "signal SIGTERM\n", "process_exit"),
}


def _analyze(tmp_path, name: str, text: str) -> tuple[int, dict]:
    f = tmp_path / f"{name}.log"
    f.write_text(text)
    js = tmp_path / "f.json"
    out, err = io.StringIO(), io.StringIO()
    rc = main(["analyze", str(f), "-o", str(tmp_path / "r.html"), "--json", str(js), "-q", "--jobs", "1"],
              Env(stdout=out, stderr=err, debug=True))
    assert rc in (0, 1), err.getvalue()
    return rc, json.loads(js.read_text())


@pytest.mark.parametrize("name", sorted(EVIDENCE))
def test_evidence_alone_is_never_no_failure(name, tmp_path):
    text, kind = EVIDENCE[name]
    rc, doc = _analyze(tmp_path, name, text)
    assert not doc["verdict"].startswith("No failure"), doc["verdict"]
    assert rc == 1, doc["verdict"]
    serious = [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
    assert serious, doc["findings"]
    if kind is not None:
        assert any(f["kind"] == kind for f in serious), [(f["kind"], f["summary"]) for f in serious]


def test_a_ray_actors_death_names_its_node_and_launcher_stops_blame_no_process(tmp_path):
    _, doc = _analyze(tmp_path, "ray", EVIDENCE["ray_actor_died"][0])
    f = next(f for f in doc["findings"] if f["kind"] == "process_exit")
    assert f["hosts"] == ["10.1.2.3"] and f["severity"] == "error" and "20174" in f["headline"]
    for name in ("deepspeed_kills_only", "agent_death_signal"):
        (tmp_path / name).mkdir()
        _, doc = _analyze(tmp_path / name, name, EVIDENCE[name][0])
        f = next(f for f in doc["findings"] if f["kind"] == "process_exit")
        assert f["ranks"] == [] and f["details"]["rule"].startswith("stopped_"), f


def test_killed_rank_is_named_and_first(tmp_path):
    _, doc = _analyze(tmp_path, "sigkill", EVIDENCE["childfailed_sigkill"][0])
    f = doc["findings"][0]
    assert f["kind"] == "process_exit" and f["ranks"] == [3] and f["hosts"] == ["node7"]
    assert "SIGKILL" in f["headline"]


def test_unknown_warn_names_host_and_quotes_line(tmp_path):
    _, doc = _analyze(tmp_path, "w", EVIDENCE["warn_unknown"][0])
    f = next(f for f in doc["findings"] if f["kind"] == "nccl_error")
    assert f["hosts"] == ["node3"] and f["severity"] == "error"
    assert "Something entirely new went wrong here" in f["summary"]


def test_unknown_warn_ranks_below_classified(tmp_path):
    text = ("node3:1234:1300 [2] NCCL WARN Something entirely new went wrong here\n"
            "node3:1234:1300 [2] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4321> with status=12 "
            "opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.0.0.1 remoteGidsfe80::1\n")
    _, doc = _analyze(tmp_path, "both", text)
    kinds = [f["kind"] for f in doc["findings"]]
    unknown = next(f for f in doc["findings"] if f["kind"] == "nccl_error")
    assert unknown["severity"] == "warning" and kinds.index("ib_errors") < kinds.index("nccl_error")


def test_dump_signal_names_the_rank_that_fired_first(tmp_path):
    _, doc = _analyze(tmp_path, "d", EVIDENCE["dump_signal"][0])
    f = next(f for f in doc["findings"] if f["kind"] == "nccl_error")
    assert f["ranks"] == [7] and f["details"]["rule"] == "dump_signal"


def _local_dump(rank: int) -> str:
    return (f"[rank{rank}]:[E1128 21:11:49.041194513 ProcessGroupNCCL.cpp:1870] [PG ID 0 PG GUID 0(default_pg) Rank "
            f"{rank}] Received a dump signal due to a collective timeout from this local rank and we will try our "
            "best to dump the debug info. Last enqueued NCCL work: 22, last completed NCCL work: 21.\n")


def test_dump_signal_from_this_local_rank_names_that_rank(tmp_path):
    """A rank whose own watchdog fired names itself; a peer that only observed the signal is not it."""
    text = _local_dump(1) + ("[rank0]:[E1128 21:11:49.041188078 ProcessGroupNCCL.cpp:1806] [PG ID 0 PG GUID "
                             "0(default_pg) Rank 0] Observed flight recorder dump signal from another rank via "
                             "TCPStore.\n")
    _, doc = _analyze(tmp_path, "l", text)
    f = next(f for f in doc["findings"] if f["kind"] == "nccl_error")
    assert f["ranks"] == [1] and doc["verdict"].startswith("Collective timeout: rank 1's watchdog fired first")


def test_dump_signals_of_several_local_ranks_name_them_all(tmp_path):
    _, doc = _analyze(tmp_path, "m", _local_dump(7) + _local_dump(6))
    f = next(f for f in doc["findings"] if f["kind"] == "nccl_error")
    assert f["ranks"] == [6, 7] and "the watchdogs of ranks 6, 7 fired" in doc["verdict"]


@pytest.mark.parametrize("message, cls", [
    ("NET/OFI Couldn't open a fabric access domain. RC: -38, ERROR: Function not implemented", "ofi_setup"),
    ("NET/OFI Unable to register memory (type = 2) for device 0. RC: -22, Error: Invalid argument", "ofi_setup"),
    ("NET/OFI Creating new endpoint for domain 0x7f9befa99380 failed: Invalid argument", "ofi_setup"),
    ("NET/OFI Request 0x7f00 completed with error. RC: 21. Error: unknown error", "ofi_completion"),
    ("libfabric efa:cq: efa_rdm_cq_readerr(): Error reading from CQ: Input/output error", "libfabric"),
    ("Bootstrap : no socket interface found", "no_interface"),
    ("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000", "topology"),
    ("Error while creating shared memory segment /dev/shm/nccl-abc (size 9637888)", "resource_shm"),
    ("Cuda failure 'invalid device ordinal'", "cuda_setup"),
    ("Invalid config blocking attribute value -1", "invalid_usage"),
    ("NVLS multicast support is not available on dev 0", "nvls"),
    ("NET/Plugin : Plugin load returned 2 : libnccl-net.so: cannot open shared object file", "plugin_load"),
    ("init.cc:1200 -> 2 (ncclSystemError)", "error_return"),
    ("unhandled system error", "system_error"),
    ("Something entirely new went wrong here", "other"),
])
def test_new_warn_classes(message, cls):
    assert classify(pd.Series([message])).iloc[0] == cls


def test_bootstrap_by_source_file():
    got = classify(pd.Series(["Unexpected thing xyz", "Unexpected thing xyz"]),
                   pd.Series(["bootstrap.cc", "enqueue.cc"]))
    assert got.tolist() == ["bootstrap", "other"]


def test_timeouts_without_the_jobs_ranks_name_the_ranks_that_logged_not_every_rank(tmp_path):
    """With no Init line the job's world is unknown: the headline says which ranks timed out."""
    line = ("[rank{r}]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, "
            "Timeout(ms)=600000) ran for 600020 milliseconds before timing out.\n")
    _, doc = _analyze(tmp_path, "wd", line.format(r=0) + line.format(r=3))
    f = doc["findings"][0]
    assert f["kind"] == "hang_stuck" and "every rank" not in f["headline"], f["headline"]
    assert f["headline"].startswith("Hang: ranks 0, 3 timed out in collective SeqNum 808"), f["headline"]


def test_pytorch_1x_timeouts_without_seqnum_in_different_calls_name_the_odd_rank(tmp_path):
    """PyTorch < 1.10 prints no SeqNum: each rank's line is its oldest pending work, so ranks
    waiting in different calls there disagree on the collective (rank 0 in ALLREDUCE, the rest
    in BROADCAST)."""
    line = ("[E ProcessGroupNCCL.cpp:566] [Rank {r}] Watchdog caught collective operation timeout: "
            "WorkNCCL(OpType={op}, Timeout(ms)=1800000) ran for 1801060 milliseconds before timing out.\n")
    text = line.format(r=0, op="ALLREDUCE") + "".join(line.format(r=r, op="BROADCAST") for r in (1, 2, 3))
    _, doc = _analyze(tmp_path, "wd19", text)
    f = doc["findings"][0]
    assert f["kind"] == "hang_mismatch" and f["ranks"] == [0] and f["peer_ranks"] == [1, 2, 3], f
    assert "SeqNum" not in f["headline"] and "None" not in f["headline"] + f["summary"], f["headline"]


def test_a_warn_of_a_log_naming_no_host_reads_host_unknown_once_and_plainly(tmp_path):
    """One file naming no host: "on host unknown (<file>)", not "on 1 host (host unknown (<file>))";
    the socket headline has no colon before its "on"."""
    from forensics.findings.warns import hosts_text
    assert hosts_text(["unknown:/x/err.txt"]) == "unknown:/x/err.txt"
    assert hosts_text(["node1"]) == "1 host (node1)" and hosts_text(["unknown:/x/a"], of=3) == "1 of 3 hosts (unknown:/x/a)"
    text = ("[0] misc/socket.cc:49 NCCL WARN socketProgressOpt: Call to recv from 172.16.0.9<33759> failed : "
            "Connection reset by peer\n")
    _, doc = _analyze(tmp_path, "err", text)
    f = next(f for f in doc["findings"] if f["kind"] == "connection_reset")
    assert f["headline"].startswith("NCCL connections failed (socket reset) on host unknown (err.log)"), f["headline"]


def test_a_rank_whose_timeout_is_a_later_seqnum_is_said_past_it_not_in_it(tmp_path):
    line = ("[rank{r}]:[E513 13:25:57.714781669 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum={n}, OpType={op}, NumelIn=513, NumelOut=2052, Timeout(ms)=1800000) "
            "ran for 1800042 milliseconds before timing out.\n")
    text = line.format(r=2, n=532339, op="BROADCAST") + line.format(r=1, n=532339, op="BROADCAST") \
        + line.format(r=0, n=532341, op="_ALLGATHER_BASE")
    _, doc = _analyze(tmp_path, "ahead", text)
    f = doc["findings"][0]
    assert f["headline"].startswith("Hang: ranks 1, 2 timed out in collective SeqNum 532339 (BROADCAST), rank 0 "
                                    "already past it"), f["headline"]


def test_an_error_return_with_a_quoted_warn_leads_with_the_warn(tmp_path):
    """``file:line -> 2`` lines say "an NCCL call failed, no WARN line says why"; where the
    framework's error quotes NCCL's last WARN (XLA: "Last NCCL warning(error) log entry ...
    '<text>'") that WARN is the why: it leads, and no finding claims there is none."""
    log = tmp_path / "jax.log"
    log.write_text("host-a:275204:275658 [4] NCCL INFO bootstrap.cc:280 -> 2\n"
                   "host-a:275204:275658 [4] NCCL INFO init.cc:1388 -> 2\n"
                   "INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:305: NCCL operation ncclCommInitRank(&comm, "
                   "nranks, id, rank) failed: unhandled system error (run with NCCL_DEBUG=INFO for details). Last NCCL "
                   "warning(error) log entry (may be unrelated) 'socketTryAccept: Accept failed: Bad file descriptor'.\n")
    js = tmp_path / "f.json"
    assert main(["analyze", str(log), "-o", str(tmp_path / "r.html"), "--json", str(js), "-q", "--jobs", "1"],
                Env(stdout=io.StringIO(), stderr=io.StringIO())) == 1
    doc = json.loads(js.read_text())
    assert "socketTryAccept: Accept failed: Bad file descriptor" in doc["verdict"], doc["verdict"]
    assert not any("no WARN line that says why" in f["summary"] for f in doc["findings"]), doc["findings"]
