"""The process pool of readers (``stallscope analyze --jobs N``): this process and ``N - 1``
worker processes read the host bundles, each taking the next unread host from one shared
counter (:class:`ReaderPool`, driven by :func:`.host_reading.read_hosts`).

A worker sends its host part pickled, as bytes, and the calling thread unpickles it
(:meth:`ReaderPool.finished`): the pool's own thread, which receives the results while the
calling thread may still be importing the analyzer, must import nothing. Unpickling a part
imports the analyzer's modules; two threads importing the same package tree at once can take
its module locks in opposite orders (an ImportError, "partially initialized module", where
Python's import-deadlock detection sees the cycle, a hang where it does not).

Standard library only until a pool starts. On Linux, in a process with no other thread, the
workers are forked from this one at once, before it imports the per-host stage (pandas,
numpy), and each imports it on its own core while this process does the same: no page of
theirs is shared, so neither process copies one on a write. Elsewhere a fork server imports
the per-host stage once for every worker while this process does its own imports.
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import sys
import threading
import traceback
import warnings

from . import memory

# what a worker imports before its first host (a fork server: once, for every worker it forks)
PRELOAD = ["forensics.model.hosts", "forensics.tcp", "pandas", "numpy"]


def source_keys(paths: list) -> list:
    """The sources as a reading keeps them: paths as strings, loose evidence as it is
    (:class:`forensics.inputs.intake.LooseSet`, plain data that pickles)."""
    return [os.fspath(p) if isinstance(p, (str, bytes, os.PathLike)) else p for p in paths]


def context():
    """Where the workers come from. A fork of this process (no server process) where that is
    safe: Linux, and no other Python thread that could hold a lock across the fork (numpy's
    BLAS threads are fork-aware). Otherwise a fork server that has imported the per-host stage
    (no thread of this process is forked), or a plain fork when the main program cannot be
    imported again by the fork server (a script read from standard input)."""
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main is not None and not os.path.isfile(main):
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class ReaderPool:
    """The bundles at ``paths`` read by ``jobs`` processes: ``jobs - 1`` workers and the
    calling process, which reads too (its hosts cost no pickling). Each reader takes the next
    unread host from one shared counter when it is free, so the hosts spread over the readers
    as they go, whatever their sizes.

    The command line makes it before it imports the analyzer, and the workers start at once:
    forked (:func:`context`) before this process imports the per-host stage, so each imports
    it itself on its own core (a fork after the imports would leave the second core idle while
    this process imports, then cost both processes a copy of every shared page they write:
    bench/README.md); with a fork server, the pool is started on a thread instead (a worker's
    start waits for the server's imports, this process need not). Either way the workers begin
    on the first hosts while this process imports. Then :func:`.host_reading.read_hosts`
    drives it: :meth:`claim` for the calling process's hosts, :meth:`finished` and
    :meth:`rest` for the workers', :meth:`close` always."""

    def __init__(self, paths: list, jobs: int, *, skew: bool = True):
        if jobs < 2:
            raise ValueError("a ReaderPool needs a worker besides this process (jobs >= 2)")
        self.paths = source_keys(paths)
        self.skew = skew
        self.jobs = jobs
        self._ctx = context()
        self._next = self._ctx.Value("q", 0)         # the first host no reader has taken
        self._pool = None
        self._futures: list = []
        self._seen: set = set()
        self._error: BaseException | None = None
        self._closed = False
        self._starter = threading.Thread(target=self._start, name="stallscope-readers", daemon=True)
        if self._ctx.get_start_method() == "fork":
            self._fork()
        else:
            self._starter.start()

    def _fork(self) -> None:
        """The workers forked now, on this thread (:func:`context` picks a fork where no
        other thread runs, or where the main program cannot start a fork server)."""
        with warnings.catch_warnings():
            # Python 3.12+ warns of any other OS thread at a fork: a caller that imported numpy
            # has its BLAS pool, which stops itself around a fork (pthread_atfork)
            warnings.simplefilter("ignore", DeprecationWarning)
            self._start()

    def _start(self) -> None:
        from concurrent.futures import ProcessPoolExecutor
        try:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs - 1, mp_context=self._ctx,
                                             initializer=_serve, initargs=(self._next,))
            # a task a host at most: each takes its host when a worker runs it, so the tasks
            # left once this process has read the rest find none and return at once (the first
            # submit forks the workers, with the fork context)
            self._futures = [self._pool.submit(_read_next, self.paths, self.skew) for _ in self.paths]
        except BaseException as exc:   # noqa: BLE001 - no worker then: this process reads every host
            self._error = exc

    def claim(self) -> int | None:
        """The index of the next host for the calling process to read; None when every host
        is taken."""
        return _take(self._next, len(self.paths))

    def finished(self, wait: bool = False) -> list:
        """(index, part) of the workers' hosts finished since the last call, at least one
        with ``wait`` unless none is left; a worker's error (a bad bundle's InputError, a
        dead worker's BrokenProcessPool) is raised here."""
        from concurrent.futures import FIRST_COMPLETED
        from concurrent.futures import wait as wait_for
        if wait:
            self._join()
        elif self._starter.is_alive():
            return []
        left = [f for f in self._futures if f not in self._seen]
        if not left:
            return []
        done = wait_for(left, timeout=None if wait else 0, return_when=FIRST_COMPLETED)[0]
        out = []
        for f in left:                          # in submission order
            if f in done:
                self._seen.add(f)
                got = f.result()
                if got is not None:
                    out.append(_received(*got))
        return out

    @property
    def error(self) -> BaseException | None:
        """Why no worker could start (then the calling process reads every host)."""
        self._join()
        return self._error if not self._futures else None

    def rest(self):
        """(index, part) of every worker's host not yet handed out, as each finishes."""
        self._join()
        while len(self._seen) < len(self._futures):
            yield from self.finished(wait=True)

    def _join(self) -> None:
        if self._starter.ident is not None:
            self._starter.join()

    def close(self) -> None:
        """Stop the workers: tasks not started are cancelled, a host being read is finished and
        dropped. The shared counter's semaphore goes with this object."""
        if self._closed:
            return
        self._closed = True
        self._join()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


