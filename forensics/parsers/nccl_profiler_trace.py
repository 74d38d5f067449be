"""Chrome-trace output of NCCL's example profiler plugin (``NCCL_PROFILE_DUMP_FILE``).

A JSON array of async ``"ph": "b"/"e"`` events (cat GROUP_API, COLL_API, KERNEL_LAUNCH,
GROUP, COLL, P2P, PROXY, NET, GPU), one per line. Older plugin builds (and the README
sample) are not strict JSON: unquoted pointers and enum names (``"Stream":
0x5020…``, ``"datatype": ncclFloat32``), typographic quotes, a truncation marker line.
A whole file that parses as JSON is taken as is; otherwise each line is read on its
own, repaired where the fault is one of those (with one warning per repaired line),
and skipped with a warning if still unreadable. Note the plugin's COLL ``e`` event
means *enqueued*, not completed: completion is the last ProxyOp/KernelCh stop.

Tables:

``profiler_events`` -- one row per event: line (int, NA when the file was strict
    JSON), name, cat, ph (str), id (int), pid, tid (int), ts_us (float, µs since the
    plugin's start), seq (int: SeqNum), comm_hash (str: CommHash as 0x hex), rank,
    count (int), datatype, algorithm, protocol (str), nchannels, channel, peer, step
    (int), args (str: all args as JSON).
``profiler_spans`` -- ``b`` and ``e`` events paired per (pid, tid, cat, name, id), in
    order: name, cat, id, pid, tid, start_us, end_us, duration_us (float; NA end for
    spans still open at the end of the file, e.g. a hang), seq, comm_hash, rank (from
    the ``b`` event).

Facts: events (int), open_spans (int), repaired_lines (int), comm_hashes (list).
"""
from __future__ import annotations

import json
import re

from ..coerce import json_int
from .registry import Parser, WarningLog, decode_text, looks_binary, register, split_lines

BARE_VALUE_RE = re.compile(r'(:\s*)(0x[0-9a-fA-F]+|[A-Za-z_][A-Za-z0-9_]*)(\s*[,}])')
ARG_COLS = {"SeqNum": "seq", "Rank": "rank", "Count": "count", "count": "count", "Datatype": "datatype",
            "datatype": "datatype", "Algorithm": "algorithm", "Protocol": "protocol", "nChannels": "nchannels",
            "Channel": "channel", "Peer": "peer", "Step": "step"}
INT_ARGS = {"seq", "rank", "count", "nchannels", "channel", "peer", "step"}


def _repair(line: str) -> str:
    line = line.replace("\u201c", '"').replace("\u201d", '"')

    def quote(m):
        v = m[2]
        return m[0] if v in ("true", "false", "null") else f'{m[1]}"{v}"{m[3]}'
    return BARE_VALUE_RE.sub(quote, line)


