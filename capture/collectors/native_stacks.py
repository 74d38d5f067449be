"""Native stacks (``--stacks``): every thread's stack of each job process, through eu-stack,
gdb or py-spy --native (``capture.stacks``). ptrace stops every thread while its stack is
read, so ``auto`` (the default) takes them only when the job looks hung: a thread watches it
for ``--stacks-grace`` (the tracer's calls, the threads' CPU time) and decides; ``always``
takes them at the start; ``never`` does not. Each run is bounded (then killed). The watcher
takes them at an incident instead (``capture.watch``), through :meth:`NativeStacks.take`.

Standard library only."""
from __future__ import annotations

import os
import shlex
import threading
import time

from .. import bundle_files as bd
from .. import stacks
from ..session import tail
from .collector import Collector


class NativeStacks(Collector):
    name = "native-stacks"

    def __init__(self, session):
        super().__init__(session)
        self.thread: threading.Thread | None = None
        self.cancel = threading.Event()    # set when the capture ends: an undecided auto check gives up

    def ready(self) -> str | None:
        """Once the tracer is up (its calls are what the auto check reads): the stacks' mode
        begins, unless the policy takes them elsewhere (the watcher: at an incident)."""
        if self.s.policy.stacks_at_start:
            self.begin()
        return None

    def begin(self) -> None:
        """--stacks: always (now, phase "start"), auto (a thread watches the job for
        stacks_grace_s and takes them, phase "hung", only if nothing progressed), never."""
        s = self.s
        mode = s.o.stacks
        phase = "start" if mode == "always" else "hung"
        pids = sorted(s.procs)
        reason = None
        if mode == "never":
            reason = "--stacks never"
        elif not s.is_root:
            reason = "needs root"
        elif not stacks.available_tools(python=True):
            reason = "no eu-stack, gdb or py-spy on PATH"
        if reason is None and mode == "always" and not pids:
            reason = "no NCCL process at the start of the capture"
        if reason:
            t = time.time_ns()
            for pid in pids:
                s.record(f"native-stacks@pid{pid}:{phase}", status="skipped", reason=reason, started_ns=t,
                         ended_ns=t)
            if not pids:
                s.record(f"native-stacks:{phase}", status="skipped", started_ns=t, ended_ns=t, reason=reason)
            return
        self.thread = threading.Thread(target=self.run_thread, args=(mode, phase),
                                       name="native-stacks", daemon=True)
        self.thread.start()

    def run_thread(self, mode: str, phase: str) -> None:
        s = self.s
        try:
            decision = None
            if mode == "auto":
                hung, decision = self.hung_check()
                if not hung:
                    t = time.time_ns()
                    for pid in sorted(s.procs):
                        s.record(f"native-stacks@pid{pid}:{phase}", status="skipped", reason=decision,
                                 started_ns=t, ended_ns=t)
                    if not s.procs:
                        s.record(f"native-stacks:{phase}", status="skipped", reason=decision, started_ns=t,
                                 ended_ns=t)
                    return
                s.log(f"{decision}: taking native stacks (ptrace)")
            for pid in sorted(s.procs):
                self.take(pid, phase, decision)
        except Exception as e:  # noqa: BLE001 - never take the capture down
            s.notes.append(f"native stacks: {type(e).__name__}: {e}")

    def hung_check(self) -> tuple[bool, str]:
        """Watch the job for stacks_grace_s (from now, or from when its first process is found,
        for a capture started before the job): (hung, why)."""
        s = self.s
        grace = s.o.stacks_grace_s
        while not s.procs:
            if self.cancel.wait(0.5):
                return False, "no NCCL process found before the capture ended"
        nss = {ns.inode: (ns.inode, s.live_pid(ns) or ns.pid, ns.own) for ns in list(s.netns.values()) if ns.pids}
        probe = stacks.ProgressProbe(sorted(s.procs), nss)
        before = probe.sample()
        if self.cancel.wait(grace):
            return False, (f"the capture ended before the {grace:g}s grace period: no decision, no ptrace stop "
                           "(--stacks always takes them at the start)")
        activity, note = None, "--no-bpf"
        if s.spool is not None and s.spool.ready.is_set():
            activity = stacks.tracer_activity(s.raw_dir, call_returns=s.o.call_returns)
            if s.spool.dropped_lines:
                activity.calls += s.spool.dropped_lines
                activity.completed += s.spool.dropped_lines
        elif s.o.bpf:
            note = "the tracer is not running"
        probe.pids = sorted(s.procs)
        return stacks.decide(grace, activity, before, probe.sample(), note)

    def take(self, pid: int, phase: str, decision: str | None) -> None:
        s = self.s
        key = f"native-stacks@pid{pid}:{phase}"
        c = self.spec
        t0 = time.time_ns()
        info = s.procs[pid]
        tools = stacks.available_tools(info.python)
        reason = None
        if not os.path.isdir(f"/proc/{pid}"):
            reason = "process exited"
        elif not tools:
            reason = "no eu-stack or gdb on PATH (py-spy serves Python processes only)"
        if reason:
            s.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=time.time_ns(),
                     decision=decision)
            return
        out = s.staging / s.fill(c.out, {"pid": pid, "phase": phase})
        threads = stacks.thread_table(pid)
        notes, res, used, argv = [], None, None, None
        for tool in tools:
            argv = stacks.tool_argv(tool, pid)
            s.record(key, status="running", command=shlex.join(argv), started_ns=t0, tool=tool, decision=decision)
            res, used = stacks.run_bounded(argv, s.o.stacks_timeout_s, pid), tool
            if res.killed or stacks.output_ok(tool, res.rc, res.out):
                break
            notes.append(f"{tool} exit code {res.rc}: {tail(res.err, 300)}")
        status, reason = "ok", None
        if res.killed:
            status, reason = "failed", f"still running after {s.o.stacks_timeout_s:g}s: killed"
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
        n, trunc = bd.write_capped(out, blob, s.budget, c.per_file_max)
        if trunc:
            reason = ((reason + "; ") if reason else "") + "output truncated to the byte budget"
        t1 = time.time_ns()
        s.record(key, status=status, reason=reason, rc=res.rc, files=[s.rel(out)] if n else [],
                 stderr_tail=tail(res.err), ended_ns=t1, tool=used, threads=len(threads),
                 seconds=round(res.seconds, 3), resumed_threads=res.resumed or None,
                 covered_ns=[t0, t1] if status == "ok" else None)

    def stop(self) -> None:
        """At the end: an auto check still in its grace period gives up; stacks being taken finish
        (each run is bounded)."""
        s = self.s
        self.cancel.set()
        th = self.thread
        if th is not None:
            n_tools = len(stacks.TOOLS)
            th.join(timeout=30 + len(s.procs) * n_tools * (s.o.stacks_timeout_s + 3))

