"""How the continuous collectors keep what they record: all of it within the bundle's byte
budget (a capture: :class:`BundlePolicy`), or their last minutes in bounded rings (the
watcher: :class:`RingPolicy`). The collectors ask their policy instead of testing a mode, so
a capture and a watcher run the same collectors and the same orchestrator
(``capture.runner.Capture``); only the policy object and the collector table differ.

Standard library only."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from . import bundle_files as bd
from .tracer import program

# tcpdump's per-packet hand-over and write; a buffered tcpdump (the watcher's) runs without them
TCPDUMP_PER_PACKET = ("--immediate-mode", "-U")


def ring_previous(path: Path) -> Path:
    """The older file of a two-file ring (ring mode): ``x.txt`` -> ``x.1.txt``."""
    return path.with_name(f"{path.stem}.1{path.suffix}")


@dataclass
class BundlePolicy:
    """One bundle: every collector keeps what it records until its byte share is used, then
    stops (first data kept); tcpdump writes each packet as it arrives; the tracer prints its
    records every ``tracer_flush_ms``."""
    ring = False
    age_s: float = 0.0
    tracer_flush_ms: int = program.FLUSH_MS
    tracer_ring: bool = False          # the tracer keeps its records in a kernel ring (bpf/README.md)
    stacks_at_start: bool = True       # --stacks always/auto run from the start of the capture
    buffered_pcap: bool = False        # tcpdump buffers packets (flushed with SIGUSR2 before a cut)
    jobs_by_env: bool = False          # a process with NCCL_* variables but no NCCL library is a job too

    def spool_max_age(self) -> float | None:
        """How long the tracer's spooled segments are kept (None: until the byte share is used)."""
        return None

    def tcpdump_args(self, argv) -> list[str]:
        """tcpdump's argument template as this policy runs it."""
        return list(argv)

    def series_room(self, st: dict, size: int, cap: int, path: Path, budget) -> str | None:
        """Room for ``size`` more bytes of a sampled series (``st``: its state, ``cap``: its
        file cap): None when there is, else why sampling stops. Takes the bytes from the budget."""
        if st.setdefault("bytes", 0) + size > cap:
            return f"the series reached its cap ({cap >> 20} MiB): sampling stopped"
        extra = 2 * bd.TAR_BLOCK if st.get("path") is None else 0
        grant = budget.take(size + extra)
        if grant < size + extra:
            budget.give_back(grant)
            return "byte budget reached: sampling stopped"
        return None


@dataclass
class RingPolicy(BundlePolicy):
    """The watcher's rings: each keeps at least ``age_s`` of data; the tracer's records stay in
    a kernel ring printed on demand (``tracer_ring``); tcpdump buffers; a series keeps two files
    (the current one and the one before), each at most half its cap."""
    ring = True
    tracer_flush_ms: int = 1000
    tracer_ring: bool = True
    stacks_at_start: bool = False      # stacks are taken at an incident (capture.watch)
    buffered_pcap: bool = True
    # the watcher knows nothing of the jobs it protects: one whose NCCL cannot be traced (linked
    # statically, symbols hidden) is still a job, for the tracer-free hang trigger
    jobs_by_env: bool = True

    def spool_max_age(self) -> float | None:
        return self.age_s

    def tcpdump_args(self, argv) -> list[str]:
        return [a for a in argv if a not in TCPDUMP_PER_PACKET]

    def series_room(self, st: dict, size: int, cap: int, path: Path, budget) -> str | None:
        if st.setdefault("bytes", 0) + size > cap // 2 or (
                st.get("opened") and time.monotonic() - st["opened"] > self.age_s):
            try:
                os.replace(path, ring_previous(path))
            except OSError:
                pass
            st["bytes"], st["opened"] = 0, None
        st["opened"] = st.get("opened") or time.monotonic()
        return None
