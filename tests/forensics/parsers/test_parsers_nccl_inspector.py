"""NCCL Inspector JSONL, its README's pretty-printed records, and the Prometheus textfile mode."""
from __future__ import annotations

from conftest import FIXTURES
from forensics.parsers.nccl_inspector import NcclInspectorParser
from forensics.parsers.nccl_profiler_trace import NcclProfilerTraceParser

D = FIXTURES / "parsers"


def test_jsonl_and_pretty_printed_give_the_same_records():
    a = NcclInspectorParser.parse(D / "nccl_inspector/example-hostname-pid1639453.log")
    b = NcclInspectorParser.parse(D / "nccl_inspector/readme_pretty_printed.log")
    assert a.warnings == [] and b.warnings == []
    ta, tb = a.tables["inspector_coll"], b.tables["inspector_coll"]
    assert ta["line"].tolist() == [1, 2, 3] and tb["line"].tolist() == [1, 25, 74]
    assert ta.drop(columns="line").equals(tb.drop(columns="line"))
    r = ta.iloc[0]
    assert (r["comm_id"], r["rank"], r["nranks"], r["nnodes"]) == ("0x7f8c496ae9f661", 2, 8, 1)
    assert (r["op"], r["op_name"], r["seq"], r["msg_size_bytes"], r["exec_time_us"]) == \
        ("ALL_REDUCE", "AllReduce", 1407, 17179869184, 61974.0)
    assert (r["algobw_gbps"], r["busbw_gbps"], r["pid"]) == (277.210914, 485.119099, 1639453)
    v = ta.iloc[1]
    assert (v["op"], v["timing_source"], v["kernel_channels"]) == ("REDUCE_SCATTER", "kernel_gpu", 1)
    assert (v["start_ts_us"], v["stop_ts_us"]) == (1752867229235059, 1752867229235064)
    assert (v["kernel_start_ts_us"], v["kernel_stop_ts_us"]) == (1752867229235181, 1752867229275811)
    assert a.facts["last_seq"] == {"0x7f8c496ae9f661:2": 1407, "0xe62dedaa97644a:4": 1231, "0x9e7a479f95a66c:31": 129}


def test_prometheus_metrics():
    r = NcclInspectorParser.parse(D / "nccl_inspector/prometheus_textfile.prom")
    assert r.warnings == []
    m = r.tables["inspector_metrics"]
    assert m["metric"].tolist() == ["nccl_bus_bandwidth_gbs", "nccl_collective_exec_time_microseconds",
                                    "nccl_p2p_bus_bandwidth_gbs", "nccl_p2p_exec_time_microseconds"]
    assert m["value"].tolist() == [678.263, 9498.47, 464.9, 1154.87]
    assert m["collective"].tolist() == ["AllReduce", "AllReduce", "Send", "Send"]
    assert m.iloc[0]["algo_proto"] == "Ring_ll" and m.iloc[0]["node"] == "nvl72004-T01"


def test_p2p_records_and_malformed_lines():
    lines = (D / "nccl_inspector/example-hostname-pid1639453.log").read_text().splitlines()
    p2p = ('{"header":{"id":"0xabc","comm_name":"pp","rank":1,"n_ranks":2,"nnodes":2},"metadata":{"hostname":"h",'
           '"pid":7},"p2p_perf":{"p2p":"Send","p2p_sn":9,"p2p_peer":0,"p2p_msg_size_bytes":1048576,'
           '"p2p_exec_time_us":12.5,"p2p_timing_source":"kernel_gpu","p2p_algobw_gbs":83.9,"p2p_busbw_gbs":83.9}}')
    bad = ['{"header":{"id":"0x1","rank":0},"coll_perf":{"coll":"AllReduce","coll_sn":1', '{"header":{}}',
           "not json at all", '{"coll_perf":{"coll":"AllReduce","coll_sn":"x"}}']
    r = NcclInspectorParser.parse("\n".join(lines[:1] + [p2p] + bad + lines[1:]).encode())
    t = r.tables["inspector_coll"]
    assert len(t) == 5
    p = t.iloc[1]
    assert (p["kind"], p["op"], p["seq"], p["peer"], p["comm_name"]) == ("p2p", "SEND", 9, 0, "pp")
    assert len(r.warnings) == 5       # truncated, no perf, not json, no header, non-integer coll_sn


def test_profiler_trace_readme_sample_repaired():
    r = NcclProfilerTraceParser.parse(D / "nccl_profiler_trace/example_readme_trace.json")
    assert r.facts["repaired_lines"] == 3
    assert len(r.warnings) == 4 and "not a trace event" in r.warnings[3]
    ev = r.tables["profiler_events"]
    assert len(ev) == 44
    coll = ev[(ev["cat"] == "COLL") & (ev["ph"] == "b")].iloc[0]
    assert (coll["seq"], coll["comm_hash"], coll["rank"], coll["count"], coll["algorithm"], coll["protocol"],
            coll["nchannels"]) == (0, "0x14ba61f9a096f33f", 0, 262144, "RING", "SIMPLE", 2)
    api = ev[(ev["cat"] == "COLL_API") & (ev["ph"] == "b")].iloc[0]
    assert api["datatype"] == "ncclFloat32"          # was unquoted in the README
    sp = r.tables["profiler_spans"]
    recv = sp[(sp["name"] == "RecvWait") & (sp["id"] == 0)].iloc[0]
    assert round(recv["duration_us"], 6) == round(119807.691986 - 119707.677979, 6)
    # the COLL span's end was cut out of the sample: it stays open, like a hung collective
    assert sp[(sp["cat"] == "COLL") & (sp["id"] == 0)]["end_us"].isna().all()
    assert r.facts["open_spans"] == 5


def test_profiler_trace_strict_json_and_garbage():
    strict = b'[{"name":"AllReduce","cat":"COLL","ph":"b","id":3,"pid":1,"tid":2,"ts":1.5,"args":{"SeqNum":7}},' \
             b'{"name":"AllReduce","cat":"COLL","ph":"e","id":3,"pid":1,"tid":2,"ts":4.0}]'
    r = NcclProfilerTraceParser.parse(strict)
    assert r.warnings == [] and r.tables["profiler_spans"].iloc[0]["duration_us"] == 2.5
    assert r.tables["profiler_events"]["line"].isna().all()
    r = NcclProfilerTraceParser.parse(b'[\n{"name": "x", "ph": \n{{{\n]')
    assert len(r.warnings) == 3 and len(r.tables["profiler_events"]) == 0
