"""How many processes read the bundles (``stallscope analyze --jobs``), and the fork server
their workers start from (:mod:`forensics.model.parallel` runs them). Standard library only:
the command line starts the fork server before it imports the analyzer, so the server's own
imports (pandas, numpy, the per-host stage: most of a second) run on another core while this
process does its own, and the first hosts do not wait for them. :class:`Forked`: the second
core's share of the work after the reading (:func:`forensics.analysis.analyze`)."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import select
import signal
import sys
import time

# below this much bundle data in all, worker processes cost more than they save (a pool's
# start is ~0.3 s; a host of 1M packets is ~15 MB compressed and ~1 s to read)
POOL_MIN_BYTES = 32 * 2**20

# what the fork server imports once for every worker it forks
PRELOAD = ["forensics.model.hosts", "forensics.tcp", "pandas", "numpy"]


def default_jobs(paths: list | None = None) -> int:
    """``--jobs`` when not given: the cores this process may run on, or 1 for bundles too
    small together to pay for a pool (``paths`` given)."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = max(1, os.cpu_count() or 1)
    if paths is not None and (len(paths) < 2 or _size(paths) < POOL_MIN_BYTES):
        return 1
    return cores


def _size(paths: list) -> int:
    total = 0
    for p in paths:
        try:
            if os.path.isdir(p):
                total += sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(p) for f in fs
                             if not os.path.islink(os.path.join(d, f)))
            else:
                total += os.path.getsize(p)
        except OSError:
            continue        # a missing bundle is reported by the reading itself
        if total >= POOL_MIN_BYTES:
            break
    return total


def context():
    """A fork server that has imported the analyzer (workers start in milliseconds, and no
    thread of this process is forked); plain fork when the main program cannot be imported
    again by the workers (a script read from standard input)."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main is not None and not os.path.isfile(main):
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_early() -> None:
    """Start the fork server now, without waiting for its imports (a pool created later
    finds it running)."""
    if context().get_start_method() == "forkserver":
        from multiprocessing import forkserver
        forkserver.ensure_running()


class Forked:
    """``fn(*args)`` computed now in a forked copy of this process (its memory shared
    copy-on-write, nothing to send it), while this process goes on with other work on another
    core; :meth:`result` is its value. The child only computes and pickles its value down a
    pipe, then leaves with ``os._exit`` (no atexit handler, no buffered output of this process
    written twice). Best effort: where fork is missing, or the child fails or outlives
    ``timeout`` seconds after :meth:`result` is called, :meth:`result` is None and the caller
    computes the value itself."""

    def __init__(self, fn, *args, timeout: float = 60.0):
        self.timeout = timeout
        self._pid: int | None = None
        self._fd: int | None = None
        if not hasattr(os, "fork"):
            return
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return
        if pid == 0:                                  # the child
            status = 1
            try:
                os.close(r)
                data = pickle.dumps(fn(*args), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(w, "wb") as fh:
                    fh.write(data)
                status = 0
            except BaseException:                     # noqa: BLE001 - the parent computes it then
                pass
            finally:
                os._exit(status)
        os.close(w)
        self._pid, self._fd = pid, r

    def result(self):
        if self._pid is None:
            return None
        chunks, deadline = [], time.monotonic() + self.timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                    os.kill(self._pid, signal.SIGKILL)   # stuck: give up on it
                    chunks = []
                    break
                chunk = os.read(self._fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(self._fd)
            _, status = os.waitpid(self._pid, 0)
            self._pid = None
        if status != 0 or not chunks:
            return None
        try:
            return pickle.loads(b"".join(chunks))
        except Exception:                             # noqa: BLE001
            return None

    def cancel(self) -> None:
        """The value is not wanted any more (the caller failed): the child is stopped and reaped."""
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except OSError:
                pass
            os.close(self._fd)
            os.waitpid(self._pid, 0)
            self._pid = None
