"""``run_capture``: one host's bundle, from discovery to the tar.gz.

:class:`Capture` is the orchestrator of a table of collectors (``capture.collectors``): it
finds the job's processes (``capture.jobs``), starts every collector, runs the capture loop
until ``--duration`` or SIGINT/SIGTERM (each tick: clock samples, the staged manifest, a
rescan for new processes and interfaces, every collector's ``sample``), then stops and
finishes the collectors, and writes the manifest and the tar.gz within the byte budget
(``capture.staging``). The watcher (``capture.watch``) runs the same orchestrator with a ring
policy and its own table, and cuts bundles from it.

Everything is staged in a hidden folder next to the bundle (``capture.staging``); a capture
that is killed leaves it behind for ``recover_orphans`` (the next capture into the same folder,
or ``stallscope capture --recover DIR``).
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from . import __version__
from . import bundle_files as bd
from . import children
from . import manifest as schema
from .collectors import BUNDLE, Collector
from .options import CaptureFailed, CaptureOptions, CaptureResult, CaptureUsageError
from .policy import BundlePolicy
from .session import Session, clock_sample
from .staging import (DISK_FULL, STAGED_MANIFEST, find_orphans, fit_budget, lock_staging, recover_orphans,
                      trim)
from .tracer import program

__all__ = ["Capture", "CaptureFailed", "CaptureOptions", "CaptureResult", "CaptureUsageError", "run_capture"]


class Capture:
    """One capture: a :class:`Session`, the collectors of ``table`` made from it, and their
    lifecycle. ``hooks`` (the watcher) may define ``tick(now)``, called every loop tick after
    the collectors sampled, and ``status(force)``, which replaces the progress line."""

    def __init__(self, opts: CaptureOptions, stderr=None, policy: BundlePolicy | None = None,
                 table: tuple[type[Collector], ...] = BUNDLE, hooks=None):
        self.s = Session(opts, stderr=stderr, policy=policy)
        self.o = opts
        self.table: list[Collector] = [cls(self.s) for cls in table]
        self.hooks = hooks
        self.last_progress = 0.0
        self.guardian: children.Guardian | None = None
        self.lock_fh = None
        self.orphans: list[Path] = []
        self.out_path: Path | None = None
        self.arcroot = ""

    def collector(self, name: str) -> Collector | None:
        """The collector of that registry name in this capture's table."""
        return next((c for c in self.table if c.name == name), None)

    def each(self, step: str, *args, reverse: bool = False) -> None:
        """Call ``step`` on every collector, in table order (``reverse``: the other way). A
        collector that raises is recorded as failed (its record ``<name>``, stderr) and the
        others go on: one broken collector must not cost the bundle."""
        for c in (reversed(self.table) if reverse else self.table):
            try:
                getattr(c, step)(*args)
            except Exception as e:  # noqa: BLE001 - see above
                self.s.record(c.name, status="failed", reason=f"{step}: {type(e).__name__}: {e}")
                self.s.log(f"collector {c.name} failed in {step}: {type(e).__name__}: {e}")

    # ------------------------------------------------------------------ main
    def on_signal(self, signum, frame) -> None:
        if self.s.stop_evt.is_set():
            print("\nstallscope capture: finishing the bundle, please wait", file=self.s.err, flush=True)
        self.s.stop_evt.set()

    def check_targets(self) -> None:
        """--pid and --nccl-lib name what exists (CaptureUsageError, exit 2, otherwise)."""
        for p in self.o.pids:
            if not os.path.isdir(f"/proc/{p}"):
                raise CaptureUsageError(f"--pid {p}: no such process")
        for lib in self.o.nccl_libs:
            if not os.path.isfile(lib):
                raise CaptureUsageError(f"--nccl-lib {lib}: no such file")

    def run(self) -> CaptureResult:
        o, s = self.o, self.s
        if o.duration_s <= 0:
            raise CaptureUsageError("--duration must be positive")
        if o.max_bytes < bd.MIN_BUDGET:
            raise CaptureUsageError(f"--max-bytes must be at least {bd.MIN_BUDGET // 1024}k")
        self.check_targets()
        try:
            self.out_path = bd.choose_output(o.output, s.host, s.started_ns)
        except (FileExistsError, FileNotFoundError) as e:
            raise CaptureUsageError(str(e)) from None
        self.arcroot = self.out_path.name[: -len(".tar.gz")] if self.out_path.name.endswith(".tar.gz") \
            else self.out_path.stem
        s.staging = self.out_path.parent / f".{self.arcroot}.staging-{os.getpid()}"
        s.staging.mkdir(parents=True)
        self.lock_fh = lock_staging(s.staging)
        s.budget = bd.Budget.plan(o.max_bytes, pcap=o.pcap, tracer=o.bpf)
        self.yield_cpu()
        if o.recover:
            self.orphans = find_orphans(self.out_path.parent)
            if self.orphans:
                s.log(f"{len(self.orphans)} staging folder(s) of killed captures found here "
                      f"({', '.join(p.name for p in self.orphans)}): turned into partial bundles at the end")
        old = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        committed = False
        try:
            self.start_guardian()
            self.write_staged_manifest()
            self.capture()
            try:
                result = self.finalize()
            except OSError as e:
                if e.errno not in DISK_FULL:
                    raise
                Path(str(self.out_path) + ".partial").unlink(missing_ok=True)
                raise CaptureFailed(f"cannot write the bundle into {self.out_path.parent}: {e.strerror}; what was "
                                    f"captured is kept in {s.staging} (free some space, then 'stallscope capture "
                                    f"--recover {self.out_path.parent}')") from None
            committed = True
            return result
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)
            self.release()
            if committed:
                shutil.rmtree(s.staging, ignore_errors=True)
            else:
                s.log(f"the bundle was not written; what was captured is kept in {s.staging} "
                      f"('stallscope capture --recover {self.out_path.parent}' makes a partial bundle of it)")
            if self.lock_fh is not None:
                self.lock_fh.close()
            if committed and self.orphans:   # those found at the start; our own bundle is written
                recover_orphans(self.out_path.parent, log=s.log, candidates=self.orphans)

    def start_guardian(self, ring_marker: str | None = None, who: str = "capture") -> None:
        """The guardian process that stops the children should this one be killed (``ring_marker``:
        the watcher's, see ``children.Guardian``)."""
        try:
            self.guardian = children.Guardian(self.s.staging, ring_marker=ring_marker)
            children.set_guardian(self.guardian)
        except OSError as e:
            self.s.notes.append(f"no guardian process ({e}): children other than the direct ones may "
                                f"outlive a killed {who}")

    def release(self) -> None:
        """The pool and the guardian, at the end whatever happened."""
        self.s.pool.shutdown(wait=False, cancel_futures=True)
        children.set_guardian(None)
        if self.guardian is not None:
            self.guardian.close()

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
            self.s.notes.append("capture and its children ran as SCHED_BATCH (no wake-up preemption of the job)")
        except (OSError, AttributeError) as e:
            self.s.notes.append(f"SCHED_BATCH not set: {e}")

    # ------------------------------------------------------------------ the manifest
    def manifest_dict(self, ended_ns: int | None, processes: list[dict], partial: bool) -> dict:
        """The bundle's ``manifest.json``: the ``always`` keys of ``capture.manifest.TOP``
        (docs/DESIGN.md, "Bundle layout"); ``files`` is filled when the archive is written."""
        s, o = self.s, self.o
        return schema.TOP.make(
            schema_version=schema.SCHEMA_VERSION,
            tool="stallscope", tool_version=__version__,
            host=s.host, hostname=os.uname().nodename, boot_id=bd.boot_id(),
            kernel=os.uname().release, machine=os.uname().machine,
            timezone=bd.timezone_facts(),
            started_ns=s.started_ns, ended_ns=ended_ns,
            partial=partial,
            clock="bpf nsecs and *_ns of events are CLOCK_MONOTONIC; convert with clock_samples",
            clock_samples=list(s.clock),
            options=schema.OPTIONS.make(
                duration_s=o.duration_s if o.duration_s != float("inf") else None,
                pids=o.pids, ifaces=o.ifaces, max_bytes=o.max_bytes, nccl_libs=o.nccl_libs,
                nccl_tests=o.nccl_tests, attach=o.attach, bpf=o.bpf, pcap=o.pcap, snaplen=o.snaplen,
                call_returns=o.call_returns, stacks=o.stacks, stacks_grace_s=o.stacks_grace_s,
                stacks_timeout_s=o.stacks_timeout_s, fr_dump_wait_s=o.fr_dump_wait_s),
            root=s.is_root,
            budget=s.budget.to_manifest(),
            collectors={k: dict(v) for k, v in sorted(s.records.items())},
            netns=s.jobs.manifest_netns(),
            processes=processes,
            notes=list(s.notes),
            files=[],
        )

    def write_staged_manifest(self) -> None:
        """The manifest so far, kept in the staging folder while capturing: what a recovery
        of this folder starts from if capture is killed."""
        s = self.s
        try:
            with s.lock:
                m = self.manifest_dict(None, [info.to_manifest() for _, info in sorted(s.procs.items())],
                                       partial=True)
            m["capture"] = schema.STAGED.make(pid=os.getpid(), bundle=str(self.out_path), arcroot=self.arcroot,
                                              staged_ns=time.time_ns())
            tmp = s.staging / ".manifest.staged.tmp"
            tmp.write_bytes(bd.dumps_manifest(m))
            os.replace(tmp, s.staging / STAGED_MANIFEST)
        except (OSError, RuntimeError) as e:
            s.notes.append(f"staged manifest not written: {e}")

    # ------------------------------------------------------------------ the capture loop
    def capture(self) -> None:
        """Discover, start every collector, and loop until the duration ends or a signal."""
        o, s = self.o, self.s
        s.clock.append(clock_sample())
        s.jobs.own()
        s.jobs.discover(program.NCCL_SYMBOLS, by_env=s.policy.jobs_by_env)
        if o.pids:
            missing = [p for p in o.pids if p not in s.procs]
            if missing:
                s.notes.append(f"--pid {missing}: not running at start")
        s.jobs.choose_initial_ifaces()
        s.log(f"{len(s.procs)} NCCL process(es) found"
              + (f" (pids {', '.join(map(str, sorted(s.procs)))})" if s.procs else
                 "; new ones are picked up while capturing"))
        self.each("start")
        if self.hooks is not None:
            self.hooks.started()
        summary = [t for c in self.table if (t := c.ready())]
        s.log("capturing: " + "; ".join(summary) + f"; {o.duration_s:g}s or Ctrl-C")
        rescan_s = o.rescan_s or (0.5 if o.pids else 2.0)
        t0 = time.monotonic()
        last_clock = last_scan = t0
        self.write_staged_manifest()
        while not s.stop_evt.is_set():
            now = time.monotonic()
            if now - t0 >= o.duration_s:
                break
            if now - last_clock >= o.clock_every_s:
                s.clock.append(clock_sample())
                last_clock = now
                self.write_staged_manifest()
            if now - last_scan >= rescan_s:
                last_scan = now
                self.rescan()
            self.each("sample", now)
            self.progress(t0)
            if self.hooks is not None:
                self.hooks.tick(now)
            # a sleep, not stop_evt.wait: on_signal sets stop_evt in this thread, and Event.set from a
            # signal handler deadlocks when it interrupts this thread inside that Event's own wait
            time.sleep(min(0.2, max(0.0, o.duration_s - (time.monotonic() - t0))))
        self.progress(t0, force=True)
        if o.progress != "off" and hasattr(s.err, "isatty") and s.err.isatty():
            print(file=s.err)
        s.log("stopping collectors")

    def rescan(self) -> None:
        """New processes of the job (and their namespaces and interfaces), and interfaces newly
        in use by those already followed, handed to every collector."""
        s = self.s
        fresh = s.jobs.discover(program.NCCL_SYMBOLS, by_env=s.policy.jobs_by_env)
        changed = [i for i in s.jobs.refresh_libraries(program.NCCL_SYMBOLS) if i not in fresh]
        if fresh:
            s.log(f"new NCCL process(es): {', '.join(str(i.pid) for i in fresh)}")
            packets = self.collector("tcpdump")
            new_ns, new_ifaces = s.jobs.adopt(fresh, packets.has_tap if packets else (lambda inode: False))
            self.each("adopt", fresh, new_ns, new_ifaces)
        if changed:
            self.each("adopt", changed, [], [])
        later = s.jobs.refresh_ifaces()
        if later:
            s.log("interfaces now in use: " + ", ".join(f"{ns.label}/{i}" for ns, i in later))
            self.each("adopt", [], [], later)

    def progress(self, t_capture0: float, force: bool = False) -> None:
        """The progress line: on a terminal rewritten every second, else a line every 5 s."""
        if self.hooks is not None and hasattr(self.hooks, "status"):
            self.hooks.status(force)
            return
        s, mode = self.s, self.o.progress
        if mode == "off":
            return
        tty = mode == "tty" or (mode == "auto" and hasattr(s.err, "isatty") and s.err.isatty())
        now = time.monotonic()
        if not force and now - self.last_progress < (1.0 if tty else 5.0):
            return
        self.last_progress = now
        counts = self.counts()
        line = (f"{now - t_capture0:6.1f}s/{self.o.duration_s:g}s  events {counts.get('events', 0)}  packets "
                f"{counts.get('packets', 0)}  bytes {self.staged_bytes() / 1048576:.1f}/"
                f"{self.o.max_bytes / 1048576:.0f} MiB  processes {len(s.procs)}")
        if tty:
            print(f"\rstallscope capture: {line}\033[K", end="", file=s.err, flush=True)
        else:
            print(f"stallscope capture: {line}", file=s.err, flush=True)

    def counts(self) -> dict:
        """The collectors' counters (``events``, ``packets`` ...), merged."""
        out: dict = {}
        for c in self.table:
            out.update(c.status())
        return out

    def staged_bytes(self) -> int:
        total = 0
        for p in self.s.staging.rglob("*"):
            try:
                if p.is_file():
                    total += p.stat().st_size
            except OSError:
                pass
        return total

    # ------------------------------------------------------------------ the end
    def finalize(self) -> CaptureResult:
        """Stop (reverse table order) and finish (table order) every collector, then the
        manifest and the archive within --max-bytes."""
        s = self.s
        self.each("stop", reverse=True)
        self.each("finish")
        s.wait_pool(timeout=120)
        s.clock.append(clock_sample())
        ended_ns = time.time_ns()
        for rec in s.records.values():
            if rec["status"] == "running":
                rec["status"] = "ok"
        manifest = self.manifest_dict(ended_ns, s.jobs.process_facts(s.staging), partial=False)
        disk_full = False
        try:
            manifest = fit_budget(s.staging, self.out_path, self.arcroot, manifest, self.o.max_bytes)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            manifest, disk_full = self.fit_disk(manifest, e), True
        failed = sorted(k for k, r in s.records.items() if r["status"] == "failed")
        code = 3 if failed or disk_full else 0
        if disk_full:
            s.log("the output file system was full: the bundle holds what fitted (its manifest's notes say "
                  "what was cut)")
        if failed:
            s.log(f"finished with failed collectors: {', '.join(failed)}")
        skipped = sorted(k.split(":")[0].split("@")[0] for k, r in s.records.items()
                         if r["status"] == "skipped" and r.get("reason") == "needs root")
        if skipped:
            s.log(f"not run without root: {', '.join(sorted(set(skipped)))} (the bundle has the rest)")
        s.log(f"bundle {self.out_path} ({self.out_path.stat().st_size} bytes)")
        return CaptureResult(path=self.out_path, exit_code=code, manifest=manifest)

    def fit_disk(self, manifest: dict, err: OSError) -> dict:
        """The output's file system filled up: cut the staged files (they share it with the
        archive) to what leaves room for their archive, then write a bundle that says so.
        Raises the OSError when even that does not fit (run() then keeps the staging folder)."""
        staging = self.s.staging
        partial = Path(str(self.out_path) + ".partial")
        for attempt in range(4):
            partial.unlink(missing_ok=True)
            (staging / "manifest.json").unlink(missing_ok=True)
            free = shutil.disk_usage(staging).free
            staged = sum(p.stat().st_size for p in bd.list_files(staging))
            # what is cut is freed on the same file system: staged + archive <= free + staged
            keep = max(0, (free + staged) // 2 - (256 << 10) * (attempt + 1))
            if keep < staged:
                trim(staging, staged - keep, manifest)
            manifest.setdefault("notes", []).append(
                f"the output file system was full ({err.strerror}): the staged files were cut to about {keep} bytes "
                "(cut and dropped files are listed above) to write this bundle")
            manifest.update(schema.TOP.make(
                partial=True, partial_reason=f"the output file system was full ({err.strerror}); see notes"))
            try:
                return fit_budget(staging, self.out_path, self.arcroot, manifest, self.o.max_bytes)
            except OSError as e:
                if e.errno not in DISK_FULL:
                    raise
                err = e
        raise err


def run_capture(opts: CaptureOptions, stderr=None) -> CaptureResult:
    """Capture one host's bundle; raises CaptureUsageError for bad options."""
    return Capture(opts, stderr=stderr).run()
