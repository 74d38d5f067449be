"""Ranked root-cause findings over the event model, one module per concern.

This file only imports the detector modules (each registers itself with
:func:`forensics.findings.base.detector`) and names the package's entry points; see
:mod:`forensics.findings.base` and :mod:`forensics.findings.runner`. No module of the package
imports it.
"""
from .base import (  # noqa: F401
    NO_DATABASE, SCHEMA_VERSION, Context, Finding, NeedsDatabase, Options, detector, detectors, queries,
)
from .runner import finish, gather, order, run_detector, run_detectors  # noqa: F401

# detector modules, imported for their registration (add one line per module)
from . import _registered  # noqa: F401,E402
