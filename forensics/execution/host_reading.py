"""Where the per-host stage (:func:`forensics.model.hosts.read_host`) runs, as the
:class:`~.choice.Execution` says: in this process, in this process and a pool of worker
processes (``stallscope analyze --jobs N``: N readers in all, :mod:`.reader_pool`), or on an
existing Dask cluster (``--dask ADDRESS``, :mod:`.on_dask`).

Each host's bundle is read, parsed and put through the TCP engine by one reader; what comes
back is a :class:`~forensics.model.hosts.HostPart` (DataFrames of flagged packets, flows,
timing aggregates, sampled fingerprints, the host's artefact tables: never a per-packet
table), which :func:`forensics.model.from_parts` merges. The result does not depend on where
the stage ran: the parts are returned in the order of the paths, and the merge is the same
code in every case. As with any multiprocessing, a script that analyzes with worker processes
guards its top level with ``if __name__ == "__main__":``.
"""
from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from ..errors import StallscopeError
from ..inputs.intake import Intake, gather
from ..model import Model, from_parts
from ..model.hosts import HostPart, read_host
from . import memory
from .choice import DASK, LOCAL, Execution
from .on_dask import read_on_dask
from .reader_pool import ReaderPool, source_keys


class WorkerError(StallscopeError):
    """A worker process died (killed, out of memory) before returning its host."""


def read_model(inputs, execution: Execution | None = None, *, skew: bool = True,
               progress: Callable[[str], None] | None = None) -> Model:
    """The model of ``inputs``: the one read pipeline of ``stallscope analyze`` and ``query``.
    ``inputs``: the paths the user gave (bundles, log files, folders, archives: sorted out by
    :func:`forensics.inputs.intake.gather`, closed here) or an
    :class:`~forensics.inputs.intake.Intake` already made (its caller closes it). Each host's
    part is read where ``execution`` says (default: in this process, :func:`read_hosts`), then
    merged by :func:`forensics.model.from_parts`. InputError when nothing given can be read."""
    execution = execution or Execution(jobs=1)
    own = not isinstance(inputs, Intake)
    intake = gather(list(inputs)) if own else inputs
    try:
        if execution.readers is not None:
            sources = execution.readers.paths
        else:
            sources = intake.sources(execution.jobs if execution.kind == LOCAL else 1)
        parts = read_hosts(sources, execution, skew=skew, progress=progress)
    finally:
        if own:
            intake.close()
    return from_parts(parts, skew=skew)


def read_hosts(paths: list, execution: Execution, *, skew: bool = True,
               progress: Callable[[str], None] | None = None) -> list[HostPart]:
    """:func:`~forensics.model.hosts.read_host` of every path, in the paths' order, where
    ``execution`` says (its ``readers``: a pool already started on these paths; its
    ``meanwhile``: work this process does once its share is read, while the workers finish
    theirs, what would otherwise run alone after them). Each part is settled out of the garbage collector's
    reach as it comes (:func:`.memory.settle`, in the caller's ``memory.steady`` scope)."""
    say = progress or (lambda _msg: None)
    if execution.kind == DASK:
        return read_on_dask(execution, paths, skew, say)
    readers = execution.readers
    if readers is not None and (readers.paths != source_keys(paths) or readers.skew != skew):
        raise ValueError("the reader pool given was started on other bundles")
    jobs = max(1, min(int(execution.jobs), len(paths)))
    if jobs == 1 and readers is None:
        out = []
        for i, p in enumerate(paths, 1):
            out.append(read_host(p, skew=skew))
            memory.settle()           # kept until the merge: no full collection walks it again
            if len(paths) > 1:
                say(f"host {i}/{len(paths)} read: {part_name(out[-1])}")
        return out
    return _read_with_pool(paths, readers or ReaderPool(paths, jobs, skew=skew), execution, skew, say)


def _read_with_pool(paths: list, readers: ReaderPool, execution: Execution, skew: bool,
                    say) -> list[HostPart]:
    """The hosts read by this process and the pool's workers (the pool closed at the end)."""
    workers_n = readers.jobs - 1
    say(f"reading {len(paths)} bundles on {readers.jobs} processes (this one and {workers_n} "
        f"worker{'s' if workers_n > 1 else ''})")
    parts: list[HostPart | None] = [None] * len(paths)
    n = 0

    def got(i: int, part: HostPart) -> None:
        nonlocal n
        parts[i] = part
        memory.settle()
        n += 1
        say(f"host {n}/{len(paths)} read: {part_name(part)}")

    try:
        while (i := readers.claim()) is not None:
            got(i, read_host(paths[i], skew=skew))
            for j, part in readers.finished():   # the first bad bundle stops the rest
                got(j, part)
        if readers.error is not None:
            say(f"no worker process could start ({readers.error}): this process read every bundle")
        execution.run_meanwhile()                # the workers may still read their last hosts
        for j, part in readers.rest():
            got(j, part)
    except BrokenProcessPool as e:
        raise WorkerError(f"a worker process died while reading the bundles ({e}); "
                          "retry with fewer --jobs (memory?) or --jobs 1") from None
    finally:
        readers.close()
    return parts


def part_name(part: HostPart) -> str:
    """A host part as a progress line names it: the loose evidence's name, or the host's."""
    loose = part.bundle.loose
    return loose.name if loose is not None else part.bundle.host
