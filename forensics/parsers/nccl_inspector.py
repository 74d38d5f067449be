"""NCCL Inspector profiler-plugin output (``<dir>/<host>-pid<pid>.log``, format v4.0).

JSON Lines: one compact object per completed collective (``coll_perf``) or p2p op
(``p2p_perf``, NCCL master) per communicator, with ``header`` (comm id hash, rank,
n_ranks, nnodes, optional comm_name) and ``metadata`` (hostname, pid, dump timestamp,
format version, git rev, rec_mechanism). Pretty-printed objects one after another (the
README's form) are read too. Only completed ops are written, so the last ``seq`` per
(comm, rank) is the hang signal. The Prometheus textfile mode
(``nccl_bus_bandwidth_gbs{…} 678.263``) is read into a second table.

Tables:

``inspector_coll`` -- one row per record:
    line (int: first line of the object), comm_id (str ``0x…``), comm_name (str), rank,
    nranks, nnodes (int), hostname (str), pid (int), dump_timestamp_us (int),
    format_version, git_rev, rec_mechanism (str), kind (coll|p2p), op (str: ALL_REDUCE …
    SEND, RECV), op_name (as written), seq (int: coll_sn / p2p_sn), peer (int, p2p),
    msg_size_bytes (int), exec_time_us (float), timing_source (kernel_gpu|kernel_cpu|
    collective_cpu), algo, proto (str, when written), algobw_gbps, busbw_gbps (float),
    start_ts_us, stop_ts_us (int: verbose ``event_trace_ts`` coll_start/stop),
    kernel_start_ts_us, kernel_stop_ts_us (int: earliest kernel start / latest kernel
    stop over channels, verbose only), kernel_channels (int).
``inspector_metrics`` -- Prometheus lines: line, metric (str), value (float), node, gpu,
    comm_name, collective (str: collective or p2p_operation), message_size, algo_proto,
    n_nodes, nranks, version, slurm_job_id (str), labels (str: all labels as JSON).

Facts: records (int), comms (list of comm ids), last_seq ({"<comm_id>:<rank>": int}),
hostnames, pids.
"""
from __future__ import annotations

import json
import re

from .nccl_coll import op_enum
from .registry import Parser, WarningLog, decode_text, looks_binary, register

PROM_RE = re.compile(r"^(?P<metric>[a-zA-Z_:][\w:]*)\{(?P<labels>.*)\}\s+(?P<value>\S+)(?:\s+\d+)?\s*$")
LABEL_RE = re.compile(r'(?P<k>\w+)="(?P<v>(?:[^"\\]|\\.)*)"')
PROM_COLS = ("node", "gpu", "comm_name", "message_size", "algo_proto", "n_nodes", "nranks", "version",
             "slurm_job_id")


def _num(v, kind=float):
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return kind(v) if kind is float or float(v).is_integer() else None
    return None


class NcclInspectorParser(Parser):
    STRUCTURED = True     # a whole file of its own format
    NAME = "nccl_inspector"
    DESCRIPTION = "NCCL Inspector plugin JSONL (per-collective bus bandwidth and exec time)"
    GLOBS = ("logs/nccl-inspector*/*", "nccl-inspector*/*", "*inspector*/*.log", "*-pid*.log")
    SCHEMAS = {
        "inspector_coll": {"line": "int", "comm_id": "str", "comm_name": "str", "rank": "int", "nranks": "int",
                           "nnodes": "int", "hostname": "str", "pid": "int", "dump_timestamp_us": "int",
                           "format_version": "str", "git_rev": "str", "rec_mechanism": "str", "kind": "str",
                           "op": "str", "op_name": "str", "seq": "int", "peer": "int", "msg_size_bytes": "int",
                           "exec_time_us": "float", "timing_source": "str", "algo": "str", "proto": "str",
                           "algobw_gbps": "float", "busbw_gbps": "float", "start_ts_us": "int",
                           "stop_ts_us": "int", "kernel_start_ts_us": "int", "kernel_stop_ts_us": "int",
                           "kernel_channels": "int"},
        "inspector_metrics": {"line": "int", "metric": "str", "value": "float", "node": "str", "gpu": "str",
                              "comm_name": "str", "collective": "str", "message_size": "str",
                              "algo_proto": "str", "n_nodes": "str", "nranks": "str", "version": "str",
                              "slurm_job_id": "str", "labels": "str"},
    }

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        return ('"inspector_output_format_version"' in t or ('"coll_perf"' in t and '"header"' in t)
                or bool(re.search(r"(?m)^nccl_(?:p2p_)?(?:bus_bandwidth_gbs|collective_exec_time_microseconds)\{", t)))

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        log = WarningLog(label)
        facts = {"records": 0, "comms": [], "last_seq": {}, "hostnames": [], "pids": []}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, {}, facts, log)
        if looks_binary(data):
            log.add(None, "binary data, not Inspector JSONL")
            return cls.result(label, {}, facts, log)
        text = decode_text(data)
        rows, metrics = [], []
        dec = json.JSONDecoder()
        pos, n = 0, len(text)
        while pos < n:
            while pos < n and text[pos].isspace():
                pos += 1
            if pos >= n:
                break
            ln = text.count("\n", 0, pos) + 1
            if text[pos] == "{":
                try:
                    obj, end = dec.raw_decode(text, pos)
                except json.JSONDecodeError as e:
                    log.add(ln, f"invalid JSON record: {e.msg}")
                    pos = _next_line(text, pos)
                    continue
                pos = end
                row = _record(obj, ln, log)
                if row is not None:
                    rows.append(row)
                continue
            eol = _next_line(text, pos)
            line = text[pos:eol].strip()
            pos = eol
            if line.startswith("#"):
                continue
            if (m := PROM_RE.match(line)):
                try:
                    value = float(m["value"])
                except ValueError:
                    log.add(ln, f"metric value is not a number: {line[:120]!r}")
                    continue
                labels = {x["k"]: x["v"] for x in LABEL_RE.finditer(m["labels"])}
                metrics.append({"line": ln, "metric": m["metric"], "value": value,
                                "collective": labels.get("collective", labels.get("p2p_operation")),
                                **{k: labels.get(k) for k in PROM_COLS}, "labels": json.dumps(labels)})
                continue
            log.add(ln, f"neither a JSON record nor a metric line: {line[:120]!r}")
        facts["records"] = len(rows)
        for r in rows:
            if r.get("comm_id") and r["comm_id"] not in facts["comms"]:
                facts["comms"].append(r["comm_id"])
            if r.get("comm_id") is not None and r.get("rank") is not None and r.get("seq") is not None:
                key = f"{r['comm_id']}:{r['rank']}"
                facts["last_seq"][key] = max(facts["last_seq"].get(key, -1), r["seq"])
        facts["hostnames"] = sorted({r["hostname"] for r in rows if r.get("hostname")})
        facts["pids"] = sorted({r["pid"] for r in rows if r.get("pid") is not None})
        if not rows and not metrics:
            log.add(None, "no Inspector records found")
        return cls.result(label, {"inspector_coll": rows, "inspector_metrics": metrics}, facts, log)


