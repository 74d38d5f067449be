"""The second core's share of the work after the reading (an :class:`~.choice.Execution`
whose ``shares_with_child``: local, ``jobs`` > 1).

Once the model is merged and connected, what is left before the report is written is a list
of independent steps: the detectors (:class:`DetectorStep`; the network ones share the
costliest table, the TCP trouble per link) and the report's tables made from the model alone
(:class:`ModelStep`). A forked copy of this process (:class:`~.forked_call.ForkedCall`: the
model shared copy-on-write) makes them from the front of the list and sends each step's value
as it is made (:func:`child_values`); this process makes them from the end
(:func:`make_from_both_ends`), so the two meet wherever the costs put them, and stops the
child once every step is made. :func:`detect_with_child` puts the list together.

The child never touches the database (a DuckDB connection is not to be used across a fork):
its :class:`~forensics.findings.base.Context` has :data:`~forensics.findings.base.NO_DATABASE`,
the detectors declared ``queries=True`` are made here before the others, and a detector that
queries anyway is left for this process to make (:class:`~forensics.findings.base.NeedsDatabase`).
What comes back is the same as one process makes: each detector's findings and problems,
put in the registry's order (:func:`forensics.findings.runner.gather`), and each model step's
memos. Should the child fail, the steps it did not send are made here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..findings.base import NO_DATABASE, Context, NeedsDatabase, detectors, queries
from ..findings.runner import gather, run_detector
from .forked_call import ForkedCall


@dataclass
class Workspace:
    """What the steps run on, in either process: ``analysis``, an analysis of the model alone
    (no findings, no database: what the report's steps read and fill, ``memos``), and
    ``ctx``, the detectors' context (the database here, :data:`NO_DATABASE` in the child)."""

    analysis: Any
    ctx: Context


@dataclass(frozen=True)
class ModelStep:
    """A step of what a renderer computes from the model alone (``run(analysis)`` fills
    ``analysis.memos``, see :func:`forensics.report.data.memo`), made before there are
    findings; ``needs``: the steps whose values it reads. Listed long ones first: this process
    makes the steps from the end."""

    name: str
    run: Callable[[Any], Any]
    needs: tuple[str, ...] = ()

    def make(self, ws: Workspace) -> dict:
        """The ``memos`` entries this step adds."""
        before = set(ws.analysis.memos)
        self.run(ws.analysis)
        return {k: v for k, v in ws.analysis.memos.items() if k not in before}

    def take(self, ws: Workspace, value: dict) -> None:
        """The child's value, kept where this process's later steps read it."""
        for k, v in value.items():
            ws.analysis.memos.setdefault(k, v)


@dataclass(frozen=True)
class DetectorStep:
    """A detector as a step: its value is :func:`~forensics.findings.runner.run_detector`'s
    (findings, problems). The values several detectors share (``Context.memo``) are made in
    each process that needs them: at the front of the list the network detectors, which share the
    costliest (the TCP trouble per link), stay together in the child."""

    name: str
    needs: tuple[str, ...] = ()

    def make(self, ws: Workspace):
        """(findings, problems) of the detector, on ``ws``'s context."""
        return run_detector(self.name, ws.ctx)

    def take(self, ws: Workspace, value) -> None:
        """Nothing to keep: the value is the detector's (findings, problems)."""


def child_values(ws: Workspace, steps: list):
    """(step name, value) of each of ``steps`` in turn, made in the child on its workspace;
    the value None for a detector that queried the database (this process makes it)."""
    for step in steps:
        try:
            value = step.make(ws)
        except NeedsDatabase:
            value = None
        yield step.name, value


def make_from_both_ends(child: ForkedCall, steps: list, ws: Workspace, first: list = ()) -> dict[str, Any]:
    """Every step's value, by name. ``child``: the forked call making ``steps`` in order
    (:func:`child_values`, streamed); ``first``: the steps only this process can make, made
    before the rest. Then, again and again, this process takes what the child has sent and
    makes the last step not yet made whose needs have come, except the one the child is on
    (the first it has not sent); it waits for the child only when there is none. The child is
    stopped once every step is made; what it did not make is made here."""
    values: dict[str, Any] = {}
    for step in first:
        values[step.name] = step.make(ws)
    by_name = {s.name: s for s in steps}
    sent = 0                                      # items the child has sent: it is on steps[sent]

    def take(items) -> None:
        nonlocal sent
        for name, value in items:
            sent += 1
            if value is not None and name not in values:
                by_name[name].take(ws, value)
                values[name] = value

    while child.running:
        take(child.received())
        if all(s.name in values for s in steps):
            break
        left = [s for i, s in enumerate(steps) if s.name not in values and i != sent]
        mine = next((s for s in reversed(left) if all(n in values for n in s.needs)), None)
        if mine is None:
            take(child.received(wait=True))
            continue
        values[mine.name] = mine.make(ws)
    child.cancel()
    for step in steps:                            # what a failed child did not send
        if step.name not in values:
            values[step.name] = step.make(ws)
    return values


def detect_with_child(ws: Workspace, child_ws: Workspace, model_steps: list) -> tuple[tuple[list, list], dict]:
    """((findings, problems), the model steps' memos), made by this process on ``ws`` and a
    forked copy of it on ``child_ws`` (its context without the database): the child the
    detectors that need no database, then the model steps, from the front; this process the
    detectors that query, then the rest from the end. Fork it after the connection is made
    (``collectives`` is made there), never with a Dask client's threads about; the child
    touches only the model's frames."""
    if child_ws.ctx.con is not NO_DATABASE:
        raise ValueError("the child's context must not hold the database")
    steps = [DetectorStep(name) for name in detectors() if not queries(name)] + list(model_steps)
    here = [DetectorStep(name) for name in detectors() if queries(name)]
    child = ForkedCall(child_values, child_ws, steps, stream=True)
    try:
        values = make_from_both_ends(child, steps, ws, first=here)
    except BaseException:
        child.cancel()
        raise
    return gather({name: values[name] for name in detectors()}), ws.analysis.memos
