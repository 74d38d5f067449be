"""PyTorch ProcessGroupNCCL lines in a job's output: watchdog timeouts, NCCL errors, dumps.

c10 log prefix ``[rank<N>]:[<E|W|I|F><MMDD> <HH:MM:SS.ns> <file>:<line>]`` (older:
``[E ProcessGroupNCCL.cpp:458]``, ``[E ProcessGroupNCCL.hpp:...]``; glog's, in builds logging
through it: ``E0927 12:07:22.643702 1012209 ProcessGroupNCCL.cpp:1356]``), anywhere in the line:
launchers, line numbers and progress bars may precede it (their tags are read by
:mod:`.lines`). Messages read (PyTorch 1.8 to 2.x):

- ``[Rank r] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=…, OpType=…,
  [NumelIn=…, NumelOut=…,] Timeout(ms)=…) ran for … milliseconds before timing out.``;
  PyTorch < 1.10 prints no SeqNum (``WorkNCCL(OpType=…, Timeout(ms)=…)``); also inside
  ``Process group watchdog thread terminated with exception:`` and ``what():``;
- ``[PG <tag> Rank r] Exception (either an error or timeout) detected by watchdog at work:
  <seq>, last enqueued NCCL work: <n>, last completed NCCL work: <n>.`` (kind exception) and
  ``Timeout at NCCL work: …`` (the same three numbers; kind timeout: that work timed out, its
  op type and time run unknown);
- ``NCCL error in: <file>:<line>, <error>, NCCL version <v>`` / ``NCCL error: <error>, NCCL
  version <v>`` (DistBackendError, the watchdog's own; ``NCCL Error 2: <error>`` in the
  C10D_NCCL_CHECK form), the ``ncclRemoteError: …`` explanation line after it, and the ``Last
  error:`` line after that (NCCL's last WARN, without its prefix); a source line of a traceback
  that only formats such a message (``f"NCCL error: {error_str}"``) is not one;
- XLA's (JAX, TensorFlow) ``NCCL operation ncclCommInitRank(&comm, …) failed: <error>`` and
  Horovod's ``ncclCommInitRank failed: <error>`` (an NCCL call and one of NCCL's own error
  strings; kind nccl_error, the error named after the call); the WARN text XLA quotes after it
  (``Last NCCL warning(error) log entry (may be unrelated) '…'``) is a ``last_error`` row too;
- a dump signal ``from rank N`` (rank N timed out first) with, since 2.5, this rank's own
  ``Last enqueued NCCL work: E, last completed NCCL work: C``; the watchdog stuck (heartbeat),
  ``… flight recorder dumps to finish``, the teardown, ``NCCL communicator was aborted``;
  ``ProcessGroupNCCL preparing to dump debug info`` (a dump asked for: kind dump_signal);
- the c10d store's ``store->get(...) got error`` while exchanging the ncclUniqueId.

The PG tag forms: ``PG 1``, ``PG ID 0 PG GUID 0(default_pg)``, none. SeqNum is the Flight
Recorder ``collective_seq_id`` of that PG. A line hard-wrapped by a terminal is joined with
the lines after it when they complete it. A line naming ``WorkNCCL(`` whose fields do not
parse even then is warned about; other log lines are ignored.

Table ``watchdog`` (one row per recognised line):
    line (int), kind (timeout|exception|terminated|nccl_error|last_error|fr_dump_wait|
    dump_signal|teardown|watchdog_stuck|aborted|store_error), severity (E|W|I|F), log_time
    (str ``MMDD HH:MM:SS.frac``), src_file (str), src_line (int), rank (int: from ``[rankN]``
    or ``[Rank N]``), pg_id (int), pg_guid (str), pg_desc (str), seq_num (int), op_type (str as
    printed, e.g. ALLREDUCE, _REDUCE_SCATTER_BASE), op (str: ALL_REDUCE, REDUCE_SCATTER, …),
    numel_in, numel_out, timeout_ms, ran_for_ms (int), last_enqueued, last_completed (int),
    peer_rank (int: the rank named by a dump signal), wait_ms (int: FR dump wait), error (str:
    NCCL's error text), nccl_version (str), message (str), and the launcher context
    (ctx_rank, ctx_local_rank, ctx_host, ctx_pid, ctx_clock: :mod:`.lines`).

Facts: timeouts ({rank: seq_num} of the first timeout per rank), ranks (sorted),
nccl_version (the first an error line names).
"""
from __future__ import annotations

import re

