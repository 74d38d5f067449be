"""``run_capture``: one host's bundle, from discovery to the tar.gz.

Phases: discover the job's processes → start snapshots (concurrently) and the
continuous collectors (tracer, tcpdump per interface, nccl-tests, off-CPU
samples) → capture until ``--duration`` or SIGINT/SIGTERM, rescanning for new
processes, sampling the clocks and refreshing the staged manifest → stop every
child (SIGINT first, so they flush) → tracer events → end snapshots,
attachments, process facts → manifest → tar.gz within the budget.

Everything is staged in a hidden folder next to the bundle
(``.stallscope-<host>-<UTC>.staging-<pid>``), locked (flock) while its capture
lives. A capture that is killed (SIGKILL, OOM) leaves that folder behind with
a manifest refreshed every few seconds; its guardian (``children.Guardian``)
stops its children and says so. ``recover_orphans`` turns such a folder into a
bundle whose manifest says ``"partial": true``: the next capture into the same
folder does it at its end, ``stallscope capture --recover DIR`` on demand.
"""
from __future__ import annotations

import concurrent.futures as cf
import errno
import fcntl
import glob
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from . import bundle as bd
from . import children, procs, sockdiag, stacks, torchfr, tracer
from .offcpu import OffCpuSampler
from .collectors import COLLECTORS, Collector
from . import collectors as colmod

STDERR_TAIL = 2000
TRACER_STOP_S = 30.0    # + 0.5 s per probe: the longest wait for bpftrace's END after SIGINT
LOG_CAP = 256 * 1024


JOB_OUTPUT_TAIL = 64 << 20       # of a traced process's stdout/stderr file, the last part attached


class CaptureUsageError(ValueError):
    """Bad options (exit code 2)."""


class CaptureFailed(RuntimeError):
    """The bundle could not be written (e.g. a full disk); the data stay in the staging
    folder for ``--recover``. Exit code 3, one line on stderr."""


@dataclass
class CaptureOptions:
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
    hang_after_s: float | None = None   # None: max(30 s, 10x the slowest collective of the last 5 minutes)
    before_s: float = 120.0
    after_s: float = 30.0
    cooldown_s: float = 600.0
    trigger_file: str | None = None
    status_every_s: float = 300.0
    pcap_ring: str = "on-trouble"       # on-trouble: tcpdump runs from TCP trouble or a trigger on | always
    pcap_linger_s: float = 600.0        # on-trouble: and stops after this long without either


TPACKET_BLOCK_S = 1.05   # libpcap retires a partly filled block of its kernel ring after tcpdump's 1 s timeout


def tcpdump_files(out: Path) -> list[Path]:
    """The files one tcpdump writes for ``-w out``: out itself, or its ring (out0, out1, ...)."""
    return list(out.parent.glob(out.name + "*"))


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:          # a ring file rotated away meanwhile
        return 0


@dataclass
class CaptureResult:
    path: Path
    exit_code: int
    manifest: dict


@dataclass
class NetNs:
    inode: int
    label: str
    pid: int | str                  # a process inside it ("self" for capture's own)
    own: bool
    name: str | None = None
    ifaces: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)


SOCK_DIAG = "netlink-sock_diag"     # the ss series' "command" when read without ss (capture.sockdiag)


