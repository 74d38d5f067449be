"""torchrun (torch.distributed.elastic) reports of the job's processes: who failed, where, how.

Also the launchers' own words for a process that died: Slurm's ``srun: error: node7: task 3:
Killed`` and slurmstepd's OOM kill, Open MPI's ``exited on signal 9 (Killed)``, the older
torch.distributed.launch's ``CalledProcessError ... died with <Signals.SIGKILL: 9>``.

When a worker dies, torchrun's agent logs it and, as it exits, prints a summary naming every
failed process with the host it ran on, its global and local rank, exit code and pid:

    torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
    [1]:
      time      : 2024-03-05_10:11:12
      host      : node-7.cluster
      rank      : 13 (local_rank: 5)
      exitcode  : -6 (pid: 41234)
      error_file: <N/A>
      traceback : Signal 6 (SIGABRT) received by PID 41234
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      ...

(torch 1.9+; the same fields in every version since). The agent's own lines:
``failed (exitcode: -6) local_rank: 0 (pid: 41234) of binary: ...``, ``Sending process 41234
closing signal SIGTERM`` and ``Received 15 death signal, shutting down workers`` (the agent
itself signalled from outside) (with Python logging, c10 or ``[default0]:`` prefixes, all skipped by
searching). These tie global ranks to hosts and pids when no NCCL line does, and tell the first
process that died from the ones torchrun killed after it.

Table ``process_exits`` (one row per process a summary or agent line names):
    line (int), kind (root_cause|failure|agent_failed|sigterm|agent_signal (the agent's own
    death signal: no pid, signal set); launchers' own lines: slurm_task,
    slurm_oom, mpi_rank, launch: :func:`launcher_rows`), time (str as printed), host
    (str), rank (int: global), local_rank (int), exitcode (int), pid (int), signal (str:
    SIGABRT, SIGKILL, ... from a negative exit code or the traceback line), error_file (str),
    traceback (str: its first line), and the launcher context (ctx_rank, ctx_local_rank,
    ctx_host, ctx_pid, ctx_clock).
"""
from __future__ import annotations

import re
import signal

from . import lines as lines_mod
from ..coerce import text_int
from .heads import TORCH_ELASTIC_MARKERS
from .registry import WarningLog, register
from .text import LogText, TextParser

FIELD_RE = re.compile(r"\b(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s*(?P<value>.*?)\s*$")
RANK_RE = re.compile(r"^(?P<rank>-?\d+)\s*\(local_rank:\s*(?P<local>-?\d+)\)")
EXIT_RE = re.compile(r"^(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)")
AGENT_RE = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)")
SIGTERM_RE = re.compile(r"Sending process (?P<pid>\d+) closing signal (?P<sig>SIG[A-Z]+)")
# the agent itself signalled (the scheduler, a preemption, a user): "Received 15 death signal, shutting down
# workers" (Python < 3.11 prints the signal as "Signals.SIGTERM")
DEATH_RE = re.compile(r"Received (?:(?P<n>\d+)|Signals\.(?P<name>SIG[A-Z]+)) death signal")
SIGNAL_IN_TEXT_RE = re.compile(r"Signal (?P<n>\d+) \((?P<name>SIG[A-Z]+)\)")
# Slurm: "srun: error: node7: task 3: Killed", "...: tasks 0-7: Exited with exit code 1", "... Out Of Memory";
# slurmstepd's cgroup OOM killer: "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=1234.0 cgroup"
SRUN_RE = re.compile(r"srun: error: (?P<host>[^\s:]+): tasks? (?P<tasks>[\d,\-\[\] ]+?): (?P<what>.+?)\s*$")
SLURM_OOM_RE = re.compile(r"slurmstepd(?:-[\w.-]+)?: error: (?:Detected (?P<n>\d+) oom[-_]kill event|.*\bOOM[ -]?Kill"
                          r"|.*[Oo]ut [Oo]f [Mm]emory)")
# Open MPI: "mpirun noticed that process rank 3 with PID 4242 on node node7 exited on signal 9 (Killed)."
MPIRUN_RE = re.compile(r"noticed that process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node (?P<host>\S+?) "
                       r"exited on signal (?P<sig>\d+)(?: \((?P<what>[^)]*)\))?")
