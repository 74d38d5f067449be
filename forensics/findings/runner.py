"""The detector runner: every registered detector on a model, the findings ordered and completed.

:func:`run_detectors` runs each detector of the registry (:mod:`forensics.findings.base`)
through :func:`run_detector`, which isolates one that fails (its failure becomes a problem line,
the others still run); :func:`gather` puts the results in the registry's order and
:func:`order` puts the findings most important first, wherever each detector ran (here, or in
a forked child: :mod:`forensics.execution.shared_steps`). :func:`finish` then settles the
stalls the watcher saw resolve (:func:`forensics.findings.stall.settle`) and completes the
findings' contract (:func:`forensics.findings.contract.complete`).
"""
from __future__ import annotations

import os
import traceback

from .base import SEVERITY_RANK, STOPS_JOB_SCORE, Context, Finding, NeedsDatabase, detectors, kinds_of
from .contract import complete
from .stall import settle


def order(findings: list[Finding]) -> list[Finding]:
    """Most important first: by severity; within one, what stopped the job (a hang, a reset
    that broke collectives: STOPS_JOB_SCORE) first, then the findings with an impact by
    the share of the collective time they explain, then the others by confidence x score."""
    def key(f: Finding):
        stops = f.score >= STOPS_JOB_SCORE
        tier = 0 if stops else 1 if f.impact_share is not None else 2
        weight = f.impact_share if tier == 1 else f.confidence * max(f.score, 1e-9)
        return SEVERITY_RANK[f.severity], tier, -weight, -f.confidence, f.kind
    return sorted(findings, key=key)


def run_detector(name: str, ctx: Context) -> tuple[list[Finding], list[str]]:
    """(findings, problems) of the detector ``name`` on ``ctx``: one that fails (or returns a
    kind it did not declare) costs only its own findings, and says why as a problem line
    (:class:`~forensics.findings.base.NeedsDatabase` goes through)."""
    try:
        found = list(detectors()[name](ctx))
        declared = kinds_of(name)      # None: a detector put in the table by hand (tests)
        stray = sorted({f.kind for f in found} - set(declared)) if declared is not None else []
        if stray:
            raise ValueError(f"emitted {', '.join(stray)}, not among its declared kinds")
        return found, []
    except NeedsDatabase:
        raise
    except Exception as exc:   # one broken detector must not cost the others' findings
        if os.environ.get("STALLSCOPE_DEBUG"):
            traceback.print_exc()
        return [], [f"detector {name} failed: {type(exc).__name__}: {exc}"]


def gather(results: dict[str, tuple[list[Finding], list[str]]]) -> tuple[list[Finding], list[str]]:
    """(findings most important first, problems) of every registered detector's
    :func:`run_detector` result, by name: the same wherever and in whatever order each ran
    (ties in :func:`order` keep the registry's order)."""
    found: list[Finding] = []
    problems: list[str] = []
    for name in detectors():
        f, p = results[name]
        found.extend(f)
        problems.extend(p)
    return order(found), problems


def run_detectors(ctx: Context) -> tuple[list[Finding], list[str]]:
    """Every registered detector on ``ctx``: (findings most important first, problems), the
    findings' contract completed (:func:`finish`)."""
    found, problems = gather({name: run_detector(name, ctx) for name in detectors()})
    return finish(ctx, found), problems


def finish(ctx: Context, found: list[Finding]) -> list[Finding]:
    """What follows the detectors wherever they ran (here, or shared with a forked child:
    forensics.execution.shared_steps): the stalls the watcher saw resolve settled
    (:func:`forensics.findings.stall.settle`), then the findings' contract completed
    (:func:`forensics.findings.contract.complete`)."""
    return complete(ctx, settle(ctx, found))