class NcclProfilerTraceParser(Parser):
    STRUCTURED = True     # a whole file of its own format
    NAME = "nccl_profiler_trace"
    DESCRIPTION = "NCCL example profiler plugin Chrome trace (b/e events per collective, proxy op, net step)"
    GLOBS = ("logs/nccl-profile*", "nccl-profile*/*", "*nccl_profile*", "*nccl-profile*")
    SCHEMAS = {
        "profiler_events": {"line": "int", "name": "str", "cat": "str", "ph": "str", "id": "int", "pid": "int",
                            "tid": "int", "ts_us": "float", "seq": "int", "comm_hash": "str", "rank": "int",
                            "count": "int", "datatype": "str", "algorithm": "str", "protocol": "str",
                            "nchannels": "int", "channel": "int", "peer": "int", "step": "int", "args": "str"},
        "profiler_spans": {"name": "str", "cat": "str", "id": "int", "pid": "int", "tid": "int",
                           "start_us": "float", "end_us": "float", "duration_us": "float", "seq": "int",
                           "comm_hash": "str", "rank": "int"},
    }

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        return bool(re.search(r'"cat":\s*"(?:GROUP_API|COLL_API|COLL|PROXY|NET|GPU|KERNEL_LAUNCH|GROUP|P2P)"', t)
                    and '"ph"' in t)

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        log = WarningLog(label)
        facts = {"events": 0, "open_spans": 0, "repaired_lines": 0, "comm_hashes": []}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, {}, facts, log)
        if looks_binary(data):
            log.add(None, "binary data, not a profiler trace")
            return cls.result(label, {}, facts, log)
        text = decode_text(data)
        events: list[tuple[int | None, object]] = []
        try:
            doc = json.loads(text)
            items = doc.get("traceEvents") if isinstance(doc, dict) else doc
            if not isinstance(items, list):
                raise ValueError("not a list of events")
            events = [(None, e) for e in items]
        except (json.JSONDecodeError, ValueError):
            for ln, raw in enumerate(split_lines(text), 1):
                line = raw.strip().rstrip(",").strip()
                if line in ("", "[", "]", "{}", "{}]", "[{}", "[]"):
                    continue
                if line.startswith("["):
                    line = line[1:].strip()
                if line.endswith("]") and line.count("[") < line.count("]"):
                    line = line[:-1].rstrip().rstrip(",")
                if not line.startswith(("{", "\u201c")) and "{" not in line[:3]:
                    log.add(ln, f"not a trace event: {line[:80]!r}")
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    fixed = _repair(line)
                    try:
                        obj = json.loads(fixed)
                    except json.JSONDecodeError as e:
                        log.add(ln, f"unreadable trace event ({e.msg}): {line[:80]!r}")
                        continue
                    facts["repaired_lines"] += 1
                    log.add(ln, "event is not strict JSON (unquoted value or curly quote); repaired")
                events.append((ln, obj))
        rows = []
        for ln, e in events:
            if not isinstance(e, dict) or not e:
                continue
            if not isinstance(e.get("ph"), str) or not isinstance(e.get("name"), str):
                log.add(ln, "event without name/ph")
                continue
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            row = {"line": ln, "name": e["name"], "cat": e.get("cat") if isinstance(e.get("cat"), str) else None,
                   "ph": e["ph"], "id": json_int(e.get("id")), "pid": json_int(e.get("pid")), "tid": json_int(e.get("tid")),
                   "ts_us": e.get("ts") if isinstance(e.get("ts"), (int, float)) and not isinstance(e.get("ts"), bool)
                   else None, "args": json.dumps(args) if args else None}
            for k, col in ARG_COLS.items():
                if k in args:
                    row[col] = json_int(args[k]) if col in INT_ARGS else str(args[k])
            ch = args.get("CommHash")
            if isinstance(ch, int) and not isinstance(ch, bool) and ch >= 0:
                row["comm_hash"] = f"0x{ch:x}"
            elif isinstance(ch, str):
                row["comm_hash"] = ch
            rows.append(row)
        spans = _pair(rows)
        facts["events"] = len(rows)
        facts["open_spans"] = sum(1 for s in spans if s["end_us"] is None)
        facts["comm_hashes"] = sorted({r["comm_hash"] for r in rows if r.get("comm_hash")})
        if not rows:
            log.add(None, "no trace events found")
        return cls.result(label, {"profiler_events": rows, "profiler_spans": spans}, facts, log)


def _pair(rows: list[dict]) -> list[dict]:
    """Match each ``b`` with the next ``e`` of the same (pid, tid, cat, name, id): the k-th
    begin of a key with its k-th end, in the order of the begins. A dict of queues, not a
    grouped merge: a trace is a few thousand events and pandas' fixed costs dominated."""
    ends: dict[tuple, list] = {}
    for r in rows:
        if r["ph"] == "e":
            ends.setdefault(_key(r), []).append(r["ts_us"])
    seen: dict[tuple, int] = {}
    out = []
    for r in rows:
        if r["ph"] != "b":
            continue
        k = _key(r)
        n = seen.get(k, 0)
        seen[k] = n + 1
        got = ends.get(k, ())
        start = None if r["ts_us"] is None else float(r["ts_us"])
        end = float(got[n]) if n < len(got) and got[n] is not None else None
        out.append({"name": r["name"], "cat": r["cat"] or None, "id": r["id"], "pid": r["pid"], "tid": r["tid"],
                    "start_us": start, "end_us": end,
                    "duration_us": end - start if start is not None and end is not None else None,
                    "seq": r.get("seq"), "comm_hash": r.get("comm_hash"), "rank": r.get("rank")})
    return out


def _key(r: dict) -> tuple:
    # None and "" are one key, as an absent field is
    return tuple("" if r[k] is None else r[k] for k in ("pid", "tid", "cat", "name", "id"))


register(NcclProfilerTraceParser)
