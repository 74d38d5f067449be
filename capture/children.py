"""Child processes that cannot outlive the capture.

Each child runs in its own process group (so a terminal's Ctrl-C reaches only
capture, which then stops the children in order and lets tcpdump and bpftrace
flush) and with ``PR_SET_PDEATHSIG`` = SIGKILL (so they die with capture even
when capture itself is SIGKILLed). The death signal belongs to the *thread*
that forked the child: long-running children must be started from the main
thread. bpftrace's probes are file descriptors: they go when bpftrace goes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import time

PR_SET_PDEATHSIG = 1
_libc = None


def _prctl():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc.prctl


def _child_setup(parent_pid: int):
    prctl = _prctl()

    def setup():  # runs in the child between fork and exec: async-signal-safe calls only
        os.setpgid(0, 0)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return setup


def spawn(argv: list[str], stdout=None, stderr=None, stdin=subprocess.DEVNULL, **kw) -> subprocess.Popen:
    """Start argv in its own process group, killed if capture dies."""
    _prctl()  # load libc before fork
    return subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=stdin,
                            preexec_fn=_child_setup(os.getpid()), close_fds=True, **kw)


def run(argv: list[str], timeout: float, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw):
    """Run argv to completion (bounded); returns (rc, stdout_bytes, stderr_bytes).

    rc is None when the command had to be killed at the timeout."""
    p = spawn(argv, stdout=stdout, stderr=stderr, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out or b"", err or b""
    except subprocess.TimeoutExpired:
        kill_group(p, signal.SIGKILL)
        out, err = p.communicate()
        return None, out or b"", (err or b"") + f"\n[killed after {timeout:.0f}s]".encode()


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
    return p.returncode
