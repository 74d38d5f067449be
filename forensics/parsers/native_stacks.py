"""Native stacks of a process: capture's ``stacks/native-<pid>-<phase>.txt`` (eu-stack, gdb or
``py-spy dump --native`` output behind capture's header), or raw eu-stack / gdb output.

Capture's header (``capture/stacks.py``; every line starts with ``# ``)::

    # stallscope native stacks
    # pid: 4242
    # phase: hung                      (hung: taken because nothing progressed; start: --stacks always)
    # tool: eu-stack
    # command: eu-stack -p 4242 -s -m
    # decision: nothing progressed during the first 5s: ...
    # thread: 4242 S "python3"        (tid, /proc state letter, comm as JSON, read before the tool attached)
    # thread: 4250 R "pt_nccl_watchdg"
    ...tool output...
    # rc: 0                            (or "killed")
    # stderr: ...

``eu-stack -p PID -s -m`` (elfutils 0.188)::

    PID 4242 - process
    TID 4242:
    #0  0x00007f078901fdf2 pause - /usr/lib/x86_64-linux-gnu/libc.so.6
        ../sysdeps/unix/sysv/linux/pause.c:29:10
    #1  0x0000555a87f601a2 wait_for_peer - /tmp/ns/hang

(``-m`` adds `` - <module>``, ``-s`` the indented ``file:line[:column]`` line; a frame
without a symbol shows its address only). ``gdb -batch -ex "thread apply all bt"``::

    Thread 2 (Thread 0x7f95846b36c0 (LWP 16884) "pt_nccl_watchdg"):
    #0  0x00007f95847b326f in __GI___poll (fds=..., nfds=0, timeout=100000) at ../sysdeps/unix/sysv/linux/poll.c:29
    #1  0x000055d73633221e in watchdog (arg=<optimized out>) at hang.c:11
    #2  0x00007f1c2a0e1d40 in ncclProxyProgress () from /usr/lib/libnccl.so.2

(gdb's attach chatter, ``[New LWP ..]``, ``[Inferior 1 (process N) detached]`` are
skipped). ``py-spy dump --native`` text is read by :mod:`.pyspy`'s parser.

Tables:

``stacks`` -- one row per frame, the py-spy parser's columns: line (int), pid (int),
    thread_id (str: the OS thread id), os_tid (int), thread_name (str: the header's
    /proc comm, else gdb's thread name), status (str: the thread's /proc state when the
    tool attached: running, sleeping, disk-sleep, stopped, tracing-stop, ...; NA
    without capture's header; py-spy's idle/active for py-spy dumps), active (bool:
    running), owns_gil (bool, NA here), depth (int: 0 = innermost), function (str, ``??``
    when unknown), file (str: the source file when known, else the module's file name),
    lineno (int, NA without source), n_locals (int, 0) -- and module (str: the library or
    executable), address (str: hex pc), tool (eu-stack|gdb|py-spy).
``stack_threads`` -- one row per thread: line, pid, thread_id, os_tid, thread_name,
    status, active, n_frames (int), top_function, top_file (str), top_lineno (int), tool.

Facts: pid, phase, tool, command, decision, rc (int, or "killed"), threads (int),
stderr (list of the tool's stderr lines), notes (list).
"""
from __future__ import annotations

import json
import re

from . import pyspy
from .registry import Parser, WarningLog, decode_text, looks_binary, register, split_lines

HEADER = "# stallscope native stacks"
STATE_NAMES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped", "t": "tracing-stop",
               "Z": "zombie", "X": "dead", "I": "idle", "P": "parked", "W": "waking", "K": "wakekill"}
HEAD_RE = re.compile(r"^# (?P<k>pid|phase|tool|command|decision|rc|note|stderr): ?(?P<v>.*)$")
THREAD_HEAD_RE = re.compile(r'^# thread: (?P<tid>\d+) (?P<state>\S) (?P<name>".*")\s*$')
EU_PID_RE = re.compile(r"^PID (?P<pid>\d+) - (?:process|core)\s*$")
EU_TID_RE = re.compile(r"^TID (?P<tid>\d+):\s*$")
EU_FRAME_RE = re.compile(r"^#(?P<n>\d+)\s+(?P<addr>0x[0-9a-fA-F]+)(?:\s+(?P<rest>\S.*?))?\s*$")
EU_MODULE_RE = re.compile(r"^(?P<func>.*?) - (?P<module>/\S.*|\[[^\]]+\])$")
EU_SOURCE_RE = re.compile(r"^\s{4}(?P<file>\S.*?):(?P<line>\d+)(?::\d+)?\s*$")
GDB_THREAD_RE = re.compile(r"^Thread (?P<num>\d+) \((?P<inner>.*)\):\s*$")
GDB_FRAME_RE = re.compile(r"^#(?P<n>\d+)\s+(?:(?P<addr>0x[0-9a-fA-F]+) in )?(?P<rest>\S.*?)\s*$")
GDB_AT_RE = re.compile(r"^(?P<call>.*) at (?P<file>\S+):(?P<line>\d+)$")
GDB_FROM_RE = re.compile(r"^(?P<call>.*) from (?P<module>\S+)$")
GDB_NOISE_RE = re.compile(r"^(?:\[|Using host libthread_db|0x[0-9a-fA-F]+ in |\d+\t|warning:|Reading symbols|"
                          r"Downloading|Attaching to|\(No debugging symbols|No symbol table|Backtrace stopped|"
                          r"Missing separate debuginfo|Try: |--Type <RET>)")
