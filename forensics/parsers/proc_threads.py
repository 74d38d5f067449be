"""Capture's per-thread samples of a traced process (``proc/<pid>-threads-<phase>.json``).

One JSON object per file (``capture/threads.py``)::

    {"pid": 4242, "phase": "end", "sample_ns": <UTC ns>, "monotonic_ns": ..., "arch": "x86_64",
     "threads": [{"tid": 4250, "name": "cuda-stream", "state": "S", "wchan": "do_sys_poll",
                  "syscall_nr": 7, "syscall_name": "poll", "args": ["0x7f..", "0x3", ...],
                  "utime_ticks": 12, "stime_ticks": 40,
                  "waits": [{"fd": 9, "events": "in", "socket_inode": 35123}], "note": null}],
     "notes": []}

Table ``threads`` -- one row per (thread, fd it waits on); a thread waiting on no fd has one
row with fd and socket_inode NA: pid, phase (start|end), sample_ns (UTC ns), tid, name,
state (R, S, D, t, ...), wchan, syscall_name (NA: running, not in a syscall, or a call not
in capture's table), fd, socket_inode (int: the socket that fd is; joins ``ss -e``'s
``ino:``), wait_events (``in``, ``out``, ``in,out``: what a poll/select/epoll waits for; a
recv is ``in``, a send ``out``), utime_ticks, stime_ticks (int: clock ticks).

Facts: pid, phase, threads (int), notes (capture's remarks, e.g. threads cut).
"""
from __future__ import annotations

import json

from ..coerce import json_int
from .registry import Parser, WarningLog, register


def _str(v):
    return v if isinstance(v, str) else None


class ProcThreadsParser(Parser):
    STRUCTURED = True     # a whole file of its own format
    NAME = "proc_threads"
    DESCRIPTION = "capture's per-thread /proc samples: state, syscall, the sockets each thread waits on"
    GLOBS = ("proc/*threads*.json", "proc/**/*threads*.json")
    SCHEMAS = {"threads": {"pid": "int", "phase": "str", "sample_ns": "int", "tid": "int", "name": "str",
                           "state": "str", "wchan": "str", "syscall_name": "str", "fd": "int",
                           "socket_inode": "int", "wait_events": "str", "utime_ticks": "int",
                           "stime_ticks": "int"}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        h = head.lstrip()[:4096]
        return h.startswith(b"{") and b'"threads"' in h and b'"tid"' in h

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        log = WarningLog(label)
        rows: list[dict] = []
        facts: dict = {"pid": None, "phase": None, "threads": 0, "notes": []}
        try:
            doc = json.loads(data.decode("utf-8", "replace")) if data.strip() else None
        except ValueError as e:
            log.add(None, f"not JSON ({e})")
            doc = None
        if doc is None and not data.strip():
            log.add(None, "empty file")
        if doc is not None and not (isinstance(doc, dict) and isinstance(doc.get("threads"), list)):
            log.add(None, "no threads list: not a capture thread sample")
            doc = None
        if doc is not None:
            pid, phase, t_ns = json_int(doc.get("pid")), _str(doc.get("phase")), json_int(doc.get("sample_ns"))
            notes = doc.get("notes")
            facts.update(pid=pid, phase=phase,
                         notes=[n for n in notes if isinstance(n, str)] if isinstance(notes, list) else [])
            for i, t in enumerate(doc["threads"]):
                if not isinstance(t, dict) or json_int(t.get("tid")) is None:
                    log.add(None, f"thread #{i}: no tid, skipped")
                    continue
                base = {"pid": pid, "phase": phase, "sample_ns": t_ns, "tid": t["tid"], "name": _str(t.get("name")),
                        "state": _str(t.get("state")), "wchan": _str(t.get("wchan")),
                        "syscall_name": _str(t.get("syscall_name")), "fd": None, "socket_inode": None,
                        "wait_events": None, "utime_ticks": json_int(t.get("utime_ticks")),
                        "stime_ticks": json_int(t.get("stime_ticks"))}
                waits = t.get("waits")
                waits = [w for w in waits if isinstance(w, dict)] if isinstance(waits, list) else []
                for w in waits:
                    rows.append(dict(base, fd=json_int(w.get("fd")), socket_inode=json_int(w.get("socket_inode")),
                                     wait_events=_str(w.get("events"))))
                if not waits:
                    rows.append(base)
                facts["threads"] += 1
        return cls.result(label, {"threads": rows}, facts, log)


register(ProcThreadsParser)
