"""Where the per-host stage (:func:`.hosts.read_host`) runs: in this process, in this process
and a pool of worker processes (``stallscope analyze --jobs N``: N readers in all), or on an
existing Dask cluster (``--dask ADDRESS``).

Each host's bundle is read, parsed and put through the TCP engine by one reader; what comes
back is a :class:`~.hosts.HostPart` (DataFrames of flagged packets, flows, timing
aggregates, sampled fingerprints, the host's artefact tables: tens of kB to a few MB a host, never a
per-packet table), which :func:`forensics.model.build_model` merges. The result does not
depend on where the stage ran: the parts are returned in the order of the paths, and the
merge is the same code in every case.

The workers are forked from this process once it has imported the per-host stage (on Linux,
with no other thread about), or from a fork server that has imported it once: no interpreter
start-up per host either way; the readers take the hosts one at a time from a shared counter
(:class:`forensics.workers.Reading`). As with any multiprocessing, a script that calls ``analyze(jobs=N)``
guards its top level with ``if __name__ == "__main__":``. A Dask worker reads the bundle at the path given, so the paths must
be ones every worker sees (a shared filesystem); they are made absolute first.
"""
from __future__ import annotations

import os
from pathlib import Path
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from .. import heap, workers
from ..errors import InputError, StallscopeError
from .hosts import HostPart, read_host

DASK_CONNECT_TIMEOUT_S = 20


class WorkerError(StallscopeError):
    """A worker process died (killed, out of memory) before returning its host."""


def read_hosts(paths: list, *, skew: bool = True, jobs: int = 1, dask: str | None = None,
               progress: Callable[[str], None] | None = None,
               while_reading: Callable[[], None] | None = None,
               reading: workers.Reading | None = None) -> list[HostPart]:
    """:func:`.hosts.read_host` of every path, in the paths' order. With ``jobs`` > 1, this
    process and ``jobs - 1`` worker processes read them (:class:`forensics.workers.Reading`;
    ``reading``: one already started on these paths, by the command line). ``while_reading``:
    work this process does once its share is read, while the workers finish theirs (imports,
    templates: what would otherwise run alone after them); best effort, its failure is left
    to the later real use to report. Each part is settled out of the garbage collector's
    reach as it comes (:func:`forensics.heap.settle`, in the caller's ``heap.steady`` scope)."""
    say = progress or (lambda _msg: None)
    if dask:
        return _on_dask(dask, paths, skew, say, while_reading)
    if reading is not None and (reading.paths != workers.source_keys(paths) or reading.skew != skew):
        raise ValueError("the reading given was started on other bundles")
    jobs = max(1, min(int(jobs), len(paths)))
    if jobs == 1 and reading is None:
        out = []
        for i, p in enumerate(paths, 1):
            out.append(read_host(p, skew=skew))
            heap.settle()             # kept until the merge: no full collection walks it again
            if len(paths) > 1:
                say(f"host {i}/{len(paths)} read: {_name(out[-1])}")
        return out
    reading = reading or workers.Reading(paths, jobs, skew=skew)
    workers_n = reading.jobs - 1
    say(f"reading {len(paths)} bundles on {reading.jobs} processes (this one and {workers_n} "
        f"worker{'s' if workers_n > 1 else ''})")
    parts: list[HostPart | None] = [None] * len(paths)
    n = 0

    def got(i: int, part: HostPart) -> None:
        nonlocal n
        parts[i] = part
        heap.settle()
        n += 1
        say(f"host {n}/{len(paths)} read: {_name(part)}")

    try:
        while (i := reading.claim()) is not None:
            got(i, read_host(paths[i], skew=skew))
            for j, part in reading.finished():   # the first bad bundle stops the rest
                got(j, part)
        if reading.error is not None:
            say(f"no worker process could start ({reading.error}): this process read every bundle")
        _meanwhile(while_reading)                # the workers may still read their last hosts
        for j, part in reading.rest():
            got(j, part)
    except BrokenProcessPool as e:
        raise WorkerError(f"a worker process died while reading the bundles ({e}); "
                          "retry with fewer --jobs (memory?) or --jobs 1") from None
    finally:
        reading.close()
    return parts


def _name(part: HostPart) -> str:
    loose = part.bundle.loose
    return loose.name if loose is not None else part.bundle.host


def _meanwhile(work: Callable[[], None] | None) -> None:
    if work is None:
        return
    try:
        work()
    except Exception:   # noqa: BLE001 - only a head start: the real use raises and says why
        pass


def _on_dask(address: str, paths: list, skew: bool, say, while_reading=None) -> list[HostPart]:
    """The bundles read on the cluster, loose evidence here (its unpacked files are this
    machine's), in the order given."""
    local = {i: p for i, p in enumerate(paths) if not isinstance(p, (str, os.PathLike))}
    if local:
        bundles = [p for i, p in enumerate(paths) if i not in local]
        got = iter(_on_dask(address, bundles, skew, say, while_reading) if bundles else [])
        mine = {i: read_host(p, skew=skew) for i, p in local.items()}
        return [mine[i] if i in mine else next(got) for i in range(len(paths))]
    try:
        from distributed import Client
    except ImportError:
        raise InputError("--dask needs dask.distributed on this machine and the workers "
                         "(pip install 'stallscope[dask]')") from None
    given, paths = paths, [os.path.abspath(p) for p in paths]
    for p in paths:   # the workers read them; a path missing here is most likely missing there too
        if not os.path.exists(p):
            raise InputError(f"{p}: no such bundle")
    try:
        client = Client(address, timeout=DASK_CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise InputError(f"--dask {address}: cannot reach the scheduler ({e})") from None
    try:
        n = len(client.scheduler_info().get("workers", {}))
        say(f"reading {len(paths)} bundles on the Dask cluster at {address} ({n} workers)")
        futs = client.map(read_host, paths, skew=skew, pure=False)
        _meanwhile(while_reading)
        parts = client.gather(futs)
        heap.settle()
    except OSError as e:
        raise InputError(f"--dask {address}: lost the cluster while reading the bundles ({e})") from None
    finally:
        client.close()
    for part, p in zip(parts, given):   # the paths as the user gave them, as a local run has them
        part.bundle.source = Path(p)
    return parts
