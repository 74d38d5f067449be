"""The second core's share of the work after the reading (``analyze`` with ``jobs`` > 1).

Once the model is merged and connected, what is left before the report is written is a list
of independent steps: the detectors (:class:`Detect`; at 64 hosts of 1M packets the network
ones take 1.5 s, the TCP trouble per link they share included) and the report's tables made
from the model alone (:class:`Ahead`; 1.1 s at 64 hosts). A forked copy of this process
(:class:`forensics.workers.Forked`: the model shared copy-on-write) makes them from the
front of the list and sends each step's value as it is made (:func:`child_values`); this
process makes them from the end (:func:`share_out`), so the two meet wherever the costs put
them, and stops the child once every step is made.

The child never touches the database (a DuckDB connection is not to be used across a fork):
its :class:`~forensics.findings.base.Context` has :data:`~forensics.findings.base.NO_DATABASE`,
the detectors declared ``queries=True`` are made here before the others, and a detector that
queries anyway is left for this process to make (:class:`~forensics.findings.base.NeedsDatabase`).
What comes back is the same as one process makes: each detector's findings and problems,
put in the registry's order (:func:`forensics.findings.base.gather`), and each report step's
values. Should the child fail, the steps it did not send are made here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .findings.base import Context, NeedsDatabase, run_detector


@dataclass
class Workspace:
    """What the steps run on, in either process: ``analysis``, an analysis of the model alone
    (no findings, no database: what the report's steps read and fill, ``prepared``), and
    ``ctx``, the detectors' context (the database here, :data:`NO_DATABASE` in the child)."""

    analysis: Any
    ctx: Context


@dataclass(frozen=True)
class Ahead:
    """A step of what a renderer computes from the model alone (``run(analysis)`` fills
    ``analysis.prepared``, see :func:`forensics.report.data.memo`), made before there are
    findings; ``needs``: the steps whose values it reads. Listed long ones first: this process
    makes the steps from the end."""

    name: str
    run: Callable[[Any], Any]
    needs: tuple[str, ...] = ()

    def make(self, ws: Workspace) -> dict:
        """The ``prepared`` entries this step adds."""
        before = set(ws.analysis.prepared)
        self.run(ws.analysis)
        return {k: v for k, v in ws.analysis.prepared.items() if k not in before}

    def take(self, ws: Workspace, value: dict) -> None:
        """The child's value, kept where this process's later steps read it."""
        for k, v in value.items():
            ws.analysis.prepared.setdefault(k, v)


@dataclass(frozen=True)
class Detect:
    """A detector as a step: its value is :func:`~forensics.findings.base.run_detector`'s
    (findings, problems). The values several detectors share (``@shared``) are made in each
    process that needs them: at the front of the list the network detectors, which share the
    costliest (the TCP trouble per link), stay together in the child."""

    name: str
    needs: tuple[str, ...] = ()

    def make(self, ws: Workspace):
        return run_detector(self.name, ws.ctx)

    def take(self, ws: Workspace, value) -> None:
        pass


def child_values(ws: Workspace, steps: list):
    """(step name, value) of each of ``steps`` in turn, made in the child on its workspace;
    the value None for a detector that queried the database (this process makes it)."""
    for step in steps:
        try:
            value = step.make(ws)
        except NeedsDatabase:
            value = None
        yield step.name, value


def share_out(beside, steps: list, ws: Workspace, first: list = ()) -> dict[str, Any]:
    """Every step's value, by name. ``beside``: the child making ``steps`` in order
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

    while beside.running:
        take(beside.received())
        if all(s.name in values for s in steps):
            break
        left = [s for i, s in enumerate(steps) if s.name not in values and i != sent]
        mine = next((s for s in reversed(left) if all(n in values for n in s.needs)), None)
        if mine is None:
            take(beside.received(wait=True))
            continue
        values[mine.name] = mine.make(ws)
    beside.cancel()
    for step in steps:                            # what a failed child did not send
        if step.name not in values:
            values[step.name] = step.make(ws)
    return values
