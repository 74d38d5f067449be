"""Native stacks of the job's processes, taken once and only when the job is hung.

``eu-stack`` (elfutils), ``gdb -batch`` or, for Python processes, ``py-spy dump
--native`` attach with ptrace: every thread stops while its stack is read. That
is acceptable in a hung job and nowhere else, so in ``--stacks auto`` (the
default) capture first decides whether the job progresses (:func:`decide`):

- with the tracer running and having seen NCCL calls: did any collective (or CUDA
  host wait) return during the grace period? (:func:`tracer_activity` reads the
  spooled raw records; a record with its return time, or a return record, is a
  completed call);
- otherwise (``--no-bpf``, the tracer did not start, or it saw no NCCL call at all,
  e.g. a job hung before the capture): the job's TCP byte counters (``ss -ti``
  bytes_acked + bytes_received of the processes' sockets, per network namespace),
  the host's InfiniBand port data counters, and the processes' CPU time, read at the
  start and at the end of the grace period (:class:`ProgressProbe`).

Each tool run is bounded (:func:`run_bounded`): at the timeout its process group
gets SIGTERM (gdb detaches on it), 1 s later SIGKILL; a target that a killed
tracer left stopped (state ``t``/``T`` in /proc, and not stopped before) gets
SIGCONT. Standard library only.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import children, procs
from .tracer.events import RET_KIND, parse_record
from .tracer.spool import raw_files

TOOLS = ("eu-stack", "gdb", "py-spy")
PROGRESS_BYTES = 256 * 1024     # TCP or IB payload growth over the grace period that counts as progress
DATA_SOCKET_BYTES = 1 << 20     # a socket that has carried this much is a data socket (not bootstrap/store)
CPU_PROGRESS_FRACTION = 0.02    # CPU seconds per second of grace (all processes together) that count as progress
HEADER = "# stallscope native stacks"
STATE_NAMES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped", "t": "tracing-stop",
               "Z": "zombie", "X": "dead", "I": "idle", "P": "parked", "W": "waking", "K": "wakekill"}


# ---------------------------------------------------------------- tools
def tool_argv(tool: str, pid: int) -> list[str]:
    if tool == "eu-stack":   # -s: source file:line, -m: the module of each frame (symbol names from .symtab/.dynsym)
        return ["eu-stack", "-p", str(pid), "-s", "-m"]
    if tool == "gdb":
        return ["gdb", "-batch", "-nx", "-p", str(pid), "-ex", "set pagination off", "-ex", "thread apply all bt"]
    if tool == "py-spy":     # no --nonblocking: py-spy stops the process to read a consistent native stack
        return ["py-spy", "dump", "--native", "--pid", str(pid)]
    raise ValueError(tool)


def available_tools(python: bool) -> list[str]:
    """The stack tools on PATH for a process, in order of preference."""
    return [t for t in TOOLS if (python or t != "py-spy") and shutil.which(t)]


def output_ok(tool: str, rc: int | None, out: bytes) -> bool:
    """Whether a finished tool run produced stacks (eu-stack exits 1 when only some frames failed)."""
    if rc is None:
        return False
    if tool == "eu-stack":
        return rc in (0, 1) and b"TID " in out
    if tool == "gdb":   # gdb -batch exits 0 or 1 whatever happened: a frame #0 says it attached
        return re.search(rb"(?m)^#0 ", out) is not None
    return rc == 0 and b"Thread " in out


# ---------------------------------------------------------------- /proc
def thread_table(pid: int) -> list[tuple[int, str, str]]:
    """(tid, state letter, comm) of every thread of pid, read before a tool attaches."""
    rows = []
    for d in sorted(glob.glob(f"/proc/{pid}/task/*"), key=lambda p: int(p.rsplit("/", 1)[1])):
        tid = int(d.rsplit("/", 1)[1])
        try:
            stat = Path(d, "stat").read_text()
            state = stat.rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        try:
            comm = Path(d, "comm").read_text().rstrip("\n")
        except OSError:
            comm = ""
        rows.append((tid, state, comm))
    return rows


def stopped_threads(pid: int) -> set[int]:
    return {tid for tid, state, _ in thread_table(pid) if state in ("t", "T")}


def cpu_seconds(pid: int) -> float | None:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


# ---------------------------------------------------------------- the bounded run
@dataclass
class RunResult:
    rc: int | None
    out: bytes
    err: bytes
    killed: bool = False            # still running at the timeout: its process group was killed
    resumed: list[int] = field(default_factory=list)   # threads left stopped by the tool, sent SIGCONT
    seconds: float = 0.0


def run_bounded(argv: list[str], timeout_s: float, target_pid: int, term_grace_s: float = 1.0) -> RunResult:
    """Run a stack tool against target_pid, bounded: SIGTERM to its process group at the
    timeout, SIGKILL ``term_grace_s`` later; then SIGCONT to the target if the tool left it
    stopped (a tracer that dies detaches, but a thread stopped by its attach stays stopped)."""
    stopped_before = stopped_threads(target_pid)
    t0 = time.monotonic()
    p = children.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed = False
    try:
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            killed = True
            children.kill_group(p, signal.SIGTERM)
            try:
                out, err = p.communicate(timeout=term_grace_s)
            except subprocess.TimeoutExpired:
                children.kill_group(p, signal.SIGKILL)
                try:
                    out, err = p.communicate(timeout=5)
                except subprocess.TimeoutExpired:   # a grandchild that left the group holds the pipes
                    for fh in (p.stdout, p.stderr):
                        fh.close()
                    p.wait(timeout=5)
                    out, err = b"", b""
    finally:
        children.kill_group(p, signal.SIGKILL)     # whatever it left behind in its group
        children.forget(p)
    res = RunResult(rc=None if killed else p.returncode, out=out or b"", err=err or b"", killed=killed,
                    seconds=time.monotonic() - t0)
    res.resumed = resume_if_stopped(target_pid, stopped_before)
    return res


def resume_if_stopped(pid: int, stopped_before: set[int], settle_s: float = 0.2) -> list[int]:
    """SIGCONT pid when threads that were running before are now stopped; those threads."""
    left: list[int] = []
    for _ in range(2):                  # the kernel detaches a dead tracer's tracees asynchronously
        left = sorted(stopped_threads(pid) - stopped_before)
        if not left:
            return []
        time.sleep(settle_s)
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        return []
    return left


def render(pid: int, phase: str, tool: str | None, argv: list[str] | None, threads, decision: str | None,
           res: RunResult | None, notes: list[str]) -> bytes:
    """The file stacks/native-<pid>-<phase>.txt: a header the native_stacks parser reads
    (thread names and states from /proc, taken before the tool attached), then the
    tool's output as it printed it, then its stderr as comments."""
    lines = [HEADER, f"# pid: {pid}", f"# phase: {phase}"]
    if tool:
        lines.append(f"# tool: {tool}")
    if argv:
        lines.append(f"# command: {shlex.join(argv)}")
    if decision:
        lines.append(f"# decision: {' '.join(decision.split())}")
    for tid, state, comm in threads:
        lines.append(f"# thread: {tid} {state} {json.dumps(comm)}")
    for n in notes:
        lines.append(f"# note: {' '.join(n.split())}")
    head = ("\n".join(lines) + "\n").encode()
    if res is None:
        return head
    body = res.out if res.out.endswith(b"\n") or not res.out else res.out + b"\n"
    tail = [f"# rc: {res.rc if res.rc is not None else 'killed'}"]
    tail += ["# stderr: " + l for l in res.err.decode("utf-8", "replace").splitlines()[-200:]]
    return head + body + ("\n".join(tail) + "\n").encode()


