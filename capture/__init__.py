"""stallscope capture: one host's evidence bundle during a hang (standard library only).

This package must import nothing outside Python's standard library: an engineer
copies ``capture/`` and ``bpf/`` to a locked-down GPU node and runs
``python3 -m capture`` with the system interpreter. The ``stallscope capture``
subcommand is a thin layer over the same ``run_capture``.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["CaptureFailed", "CaptureOptions", "CaptureResult", "CaptureUsageError", "run_capture", "__version__"]


def __getattr__(name: str):
    """The runner's names, imported on first use: ``stallscope analyze`` and ``query`` load
    ``capture.cli`` for their parser and need none of the capture machinery (0.1 s)."""
    if name in __all__:
        from . import runner
        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
