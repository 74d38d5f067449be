"""PyTorch ProcessGroupNCCL watchdog lines, several PyTorch versions."""
from __future__ import annotations

import pandas as pd

from conftest import FIXTURES
from forensics.parsers.text import LogText
from forensics.parsers.torch_watchdog import TorchWatchdogParser

D = FIXTURES / "parsers" / "torch_watchdog"


def test_watchdog_sample():
    r = TorchWatchdogParser.parse(D / "watchdog.log")
    assert r.warnings == []
    w = r.tables["watchdog"]
    assert len(w) == 15
    assert w["kind"].value_counts().to_dict() == {"timeout": 7, "exception": 4, "teardown": 2, "fr_dump_wait": 1,
                                                  "terminated": 1}
    t = w.iloc[0]
    assert (t["rank"], t["severity"], t["log_time"], t["src_file"], t["src_line"]) == \
        (0, "E", "321 02:07:08.408271257", "ProcessGroupNCCL.cpp", 607)
    assert (t["seq_num"], t["op_type"], t["op"], t["numel_in"], t["numel_out"], t["timeout_ms"], t["ran_for_ms"]) == \
        (1580, "ALLREDUCE", "ALL_REDUCE", 466119168, 466119168, 600000, 600060)
    e = w[w["kind"] == "exception"].iloc[1]
    assert (e["rank"], e["pg_id"], e["seq_num"], e["last_enqueued"], e["last_completed"]) == (3, 1, 1580, 1582, 1579)
    guid = w[(w["kind"] == "exception") & w["pg_desc"].notna()].iloc[0]
    assert (guid["pg_id"], guid["pg_guid"], guid["pg_desc"], guid["rank"]) == (0, "0", "default_pg", 1)
    rs = w[w["op_type"] == "_REDUCE_SCATTER_BASE"].iloc[0]
    assert (rs["op"], rs["numel_in"], rs["numel_out"]) == ("REDUCE_SCATTER", 544997376, 68124672)
    old = w[w["seq_num"] == 96117].iloc[0]            # [E ProcessGroupNCCL.cpp:458] without NumelIn
    assert old["rank"] == 0 and pd.isna(old["numel_in"]) and old["timeout_ms"] == 1800000 and pd.isna(old["log_time"])
    term = w[w["kind"] == "terminated"].iloc[0]
    assert (term["pg_id"], term["rank"], term["seq_num"], term["op"]) == (3, 5, 9141, "ALL_GATHER")
    assert w[w["kind"] == "fr_dump_wait"].iloc[0]["wait_ms"] == 60000
    assert r.facts["timeouts"] == {0: 1580, 4: 1580, 1: 808, 7: 64088}     # first timeout per rank


def test_dump_signal_and_stuck_lines_and_malformed_work():
    text = ("[rank2]:[E1010 10:00:00.000000001 ProcessGroupNCCL.cpp:1500] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
            "Received a dump signal due to a collective timeout from rank 5 and we will try our best to dump.\n"
            "[rank2]:[F1010 10:08:00.000000001 ProcessGroupNCCL.cpp:1600] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
            "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress\n"
            "[rank2]:[E1010 10:00:00.000000001 ProcessGroupNCCL.cpp:607] [Rank 2] Watchdog caught collective "
            "operation timeout: WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=6\n"
            "unrelated training output\n")
    r = TorchWatchdogParser.parse(text.encode())
    w = r.tables["watchdog"]
    assert w["kind"].tolist() == ["dump_signal", "watchdog_stuck"]
    assert w.iloc[0]["peer_rank"] == 5 and w.iloc[1]["severity"] == "F"
    assert len(r.warnings) == 1 and ":3:" in r.warnings[0] and "WorkNCCL" in r.warnings[0]


def test_dump_signal_carries_the_ranks_own_positions():
    """2.5+ dump signals say where this rank is; "from this local rank" names no peer."""
    text = ("3: [rank3]:[E1112 09:40:46.021102764 ProcessGroupNCCL.cpp:1398] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
            "Received a dump signal due to a collective timeout from  rank 1 and we will try our best to dump the "
            "debug info. Last enqueued NCCL work: 2740, last completed NCCL work: 2740.This is most likely caused\n"
            "1: [rank1]:[E1112 09:40:45.189650217 ProcessGroupNCCL.cpp:1398] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
            "Received a dump signal due to a collective timeout from this local rank and we will try our best to "
            "dump the debug info. Last enqueued NCCL work: 2741, last completed NCCL work: 2740.\n"
            "[rank0]:[E1112 09:40:46.020961538 ProcessGroupNCCL.cpp:1349] [PG ID 0 PG GUID 0(default_pg) Rank 0] Observed "
            "flight recorder dump signal from another rank via TCPStore.\n")
    w = TorchWatchdogParser.parse(text.encode()).tables["watchdog"]
    assert w["kind"].tolist() == ["dump_signal"] * 3
    assert w["rank"].tolist() == [3, 1, 0]
    assert w.iloc[0]["peer_rank"] == 1 and pd.isna(w.iloc[1]["peer_rank"]) and pd.isna(w.iloc[2]["peer_rank"])
    assert (w.iloc[0]["last_enqueued"], w.iloc[0]["last_completed"]) == (2740, 2740)
    assert (w.iloc[1]["last_enqueued"], w.iloc[1]["last_completed"]) == (2741, 2740)
    assert pd.isna(w.iloc[2]["last_enqueued"])


