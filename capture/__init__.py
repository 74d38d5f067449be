"""stallscope capture: one host's evidence bundle during a hang (standard library only).

This package must import nothing outside Python's standard library: an engineer
copies ``capture/`` and ``bpf/`` to a locked-down GPU node and runs
``python3 -m capture`` with the system interpreter. The ``stallscope capture``
subcommand is a thin layer over the same ``run_capture`` (:mod:`capture.runner`; its options
and errors in :mod:`capture.options`).

The package itself imports nothing: its modules import ``__version__`` from it, and
``stallscope analyze`` and ``query``, which load ``capture.cli`` for their parser, load none of
the capture machinery (0.1 s).
"""
from __future__ import annotations

__version__ = "0.1.0"
