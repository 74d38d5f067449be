"""The ss series: ``ss -tinpe`` of every network namespace of the job every ``--ss-every``
seconds, appended to ``sys/<ns>/ss-series.txt`` in blocks headed
``# stallscope-sample realtime_ns=.. monotonic_ns=..``. Bytes acknowledged and received over
time tell a link that moves from one with data stuck behind an RTO backoff. Read on a netlink
socket kept open per namespace (``capture.sockdiag``: no process started), ``ss`` itself only
where that socket cannot be had. The policy decides how a series keeps within its bytes.

Standard library only."""
from __future__ import annotations

import shlex
import threading
import time

from .. import children, sockdiag
from ..jobs import NetNs
from ..session import tail
from . import specs
from .collector import Collector

SOCK_DIAG = "netlink-sock_diag"     # the ss series' "command" when read without ss (capture.sockdiag)


class SsSeries(Collector):
    """Samples in the session's pool, one sample at a time: a slow ss skips a beat instead
    of piling up."""

    name = "ss-series"

    def __init__(self, session):
        super().__init__(session)
        self.series: dict[int, dict] = {}      # netns inode -> {path, first_ns, last_ns, stopped, samples}
        self.busy = threading.Event()
        self.sockdiag: dict[int, sockdiag.SockDiag | None] = {}   # netns inode -> its socket (None: use ss)
        self.last = 0.0
        # the newest sample of each namespace (CLOCK_MONOTONIC ns, ss text): what the watcher's
        # tracer-free hang trigger reads (capture.watch.monitors.QuietJobs)
        self.latest: dict[int, tuple[int, bytes]] = {}

    def start(self) -> None:
        self.last = time.monotonic()
        if self.s.o.ss_every_s > 0:
            self.take()
        else:
            self.s.record("ss-series", status="skipped", reason="--ss-every 0 (ss at the start and end only)")

    def sample(self, now: float) -> None:
        if self.s.o.ss_every_s > 0 and now - self.last >= self.s.o.ss_every_s:
            self.last = now
            self.take()

    def take(self) -> None:
        """One ``ss -tinpe`` sample of every namespace of the job, appended to its series file
        (``sys/<ns>/ss-series.txt``, blocks headed ``# stallscope-sample realtime_ns=..``): bytes
        acknowledged and received over time tell a link that moves from one with data stuck
        behind an RTO backoff. Runs in the snapshot pool, one sample at a time: a slow ss
        skips a beat instead of piling up."""
        if self.busy.is_set():
            return
        reason = self.s.skip_reason(self.spec)
        if reason:
            if "ss-series" not in self.s.records:
                self.s.record("ss-series", status="skipped", reason=reason)
            return
        self.busy.set()
        try:
            self.s.submit(self.run_sample)
        except RuntimeError:        # the pool is shutting down
            self.busy.clear()

    def run_sample(self) -> None:
        c = self.spec
        s = self.s
        try:
            for ns in list(s.netns.values()):
                if not ns.pids:
                    continue
                st = self.series.setdefault(ns.inode, {"first_ns": None, "last_ns": None, "stopped": None,
                                                       "samples": 0, "path": None})
                key = f"ss-series@{ns.label}"
                if st["stopped"]:
                    continue
                if not ns.own and not s.is_root:
                    st["stopped"] = "entering another network namespace needs root"
                    s.record(key, status="skipped", reason=st["stopped"])
                    continue
                live = s.live_pid(ns)
                if live is None:
                    continue
                t_ns, t_mono = time.time_ns(), time.monotonic_ns()
                argv, rc, so, se = self.ss_text(ns, live, c)
                if rc != 0:
                    s.record(key, status="ok" if st["samples"] else "failed", command=shlex.join(argv), rc=rc,
                             reason=(f"{argv[0]}: {tail(se)}" if argv[0] == SOCK_DIAG else
                                     f"ss exit code {rc}" if rc is not None else
                                     f"ss still running after {c.timeout_s:g}s: killed"),
                             stderr_tail=tail(se))
                    continue
                self.latest[ns.inode] = (t_mono, so)
                block = f"# stallscope-sample realtime_ns={t_ns} monotonic_ns={t_mono}\n".encode() + so
                path = s.staging / s.fill(c.out, {"ns": ns, "phase": "continuous"})
                st["stopped"] = s.policy.series_room(st, len(block), c.per_file_max, path, s.budget)
                if st["stopped"]:
                    s.record(key, status="ok" if st["samples"] else "skipped", reason=st["stopped"])
                    continue
                st["bytes"] += len(block)
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "ab") as fh:
                    fh.write(block)
                st["path"] = s.rel(path)
                st["first_ns"] = st["first_ns"] or t_ns
                st["last_ns"] = t_ns
                st["samples"] += 1
                s.record(key, status="ok", rc=0, command=shlex.join(argv), files=[st["path"]],
                         started_ns=st["first_ns"], ended_ns=t_ns, covered_ns=[st["first_ns"], t_ns],
                         samples=st["samples"])
        finally:
            self.drop_sockdiag()
            self.busy.clear()

    def ss_text(self, ns: NetNs, live: int, c: specs.Spec) -> tuple[list[str], int | None, bytes, bytes]:
        """``ss -tinpeH`` of one namespace: read on a netlink socket kept open for it
        (capture.sockdiag: no process started, owners looked up among the job's processes
        only), or by running ss where that socket cannot be had. Returns (what ran, rc,
        stdout, stderr)."""
        diag = self.sockdiag.get(ns.inode, False)
        if diag is False:
            try:
                diag = sockdiag.SockDiag(None if ns.own else f"/proc/{live}/ns/net")
            except OSError as e:
                diag = None
                self.s.notes.append(f"ss series of {ns.label}: netlink sock_diag unavailable ({e}): ss runs instead")
            self.sockdiag[ns.inode] = diag
        if diag is not None:
            try:
                return [SOCK_DIAG], 0, diag.text(ns.pids), b""
            except OSError as e:
                return [SOCK_DIAG], 1, b"", str(e).encode()
        argv = ([] if ns.own else ["nsenter", f"--net=/proc/{live}/ns/net"]) + list(c.argv)
        return (argv, *children.run(argv, timeout=c.timeout_s))

    def drop_sockdiag(self) -> None:
        """Close the netlink sockets of namespaces no process of the job is in any more: an
        open socket would keep a finished job's namespace alive for as long as the watcher
        runs."""
        live = {ns.inode for ns in list(self.s.netns.values()) if ns.pids}
        for inode in [i for i in self.sockdiag if i not in live]:
            diag = self.sockdiag.pop(inode)
            if diag is not None:
                diag.close()

