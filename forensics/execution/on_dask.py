"""The per-host stage on an existing ``dask.distributed`` cluster (``stallscope analyze --dask
ADDRESS``, :class:`~.choice.Execution` of kind ``dask``).

A Dask worker reads the bundle at the path given, so the paths must be ones every worker sees
(a shared filesystem); they are made absolute first. Loose evidence is read here (its
unpacked files are this machine's). The parts come back in the order of the paths, with the
paths as the user gave them, as a local reading has them.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError
from ..model.hosts import HostPart, read_host
from . import memory
from .choice import Execution

DASK_CONNECT_TIMEOUT_S = 20


def read_on_dask(execution: Execution, paths: list, skew: bool, say) -> list[HostPart]:
    """The bundles read on the cluster whose scheduler is at ``execution.address``, loose
    evidence here, in the order given; ``execution.meanwhile`` done here while the cluster
    reads. ``say``: a progress line."""
    address = execution.address
    local = {i: p for i, p in enumerate(paths) if not isinstance(p, (str, os.PathLike))}
    if local:
        bundles = [p for i, p in enumerate(paths) if i not in local]
        got = iter(read_on_dask(execution, bundles, skew, say) if bundles else [])
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
        execution.run_meanwhile()
        parts = client.gather(futs)
        memory.settle()
    except OSError as e:
        raise InputError(f"--dask {address}: lost the cluster while reading the bundles ({e})") from None
    finally:
        client.close()
    for part, p in zip(parts, given):   # the paths as the user gave them, as a local run has them
        part.bundle.source = Path(p)
    return parts