# ---------------------------------------------------------------- is the job progressing?
@dataclass
class Sample:
    t: float
    tcp: dict[tuple, int] | None        # (netns inode, local, peer) -> bytes_acked + bytes_received
    ib: int | None                      # port data bytes of every IB/RoCE port of the host
    cpu: dict[int, float]


class ProgressProbe:
    """Counters that move while a job makes progress: TCP bytes of the job's sockets per
    network namespace (``ss -tinH``, entered with nsenter), IB port data, CPU time."""

    def __init__(self, pids: list[int], netns: dict[int, tuple[int, int | str, bool]]):
        self.pids = list(pids)
        self.netns = netns      # inode -> (inode, a pid inside, own namespace)

    def sample(self) -> Sample:
        return Sample(t=time.monotonic(), tcp=self.tcp_bytes(), ib=ib_bytes(),
                      cpu={p: c for p in self.pids if (c := cpu_seconds(p)) is not None})

    def tcp_bytes(self) -> dict[tuple, int] | None:
        if shutil.which("ss") is None:
            return None
        want = set(self.pids)
        out: dict[tuple, int] = {}
        for inode, pid, own in self.netns.values():
            argv = ["ss", "-tinpH"] if own else ["nsenter", f"--net=/proc/{pid}/ns/net", "ss", "-tinpH"]
            try:
                rc, so, _ = children.run(argv, timeout=10)
            except OSError:
                continue
            if rc != 0:
                continue
            for row in procs.parse_ss_tinp(so.decode("utf-8", "replace")):
                if want & set(row.get("pids", [])):
                    out[(inode, row["local"], row["peer"])] = row.get("bytes_acked", 0) + row.get("bytes_received", 0)
        return out


