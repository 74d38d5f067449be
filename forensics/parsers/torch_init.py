"""A job that never started: PyTorch's rendezvous and c10d store failures while the ranks meet.

Before the first collective, the ranks meet twice: torchrun's agents in the elastic
*rendezvous* (a c10d TCP store at ``--rdzv_endpoint``, or etcd), then every process group's
ranks at the c10d store (``MASTER_ADDR:MASTER_PORT``), where rank 0 of each communicator
publishes its ``ncclUniqueId`` and the others wait for it. A rank that never arrives, or a store
nobody can reach, shows as (torch 1.9 to 2.9, any launcher prefix before the text):

- ``[c10d] The client socket has timed out after 60s while trying to connect to
  192.0.0.1:1234`` (also ``(IP1, 2222)``, ``has failed to connect to ... (errno: 111 -
  Connection refused)``): the store's address was unreachable;
- ``torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the
  C10d store has failed``, ``RendezvousTimeoutError``, ``RendezvousClosedError`` (also inside
  the elastic error handler's JSON, ``"message": "RendezvousTimeoutError: "``);
- ``The node 'x' has failed to send a keep-alive heartbeat to the rendezvous 'job' due to an
  error of type RendezvousConnectionError``;
- ``[1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value
  store by key '0', but store->get('0') got error: wait timeout after 600000ms`` (``retreiving``
  and ``got exception`` before torch 1.12): rank 1 waited for rank 0's id;
- ``Timed out initializing process group in store based barrier on rank: 5, for key:
  store_based_barrier_key:32 (world_size=8, worker_count=4, timeout=0:00:30)`` and its INFO
  ``Waiting in store based barrier to initialize process group for rank: 0, key: ...`` (torch
  1.8 to 1.13): a new process group's ranks meet at the store; only ``worker_count`` of
  ``world_size`` arrived (more than the world: a rank started twice, or two jobs on one store);
- the launch configuration the agent prints (``rdzv_endpoint    : IP1:2222``): where it meets;
- a traceback of the torchrun agent itself (``torch/distributed/launcher/api.py ... in
  launch_agent`` / ``__call__``) with no error line after it in the log: the agent failed
  before any worker did (the excerpt ends before its reason).

Table ``init_errors`` (one row per line read):
    line (int), kind (store_connect|rdzv_connection|rdzv_timeout|rdzv_closed|rdzv_keepalive|
    unique_id|barrier_timeout|barrier_wait|rdzv_endpoint|agent_traceback), rank (int: the rank that
    waited; a barrier's: ``error`` says how many of the world arrived), root_rank (int:
    the rank it waited for), address (str ``host:port``), timeout_ms (int), error (str: the
    error as printed), message (str), and the launcher context (ctx_rank, ctx_local_rank,
    ctx_host, ctx_pid, ctx_clock: :mod:`.lines`).
"""
from __future__ import annotations

import re

from . import lines as lines_mod
from .registry import WarningLog, register
from .text import LogText, TextParser

CLIENT_RE = re.compile(r"client socket has (?:timed out after (?P<s>\d+)s while trying to connect to|failed to connect "
                       r"to(?: any network address of)?) (?P<addr>\(\s*[^,()]+,\s*\d+\s*\)|\[?[\w.:-]+\]?:\d+)"
                       r"(?P<rest>.*)$")
RDZV_RE = re.compile(r"(?:[A-Za-z_][\w.]*\.)?Rendezvous(?P<what>Connection|Timeout|Closed|State|)Error\b\)?:? ?(?P<err>[^\"]*)")
KEEPALIVE_RE = re.compile(r"has failed to send a keep-alive heartbeat to the rendezvous '(?P<run>[^']*)' due to an "
                          r"error of type (?P<err>\w+)")
UNIQUE_RE = re.compile(r"\[(?P<rank>\d+)\] is setting up NCCL communicator and retr\w+ ncclUniqueId from "
                       r"\[(?P<root>\d+)\](?: via c10d key-value store by key '(?P<key>[^']*)')?"
                       r"(?:, but store->get\('[^']*'\) got (?:error|exception): (?P<err>.*?))?\s*$")
WAIT_MS_RE = re.compile(r"(?:wait )?timeout after (?P<ms>\d+)ms")
BARRIER_RE = re.compile(r"(?P<state>Timed out initializing process group|Waiting) in store based barrier (?:on rank|to "
                        r"initialize process group for rank): (?P<rank>\d+), (?:for )?key: (?P<key>[^\s,()]+) "
                        r"\(world_size=(?P<world>\d+), worker_count=(?P<count>\d+), timeout=(?P<t>[\d:.]+)\)")
ENDPOINT_RE = re.compile(r"^\s*rdzv_endpoint\s*:\s*(?P<addr>\S+:\d+)\s*$")
AGENT_TB_RE = re.compile(r"torch/distributed/launcher/api\.py\", line \d+, in (?:__call__|launch_agent)")
KINDS = {"Connection": "rdzv_connection", "Timeout": "rdzv_timeout", "Closed": "rdzv_closed", "State": "rdzv_connection",
         "": "rdzv_connection"}
NEEDLES = (b"client socket has", b"RendezvousConnectionError", b"RendezvousTimeoutError", b"RendezvousClosedError",
           b"RendezvousStateError", b"keep-alive heartbeat", b"ncclUniqueId", b"rdzv_endpoint",
           b"distributed/launcher/api.py", b"store based barrier")
# the lines that, after an agent's traceback, say why it failed (then the traceback adds nothing)
TB_TAIL = 12


