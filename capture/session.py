"""What every collector of one capture shares: the options, the staging folder and its byte
budget, the policy (bundle or rings), the job being followed (:class:`capture.jobs.Jobs`), the
manifest's per-collector records, the notes, the clock samples and a small thread pool for
snapshots. Collectors receive the session; they never reach into each other.

Standard library only."""
from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from . import bundle_files as bd
from . import manifest as schema
from .jobs import Jobs, NetNs
from .options import CaptureOptions
from .policy import BundlePolicy

STDERR_TAIL = 2000
LOG_CAP = 256 * 1024     # a child's stderr file kept in the bundle is cut to this


def clock_sample() -> dict:
    """CLOCK_MONOTONIC and CLOCK_REALTIME read together: the tightest of three brackets."""
    best = None
    for _ in range(3):
        m0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r = time.time_ns()
        m1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if best is None or m1 - m0 < best[2]:
            best = ((m0 + m1) // 2, r, m1 - m0)
    return schema.CLOCK_SAMPLE.make(monotonic_ns=best[0], realtime_ns=best[1], uncertainty_ns=best[2])


def utc_span(samples: list[dict], span) -> list[int] | None:
    """A CLOCK_MONOTONIC [first, last] as UTC ns (the manifest's ``covered_ns``), each end
    through the clock sample nearest to it; None without a span or samples."""
    if not span or not samples:
        return None
    out = []
    for t in span:
        s = min(samples, key=lambda c: abs(c["monotonic_ns"] - t))
        out.append(int(t + s["realtime_ns"] - s["monotonic_ns"]))
    return out if 0 <= out[0] <= out[1] else None


def tail(data: bytes | str, n: int = STDERR_TAIL) -> str:
    """The last ``n`` characters of a child's stderr, without bpftrace's harmless
    RLIMIT_MEMLOCK warning."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    data = data.strip()
    lines = [l for l in data.splitlines() if "RLIMIT_MEMLOCK" not in l]
    data = "\n".join(lines)
    return data[-n:]


class Session:
    """The shared state of one capture (or of one watcher and, during a cut, of its incident:
    ``capture.watch`` swaps ``staging``, ``records``, ``budget``, ``notes`` and ``futures``).

    ``records`` are the manifest's ``collectors`` entries, one per collector instance
    (``tcpdump@host/eth0``, ``ss:start`` ...), written through :meth:`record` from any thread."""

    def __init__(self, opts: CaptureOptions, stderr=None, policy: BundlePolicy | None = None):
        self.o = opts
        self.err = stderr or sys.stderr
        self.policy = policy or BundlePolicy()
        self.is_root = os.geteuid() == 0
        self.stop_evt = threading.Event()
        self.started_ns = time.time_ns()
        self.host = bd.short_host()
        self.records: dict[str, dict] = {}
        self.clock: list[dict] = []
        self.notes: list[str] = []
        self.jobs = Jobs(opts)
        self.pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="snapshot")
        self.futures: list[cf.Future] = []
        self.lock = threading.Lock()
        self.staging: Path | None = None
        self.budget: bd.Budget | None = None
        self.spool = None     # the tracer's spool (capture.tracer.spool.Spool) once it runs: what others read of it

    @property
    def raw_dir(self) -> Path:
        """Where the tracer's raw lines and the off-CPU samples are spooled while capturing."""
        return self.staging / "bpf" / "raw"

    # the job's processes and namespaces (capture.jobs), read by most collectors
    @property
    def procs(self):
        return self.jobs.procs

    @property
    def netns(self) -> dict[int, NetNs]:
        return self.jobs.netns

    def log(self, msg: str) -> None:
        if self.o.progress != "off":
            print(f"stallscope capture: {msg}", file=self.err, flush=True)

    def record(self, key: str, **kw) -> dict:
        """Create or update the manifest record ``key`` (thread-safe); returns it. A new record
        holds ``capture.manifest.RECORD``'s ``always`` keys; ``kw`` are keys of that table."""
        with self.lock:
            rec = self.records.get(key)
            if rec is None:
                rec = self.records[key] = schema.RECORD.defaults()
            rec.update(kw)
            return rec

    def skip_reason(self, spec) -> str | None:
        """Why a collector described by ``spec`` (a ``capture.collectors.specs.Spec``) cannot
        run here: root or a tool missing; None when it can."""
        if spec.needs_root and not self.is_root:
            return "needs root"
        if spec.tool and shutil.which(spec.tool) is None:
            return f"{spec.tool} not found on PATH"
        return None

    def ns_prefix(self, ns: NetNs) -> list[str]:
        """The argv prefix that runs a command inside ``ns`` (none for capture's own)."""
        return [] if ns.own else ["nsenter", f"--net=/proc/{self.jobs.live_pid(ns) or ns.pid}/ns/net"]

    def live_pid(self, ns: NetNs) -> int | str | None:
        return self.jobs.live_pid(ns)

    def rel(self, p: Path) -> str:
        """``p`` as a bundle path (relative to the staging folder)."""
        return p.relative_to(self.staging).as_posix()

    def fill(self, template: str, ctx: dict) -> str:
        """A spec's argv or path template filled from a scope's context."""
        return template.format(pid=ctx.get("pid", "self"), iface=ctx.get("iface", ""), phase=ctx["phase"],
                               ns=ctx["ns"].label if ctx.get("ns") else "host", snaplen=self.o.snaplen)

    def submit(self, fn, *args) -> None:
        """Run ``fn(*args)`` in the snapshot pool; :meth:`wait_pool` waits for it."""
        self.futures.append(self.pool.submit(fn, *args))

    def wait_pool(self, timeout: float = 120) -> None:
        futures, self.futures = self.futures, []
        cf.wait(futures, timeout=timeout)