def clock_sample() -> dict:
    """CLOCK_MONOTONIC and CLOCK_REALTIME read together: the tightest of three brackets."""
    best = None
    for _ in range(3):
        m0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r = time.time_ns()
        m1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if best is None or m1 - m0 < best[2]:
            best = ((m0 + m1) // 2, r, m1 - m0)
    return {"monotonic_ns": best[0], "realtime_ns": best[1], "uncertainty_ns": best[2]}


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


def _tail(data: bytes | str, n: int = STDERR_TAIL) -> str:
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    data = data.strip()
    lines = [l for l in data.splitlines() if "RLIMIT_MEMLOCK" not in l]  # bpftrace's harmless warning
    data = "\n".join(lines)
    return data[-n:]


def _netns_names() -> dict[int, str]:
    out = {}
    for p in glob.glob("/run/netns/*"):
        try:
            out[os.stat(p).st_ino] = os.path.basename(p)
        except OSError:
            pass
    return out


class Capture:
    def __init__(self, opts: CaptureOptions, stderr=None):
        self.o = opts
        self.err = stderr or sys.stderr
        self.is_root = os.geteuid() == 0
        self.stop_evt = threading.Event()
        self.started_ns = time.time_ns()
        self.host = bd.short_host()
        self.collectors: dict[str, dict] = {}
        self.clock: list[dict] = []
        self.notes: list[str] = []
        self.procs: dict[int, procs.ProcInfo] = {}
        self.tracer_flush_ms = tracer.FLUSH_MS
        self.tracer_ring = False          # capture --watch: the tracer's records in a ring (tracer.render_script)
        self.not_nccl: dict[int, tuple[int, int]] = {}   # processes seen mapping no NCCL (procs.discover)
        self.netns: dict[int, NetNs] = {}
        self.own_ns = procs.netns_inode("self")
        self.ns_names = _netns_names()
        self.pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="snapshot")
        self.futures: list[cf.Future] = []
        self.lock = threading.Lock()
        self.tracer_proc: subprocess.Popen | None = None
        self.spool: tracer.Spool | None = None
        self.offcpu: OffCpuSampler | None = None
        self.guardian: children.Guardian | None = None
        self.lock_fh = None
        self.orphans: list[Path] = []
        self.tracer_libs: set[str] = set()
        self.tracer_problems: list[str] = []        # asked-for libraries the tracer cannot attach to
        self.snapshots_started: set[str] = set()
        self.tcpdumps: dict[tuple[int, str], dict] = {}
        self.nccl_tests: dict | None = None
        self.pcap_slot_bytes = 0
        self.last_progress = 0.0
        self.ss_series: dict[int, dict] = {}      # netns inode -> {path, first_ns, last_ns, stopped}
        self.seen_sockets: dict[int, set[int]] = {}   # netns inode -> connections already looked at (refresh_ifaces)
        self.offcpu_span: list[int] | None = None     # UTC ns of the first and last off-CPU sample kept
        self.ss_busy = threading.Event()
        self.sockdiag: dict[int, sockdiag.SockDiag | None] = {}   # netns inode -> its netlink socket (None: use ss)
        self.stacks_thread: threading.Thread | None = None
        self.stacks_cancel = threading.Event()    # set when the capture ends: an undecided auto check gives up
        # ring mode (capture.watch): the continuous collectors keep their last minutes instead of
        # filling the bundle's byte budget; ring_age_s is how long a ring keeps data at least
        self.ring = False
        self.ring_age_s = 0.0

    # ------------------------------------------------------------------ helpers
    def log(self, msg: str) -> None:
        if self.o.progress != "off":
            print(f"stallscope capture: {msg}", file=self.err, flush=True)

    def record(self, key: str, **kw) -> dict:
        with self.lock:
            rec = self.collectors.setdefault(key, {"status": None, "reason": None, "command": None, "rc": None,
                                                   "files": [], "stderr_tail": "", "started_ns": None,
                                                   "ended_ns": None})
            rec.update(kw)
            return rec

    def skip_reason(self, c: Collector) -> str | None:
        if c.needs_root and not self.is_root:
            return "needs root"
        if c.tool and shutil.which(c.tool) is None:
            return f"{c.tool} not found on PATH"
        return None

    def ns_prefix(self, ns: NetNs) -> list[str]:
        return [] if ns.own else ["nsenter", f"--net=/proc/{self.live_pid(ns) or ns.pid}/ns/net"]

    def live_pid(self, ns: NetNs) -> int | str | None:
        """A process still inside ns (namespaces of finished jobs go away with them)."""
        if ns.own:
            return "self"
        for pid in [ns.pid] + ns.pids:
            if procs.netns_inode(pid) == ns.inode:
                return pid
        return None

    def rel(self, p: Path) -> str:
        return p.relative_to(self.staging).as_posix()

    # ------------------------------------------------------------------ discovery
    def ensure_netns(self, inode: int | None, pid: int | str) -> NetNs:
        if inode is None or inode == self.own_ns:
            inode = self.own_ns or 0
        ns = self.netns.get(inode)
        if ns is None:
            if inode not in self.ns_names:
                self.ns_names = _netns_names()
            own = inode == self.own_ns
            name = None if own else self.ns_names.get(inode)
            label = "host" if own else f"netns-{name}" if name and re.fullmatch(r"[\w.-]+", name) else f"netns-{inode}"
            ns = NetNs(inode=inode, label=label, pid="self" if own else pid, own=own, name=name)
            self.netns[inode] = ns
        return ns

    def ifaces_for(self, ns: NetNs) -> list[str]:
        avail = procs.netns_interfaces(ns.pid)
        if self.o.ifaces:
            return [i for i in self.o.ifaces if i in avail]
        chosen: list[str] = []
        for pid in ns.pids:
            spec = self.procs[pid].env.get("NCCL_SOCKET_IFNAME")
            for i in procs.select_ifaces(spec, avail):
                if i not in chosen:
                    chosen.append(i)
        if not chosen:
            addrs = set()
            for pid in ns.pids:
                for s in procs.tcp_sockets(pid):
                    if s["state"] == "ESTABLISHED" and not s["saddr"].startswith("127.") and s["saddr"] != "::1":
                        addrs.add(s["saddr"])
            chosen = procs.ifaces_of_addresses(ns.pid, addrs)
        return chosen

    def discover(self, initial: bool) -> list[procs.ProcInfo]:
        found = procs.discover(tracer.NCCL_SYMBOLS, pids=self.o.pids or None,
                               nccl_lib_override=self.o.nccl_libs, skip=set(self.procs), not_nccl=self.not_nccl)
        fresh = []
        for info in found:
            self.procs[info.pid] = info
            ns = self.ensure_netns(info.netns_inode, info.pid)
            ns.pids.append(info.pid)
            fresh.append(info)
            new_libs = {l.host_path for l in info.nccl_libs} - self.tracer_libs
            if not initial and new_libs and self.tracer_proc is not None:
                self.notes.append(f"pid {info.pid} maps {sorted(new_libs)} that appeared after the tracer "
                                  "started: its NCCL calls are not traced (use --nccl-lib)")
        return fresh

    # ------------------------------------------------------------------ snapshots
    def snapshot_jobs(self, phase: str, nss=None, ifaces=None, pids=None):
        """(collector, context) pairs of a phase. With no scope given: every scope; with some
        given (a namespace, interface or process found later): only those, so the snapshots
        already taken are not taken again (a second run would overwrite the first one's file
        with whatever budget is left)."""
        limited = nss is not None or ifaces is not None or pids is not None
        if not limited:
            nss = list(self.netns.values())
            ifaces = [(ns, i) for ns in self.netns.values() for i in ns.ifaces]
            pids = list(self.procs)
        jobs = []
        for c in COLLECTORS:
            if phase not in c.when:
                continue
            if c.scope == "host" and not limited:
                jobs.append((c, {"pid": "self", "ns": self.ensure_netns(self.own_ns, "self"), "phase": phase,
                                 "procs": dict(self.procs)}))
            elif c.scope == "netns":
                for ns in nss or ():
                    jobs.append((c, {"pid": ns.pid, "ns": ns, "phase": phase}))
            elif c.scope == "iface":
                for ns, iface in ifaces or ():
                    jobs.append((c, {"pid": ns.pid, "ns": ns, "iface": iface, "phase": phase}))
            elif c.scope == "process":
                for pid in pids or ():
                    info = self.procs[pid]
                    if c.python_only and not info.python:
                        continue
                    jobs.append((c, {"pid": pid, "ns": self.ensure_netns(info.netns_inode, pid), "phase": phase}))
        return jobs

    def submit_snapshots(self, jobs) -> None:
        for c, ctx in jobs:
            if c.when == ("continuous",) or c.name in ("attachments", "flight-recorder-trigger"):
                continue
            self.futures.append(self.pool.submit(self.run_snapshot, c, ctx))

    def wait_snapshots(self, timeout: float = 120) -> None:
        futures, self.futures = self.futures, []
        cf.wait(futures, timeout=timeout)

    def instance_key(self, c: Collector, ctx: dict) -> str:
        key = c.name
        if c.scope in ("netns", "iface"):
            key += f"@{ctx['ns'].label}"
        if c.scope == "iface":
            key += f"/{ctx['iface']}"
        if c.scope == "process":
            key += f"@pid{ctx['pid']}"
        return f"{key}:{ctx['phase']}"

    def fill(self, template: str, ctx: dict) -> str:
        return template.format(pid=ctx.get("pid", "self"), iface=ctx.get("iface", ""), phase=ctx["phase"],
                               ns=ctx["ns"].label if ctx.get("ns") else "host", snaplen=self.o.snaplen)

    def run_snapshot(self, c: Collector, ctx: dict) -> None:
        key = self.instance_key(c, ctx)
        with self.lock:   # each snapshot once: a file already written is never overwritten
            if key in self.snapshots_started:
                return
            self.snapshots_started.add(key)
        t0 = time.time_ns()
        reason = self.skip_reason(c)
        ns = ctx.get("ns")
        if reason is None and ns is not None and not ns.own and c.argv and not self.is_root:
            reason = "entering another network namespace needs root"
        if reason is None and c.scope in ("netns", "iface") and ns is not None:
            live = self.live_pid(ns)
            if live is None:
                reason = "network namespace gone (its processes exited)"
            else:
                ctx = dict(ctx, pid=live)
        if reason is None and c.scope == "process" and not os.path.isdir(f"/proc/{ctx['pid']}"):
            reason = "process exited"
        if reason:
            self.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=time.time_ns())
            return
        out = self.staging / self.fill(c.out, ctx)
        try:
            if c.argv:
                argv = self.ns_prefix(ns) + [self.fill(a, ctx) for a in c.argv]
                self.record(key, command=shlex.join(argv), started_ns=t0)
                rc, so, se = children.run(argv, timeout=c.timeout_s)
                n, trunc = bd.write_capped(out, so, self.budget, c.per_file_max)
                status = "ok" if rc in c.ok_rc else ("skipped" if c.optional else "failed")
                reason = None
                if rc is None:
                    status, reason = "failed", f"still running after {c.timeout_s:g}s: killed (its output so far is kept)"
                elif status != "ok":
                    reason = (f"{c.optional}: " if c.optional else "") + f"exit code {rc}"
                    if ns is not None and not ns.own and self.live_pid(ns) is None:
                        status, reason = "skipped", "network namespace gone (its processes exited)"
                if trunc:
                    reason = ((reason + "; ") if reason else "") + "output truncated to the byte budget"
                t1 = time.time_ns()      # a snapshot covers the time its command ran
                self.record(key, status=status, reason=reason, rc=rc, files=[self.rel(out)] if n or out.exists() else [],
                            stderr_tail=_tail(se), ended_ns=t1, covered_ns=[t0, t1] if status == "ok" else None)
                return
            fn = getattr(colmod, c.func)
            self.record(key, command=f"stallscope:{c.func}({ctx.get('pid', '')})", started_ns=t0)
            try:
                data = fn(ctx)
            except FileNotFoundError:
                if c.scope in ("netns", "iface") and ns is not None and self.live_pid(ns) is None:
                    raise LookupError("network namespace gone (its processes exited)") from None
                raise
            if isinstance(data, bytes):
                data = {"": data}
            files, truncated = [], False
            for suffix, blob in data.items():
                if c.out.endswith(("/{phase}",)) or suffix.startswith("/"):
                    path = Path(str(out) + suffix)
                else:
                    stem, dot, ext = str(out).rpartition(".")
                    path = Path(f"{stem}{suffix}.{ext}") if dot else Path(str(out) + suffix)
                _, t = bd.write_capped(path, blob, self.budget, c.per_file_max)
                truncated |= t
                files.append(self.rel(path))
            t1 = time.time_ns()
            self.record(key, status="ok", rc=0, files=files, ended_ns=t1, covered_ns=[t0, t1],
                        reason="output truncated to the byte budget" if truncated else None)
        except LookupError as e:   # does not apply here (no IB devices, ...)
            self.record(key, status="skipped", reason=str(e).strip("'\""), ended_ns=time.time_ns())
        except Exception as e:  # noqa: BLE001 - a collector failing must not stop the capture
            self.record(key, status="failed", reason=f"{type(e).__name__}: {e}", ended_ns=time.time_ns())

    # ------------------------------------------------------------------ ss series
    def sample_ss(self) -> None:
        """One ``ss -tinpe`` sample of every namespace of the job, appended to its series file
        (``sys/<ns>/ss-series.txt``, blocks headed ``# stallscope-sample realtime_ns=..``): bytes
        acknowledged and received over time tell a link that moves from one with data stuck
        behind an RTO backoff. Runs in the snapshot pool, one sample at a time: a slow ss
        skips a beat instead of piling up."""
        if self.ss_busy.is_set():
            return
        reason = self.skip_reason(colmod.by_name()["ss-series"])
        if reason:
            if "ss-series" not in self.collectors:
                self.record("ss-series", status="skipped", reason=reason)
            return
        self.ss_busy.set()
        try:
            self.futures.append(self.pool.submit(self._sample_ss))
        except RuntimeError:        # the pool is shutting down
            self.ss_busy.clear()

    def _sample_ss(self) -> None:
        c = colmod.by_name()["ss-series"]
        try:
            for ns in list(self.netns.values()):
                if not ns.pids:
                    continue
                st = self.ss_series.setdefault(ns.inode, {"first_ns": None, "last_ns": None, "stopped": None,
                                                          "samples": 0, "path": None})
                key = f"ss-series@{ns.label}"
                if st["stopped"]:
                    continue
                if not ns.own and not self.is_root:
                    st["stopped"] = "entering another network namespace needs root"
                    self.record(key, status="skipped", reason=st["stopped"])
                    continue
                live = self.live_pid(ns)
                if live is None:
                    continue
                t_ns, t_mono = time.time_ns(), time.monotonic_ns()
                argv, rc, so, se = self._ss_text(ns, live, c)
                if rc != 0:
                    self.record(key, status="ok" if st["samples"] else "failed", command=shlex.join(argv), rc=rc,
                                reason=(f"{argv[0]}: {_tail(se)}" if argv[0] == SOCK_DIAG else
                                        f"ss exit code {rc}" if rc is not None else
                                        f"ss still running after {c.timeout_s:g}s: killed"),
                                stderr_tail=_tail(se))
                    continue
                block = f"# stallscope-sample realtime_ns={t_ns} monotonic_ns={t_mono}\n".encode() + so
                path = self.staging / self.fill(c.out, {"ns": ns, "phase": "continuous"})
                extra = 2 * bd.TAR_BLOCK if st["path"] is None else 0
                grant = 0
                if self.ring:    # a ring of two files: the current one and the one before
                    if st.setdefault("bytes", 0) + len(block) > c.per_file_max // 2 or (
                            st.get("opened") and time.monotonic() - st["opened"] > self.ring_age_s):
                        try:
                            os.replace(path, ring_previous(path))
                        except OSError:
                            pass
                        st["bytes"], st["opened"] = 0, None
                    st["opened"] = st.get("opened") or time.monotonic()
                elif st.setdefault("bytes", 0) + len(block) > c.per_file_max:
                    st["stopped"] = f"the series reached its cap ({c.per_file_max >> 20} MiB): sampling stopped"
                else:
                    grant = self.budget.take(len(block) + extra)
                    if grant < len(block) + extra:
                        self.budget.give_back(grant)
                        st["stopped"] = "byte budget reached: sampling stopped"
                if st["stopped"]:
                    self.record(key, status="ok" if st["samples"] else "skipped", reason=st["stopped"])
                    continue
                st["bytes"] += len(block)
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "ab") as fh:
                    fh.write(block)
                st["path"] = self.rel(path)
                st["first_ns"] = st["first_ns"] or t_ns
                st["last_ns"] = t_ns
                st["samples"] += 1
                self.record(key, status="ok", rc=0, command=shlex.join(argv), files=[st["path"]],
                            started_ns=st["first_ns"], ended_ns=t_ns, covered_ns=[st["first_ns"], t_ns],
                            samples=st["samples"])
        finally:
            self._drop_sockdiag()
            self.ss_busy.clear()

    def _ss_text(self, ns: NetNs, live: int, c: Collector) -> tuple[list[str], int | None, bytes, bytes]:
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
                self.notes.append(f"ss series of {ns.label}: netlink sock_diag unavailable ({e}): ss runs instead")
            self.sockdiag[ns.inode] = diag
        if diag is not None:
            try:
                return [SOCK_DIAG], 0, diag.text(ns.pids), b""
            except OSError as e:
                return [SOCK_DIAG], 1, b"", str(e).encode()
        argv = ([] if ns.own else ["nsenter", f"--net=/proc/{live}/ns/net"]) + list(c.argv)
        return (argv, *children.run(argv, timeout=c.timeout_s))

    def _drop_sockdiag(self) -> None:
        """Close the netlink sockets of namespaces no process of the job is in any more: an
        open socket would keep a finished job's namespace alive for as long as the watcher
        runs."""
        live = {ns.inode for ns in list(self.netns.values()) if ns.pids}
        for inode in [i for i in self.sockdiag if i not in live]:
            diag = self.sockdiag.pop(inode)
            if diag is not None:
                diag.close()

    # ------------------------------------------------------------------ native stacks
    def start_native_stacks(self) -> None:
        """--stacks: always (now, phase "start"), auto (a thread watches the job for
        stacks_grace_s and takes them, phase "hung", only if nothing progressed), never."""
        mode = self.o.stacks
        phase = "start" if mode == "always" else "hung"
        pids = sorted(self.procs)
        reason = None
        if mode == "never":
            reason = "--stacks never"
        elif not self.is_root:
            reason = "needs root"
        elif not stacks.available_tools(python=True):
            reason = "no eu-stack, gdb or py-spy on PATH"
        if reason is None and mode == "always" and not pids:
            reason = "no NCCL process at the start of the capture"
        if reason:
            t = time.time_ns()
            for pid in pids:
                self.record(f"native-stacks@pid{pid}:{phase}", status="skipped", reason=reason, started_ns=t,
                            ended_ns=t)
            if not pids:
                self.record(f"native-stacks:{phase}", status="skipped", started_ns=t, ended_ns=t, reason=reason)
            return
        self.stacks_thread = threading.Thread(target=self._native_stacks_main, args=(mode, phase),
                                              name="native-stacks", daemon=True)
        self.stacks_thread.start()

    def _native_stacks_main(self, mode: str, phase: str) -> None:
        try:
            decision = None
            if mode == "auto":
                hung, decision = self.hung_check()
                if not hung:
                    t = time.time_ns()
                    for pid in sorted(self.procs):
                        self.record(f"native-stacks@pid{pid}:{phase}", status="skipped", reason=decision,
                                    started_ns=t, ended_ns=t)
                    if not self.procs:
                        self.record(f"native-stacks:{phase}", status="skipped", reason=decision, started_ns=t,
                                    ended_ns=t)
                    return
                self.log(f"{decision}: taking native stacks (ptrace)")
            for pid in sorted(self.procs):
                self.take_native_stack(pid, phase, decision)
        except Exception as e:  # noqa: BLE001 - never take the capture down
            self.notes.append(f"native stacks: {type(e).__name__}: {e}")

    def hung_check(self) -> tuple[bool, str]:
        """Watch the job for stacks_grace_s (from now, or from when its first process is found,
        for a capture started before the job): (hung, why)."""
        grace = self.o.stacks_grace_s
        while not self.procs:
            if self.stacks_cancel.wait(0.5):
                return False, "no NCCL process found before the capture ended"
        nss = {ns.inode: (ns.inode, self.live_pid(ns) or ns.pid, ns.own) for ns in list(self.netns.values()) if ns.pids}
        probe = stacks.ProgressProbe(sorted(self.procs), nss)
        before = probe.sample()
        if self.stacks_cancel.wait(grace):
            return False, (f"the capture ended before the {grace:g}s grace period: no decision, no ptrace stop "
                           "(--stacks always takes them at the start)")
        activity, note = None, "--no-bpf"
        if self.spool is not None and self.spool.ready.is_set():
            activity = stacks.tracer_activity(self.raw_dir, call_returns=self.o.call_returns)
            if self.spool.dropped_lines:
                activity.calls += self.spool.dropped_lines
                activity.completed += self.spool.dropped_lines
        elif self.o.bpf:
            note = "the tracer is not running"
        probe.pids = sorted(self.procs)
        return stacks.decide(grace, activity, before, probe.sample(), note)

    def take_native_stack(self, pid: int, phase: str, decision: str | None) -> None:
        key = f"native-stacks@pid{pid}:{phase}"
        c = colmod.by_name()["native-stacks"]
        t0 = time.time_ns()
        info = self.procs[pid]
        tools = stacks.available_tools(info.python)
        reason = None
        if not os.path.isdir(f"/proc/{pid}"):
            reason = "process exited"
        elif not tools:
            reason = "no eu-stack or gdb on PATH (py-spy serves Python processes only)"
        if reason:
            self.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=time.time_ns(),
                        decision=decision)
            return
        out = self.staging / self.fill(c.out, {"pid": pid, "phase": phase})
        threads = stacks.thread_table(pid)
        notes, res, used, argv = [], None, None, None
        for tool in tools:
            argv = stacks.tool_argv(tool, pid)
            self.record(key, status="running", command=shlex.join(argv), started_ns=t0, tool=tool, decision=decision)
            res, used = stacks.run_bounded(argv, self.o.stacks_timeout_s, pid), tool
            if res.killed or stacks.output_ok(tool, res.rc, res.out):
                break
            notes.append(f"{tool} exit code {res.rc}: {_tail(res.err, 300)}")
        status, reason = "ok", None
        if res.killed:
            status, reason = "failed", f"still running after {self.o.stacks_timeout_s:g}s: killed"
        elif not stacks.output_ok(used, res.rc, res.out):
            status, reason = "failed", "; ".join(notes) or f"{used} exit code {res.rc}"
        elif notes:
            reason = "; ".join(notes)
        elif used == "eu-stack" and res.rc == 1:
            reason = "eu-stack exit code 1: some frames could not be unwound"
        if res.resumed:
            reason = ((reason + "; ") if reason else "") + (f"the target was left stopped (threads {res.resumed}): "
                                                            "SIGCONT sent")
        blob = stacks.render(pid, phase, used, argv, threads, decision, res, notes)
        n, trunc = bd.write_capped(out, blob, self.budget, c.per_file_max)
        if trunc:
            reason = ((reason + "; ") if reason else "") + "output truncated to the byte budget"
        t1 = time.time_ns()
        self.record(key, status=status, reason=reason, rc=res.rc, files=[self.rel(out)] if n else [],
                    stderr_tail=_tail(res.err), ended_ns=t1, tool=used, threads=len(threads),
                    seconds=round(res.seconds, 3), resumed_threads=res.resumed or None,
                    covered_ns=[t0, t1] if status == "ok" else None)

    def stop_native_stacks(self) -> None:
        """At the end: an auto check still in its grace period gives up; stacks being taken finish
        (each run is bounded)."""
        self.stacks_cancel.set()
        th = self.stacks_thread
        if th is not None:
            n_tools = len(stacks.TOOLS)
            th.join(timeout=30 + len(self.procs) * n_tools * (self.o.stacks_timeout_s + 3))

    # ------------------------------------------------------------------ tracer
    def start_tracer(self) -> None:
        c = colmod.by_name()["tracer"]
        key = "tracer"
        t0 = time.time_ns()
        reason = "--no-bpf" if not self.o.bpf else self.skip_reason(c)
        if reason:
            self.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=t0)
            return
        # --pid roots and their descendants alive now; later forks are followed in the kernel
        want = sorted(set(self.o.pids) | procs.descendants(self.o.pids)) if self.o.pids else []
        targets = tracer.TraceTargets(want_pids=want)
        for info in self.procs.values():
            for lib in info.nccl_libs:
                targets.nccl.setdefault(lib.host_path, set()).update(lib.symbols or set(tracer.NCCL_SYMBOLS))
            for lib in info.cudart_libs:
                targets.cudart.setdefault(lib.host_path, set()).update(lib.symbols & set(tracer.CUDART_SYMBOLS))
            for lib in info.cuda_libs:
                targets.cuda.setdefault(lib.host_path, set()).update(lib.symbols & set(tracer.CUDA_SYMBOLS))
            targets.traced_pids.append(info.pid)
        from .elf import ElfError, exported_functions_cached
        for path in self.o.nccl_libs:
            try:
                syms = set(exported_functions_cached(path)) & set(tracer.NCCL_SYMBOLS)
            except (OSError, ElfError) as e:
                self.record(key, status="failed", reason=f"--nccl-lib {path}: {e}", started_ns=t0, ended_ns=t0)
                return
            if not syms:   # a wrong library: say so (manifest, stderr, exit code 3); trace the rest
                self.tracer_problems.append(f"--nccl-lib {path}: exports none of the NCCL API "
                                            f"({', '.join(tracer.NCCL_SYMBOLS[:3])}, ...): its calls are not traced")
                self.log(self.tracer_problems[-1])
                continue
            targets.nccl.setdefault(str(Path(path).resolve()), set()).update(syms)
            # processes not started yet: look for the CUDA runtime next to the given libnccl
            for sib in sorted(glob.glob(str(Path(path).resolve().parent / "libcudart.so*"))):
                try:
                    cs = set(exported_functions_cached(sib)) & set(tracer.CUDART_SYMBOLS)
                except (OSError, ElfError):
                    continue
                real = str(Path(sib).resolve())
                if cs and not any(os.path.samefile(real, k) for k in targets.cudart):
                    targets.cudart[real] = cs
        self.tracer_libs = set(targets.nccl)
        libc = tracer.own_libc()
        try:
            if libc and tracer.STOP_SYMBOL in exported_functions_cached(libc):
                targets.stop_lib, targets.capture_pid = libc, os.getpid()
        except (OSError, ElfError):
            pass
        targets.fill_addresses()
        feats = tracer.KernelFeatures.probe()
        keys = os.environ.get("BPFTRACE_MAP_KEYS_MAX", str(tracer.MAP_KEYS_MAX))
        # ring mode needs the dump probe's attach point (the libc of this process)
        ring = int(keys) if self.tracer_ring and targets.stop_lib and keys.isdigit() else 0
        script, blocks = tracer.render_script(targets, feats, call_returns=self.o.call_returns,
                                              flush_ms=self.tracer_flush_ms, ring=ring)
        bpf_dir = self.staging / "bpf"
        bpf_dir.mkdir(parents=True, exist_ok=True)
        script_path = bpf_dir / "nccl.generated.bt"
        script_path.write_text(script)
        self.budget.take(len(script) + 1024)
        argv = ["bpftrace", "-B", "line", str(script_path)]
        self.tracer_stderr = open(bpf_dir / "tracer.stderr.txt", "wb")
        env = dict(os.environ, BPFTRACE_PERF_RB_PAGES=os.environ.get("BPFTRACE_PERF_RB_PAGES", "256"),
                   BPFTRACE_MAP_KEYS_MAX=keys)
        self.tracer_proc = children.spawn(argv, stdout=subprocess.PIPE, stderr=self.tracer_stderr, env=env)
        # raw lines are spooled as they come (no parsing while the job runs) and become
        # bpf/events.jsonl at the end; the spool keeps within the tracer's byte share
        self.spool = tracer.Spool(self.tracer_proc.stdout, self.raw_dir, self.budget.tracer,
                                  max_age_s=self.ring_age_s if self.ring else None).start()
        self.record(key, status="running", command=shlex.join(["bpftrace", "-B", "line", "bpf/nccl.generated.bt"]),
                    started_ns=t0, files=["bpf/events.jsonl", "bpf/nccl.generated.bt", "bpf/tracer.stderr.txt"],
                    libraries=sorted(targets.nccl), cuda_libraries=sorted(set(targets.cudart) | set(targets.cuda)),
                    blocks=blocks, kernel_tracepoints=sorted(feats.tracepoints), btf=feats.btf,
                    call_returns=self.o.call_returns, **({"ring_slots": ring} if ring else {}))

    @property
    def raw_dir(self) -> Path:
        return self.staging / "bpf" / "raw"

    def wait_tracer_ready(self) -> bool:
        if self.tracer_proc is None:
            return False
        deadline = time.monotonic() + self.o.ready_timeout_s
        while time.monotonic() < deadline and not self.stop_evt.is_set():
            if self.spool.ready.wait(0.1):
                return True
            if self.tracer_proc.poll() is not None:
                self.spool.join(2)
                break
        return self.spool.ready.is_set()

    def stop_tracer(self) -> None:
        if self.tracer_proc is None:
            return
        proc = self.tracer_proc
        alive = proc.poll() is None
        late = False
        if alive and "stop" in self.collectors["tracer"].get("blocks", []):
            # the stop probe: recording ends now, the last records and open calls come out
            tracer.trigger_stop()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and proc.poll() is None and not self.spool.stopped.is_set():
                time.sleep(0.02)
        if alive:
            # bpftrace detaches every probe before its END probe prints the last records, and
            # the kernel takes ~0.1 s per uprobe: wait for END's line rather than a fixed time
            children.kill_group(proc, signal.SIGINT)
            wait_s = TRACER_STOP_S + 0.5 * (self.spool.attached_probes or 50)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and proc.poll() is None and not self.spool.ended.is_set():
                time.sleep(0.05)
            late = proc.poll() is None and not self.spool.ended.is_set()
        rc = children.stop(proc, signal.SIGINT, grace_s=10)
        self.spool.join(timeout=15)
        self.tracer_stderr.close()
        err = (self.staging / "bpf/tracer.stderr.txt").read_bytes()
        bd.truncate_file(self.staging / "bpf/tracer.stderr.txt", LOG_CAP)
        flushed = self.spool.stopped.is_set()   # the stop probe printed every record before SIGINT
        final = flushed or self.spool.ended.is_set()
        ok = self.spool.ready.is_set() and alive and final
        reason = None
        if not self.spool.ready.is_set():
            reason = "bpftrace did not start: " + _tail(err, 600)
        elif not alive:
            reason = f"bpftrace exited early (code {proc.returncode})"
        elif late and not flushed:
            reason = (f"bpftrace did not finish within {wait_s:.0f}s of SIGINT and was killed: "
                      "the records of its last flush interval are missing")
        elif not final:
            reason = (f"bpftrace ended (code {rc}) without its last flush: the records of its last flush "
                      "interval are missing; see stderr_tail")
        elif late:
            reason = f"bpftrace did not finish within {wait_s:.0f}s of SIGINT and was killed (after its last flush)"
        if self.tracer_problems:
            ok, reason = False, "; ".join(([reason] if reason else []) + self.tracer_problems)
        self.record("tracer", status="ok" if ok else "failed", reason=reason, rc=rc, stderr_tail=_tail(err),
                    ended_ns=time.time_ns())

    # ------------------------------------------------------------------ off-CPU samples and events.jsonl
    def start_offcpu(self) -> None:
        key = "offcpu"
        t0 = time.time_ns()
        if not self.o.bpf:
            self.record(key, status="skipped", reason="--no-bpf", started_ns=t0, ended_ns=t0)
            return
        self.offcpu = OffCpuSampler(self.raw_dir / "offcpu.jsonl", self.budget.tracer // 8, ring=self.ring)
        self.record(key, status="running", command="stallscope:offcpu(/proc/PID/task/TID/schedstat every "
                    f"{self.o.offcpu_every_s:g}s)", started_ns=t0, files=["bpf/events.jsonl"])

    def sample_offcpu(self, final: bool = False) -> None:
        if self.offcpu is None:
            return
        pids = [p for p in self.procs if os.path.isdir(f"/proc/{p}")]
        try:
            if self.offcpu.sample(pids, final=final):
                t = time.time_ns()     # what the samples cover: the first and the last one kept
                self.offcpu_span = [self.offcpu_span[0] if self.offcpu_span else t, t]
        except OSError as e:
            self.notes.append(f"off-CPU sample failed: {e}")

    def build_events(self) -> None:
        """bpf/events.jsonl from the spooled tracer lines and the off-CPU samples."""
        if self.offcpu is None and self.spool is None:
            return
        self.sample_offcpu(final=True)
        out = self.staging / "bpf" / "events.jsonl"
        extra = [self.raw_dir / "offcpu.jsonl"] if self.offcpu is not None else []
        try:
            summ = tracer.postprocess(self.raw_dir if self.spool is not None else None, out, self.budget.tracer,
                                      extra=extra, call_returns=self.o.call_returns, spool=self.spool)
        except Exception as e:  # noqa: BLE001 - keep the raw lines in the bundle instead
            self.record("tracer", status="failed", reason=f"building bpf/events.jsonl failed: "
                        f"{type(e).__name__}: {e}; the raw tracer output is kept in bpf/raw/")
            return
        shutil.rmtree(self.raw_dir, ignore_errors=True)
        if self.offcpu is not None:
            rec = self.collectors["offcpu"]
            reason = None
            if self.offcpu.skipped:
                reason = f"{self.offcpu.skipped} periodic samples left out: byte share used"
            self.record("offcpu", status="ok" if rec["status"] == "running" else rec["status"], reason=reason,
                        rc=0, ended_ns=time.time_ns(), samples=self.offcpu.samples,
                        events=summ["by_type"].get("offcpu", 0), covered_ns=self.offcpu_span)
        if self.spool is not None:
            rec = self.collectors["tracer"]
            reasons = [rec["reason"]] if rec.get("reason") else []
            if summ["dropped_for_budget"]:
                reasons.append(f"{summ['dropped_for_budget']} oldest hot-path events dropped: tracer byte share used")
            if summ["lost_events"]:
                reasons.append(f"bpftrace lost {summ['lost_events']} events")
            self.record("tracer", reason="; ".join(reasons) or None, summary=summ,
                        tracer_messages=summ.pop("messages", []),
                        covered_ns=utc_span(self.clock + [clock_sample()], summ.get("span_monotonic_ns")))

    # ------------------------------------------------------------------ tcpdump
    def ring_plan(self) -> list[str]:
        """tcpdump options keeping one interface's files within its slot of the pcap share."""
        share = self.pcap_slot_bytes
        rec = 16 + self.o.snaplen
        if share >= 2_000_000 + 4 * rec:
            c_mb = max(1, share // 4_000_000)
            w = share // (c_mb * 1_000_000 + rec + 24 + 2 * bd.TAR_BLOCK)
            if w >= 2:
                return ["-C", str(c_mb), "-W", str(min(w, 1000))]
        count = max(1, (share - 24 - 2 * bd.TAR_BLOCK) // rec)
        return ["-c", str(count)]

    def start_tcpdumps(self, pairs: list[tuple[NetNs, str]]) -> None:
        """Start tcpdump on each (namespace, interface) at once, then wait (5 s at most in
        all) until every one is listening: one after the other, each interface would miss
        the packets of the others' start-up time."""
        started = [t for t in (self.spawn_tcpdump(ns, iface) for ns, iface in pairs) if t is not None]
        deadline = time.monotonic() + 5
        for t in started:
            while time.monotonic() < deadline and t["proc"].poll() is None:
                if b"listening on" in t["err"].read_bytes():
                    break
                time.sleep(0.05)

    def tcpdump_tag(self) -> str:
        """Set apart the names (collector key, files) of a tcpdump started again on an interface
        (the watcher's packet ring, restarted on new TCP trouble); a capture starts one."""
        return ""

    def spawn_tcpdump(self, ns: NetNs, iface: str) -> dict | None:
        c = colmod.by_name()["tcpdump"]
        tag = self.tcpdump_tag()
        key = f"tcpdump@{ns.label}/{iface}{tag}"
        if (ns.inode, iface) in self.tcpdumps:
            return None
        t0 = time.time_ns()
        reason = "--no-pcap" if not self.o.pcap else self.skip_reason(c)
        if reason is None and len(self.tcpdumps) >= self.n_slots:
            reason = f"pcap share already split over {self.n_slots} interfaces (raise --max-bytes)"
        if reason:
            self.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=t0)
            self.tcpdumps[(ns.inode, iface)] = {"proc": None, "key": key}
            return None
        ctx = {"ns": ns, "iface": iface, "phase": "continuous", "pid": ns.pid}
        out = self.staging / self.fill(c.out, ctx)
        if tag:
            out = out.with_name(f"{out.stem}{tag}{out.suffix}")
        out.parent.mkdir(parents=True, exist_ok=True)
        errf = self.staging / "logs" / f"tcpdump-{ns.label}-{iface}{tag}.stderr.txt"
        errf.parent.mkdir(parents=True, exist_ok=True)
        args = [a for a in c.argv if not (self.ring and a in colmod.TCPDUMP_PER_PACKET)]
        argv = self.ns_prefix(ns) + [self.fill(a, ctx) for a in args] + self.ring_plan() + ["-w", str(out)]
        fh = open(errf, "wb")
        proc = children.spawn(argv, stdout=subprocess.DEVNULL, stderr=fh)
        self.tcpdumps[(ns.inode, iface)] = {"proc": proc, "key": key, "out": out, "err": errf, "fh": fh,
                                            "packets": 0, "ns": ns, "iface": iface}
        shown = [a if a != str(out) else self.rel(out) for a in argv]
        self.record(key, status="running", command=shlex.join(shown), started_ns=t0)
        with self.lock:   # the start's "no interface yet" placeholder: an interface has come
            if ((self.collectors.get("tcpdump") or {}).get("reason") or "").startswith("no interface yet"):
                del self.collectors["tcpdump"]
        return self.tcpdumps[(ns.inode, iface)]

    def tcpdump_packets(self) -> int:
        """Packets written so far, counted from the pcap record headers (ring files included)."""
        total = 0
        for t in self.tcpdumps.values():
            if not t.get("proc"):
                continue
            n = 0
            for f in tcpdump_files(t["out"]):
                n += bd.pcap_records(f)
            t["packets"] = max(t.get("packets", 0), n)
            total += t["packets"]
        return total

    def flush_tcpdumps(self) -> None:
        """Everything a buffered tcpdump (ring mode: no --immediate-mode, no -U) has captured
        until now onto its files: libpcap hands a block of its kernel ring over when the block
        is full or 1 s old, and SIGUSR2 makes tcpdump write out what it holds. Waits up to
        ~1.5 s; packets of the last moment may still be in flight."""
        live = [t for t in self.tcpdumps.values() if t.get("proc") is not None and t["proc"].poll() is None]
        if not self.ring or not live:
            return
        time.sleep(TPACKET_BLOCK_S)
        for t in live:
            try:
                t["proc"].send_signal(signal.SIGUSR2)
            except ProcessLookupError:
                pass
        sizes, deadline = None, time.monotonic() + 0.5
        while time.monotonic() < deadline:      # written out when the files stop growing
            time.sleep(0.05)
            now = [sum(_size_of(f) for f in tcpdump_files(t["out"])) for t in live]
            if now == sizes:
                break
            sizes = now

    def stop_tcpdumps(self) -> None:
        live = [t for t in self.tcpdumps.values() if t.get("proc") is not None]
        for t in live:
            if t["proc"].poll() is None:
                children.kill_group(t["proc"], signal.SIGINT)
        for t in live:
            p = t["proc"]
            was_alive_rc = p.poll()
            rc = children.stop(p, signal.SIGINT, grace_s=5)
            t["fh"].close()
            err = t["err"].read_bytes()
            bd.truncate_file(t["err"], LOG_CAP)
            files = self.finish_ring(t["out"])
            m = re.findall(rb"(\d+) packets? captured", err)
            drop = re.findall(rb"(\d+) packets? dropped by kernel", err)
            packets = sum(bd.pcap_records(self.staging / f) for f in files)
            if m:
                packets = int(m[-1])
            t["packets"] = packets
            started = b"listening on" in err
            ok = started and (rc == 0 or rc is None or rc < 0)
            reason = None
            if not ok:
                reason = f"tcpdump failed: {_tail(err, 400)}"
            elif rc is not None and rc < 0 and rc != -signal.SIGINT:
                reason = f"tcpdump ended by signal {-rc}"
                if self.live_pid(t["ns"]) is None:
                    reason += " when its network namespace was torn down; the file holds what it had written"
            elif was_alive_rc is not None and rc == 0 and "-c" in self.ring_plan():
                reason = "packet count limit of the byte budget reached (first packets kept)"
            # what it covered: its first and last packet (the record headers, UTC ns)
            spans = [sp for f in files if (sp := bd.pcap_span(self.staging / f))]
            covered = [min(a for a, _ in spans), max(b for _, b in spans)] if spans else None
            self.record(t["key"], status="ok" if ok else "failed", rc=rc, reason=reason,
                        files=files + [self.rel(t["err"])], stderr_tail=_tail(err), ended_ns=time.time_ns(),
                        packets=packets, dropped_by_kernel=int(drop[-1]) if drop else None,
                        netns=t["ns"].label, iface=t["iface"], covered_ns=covered)

    def no_pcap_warning(self) -> None:
        """No tcpdump ran (and --no-pcap was not given): one warning line on stderr saying why,
        the same in the manifest's notes and as the tcpdump collector's reason."""
        if not self.o.pcap or any(self.collectors.get(t["key"], {}).get("status") == "ok"
                                  for t in self.tcpdumps.values()):
            return
        why = self.skip_reason(colmod.by_name()["tcpdump"])
        status = "skipped"
        tried = [t for t in self.tcpdumps.values() if t.get("proc") is not None]
        if why is not None:
            pass
        elif tried:
            status = "failed"
            why = "tcpdump failed on " + ", ".join(f"{t['ns'].label}/{t['iface']}" for t in tried) + \
                  " (see their collectors' reasons)"
        elif self.tcpdumps:
            why = "; ".join(sorted({self.collectors.get(t["key"], {}).get("reason") or "skipped"
                                    for t in self.tcpdumps.values()}))
        elif self.o.ifaces:
            why = (f"--iface {', '.join(self.o.ifaces)}: in none of the namespaces followed "
                   f"({', '.join(ns.label for ns in self.netns.values() if ns.pids or ns.own)})")
        elif not self.procs:
            why = "no NCCL process found and no --iface given"
        else:
            why = ("no interface in use by the job's processes: no NCCL_SOCKET_IFNAME matching an interface of "
                   "their namespaces and no TCP connection off loopback while capturing (or pass --iface)")
        self.notes.append(f"no packet capture: {why}")
        self.record("tcpdump", status=status, reason=why)
        print(f"stallscope capture: warning: no packet capture: {why}", file=self.err, flush=True)

    def finish_ring(self, out: Path) -> list[str]:
        """The bundle paths of one tcpdump's output: its ring files renamed, or the one file."""
        ring = rename_ring(out)
        if not ring:
            return [self.rel(out)] if out.exists() else []
        return [self.rel(p) for p in ring]

    # ------------------------------------------------------------------ nccl-tests
    def start_nccl_tests(self) -> None:
        if not self.o.nccl_tests:
            return
        key = "nccl-tests"
        out = self.staging / "nccl-tests" / "output.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        # nccl-tests output is an attachment: at most half of the attachments' part, 16 MiB
        limit = self.budget.take(min(16 << 20, max(64 << 10, self.budget.attach // 2)), "attach")
        argv = ["sh", "-c", self.o.nccl_tests]
        proc = children.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        result = {"proc": proc, "out": out, "bytes": 0, "truncated": False, "errors": []}

        def pump():
            result["bytes"], result["truncated"] = bd.stream_copy(proc.stdout, out, limit, result["errors"])
        th = threading.Thread(target=pump, daemon=True)
        th.start()
        result["thread"] = th
        self.nccl_tests = result
        self.record(key, status="running", command=shlex.join(argv), started_ns=time.time_ns(),
                    files=[self.rel(out)])

    def stop_nccl_tests(self) -> None:
        t = self.nccl_tests
        if not t:
            return
        finished = t["proc"].poll() is not None
        rc = children.stop(t["proc"], signal.SIGINT, grace_s=3)
        t["thread"].join(timeout=5)
        reason = None if finished else "still running at the end of the capture: stopped"
        if t["errors"]:
            reason = ((reason + "; ") if reason else "") + "; ".join(t["errors"])
        elif t["truncated"]:
            reason = ((reason + "; ") if reason else "") + "output truncated to the byte budget"
        status = "ok" if (rc == 0 or not finished) else "failed"
        if finished and rc != 0:
            reason = f"exit code {rc}"
        t1 = time.time_ns()
        self.record("nccl-tests", status=status, rc=rc, reason=reason, ended_ns=t1,
                    covered_ns=[self.collectors["nccl-tests"]["started_ns"], t1])

    # ------------------------------------------------------------------ Flight Recorder pipes
    def trigger_flight_recorders(self) -> list:
        """One byte into the debug pipe of every process whose environment sets
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE (capture.torchfr); what to wait for."""
        pending, seen = [], set()
        for pid, info in sorted(self.procs.items()):
            e = info.env
            if not e.get(torchfr.PIPE_VAR):
                continue
            key = f"flight-recorder-trigger@pid{pid}"
            t0 = time.time_ns()
            rank = info.rank_facts()["rank"]
            shown, pipes = torchfr.pipe_paths(pid, e, rank)
            if not os.path.isdir(f"/proc/{pid}"):
                self.record(key, status="skipped", reason="process exited", started_ns=t0, ended_ns=t0, pipe=shown)
                continue
            if not pipes:
                self.record(key, status="skipped", started_ns=t0, ended_ns=t0, pipe=shown,
                            reason=f"no pipe {shown} in the process's file system: torch creates it only with a "
                                   "trace buffer (TORCH_NCCL_TRACE_BUFFER_SIZE > 0; newer releases default to 2000)"
                                   + ("" if rank is not None else "; RANK unknown"))
                continue
            before = {f: sig for f in torchfr.dump_files(pid, e, rank) if (sig := torchfr.file_sig(f))}
            results = []
            for path in pipes:
                real = os.path.realpath(path)
                if real in seen:
                    continue
                seen.add(real)
                results.append(torchfr.trigger(path))
            if not results:
                self.record(key, status="skipped", started_ns=t0, ended_ns=t0, pipe=shown,
                            reason="the same pipe as another process's, already written to")
                continue
            if not any(ok for ok, _ in results):
                # nobody reading (ENXIO): the process group that polled it is gone, nothing to ask
                idle = all(msg.startswith("nobody has the pipe open") for _, msg in results)
                self.record(key, status="skipped" if idle else "failed", started_ns=t0, ended_ns=time.time_ns(),
                            pipe=shown,
                            command=f"write 1 byte to {shown}", reason="; ".join(msg for _, msg in results))
                continue
            self.record(key, status="running", started_ns=t0, pipe=shown, command=f"write 1 byte to {shown}")
            pending.append(torchfr.Pending(key=key, pid=pid, rank=rank, shown=shown, triggered_ns=time.time_ns(),
                                           started_ns=t0, before=before, env=dict(e)))
        if pending:
            self.log(f"Flight Recorder dump requested from {len(pending)} process(es) through their pipes")
        self.fr_deadline = time.monotonic() + self.o.fr_dump_wait_s
        return pending

    def wait_flight_recorders(self, pending: list) -> None:
        """Until fr_dump_wait_s after the triggers: each dump new or changed and no longer growing."""
        if not pending:
            return
        got = torchfr.wait_dumps(pending, self.fr_deadline)
        for p in pending:
            path = got.get(p.key)
            if path:
                secs = (time.time_ns() - p.triggered_ns) / 1e9
                self.record(p.key, status="ok", rc=0, ended_ns=time.time_ns(), dump=path,
                            reason=f"dump written within {secs:.1f}s; attached under flight-recorder/")
            else:
                self.record(p.key, status="failed", ended_ns=time.time_ns(),
                            reason=f"triggered, but no new dump <prefix>{p.rank if p.rank is not None else '<rank>'} "
                                   f"within {self.o.fr_dump_wait_s:g}s (prefixes: "
                                   f"{', '.join(torchfr.dump_prefixes(p.pid, p.env))}); newer torch polls the pipe in "
                                   "its heartbeat monitor thread, every TORCH_NCCL_COORD_CHECK_MILSEC (1 s) only "
                                   "while dump-on-timeout is on, else every heartbeat timeout (minutes)")

    # ------------------------------------------------------------------ attachments
    def attachment_sources(self, dumps: bool = True) -> tuple[list[tuple[str, str]], list[str]]:
        """(path, why) of files to attach, and patterns that matched nothing; ``dumps=False``:
        without the Flight Recorder dumps (the watcher's log trigger)."""
        found, missing = [], []
        for pat in self.o.attach:
            hits = sorted(glob.glob(pat)) or ([pat] if os.path.isfile(pat) else [])
            if not hits:
                missing.append(pat)
            found += [(h, "--attach") for h in hits if os.path.isfile(h)]
        for pid, info in self.procs.items():
            e = info.env
            root = f"/proc/{pid}/root"
            cwd = f"/proc/{pid}/cwd"

            def resolve(p):
                base = p if p.startswith("/") else os.path.join(cwd, p)
                return base if os.path.exists(os.path.dirname(base) or "/") else root + p
            # the job's own output, where its stdout or stderr is a file (a launcher's log, a Slurm
            # job's output file): watchdog timeouts and NCCL WARN lines land there; read through
            # /proc/PID/fd, so a file of another mount namespace is found too
            for fd in (1, 2):
                link = f"/proc/{pid}/fd/{fd}"
                try:
                    if stat.S_ISREG(os.stat(link).st_mode):
                        found.append((link, f"{'stdout' if fd == 1 else 'stderr'} of pid {pid} ({os.readlink(link)})"))
                except OSError:
                    pass
            dbg = e.get("NCCL_DEBUG_FILE")
            if dbg:
                pat = resolve(dbg.replace("%h", "*").replace("%p", str(pid)))
                found += [(h, f"NCCL_DEBUG_FILE of pid {pid}") for h in sorted(glob.glob(pat))]
            # dumps that exist, whatever enabled them: <prefix><rank> for every prefix this torch may
            # use (TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE or the defaults); every
            # rank's <prefix><n> when the rank is unknown (capture.torchfr)
            if dumps:
                found += [(h, f"Flight Recorder dump of pid {pid}")
                          for h in torchfr.dump_files(pid, e, info.rank_facts()["rank"])]
        seen, out = set(), []
        for path, why in found:
            try:
                st = os.stat(path)
                real = (st.st_dev, st.st_ino)      # the same file through /proc/PID/fd and its own path
            except OSError:
                real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                out.append((path, why))
        return out, missing

    def collect_attachments(self) -> None:
        key = "attachments:end"
        t0 = time.time_ns()
        sources, missing = self.attachment_sources()
        if not sources and not missing:
            self.record(key, status="skipped", reason="nothing to attach (no --attach, no NCCL_DEBUG_FILE or "
                        "Flight Recorder dumps in the processes' environment)", started_ns=t0, ended_ns=t0)
            return
        files, notes = [], []

        def size(src: tuple[str, str]) -> int:
            try:
                return os.path.getsize(src[0])
            except OSError:
                return 0
        # smallest first, each at most an equal share of what is left: one huge log
        # cannot leave the other ranks' logs nothing
        sources = sorted(sources, key=size)
        for n_left, (path, why) in zip(range(len(sources), 0, -1), sources):
            try:
                with open(path, "rb") as fh:
                    head = fh.read(4096)
                name = os.path.basename(path)
                job_output = why.startswith(("stdout of pid", "stderr of pid"))
                if job_output:                     # /proc/PID/fd/N: named after the stream, pid and file
                    target = os.path.basename(why.split("(", 1)[1].rstrip(")")) if "(" in why else "out"
                    name = f"job-{why.split()[0]}-{why.split()[3]}-{target}"
                if head[:1] == b"\x80" or "nccl_trace_rank" in name or why.startswith("Flight Recorder"):
                    folder = "flight-recorder"
                elif b"nccl-tests" in head or b"Avg bus bandwidth" in head or b"# nThread" in head:
                    folder = "nccl-tests"
                else:
                    folder = "logs"
                dst = self.staging / folder / name
                i = 1
                while dst.exists():
                    dst = self.staging / folder / f"{i}-{name}"
                    i += 1
                if job_output:
                    # the job's own output may be gigabytes: its last part is what tells the stall
                    with open(path, "rb") as fh:
                        size = os.fstat(fh.fileno()).st_size
                        fh.seek(max(0, size - JOB_OUTPUT_TAIL))
                        data = fh.read(JOB_OUTPUT_TAIL)
                    if size > JOB_OUTPUT_TAIL:
                        notes.append(f"{path} ({why}): its last {JOB_OUTPUT_TAIL >> 20} MiB of {size} bytes attached")
                else:
                    data = Path(path).read_bytes()
                if folder == "flight-recorder":
                    grant = self.budget.take(len(data) + 1024, "attach")
                    if grant < len(data) + 1024:
                        self.budget.give_back(grant, "attach")
                        notes.append(f"{path}: not attached ({len(data)} bytes exceed the byte budget)")
                        continue
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_bytes(data)
                else:
                    share = max(0, self.budget.room("attach") // n_left - 2 * bd.TAR_BLOCK)
                    _, trunc = bd.write_capped(dst, data, self.budget, min(64 << 20, share), pool="attach",
                                               keep_head=True)
                    if trunc:
                        notes.append(f"{path}: cut in the middle to fit the byte budget (its start and end kept)")
                files.append({"source": path, "path": self.rel(dst), "why": why})
            except OSError as e:
                notes.append(f"{path}: {e.strerror}")
        status = "failed" if missing else "ok"
        reason = "; ".join(([f"no file matches {m!r}" for m in missing]) + notes) or None
        self.record(key, status=status, reason=reason, command="copy " + " ".join(shlex.quote(s) for s, _ in sources),
                    rc=0, files=[f["path"] for f in files], sources=files, started_ns=t0, ended_ns=time.time_ns())

    # ------------------------------------------------------------------ process facts
    def process_facts(self) -> list[dict]:
        ss_by_ns: dict[int, list[dict]] = {}
        for ns in self.netns.values():
            f = self.staging / "sys" / ns.label / "ss-tinp-end.txt"
            if f.exists():
                ss_by_ns[ns.inode] = procs.parse_ss_tinp(f.read_text(errors="replace"))
        out = []
        for pid, info in sorted(self.procs.items()):
            d = info.to_manifest()
            ns = self.ensure_netns(info.netns_inode, pid)
            d["netns"] = ns.label
            d["alive_at_end"] = os.path.isdir(f"/proc/{pid}")
            socks = procs.tcp_sockets(pid) if d["alive_at_end"] else []
            ss = ss_by_ns.get(ns.inode, [])
            for s in socks:
                loc = f"{s['saddr']}:{s['sport']}"
                peer = f"{s['daddr']}:{s['dport']}"
                for row in ss:
                    if row["local"].replace("[", "").replace("]", "").endswith(loc) and \
                            row["peer"].replace("[", "").replace("]", "").endswith(peer):
                        for k in ("retrans_now", "retrans_total", "bytes_retrans", "bytes_sent", "bytes_received",
                                  "lost", "rtt_ms", "cwnd", "segs_out"):
                            if k in row:
                                s[k] = row[k]
                        break
            d["sockets"] = socks
            out.append(d)
        return out

    # ------------------------------------------------------------------ progress
    def staged_bytes(self) -> int:
        total = 0
        for p in self.staging.rglob("*"):
            try:
                if p.is_file():
                    total += p.stat().st_size
            except OSError:
                pass
        return total

    def progress(self, t_capture0: float, force: bool = False) -> None:
        mode = self.o.progress
        if mode == "off":
            return
        tty = mode == "tty" or (mode == "auto" and hasattr(self.err, "isatty") and self.err.isatty())
        now = time.monotonic()
        if not force and now - self.last_progress < (1.0 if tty else 5.0):
            return
        self.last_progress = now
        events = self.spool.lines if self.spool else 0
        line = (f"{now - t_capture0:6.1f}s/{self.o.duration_s:g}s  events {events}  packets {self.tcpdump_packets()}"
                f"  bytes {self.staged_bytes() / 1048576:.1f}/{self.o.max_bytes / 1048576:.0f} MiB"
                f"  processes {len(self.procs)}")
        if tty:
            print(f"\rstallscope capture: {line}\033[K", end="", file=self.err, flush=True)
        else:
            print(f"stallscope capture: {line}", file=self.err, flush=True)

    # ------------------------------------------------------------------ main
    def on_signal(self, signum, frame) -> None:
        if self.stop_evt.is_set():
            print("\nstallscope capture: finishing the bundle, please wait", file=self.err, flush=True)
        self.stop_evt.set()

    def check_targets(self) -> None:
        """--pid and --nccl-lib name what exists (CaptureUsageError, exit 2, otherwise)."""
        for p in self.o.pids:
            if not os.path.isdir(f"/proc/{p}"):
                raise CaptureUsageError(f"--pid {p}: no such process")
        for lib in self.o.nccl_libs:
            if not os.path.isfile(lib):
                raise CaptureUsageError(f"--nccl-lib {lib}: no such file")

    def run(self) -> CaptureResult:
        o = self.o
        if o.duration_s <= 0:
            raise CaptureUsageError("--duration must be positive")
        if o.max_bytes < bd.MIN_BUDGET:
            raise CaptureUsageError(f"--max-bytes must be at least {bd.MIN_BUDGET // 1024}k")
        self.check_targets()
        try:
            self.out_path = bd.choose_output(o.output, self.host, self.started_ns)
        except (FileExistsError, FileNotFoundError) as e:
            raise CaptureUsageError(str(e)) from None
        self.arcroot = self.out_path.name[: -len(".tar.gz")] if self.out_path.name.endswith(".tar.gz") \
            else self.out_path.stem
        self.staging = self.out_path.parent / f".{self.arcroot}.staging-{os.getpid()}"
        self.staging.mkdir(parents=True)
        self.lock_fh = lock_staging(self.staging)
        self.budget = bd.Budget.plan(o.max_bytes, pcap=o.pcap, tracer=o.bpf)
        self.yield_cpu()
        if o.recover:
            self.orphans = find_orphans(self.out_path.parent)
            if self.orphans:
                self.log(f"{len(self.orphans)} staging folder(s) of killed captures found here "
                         f"({', '.join(p.name for p in self.orphans)}): turned into partial bundles at the end")
        old = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        committed = False
        try:
            try:
                self.guardian = children.Guardian(self.staging)
                children.set_guardian(self.guardian)
            except OSError as e:
                self.notes.append(f"no guardian process ({e}): children other than the direct ones may "
                                  "outlive a killed capture")
            self.write_staged_manifest()
            self.capture()
            try:
                result = self.finalize()
            except OSError as e:
                if e.errno not in DISK_FULL:
                    raise
                Path(str(self.out_path) + ".partial").unlink(missing_ok=True)
                raise CaptureFailed(f"cannot write the bundle into {self.out_path.parent}: {e.strerror}; what was "
                                    f"captured is kept in {self.staging} (free some space, then 'stallscope capture "
                                    f"--recover {self.out_path.parent}')") from None
            committed = True
            return result
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.pool.shutdown(wait=False, cancel_futures=True)
            children.set_guardian(None)
            if self.guardian is not None:
                self.guardian.close()
            if committed:
                shutil.rmtree(self.staging, ignore_errors=True)
            else:
                self.log(f"the bundle was not written; what was captured is kept in {self.staging} "
                         f"('stallscope capture --recover {self.out_path.parent}' makes a partial bundle of it)")
            if self.lock_fh is not None:
                self.lock_fh.close()
            if committed and self.orphans:   # those found at the start; our own bundle is written
                recover_orphans(self.out_path.parent, log=self.log, candidates=self.orphans)

    def yield_cpu(self) -> None:
        """SCHED_BATCH for capture and (inherited) its children: bpftrace wakes up for every
        event it prints; as a batch task its wake-ups never preempt the job's threads, it runs
        in their gaps (the job sleeps in syncs and I/O) and still gets its fair share of a
        busy machine. Nothing capture does is latency-critical; lost tracer events, should
        bpftrace fall behind, are counted in the manifest."""
        if not self.o.batch_sched:
            return
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            self.notes.append("capture and its children ran as SCHED_BATCH (no wake-up preemption of the job)")
        except (OSError, AttributeError) as e:
            self.notes.append(f"SCHED_BATCH not set: {e}")

    def manifest_dict(self, ended_ns: int | None, processes: list[dict], partial: bool) -> dict:
        return {
            "schema_version": bd.SCHEMA_VERSION,
            "tool": "stallscope", "tool_version": __version__,
            "host": self.host, "hostname": os.uname().nodename, "boot_id": bd.boot_id(),
            "kernel": os.uname().release, "machine": os.uname().machine,
            "timezone": bd.timezone_facts(),
            "started_ns": self.started_ns, "ended_ns": ended_ns,
            "partial": partial,
            "clock": "bpf nsecs and *_ns of events are CLOCK_MONOTONIC; convert with clock_samples",
            "clock_samples": list(self.clock),
            "options": {"duration_s": self.o.duration_s if self.o.duration_s != float("inf") else None,
                        "pids": self.o.pids, "ifaces": self.o.ifaces,
                        "max_bytes": self.o.max_bytes, "nccl_libs": self.o.nccl_libs,
                        "nccl_tests": self.o.nccl_tests, "attach": self.o.attach, "bpf": self.o.bpf,
                        "pcap": self.o.pcap, "snaplen": self.o.snaplen, "call_returns": self.o.call_returns,
                        "stacks": self.o.stacks, "stacks_grace_s": self.o.stacks_grace_s,
                        "stacks_timeout_s": self.o.stacks_timeout_s, "fr_dump_wait_s": self.o.fr_dump_wait_s},
            "root": self.is_root,
            "budget": self.budget.to_manifest(),
            "collectors": {k: dict(v) for k, v in sorted(self.collectors.items())},
            "netns": [{"inode": ns.inode, "label": ns.label, "name": ns.name, "own": ns.own, "pids": list(ns.pids),
                       "ifaces": list(ns.ifaces)} for ns in list(self.netns.values())],
            "processes": processes,
            "notes": list(self.notes),
            "files": [],
        }

    def write_staged_manifest(self) -> None:
        """The manifest so far, kept in the staging folder while capturing: what a recovery
        of this folder starts from if capture is killed."""
        try:
            with self.lock:
                m = self.manifest_dict(None, [info.to_manifest() for _, info in sorted(self.procs.items())],
                                       partial=True)
            m["capture"] = {"pid": os.getpid(), "bundle": str(self.out_path), "arcroot": self.arcroot,
                            "staged_ns": time.time_ns()}
            tmp = self.staging / ".manifest.staged.tmp"
            tmp.write_bytes(bd.dumps_manifest(m))
            os.replace(tmp, self.staging / STAGED_MANIFEST)
        except (OSError, RuntimeError) as e:
            self.notes.append(f"staged manifest not written: {e}")

    def capture(self) -> None:
        o = self.o
        self.clock.append(clock_sample())
        self.ensure_netns(self.own_ns, "self")
        self.discover(initial=True)
        if o.pids:
            missing = [p for p in o.pids if p not in self.procs]
            if missing:
                self.notes.append(f"--pid {missing}: not running at start")
        for ns in list(self.netns.values()):
            if ns.own and not ns.pids and o.ifaces:
                ns.ifaces = [i for i in o.ifaces if i in procs.netns_interfaces("self")]
            elif ns.pids:
                ns.ifaces = self.ifaces_for(ns)
        n_if = sum(len(ns.ifaces) for ns in self.netns.values())
        self.n_slots = max(o.pcap_slots, n_if)
        self.pcap_slot_bytes = self.budget.pcap // self.n_slots if self.n_slots else 0
        self.log(f"{len(self.procs)} NCCL process(es) found"
                 + (f" (pids {', '.join(map(str, sorted(self.procs)))})" if self.procs else
                    "; new ones are picked up while capturing"))
        self.submit_snapshots(self.snapshot_jobs("start"))
        self.start_tracer()
        self.start_offcpu()
        self.start_tcpdumps([(ns, iface) for ns in list(self.netns.values()) for iface in ns.ifaces])
        if not any(ns.ifaces for ns in self.netns.values()):
            self.record("tcpdump", status="skipped" if o.pcap else "skipped",
                        reason="--no-pcap" if not o.pcap else "no interface yet: no --iface, and no NCCL process "
                        "with NCCL_SOCKET_IFNAME or a connection off loopback (interfaces are captured as they "
                        "come into use)")
        self.start_nccl_tests()
        if self.tracer_proc is not None:
            if self.wait_tracer_ready():
                self.record("tracer", status="running")
            else:
                self.log("tracer did not start; see the manifest")
        summary = []
        if self.spool is not None and self.spool.ready.is_set():
            summary.append(f"tracer attached ({self.spool.attached_probes} probes)")
        else:
            summary.append("no tracer")
        summary.append(f"tcpdump on {sum(1 for t in self.tcpdumps.values() if t.get('proc'))} interface(s)")
        self.log("capturing: " + "; ".join(summary) + f"; {o.duration_s:g}s or Ctrl-C")
        self.start_native_stacks()
        rescan_s = o.rescan_s or (0.5 if o.pids else 2.0)
        t0 = time.monotonic()
        last_clock = last_scan = last_offcpu = last_ss = t0
        self.sample_offcpu()
        if o.ss_every_s > 0:
            self.sample_ss()
        else:
            self.record("ss-series", status="skipped", reason="--ss-every 0 (ss at the start and end only)")
        self.write_staged_manifest()
        while not self.stop_evt.is_set():
            now = time.monotonic()
            if now - t0 >= o.duration_s:
                break
            if now - last_clock >= o.clock_every_s:
                self.clock.append(clock_sample())
                last_clock = now
                self.write_staged_manifest()
            if now - last_offcpu >= o.offcpu_every_s:
                last_offcpu = now
                self.sample_offcpu()
            if now - last_scan >= rescan_s:
                last_scan = now
                self.rescan()
            if o.ss_every_s > 0 and now - last_ss >= o.ss_every_s:
                last_ss = now
                self.sample_ss()
            if self.tracer_proc is not None and self.tracer_proc.poll() is not None and \
                    self.collectors["tracer"]["status"] == "running":
                self.record("tracer", status="failed")
                self.log("tracer exited early")
            self.progress(t0)
            self.tick(now)
            self.stop_evt.wait(min(0.2, max(0.0, o.duration_s - (time.monotonic() - t0))))
        self.progress(t0, force=True)
        if self.o.progress != "off" and self.err.isatty() if hasattr(self.err, "isatty") else False:
            print(file=self.err)
        self.log("stopping collectors")

    def tick(self, now: float) -> None:
        """Called by the capture loop every 0.2 s (capture.watch checks its triggers here)."""

    def fit_disk(self, manifest: dict, err: OSError) -> dict:
        """The output's file system filled up: cut the staged files (they share it with the
        archive) to what leaves room for their archive, then write a bundle that says so.
        Raises the OSError when even that does not fit (run() then keeps the staging folder)."""
        partial = Path(str(self.out_path) + ".partial")
        for attempt in range(4):
            partial.unlink(missing_ok=True)
            (self.staging / "manifest.json").unlink(missing_ok=True)
            free = shutil.disk_usage(self.staging).free
            staged = sum(p.stat().st_size for p in bd.list_files(self.staging))
            # what is cut is freed on the same file system: staged + archive <= free + staged
            keep = max(0, (free + staged) // 2 - (256 << 10) * (attempt + 1))
            if keep < staged:
                trim(self.staging, staged - keep, manifest)
            manifest.setdefault("notes", []).append(
                f"the output file system was full ({err.strerror}): the staged files were cut to about {keep} bytes "
                "(cut and dropped files are listed above) to write this bundle")
            manifest["partial"] = True
            manifest["partial_reason"] = f"the output file system was full ({err.strerror}); see notes"
            try:
                return fit_budget(self.staging, self.out_path, self.arcroot, manifest, self.o.max_bytes)
            except OSError as e:
                if e.errno not in DISK_FULL:
                    raise
                err = e
        raise err

    def rescan(self) -> None:
        fresh = self.discover(initial=False)
        if not fresh:
            self.start_new_ifaces(self.refresh_ifaces())
            return
        self.log(f"new NCCL process(es): {', '.join(str(i.pid) for i in fresh)}")
        if self.offcpu is not None:   # a first off-CPU sample right away (short jobs)
            try:
                self.offcpu.sample([i.pid for i in fresh])
            except OSError:
                pass
        new_ns, new_ifaces = [], []
        for info in fresh:
            ns = self.ensure_netns(info.netns_inode, info.pid)
            ifaces = self.ifaces_for(ns)
            added = [i for i in ifaces if i not in ns.ifaces]
            if ns not in new_ns and not any(k[0] == ns.inode for k in self.tcpdumps) and not ns.own:
                new_ns.append(ns)
            ns.ifaces += added
            new_ifaces += [(ns, iface) for iface in added]
        self.start_tcpdumps(new_ifaces)
        if new_ifaces:
            self.submit_snapshots(self.snapshot_jobs("start", ifaces=new_ifaces))
        if new_ns:
            self.submit_snapshots(self.snapshot_jobs("start", nss=new_ns))
        self.submit_snapshots(self.snapshot_jobs("start", pids=[i.pid for i in fresh]))
        self.start_new_ifaces(self.refresh_ifaces())

    def refresh_ifaces(self) -> list[tuple[NetNs, str]]:
        """Interfaces newly in use in the namespaces already known, each rescan: a capture
        started before the job's sockets exist (a prolog, a process found before it connected
        or before its exec) captures them as they appear. Per namespace with live processes:
        --iface names that appeared; NCCL_SOCKET_IFNAME (the environment read again while it is
        unset: an exec replaces it) against the interfaces there now; else the interfaces of
        the job's new connections. Cheap: /proc/PID/net/dev and net/tcp{,6} of one process per
        namespace; the processes' fds and ``ip addr`` only for connections not seen before."""
        added: list[tuple[NetNs, str]] = []
        for ns in list(self.netns.values()):
            if not ns.pids and not (ns.own and self.o.ifaces):
                continue
            live = self.live_pid(ns)
            if live is None:
                continue
            avail = procs.netns_interfaces(live)
            chosen: list[str] = []
            if self.o.ifaces:
                chosen = [i for i in self.o.ifaces if i in avail]
            else:
                for pid in list(ns.pids):
                    info = self.procs.get(pid)
                    if info is None:
                        continue
                    if "NCCL_SOCKET_IFNAME" not in info.env and os.path.isdir(f"/proc/{pid}"):
                        env = procs.read_env(pid)
                        if env.get("NCCL_SOCKET_IFNAME"):
                            info.env = env
                    chosen += procs.select_ifaces(info.env.get("NCCL_SOCKET_IFNAME"), avail)
                if not chosen:
                    chosen = self.ifaces_of_new_connections(ns, live)
            new = [i for i in dict.fromkeys(chosen) if i not in ns.ifaces]
            ns.ifaces += new
            added += [(ns, i) for i in new]
        return added

    def ifaces_of_new_connections(self, ns: NetNs, live) -> list[str]:
        """Interfaces of the established connections of ns that this capture has not seen
        before and the job's processes own (loopback left out)."""
        seen = self.seen_sockets.setdefault(ns.inode, set())
        est = procs.netns_established(live)
        new = {ino: a for ino, a in est.items() if ino not in seen}
        if not new:
            return []
        seen.update(new)
        owned: set[int] = set()
        for pid in ns.pids:
            owned.update(procs.socket_inodes(pid))
        addrs = {a for ino, a in new.items() if ino in owned and not a.startswith("127.") and a != "::1"}
        return procs.ifaces_of_addresses(live, addrs) if addrs else []

    def start_new_ifaces(self, pairs: list[tuple[NetNs, str]]) -> None:
        if not pairs:
            return
        self.log("interfaces now in use: " + ", ".join(f"{ns.label}/{i}" for ns, i in pairs))
        self.start_tcpdumps(pairs)
        self.submit_snapshots(self.snapshot_jobs("start", ifaces=pairs))

    def finalize(self) -> CaptureResult:
        # native stacks being taken finish first (bounded; they read the tracer's spool), then
        # the Flight Recorder pipes get their byte: torch dumps while the collectors stop
        self.stop_native_stacks()
        fr_pending = self.trigger_flight_recorders()
        # stop the continuous collectors first (they flush on SIGINT), all at once
        self.stop_nccl_tests()
        tracer_stopper = threading.Thread(target=self.stop_tracer)
        tracer_stopper.start()   # bpftrace exits on SIGINT; its threads join here (not a spawner)
        self.stop_tcpdumps()
        self.no_pcap_warning()
        tracer_stopper.join()
        self.build_events()
        self.wait_snapshots(timeout=60)
        self.submit_snapshots(self.snapshot_jobs("end"))
        self.wait_flight_recorders(fr_pending)
        self.collect_attachments()
        self.wait_snapshots(timeout=120)
        self.clock.append(clock_sample())
        ended_ns = time.time_ns()
        for key, rec in self.collectors.items():
            if rec["status"] == "running":
                rec["status"] = "ok"
        processes = self.process_facts()
        manifest = self.manifest_dict(ended_ns, processes, partial=False)
        disk_full = False
        try:
            manifest = fit_budget(self.staging, self.out_path, self.arcroot, manifest, self.o.max_bytes)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            manifest, disk_full = self.fit_disk(manifest, e), True
        failed = sorted(k for k, r in self.collectors.items() if r["status"] == "failed")
        code = 3 if failed or disk_full else 0
        if disk_full:
            self.log("the output file system was full: the bundle holds what fitted (its manifest's notes say "
                     "what was cut)")
        if failed:
            self.log(f"finished with failed collectors: {', '.join(failed)}")
        skipped = sorted(k.split(":")[0].split("@")[0] for k, r in self.collectors.items()
                         if r["status"] == "skipped" and r.get("reason") == "needs root")
        if skipped:
            self.log(f"not run without root: {', '.join(sorted(set(skipped)))} (the bundle has the rest)")
        self.log(f"bundle {self.out_path} ({self.out_path.stat().st_size} bytes)")
        return CaptureResult(path=self.out_path, exit_code=code, manifest=manifest)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
STAGED_MANIFEST = ".manifest.staged.json"
LOCK_FILE = ".lock"
DIED_MARKER = ".capture-died.json"
_STAGING_RE = re.compile(r"^\.(.+)\.staging-(\d+)$")


def fit_budget(staging: Path, out_path: Path, arcroot: str, manifest: dict, limit: int) -> dict:
    """Write manifest and archive, trimming the biggest capped files until within limit."""
    mpath = staging / "manifest.json"
    for attempt in range(8):
        manifest["files"] = bd.file_entries(staging)
        blob = bd.dumps_manifest(manifest)
        mpath.write_bytes(blob)
        sizes = [f["bytes"] for f in manifest["files"]] + [len(blob)]
        dirs = len({str(Path(f["path"]).parent) for f in manifest["files"]}) + 2
        bound = bd.archive_bound(sizes, dirs)
        if bound > limit:
            trim(staging, bound - limit, manifest)
            continue
        size = bd.write_archive(staging, out_path, arcroot)
        if size <= limit:
            bd.commit_archive(out_path)
            return manifest
        os.unlink(str(out_path) + ".partial")
        trim(staging, size - limit + 4096, manifest)
    raise RuntimeError("could not fit the bundle into --max-bytes")


def trim(staging: Path, excess: int, manifest: dict) -> None:
    """Drop the oldest pcap ring files, then cut the largest files, until excess bytes are freed."""
    def rel(p: Path) -> str:
        return p.relative_to(staging).as_posix()
    excess += 64 * 1024
    notes = manifest.setdefault("notes", [])
    ring = sorted(staging.glob("pcap/*-[0-9][0-9][0-9].pcap"), key=lambda p: p.name)
    for p in ring:
        if excess <= 0:
            break
        excess -= p.stat().st_size + bd.TAR_BLOCK
        notes.append(f"dropped {rel(p)} to stay within --max-bytes")
        p.unlink()
    while excess > 0:
        files = sorted((p for p in bd.list_files(staging) if p.name != "manifest.json"),
                       key=lambda p: p.stat().st_size, reverse=True)
        if not files or files[0].stat().st_size == 0:
            break
        big = files[0]
        size = big.stat().st_size
        keep = max(0, size - excess)
        if big.suffix == ".pcap" or keep == 0:
            notes.append(f"dropped {rel(big)} ({size} bytes) to stay within --max-bytes")
            big.unlink()
            excess -= size + bd.TAR_BLOCK
            continue
        if big.suffix == ".jsonl":  # keep whole lines from the start
            with open(big, "rb") as fh:
                head = fh.read(keep)
            keep = head.rfind(b"\n") + 1
            bd.truncate_file(big, keep, from_end=False)
        else:
            bd.truncate_file(big, keep, from_end=True)
        notes.append(f"cut {rel(big)} from {size} to {keep} bytes to stay within --max-bytes")
        excess -= size - keep


# ------------------------------------------------------------------ killed captures
def lock_staging(staging: Path, block: bool = True):
    """Hold the staging folder's lock (released by the kernel when its holder dies)."""
    fh = open(staging / LOCK_FILE, "a+b")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except OSError:
        fh.close()
        raise
    return fh


def find_orphans(folder: Path) -> list[Path]:
    """Staging folders in folder whose capture is gone (nobody holds their lock)."""
    out = []
    try:
        entries = sorted(Path(folder).iterdir())
    except OSError:
        return out
    for d in entries:
        m = _STAGING_RE.match(d.name)
        if not m or not d.is_dir():
            continue
        if not any((d / f).exists() for f in (LOCK_FILE, STAGED_MANIFEST, "manifest.json")):
            continue              # not one of ours
        if (d / LOCK_FILE).exists():
            try:
                fh = lock_staging(d, block=False)
            except OSError:
                continue          # a live capture holds it
            fh.close()
        elif os.path.isdir(f"/proc/{m.group(2)}"):
            continue              # no lock yet (just created), its capture alive
        out.append(d)
    return out


def ring_previous(path: Path) -> Path:
    """The older file of a two-file ring (ring mode): ``x.txt`` -> ``x.1.txt``."""
    return path.with_name(f"{path.stem}.1{path.suffix}")


def rename_ring(out: Path) -> list[Path]:
    """tcpdump -W names its files x.pcap0, x.pcap1...: renamed oldest first to x-000.pcap,
    x-001.pcap... (the new paths; none when tcpdump wrote one file)."""
    ring = sorted((p for p in tcpdump_files(out) if re.fullmatch(re.escape(out.name) + r"\d+", p.name)),
                  key=lambda p: p.stat().st_mtime_ns)
    stem = out.name[:-5] if out.name.endswith(".pcap") else out.name
    renamed = []
    for i, p in enumerate(ring):
        dst = out.parent / f"{stem}-{i:03d}.pcap"
        p.rename(dst)
        renamed.append(dst)
    return renamed


def _finish_rings(staging: Path) -> None:
    """Every tcpdump ring of a killed capture's staging folder, as stop_tcpdumps does it."""
    outs = {p.with_name(m.group(1)) for p in staging.glob("pcap/*.pcap*")
            if (m := re.fullmatch(r"(.+\.pcap)\d+", p.name))}
    for out in outs:
        rename_ring(out)


def recover_staging(staging: Path, log=None, output_folder: Path | None = None) -> Path | None:
    """Turn the staging folder of a killed capture into a bundle marked ``"partial": true``.

    The folder holds what the capture had staged: snapshots, pcaps, the tracer's
    raw lines and off-CPU samples, and a manifest refreshed every few seconds.
    Returns the bundle's path (None when another process holds the folder)."""
    log = log or (lambda msg: None)
    staging = Path(staging)
    try:
        lock = lock_staging(staging, block=False)
    except OSError:
        return None
    try:
        m = _STAGING_RE.match(staging.name)
        capture_pid = int(m.group(2)) if m else None
        staged = {}
        for name in (STAGED_MANIFEST, "manifest.json"):   # killed while archiving: the final one
            try:
                staged = json.loads((staging / name).read_text())
                break
            except (OSError, ValueError):
                continue
        died = {}
        try:
            died = json.loads((staging / DIED_MARKER).read_text())
        except (OSError, ValueError):
            pass
        info = staged.pop("capture", {})
        host = staged.get("host") or bd.short_host()
        started = staged.get("started_ns") or staging.stat().st_mtime_ns
        opts = staged.get("options", {})
        limit = int(opts.get("max_bytes") or (2 << 30))
        budget = bd.Budget.plan(limit, pcap=opts.get("pcap", True), tracer=opts.get("bpf", True))
        # the killed capture's unfinished archive, if it got that far: ours to replace
        if m:
            (staging.parent / f"{m.group(1)}.tar.gz.partial").unlink(missing_ok=True)
        if info.get("bundle"):
            Path(str(info["bundle"]) + ".partial").unlink(missing_ok=True)
        _finish_rings(staging)
        notes = list(staged.get("notes", []))
        raw = staging / "bpf" / "raw"
        summary = None
        if raw.is_dir():
            try:
                summary = tracer.postprocess(raw, staging / "bpf" / "events.jsonl", budget.tracer,
                                             extra=[raw / "offcpu.jsonl"],
                                             call_returns=bool(opts.get("call_returns", True)))
                shutil.rmtree(raw, ignore_errors=True)
            except Exception as e:  # noqa: BLE001 - the raw lines stay in the bundle
                notes.append(f"building bpf/events.jsonl failed ({type(e).__name__}: {e}); raw lines in bpf/raw/")
        ended = died.get("detected_realtime_ns") or info.get("staged_ns") or time.time_ns()
        collectors = staged.get("collectors", {})
        for key, rec in collectors.items():
            if rec.get("status") in ("running", None):
                rec["status"] = "failed"
                rec["reason"] = "the capture process was killed while this ran; its output up to then is kept"
            if key == "tracer" and summary is not None:
                rec["summary"] = {k: v for k, v in summary.items() if k != "messages"}
                rec["covered_ns"] = utc_span([c for c in staged.get("clock_samples") or [] if isinstance(c, dict)
                                              and isinstance(c.get("monotonic_ns"), int)
                                              and isinstance(c.get("realtime_ns"), int)],
                                             summary.get("span_monotonic_ns"))
        for f in (STAGED_MANIFEST, DIED_MARKER, ".manifest.staged.tmp"):
            (staging / f).unlink(missing_ok=True)
        manifest = dict(staged) if staged else {"schema_version": bd.SCHEMA_VERSION, "tool": "stallscope",
                                                  "tool_version": __version__, "host": host,
                                                  "kernel": os.uname().release, "clock_samples": [],
                                                  "collectors": {}, "processes": []}
        samples = list(manifest.get("clock_samples", []))
        if manifest.get("boot_id") in (None, bd.boot_id()):   # same boot: the clocks' relation still holds
            if died.get("detected_monotonic_ns") and died.get("detected_realtime_ns"):
                samples.append({"monotonic_ns": died["detected_monotonic_ns"],
                                "realtime_ns": died["detected_realtime_ns"], "uncertainty_ns": None,
                                "source": "guardian, when the capture died"})
            samples.append(dict(clock_sample(), source="recovery"))
        manifest.update({"started_ns": started, "ended_ns": ended, "partial": True, "collectors": collectors,
                         "clock_samples": samples,
                         "partial_reason": f"capture process {capture_pid} was killed before it wrote its bundle; "
                                           "recovered from its staging folder", "notes": notes,
                         "recovered": {"by_pid": os.getpid(), "at_ns": time.time_ns(),
                                       "staging": staging.name, "died": died or None}})
        (staging / LOCK_FILE).unlink(missing_ok=True)
        folder = Path(output_folder) if output_folder else staging.parent
        out = bd.choose_output(str(folder), host, started)
        arcroot = out.name[: -len(".tar.gz")]
        fit_budget(staging, out, arcroot, manifest, limit)
        shutil.rmtree(staging, ignore_errors=True)
        log(f"recovered a partial bundle {out} from {staging.name} (capture {capture_pid} was killed)")
        return out
    finally:
        lock.close()


def recover_orphans(folder: Path, log=None, candidates: list[Path] | None = None) -> list[Path]:
    """Every orphaned staging folder in folder (or just ``candidates``) -> a partial bundle;
    their paths."""
    out = []
    for d in find_orphans(folder) if candidates is None else candidates:
        try:
            p = recover_staging(d, log=log)
        except Exception as e:  # noqa: BLE001 - one unreadable folder must not stop the others
            if log:
                log(f"could not recover {d}: {type(e).__name__}: {e} (kept)")
            continue
        if p is not None:
            out.append(p)
    return out


def run_capture(opts: CaptureOptions, stderr=None) -> CaptureResult:
    """Capture one host's bundle; raises CaptureUsageError for bad options."""
    return Capture(opts, stderr=stderr).run()
