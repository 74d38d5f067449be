"""The collectors of a capture, registered in one table per policy.

Each collector is one class with one lifecycle (``collector.Collector``: start, ready, sample,
adopt, stop, finish), one module each; the command specs they and the snapshots run are the
rows of ``specs.SPECS``. The orchestrator (``capture.runner.Capture``) makes one object per
class of its table and calls each step on all of them: in table order, except ``stop``, which
goes in reverse (the last started stops first: native stacks being taken finish before the
tracer they read stops; the Flight Recorder pipes are written while the others stop).

Adding a collector: one class (a module here) and one row in ``BUNDLE`` (and ``RING`` when
the watcher should run it too). ``tests/capture/collectors/test_capture_collectors.py`` shows it with a toy one.

Standard library only."""
from __future__ import annotations

from .attachments import Attachments
from .collector import Collector
from .fr_pipes import FlightRecorderPipes
from .native_stacks import NativeStacks
from .nccl_tests_run import NcclTestsRun
from .packet_ring import PacketRing
from .packets import Packets
from .snapshots import Snapshots
from .ss_series import SsSeries
from .tracing import Tracing

# a capture: one bundle. The order is the lifecycle's: the tracer starts first (it takes longest
# to attach); the end snapshots are taken once the tracer has stopped (Snapshots.finish after
# Tracing.finish), right before the manifest's ended_ns, which the analyzer takes as their time;
# native stacks being taken finish, and the Flight Recorder pipes get their byte, before the
# others stop (stop goes in reverse); the attachments are copied last (the dumps are in by then).
BUNDLE: tuple[type[Collector], ...] = (
    Tracing, Snapshots, Packets, NcclTestsRun, FlightRecorderPipes, NativeStacks, SsSeries, Attachments,
)

# the watcher (capture.watch): the same, with tcpdump running only from TCP trouble on
RING: tuple[type[Collector], ...] = tuple(PacketRing if c is Packets else c for c in BUNDLE)

__all__ = ["BUNDLE", "RING", "Collector"]
