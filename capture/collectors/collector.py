"""The lifecycle every collector of a capture follows.

A collector is one object per capture, made from its class in a collector table
(``capture.collectors.BUNDLE`` or ``RING``) with the capture's :class:`capture.session.Session`.
The orchestrator (``capture.runner.Capture``) calls, on every collector of the table in
table order:

- ``start()`` once the job's first processes are known (``session.procs``, maybe none yet);
- ``ready()`` after every collector started: wait for what it needs before the capture counts
  (bpftrace attaching its probes); returns a few words for the "capturing:" line, or None;
- ``sample(now)`` every tick of the capture loop (0.2 s; ``now`` is ``time.monotonic()``):
  periodic work, each collector keeping its own interval;
- ``adopt(fresh, new_ns, new_ifaces)`` when a rescan found processes, network namespaces or
  interfaces the capture did not follow yet;
- ``stop()`` at the end, in table order: children stop and flush (may leave a thread running);
- ``finish()`` after every ``stop()``, in table order: the outputs made final in the staging
  folder and the manifest records completed.

A collector writes only under its own paths of the staging folder, takes its bytes from its
``share`` of the budget (``capture.bundle_files.Budget``: ``tracer``, ``pcap``, ``other`` or
``attach``), and reports through ``session.record`` (the manifest's ``collectors``). It never
calls another collector; the watcher (``capture.watch``) reaches a collector by its name
(``Capture.collector``). ``stop()`` then ``start()`` again must work: a collector may be
restarted during a capture. A collector that fails records it and never raises into the
orchestrator."""
from __future__ import annotations

from ..session import Session
from . import specs


class Collector:
    """Base class: a collector that does nothing at every step. ``name`` is its registry name
    and, when ``specs.by_name()`` has a row of that name, the row holding its command, output
    path, tool and limits (:attr:`spec`)."""

    name: str = ""
    share: str = "other"

    def __init__(self, session: Session):
        self.s = session

    @property
    def spec(self) -> specs.Spec | None:
        return specs.by_name().get(self.name)

    def start(self) -> None:
        """The capture starts."""

    def ready(self) -> str | None:
        """Wait (bounded) until this collector records; a few words for the start line."""
        return None

    def sample(self, now: float) -> None:
        """One tick of the capture loop."""

    def adopt(self, fresh: list, new_ns: list, new_ifaces: list) -> None:
        """New processes (``procs.ProcInfo``), namespaces (``jobs.NetNs``) and (namespace,
        interface) pairs found by a rescan."""

    def stop(self) -> None:
        """The capture ends: stop children, let them flush."""

    def finish(self) -> None:
        """Make the outputs final; complete the manifest records."""

    def status(self) -> dict:
        """Counters for the progress line (e.g. ``{"events": n}``)."""
        return {}
