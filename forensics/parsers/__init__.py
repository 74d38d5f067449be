"""Parsers of the artefacts in a capture bundle, one module per format.

This file only imports the parser modules; each registers itself with
:mod:`forensics.parsers.registry`. Use :func:`parse_file` (picks the parser by path
and content) or :func:`get` (by name).
"""
from . import (  # noqa: F401  (imported for their registration)
    flight_recorder,
    fr_analyzer,
    ib_counters,
    ib_status,
    kernel_log,
    launcher_exits,
    native_stacks,
    nccl_debug,
    nccl_inspector,
    nccl_profiler_trace,
    nccl_tests,
    ncclras,
    nvidia_smi,
    proc_threads,
    pyspy,
    ss,
    torch_elastic,
    torch_init,
    torch_watchdog,
)
from .registry import ParseResult, get, parse_file, parse_tree, parsers, select  # noqa: F401