def _next_line(text: str, pos: int) -> int:
    i = text.find("\n", pos)
    return len(text) if i < 0 else i + 1


def _record(obj, ln: int, log: WarningLog) -> dict | None:
    if not isinstance(obj, dict):
        log.add(ln, "record is not a JSON object")
        return None
    hdr = obj.get("header") if isinstance(obj.get("header"), dict) else {}
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    if isinstance(obj.get("coll_perf"), dict):
        perf, kind, p = obj["coll_perf"], "coll", "coll"
    elif isinstance(obj.get("p2p_perf"), dict):
        perf, kind, p = obj["p2p_perf"], "p2p", "p2p"
    else:
        log.add(ln, "record has neither coll_perf nor p2p_perf")
        return None
    if not hdr:
        log.add(ln, "record has no header (communicator and rank unknown)")
    name = perf.get(p)
    if not isinstance(name, str):
        log.add(ln, f"record has no {p} name")
        return None
    seq = _num(perf.get(f"{p}_sn"), int)
    if seq is None:
        log.add(ln, f"record has no integer {p}_sn")
    row = {"line": ln, "comm_id": hdr.get("id") if isinstance(hdr.get("id"), str) else None,
           "comm_name": hdr.get("comm_name") if isinstance(hdr.get("comm_name"), str) else None,
           "rank": _num(hdr.get("rank"), int), "nranks": _num(hdr.get("n_ranks"), int),
           "nnodes": _num(hdr.get("nnodes"), int),
           "hostname": meta.get("hostname") if isinstance(meta.get("hostname"), str) else None,
           "pid": _num(meta.get("pid"), int), "dump_timestamp_us": _num(meta.get("dump_timestamp_us"), int),
           "format_version": meta.get("inspector_output_format_version"), "git_rev": meta.get("git_rev"),
           "rec_mechanism": meta.get("rec_mechanism"), "kind": kind, "op_name": name, "op": op_enum(name),
           "seq": seq, "peer": _num(perf.get("p2p_peer"), int),
           "msg_size_bytes": _num(perf.get(f"{p}_msg_size_bytes"), int),
           "exec_time_us": _num(perf.get(f"{p}_exec_time_us")),
           "timing_source": perf.get(f"{p}_timing_source"),
           "algo": perf.get(f"{p}_algo", perf.get("algo")), "proto": perf.get(f"{p}_proto", perf.get("proto")),
           "algobw_gbps": _num(perf.get(f"{p}_algobw_gbs")), "busbw_gbps": _num(perf.get(f"{p}_busbw_gbs"))}
    for k in ("format_version", "git_rev", "rec_mechanism", "timing_source", "algo", "proto"):
        if row[k] is not None and not isinstance(row[k], str):
            row[k] = str(row[k])
    ts = perf.get("event_trace_ts")
    if isinstance(ts, dict):
        row["start_ts_us"] = _num(ts.get(f"{p}_start_ts"), int)
        row["stop_ts_us"] = _num(ts.get(f"{p}_stop_ts"), int)
        kev = [k for k in ts.get("kernel_events") or [] if isinstance(k, dict)]
        starts = [v for k in kev if (v := _num(k.get("kernel_start_ts"), int)) is not None]
        stops = [v for k in kev if (v := _num(k.get("kernel_stop_ts"), int)) is not None]
        row["kernel_start_ts_us"] = min(starts) if starts else None
        row["kernel_stop_ts_us"] = max(stops) if stops else None
        row["kernel_channels"] = len(kev)
    return row


register(NcclInspectorParser)