from . import lines as lines_mod
from ..coerce import text_int
from .heads import CODE_MARKERS
from .registry import WarningLog, register
from .text import LogText, TextParser

PREFIX_RE = re.compile(r"(?:\[rank(?P<prank>\d+)\]:)?(?:\[|\b(?=[EWIF]\d{4} [\d:.]+ +\d+ ))"
                       r"(?P<sev>[EWIF])(?P<date>\d{3,4})? ?(?P<time>[\d:.]+)? *(?:\d+ )?"
                       r"(?P<file>[\w.]+\.(?:cpp|cc|hpp|h|py)):(?P<srcline>\d+)\] ?(?P<msg>.*)$")
PG_TAG_RE = re.compile(r"\[(?:PG (?:ID )?(?P<pg>\d+)(?: PG GUID (?P<guid>[^\s(\]]+)(?:\((?P<desc>[^)]*)\))?)? )?"
                       r"Rank (?P<rank>\d+)\]")
WORK_RE = re.compile(r"WorkNCCL\((?P<fields>.*?)\)\s+ran for (?P<ran>\d+) milliseconds")
FIELD_RE = re.compile(r"(?P<k>[A-Za-z]+(?:\(ms\))?)=(?P<v>[^,]+?)(?=,|$)")
# "detected by watchdog at work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752."
# (2.4-2.6), "Timeout at NCCL work: ..." (2.2-2.6), "failure detected by watchdog at work sequence id: 493
# PG status: last enqueued work: 493, last completed work: 492" (2.6+)
EXC_RE = re.compile(r"(?:detected by watchdog at work(?: sequence id)?|Timeout at NCCL work):? (?P<seq>-?\d+),?"
                    r"(?: PG status:)? last enqueued (?:NCCL )?work: (?P<enq>-?\d+), last completed (?:NCCL )?work: "
                    r"(?P<done>-?\d+)")
NCCL_ERROR_RE = re.compile(r"NCCL [Ee]rror(?: \d+)?(?: in: (?P<where>[^,]+),| ?:)? ?(?P<err>.*?)(?:, NCCL version "
                           r"(?P<version>[\w.+-]+))?\s*$")
NCCL_ERROR_AT_RE = re.compile(r"NCCL [Ee]rror\b")
# XLA (JAX, TensorFlow): "NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled cuda error";
# Horovod: "ncclCommInitRank failed: unhandled cuda error" (an NCCL call, then one of ncclGetErrorString's texts)
ERROR_STRINGS = ("unhandled cuda error", "unhandled system error", "internal error", "invalid argument",
                 "invalid usage", "remote process exited")
NCCL_STRINGS = tuple(b"failed: " + t.encode() for t in ERROR_STRINGS)
CALL_FAILED_RE = re.compile(r"\b(?P<call>nccl[A-Z]\w*)(?:\([^)]*\))? failed: (?P<err>(?:"
                            + "|".join(map(re.escape, ERROR_STRINGS)) + r")[^;]*?)(?:\.? Last NCCL|;|\.?\s*$)")
CALL_CUT_RE = re.compile(r"\bnccl[A-Z]\w*(?:\([^)]*\))? failed:\s*$")
# XLA's error goes on with NCCL's last WARN text, quoted: "Last NCCL warning(error) log entry (may
# be unrelated) 'socketTryAccept: Accept failed: Bad file descriptor'."
XLA_LAST_RE = re.compile(r"Last\s*NCCL\s*warning(?:\(error\))?\s*log\s*entry(?:\s*\(may\s*be\s*unrelated\))?\s*"
                         r"'(?P<text>[^']+)'")
PLACEHOLDER_RE = re.compile(r"\{[\w.\[\]]*\}|%[sd]\b")     # a message being formatted: source code, not a log
NCCL_CODE_RE = re.compile(r"\b(?P<code>nccl(?:Remote|System|Internal|UnhandledCuda|InvalidUsage|InvalidArgument)"
                          r"Error): (?P<text>.*)$")
FR_WAIT_RE = re.compile(r"timed out after waiting for (?P<ms>\d+)ms flight recorder dumps")
DUMP_SIGNAL_RE = re.compile(r"(?:dump signal|flight recorder dump signal|global timeout).*?(?:from rank|rank) "
                            r"(?P<peer>\d+)", re.I)
DUMP_WORK_RE = re.compile(r"Last enqueued NCCL work: (?P<enq>-?\d+), last completed NCCL work: (?P<done>-?\d+)")
DUMP_ANY_RE = re.compile(r"(?:Received|Observed) (?:a )?(?:dump signal|flight recorder dump signal|global timeout)"
                         r"|ProcessGroupNCCL preparing to dump debug info", re.I)
