"""``stallscope capture --watch``: the black box. Runs next to the jobs of a host for days,
keeps the last minutes of every continuous collector in bounded rings, and writes a normal
bundle when a hang starts.

What runs is the capture orchestrator (:class:`capture.runner.Capture`) with the ring policy
(``capture.policy.RingPolicy``: the tracer's spool drops its segments by age, tcpdump rotates
through ``-C/-W`` files, the ss series and off-CPU samples keep two files each) and the ring
collector table (``capture.collectors.RING``), in a hidden staging folder in the output folder,
with no end. The :class:`Watcher` is its hooks: each 0.2 s tick of the loop it checks its
triggers:

- **hang**: ``capture.watch.monitors.RingMonitor`` reads the calls' state the tracer prints every second (its
  records stay in a ring in the kernel, printed at a trigger and at the cut: bpf/README.md,
  "Ring mode"; ``ProgressMonitor`` reads every record where the ring cannot be used); a process
  with a collective in flight (an NCCL collective entered since its last returned host wait,
  and a call of it still open: the collective or the synchronize after it) and nothing
  returned for ``--hang-after`` (default: the larger of 10 s and 10x the slowest collective
  completed in the last 5 minutes on this host);
- **log**: ``capture.watch.monitors.LogWatch`` tails the job's NCCL_DEBUG_FILE logs and stdout/stderr files for
  ``NCCL WARN`` lines and PyTorch watchdog timeouts; the trigger names the processes whose
  output those files are (the incident's job);
- **on demand**: SIGUSR1, ``stallscope capture --trigger`` or the trigger file
  (``--trigger-file``, default ``<output>/stallscope.trigger``); the incident's job is the one
  running then, when only one is.

The packet ring runs on trouble (``--pcap-ring on-trouble``, the default;
``capture.collectors.tcpdump_ring``).

An incident starts at its first trigger, and its bundle is written in two stages
(``capture.watch.incident``): at once, the rings' last ``--before`` and the state of the job then
(the snapshots of a capture's end, native stacks for a hang, Flight Recorder dumps through
their pipes, the logs), a complete bundle with ``"trigger"`` and ``"watch"`` in its manifest;
``--after`` later, the same archive completed with what followed (every file of the first
kept) and, for a hang trigger, whether the stall resolved (``watch.stall``: the stuck
processes made progress again, and when, or were still stuck at the end of the window). Its
name carries the trigger's time, so the bundles of one incident from every host sort together. Triggers
during an incident, and for ``--cooldown`` after it, are folded into it (one bundle per
incident); a hang of the same processes triggers again only after they made progress.

SIGTERM/SIGINT end the watcher: an incident already triggered is written with what the
rings hold, every child stops, the rings are removed. A SIGKILLed watcher's guardian stops
the children and removes the rings as well, unless an incident was pending: then they stay
as a capture's staging folder does (``--recover`` makes a partial bundle of them).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
from pathlib import Path

from .. import bundle_files as bd
from .. import procs
from ..collectors import RING
from ..options import CaptureResult, CaptureUsageError
from ..policy import RingPolicy
from ..runner import Capture
from ..staging import lock_staging
from . import stall
from .incident import IncidentWriter
from .init_hang import InitWatch
from .monitors import LogWatch, ProgressMonitor, QuietJobs, RingMonitor
from .triggers import PENDING, TRIGGER_NAME, Trigger, registry_dir

HANG_AFTER_FLOOR_S = 10.0
HANG_AFTER_FACTOR = 10.0
LOG_PATHS_EVERY_S = 10.0             # the job's log files looked for again this often (and when its processes change)
RING_SLACK_S = 30.0                  # the rings keep --before + --after + this


# --------------------------------------------------------------------------- the watcher
class Watcher:
    """The black box: a :class:`Capture` with the ring policy and table, and the triggers that
    cut a bundle from its rings; see the module's text. It is the capture's hooks
    (``started``, ``tick``, ``status``)."""

    def __init__(self, opts, stderr=None):
        self.o = o = opts
        policy = RingPolicy(age_s=o.before_s + o.after_s + RING_SLACK_S)
        self.cap = Capture(opts, stderr=stderr, policy=policy, table=RING, hooks=self)
        self.s = self.cap.s
        self.tracing = self.cap.collector("tracer")
        self.packets = self.cap.collector("tcpdump")          # a TcpdumpRing
        self.monitor: ProgressMonitor | None = None
        self.stuck_kw: dict = {}
        self.logwatch = LogWatch()
        self.quiet = QuietJobs()                    # the tracer-free hang trigger
        self.inits = InitWatch()                    # ranks stuck in a communicator's init
        self.quiet_cleared: dict[int, int] = {}     # pid -> its last move when its quiet hang was reported
        self.ss = self.cap.collector("ss-series")
        self.logs_found: tuple[float, frozenset, list] | None = None    # (when, pids, log_paths())
        self.incident: dict | None = None           # the open incident: triggers, due time
        self.last_incident_end = -1e18              # monotonic s
        self.last_incident_pids: list[int] = []     # the last incident's first trigger's processes
        self.queued: list[Trigger] = []             # another job's triggers during an incident: its own, next
        self.cleared: dict[int, int] = {}           # pid -> last_return when its hang was reported
        self.bundles: list[Path] = []
        self.usr1 = False
        self.next_check = 0.0
        self.next_logs = 0.0
        self.next_prune = 0.0
        self.last_status = time.monotonic()
        self.dead_since: dict[int, float] = {}
        self.registry: Path | None = None
        self.folder: Path | None = None
        self.trigger_path: Path | None = None
        self.incident_window0 = 0

    # ---------------------------------------------------------------- lifecycle
    def run(self) -> CaptureResult:
        o, s, cap = self.o, self.s, self.cap
        folder = Path(o.output or ".")
        if o.output and (o.output.endswith(".tar.gz") or o.output.endswith(".tgz")):
            raise CaptureUsageError("--watch writes one bundle per incident: -o takes a folder")
        if not folder.is_dir():
            raise CaptureUsageError(f"output folder {folder} does not exist")
        cap.check_targets()
        if o.ring_bytes < 8 * bd.MIN_BUDGET:
            raise CaptureUsageError(f"--ring-bytes must be at least {8 * bd.MIN_BUDGET // 1024}k")
        self.folder = folder.resolve()
        self.trigger_path = Path(o.trigger_file) if o.trigger_file else self.folder / TRIGGER_NAME
        cap.arcroot = f"stallscope-{s.host}-{bd.utc_stamp(s.started_ns)}-watch"
        cap.out_path = self.folder / f"{cap.arcroot}.tar.gz"     # never written: the rings' name
        s.staging = self.folder / f".{cap.arcroot}.staging-{os.getpid()}"
        s.staging.mkdir(parents=True)
        cap.lock_fh = lock_staging(s.staging)
        s.budget = bd.Budget.plan(o.ring_bytes, pcap=o.pcap, tracer=o.bpf)
        cap.yield_cpu()
        old = {sig: signal.signal(sig, cap.on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        old[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self.on_usr1)
        try:
            cap.start_guardian(ring_marker=PENDING, who="watcher")
            self.register()
            s.log(f"watching: rings in {s.staging.name} (at most {o.ring_bytes >> 20} MiB), bundles into "
                  f"{self.folder}; packets: "
                  f"{'from TCP trouble on' if self.packets.on_trouble else 'always' if o.pcap else 'off'}; "
                  f"hang after {self.hang_after_text()}, {o.before_s:g}s before and "
                  f"{o.after_s:g}s after a trigger; on demand: stallscope capture --trigger, SIGUSR1 "
                  f"(pid {os.getpid()}) or touch {self.trigger_path}")
            cap.capture()
            s.log("stopping the watcher")
            if self.incident is not None:        # triggered, not yet written: write it with what is there
                self.cut()
        finally:
            self.stop_all()
            for sig, h in old.items():
                signal.signal(sig, h)
            cap.release()
            if not (s.staging / PENDING).exists():
                shutil.rmtree(s.staging, ignore_errors=True)
            if cap.lock_fh is not None:
                cap.lock_fh.close()
            if self.registry is not None:
                self.registry.unlink(missing_ok=True)
        code = 3 if any(b is None for b in self.bundles) else 0
        return CaptureResult(path=self.folder, exit_code=code, manifest={"bundles": [str(b) for b in self.bundles]})

    def register(self) -> None:
        s = self.s
        try:
            d = registry_dir()
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.registry = d / f"watch-{os.getpid()}.json"
            self.registry.write_text(json.dumps({"pid": os.getpid(), "output": str(self.folder),
                                                 "trigger_file": str(self.trigger_path),
                                                 "started_ns": s.started_ns}))
        except OSError as e:
            self.registry = None
            s.notes.append(f"not registered for --trigger ({e}): SIGUSR1 or the trigger file still work")

    def on_usr1(self, signum, frame) -> None:
        self.usr1 = True

    def stop_all(self) -> None:
        """The children, as a capture's end stops them (no bundle of the rings themselves)."""
        self.cap.collector("native-stacks").cancel.set()
        self.cap.collector("nccl-tests").stop()
        self.tracing.stop_quietly()
        self.packets.stop_quietly()

    def started(self) -> None:
        """Every collector started: the hang trigger reads the tracer's records (its ring where
        the tracer keeps one)."""
        s = self.s
        if self.tracing.proc is None:
            return
        ring = (s.records.get("tracer") or {}).get("ring_slots")
        self.monitor = (RingMonitor if ring else ProgressMonitor)(s.raw_dir, call_returns=self.o.call_returns)
        if ring and not self.o.call_returns:      # a launched collective: is the thread still inside it?
            self.stuck_kw = {"inside": procs.inside_call}
        if not ring:
            s.notes.append("the tracer prints every record (no libc to attach its ring dump to): the watch "
                           "costs the job more")

    def status(self, force: bool = False) -> None:
        """A status line every --status-every s (a watcher runs for days: not every 5 s)."""
        s, now = self.s, time.monotonic()
        if self.o.progress == "off" or (not force and now - self.last_status < self.o.status_every_s):
            return
        self.last_status = now
        counts = self.cap.counts()
        s.log(f"watching {len(s.procs)} NCCL process(es); tracer lines {counts.get('events', 0)}"
              f"; packets {counts.get('packets', 0)}"
              + ("" if not self.packets.on_trouble else f" (packet ring {'on' if self.packets.armed else 'off'})")
              + f"; rings {self.cap.staged_bytes() >> 20} MiB; bundles written "
              f"{len([b for b in self.bundles if b])}")

    # ---------------------------------------------------------------- triggers
    def hang_after_ns(self, now_ns: int) -> int:
        if self.o.hang_after_s:
            return int(self.o.hang_after_s * 1e9)
        slowest = self.monitor.slowest_ns(now_ns) if self.monitor else 0
        return int(max(HANG_AFTER_FLOOR_S * 1e9, HANG_AFTER_FACTOR * slowest))

    def hang_after_text(self) -> str:
        if self.o.hang_after_s:
            return f"{self.o.hang_after_s:g}s"
        return f"max({HANG_AFTER_FLOOR_S:g}s, {HANG_AFTER_FACTOR:g}x the slowest collective of the last 5 min)"

    def tick(self, now: float) -> None:
        if now >= self.next_check:
            self.next_check = now + 0.25
            self.check_hang()
            self.check_on_demand()
        if now >= self.next_logs:
            self.next_logs = now + 2.0
            self.check_logs()
            self.check_quiet()
            self.inits.check(self, self.o.hang_after_s or HANG_AFTER_FLOOR_S)
        if now >= self.next_prune:
            self.next_prune = now + 10.0
            self.prune()
        inc = self.incident
        if inc is not None and "staged" not in inc:
            inc["writer"].write_first(inc)            # stage one: the bundle of the trigger, at once
        if inc is not None:
            self.follow_stall(inc)
        if inc is not None and time.monotonic() >= inc["due"]:
            self.cut()

    def rank_of(self, pid: int) -> int | None:
        info = self.s.procs.get(pid)
        return info.rank_facts().get("rank") if info else None

    def stall_of(self, trig: Trigger, stuck: list[dict] | None) -> dict | None:
        """A hang trigger's stall (``capture.watch.stall.stall_at``)."""
        return stall.stall_at(trig, stuck, self.monitor, self.rank_of)

    def follow_stall(self, inc: dict) -> None:
        """The open incident's stall followed (``capture.watch.stall.follow``)."""
        stall.follow(inc.get("stall"), self.monitor, self.quiet)

    def fire(self, trig: Trigger, stuck: list[dict] | None = None) -> None:
        s = self.s
        jobs = self.by_job(trig.pids)
        if len(jobs) > 1:       # one job per incident: a trigger naming several jobs' processes, one each
            for pids in jobs:
                self.fire(dataclasses.replace(trig, pids=pids), stuck)
            return
        self.packets.arm(f"{trig.kind} trigger")       # the packets of the --after window
        now = time.monotonic()
        if self.incident is not None:
            if self.other_job(trig.pids, self.incident["first"].pids):
                self.queued.append(trig)             # one job per incident: its own bundle after this one
                return
            self.incident["triggers"].append(trig)
            return
        if trig.kind != "on-demand" and now - self.last_incident_end < self.o.cooldown_s \
                and not self.other_job(trig.pids, self.last_incident_pids):
            s.notes.append(f"{bd.utc_stamp(trig.realtime_ns)}: {trig.kind} trigger within --cooldown of the "
                           f"last incident, not a new bundle: {trig.reason}")
            return
        self.incident = {"first": trig, "triggers": [trig], "due": now + self.o.after_s,
                         "stall": self.stall_of(trig, stuck), "writer": IncidentWriter(self)}
        try:
            (s.staging / PENDING).write_text(json.dumps(trig.to_manifest()))
        except OSError:
            pass
        s.log(f"TRIGGER ({trig.kind}): {trig.reason}; writing the bundle now, completed {self.o.after_s:g}s later")

    def check_hang(self) -> None:
        if self.monitor is None:
            return
        self.monitor.poll()
        self.packets.see_trouble(self.monitor.take_trouble(), self.incident is not None)
        gone = [p for p in set(self.monitor.last_return) | {v[0] for v in self.monitor.open.values()}
                if not os.path.isdir(f"/proc/{p}")]
        if gone:                 # a job that ended or was killed mid-collective is not a hang
            self.monitor.forget(gone)
        now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        after = self.hang_after_ns(now_ns)
        stuck = [st for st in self.monitor.stuck(now_ns, after, **self.stuck_kw)
                 if self.cleared.get(st["pid"], -1) != self.monitor.last_return.get(st["pid"], 0)]
        if not stuck:
            return
        for st in stuck:   # this hang is reported once: again only after the process made progress
            self.cleared[st["pid"]] = self.monitor.last_return.get(st["pid"], 0)
        pids = [st["pid"] for st in stuck]
        quiet = max(st["quiet_ns"] for st in stuck) / 1e9
        ranks = []
        for p in pids:
            info = self.s.procs.get(p)
            r = info.rank_facts().get("rank") if info else None
            ranks.append(f"pid {p}" + (f" (rank {r})" if r is not None else ""))
        self.fire(Trigger("hang", f"collective in flight with nothing returned for {quiet:.0f}s (hang after "
                          f"{after / 1e9:g}s) in {', '.join(ranks)}", time.time_ns(), now_ns, pids=pids,
                          source="tracer"), stuck=stuck)

    def untraced(self) -> set[int]:
        """The followed processes whose NCCL calls the tracer does not see: no tracer running,
        none of their NCCL libraries among those it covers (static, hidden, not yet attached), or
        no call of theirs seen since it covers them (a job that hung before the tracer attached:
        its threads make no call the tracer could see)."""
        s, tr, mon = self.s, self.tracing, self.monitor
        if not tr.alive():
            return set(s.procs)
        seen = (set(mon.last_coll) | set(mon.last_return) | {v[0] for v in mon.open.values()}) if mon else set()
        return {pid for pid, info in s.procs.items()
                if pid not in seen or not any(tr.covers(l) for l in info.nccl_libs)}

    def check_quiet(self) -> None:
        """The tracer-free hang trigger (``QuietJobs``) on the live processes the tracer does not
        cover. A process that ended is no hang: the followed ones are kept a while after they
        end, and the hang monitor forgets them at once, so they read as untraced with their last
        ss samples, data waiting (a job torn down after its hang's incident, make watch-align)."""
        pids = {p for p in self.untraced() if os.path.isdir(f"/proc/{p}")}
        if not pids or self.ss is None:
            return
        self.quiet.feed(self.ss.latest, pids)
        now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        after = int((self.o.hang_after_s or HANG_AFTER_FLOOR_S) * 1e9)
        stuck = [st for st in self.quiet.stuck(now_ns, after)
                 if st["pid"] in pids and self.quiet_cleared.get(st["pid"]) != st["last_move_ns"]]
        if not stuck:
            return
        for st in stuck:     # once: again only after its connections moved
            self.quiet_cleared[st["pid"]] = st["last_move_ns"]
        ranks = []
        for st in stuck:
            info = self.s.procs.get(st["pid"])
            r = info.rank_facts().get("rank") if info else None
            why = ", ".join(info.job_reasons) if info and info.job_reasons else "job"
            ranks.append(f"pid {st['pid']}" + (f" (rank {r})" if r is not None else "") + f" [{why}]")
        quiet = max(st["quiet_ns"] for st in stuck) / 1e9
        self.fire(Trigger("hang", f"no TCP progress for {quiet:.0f}s with data waiting on "
                          f"{sum(st['waiting'] for st in stuck)} connection(s) (hang after {after / 1e9:g}s; "
                          f"its NCCL calls are not traced) in {', '.join(ranks)}", time.time_ns(), now_ns,
                          pids=[st["pid"] for st in stuck], source="tracer-free (ss series)"), stuck=stuck)

    def log_paths(self) -> list[tuple[str, str]]:
        """The job's logs to tail, found again when its processes change or every
        LOG_PATHS_EVERY_S (a log file NCCL creates later); a glob per process every 2 s was a
        fifth of the watcher's CPU."""
        s = self.s
        now, pids = time.monotonic(), frozenset(s.procs)
        if self.logs_found is not None and self.logs_found[1] == pids and now - self.logs_found[0] < LOG_PATHS_EVERY_S:
            return self.logs_found[2]
        # --attach's files, NCCL_DEBUG_FILE and the processes' stdout/stderr files, each once
        paths = self.cap.collector("attachments").sources(dumps=False)[0]
        self.logs_found = (now, pids, paths)
        return paths

    def check_logs(self) -> None:
        s = self.s
        try:
            hits = self.logwatch.poll(self.log_paths())
        except Exception as e:  # noqa: BLE001 - a log we cannot read is no reason to stop watching
            s.notes.append(f"log watch: {type(e).__name__}: {e}")
            return
        if hits:
            path, what, line = hits[0]
            more = f" (+{len(hits) - 1} more)" if len(hits) > 1 else ""
            # the processes whose output the lines are: the incident's job (a log names no pid)
            owners = self.cap.collector("attachments").owners
            pids = sorted({owners[p] for p, _, _ in hits if p in owners})
            self.fire(Trigger("log", f"{what} in {path}: {line}{more}", time.time_ns(),
                              time.clock_gettime_ns(time.CLOCK_MONOTONIC), pids=pids, source=path))

    def check_on_demand(self) -> None:
        reason = None
        tp = self.trigger_path
        if tp is not None and tp.exists():
            try:
                reason = tp.read_text(errors="replace").strip()[:300] or f"trigger file {tp}"
                tp.unlink()
            except OSError:
                reason = f"trigger file {tp}"
        if self.usr1:
            self.usr1 = False
            reason = reason or "SIGUSR1"
        if reason:
            self.fire(Trigger("on-demand", reason, time.time_ns(), time.clock_gettime_ns(time.CLOCK_MONOTONIC),
                              pids=self.live_job(), source="trigger"))

    def live_job(self) -> list[int]:
        """The followed processes still running, when they are all of one job; [] otherwise. An
        operator's trigger names no process: on a host running one job it is about that job, and
        the processes of jobs that ended (kept a while after) and their records stay out."""
        live = sorted(p for p in self.s.procs if os.path.isdir(f"/proc/{p}"))
        return live if len({self.s.jobs.job_id(p) for p in live} - {None}) == 1 else []

    def prune(self) -> None:
        """Jobs come and go: processes gone longer than the rings keep are forgotten, the files
        of tcpdumps whose interface went with them removed (their slot serves the next job)."""
        s = self.s
        now = time.monotonic()
        keep_s = s.policy.age_s
        gone = []
        for pid in list(s.procs):
            if os.path.isdir(f"/proc/{pid}"):
                self.dead_since.pop(pid, None)
                continue
            t = self.dead_since.setdefault(pid, now)
            if now - t > keep_s:
                gone.append(pid)
        for pid in gone:
            s.jobs.forget(pid)
            self.dead_since.pop(pid, None)
            self.quiet_cleared.pop(pid, None)
        self.quiet.forget(gone)
        if gone and self.monitor is not None:
            self.monitor.forget(gone)
        self.packets.prune(keep_s)

    # ---------------------------------------------------------------- the incident's bundle
    def cut(self) -> None:
        """Complete the open incident's bundle (``capture.watch.incident``; its first stage first, if
        the watcher stops before it was written)."""
        inc, self.incident = self.incident, None
        self.last_incident_pids = list(inc["first"].pids or [])
        if "staged" not in inc:
            inc["writer"].write_first(inc)
        self.follow_stall(inc)
        stall = inc.get("stall")
        if stall is not None and stall["state"] == "pending":
            stall["state"] = "stuck"
        inc["writer"].complete(inc)
        queued, self.queued = self.queued, []
        for trig in queued:                          # another job's hang seen meanwhile: its incident now
            self.fire(trig)

    def by_job(self, pids) -> list[list[int]]:
        """``pids`` grouped by job (``capture.jobs.Jobs.job_id``; a process not followed stays
        with the first group), in the order of their first pid."""
        groups: dict = {}
        for p in pids or []:
            groups.setdefault(self.s.jobs.job_id(p), []).append(p)
        if None in groups and len(groups) > 1:
            loose = groups.pop(None)
            groups[next(iter(groups))] += loose
        return list(groups.values())

    def other_job(self, pids, than) -> bool:
        """Whether the processes ``pids`` (a trigger's) are of jobs none of ``than`` is of
        (``capture.jobs.Jobs.job_id``); False when either names no followed process."""
        a = {self.s.jobs.job_id(p) for p in pids or []} - {None}
        b = {self.s.jobs.job_id(p) for p in than or []} - {None}
        return bool(a and b) and not (a & b)


def run_watch(opts, stderr=None) -> CaptureResult:
    return Watcher(opts, stderr=stderr).run()
