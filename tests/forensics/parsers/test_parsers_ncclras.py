"""NCCL RAS status output (ncclras -v): the documentation's samples, the source's other lines,
truncated and garbage input."""
from __future__ import annotations

from conftest import FIXTURES
from forensics.parsers import registry
from forensics.parsers.ncclras import NcclRasParser

D = FIXTURES / "parsers" / "ncclras"


def test_healthy_job():
    r = NcclRasParser.parse(D / "doc_healthy.txt")
    assert r.warnings == []
    f = r.facts
    assert (f["nodes"], f["processes_per_node"], f["gpus_per_process"], f["processes"], f["gpus"]) == (4, 8, 1, 32, 32)
    assert f["collection_s"] == 0.0 and f["sections"] == ["summary", "communicators"]
    g = r.tables["ras_comm_groups"]
    assert g[["group", "comms", "nodes_per_comm", "ranks_per_node", "ranks_per_comm", "ranks_in_group", "status",
              "errors"]].values.tolist() == [[0, 8, 4, "1", 4, 32, "RUNNING", "OK"]]
    assert r.tables["ras_communicators"].empty and r.tables["ras_ranks"].empty


def test_mismatched_operation_counts():
    r = NcclRasParser.parse(D / "doc_mismatch_op_counts.txt")
    assert r.warnings == []
    assert r.tables["ras_comm_groups"].iloc[0]["errors"] == "MISMATCH"
    c = r.tables["ras_communicators"]
    assert c[["section", "comm_id", "comm_hash", "kind", "ranks_listed"]].values.tolist() == \
        [["warnings", "#0-0", "27a079b828ff1a75", "MISMATCH", 6]]
    counts = r.tables["ras_rank_counts"]
    assert counts[["what", "collective", "value", "ranks"]].values.tolist() == \
        [["op_count", "collective", "6650", 26], ["op_count", "collective", "6649", 6]]
    ranks = r.tables["ras_ranks"]
    assert ranks["rank"].tolist() == [0, 2, 3, 4, 5, 7]
    assert set(ranks["op_count"]) == {6649} and set(ranks["node"]) == {"172.16.64.210"}
    assert ranks.iloc[0][["gpu", "pid"]].tolist() == ["0", 483072]


def test_mismatched_status_excerpt_without_its_heading():
    r = NcclRasParser.parse(D / "doc_mismatch_status.txt")
    # the page's "[...]" elision is the one line that is not RAS output
    assert len(r.warnings) == 1 and "'[...]'" in r.warnings[0]
    g = r.tables["ras_comm_groups"]
    assert g[["status", "errors", "ranks_per_node"]].values.tolist() == \
        [["FINALIZE", "MISMATCH", "1-2"], ["RUNNING", "OK", "1"], ["INIT", "OK", "1"]]
    assert r.tables["ras_communicators"].iloc[0]["section"] == "warnings"
    counts = r.tables["ras_rank_counts"]
    assert counts[["what", "value", "ranks"]].values.tolist() == \
        [["status", "UNKNOWN", 26], ["status", "RUNNING", 4], ["status", "FINALIZE", 2]]
    ranks = r.tables["ras_ranks"]
    assert ranks[["rank", "status"]].values.tolist() == [[0, "RUNNING"], [8, "RUNNING"], [16, "RUNNING"],
                                                         [24, "RUNNING"], [4, "FINALIZE"], [20, "FINALIZE"]]


def test_incomplete_and_dead():
    r = NcclRasParser.parse(D / "doc_incomplete.txt")
    assert r.warnings == []
    f = r.facts
    assert (f["collection_s"], f["missing_processes"], f["timeouts"], f["dead_processes"]) == (2.05, 1, 2, 0)
    assert r.tables["ras_processes"][["kind", "pid", "node", "gpus"]].values.tolist() == \
        [["INCOMPLETE", 3487984, "172.16.64.213", "5"]]
    c = r.tables["ras_communicators"].iloc[0]
    assert (c["comm_hash"], c["kind"], c["missing_ranks"], c["section"]) == ("cf264af53edbe986", "INCOMPLETE", 1,
                                                                             "errors")
    miss = r.tables["ras_ranks"]
    assert miss[["rank", "missing"]].values.tolist() == [[21, True]]
    d = NcclRasParser.parse(D / "doc_dead.txt")
    assert d.warnings == [] and d.facts["dead_processes"] == 1
    assert d.tables["ras_processes"][["kind", "pid"]].values.tolist() == [["DEAD", 3487984]]


