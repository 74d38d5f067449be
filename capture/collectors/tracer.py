"""The tracer: bpftrace on the NCCL API, the CUDA host waits and the kernel's TCP and scheduler
tracepoints (``capture.tracer.program`` renders it from ``bpf/nccl.bt``), with the off-CPU
samples of the job's threads (``capture.offcpu``, /proc schedstat). Both spool raw lines into
``bpf/raw/`` while the job runs (no parsing then) and become ``bpf/events.jsonl`` at the end
(``capture.tracer.events.postprocess``), within the tracer's share of the byte budget.

Standard library only."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from .. import bundle_files as bd
from .. import children, procs
from ..elf import ElfError, exported_functions_cached
from ..offcpu import OffCpuSampler
from ..session import LOG_CAP, clock_sample, tail, utc_span
from ..tracer import events, libs, program, spool
from .collector import Collector

TRACER_STOP_S = 30.0    # + 0.5 s per probe: the longest wait for bpftrace's END after SIGINT
RETARGET_SETTLE_S = 0.5     # a job maps its libraries within a moment: they are traced together after this
RETARGET_EVERY_S = 10.0     # restarts at most this often (a burst of new jobs is one restart)
DETACH_AFTER_S = 60.0       # a traced library no followed process maps any more is detached after this
RING_DUMP_WAIT_S = 5.0      # before a restart, the wait for the ring's records to be spooled


def trace_targets(s, versions: dict, pinned: set, problems: list) -> tuple[program.TraceTargets, dict] | str:
    """What the tracer's program attaches to: the NCCL, CUDA runtime and driver libraries the
    session's live processes map (each file once, whatever path or namespace it is seen
    through) and ``--nccl-lib``'s, with the processes traced; and the files covered (file key
    -> the path traced). Fills ``versions`` (path -> NCCL version), ``pinned`` (the
    ``--nccl-lib`` files' keys) and ``problems`` (a ``--nccl-lib`` that exports no NCCL API, once
    each). A string instead: why the tracer cannot start (an ``--nccl-lib`` it cannot read)."""
    # --pid roots and their descendants alive now; later forks are followed in the kernel
    want = sorted(set(s.o.pids) | procs.descendants(s.o.pids)) if s.o.pids else []
    targets = program.TraceTargets(want_pids=want)
    covered: dict[tuple, str] = {}
    for info in s.procs.values():
        if not os.path.isdir(f"/proc/{info.pid}"):
            continue              # gone: its libraries' paths may be gone with its mount namespace
        for lib in info.nccl_libs:
            if lib.key in covered:
                continue          # the same file through another path (another namespace's)
            covered[lib.key] = lib.host_path
            targets.nccl.setdefault(lib.host_path, set()).update(lib.symbols or set(program.NCCL_SYMBOLS))
            if lib.version:
                versions[lib.host_path] = lib.version
        for lib in info.cudart_libs:
            targets.cudart.setdefault(lib.host_path, set()).update(lib.symbols & set(program.CUDART_SYMBOLS))
        for lib in info.cuda_libs:
            targets.cuda.setdefault(lib.host_path, set()).update(lib.symbols & set(program.CUDA_SYMBOLS))
        targets.traced_pids.append(info.pid)
    for path in s.o.nccl_libs:
        try:
            syms = set(exported_functions_cached(path)) & set(program.NCCL_SYMBOLS)
        except (OSError, ElfError) as e:
            return f"--nccl-lib {path}: {e}"
        if not syms:   # a wrong library: say so (manifest, stderr, exit code 3); trace the rest
            problem = (f"--nccl-lib {path}: exports none of the NCCL API "
                       f"({', '.join(program.NCCL_SYMBOLS[:3])}, ...): its calls are not traced")
            if problem not in problems:      # once, not again at each restart
                problems.append(problem)
                s.log(problem)
            continue
        real = str(Path(path).resolve())
        targets.nccl.setdefault(real, set()).update(syms)
        try:
            st = os.stat(real)
            covered.setdefault((st.st_dev, st.st_ino), real)
            pinned.add((st.st_dev, st.st_ino))
        except OSError:
            pass
        # processes not started yet: the CUDA runtime next to the given libnccl
        libs.add_cudart_beside(targets, path)
    return targets, covered


class Tracer(Collector):
    """The tracer's bpftrace (``proc``) and its spool (``spool``, also ``session.spool``), and
    the off-CPU sampler (``offcpu``). The manifest records ``tracer`` and ``offcpu``.

    The tracer follows the libraries of the job: when a process maps an NCCL (or CUDA)
    library the running program does not cover, from any mount namespace, the tracer is
    restarted with the union of the libraries the followed processes map (``retarget``);
    libraries whose last process is gone are dropped at the next restart, or after
    ``DETACH_AFTER_S``. A restart first has the ring printed (ring mode), then stops bpftrace
    (its END prints its last records) and starts the new program into the same spool; the
    watcher's monitor keeps the call state it read. Each restart is listed in the record's
    ``restarts``; the seconds between the two programs are not traced (bpf/README.md)."""

    name = "tracer"
    share = "tracer"

    def __init__(self, session):
        super().__init__(session)
        self.proc: subprocess.Popen | None = None
        self.spool: spool.Spool | None = None
        self.stderr_fh = None
        self.problems: list[str] = []          # asked-for libraries the tracer cannot attach to
        self.offcpu: OffCpuSampler | None = None
        self.offcpu_span: list[int] | None = None     # UTC ns of the first and last off-CPU sample kept
        self.last_offcpu = 0.0
        self.stopper: threading.Thread | None = None
        self.covered: dict[tuple, str] = {}    # NCCL libraries of the running program: (dev, inode) -> path
        self.pinned: set[tuple] = set()         # those of --nccl-lib: traced whether or not a process maps them
        self.versions: dict[str, str] = {}     # their NCCL version strings, by path
        self.retarget_why: str | None = None
        self.retarget_at = 0.0
        self.last_restart = -1e18       # monotonic s of the last restart (the first one waits for nothing)
        self.last_check = 0.0
        self.orphaned_since: float | None = None
        self.restarts: list[dict] = []
        self.libs = libs.AheadOfTime(session)    # the watcher's: files found before a job maps them

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.start_tracer()
        self.start_offcpu()

    def ready(self) -> str | None:
        s = self.s
        if self.proc is not None:
            if self.wait_ready():
                s.record("tracer", status="running")
            else:
                s.log("tracer did not start; see the manifest")
        self.last_offcpu = time.monotonic()
        self.sample_offcpu()
        if self.spool is not None and self.spool.ready.is_set():
            return f"tracer attached ({self.spool.attached_probes} probes)"
        return "no tracer"

    def sample(self, now: float) -> None:
        s = self.s
        if now - self.last_offcpu >= s.o.offcpu_every_s:
            self.last_offcpu = now
            self.sample_offcpu()
        if self.proc is not None and self.proc.poll() is not None and s.records["tracer"]["status"] == "running":
            s.record("tracer", status="failed")
            s.log("tracer exited early")
        if self.proc is None or not self.alive():
            return
        if now - self.last_check >= 2.0:
            self.last_check = now
            self.check_orphans(now)
        why = self.libs.poll(self, now)           # a library mapped or found the program does not cover
        if why:
            self.retarget_why, self.retarget_at = why, now
            if self.libs.held:
                self.last_restart = -1e18         # at once: a held process waits for it
        if self.retarget_why and now >= max(self.retarget_at, self.last_restart + RETARGET_EVERY_S) \
                and not self.libs.busy():
            why, self.retarget_why = self.retarget_why, None
            self.retarget(why)

    def adopt(self, fresh, new_ns, new_ifaces) -> None:
        """New processes, or known ones whose libraries changed: those mapping an NCCL library the
        running program does not cover get the tracer restarted for them (after a settle time)."""
        for info in fresh:
            new = sorted({l.host_path for l in info.nccl_libs if not self.covers(l) and l.key not in self.libs.declined})
            if new and self.proc is not None:
                if not self.retarget_why:
                    self.retarget_at = time.monotonic() + RETARGET_SETTLE_S
                self.retarget_why = ((self.retarget_why + "; " if self.retarget_why else "")
                                     + f"pid {info.pid} maps {', '.join(new)}")[:1000]
        if fresh and self.offcpu is not None:   # a first off-CPU sample right away (short jobs)
            try:
                self.offcpu.sample([i.pid for i in fresh])
            except OSError:
                pass

    def stop(self) -> None:
        """bpftrace exits on SIGINT, stopped by a thread (its END can take a while); joined in finish."""
        self.libs.resume_all()
        self.stopper = threading.Thread(target=self.stop_tracer)
        self.stopper.start()

    def finish(self) -> None:
        if self.stopper is not None:
            self.stopper.join()
            self.stopper = None
        self.build_events()

    def status(self) -> dict:
        return {"events": self.spool.lines if self.spool else 0}

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop_quietly(self) -> None:
        """Stop bpftrace without building events (the watcher's end: its rings are dropped)."""
        self.libs.resume_all()
        if self.alive():
            children.stop(self.proc, signal.SIGINT, grace_s=10)
            if self.spool is not None:
                self.spool.join(timeout=10)
            self.stderr_fh.close()

    # ------------------------------------------------------------------ the tracer
    def start_tracer(self, restart: bool = False, overlap: bool = False) -> None:
        """bpftrace on the libraries the job's processes map (and --nccl-lib's), its raw lines
        spooled as they come; ``restart``: a new program into the same spool and record."""
        s = self.s
        c = self.spec
        key = "tracer"
        t0 = time.time_ns()
        reason = "--no-bpf" if not s.o.bpf else s.skip_reason(c)
        if reason:
            s.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=t0)
            return
        found = trace_targets(s, self.versions, self.pinned, self.problems)
        if isinstance(found, str):
            s.record(key, status="failed", reason=found, started_ns=t0, ended_ns=t0)
            return
        targets, covered = found
        self.libs.add_targets(targets, covered, self.versions)
        self.covered = covered
        libc = program.own_libc()
        try:
            if libc and program.STOP_SYMBOL in exported_functions_cached(libc):
                targets.stop_lib, targets.capture_pid = libc, os.getpid()
        except (OSError, ElfError):
            pass
        targets.fill_addresses()
        feats = program.KernelFeatures.probe()
        keys = os.environ.get("BPFTRACE_MAP_KEYS_MAX", str(program.MAP_KEYS_MAX))
        # ring mode needs the dump probe's attach point (the libc of this process)
        ring = int(keys) if s.policy.tracer_ring and targets.stop_lib and keys.isdigit() else 0
        script, blocks = program.render_script(targets, feats, call_returns=s.o.call_returns,
                                              flush_ms=s.policy.tracer_flush_ms, ring=ring)
        bpf_dir = s.staging / "bpf"
        bpf_dir.mkdir(parents=True, exist_ok=True)
        script_path = bpf_dir / "nccl.generated.bt"
        script_path.write_text(script)
        if not restart:
            s.budget.take(len(script) + 1024)
        argv = ["bpftrace", "-B", "line"] + (["--unsafe"] if targets.hold and ring else []) + [str(script_path)]
        self.stderr_fh = open(bpf_dir / "program.stderr.txt", "ab" if restart else "wb")
        self.libs.rendered(targets, ring)
        env = dict(os.environ, BPFTRACE_PERF_RB_PAGES=os.environ.get("BPFTRACE_PERF_RB_PAGES", "256"),
                   BPFTRACE_MAP_KEYS_MAX=keys)
        self.proc = children.spawn(argv, stdout=subprocess.PIPE, stderr=self.stderr_fh, env=env)
        s.jobs.tools.add(self.proc.pid)          # it maps the libraries it probes: no job of the host
        # raw lines are spooled as they come (no parsing while the job runs) and become
        # bpf/events.jsonl at the end; the spool keeps within the tracer's byte share
        if restart and self.spool is not None and overlap:
            self.spool.overlap(self.proc.stdout)
        elif restart and self.spool is not None:
            self.spool.follow(self.proc.stdout)
        else:
            self.spool = spool.Spool(self.proc.stdout, s.raw_dir, s.budget.tracer,
                                            max_age_s=s.policy.spool_max_age()).start()
        s.spool = self.spool
        s.record(key, status="running", command=shlex.join(["bpftrace", "-B", "line", "bpf/nccl.generated.bt"]),
                 **({} if restart else {"started_ns": t0}),
                 files=["bpf/events.jsonl", "bpf/nccl.generated.bt", "bpf/program.stderr.txt"],
                 libraries=sorted(targets.nccl), cuda_libraries=sorted(set(targets.cudart) | set(targets.cuda)),
                 library_versions={p: v for p, v in sorted(self.versions.items()) if p in targets.nccl},
                 blocks=blocks, kernel_tracepoints=sorted(feats.tracepoints), btf=feats.btf,
                 call_returns=s.o.call_returns, **({"ring_slots": ring} if ring else {}))

    def wait_ready(self) -> bool:
        s = self.s
        if self.proc is None:
            return False
        deadline = time.monotonic() + s.o.ready_timeout_s
        while time.monotonic() < deadline and not s.stop_evt.is_set():
            if self.spool.ready.wait(0.1):
                return True
            if self.proc.poll() is not None:
                self.spool.join(2)
                break
        return self.spool.ready.is_set()

    # ------------------------------------------------------------------ following the job's libraries
    def covers(self, lib) -> bool:
        """Whether the running program probes that library (``procs.MappedLib``): the same file
        by device and inode, or by its resolved path (a --nccl-lib on a file system whose
        device /proc/PID/maps names otherwise)."""
        if lib.key in self.covered:
            return True
        try:
            return os.path.realpath(lib.host_path) in set(self.covered.values())
        except OSError:
            return False

    def check_orphans(self, now: float) -> None:
        """Traced libraries that no followed, live process maps any more: detached (a restart
        without them) once that has lasted DETACH_AFTER_S, so the next job's tracer does not
        keep uprobes on a file nobody runs."""
        live = {lib.key for info in list(self.s.procs.values()) if os.path.isdir(f"/proc/{info.pid}")
                for lib in info.nccl_libs}
        if not self.covered or set(self.covered) - self.pinned <= live:
            self.orphaned_since = None
            return
        self.orphaned_since = self.orphaned_since or now
        if now - self.orphaned_since >= DETACH_AFTER_S and not self.retarget_why:
            gone = sorted(p for k, p in self.covered.items() if k not in live and k not in self.pinned)
            self.retarget_why = f"no process maps {', '.join(gone)} any more"
            self.retarget_at = now

    def retarget(self, why: str) -> None:
        """Restart the tracer on the libraries the followed processes map now. Ring mode: the
        ring is printed first (its records would go with the program). The monitor reading the
        spool keeps the call state it read; the spool and the record go on."""
        s = self.s
        t0 = time.time_ns()
        before = sorted(self.covered.values())
        if self.spool is not None and (s.records.get("tracer") or {}).get("ring_slots") and self.alive():
            dumps = self.spool.ring_dumps
            program.trigger_dump()
            deadline = time.monotonic() + RING_DUMP_WAIT_S
            while self.spool.ring_dumps == dumps and time.monotonic() < deadline and self.alive():
                time.sleep(0.05)
        self.last_restart = time.monotonic()
        overlap = libs.overlap_restart(self, t0)
        if overlap is None:           # the old program stopped first (capture, not the watcher)
            self.halt()
            self.start_tracer(restart=True)
        after = sorted(self.covered.values())
        self.restarts = self.restarts[-49:] + [{"at_ns": t0, "why": why, "libraries": after,
                                                 "stopped_ns": t0, "started_ns": time.time_ns(),
                                                 **(overlap or {})}]
        self.libs.restarted(self)
        s.record("tracer", restarts=list(self.restarts))
        s.log(f"tracer restarted ({why}): tracing {len(after)} NCCL librar{'y' if len(after) == 1 else 'ies'}"
              + (f" (was {len(before)})" if before != after else ""))

    def halt(self) -> None:
        """Stop the running bpftrace for a restart: SIGINT, its END's last records spooled (bounded),
        the spool's reader at the end of that program's output."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            children.kill_group(proc, signal.SIGINT)
            deadline = time.monotonic() + TRACER_STOP_S + 0.5 * (self.spool.attached_probes or 50)
            while time.monotonic() < deadline and proc.poll() is None and not self.spool.ended.is_set():
                time.sleep(0.05)
        children.stop(proc, signal.SIGINT, grace_s=10)
        self.spool.join(timeout=15)
        self.stderr_fh.close()
        self.proc = None

    def stop_tracer(self) -> None:
        s = self.s
        if self.proc is None:
            return
        proc = self.proc
        alive = proc.poll() is None
        late = False
        if alive and "stop" in s.records["tracer"].get("blocks", []):
            # the stop probe: recording ends now, the last records and open calls come out
            program.trigger_stop()
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
        self.stderr_fh.close()
        err = (s.staging / "bpf/program.stderr.txt").read_bytes()
        bd.truncate_file(s.staging / "bpf/program.stderr.txt", LOG_CAP)
        flushed = self.spool.stopped.is_set()   # the stop probe printed every record before SIGINT
        final = flushed or self.spool.ended.is_set()
        ok = self.spool.ready.is_set() and alive and final
        reason = None
        if not self.spool.ready.is_set():
            reason = "bpftrace did not start: " + tail(err, 600)
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
        if self.problems:
            ok, reason = False, "; ".join(([reason] if reason else []) + self.problems)
        s.record("tracer", status="ok" if ok else "failed", reason=reason, rc=rc, stderr_tail=tail(err),
                 ended_ns=time.time_ns())

    # ------------------------------------------------------------------ off-CPU samples and events.jsonl
    def start_offcpu(self) -> None:
        s = self.s
        key = "offcpu"
        t0 = time.time_ns()
        if not s.o.bpf:
            s.record(key, status="skipped", reason="--no-bpf", started_ns=t0, ended_ns=t0)
            return
        self.offcpu = OffCpuSampler(s.raw_dir / "offcpu.jsonl", s.budget.tracer // 8, ring=s.policy.ring)
        s.record(key, status="running", command="stallscope:offcpu(/proc/PID/task/TID/schedstat every "
                 f"{s.o.offcpu_every_s:g}s)", started_ns=t0, files=["bpf/events.jsonl"])

    def sample_offcpu(self, final: bool = False) -> None:
        s = self.s
        if self.offcpu is None:
            return
        pids = [p for p in s.procs if os.path.isdir(f"/proc/{p}")]
        try:
            if self.offcpu.sample(pids, final=final):
                t = time.time_ns()     # what the samples cover: the first and the last one kept
                self.offcpu_span = [self.offcpu_span[0] if self.offcpu_span else t, t]
        except OSError as e:
            s.notes.append(f"off-CPU sample failed: {e}")

    def build_events(self) -> None:
        """bpf/events.jsonl from the spooled tracer lines and the off-CPU samples."""
        s = self.s
        if self.offcpu is None and self.spool is None:
            return
        self.sample_offcpu(final=True)
        out = s.staging / "bpf" / "events.jsonl"
        extra = [s.raw_dir / "offcpu.jsonl"] if self.offcpu is not None else []
        try:
            summ = events.postprocess(s.raw_dir if self.spool is not None else None, out, s.budget.tracer,
                                             extra=extra, call_returns=s.o.call_returns, spool=self.spool)
        except Exception as e:  # noqa: BLE001 - keep the raw lines in the bundle instead
            s.record("tracer", status="failed", reason=f"building bpf/events.jsonl failed: "
                     f"{type(e).__name__}: {e}; the raw tracer output is kept in bpf/raw/")
            return
        shutil.rmtree(s.raw_dir, ignore_errors=True)
        if self.offcpu is not None:
            rec = s.records["offcpu"]
            reason = None
            if self.offcpu.skipped:
                reason = f"{self.offcpu.skipped} periodic samples left out: byte share used"
            s.record("offcpu", status="ok" if rec["status"] == "running" else rec["status"], reason=reason,
                     rc=0, ended_ns=time.time_ns(), samples=self.offcpu.samples,
                     events=summ["by_type"].get("offcpu", 0), covered_ns=self.offcpu_span)
        if self.spool is not None:
            rec = s.records["tracer"]
            reasons = [rec["reason"]] if rec.get("reason") else []
            if summ["dropped_for_budget"]:
                reasons.append(f"{summ['dropped_for_budget']} oldest hot-path events dropped: tracer byte share used")
            if summ["lost_events"]:
                reasons.append(f"bpftrace lost {summ['lost_events']} events")
            s.record("tracer", reason="; ".join(reasons) or None, summary=summ,
                     tracer_messages=summ.pop("messages", []),
                     covered_ns=utc_span(s.clock + [clock_sample()], summ.get("span_monotonic_ns")))