_shared_next = None      # in a worker: the counter of the ReaderPool it serves


def _serve(counter) -> None:
    """A worker's start: the counter kept, the allocator told to keep what it frees (see
    :func:`.memory.keep_freed_memory`; a forked worker has it already), the per-host
    stage imported (a forked worker has not; a fork server's has, at no cost here) and frozen
    out of the garbage collector's reach (the worker ends with the reading)."""
    global _shared_next
    _shared_next = counter
    memory.keep_freed_memory()
    try:
        for name in PRELOAD:
            __import__(name)
    except ImportError:
        pass                 # the worker's first host says what is missing, as one line
    gc.freeze()              # the imports, for the worker's life: no full collection walks them


def _take(counter, n: int) -> int | None:
    with counter.get_lock():
        i = counter.value
        if i >= n:
            return None
        counter.value = i + 1
    return i


class RemoteTraceback(Exception):
    """Where a worker's error was raised: its traceback, as text (the error's ``__cause__``)."""


def _read_next(paths: list, skew: bool):
    """A worker's task: the next unclaimed host, read: (index, True, the part pickled) or, when
    reading it failed, (index, False, the error and its traceback pickled); None when no host is
    left. Pickled here so that the pool's thread in the calling process unpickles only bytes."""
    i = _take(_shared_next, len(paths))
    if i is None:
        return None
    try:
        from ..model.hosts import read_host
        part = read_host(paths[i], skew=skew)
    except Exception as exc:   # noqa: BLE001 - raised again by the calling thread (_received)
        tb = "".join(traceback.format_exception(exc))
        try:
            return i, False, pickle.dumps((exc, tb), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:      # noqa: BLE001 - an error that does not pickle: its text then
            return i, False, pickle.dumps((RuntimeError(f"{type(exc).__name__}: {exc}"), tb))
    return i, True, pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)


def _received(i: int, ok: bool, blob: bytes) -> tuple:
    """(index, part) of what a worker sent (:func:`_read_next`), unpickled on the calling
    thread; the worker's error raised here (its traceback as the ``__cause__``)."""
    value = pickle.loads(blob)
    if ok:
        return i, value
    exc, tb = value
    raise exc from RemoteTraceback(tb)
