"""nccl-tests stdout of several versions and its JSON output."""
from __future__ import annotations

import json
import math

import pandas as pd

from conftest import FIXTURES
from forensics.parsers.nccl_tests import NcclTestsParser

D = FIXTURES / "parsers" / "nccl_tests"


def test_mixed_versions_rows_and_sides():
    r = NcclTestsParser.parse(D / "nccl_tests_output_mixed.txt")
    assert r.warnings == []
    t = r.tables["nccl_tests"]
    # 14 full rows x 2 sides + 1 out-of-place-only row
    assert len(t) == 29 and (t["placement"] == "out").sum() == 15
    first = t.iloc[0]   # 8192 2048 float sum -1 35.15 0.23 0.23 0 30.33 0.27 0.27 0
    assert (first["test"], first["size_bytes"], first["count"], first["dtype"], first["redop"], first["root"]) == \
        ("all_reduce_perf", 8192, 2048, "float", "sum", -1)
    assert (first["time_us"], first["algbw_gbps"], first["busbw_gbps"], first["wrong"]) == (35.15, 0.23, 0.23, 0)
    inplace = t.iloc[1]
    assert inplace["placement"] == "in" and inplace["time_us"] == 30.33 and inplace["busbw_gbps"] == 0.27
    # integer microseconds of big sizes (rccl-tests) and the mid-row "[0]" tags of nccl#1453
    big = t[(t["size_bytes"] == 4294967296) & (t["placement"] == "in")].iloc[0]
    assert big["time_us"] == 22414 and big["busbw_gbps"] == 359.28
    tagged = t[(t["size_bytes"] == 134217728) & (t["placement"] == "in")].iloc[0]
    assert (tagged["time_us"], tagged["algbw_gbps"], tagged["busbw_gbps"]) == (48558, 2.76, 5.30)
    # Open MPI --tag-output prefix
    assert t[t["size_bytes"] == 16]["time_us"].tolist() == [12.88, 12.83]


def test_header_facts_devices_footer_and_failures():
    r = NcclTestsParser.parse(D / "nccl_tests_output_mixed.txt")
    f = r.facts
    assert (f["version"], f["git_hash"], f["nccl_headers"], f["nccl_library"]) == ("2.20.0", "b4d5bee", 23102, 23102)
    assert f["tests"] == ["all_reduce_perf"]
    assert f["config"]["nGpus"] == 8 and f["config"]["iters"] == 20 and f["config"]["unalign"] == 0
    assert f["avg_busbw_gbps"] == 142.652 and f["avg_busbw_status"] is None
    assert f["out_of_bounds"] == 0 and f["out_of_bounds_ok"] is True
    assert len(f["failures"]) == 1 and "common.cu:1012" in f["failures"][0]
    dev = r.tables["nccl_tests_devices"]
    assert len(dev) == 12 and f["devices"] == 12
    assert f["hosts"] == ["gpu59", "h100-2", "h100-4", "spark-d708", "spark-dbf4", "worker-0", "worker-1"]
    h = dev[dev["host"] == "h100-4"].iloc[1]
    assert (h["rank"], h["group"], h["pid"], h["device"], h["bus_id"], h["gpu"]) == \
        (9, 0, 739787, 1, "0002:00:02", "NVIDIA H100 80GB HBM3")
    assert dev[dev["host"] == "worker-1"]["bus_id"].tolist() == ["0x8d", "0x91"]


def test_old_format_without_root_and_error_column():
    text = ("#   Rank  0 Pid  12 on     node01 device  0 [0x1b] Tesla V100\n"
            "#\n"
            "#                                                     out-of-place                       in-place\n"
            "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
            "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
            "     1048576        262144   float     sum    55.12   19.02   33.29  2e-07    54.90   19.10   33.43  0e+00\n"
            "# Avg bus bandwidth    : 33.36 FAILED\n")
    r = NcclTestsParser.parse(text.encode())
    assert r.warnings == []
    t = r.tables["nccl_tests"]
    assert len(t) == 2 and pd.isna(t["root"]).all()
    assert t["wrong"].tolist() == [2e-07, 0.0] and t["busbw_gbps"].tolist() == [33.29, 33.43]
    d = r.tables["nccl_tests_devices"].iloc[0]
    assert pd.isna(d["group"]) and d["host"] == "node01" and d["gpu"] == "Tesla V100"
    assert r.facts["avg_busbw_status"] == "FAILED"


def test_unchecked_results_and_timestamp_column():
    row = "        8192          2048     float     sum      -1    35.15    0.23    0.23     N/A    30.33    0.27    0.27     N/A  2025-10-01 12:00:01\n"
    r = NcclTestsParser.parse(("# Collective test starting: broadcast_perf\n" + row).encode())
    t = r.tables["nccl_tests"]
    assert r.warnings == [] and len(t) == 2
    assert t["wrong"].isna().all() and t["timestamp"].tolist() == ["2025-10-01 12:00:01"] * 2
    assert t["test"].tolist() == ["broadcast_perf"] * 2