SOURCE_FORMAT = b"""# ncclras -v
NCCL version 2.27.3+cuda12.9 compiled with CUDA 12.9
CUDA runtime version 12090, driver version 12090

Job summary
===========

  Nodes  Processes         GPUs
          per node  per process
      3          8            1
      1          7            1

  Nodes  Processes         GPUs
(total)    (total)      (total)
      4         31           31

The outlier node:
  Node 10.0.0.4 running processes 4101,4102,4103,4104,4105,4106,4107

Communicators... (5.012s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4       7-8        32        31   RUNNING  INCOMPLETE,ERROR,MISMATCH

Errors
======

#0-0 (5a1c6e2f0b9d8c11) INCOMPLETE
  Missing communicator data from 1 rank
  Rank 31 -- GPU 7 managed by process 4108 on node 10.0.0.4

#0-0 (5a1c6e2f0b9d8c11) ERROR
  Asynchronous error on 1 rank
  Rank 12 reported remote process exited or there was a network error -- GPU 4 managed by process 3012 on node 10.0.0.2

Warnings
========

#0-0 (5a1c6e2f0b9d8c11) MISMATCH
  Communicator ranks have different AllReduce operation counts
  30 ranks have launched up to operation 811
  Rank 12 has launched up to operation 810 -- GPU 4 managed by process 3012 on node 10.0.0.2

"""


def test_source_format_lines():
    """Lines the documentation does not show, as src/ras/client_support.cc prints them."""
    r = NcclRasParser.parse(SOURCE_FORMAT)
    assert r.warnings == []
    f = r.facts
    assert (f["nccl_version"], f["cuda_compiled"], f["cuda_runtime"], f["cuda_driver"]) == \
        ("2.27.3+cuda12.9", "12.9", 12090, 12090)
    assert (f["nodes"], f["processes"], f["gpus"]) == (4, 31, 31) and "processes_per_node" not in f
    assert f["processes_per_node_counts"] == [{"nodes": 3, "processes_per_node": 8},
                                              {"nodes": 1, "processes_per_node": 7}]
    assert f["outlier_nodes"] == [{"node": "10.0.0.4", "pids": list(range(4101, 4108))}]
    assert r.tables["ras_comm_groups"].iloc[0]["errors"] == "INCOMPLETE,ERROR,MISMATCH"
    kinds = r.tables["ras_communicators"][["section", "kind"]].values.tolist()
    assert kinds == [["errors", "INCOMPLETE"], ["errors", "ERROR"], ["warnings", "MISMATCH"]]
    ranks = r.tables["ras_ranks"]
    assert ranks[["kind", "rank", "pid", "node"]].values.tolist() == [
        ["INCOMPLETE", 31, 4108, "10.0.0.4"], ["ERROR", 12, 3012, "10.0.0.2"], ["MISMATCH", 12, 3012, "10.0.0.2"]]
    err = ranks.iloc[1]
    assert err["error"] == "remote process exited or there was a network error" and err["gpu"] == "4"
    mm = ranks.iloc[2]
    assert (mm["op_count"], mm["collective"]) == (810, "AllReduce")
    assert r.tables["ras_rank_counts"][["what", "collective", "value", "ranks"]].values.tolist() == \
        [["op_count", "AllReduce", "811", 30]]


