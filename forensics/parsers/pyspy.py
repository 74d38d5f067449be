"""``py-spy dump`` output: the Python stack of every thread of a (hung) process.

Text (py-spy 0.3/0.4 ``dump``, optionally ``--native``, ``--locals``,
``--subprocesses``)::

    Process 4242: python train.py --nodes 2
    Python v3.10.12 (/usr/bin/python3.10)
    [Parent Process 4200: torchrun …]

    Thread 4242 (active+gil): "MainThread"
        all_reduce (torch/distributed/distributed_c10d.py:2050)
        train_step (train.py:88)
    Thread 0x7F1A2B3C4D50 (idle)
        wait (threading.py:320)

``Thread`` ids are the OS tid in decimal, or the Python thread id in hex when py-spy
cannot map it. Frames are innermost first; native frames have no line number
(``cudaStreamSynchronize (libcudart.so.12)``). ``--locals`` adds indented
``Arguments:``/``Locals:`` blocks, counted per frame. ``py-spy dump --json`` output (a
list of thread traces) is accepted too. Several dumps may be concatenated.

Tables:

``stacks`` -- one row per frame: line (int), pid (int), thread_id (str as printed),
    os_tid (int when decimal), thread_name (str), status (idle|active|active+gil),
    active, owns_gil (bool), depth (int: 0 = innermost), function, file (str), lineno
    (int, NA for native frames), n_locals (int: locals/arguments shown).
``stack_threads`` -- one row per thread: line, pid, cmdline (str), python_version
    (str), thread_id, os_tid, thread_name, status, active, owns_gil, n_frames (int),
    top_function, top_file (str), top_lineno (int).

Facts: processes ({pid: {cmdline, python_version, parent_pid}}), threads (int),
errors (py-spy error lines, e.g. permission denied).
"""
from __future__ import annotations

import json
import re

from .registry import Parser, WarningLog, decode_text, looks_binary, register, split_lines

PROCESS_RE = re.compile(r"^Process (?P<pid>\d+): ?(?P<cmd>.*)$")
PARENT_RE = re.compile(r"^Parent Process (?P<pid>\d+): ?(?P<cmd>.*)$")
PYTHON_RE = re.compile(r"^Python v(?P<v>\S+)(?: \((?P<exe>.*)\))?\s*$")
THREAD_RE = re.compile(r'^Thread (?P<tid>0[xX][0-9a-fA-F]+|\d+) \((?P<status>[a-z+]+)\)(?:: "(?P<name>.*)")?\s*$')
FRAME_RE = re.compile(r"^ {4}(?P<func>\S.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)\s*$")
LOCALS_HEAD_RE = re.compile(r"^ {8}(?:Arguments|Locals):?\s*$")
LOCAL_RE = re.compile(r"^ {12}\S")
ERROR_RE = re.compile(r"^(?:Error|error|Permission Denied|Failed)\b")
STATUSES = {"idle": (False, False), "active": (True, False), "active+gil": (True, True), "gil": (True, True)}


class PySpyParser(Parser):
    STRUCTURED = True     # a whole file of its own format
    NAME = "pyspy"
    DESCRIPTION = "py-spy dump (text or --json): per-thread Python stacks"
    GLOBS = ("stacks/*", "stacks/**/*", "*py-spy*", "*pyspy*")
    SCHEMAS = {
        "stacks": {"line": "int", "pid": "int", "thread_id": "str", "os_tid": "int", "thread_name": "str",
                   "status": "str", "active": "bool", "owns_gil": "bool", "depth": "int", "function": "str",
                   "file": "str", "lineno": "int", "n_locals": "int"},
        "stack_threads": {"line": "int", "pid": "int", "cmdline": "str", "python_version": "str",
                          "thread_id": "str", "os_tid": "int", "thread_name": "str", "status": "str",
                          "active": "bool", "owns_gil": "bool", "n_frames": "int", "top_function": "str",
                          "top_file": "str", "top_lineno": "int"},
    }

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        if re.search(r"(?m)^Process \d+: ", t) and re.search(r"(?m)^(?:Python v\d|Thread (?:0x[0-9A-Fa-f]+|\d+) \()", t):
            return True
        return t.lstrip().startswith("[") and '"owns_gil"' in t and '"frames"' in t

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        log = WarningLog(label)
        facts = {"processes": {}, "threads": 0, "errors": []}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, {}, facts, log)
        if looks_binary(data):
            log.add(None, "binary data, not a py-spy dump")
            return cls.result(label, {}, facts, log)
        text = decode_text(data)
        if text.lstrip().startswith("["):
            frames, threads = _parse_json(text, facts, log)
        else:
            frames, threads = parse_text(text, facts, log)
        facts["threads"] = len(threads)
        if not threads:
            log.add(None, "no threads found")
        return cls.result(label, {"stacks": frames, "stack_threads": threads}, facts, log)


def _thread_row(ln, pid, proc, tid, status, name):
    active, gil = STATUSES.get(status, (None, None))
    return {"line": ln, "pid": pid, "cmdline": proc.get("cmdline"), "python_version": proc.get("python_version"),
            "thread_id": tid, "os_tid": int(tid) if tid.isdigit() else None, "thread_name": name,
            "status": status, "active": active, "owns_gil": gil, "n_frames": 0}


