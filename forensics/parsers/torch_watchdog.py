"""PyTorch ProcessGroupNCCL watchdog lines in training logs (timeouts, exceptions, FR dumps).

c10 log prefix ``[rank<N>]:[<E|W|I><MMDD> <HH:MM:SS.ns> <file>:<line>]`` (older:
``[E ProcessGroupNCCL.cpp:458]``), anywhere in the line (launchers and line numbers
may precede it). Messages read:

- ``[Rank r] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=…,
  OpType=…, [NumelIn=…, NumelOut=…,] Timeout(ms)=…) ran for … milliseconds before
  timing out.`` (also inside ``Process group watchdog thread terminated with exception:``)
- ``[PG <tag> Rank r] Exception (either an error or timeout) detected by watchdog at
  work: <seq>, last enqueued NCCL work: <n>, last completed NCCL work: <n>.``
- ``… timed out after waiting for <ms>ms flight recorder dumps to finish.``
- dump signals from another rank, the teardown messages, and the watchdog-stuck
  (heartbeat) message.

The PG tag forms: ``PG 1``, ``PG ID 0 PG GUID 0(default_pg)``, none. SeqNum is the
Flight Recorder ``collective_seq_id`` of that PG. A line naming ``WorkNCCL(`` whose
fields do not parse is warned about; other log lines are ignored.

Table ``watchdog`` (one row per recognised line):
    line (int), kind (timeout|exception|terminated|fr_dump_wait|dump_signal|teardown|
    watchdog_stuck), severity (E|W|I|F), log_time (str ``MMDD HH:MM:SS.frac``), src_file
    (str), src_line (int), rank (int: from ``[rankN]`` or ``[Rank N]``), pg_id (int),
    pg_guid (str), pg_desc (str), seq_num (int), op_type (str as printed, e.g.
    ALLREDUCE, _REDUCE_SCATTER_BASE), op (str: ALL_REDUCE, REDUCE_SCATTER, …), numel_in,
    numel_out, timeout_ms, ran_for_ms (int), last_enqueued, last_completed (int),
    peer_rank (int: the rank named by a dump signal), wait_ms (int: FR dump wait),
    message (str).

Facts: timeouts ({rank: seq_num} of the first timeout per rank), ranks (sorted).
"""
from __future__ import annotations

import re

from .registry import Parser, WarningLog, decode_text, looks_binary, register, split_lines

PREFIX_RE = re.compile(r"(?:\[rank(?P<prank>\d+)\]:)?\[(?P<sev>[EWIF])(?P<date>\d{3,4})? ?(?P<time>[\d:.]+)? ?"
                       r"(?P<file>[\w.]+\.(?:cpp|cc|hpp|h|py)):(?P<srcline>\d+)\] ?(?P<msg>.*)$")
PG_TAG_RE = re.compile(r"\[(?:PG (?:ID )?(?P<pg>\d+)(?: PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)]*)\))?)? )?"
                       r"Rank (?P<rank>\d+)\]")
WORK_RE = re.compile(r"WorkNCCL\((?P<fields>.*)\)\s+ran for (?P<ran>\d+) milliseconds")
FIELD_RE = re.compile(r"(?P<k>[A-Za-z]+(?:\(ms\))?)=(?P<v>[^,]+?)(?=,|$)")
EXC_RE = re.compile(r"detected by watchdog at work: (?P<seq>-?\d+), last enqueued NCCL work: (?P<enq>-?\d+), "
                    r"last completed NCCL work: (?P<done>-?\d+)")