def test_truncated_and_garbage_warn_never_raise():
    text = (D / "doc_incomplete.txt").read_bytes()
    cut = NcclRasParser.parse(text[: text.index(b"  Process 3487984") + 20])    # cut inside a line
    assert cut.tables["ras_comm_groups"].iloc[0]["errors"] == "INCOMPLETE"
    assert len(cut.warnings) == 1 and "unexpected line in errors" in cut.warnings[0]
    spliced = NcclRasParser.parse(SOURCE_FORMAT.replace(b"Warnings\n", b"Warnings\n\xff\xfe\x00junk\n  ???\n"))
    assert len(spliced.warnings) == 2 and len(spliced.tables["ras_ranks"]) == 3
    bad_row = NcclRasParser.parse(b"Group     Comms\n    0  x  4\n")
    assert bad_row.warnings and bad_row.tables["ras_comm_groups"].empty
    for junk in (b"", b"\x00\x01\x02" * 500, b"Failed to connect to the NCCL RAS service!\n"):
        r = NcclRasParser.parse(junk)
        assert r.warnings and all(t.empty for t in r.tables.values())


def test_selected_by_path_and_content():
    head = (D / "doc_healthy.txt").read_bytes()
    assert registry.select("sys/host/ncclras-end.txt", head)[0] is NcclRasParser
    assert NcclRasParser.sniff(head) and NcclRasParser.sniff(SOURCE_FORMAT)
    assert not NcclRasParser.sniff(b"State Recv-Q Send-Q Local Address:Port Peer Address:Port\n")


def test_v2_24_unknown_ranks_lines_are_missing_and_behind():
    r = NcclRasParser.parse(FIXTURES / "parsers" / "ncclras" / "v2_24_unknown_ranks.txt")
    assert r.warnings == []
    t = r.tables["ras_ranks"]
    assert sorted(t["rank"]) == [9, 11, 13] and set(t["status"]) == {"UNKNOWN"}
    assert t["behind"].all() and t["missing"].all()


def test_behind_is_the_smaller_op_count_not_the_outliers_ahead():
    text = ("#0-0 (27a079b828ff1a75) MISMATCH\n  Communicator ranks have different AllReduce operation counts\n"
            "  30 ranks have launched up to operation 811\n  2 ranks have launched up to operation 812\n"
            "  Rank 4 -- GPU 4 managed by process 11 on node n1\n  Rank 9 -- GPU 1 managed by process 12 on node n2\n"
            "  1 ranks have launched up to operation 810\n  Rank 17 -- GPU 1 managed by process 13 on node n3\n")
    t = NcclRasParser.parse(text.encode()).tables["ras_ranks"]
    assert dict(zip(t["rank"], t["behind"])) == {4: False, 9: False, 17: True}     # 4, 9 are ahead
    text = text.replace("811\n", "813\n")              # now 4 and 9 are behind the 30, 17 more so
    t = NcclRasParser.parse(text.encode()).tables["ras_ranks"]
    assert set(t["peers_op_count"]) == {813} and t["behind"].all()


def test_json_2_28_9_with_its_missing_comma():
    r = NcclRasParser.parse(FIXTURES / "parsers" / "ncclras" / "v2_28_9_json_missing_comma.json")
    assert r.warnings == [] and r.facts["nccl_version"] == "2.28.9+cuda12.9" and r.facts["timeouts"] == 1
    t = r.tables["ras_ranks"]
    behind = t[t["behind"]]
    assert sorted(behind["rank"]) == [1, 3]
    b1 = behind[behind["rank"] == 1].iloc[0]
    assert (b1["collective"], b1["op_count"], b1["peers_op_count"], b1["node"]) == ("AllReduce", 5120, 5121, "gpu-f01")
    b3 = behind[behind["rank"] == 3].iloc[0]
    assert (b3["kind"], b3["status"], b3["node"], b3["pid"]) == ("INCOMPLETE", "DEAD", "gpu-f02", 40202)
    assert NcclRasParser.sniff((FIXTURES / "parsers" / "ncclras" / "v2_28_9_json_missing_comma.json").read_bytes())