STUCK_RE = re.compile(r"watchdog got stuck for (?P<s>\d+) seconds|Heartbeat monitor timed out"
                      r"|[Ww]atchdog (?:thread )?(?:is )?(?:stuck|hang)", re.I)
TEARDOWN_RE = re.compile(r"Some NCCL operations have failed or timed out|taking the entire process down")
ABORTED_RE = re.compile(r"NCCL communicator was aborted(?: on rank (?P<rank>\d+))?|ncclCommAbort", re.I)
STORE_RE = re.compile(r"store->get\((?P<key>[^)]*)\) got error: (?P<err>.*)$|ncclUniqueId from \[(?P<root>\d+)\]")
OP_TYPES = {"ALLREDUCE": "ALL_REDUCE", "ALLGATHER": "ALL_GATHER", "_ALLGATHER_BASE": "ALL_GATHER",
            "ALLGATHER_COALESCED": "ALL_GATHER", "ALLGATHER_INTO_TENSOR_COALESCED": "ALL_GATHER",
            "REDUCE_SCATTER": "REDUCE_SCATTER", "_REDUCE_SCATTER_BASE": "REDUCE_SCATTER",
            "REDUCE_SCATTER_TENSOR_COALESCED": "REDUCE_SCATTER", "BROADCAST": "BROADCAST", "REDUCE": "REDUCE",
            "SEND": "SEND", "RECV": "RECV", "RECVANYSOURCE": "RECV", "ALLTOALL": "ALL_TO_ALL",
            "ALLTOALL_BASE": "ALL_TO_ALL", "BARRIER": "BARRIER", "GATHER": "GATHER", "SCATTER": "SCATTER",
            "COALESCED": "COALESCED", "ALLREDUCE_COALESCED": "ALL_REDUCE"}
# literal markers of the lines read (each found with memmem, :mod:`.text`); of NCCL's lower-case
# names only those an expression below reads (a bare b"nccl" selected every NCCL INFO line that
# names ncclCommInitRank: a quarter of an init-heavy log's reading time, for nothing)
NEEDLES = (b"WorkNCCL", b"ProcessGroupNCCL", b"atchdog", b"NCCL error", b"NCCL Error", b"NCCL operation",
           *NCCL_STRINGS, *CODE_MARKERS, b"ncclUniqueId", b"ncclCommAbort", b"light recorder", b"eartbeat",
           b"dump signal", b"global timeout", b"Last error")
# what stands after "Last error:" when it is not NCCL's quoted WARN: the error's own lines (a
# reversed paste puts the quoted text before "Last error:")
NOT_QUOTED_RE = re.compile(r"\s*(?:nccl(?:[A-Za-z]+Error|InvalidUsage|InvalidArgument): |[\w.]*(?:DistBackendError|RuntimeError): NCCL error"
                           r"|Traceback \(most recent|File \")")
WRAP_JOIN = 4            # lines after a cut one that may complete it


