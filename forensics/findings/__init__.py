"""Ranked root-cause findings over the event model, one module per concern.

This file only imports the detector modules (each registers itself with
:func:`forensics.findings.base.detector`); see :mod:`forensics.findings.base`.
"""
from .base import (  # noqa: F401
    NO_DATABASE, SCHEMA_VERSION, Context, Finding, NeedsDatabase, Options, detector, detectors, finish, gather, order,
    queries, run_detector, run_detectors,
)

# detector modules, imported for their registration (add one line per module)
from . import _registered  # noqa: F401,E402
