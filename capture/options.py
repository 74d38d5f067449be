"""What a capture is asked to do, and how it ends: the options every part of ``capture`` reads,
the two errors the command line turns into exit codes, and the result it reports.

Standard library only (see ``capture/__init__.py``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class CaptureUsageError(ValueError):
    """Bad options (exit code 2)."""


class CaptureFailed(RuntimeError):
    """The bundle could not be written (e.g. a full disk); the data stay in the staging
    folder for ``--recover``. Exit code 3, one line on stderr."""


@dataclass
class CaptureOptions:
    """The command line's options (``capture/cli.py`` maps each flag to a field)."""
    output: str | None = None
    duration_s: float = 120.0
    pids: list[int] = field(default_factory=list)
    ifaces: list[str] = field(default_factory=list)
    max_bytes: int = 2 << 30
    nccl_libs: list[str] = field(default_factory=list)
    nccl_tests: str | None = None
    attach: list[str] = field(default_factory=list)
    bpf: bool = True
    pcap: bool = True
    snaplen: int = 128
    rescan_s: float | None = None   # default: 0.5 s with --pid (descendants only), 2 s for a full /proc scan
    clock_every_s: float = 5.0
    progress: str = "auto"          # auto | tty | lines | off
    ready_timeout_s: float = 90.0
    pcap_slots: int = 4             # interfaces the pcap share is split into (at least)
    call_returns: bool = True       # uretprobes on the collectives too (t1/rc of each call; --no-call-returns)
    offcpu_every_s: float = 2.0     # off-CPU samples of the job's threads (/proc schedstat)
    recover: bool = True            # turn orphaned staging folders in the output folder into bundles
    batch_sched: bool = True        # run capture and its children as SCHED_BATCH (see Capture.yield_cpu)
    ss_every_s: float = 2.0         # ss -tinpe of every namespace of the job this often (0: start/end only)
    stacks: str = "auto"            # native stacks (ptrace): auto (only when hung) | always (at the start) | never
    stacks_grace_s: float = 5.0     # auto: how long to watch the job for progress before deciding it is hung
    stacks_timeout_s: float = 10.0  # each stack tool run is killed after this
    fr_dump_wait_s: float = 10.0    # how long to wait for a Flight Recorder dump after writing to its pipe
    # --watch (capture.watch): rings instead of one bundle, a bundle per incident
    watch: bool = False
    ring_bytes: int = 1 << 30
    hang_after_s: float | None = None   # None: max(10 s, 10x the slowest collective of the last 5 minutes)
    before_s: float = 120.0
    after_s: float = 30.0
    cooldown_s: float = 600.0
    trigger_file: str | None = None
    status_every_s: float = 300.0
    pcap_ring: str = "on-trouble"       # on-trouble: tcpdump runs from TCP trouble or a trigger on | always
    pcap_linger_s: float = 600.0        # on-trouble: and stops after this long without either


@dataclass
class CaptureResult:
    """A finished capture: the bundle (a watcher: its output folder), the exit code (0, or 3
    when a collector failed or the disk filled) and the manifest written."""
    path: Path
    exit_code: int
    manifest: dict