def test_json_output():
    r = NcclTestsParser.parse(D / "all_reduce_perf.json")
    assert r.warnings == []
    t = r.tables["nccl_tests"]
    assert t[["placement", "time_us", "algbw_gbps", "busbw_gbps", "wrong"]].values.tolist() == \
        [["out", 12.9, 0.00062, 0.001085, 0.0], ["in", 12.87, 0.000622, 0.001088, 0.0]]
    assert t["root"].tolist() == [-1, -1] and t["test"].tolist() == ["all_reduce_perf"] * 2
    f = r.facts
    assert f["avg_busbw_gbps"] == 92.3405 and f["nccl_version"] == 23007 and f["json_version"] == 3
    assert f["hosts"] == ["node01"] and f["config"]["iterations"] == 20


def test_json_quirks_cpu_time_nan_and_bad_records():
    doc = json.loads((D / "all_reduce_perf.json").read_text())
    res = doc["results"][0]
    res["out_of_place"] = {"cpu_time": "nan", "alg_bw": 1, "bus_bw": 2, "nwrong": None}
    doc["results"] += [{"size": "big", "count": 1, "type": "float", "root": "    -1"}, "junk",
                       {**res, "in_place": {"time": [1], "alg_bw": 1, "bus_bw": 1, "nwrong": 0}}]
    r = NcclTestsParser.parse(json.dumps(doc).encode())
    t = r.tables["nccl_tests"]
    assert len(r.warnings) == 3
    assert t.iloc[0]["time_kind"] == "cpu" and math.isnan(t.iloc[0]["time_us"]) and pd.isna(t.iloc[0]["wrong"])
    assert len(t) == 3          # good record (2 sides) + the bad-in_place record's out side


def test_malformed_rows_warn():
    good = (D / "nccl_tests_output_mixed.txt").read_text().splitlines()
    bad = ["        8192          2048     float     sum      -1    35.15    0.23",          # truncated
           "        8192          2048     float     sum      -1    xx.15    0.23    0.23       0    30.33    0.27    0.27       0",
           '{"not": "json"']
    r = NcclTestsParser.parse("\n".join(good[:12] + bad + good[12:]).encode())
    assert len(r.tables["nccl_tests"]) == 29
    assert len(r.warnings) == 2 and ":13:" in r.warnings[0] and ":14:" in r.warnings[1]
    assert any(w.startswith("<bytes>:1: invalid JSON") for w in NcclTestsParser.parse(b"{truncated json").warnings)
    assert NcclTestsParser.parse(b"").warnings == ["<bytes>: empty file"]


def test_nccl_tests_1x_layout_without_marks_and_in_milliseconds():
    """nccl-tests 1.x (2017-18): no "#" before the parameter and summary lines, a "res" column,
    times in ms (kept in us here)."""
    text = ("nThread 1 nGpus 2 minBytes 8 maxBytes 1048576 step: 2(factor) warmup iters: 5 iters: 20 validation: 1\n"
            "Using devices\n"
            "       size         count    type   redop     time   algbw   busbw     res     time   algbw   busbw     res\n"
            "        (B)    (elements)                     (ms)  (GB/s)  (GB/s)             (ms)  (GB/s)  (GB/s)\n"
            "     1048576        262144   float     sum    0.105    9.99    9.99    0e+00    0.104   10.08   10.08    0e+00\n"
            " Out of bounds values : 0 OK\n"
            " Avg bus bandwidth    : 5.0175\n")
    r = NcclTestsParser.parse(text.encode())
    t = r.tables["nccl_tests"]
    assert r.warnings == [] and t["time_us"].tolist() == [105.0, 104.0] and t["busbw_gbps"].tolist() == [9.99, 10.08]
    assert (r.facts["avg_busbw_gbps"], r.facts["out_of_bounds"], r.facts["config"]["nGpus"]) == (5.0175, 0, 2)


BODY = ("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
        "           8             2     float     sum      -1    40.64    0.00    0.00      0    45.02    0.00    0.00      0\n"
        "         256            64     float     sum      -1    48.23    0.01    0.01      0    47.77    0.01    0.01      0\n"
        "           8             2     float     sum      -1    46.80    0.00    0.00      0    56.22    0.00    0.00      0\n"
        "        1024           256     float     sum      -1    47.44    0.02    0.02      0    53.56    0.02    0.02      0\n")


def test_a_table_body_without_its_header_is_claimed_by_its_rows_and_read():
    """A pasted table body (two runs' rows interleaved, no "# size count" header) is nccl-tests
    output by its rows' shape, with or without the units line; every row is kept."""
    from forensics.parsers.text import LogText
    rows_only = "".join(BODY.splitlines(keepends=True)[1:])
    for text in (BODY, rows_only, "job output\n" + rows_only):
        assert NcclTestsParser.claims(LogText.of(text.encode(), "paste.txt")), text
        r = NcclTestsParser.parse(text.encode())
        t = r.tables["nccl_tests"]
        assert r.warnings == [] and len(t) == 8 and t["busbw_gbps"].max() == 0.02
    # 4 key columns (no root, 2017's all_reduce) and no #wrong column are rows too
    old = "   8388608   2097152   float   sum   4.140   2.03   3.04   4.153   2.02   3.03\n" * 2
    assert NcclTestsParser.claims(LogText.of(old.encode(), "f"))
    assert not NcclTestsParser.claims(LogText.of(b"1 2 3 4 5 6 7 8\n10 20 30 40 50 60 70 80\n", "f"))