# torch.distributed.launch (before torchrun): "subprocess.CalledProcessError: Command '[..., '--local_rank=3']'
# died with <Signals.SIGKILL: 9>." or "... returned non-zero exit status 1."
LAUNCH_RE = re.compile(r"CalledProcessError: Command .*?(?:--local[-_]rank[= ](?P<local>\d+).*?)?'?\]?'? "
                       r"(?:died with <Signals\.(?P<sig>SIG[A-Z]+): (?P<n>\d+)>|returned non-zero exit status "
                       r"(?P<code>-?\d+))")
# what srun says of a task: the signal it names
SRUN_SIGNALS = {"killed": "SIGKILL", "out of memory": "SIGKILL", "segmentation fault": "SIGSEGV", "aborted": "SIGABRT",
                "terminated": "SIGTERM", "bus error": "SIGBUS", "illegal instruction": "SIGILL",
                "floating point exception": "SIGFPE"}
EXIT_CODE_RE = re.compile(r"[Ee]xited with exit code (?P<code>\d+)")
MAX_TASKS = 64
NEEDLES = (b"exitcode", b"closing signal", b"death signal", b"srun: error:", b"slurmstepd", b"exited on signal", b"CalledProcessError")


def signal_name(code: int | None) -> str | None:
    """The signal of a negative exit code (-6: SIGABRT), as torchrun reports them."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class TorchElasticParser(TextParser):
    NEEDLES = NEEDLES       # the lines it reads (besides MARKERS: whether it reads the file at all)
    NAME = "torch_elastic"
    DESCRIPTION = "torchrun's failure summary and agent lines: the failed processes' hosts, ranks, exit codes"
    GLOBS = ("logs/*", "logs/**/*")
    MARKERS = TORCH_ELASTIC_MARKERS
    SCHEMAS = {"process_exits": {
        "line": "int", "kind": "str", "time": "str", "host": "str", "rank": "int", "local_rank": "int",
        "exitcode": "int", "pid": "int", "signal": "str", "error_file": "str", "traceback": "str",
        **lines_mod.CONTEXT_COLUMNS}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return b"ChildFailedError" in head or bool(re.search(rb"exitcode\s*:\s*-?\d+ \(pid:", head))

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        log = WarningLog(label)
        if cls.unreadable(text, log, "a text log"):
            return cls.result(label, {}, {}, log)
        rows = []
        for ln, line, start, end in text.iter_spans(text.lines_with(NEEDLES)):
            line = lines_mod.ANSI_RE.sub("", line)
            if ("(exitcode:" in line and not AGENT_RE.search(line)) or \
                    ("closing signal" in line and not SIGTERM_RE.search(line)) or line.rstrip().endswith("Sending"):
                line = _unwrapped(text, end, line)      # hard-wrapped by a terminal: joined with what follows
            if (m := AGENT_RE.search(line)):
                code = int(m["code"])
                rows.append({"line": ln, "kind": "agent_failed", "exitcode": code, "local_rank": int(m["local"]),
                             "pid": int(m["pid"]), "signal": signal_name(code),
                             **lines_mod.context(line[:m.start()]).as_row()})
            elif (m := SIGTERM_RE.search(line)):
                rows.append({"line": ln, "kind": "sigterm", "pid": int(m["pid"]), "signal": m["sig"],
                             **lines_mod.context(line[:m.start()]).as_row()})
            elif (m := DEATH_RE.search(line)):
                sig = m["name"] or signal_name(-int(m["n"]))
                rows.append({"line": ln, "kind": "agent_signal", "signal": sig,
                             "traceback": f"torchrun's agent received {sig}, shutting down its workers",
                             **lines_mod.context(line[:m.start()]).as_row()})
            elif (f := FIELD_RE.search(line)) and f["key"] == "exitcode" and EXIT_RE.match(f["value"]):
                rows.append(_block(text, ln, line, start, end, f))
            else:
                rows.extend(launcher_rows(ln, line))
        if not rows:
            log.add(None, "no torchrun failure report found")
        return cls.result(label, {"process_exits": rows}, {}, log)


def launcher_rows(ln: int, line: str) -> list[dict]:
    """The ``process_exits`` rows of one Slurm, Open MPI or torch.distributed.launch line (none
    when it is none of theirs): kinds ``slurm_task`` (one row per task, ``rank`` the task id),
    ``slurm_oom`` (slurmstepd's cgroup OOM kill: no rank), ``mpi_rank``, ``launch``."""
    if (m := SRUN_RE.search(line)):
        what = m["what"].strip().rstrip(".")
        sig = SRUN_SIGNALS.get(what.lower())
        code = EXIT_CODE_RE.search(what)
        if sig is None and code is None:
            return []
        base = {"line": ln, "kind": "slurm_task", "host": m["host"], "signal": sig, "traceback": what,
                "exitcode": int(code["code"]) if code else None}
        return [{**base, "rank": t} for t in _tasks(m["tasks"])] or [base]
    if (m := SLURM_OOM_RE.search(line)):
        return [{"line": ln, "kind": "slurm_oom", "signal": "SIGKILL", "traceback": line[m.start():].strip()[:200],
                 **lines_mod.context(line[:m.start()]).as_row()}]
    if (m := MPIRUN_RE.search(line)):
        return [{"line": ln, "kind": "mpi_rank", "rank": int(m["rank"]), "pid": int(m["pid"]), "host": m["host"],
                 "exitcode": -int(m["sig"]), "signal": signal_name(-int(m["sig"])), "traceback": m["what"]}]
    if (m := LAUNCH_RE.search(line)):
        code = -int(m["n"]) if m["n"] else int(m["code"])
        return [{"line": ln, "kind": "launch", "local_rank": text_int(m["local"]), "exitcode": code,
                 "signal": m["sig"] or signal_name(code), **lines_mod.context(line[:m.start()]).as_row()}]
    return []


def _tasks(text: str) -> list[int]:
    """Slurm's task list ("3", "0-7", "[0-3,5]"): the task ids, at most MAX_TASKS."""
    out: list[int] = []
    for part in text.strip("[] ").split(","):
        a, _, b = part.strip().partition("-")
        if a.isdigit() and (not b or b.isdigit()):
            out += list(range(int(a), min(int(b or a), int(a) + MAX_TASKS) + 1))
    return out[:MAX_TASKS]


def _unwrapped(text: LogText, end: int, line: str) -> str:
    """A line and up to two after it joined (no separator: a terminal's hard wrap cuts mid-word)
    when that completes an agent line."""
    joined = line
    for nxt in text.following(end, 2):
        joined += nxt
        if AGENT_RE.search(joined) or SIGTERM_RE.search(joined):
            return joined
    return line


def _block(text: LogText, ln: int, line: str, start: int, end: int, f: re.Match) -> dict:
    """One ``[i]:`` entry of the summary around its exitcode line: time, host and rank above
    it, error_file and traceback below, and whether it is under ``Root Cause``."""
    row: dict = {"line": ln, "kind": "failure", **lines_mod.context(line[:f.start()]).as_row()}
    fields = {}
    above = text.preceding(start, 8)
    for prev in reversed(above):
        g = FIELD_RE.search(lines_mod.ANSI_RE.sub("", prev))
        if g is None or g["key"] in fields or g["key"] == "exitcode":
            if "Root Cause" in prev:
                row["kind"] = "root_cause"
                break
            if g is None and re.search(r"\[\d+\]:\s*$|^[=-]{10,}", prev.strip()):
                break
            continue
        fields[g["key"]] = g["value"]
    for nxt in text.following(end, 3):
        g = FIELD_RE.search(lines_mod.ANSI_RE.sub("", nxt))
        if g is None or g["key"] in ("time", "host", "rank", "exitcode"):
            break
        fields[g["key"]] = g["value"]
    if row["kind"] == "failure" and any("Root Cause" in p for p in above[-10:]):
        row["kind"] = "root_cause"
    if (m := EXIT_RE.match(f["value"])):
        row["exitcode"], row["pid"] = int(m["code"]), int(m["pid"])
        row["signal"] = signal_name(row["exitcode"])
    if (m := RANK_RE.match(fields.get("rank", ""))):
        row["rank"], row["local_rank"] = int(m["rank"]), int(m["local"])
    row["time"] = fields.get("time")
    row["host"] = fields.get("host") or None
    err = fields.get("error_file")
    row["error_file"] = None if err in (None, "<N/A>", "") else err
    tb = fields.get("traceback")
    row["traceback"] = tb
    if row.get("signal") is None and tb and (s := SIGNAL_IN_TEXT_RE.search(tb)):
        row["signal"] = s["name"]
    return row


register(TorchElasticParser)
