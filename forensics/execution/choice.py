"""The execution choice: where :func:`forensics.analysis.analyze` runs the per-host stage and
what it may overlap (:class:`Execution`), and ``--jobs``' default (:func:`default_jobs`).

Standard library only: the command line builds the choice, and starts the reader pool it may
hold, before it imports pandas or the analyzer.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .reader_pool import ReaderPool

LOCAL = "local"      # this process, and with jobs > 1 a pool of worker processes
DASK = "dask"        # the workers of an existing dask.distributed cluster
KINDS = (LOCAL, DASK)

# below this much bundle data in all, worker processes cost more than they save (a pool's
# start against a host's reading: bench/README.md, "bench/fleet.py")
POOL_MIN_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Execution:
    """How an analysis runs; what the result is never depends on it.

    ``kind``: :data:`LOCAL` (``jobs`` readers: this process and ``jobs - 1`` worker processes,
    :mod:`.reader_pool`; with ``jobs`` > 1 the work after the reading is shared with a forked
    copy of this process, :mod:`.shared_steps`) or :data:`DASK` (the per-host stage on the
    cluster at ``address``, :mod:`.on_dask`; the rest in this process).
    ``readers``: a :class:`~.reader_pool.ReaderPool` the caller started already on the
    sources (its ``jobs`` readers; the caller closes it). ``meanwhile``: the caller's own
    preparation (templates compiled), done while the workers read; best effort.
    ``model_steps``: what the caller will compute from the model alone
    (:class:`~.shared_steps.ModelStep`, e.g. :func:`forensics.report.model_steps`), made
    beside the detectors when the work is shared, else left to the caller."""

    kind: str = LOCAL
    jobs: int = 1
    address: str | None = None
    readers: ReaderPool | None = None
    meanwhile: Callable[[], Any] | None = None
    model_steps: tuple = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"execution kind {self.kind!r}: one of {', '.join(KINDS)}")
        if (self.kind == DASK) != (self.address is not None):
            raise ValueError("a Dask execution needs the scheduler's address, and only it takes one")
        if self.jobs < 1:
            raise ValueError("jobs must be at least 1")
        if self.readers is not None and (self.kind != LOCAL or self.readers.jobs != self.jobs):
            raise ValueError("the reader pool given must be a local one of the same jobs")

    @classmethod
    def on_dask(cls, address: str, **kw) -> Execution:
        """The per-host stage on the Dask cluster whose scheduler is at ``address``."""
        return cls(kind=DASK, address=address, **kw)

    @property
    def shares_with_child(self) -> bool:
        """Whether the work after the reading is shared with a forked copy of this process
        (:mod:`.shared_steps`): local, more than one job (never beside a Dask client's threads)."""
        return self.kind == LOCAL and self.jobs > 1

    def run_meanwhile(self) -> None:
        """:attr:`meanwhile`, best effort: only a head start, so its failure is left to the
        later real use (which raises and says why)."""
        if self.meanwhile is None:
            return
        try:
            self.meanwhile()
        except Exception:   # noqa: BLE001 - only a head start: the real use raises and says why
            pass


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
    """The bytes of ``paths`` (bundles, folders, loose evidence), counted up to
    :data:`POOL_MIN_BYTES`."""
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