VERSION_SUFFIX_RE = re.compile(r"@{1,2}[A-Za-z_][\w.]*$")


class NativeStacksParser(Parser):
    STRUCTURED = True     # a whole file of its own format
    NAME = "native_stacks"
    DESCRIPTION = "native stacks (eu-stack, gdb thread apply all bt, py-spy --native) with capture's header"
    GLOBS = ("stacks/native-*", "*native-stacks*")
    SCHEMAS = {
        "stacks": dict(pyspy.PySpyParser.SCHEMAS["stacks"], module="str", address="str", tool="str"),
        "stack_threads": {"line": "int", "pid": "int", "thread_id": "str", "os_tid": "int", "thread_name": "str",
                          "status": "str", "active": "bool", "n_frames": "int", "top_function": "str",
                          "top_file": "str", "top_lineno": "int", "tool": "str"},
    }

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        if t.startswith(HEADER):
            return True
        if re.search(r"(?m)^PID \d+ - process\s*$", t) and re.search(r"(?m)^TID \d+:\s*$", t):
            return True
        return re.search(r"(?m)^Thread \d+ \((?:Thread 0x[0-9a-fA-F]+ \()?LWP \d+\)", t) is not None

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        log = WarningLog(label)
        facts = {"pid": None, "phase": None, "tool": None, "command": None, "decision": None, "rc": None,
                 "threads": 0, "stderr": [], "notes": []}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, {}, facts, log)
        if looks_binary(data):
            log.add(None, "binary data, not a stack dump")
            return cls.result(label, {}, facts, log)
        lines = split_lines(decode_text(data))
        names: dict[int, tuple[str, str]] = {}     # tid -> (state letter, comm) from the header
        body = []                                  # (line number, text) of the tool's output
        for ln, raw in enumerate(lines, 1):
            line = raw.rstrip()
            if line == HEADER:
                continue
            if line.startswith("# "):
                if (m := THREAD_HEAD_RE.match(line)):
                    try:
                        names[int(m["tid"])] = (m["state"], json.loads(m["name"]))
                    except ValueError:
                        log.add(ln, f"bad thread header: {line[:120]!r}")
                elif (m := HEAD_RE.match(line)):
                    _head_fact(facts, m["k"], m["v"], ln, log)
                continue                            # other comments (ncclras-style notes) are not stacks
            body.append((ln, line))
        tool = facts["tool"] or _guess_tool(body)
        if tool == "py-spy":
            frames, threads = _parse_pyspy(lines, facts, log)
        elif tool == "gdb":
            frames, threads = _parse_gdb(body, facts, log)
        else:
            tool = "eu-stack" if tool is None else tool
            frames, threads = _parse_eu(body, facts, log)
        for row in frames + threads:
            row["tool"] = tool
            tid = row.get("os_tid")
            if tid in names:
                state, comm = names[tid]
                if tool != "py-spy" or not row.get("status"):
                    row["status"], row["active"] = STATE_NAMES.get(state, state), state == "R"
                row["thread_name"] = row.get("thread_name") or comm
        facts["tool"] = facts["tool"] or tool
        facts["threads"] = len(threads)
        if not threads and facts["rc"] != "killed":
            log.add(None, "no thread stacks found")
        return cls.result(label, {"stacks": frames, "stack_threads": threads}, facts, log)


def _head_fact(facts: dict, k: str, v: str, ln: int, log: WarningLog) -> None:
    if k == "pid":
        try:
            facts["pid"] = int(v)
        except ValueError:
            log.add(ln, f"bad pid {v!r}")
    elif k == "rc":
        facts["rc"] = int(v) if re.fullmatch(r"-?\d+", v) else v
    elif k == "stderr":
        facts["stderr"].append(v)
    elif k == "note":
        facts["notes"].append(v)
    else:
        facts[k] = v


def _guess_tool(body) -> str | None:
    for _, line in body:
        if EU_PID_RE.match(line) or EU_TID_RE.match(line):
            return "eu-stack"
        if GDB_THREAD_RE.match(line):
            return "gdb"
        if pyspy.PROCESS_RE.match(line) or pyspy.PYTHON_RE.match(line):
            return "py-spy"
    return None


def _thread(ln, pid, tid, name=None) -> dict:
    return {"line": ln, "pid": pid, "thread_id": str(tid), "os_tid": tid, "thread_name": name, "status": None,
            "active": None, "n_frames": 0}


