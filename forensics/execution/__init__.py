"""How the analyzer runs: where the per-host stage runs and what overlaps what, never what the
result is (every execution gives the same analysis).

One module per concern:

- :mod:`.choice`: the execution choice :func:`forensics.analysis.analyze` takes
  (:class:`Execution`: local processes or a Dask cluster) and ``--jobs``' default;
- :mod:`.host_reading`: the per-host stage run as the choice says (``read_hosts``), and the
  one read pipeline from the user's paths to the model (``read_model``: analyze and query);
- :mod:`.reader_pool`: this process and forked worker processes reading the hosts from one
  shared counter (``ReaderPool``);
- :mod:`.on_dask`: the per-host stage on a ``dask.distributed`` cluster;
- :mod:`.shared_steps`: the detectors and the report's model-only steps shared with a
  forked copy of this process after the reading;
- :mod:`.forked_call`: a call computed in a forked copy of this process (``ForkedCall``);
- :mod:`.thread_call`: DuckDB's work on a thread (``ThreadCall``);
- :mod:`.memory`: the garbage collector kept off what an analysis holds, the allocator told
  to keep what it frees.

This module and :mod:`.choice`, :mod:`.reader_pool`, :mod:`.memory` import the standard
library only: the command line starts the workers before it imports pandas or the analyzer.
"""
from __future__ import annotations

from .choice import DASK, LOCAL, Execution, default_jobs

__all__ = ["DASK", "LOCAL", "Execution", "default_jobs"]