def test_newer_status_lines_nccl_errors_last_error_and_old_version_codes():
    text = ("[rank2]:[E109 22:46:25.933593122 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 2]  failure "
            "detected by watchdog at work sequence id: 493 PG status: last enqueued work: 493, last completed work: 492\n"
            "[rank1]:[E1003 18:37:01.833621509 ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank 1] Timeout at NCCL "
            "work: 6463, last enqueued NCCL work: 6463, last completed NCCL work: 76280750235782912.\n"
            "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, NCCL "
            "version 21.1.4\n"
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n"
            "Last error:\n"
            "[pod/w-1/main] NET/IB : Got completion from peer 10.1.2.3<41234> with error 12, opcode 0, len 0, vendor err 129\n")
    w = TorchWatchdogParser.parse(text.encode()).tables["watchdog"]
    # "Timeout at NCCL work" is that rank's timeout, without the WorkNCCL description
    assert w["kind"].tolist() == ["exception", "timeout", "nccl_error", "nccl_error", "last_error"]
    assert (w.iloc[1]["rank"], w.iloc[1]["seq_num"]) == (1, 6463) and pd.isna(w.iloc[1]["op_type"])
    e = w.iloc[0]
    assert (e["rank"], e["seq_num"], e["last_enqueued"], e["last_completed"]) == (2, 493, 493, 492)
    assert pd.isna(w.iloc[1]["last_completed"])           # an uninitialised value (2.3) is no position
    assert w.iloc[2]["nccl_version"] == "2.11.4" and w.iloc[2]["error"] == "unhandled system error"
    last = w.iloc[4]
    assert last["error"].startswith("NET/IB : Got completion") and last["ctx_host"] == "w-1"


def test_last_error_in_a_reversed_paste_and_behind_a_torchx_role_tag():
    reversed_paste = (b"Duplicate GPU detected : rank 9 and rank 1 both on CUDA device 34000\n Last error:\n"
                      b"ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
                      b"torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:268, invalid usage, "
                      b"NCCL version 2.21.5\n")
    t = TorchWatchdogParser.parse(reversed_paste).tables["watchdog"]
    assert t.loc[t["kind"] == "last_error", "error"].tolist() == [
        "Duplicate GPU detected : rank 9 and rank 1 both on CUDA device 34000"]
    torchx = (b"[trainer0|0]:ncclInternalError: Internal check failed.\n[trainer0|0]:Last error:\n"
              b"[trainer0|0]:ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor "
              b"AF_INET6(10)\n")
    assert TorchWatchdogParser.claims(LogText(torchx, "x"))
    t = TorchWatchdogParser.parse(torchx).tables["watchdog"]
    assert t.loc[t["kind"] == "last_error", "error"].iloc[0].startswith("ncclSocketInit: connecting")


def test_a_result_code_and_last_error_behind_torchx_tags_are_claimed_and_read():
    """A log holding only NCCL's result code and its quoted last error (corpus 076)."""
    from forensics.parsers.text import LogText
    from forensics.parsers.torch_watchdog import TorchWatchdogParser
    data = (b"[trainer0|0]:ncclInternalError: Internal check failed.\n[trainer0|0]:Last error:\n"
            b"[trainer0|0]:ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor "
            b"AF_INET6(10)\n")
    assert TorchWatchdogParser.claims(LogText.of(data, "x"))
    wd = TorchWatchdogParser.parse(data).tables["watchdog"]
    assert wd["kind"].tolist() == ["nccl_error", "last_error"]
    assert wd["error"].tolist()[1].startswith("ncclSocketInit:") and wd["ctx_local_rank"].tolist() == [0, 0]