def ib_bytes() -> int | None:
    """port_xmit_data + port_rcv_data (4-byte units) of every InfiniBand/RoCE port; None without any."""
    total, seen = 0, False
    for port in glob.glob("/sys/class/infiniband/*/ports/*/counters"):
        for name in ("port_xmit_data", "port_rcv_data"):
            try:
                total += int(Path(port, name).read_text().strip()) * 4
                seen = True
            except (OSError, ValueError):
                pass
    return total if seen else None


@dataclass
class TracerActivity:
    calls: int = 0          # NCCL API calls and CUDA host waits the tracer recorded (entries)
    completed: int = 0      # of those, the ones that returned (collectives: launched; waits: done)
    inits: int = 0          # communicator inits (JSON lines)


def tracer_activity(raw_dir: Path, call_returns: bool = True, max_bytes: int = 256 << 20) -> TracerActivity:
    """Count what the tracer spooled so far (raw bpftrace lines, see capture.tracer.spool)."""
    act = TracerActivity()
    read = 0
    for f in raw_files(raw_dir):
        try:
            fh = open(f, "rb")
        except OSError:
            continue
        with fh:
            for line in fh:
                read += len(line)
                if read > max_bytes:
                    return act
                rec = parse_record(line)
                if rec is not None:
                    fields = rec[2]
                    kind = fields[0]
                    if kind == RET_KIND:
                        act.completed += 1
                        continue
                    if 16 <= kind < 32:         # ncclGroupStart/End: not evidence either way
                        continue
                    act.calls += 1
                    if fields[9] or (kind < 16 and not call_returns):
                        act.completed += 1
                elif line[:1] == b"{" and (b'"ev":"comm_init"' in line or b'"ev":"unique_id"' in line):
                    act.inits += 1
    return act


def _fmt_bytes(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def decide(grace_s: float, activity: TracerActivity | None, before: Sample, after: Sample,
           tracer_note: str) -> tuple[bool, str]:
    """(hung, why). ``activity`` None: the tracer is not running (``tracer_note`` says why)."""
    g = f"{grace_s:g}s"
    if activity is not None and activity.calls > 0:
        if activity.completed > 0:
            return False, (f"collectives completed during the first {g} ({activity.completed} NCCL calls or CUDA "
                           "host waits returned, tracer): no ptrace stop")
        return True, (f"no collective completed during the first {g}: {activity.calls} NCCL calls or host waits "
                      "entered, none returned (tracer)")
    why = tracer_note if activity is None else "the tracer saw no NCCL call"
    window = max(1e-3, after.t - before.t)
    ev = []
    tcp_growth, data_socket = 0, False
    if after.tcp is not None and before.tcp is not None:
        for k, v in after.tcp.items():
            tcp_growth += max(0, v - before.tcp.get(k, 0))
            data_socket |= v >= DATA_SOCKET_BYTES
        ev.append(f"TCP +{_fmt_bytes(tcp_growth)} on {len(after.tcp)} sockets"
                  + ("" if data_socket else " (none has carried 1 MiB: no data socket)"))
    else:
        ev.append("no TCP counters (ss missing)")
    ib_growth = None
    if after.ib is not None and before.ib is not None:
        ib_growth = max(0, after.ib - before.ib)
        ev.append(f"IB ports +{_fmt_bytes(ib_growth)}")
    cpu = sum(max(0.0, c - before.cpu.get(p, c)) for p, c in after.cpu.items())
    ev.append(f"CPU +{cpu:.2f}s")
    evidence = ", ".join(ev) + f" over {window:.1f}s ({why})"
    if tcp_growth >= PROGRESS_BYTES:
        return False, f"job progressing during the first {g}: {evidence}: no ptrace stop"
    if ib_growth is not None and ib_growth >= PROGRESS_BYTES:
        return False, f"job (or this host) progressing during the first {g}: {evidence}: no ptrace stop"
    network = data_socket or ib_growth is not None
    if not network and cpu >= CPU_PROGRESS_FRACTION * window:
        return False, (f"job busy during the first {g} and no network counter to tell progress from spinning: "
                       f"{evidence}: no ptrace stop (--stacks always takes them anyway)")
    return True, f"nothing progressed during the first {g}: {evidence}"
