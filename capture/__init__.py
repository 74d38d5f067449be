"""stallscope capture: one host's evidence bundle during a hang (standard library only).

This package must import nothing outside Python's standard library: an engineer
copies ``capture/`` and ``bpf/`` to a locked-down GPU node and runs
``python3 -m capture`` with the system interpreter. The ``stallscope capture``
subcommand is a thin layer over the same ``run_capture``.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .runner import CaptureFailed, CaptureOptions, CaptureResult, CaptureUsageError, run_capture  # noqa: E402

__all__ = ["CaptureFailed", "CaptureOptions", "CaptureResult", "CaptureUsageError", "run_capture", "__version__"]
