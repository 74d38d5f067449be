"""Child processes that cannot outlive the capture.

Each child runs in its own process group (so a terminal's Ctrl-C reaches only
capture, which then stops the children in order and lets tcpdump and bpftrace
flush) and with ``PR_SET_PDEATHSIG`` = SIGKILL (so it dies with capture even
when capture itself is SIGKILLed). The death signal belongs to the *thread*
that forked the child: long-running children must be started from the main
thread. bpftrace's probes are file descriptors: they go when bpftrace goes.

The death signal reaches the direct child only, not what it starts (the
processes of ``--nccl-tests "mpirun ..."``, a shell's children). For those a
:class:`Guardian` watches: a small process of its own (standard library
Python) that learns the process group of every child through a pipe and, when
that pipe closes without a clean "exit" (capture died, however), sends SIGINT
and then SIGKILL to every group still registered, leaves a marker
(``.capture-died.json``) in the staging folder and says on stderr where the
data captured so far are kept. A process that leaves its group on purpose
(``setsid``) escapes it; only a cgroup would hold such a process.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
_libc = None


def libc():
    """The C library (ctypes, errno kept), loaded once."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _prctl():
    return libc().prctl


def _child_setup(parent_pid: int):
    prctl = _prctl()

    def setup():  # runs in the child between fork and exec: async-signal-safe calls only
        os.setpgid(0, 0)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return setup


GUARDIAN_CODE = r"""
import json, os, signal, sys, time
for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT):
    signal.signal(s, signal.SIG_IGN)
staging, capture_pid = sys.argv[1], int(sys.argv[2])
ring_marker = sys.argv[3] if len(sys.argv) > 3 else None
groups, clean, buf = set(), False, b""
while True:
    try:
        data = os.read(0, 65536)
    except InterruptedError:
        continue
    except OSError:
        data = b""
    if not data:
        break
    buf += data
    *lines, buf = buf.split(b"\n")
    for line in lines:
        if line.startswith(b"+"):
            groups.add(int(line[1:]))
        elif line.startswith(b"-"):
            groups.discard(int(line[1:]))
        elif line == b"exit":
            clean = True
if clean:
    sys.exit(0)
def alive(g):
    try:
        os.killpg(g, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
found = sorted(g for g in groups if alive(g))
for sig, wait in ((signal.SIGINT, 1.0), (signal.SIGKILL, 2.0)):
    for g in found:
        try:
            os.killpg(g, sig)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(alive(g) for g in found):
        time.sleep(0.05)
left = [g for g in found if alive(g)]
marker = {"capture_pid": capture_pid, "detected_realtime_ns": time.time_ns(),
          "detected_monotonic_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
          "stopped_process_groups": found, "still_alive": left}
try:
    if ring_marker and os.path.isdir(staging) and not os.path.exists(os.path.join(staging, ring_marker)):
        import shutil
        shutil.rmtree(staging, ignore_errors=True)
        sys.stderr.write(
            f"stallscope capture: the watcher {capture_pid} died; its {len(found)} child process group(s) were "
            "stopped and its rings removed (no incident was pending).\n")
        sys.stderr.flush()
    elif os.path.isdir(staging):
        with open(os.path.join(staging, ".capture-died.json"), "w") as fh:
            json.dump(marker, fh)
        folder = os.path.dirname(os.path.abspath(staging)) or "."
        sys.stderr.write(
            f"stallscope capture: the capture process {capture_pid} died before writing its bundle; "
            f"its {len(found)} child process group(s) were stopped. The data captured so far are kept in "
            f"{staging}: 'stallscope capture --recover {folder}' (or the next capture into that folder) "
            "turns them into a partial bundle.\n")
        sys.stderr.flush()
except OSError:
    pass
"""


class Guardian:
    """Kills the children's process groups if capture dies without saying goodbye.

    ``add``/``discard`` keep it informed (spawn and stop do it); ``close`` says
    goodbye (a clean exit: nothing is killed)."""

    def __init__(self, staging, python: str | None = None, ring_marker: str | None = None):
        """ring_marker (capture.watch): the staging folder holds rings, removed when capture
        dies unless this file is in it (an incident's data are only there)."""
        r, w = os.pipe()
        os.set_inheritable(r, True)

        def setup():
            os.setpgid(0, 0)   # not in capture's group: a terminal's Ctrl-C is capture's to handle
        self._lock = threading.Lock()
        try:
            argv = [python or sys.executable, "-S", "-E", "-c", GUARDIAN_CODE, str(staging), str(os.getpid())]
            self.proc = subprocess.Popen(argv + ([ring_marker] if ring_marker else []), stdin=r,
                                         stdout=subprocess.DEVNULL, close_fds=True, preexec_fn=setup)
        finally:
            os.close(r)
        self._w = w

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, msg: str) -> None:
        with self._lock:
            if self._w is None:
                return
            try:
                os.write(self._w, (msg + "\n").encode())
            except OSError:   # the guardian is gone: nothing more to tell it
                os.close(self._w)
                self._w = None

    def add(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def discard(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        self._send("exit")
        with self._lock:
            if self._w is not None:
                os.close(self._w)
                self._w = None
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_guardian: Guardian | None = None


def set_guardian(g: Guardian | None) -> None:
    global _guardian
    _guardian = g


def spawn(argv: list[str], stdout=None, stderr=None, stdin=subprocess.DEVNULL, **kw) -> subprocess.Popen:
    """Start argv in its own process group, killed if capture dies."""
    _prctl()  # load libc before fork
    p = subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=stdin,
                         preexec_fn=_child_setup(os.getpid()), close_fds=True, **kw)
    if _guardian is not None:
        _guardian.add(p.pid)   # the child's pid is its process group (setpgid(0, 0) before exec)
    return p


def forget(p: subprocess.Popen) -> None:
    """Stop guarding ``p``'s process group (it ended, or its group was killed): the guardian
    no longer kills it should capture die."""
    if _guardian is not None:
        _guardian.discard(p.pid)


def run(argv: list[str], timeout: float, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw):
    """Run argv to completion (bounded); returns (rc, stdout_bytes, stderr_bytes).

    rc is None when the command had to be killed at the timeout."""
    p = spawn(argv, stdout=stdout, stderr=stderr, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
        kill_group(p, signal.SIGKILL)   # anything it left behind in its group
        return p.returncode, out or b"", err or b""
    except subprocess.TimeoutExpired:
        kill_group(p, signal.SIGKILL)
        out, err = p.communicate()
        return None, out or b"", (err or b"") + f"\n[killed after {timeout:.0f}s]".encode()
    finally:
        forget(p)


def kill_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass


def stop(p: subprocess.Popen, first: int = signal.SIGINT, grace_s: float = 5.0) -> int | None:
    """SIGINT (flush), then SIGTERM, then SIGKILL to p's process group; returns its exit code."""
    for sig, wait in ((first, grace_s), (signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        if p.poll() is not None:
            break
        kill_group(p, sig)
        deadline = time.monotonic() + wait
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    if p.poll() is None:
        return None
    # the leader is gone; make sure nothing of its group lingers either
    kill_group(p, signal.SIGKILL)
    forget(p)
    return p.returncode