FR_WAIT_RE = re.compile(r"timed out after waiting for (?P<ms>\d+)ms flight recorder dumps")
DUMP_SIGNAL_RE = re.compile(r"(?:dump signal|flight recorder dump signal).*?(?:from rank|rank) (?P<peer>\d+)", re.I)
STUCK_RE = re.compile(r"watchdog got stuck for (?P<s>\d+) seconds|Heartbeat monitor timed out", re.I)
TEARDOWN_RE = re.compile(r"Some NCCL operations have failed or timed out|taking the entire process down")
OP_TYPES = {"ALLREDUCE": "ALL_REDUCE", "ALLGATHER": "ALL_GATHER", "_ALLGATHER_BASE": "ALL_GATHER",
            "ALLGATHER_COALESCED": "ALL_GATHER", "REDUCE_SCATTER": "REDUCE_SCATTER",
            "_REDUCE_SCATTER_BASE": "REDUCE_SCATTER", "REDUCE_SCATTER_TENSOR_COALESCED": "REDUCE_SCATTER",
            "BROADCAST": "BROADCAST", "REDUCE": "REDUCE", "SEND": "SEND", "RECV": "RECV", "RECVANYSOURCE": "RECV",
            "ALLTOALL": "ALL_TO_ALL", "ALLTOALL_BASE": "ALL_TO_ALL", "BARRIER": "BARRIER", "GATHER": "GATHER",
            "SCATTER": "SCATTER", "COALESCED": "COALESCED"}


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class TorchWatchdogParser(Parser):
    NAME = "torch_watchdog"
    DESCRIPTION = "PyTorch ProcessGroupNCCL watchdog timeout/exception lines"
    GLOBS = ("logs/*", "logs/**/*")
    SCHEMAS = {"watchdog": {
        "line": "int", "kind": "str", "severity": "str", "log_time": "str", "src_file": "str", "src_line": "int",
        "rank": "int", "pg_id": "int", "pg_guid": "str", "pg_desc": "str", "seq_num": "int", "op_type": "str",
        "op": "str", "numel_in": "int", "numel_out": "int", "timeout_ms": "int", "ran_for_ms": "int",
        "last_enqueued": "int", "last_completed": "int", "peer_rank": "int", "wait_ms": "int", "message": "str"}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        return bool(re.search(r"ProcessGroupNCCL\.cpp:\d+\]|Watchdog caught collective operation timeout", t))

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        log = WarningLog(label)
        facts = {"timeouts": {}, "ranks": []}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, {}, facts, log)
        if looks_binary(data):
            log.add(None, "binary data, not a text log")
            return cls.result(label, {}, facts, log)
        rows = []
        for ln, raw in enumerate(split_lines(decode_text(data)), 1):
            if "WorkNCCL" not in raw and "watchdog" not in raw.lower() and "flight recorder" not in raw.lower() \
                    and "ProcessGroupNCCL" not in raw:
                continue
            row = _parse_line(raw, ln, log)
            if row is not None:
                rows.append(row)
        for r in rows:
            if r["kind"] == "timeout" and r.get("rank") is not None and r.get("seq_num") is not None:
                facts["timeouts"].setdefault(r["rank"], r["seq_num"])
        facts["ranks"] = sorted({r["rank"] for r in rows if r.get("rank") is not None})
        if not rows:
            log.add(None, "no watchdog lines found")
        return cls.result(label, {"watchdog": rows}, facts, log)


def _parse_line(raw: str, ln: int, log: WarningLog) -> dict | None:
    m = PREFIX_RE.search(raw)
    row: dict = {"line": ln}
    if m:
        msg = m["msg"]
        row.update(severity=m["sev"], src_file=m["file"], src_line=int(m["srcline"]),
                   log_time=f"{m['date']} {m['time']}" if m["date"] and m["time"] else None,
                   rank=_int(m["prank"]))
    else:
        msg = raw.strip()
        if msg.startswith("what():"):
            msg = msg[len("what():"):].strip()
    row["message"] = msg.strip()
    if (t := PG_TAG_RE.search(msg)):
        row["pg_id"] = _int(t["pg"])
        row["pg_guid"], row["pg_desc"] = t["guid"], t["desc"]
        row["rank"] = row.get("rank") if row.get("rank") is not None else _int(t["rank"])
    if "WorkNCCL(" in msg:
        w = WORK_RE.search(msg)
        fields = {f["k"]: f["v"].strip() for f in FIELD_RE.finditer(w["fields"])} if w else {}
        if not w or "SeqNum" not in fields or _int(fields.get("SeqNum")) is None:
            log.add(ln, f"unreadable WorkNCCL(...) description: {raw.strip()[:160]!r}")
            return None
        row["kind"] = "terminated" if "watchdog thread terminated" in msg else "timeout"
        row["seq_num"] = _int(fields.get("SeqNum"))
        row["op_type"] = fields.get("OpType")
        row["op"] = OP_TYPES.get((fields.get("OpType") or "").upper(), fields.get("OpType"))
        row["numel_in"], row["numel_out"] = _int(fields.get("NumelIn")), _int(fields.get("NumelOut"))
        row["timeout_ms"] = _int(fields.get("Timeout(ms)"))
        row["ran_for_ms"] = _int(w["ran"])
        # the inner "[Rank N]" of a terminated line names the rank too
        if row.get("rank") is None and (r := re.search(r"\[Rank (\d+)\]", msg)):
            row["rank"] = int(r[1])
        return row
    if (e := EXC_RE.search(msg)):
        row.update(kind="exception", seq_num=int(e["seq"]), last_enqueued=int(e["enq"]),
                   last_completed=int(e["done"]))
        return row
    if (f := FR_WAIT_RE.search(msg)):
        row.update(kind="fr_dump_wait", wait_ms=int(f["ms"]))
        return row
    if (d := DUMP_SIGNAL_RE.search(msg)):
        row.update(kind="dump_signal", peer_rank=int(d["peer"]))
        return row
    if STUCK_RE.search(msg):
        row["kind"] = "watchdog_stuck"
        return row
    if TEARDOWN_RE.search(msg):
        row["kind"] = "teardown"
        return row
    return None


register(TorchWatchdogParser)