def parse_text(text, facts, log):
    """(frames, threads) rows of a ``py-spy dump`` in text form; ``facts["processes"]`` gets
    each process met (pid -> cmdline, python_version, parent_pid), ``log`` the lines not
    understood. Also what :mod:`.native_stacks` reads py-spy sections of capture's files with."""
    frames, threads = [], []
    pid, proc, thread = None, {}, None
    for ln, raw in enumerate(split_lines(text), 1):
        if not raw.strip():
            continue
        line = raw.rstrip()
        if (m := PROCESS_RE.match(line)):
            pid = int(m["pid"])
            proc = facts["processes"].setdefault(pid, {"cmdline": m["cmd"], "python_version": None,
                                                       "parent_pid": None})
            thread = None
        elif (m := PARENT_RE.match(line)):
            if proc:
                proc["parent_pid"] = int(m["pid"])
        elif (m := PYTHON_RE.match(line)):
            if proc:
                proc["python_version"] = m["v"]
        elif (m := THREAD_RE.match(line)):
            if m["status"] not in STATUSES:
                log.add(ln, f"unknown thread status {m['status']!r}")
            thread = _thread_row(ln, pid, proc, m["tid"], m["status"], m["name"])
            threads.append(thread)
        elif (m := FRAME_RE.match(line)):
            if thread is None:
                log.add(ln, "frame line outside a thread")
                continue
            lineno = int(m["line"]) if m["line"] else None
            frames.append({"line": ln, "pid": pid, "thread_id": thread["thread_id"], "os_tid": thread["os_tid"],
                           "thread_name": thread["thread_name"], "status": thread["status"],
                           "active": thread["active"], "owns_gil": thread["owns_gil"], "depth": thread["n_frames"],
                           "function": m["func"], "file": m["file"], "lineno": lineno, "n_locals": 0})
            if thread["n_frames"] == 0:
                thread["top_function"], thread["top_file"], thread["top_lineno"] = m["func"], m["file"], lineno
            thread["n_frames"] += 1
        elif LOCALS_HEAD_RE.match(line):
            continue
        elif LOCAL_RE.match(line):
            if frames and thread is not None and frames[-1]["thread_id"] == thread["thread_id"]:
                frames[-1]["n_locals"] += 1
        elif set(line.strip()) == {"-"}:          # --subprocesses separator
            continue
        elif ERROR_RE.match(line.strip()):
            facts["errors"].append(line.strip())
            log.add(ln, f"py-spy reported: {line.strip()[:120]}")
        else:
            log.add(ln, f"not a py-spy dump line: {line.strip()[:120]!r}")
    return frames, threads


def _parse_json(text, facts, log):
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        log.add(e.lineno, f"invalid JSON: {e.msg}")
        return [], []
    if not isinstance(doc, list):
        log.add(None, "py-spy JSON is not a list of traces")
        return [], []
    frames, threads = [], []
    for i, t in enumerate(doc):
        if not isinstance(t, dict):
            log.add(None, f"trace [{i}] is not an object")
            continue
        pid = t.get("pid") if isinstance(t.get("pid"), int) else None
        osid = t.get("os_thread_id")
        tid = str(osid) if isinstance(osid, int) else (f"0x{t['thread_id']:X}" if isinstance(t.get("thread_id"), int)
                                                        else "?")
        active, gil = t.get("active"), t.get("owns_gil")
        status = "idle" if active is False else ("active+gil" if gil else "active") if active else None
        proc = facts["processes"].setdefault(pid, {"cmdline": None, "python_version": None, "parent_pid": None}) \
            if pid is not None else {}
        info = t.get("process_info")
        if isinstance(info, dict) and isinstance(info.get("command_line"), str) and proc:
            proc["cmdline"] = info["command_line"]
        name = t.get("thread_name") if isinstance(t.get("thread_name"), str) else None
        thread = _thread_row(None, pid, proc, tid, status, name)
        thread["active"] = active if isinstance(active, bool) else None
        thread["owns_gil"] = gil if isinstance(gil, bool) else None
        threads.append(thread)
        raw_frames = t.get("frames")
        if raw_frames is not None and not isinstance(raw_frames, list):
            log.add(None, f"trace [{i}] frames is a {type(raw_frames).__name__}, not a list")
            raw_frames = None
        for f in raw_frames or []:
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                log.add(None, f"trace [{i}] has a frame without a name")
                continue
            file = f.get("short_filename") or f.get("filename")
            lineno = f.get("line") if isinstance(f.get("line"), int) and f.get("line") > 0 else None
            locals_ = f.get("locals")
            frames.append({"pid": pid, "thread_id": tid, "os_tid": thread["os_tid"], "thread_name": name,
                           "status": status, "active": thread["active"], "owns_gil": thread["owns_gil"],
                           "depth": thread["n_frames"], "function": f["name"],
                           "file": file if isinstance(file, str) else None, "lineno": lineno,
                           "n_locals": len(locals_) if isinstance(locals_, list) else 0})
            if thread["n_frames"] == 0:
                thread["top_function"], thread["top_file"], thread["top_lineno"] = f["name"], file, lineno
            thread["n_frames"] += 1
    return frames, threads


register(PySpyParser)
