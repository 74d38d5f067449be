"""The collectors of a capture, registered in one table per policy.

Each collector is one class with one lifecycle (``collector.Collector``: start, ready, sample,
adopt, stop, finish), one module each; the command specs they and the snapshots run are the
rows of ``specs.SPECS``. The orchestrator (``capture.runner.Capture``) makes one object per
class of its table and calls each step on all of them: in table order, except ``stop``, which
goes in reverse (the last started stops first: native stacks being taken finish before the
tracer they read stops; the Flight Recorder pipes are written while the others stop).

Adding a collector: one class (a module here, both named after the collector's ``name``, what
it drives: ``tcpdump`` is ``tcpdump.Tcpdump``) and one row in ``BUNDLE`` (and ``RING`` when
the watcher should run it too). ``tests/capture/collectors/test_capture_collectors.py`` shows it with a toy one.

Standard library only."""
from __future__ import annotations

from .attachments import Attachments
from .collector import Collector
from .flight_recorder_trigger import FlightRecorderTrigger
from .native_stacks import NativeStacks
from .nccl_tests import NcclTests
from .tcpdump import Tcpdump
from .tcpdump_ring import TcpdumpRing
from .snapshots import Snapshots
from .ss_series import SsSeries
from .tracer import Tracer

# a capture: one bundle. The order is the lifecycle's: the tracer starts first (it takes longest
# to attach); the end snapshots are taken once the tracer has stopped (Snapshots.finish after
# Tracer.finish), right before the manifest's ended_ns, which the analyzer takes as their time;
# native stacks being taken finish, and the Flight Recorder pipes get their byte, before the
# others stop (stop goes in reverse); the attachments are copied last (the dumps are in by then).
BUNDLE: tuple[type[Collector], ...] = (
    Tracer, Snapshots, Tcpdump, NcclTests, FlightRecorderTrigger, NativeStacks, SsSeries, Attachments,
)

# the watcher (capture.watch): the same, with tcpdump running only from TCP trouble on
RING: tuple[type[Collector], ...] = tuple(TcpdumpRing if c is Tcpdump else c for c in BUNDLE)

__all__ = ["BUNDLE", "RING", "Collector"]