class TorchInitParser(TextParser):
    NEEDLES = NEEDLES
    NAME = "torch_init"
    DESCRIPTION = "PyTorch rendezvous and c10d store failures: ranks that never met, stores never reached"
    GLOBS = ("logs/*", "logs/**/*")
    MARKERS = (b"client socket has", b"RendezvousConnectionError", b"RendezvousTimeoutError",
               b"RendezvousClosedError", b"keep-alive heartbeat", b"ncclUniqueId", b"distributed/launcher/api.py",
               b"store based barrier")
    SCHEMAS = {"init_errors": {
        "line": "int", "kind": "str", "rank": "int", "root_rank": "int", "address": "str", "timeout_ms": "int",
        "error": "str", "message": "str", **lines_mod.CONTEXT_COLUMNS}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return any(m in head for m in cls.MARKERS)

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        log = WarningLog(label)
        if cls.unreadable(text, log, "a text log"):
            return cls.result(label, {}, {}, log)
        rows: list[dict] = []
        tb_end = None           # the end offset of the last agent traceback line
        for ln, raw, _start, end in text.iter_spans(text.lines_with(NEEDLES)):
            line = lines_mod.ANSI_RE.sub("", raw)
            row = _row(ln, line)
            if row is None and AGENT_TB_RE.search(line):
                tb_end, tb_line = end, ln
                continue
            if row is not None:
                rows.append(row)
        if tb_end is not None and not _explained(text, tb_end, rows, tb_line):
            rows.append({"line": tb_line, "kind": "agent_traceback",
                         "message": "torchrun's agent raised (launcher/api.py); its error is not in the log"})
        if not rows:
            log.add(None, "no rendezvous or c10d store failure found")
        return cls.result(label, {"init_errors": rows}, {}, log)


EXC_NAME_RE = re.compile(r"[\w.]*(?:Error|Exception|Warning)\)?:\s*$")


def _context(prefix: str) -> dict:
    """The launcher context of the text before a message, less the exception's name that
    introduces it (``RuntimeError: `` is no pdsh host)."""
    return lines_mod.context(EXC_NAME_RE.sub("", prefix)).as_row()


def _address(text: str) -> str:
    """``(IP1, 2222)`` or ``[::1]:29500`` or ``host:port`` as ``host:port``."""
    t = text.strip()
    if t.startswith("("):
        host, _, port = t.strip("()").rpartition(",")
        return f"{host.strip()}:{port.strip()}"
    return t


def _hms_ms(t: str) -> int | None:
    """``0:30:00`` (a timedelta as printed) in ms."""
    try:
        h, m, sec = t.split(":")
        return int((int(h) * 3600 + int(m) * 60 + float(sec)) * 1000)
    except ValueError:
        return None


def _row(ln: int, line: str) -> dict | None:
    if (m := UNIQUE_RE.search(line)):
        err = (m["err"] or "").strip() or None
        w = WAIT_MS_RE.search(err or "")
        return {"line": ln, "kind": "unique_id", "rank": int(m["rank"]), "root_rank": int(m["root"]), "error": err,
                "timeout_ms": int(w["ms"]) if w else None, "message": line[m.start():].strip()[:300],
                **_context(line[:m.start()])}
    if (m := CLIENT_RE.search(line)):
        return {"line": ln, "kind": "store_connect", "address": _address(m["addr"]),
                "timeout_ms": int(m["s"]) * 1000 if m["s"] else None,
                "error": ("timed out" if m["s"] else "failed to connect") + (m["rest"] or "").strip(" .")[:160],
                "message": line[m.start():].strip()[:300], **_context(line[:m.start()])}
    if (m := BARRIER_RE.search(line)):
        world, count = int(m["world"]), int(m["count"])
        arrived = (f"{count} of {world} ranks arrived" if count <= world else
                   f"{count} workers for a world of {world}: a rank started twice, or two jobs on one store")
        return {"line": ln, "kind": "barrier_timeout" if m["state"].startswith("Timed") else "barrier_wait",
                "rank": int(m["rank"]), "timeout_ms": _hms_ms(m["t"]), "error": f"{arrived} (key {m['key']})",
                "message": line[m.start():].strip()[:300], **_context(line[:m.start()])}
    if (m := KEEPALIVE_RE.search(line)):
        return {"line": ln, "kind": "rdzv_keepalive", "error": m["err"], "message": line[m.start():].strip()[:300],
                **_context(line[:m.start()])}
    if (m := RDZV_RE.search(line)):
        err = f"Rendezvous{m['what']}Error" + (f": {m['err'].strip()}" if m["err"].strip() else "")
        return {"line": ln, "kind": KINDS.get(m["what"], "rdzv_connection"), "error": err[:200],
                "message": line.strip()[:300], **_context(line[:m.start()])}
    if (m := ENDPOINT_RE.search(line)):
        return {"line": ln, "kind": "rdzv_endpoint", "address": m["addr"], "message": line.strip()}
    return None


def _explained(text: LogText, end: int, rows: list[dict], tb_line: int) -> bool:
    """Whether the agent's traceback is followed by what it raised (a row of this table after
    it, or an exception line within TB_TAIL lines: ChildFailedError, any ``Error:``)."""
    if any(r["line"] > tb_line and r["kind"] != "rdzv_endpoint" for r in rows):
        return True
    return any(re.search(r"^\s*[\w.]+(?:Error|Exception)\b", x) for x in text.following(end, TB_TAIL))


register(TorchInitParser)