def test_glog_prefix_behind_a_torchx_tag_and_a_dump_debug_info_line():
    text = (b"trainer/0 [0]:E0927 12:07:22.643702 1012209 ProcessGroupNCCL.cpp:1356] [PG ID 0 PG GUID 0(default_pg) "
            b"Rank 0] ProcessGroupNCCL preparing to dump debug info.\n"
            b"trainer/0 [0]:I0927 12:07:22.643784 1012209 ProcessGroupNCCL.cpp:392] NCCL_PROFILER_PLUGIN: /x.so\n")
    w = TorchWatchdogParser.parse(text).tables["watchdog"]
    assert w["kind"].tolist() == ["dump_signal"]
    r = w.iloc[0]
    assert (r["severity"], r["log_time"], r["src_line"], r["rank"]) == ("E", "0927 12:07:22.643702", 1356, 0)
    assert r["message"].startswith("[PG ID 0") and pd.isna(r["peer_rank"])


def test_numbered_nccl_error_xla_operation_and_not_a_traceback_source_line():
    """``NCCL Error 2: <error>`` (C10D_NCCL_CHECK), XLA's ``NCCL operation <call>(...) failed:
    <error>`` and, in a traceback, a source line that only formats the message: read, read, not
    read (its ``{error_str}`` is no error)."""
    text = ("(RayWorkerWrapper pid=67451, ip=10.1.0.7) ERROR 06-25 15:28:30 worker_base.py:148] RuntimeError: NCCL "
            "Error 2: unhandled system error (run with NCCL_DEBUG=INFO for details)\n"
            "(RayWorkerWrapper pid=11305) ERROR 08-27 05:12:18 worker_base.py:382]     raise RuntimeError(f\"NCCL "
            "error: {error_str}\")\n"
            "INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:305: NCCL operation ncclCommInitRank(&comm, nranks, "
            "id, rank) failed: unhandled system error (run with NCCL_DEBUG=INFO for details). Last NCCL warning(error) "
            "log entry (may be unrelated) 'socketTryAccept: Accept failed: Bad file descriptor'.\n"
            "2023-09-01 10:20:11.257981: E external/xla/xla/pjrt/pjrt_stream_executor_client.cc:2593] Execution of "
            "replica 3 failed: INTERNAL: custom call 'xla.gpu.all_reduce' failed: external/xla/xla/service/gpu/"
            "nccl_utils.cc:275: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled cuda error; "
            "current tracing scope: all-reduce-start.163\n")
    w = TorchWatchdogParser.parse(text.encode()).tables["watchdog"]
    assert w["kind"].tolist() == ["nccl_error", "nccl_error", "last_error", "nccl_error"], w[["line", "kind", "error"]]
    assert w["line"].tolist() == [1, 3, 3, 4]
    assert w.iloc[0]["error"] == "unhandled system error (run with NCCL_DEBUG=INFO for details)"
    assert w.iloc[0]["ctx_host"] == "10.1.0.7"
    assert w.iloc[1]["error"] == "ncclCommInitRank failed: unhandled system error (run with NCCL_DEBUG=INFO for details)"
    # the WARN XLA quotes after the error is NCCL's last one: a last_error row, as "Last error:" gives
    assert w.iloc[2]["error"] == "socketTryAccept: Accept failed: Bad file descriptor"
    assert w.iloc[3]["error"] == "ncclCommInitRank failed: unhandled cuda error"


def test_horovods_call_failed_line_needs_one_of_nccls_error_strings():
    text = ("[1]<stderr>:RuntimeError: ncclCommInitRank failed: unhandled cuda error (run with NCCL_DEBUG=INFO for "
            "details)\n"
            "tensorflow.python.framework.errors_impl.UnknownError: ncclCommInitRank failed: unhandled system error\n"
            "ncclAllReduce failed: some text of the application's own\n")
    w = TorchWatchdogParser.parse(text.encode()).tables["watchdog"]
    assert w["line"].tolist() == [1, 2]
    assert w.iloc[0]["ctx_rank"] == 1
    assert w["error"].tolist() == ["ncclCommInitRank failed: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
                                   "ncclCommInitRank failed: unhandled system error"]


def test_an_xla_line_wrapped_right_after_failed_is_read_with_its_next_line():
    text = ("INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:305: NCCL operation ncclCommInitRank(&comm, nranks, "
            "id, rank) failed: \nunhandled system error (run with NCCL_DEBUG=INFO for details). Last NCCL warning\n")
    w = TorchWatchdogParser.parse(text.encode()).tables["watchdog"]
    assert w["error"].tolist() == ["ncclCommInitRank failed: unhandled system error (run with NCCL_DEBUG=INFO for "
                                   "details)"]
