"""Which evidence judges a hang or a reset that several bodies of evidence saw.

One event can be seen several ways, each with its own sharpness:

- a hang, by the **tracer** (the calls every rank entered and completed: :mod:`.hang`), by
  the **state at capture** (positions, stacks, sockets and threads of a capture that attached
  after the ranks entered the collective they hang in: :mod:`.state`), by **NCCL RAS's
  report** (the ranks behind: :mod:`.reports`), by **the Flight Recorder analyzer's report** (the
  ranks missing from a collective or culprit of a mismatch: :mod:`.reports`), by **PyTorch's watchdog lines** in the job's
  logs (:mod:`.timeouts`);
- a reset between ranks, by the **packets** (:mod:`.connection_reset`), by the state at
  capture (a reset on a hung communicator's ring), by **NCCL's WARN lines**: by address
  (:func:`.socket_errors.logged_resets`), or as socket errors naming the peer that went away
  (:func:`.socket_errors.socket_failures`).

The sharpest evidence that saw the event judges it; a weaker source would say it again, with
less (a SeqNum where the tracer knows the opCount, a log line where the packets name the
connection and who sent the reset). :data:`PRECEDENCE` declares it: for each source a
detector consults, the sources that take precedence over it, and :func:`consult` is the one
function that reads it: a source is consulted only when none of those saw the event. A
stronger source *saw* the event when it is a :data:`WITNESSES` entry that says so (the
tracer's hung communicators, the packets' resets: evidence judged by detectors of their own,
``hang_mismatch``, ``hang_stuck``, ``connection_reset``), or when it is a source of
:data:`PRECEDENCE` that, consulted, gave a finding.

The modules that own the evidence register its functions by name, the way detectors register
(:func:`finds`: ``late_state``, ``reports``, ``timeouts``, ``socket_errors``; :func:`sees`:
``hang`` for the tracer, ``connection_reset`` for the packets): the table imports none of them,
so they all import it. ``forensics/findings/_registered.py`` imports every one of them.

The owners consult: ``hang_state`` (:mod:`.hang`): STATE_HANGS, RAS_REPORT, FR_REPORT, then WATCHDOG;
``reset_state`` (:mod:`.connection_reset`): STATE_RESETS, WARN_RESETS, then SOCKET_ERRORS.
Within one source, which verdict a body of evidence gives is that source's own reading
(e.g. the state at capture names a reset on the ring before a dead path, :func:`.late_state.late_verdicts`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .base import Context, Finding

HANG_KINDS = ("hang_mismatch", "hang_stuck", "hang_host")

# witnesses: evidence judged by detectors of its own, asked here only whether it saw the event
TRACER = "tracer: a hung communicator"
PACKETS = "packets: a reset between ranks"
# sources: consulted through consult()
STATE_HANGS = "state at capture: hangs"
RAS_REPORT = "NCCL RAS report: ranks behind"
FR_REPORT = "Flight Recorder analyzer report: ranks missing or culprit"
FR_DUMPS = "Flight Recorder dumps: ranks behind"
WATCHDOG = "watchdog lines: hangs"
STATE_RESETS = "state at capture: resets"
WARN_RESETS = "WARN lines: resets by address"
SOCKET_ERRORS = "WARN lines: socket errors"


@dataclass(frozen=True)
class Witness:
    """Evidence asked only whether it saw the event (its question registered by its owner:
    :func:`sees`). ``costly``: asked only once the weaker source has a finding it would drop
    (the same verdict, without making a costly table where nothing needs it)."""

    costly: bool = False


@dataclass(frozen=True)
class Source:
    """Evidence that gives findings (of ``kinds``; the function that finds them registered by
    the module that reads that evidence: :func:`finds`), consulted only when none of
    ``yields_to`` (witnesses or sources, strongest first) saw the event."""

    kinds: tuple[str, ...]
    yields_to: tuple[str, ...] = ()


WITNESSES: dict[str, Witness] = {
    TRACER: Witness(),
    # the TCP trouble per link is the costliest shared table, made where the network detectors run
    PACKETS: Witness(costly=True),
}

PRECEDENCE: dict[str, Source] = {
    # hangs: the tracer's calls, then the state at capture, then NCCL RAS's report (it compared
    # every rank's counts: it names the rank behind), then the watchdog's lines (the ranks that waited)
    STATE_HANGS: Source(HANG_KINDS, yields_to=(TRACER,)),
    RAS_REPORT: Source(HANG_KINDS, yields_to=(TRACER, STATE_HANGS)),
    # the Flight Recorder analyzer matched every rank's dump: it names the ranks missing or culprit
    FR_REPORT: Source(HANG_KINDS, yields_to=(TRACER, STATE_HANGS)),
    # the dumps themselves, compared where nothing above placed them (loose dumps have no process)
    FR_DUMPS: Source(HANG_KINDS, yields_to=(TRACER, STATE_HANGS, RAS_REPORT, FR_REPORT)),
    WATCHDOG: Source(HANG_KINDS, yields_to=(TRACER, STATE_HANGS, RAS_REPORT, FR_REPORT, FR_DUMPS)),
    # resets: the packets and the state at capture, then NCCL's WARN lines by address, then its
    # socket errors; none of the late ones where the tracer saw the hang (hang_stuck names the
    # reset that caused it)
    STATE_RESETS: Source(("connection_reset",), yields_to=(TRACER,)),
    WARN_RESETS: Source(("connection_reset",), yields_to=(TRACER, STATE_RESETS, PACKETS)),
    SOCKET_ERRORS: Source(("connection_reset",), yields_to=(TRACER, STATE_RESETS, WARN_RESETS)),
}

# witness -> its question, source -> its finder: registered by the modules that own the evidence
SEES: dict[str, Callable[[Context], bool]] = {}
FINDS: dict[str, Callable[[Context], list[Finding]]] = {}


def sees(name: str) -> Callable[[Callable[[Context], bool]], Callable[[Context], bool]]:
    """Register ``saw(ctx)``, whether the witness ``name`` (:data:`WITNESSES`) saw the event;
    declared by the module whose detectors judge that evidence, as a detector is. ValueError
    for a name not in the table or registered twice."""
    return _register(SEES, WITNESSES, name)


def finds(name: str) -> Callable[[Callable[[Context], list[Finding]]], Callable[[Context], list[Finding]]]:
    """Register ``find(ctx)``, the findings the source ``name`` (:data:`PRECEDENCE`) gives;
    declared by the module that reads that evidence. ValueError for a name not in the table
    or registered twice."""
    return _register(FINDS, PRECEDENCE, name)


def _register(into: dict, table: dict, name: str) -> Callable:
    if name not in table:
        raise ValueError(f"{name!r} is not in the precedence table")

    def register(fn: Callable) -> Callable:
        if name in into:
            raise ValueError(f"{name!r} registered twice ({into[name].__module__}, {fn.__module__})")
        into[name] = fn
        return fn
    return register


def consult(ctx: Context, name: str) -> list[Finding]:
    """The findings of the source ``name`` (:data:`PRECEDENCE`), or none when a source that
    takes precedence over it saw the event; a memo of the analysis (:meth:`Context.memo`)."""
    return list(ctx.memo(f"precedence:{name}", lambda: _consult(ctx, name)))


def _consult(ctx: Context, name: str) -> list[Finding]:
    src = PRECEDENCE[name]
    costly = [s for s in src.yields_to if s in WITNESSES and WITNESSES[s].costly]
    if any(saw(ctx, s) for s in src.yields_to if s not in costly):
        return []
    found = list(FINDS[name](ctx))
    if found and any(saw(ctx, s) for s in costly):
        return []
    return found


def saw(ctx: Context, name: str) -> bool:
    """Whether the witness or source ``name`` saw the event (a source: consulted, it gave a
    finding)."""
    if name in WITNESSES:
        return SEES[name](ctx)
    return bool(consult(ctx, name))
