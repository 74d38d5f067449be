"""How many processes read the bundles (``stallscope analyze --jobs``) and how
(:class:`Reading`: this process and workers, driven by :mod:`forensics.model.parallel`).
Standard library only until a reading starts. On Linux, in a process with no other thread,
the workers are forked from this one at once, before it imports the per-host stage (pandas,
numpy: about 0.3 s), and each imports it on its own core while this process does the same:
no page of theirs is shared, so neither process copies one on a write; elsewhere a fork
server imports them once for every worker, while this process does its own imports on
another core. :class:`Forked`: the second core's share of the work after the reading
(:func:`forensics.analysis.analyze`)."""
from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import select
import signal
import sys
import tempfile
import threading
import time
import warnings

from . import heap

# below this much bundle data in all, worker processes cost more than they save (a pool's
# start is ~0.3 s; a host of 1M packets is ~15 MB compressed and ~1 s to read)
POOL_MIN_BYTES = 32 * 2**20

# what a worker imports before its first host (a fork server: once, for every worker it forks)
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


def source_keys(paths: list) -> list:
    """The sources as a reading keeps them: paths as strings, loose evidence as it is
    (:class:`forensics.intake.LooseSet`, plain data that pickles)."""
    return [os.fspath(p) if isinstance(p, (str, bytes, os.PathLike)) else p for p in paths]


def _size(paths: list) -> int:
    total = 0
    for p in paths:
        if not isinstance(p, (str, bytes, os.PathLike)):
            total += getattr(p, "size", 0)        # loose evidence knows its size
            if total >= POOL_MIN_BYTES:
                break
            continue
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


class Reading:
    """The bundles at ``paths`` read by ``jobs`` processes: ``jobs - 1`` workers and the
    calling process, which reads too (its hosts cost no pickling). Each reader takes the next
    unread host from one shared counter when it is free, so the hosts spread over the readers
    as they go, whatever their sizes.

    The command line makes it before it imports the analyzer, and the workers start at once:
    forked (:func:`context`) before this process imports the per-host stage, each imports it
    itself on its own core (a fork after the imports leaves the second core idle while this
    process imports, then costs both processes a copy of every shared page they write: 0.1-0.9 s
    more at 8 hosts, measured side by side, with the allocator keeping its freed memory); with
    a fork server, the pool is started on a thread instead (a worker's start waits for the
    server's imports, this process need not). Either way the workers begin on the first hosts
    while this process imports. Then
    :func:`forensics.model.parallel.read_hosts` drives it: :meth:`claim` for the calling
    process's hosts, :meth:`finished` and :meth:`rest` for the workers', :meth:`close` always."""

    def __init__(self, paths: list, jobs: int, *, skew: bool = True):
        if jobs < 2:
            raise ValueError("a Reading needs a worker besides this process (jobs >= 2)")
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
                    out.append(got)
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


_shared_next = None      # in a worker: the counter of the Reading it serves


def _serve(counter) -> None:
    """A worker's start: the counter kept, the allocator told to keep what it frees (see
    :func:`forensics.heap.keep_freed_memory`; a forked worker has it already), the per-host
    stage imported (a forked worker has not; a fork server's has, at no cost here) and frozen
    out of the garbage collector's reach (the worker ends with the reading)."""
    global _shared_next
    _shared_next = counter
    heap.keep_freed_memory()
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


def _read_next(paths: list, skew: bool):
    """A worker's task: the next unclaimed host, read (index, part); None when none is left."""
    i = _take(_shared_next, len(paths))
    if i is None:
        return None
    from .model.hosts import read_host
    return i, read_host(paths[i], skew=skew)


class Forked:
    """``fn(*args)`` computed now in a forked copy of this process (its memory shared
    copy-on-write, nothing to send it), while this process goes on with other work on another
    core; :meth:`result` is its value. With ``stream``, ``fn(*args)`` is an iterable whose
    items the child sends one by one as it makes them, for :meth:`received` to collect.

    The child pickles each item into an unlinked spool file and says where it lies down a pipe
    (16 bytes an item): it never waits for this process to read, however large the items (a
    pipe holds 64 kB; a child writing into a full one would stop computing until this process,
    busy with its own work, read it). Then it leaves with ``os._exit`` (no atexit handler, no
    buffered output of this process written twice). Best effort: where fork is missing, or the
    child fails or sends nothing for ``timeout`` seconds while waited for, :meth:`result` is
    None (:meth:`received` has what came before) and the caller computes the rest itself."""

    def __init__(self, fn, *args, timeout: float = 60.0, stream: bool = False):
        self.timeout = timeout
        self._pid: int | None = None
        self._fd: int | None = None
        self._spool = None
        self._buf = bytearray()
        self._status: int | None = None
        if not hasattr(os, "fork"):
            return
        try:
            spool = tempfile.TemporaryFile()
        except OSError:
            return
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            spool.close()
            return
        if pid == 0:                                  # the child
            status = 1
            try:
                os.close(r)
                at = 0
                for item in (fn(*args) if stream else [fn(*args)]):
                    data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
                    done = 0
                    while done < len(data):
                        done += os.pwrite(spool.fileno(), memoryview(data)[done:], at + done)
                    os.write(w, at.to_bytes(8, "little") + len(data).to_bytes(8, "little"))
                    at += len(data)
                status = 0
            except BaseException:                     # noqa: BLE001 - the parent computes it then
                pass
            finally:
                os._exit(status)
        os.close(w)
        self._pid, self._fd, self._spool = pid, r, spool

    @property
    def running(self) -> bool:
        """Whether the child may still send something (not yet ended, reaped or stopped)."""
        return self._pid is not None

    def result(self):
        """The value (without ``stream``); None where the child failed or was too slow."""
        items = []
        while self._pid is not None:
            items += self.received(wait=True)
        return items[0] if items and self._status == 0 else None

    def received(self, wait: bool = False) -> list:
        """The items the child has sent since the last call: those it has said are ready, or
        with ``wait`` at least one, unless the child ends (then what it sent before it ended;
        a child that sends nothing for ``timeout`` seconds is stopped)."""
        out: list = []
        deadline = time.monotonic() + self.timeout
        while self._pid is not None:
            left = deadline - time.monotonic() if wait and not out else 0
            if left < 0 or not select.select([self._fd], [], [], max(left, 0))[0]:
                if wait and not out:                  # stuck: give up on it
                    self.cancel()
                break
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:                             # the child is done
                self._reap()
                break
            self._buf += chunk
            out += self._items()
        return out

    def _items(self) -> list:
        out = []
        while len(self._buf) >= 16:
            at, n = int.from_bytes(self._buf[:8], "little"), int.from_bytes(self._buf[8:16], "little")
            del self._buf[:16]
            try:
                out.append(pickle.loads(_pread_all(self._spool.fileno(), n, at)))
            except Exception:                         # noqa: BLE001 - the caller makes it then
                pass
        return out

    def _reap(self) -> None:
        os.close(self._fd)
        self._spool.close()
        _, status = os.waitpid(self._pid, 0)
        self._status = os.waitstatus_to_exitcode(status)
        self._pid = None

    def cancel(self) -> None:
        """Nothing more is wanted (the caller failed, or made the rest itself): the child is
        stopped and reaped."""
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except OSError:
                pass
            self._reap()


def _pread_all(fd: int, n: int, at: int) -> bytes:
    """``n`` bytes of ``fd`` from offset ``at`` (``os.pread`` may return fewer)."""
    parts, got = [], 0
    while got < n:
        chunk = os.pread(fd, n - got, at + got)
        if not chunk:
            raise EOFError(f"spool ends {n - got} bytes short")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