class TorchWatchdogParser(TextParser):
    NEEDLES = NEEDLES       # the lines it reads (besides MARKERS: whether it reads the file at all)
    NAME = "torch_watchdog"
    DESCRIPTION = "PyTorch ProcessGroupNCCL watchdog timeouts, NCCL errors and dump lines"
    GLOBS = ("logs/*", "logs/**/*")
    # an NCCL result code with its text ("ncclInternalError: Internal check failed.") is read
    # wherever it stands, whatever launcher printed it
    MARKERS = (b"WorkNCCL", b"ProcessGroupNCCL", b"NCCL error", b"NCCL Error", b"NCCL operation", *NCCL_STRINGS,
               b"DistBackendError", b"Watchdog caught", b"Last error:", *CODE_MARKERS)
    SCHEMAS = {"watchdog": {
        "line": "int", "kind": "str", "severity": "str", "log_time": "str", "src_file": "str", "src_line": "int",
        "rank": "int", "pg_id": "int", "pg_guid": "str", "pg_desc": "str", "seq_num": "int", "op_type": "str",
        "op": "str", "numel_in": "int", "numel_out": "int", "timeout_ms": "int", "ran_for_ms": "int",
        "last_enqueued": "int", "last_completed": "int", "peer_rank": "int", "wait_ms": "int", "error": "str",
        "nccl_version": "str", "message": "str", **lines_mod.CONTEXT_COLUMNS}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        return bool(re.search(r"ProcessGroupNCCL\.(?:cpp|hpp):\d+\]|Watchdog caught collective operation timeout", t))

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        log = WarningLog(label)
        facts: dict = {"timeouts": {}, "ranks": [], "nccl_version": None}
        if cls.unreadable(text, log, "a text log"):
            return cls.result(label, {}, facts, log)
        rows = []
        for ln, raw, start, end in text.iter_spans(text.lines_with(NEEDLES)):
            row = _parse_line(raw, ln, log, text, end)
            if row is None:
                continue
            if row["kind"] == "last_error_head":
                # NCCL's last WARN text stands on the next line(s), without a prefix; in a paste
                # whose lines came reversed, on the line before
                following = [x for x in text.following(end, 3) if lines_mod.strip_tags(x)[1].strip()]
                if following and NOT_QUOTED_RE.match(lines_mod.strip_tags(following[0])[1]):
                    before = [x for x in text.preceding(start, 2) if lines_mod.strip_tags(x)[1].strip()]
                    following = before[-1:] if before and not NOT_QUOTED_RE.match(
                        lines_mod.strip_tags(before[-1])[1]) else []
                if following:
                    tags, quoted = lines_mod.strip_tags(following[0])
                    ctx = {k: v for k, v in lines_mod.context(tags).as_row().items() if v is not None}
                    rows.append({**row, **ctx, "kind": "last_error", "error": quoted.strip(),
                                 "message": quoted.strip()})
                continue
            rows.append(row)
            if row["kind"] == "nccl_error" and (q := _xla_last_warn(raw, text, end)):
                # the WARN XLA quotes: a last_error row, as PyTorch's "Last error:" line gives
                rows.append({**row, "kind": "last_error", "error": q, "message": q})
        for r in rows:
            if r["kind"] == "timeout" and r.get("rank") is not None and r.get("seq_num") is not None:
                facts["timeouts"].setdefault(r["rank"], r["seq_num"])
            if r.get("nccl_version") and facts["nccl_version"] is None:
                facts["nccl_version"] = r["nccl_version"]
        facts["ranks"] = sorted({r["rank"] for r in rows if r.get("rank") is not None})
        if not rows:
            log.add(None, "no watchdog lines found")
        return cls.result(label, {"watchdog": rows}, facts, log)


def _version(v: str | None) -> str | None:
    """PyTorch before its fix for NCCL >= 2.9's version code printed 2.11.4 as "21.1.4": read
    back as NCCL's own."""
    if v and (m := re.fullmatch(r"2(\d)\.(\d)\.(\d+)", v)):
        return f"2.{m[1]}{m[2]}.{m[3]}"
    return v


def _xla_last_warn(raw: str, text: LogText, end: int) -> str | None:
    """The WARN text XLA quotes at the end of its NCCL error (:data:`XLA_LAST_RE`), on this line
    or, where a wrap cut the line before it ended, with the next lines (joined without a blank
    after a cut mid-word, with one after a line that ends in one)."""
    if (q := XLA_LAST_RE.search(raw)) is not None:
        return q["text"].strip()
    if "NCCL operation" not in raw:
        return None
    joined = raw
    for nxt in text.following(end, 3):        # a line hard- or soft-wrapped into up to four
        if not nxt.strip():
            break
        joined = joined.rstrip() + (" " if joined[-1:].isspace() else "") + nxt.strip()
        if (q := XLA_LAST_RE.search(joined)) is not None:
            return " ".join(q["text"].split())
    return None


def _parse_line(raw: str, ln: int, log: WarningLog, text: LogText, end: int) -> dict | None:
    raw = lines_mod.ANSI_RE.sub("", raw)
    m = PREFIX_RE.search(raw)
    row: dict = {"line": ln}
    if m:
        msg = m["msg"]
        row.update(severity=m["sev"], src_file=m["file"], src_line=int(m["srcline"]),
                   log_time=f"{m['date']} {m['time']}" if m["date"] and m["time"] else None,
                   rank=text_int(m["prank"]))
        pre = raw[:m.start()]
    else:
        pre, msg = lines_mod.strip_tags(raw.strip())       # a launcher's tags say whose line it is
        if (w := msg.find("what():")) >= 0:
            pre, msg = pre + msg[:w], msg[w + len("what():"):].strip()
    row.update({k: v for k, v in lines_mod.context(pre).as_row().items() if v is not None})
    row["message"] = msg.strip()
    if (t := PG_TAG_RE.search(msg)):
        row["pg_id"] = text_int(t["pg"])
        row["pg_guid"], row["pg_desc"] = t["guid"], t["desc"]
        row["rank"] = row.get("rank") if row.get("rank") is not None else text_int(t["rank"])
    if "WorkNCCL(" in msg:
        w = WORK_RE.search(msg)
        if w is None:                                 # a line hard-wrapped by a terminal
            joined = msg
            for nxt in text.following(end, WRAP_JOIN):
                joined += nxt.rstrip("\n")
                if (w := WORK_RE.search(joined)) is not None:
                    msg = joined
                    row["message"] = msg.strip()
                    break
        fields = {f["k"]: f["v"].strip() for f in FIELD_RE.finditer(w["fields"])} if w else {}
        if not w or ("SeqNum" in fields and text_int(fields["SeqNum"]) is None) or "OpType" not in fields:
            log.add(ln, f"unreadable WorkNCCL(...) description: {raw.strip()[:160]!r}")
            return None
        row["kind"] = "terminated" if "watchdog thread terminated" in msg else "timeout"
        row["seq_num"] = text_int(fields.get("SeqNum"))
        row["op_type"] = fields.get("OpType")
        row["op"] = OP_TYPES.get((fields.get("OpType") or "").upper(), fields.get("OpType"))
        row["numel_in"], row["numel_out"] = text_int(fields.get("NumelIn")), text_int(fields.get("NumelOut"))
        row["timeout_ms"] = text_int(fields.get("Timeout(ms)"))
        row["ran_for_ms"] = text_int(w["ran"])
        # the inner "[Rank N]" of a terminated line names the rank too
        if row.get("rank") is None and (r := re.search(r"\[Rank (\d+)\]", msg)):
            row["rank"] = int(r[1])
        return row
    if (e := EXC_RE.search(msg)):
        enq, done = int(e["enq"]), int(e["done"])
        # 2.3 can print an uninitialised "last completed" (larger than anything enqueued)
        # "Timeout at NCCL work: n" is printed only when work n ran past its timeout: a timeout
        # of that rank (without the WorkNCCL description: no op type, no time run)
        row.update(kind="timeout" if "Timeout at NCCL work" in e[0] else "exception", seq_num=int(e["seq"]),
                   last_enqueued=enq, last_completed=done if done <= max(enq, int(e["seq"])) else None)
        return row
    if (at := NCCL_ERROR_AT_RE.search(msg)) and (e := NCCL_ERROR_RE.match(msg, at.start())) \
            and not PLACEHOLDER_RE.search(e["err"] or ""):
        row.update(kind="nccl_error", error=(e["err"] or "").strip(" ,") or None, nccl_version=_version(e["version"]))
        return row
    if (x := CALL_FAILED_RE.search(msg)) is None and CALL_CUT_RE.search(msg):
        # a line wrapped right after "failed:": its error stands on the next line
        x = CALL_FAILED_RE.search(msg.rstrip() + " " + next(iter(text.following(end, 1)), "").strip())
    if x is not None:
        row.update(kind="nccl_error", error=f"{x['call']} failed: {x['err'].strip()}")
        return row
    if (c := NCCL_CODE_RE.search(msg)):
        row.update(kind="nccl_error", error=f"{c['code']}: {c['text'].strip()}")
        return row
    if msg.rstrip().endswith("Last error:"):
        row["kind"] = "last_error_head"
        return row
    if (f := FR_WAIT_RE.search(msg)):
        row.update(kind="fr_dump_wait", wait_ms=int(f["ms"]))
        return row
    if (d := DUMP_SIGNAL_RE.search(msg)) or DUMP_ANY_RE.search(msg):
        row["kind"] = "dump_signal"
        if d is not None:
            row["peer_rank"] = int(d["peer"])
        # 2.5+: this rank's own positions in the PG when the dump was asked for
        if (w := DUMP_WORK_RE.search(msg)):
            row.update(last_enqueued=int(w["enq"]), last_completed=int(w["done"]))
        return row
    if STUCK_RE.search(msg):
        row["kind"] = "watchdog_stuck"
        return row
    if TEARDOWN_RE.search(msg):
        row["kind"] = "teardown"
        return row
    if (a := ABORTED_RE.search(msg)) and ("ProcessGroupNCCL" in raw or "aborted" in msg):
        row["kind"] = "aborted"
        if row.get("rank") is None and a["rank"]:
            row["rank"] = int(a["rank"])
        return row
    if (s := STORE_RE.search(msg)):
        row.update(kind="store_error", error=(s["err"] or "").strip() or None)
        return row
    return None


register(TorchWatchdogParser)