def _frame(thread: dict, ln: int, function: str, file, lineno, module, address) -> dict:
    row = {"line": ln, "pid": thread["pid"], "thread_id": thread["thread_id"], "os_tid": thread["os_tid"],
           "thread_name": thread["thread_name"], "status": None, "active": None, "owns_gil": None,
           "depth": thread["n_frames"], "function": function, "file": file, "lineno": lineno, "n_locals": 0,
           "module": module, "address": address}
    if thread["n_frames"] == 0:
        thread["top_function"], thread["top_file"], thread["top_lineno"] = function, file, lineno
    thread["n_frames"] += 1
    return row


def _basename(path):
    return path.rsplit("/", 1)[-1] if path else None


def _parse_eu(body, facts, log):
    frames, threads = [], []
    pid = facts["pid"]
    thread, last = None, None
    for ln, line in body:
        if not line.strip():
            continue
        if (m := EU_PID_RE.match(line)):
            pid = facts["pid"] = facts["pid"] or int(m["pid"])
            thread = last = None
        elif (m := EU_TID_RE.match(line)):
            thread = _thread(ln, pid, int(m["tid"]))
            threads.append(thread)
            last = None
        elif (m := EU_FRAME_RE.match(line)):
            if thread is None:
                log.add(ln, "frame line outside a thread")
                continue
            rest, module = (m["rest"] or "").strip(), None
            if (mm := EU_MODULE_RE.match(rest)):
                rest, module = mm["func"].strip(), mm["module"]
            function = VERSION_SUFFIX_RE.sub("", rest) or "??"
            last = _frame(thread, ln, function, _basename(module), None, module, m["addr"].lower())
            frames.append(last)
        elif (m := EU_SOURCE_RE.match(line)):
            if last is None:
                log.add(ln, "source line without a frame")
                continue
            last["file"], last["lineno"] = m["file"], int(m["line"])
            if last["depth"] == 0:
                thread["top_file"], thread["top_lineno"] = last["file"], last["lineno"]
        else:
            log.add(ln, f"not an eu-stack line: {line.strip()[:120]!r}")
    return frames, threads


def _split_call(s: str) -> str:
    """``func (args)`` -> func; the argument list is the last balanced (...) group."""
    s = s.strip()
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                return s[:i].rstrip() or "??"
    return s


def _parse_gdb(body, facts, log):
    frames, threads = [], []
    pid = facts["pid"]
    thread = None
    for ln, line in body:
        if not line.strip():
            continue
        if (m := GDB_THREAD_RE.match(line)):
            inner = m["inner"]
            lwp = re.search(r"\b(?:LWP|process) (\d+)", inner)
            name = re.search(r'"(.*)"\s*$', inner)
            tid = int(lwp.group(1)) if lwp else None
            thread = _thread(ln, pid, tid, name.group(1) if name else None)
            if tid is None:
                thread["thread_id"] = m["num"]
            threads.append(thread)
        elif (m := GDB_FRAME_RE.match(line)):
            if thread is None:
                log.add(ln, "frame line outside a thread")
                continue
            rest, file, lineno, module = m["rest"], None, None, None
            if (mm := GDB_AT_RE.match(rest)):
                rest, file, lineno = mm["call"], mm["file"], int(mm["line"])
            elif (mm := GDB_FROM_RE.match(rest)):
                rest, module = mm["call"], mm["module"]
            frames.append(_frame(thread, ln, _split_call(rest), file or _basename(module), lineno, module,
                                 m["addr"].lower() if m["addr"] else None))
        elif GDB_NOISE_RE.match(line) or thread is None:
            if facts["pid"] is None and (m := re.match(r"^\[Inferior \d+ \(process (\d+)\) detached\]", line)):
                facts["pid"] = int(m.group(1))
            continue                       # gdb's attach chatter, before the first thread or between them
        else:
            log.add(ln, f"not a gdb backtrace line: {line.strip()[:120]!r}")
    if pid is None and facts["pid"] is not None:      # raw gdb output names the process only at its end
        for row in frames + threads:
            row["pid"] = facts["pid"]
    return frames, threads


def _parse_pyspy(lines, facts, log):
    # capture's comments become blank lines (ignored by the py-spy parser; line numbers kept)
    text = "\n".join("" if l.startswith("# ") or l.rstrip() == HEADER else l for l in lines)
    pfacts = {"processes": {}, "threads": 0, "errors": []}
    frames, threads = pyspy.parse_text(text, pfacts, log)
    if facts["pid"] is None and pfacts["processes"]:
        facts["pid"] = next(iter(pfacts["processes"]))
    for t in threads:
        t.pop("cmdline", None)
        t.pop("python_version", None)
        t.pop("owns_gil", None)
    for f in frames:
        f.setdefault("module", None)
        f.setdefault("address", None)
    return frames, threads


register(NativeStacksParser)
