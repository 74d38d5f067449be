"""A command run in a fresh process whose hang, if it happens, explains itself.

:func:`run_explained` is ``subprocess.run(..., capture_output=True, text=True)`` with a
timeout; past it, before the process tree is killed, every process of the tree is asked for
its stacks (Python's, by ``faulthandler`` on SIGUSR1, which :data:`DUMP_ON_SIGNAL` arms in the
child's code and which its forked children inherit; native ones by gdb where it is installed;
the kernel's wait channel always), and the test fails with them. A hang seen once in CI is
then a stack to read, not a timeout to guess at.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

# put at the top of a ``python -c`` program: SIGUSR1 prints every thread's Python stack
DUMP_ON_SIGNAL = ("import faulthandler as _fh, signal as _sig\n"
                  "_fh.register(_sig.SIGUSR1, all_threads=True)\n")


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as fh:
                todo += [int(c) for c in fh.read().split()]
        except OSError:
            pass
    return out


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError as e:
        return f"({e.strerror})"


def explain(pid: int) -> str:
    """What each process of ``pid``'s tree is doing: its state and wait channel per thread and,
    with gdb, its native stacks; each is sent SIGUSR1 (its Python stacks go to its stderr)."""
    lines = []
    pids = tree(pid)
    for p in pids:
        cmd = " ".join(_read(f"/proc/{p}/cmdline").replace("\0", " ").split())[:120]
        lines.append(f"--- pid {p}: {cmd}")
        for tid in sorted(os.listdir(f"/proc/{p}/task")) if os.path.isdir(f"/proc/{p}/task") else []:
            stat = _read(f"/proc/{p}/task/{tid}/stat").rsplit(")", 1)[-1].split()[:1]
            lines.append(f"  thread {tid} {_read(f'/proc/{p}/task/{tid}/comm')}: state {stat} "
                         f"wchan {_read(f'/proc/{p}/task/{tid}/wchan')}")
        if shutil.which("gdb"):
            try:
                bt = subprocess.run(["gdb", "-p", str(p), "-batch", "-nx", "-ex", "thread apply all bt 25"],
                                    capture_output=True, text=True, timeout=60).stdout
                lines += ["  " + ln[:200] for ln in bt.splitlines() if ln.startswith(("#", "Thread"))]
            except (OSError, subprocess.TimeoutExpired):
                lines.append("  (gdb did not answer)")
    for p in pids:                     # one at a time: their stacks do not interleave
        try:
            os.kill(p, signal.SIGUSR1)
        except OSError:
            pass
        time.sleep(0.5)
    return "\n".join(lines)


def run_explained(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """``argv`` run to its end (stdout and stderr captured as text); a run past ``timeout``
    seconds fails the test with :func:`explain`'s account and what the process had written."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        account = explain(p.pid)
        for q in reversed(tree(p.pid)):
            try:
                os.kill(q, signal.SIGKILL)
            except OSError:
                pass
        out, err = p.communicate()
        raise AssertionError(f"{argv[:3]} still running after {timeout:.0f} s\n{account}\n"
                             f"--- its stdout:\n{out[-4000:]}\n--- its stderr (Python stacks):\n{err[-20000:]}")
    return subprocess.CompletedProcess(argv, p.returncode, out, err)
