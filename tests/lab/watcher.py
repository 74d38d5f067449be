"""The black-box watcher as an operator runs it (``stallscope capture --watch`` with no --pid and
no --nccl-lib, as deploy/ runs it), for the benches that time or score its bundles
(bench/time_to_bundle.py, bench/accuracy.py). Standard library only.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .scenarios import REPO


class WatcherError(RuntimeError):
    """The watcher exited or did not say ``capturing:`` in time (the message holds its stderr's tail)."""


def start_watcher(bundles: Path, args: list[str], err: Path, timeout_s: float = 120.0) -> subprocess.Popen:
    """Start a watcher writing its bundles into ``bundles`` (extra ``args``, e.g. ``--hang-after
    10s``; ``--cooldown 1s`` always), its stderr into ``err``; return once it is capturing.
    Raises :class:`WatcherError` (after stopping it) when it exits or is not capturing within
    ``timeout_s``."""
    p = subprocess.Popen([sys.executable, "-m", "capture", "--watch", "-o", str(bundles), "--cooldown", "1s", *args],
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(err, "wb"))
    deadline = time.monotonic() + timeout_s
    while b"capturing:" not in err.read_bytes():
        if p.poll() is not None or time.monotonic() > deadline:
            stop_watcher(p)
            raise WatcherError("the watcher did not start:\n" + err.read_text(errors="replace")[-2000:])
        time.sleep(0.2)
    return p


def stop_watcher(p: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """SIGTERM (the watcher writes an open incident, then exits), SIGKILL if it outlives ``timeout_s``."""
    if p.poll() is None:
        p.terminate()
    try:
        p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