def test_launcher_tags_and_markdown_quotes_before_rows_and_footer():
    from forensics.parsers.text import LogText
    text = ("```\n[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong"
            "     time   algbw   busbw  #wrong\n"
            "[1,0]<stdout>:           8             2     float     sum      -1    12.90    0.00    0.00      0"
            "    12.87    0.00    0.00      0\n"
            ">        [1,0]<stdout>:# Avg bus bandwidth    : 92.3405 \n")
    assert NcclTestsParser.claims(LogText.of(text.encode(), "f"))
    r = NcclTestsParser.parse(text.encode())
    assert len(r.tables["nccl_tests"]) == 2 and r.facts["avg_busbw_gbps"] == 92.3405


def test_failure_lines_alone_are_read_without_a_warning():
    r = NcclTestsParser.parse(b"HCA-14: Test NCCL failure common.cu:1204 'unhandled cuda error / '\n"
                              b" .. HCA-14 pid 1015577: Test failure common.cu:915\n")
    assert r.warnings == [] and len(r.facts["failures"]) == 2


def test_headerless_rows_of_every_layout():
    """Without a header the layout is told by the fields: root or not, redop or not, #wrong or not."""
    cases = {
        "8388608 2097152 float sum 4.140 2.03 3.04 4.153 2.02 3.03": ("sum", None, 2, None),
        "8388608 2097152 float sum -1 4.140 2.03 3.04 4.153 2.02 3.03": ("sum", -1, 2, None),
        "8388608 2097152 float sum 4.140 2.03 3.04 0e+00 4.153 2.02 3.03 0e+00": ("sum", None, 2, 0.0),
        "8388608 2097152 float 0 4.140 2.03 3.04 0 4.153 2.02 3.03 0": (None, 0, 2, 0.0),
        "8388608 2097152 float sum -1 4.140 2.03 3.04 0": ("sum", -1, 1, 0.0),
        # 2.4-2.6's all_reduce_perf / all_gather_perf: neither redop nor root, an error column
        "8388608 2097152 float 4.140 2.03 3.04 0e+00 4.153 2.02 3.03 0e+00": (None, None, 2, 0.0),
    }
    for row, (redop, root, n, wrong) in cases.items():
        r = NcclTestsParser.parse((row + "\n").encode())
        t = r.tables["nccl_tests"]
        assert r.warnings == [] and len(t) == n, (row, r.warnings)
        got = t.iloc[0]
        assert (got["redop"] if pd.notna(got["redop"]) else None) == redop, row
        assert (int(got["root"]) if pd.notna(got["root"]) else None) == root, row
        assert got["busbw_gbps"] == 3.04 and (got["wrong"] if pd.notna(got["wrong"]) else None) == wrong, row


def test_unmarked_pastes_are_claimed_one_row_summary_or_header_alone():
    """nccl-tests 1.x, or a paste that lost its "#": one row with its summary lines, the header
    and device lines with no row yet, and the pre-2019 device line without "Pid" are all claimed."""
    from forensics.parsers.text import LogText
    row = ("134217728      33554432   float     sum    2.237  60.00   0.00    0e+00    0.001  139715.53   0.00    0e+00\n"
           " Out of bounds values : 0 OK\n Avg bus bandwidth    : 0\n")
    head = (" nThread 1 nGpus 1 minBytes 32 maxBytes 8589934592 step: 2(factor) warmup iters: 5       iters: 20\n\n"
            " Using devices\n   Rank  0 Pid 1821213 on AI-A100-Beethoven01 device  0 [0x00] NVIDIA A100-SXM4-40GB\n")
    old_devices = " Using devices\n#   Rank  0 on ip-172-31-6-103 device  0 [0x00] Tesla M60\n"
    for text in (row, head, old_devices):
        assert NcclTestsParser.claims(LogText.of(text.encode(), "paste.txt")), text
    r = NcclTestsParser.parse(row.encode())
    assert r.tables["nccl_tests"]["busbw_gbps"].tolist() == [0.0, 0.0] and r.facts["avg_busbw_gbps"] == 0.0
    d = NcclTestsParser.parse(head.encode()).tables["nccl_tests_devices"]
    assert d[["rank", "pid", "host"]].values.tolist() == [[0, 1821213, "AI-A100-Beethoven01"]]
    d = NcclTestsParser.parse(old_devices.encode()).tables["nccl_tests_devices"]
    assert d["host"].tolist() == ["ip-172-31-6-103"] and d["pid"].isna().all()
    assert not NcclTestsParser.claims(LogText.of(b"The Avg bus bandwidth : 0 was odd, and Rank 0 on x too\n", "f"))
