"""The per-host captures of a lab run (``--capture per-host``): one ``stallscope capture`` per
rank inside its network and UTS namespaces, started seconds apart like a pdsh loop, each
stopped with a Ctrl-C on its own schedule (:meth:`Captures.stop_due_ns`). :class:`Captures`
is ticked by every waiting loop of the :class:`~tests.lab.launcher.Run`; each capture's
record goes into scenario.json.
"""
from __future__ import annotations

import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .scenarios import CAPTURE_BACKSTOP_S, REPO, now_ns, parse_capture_start, parse_stagger

if TYPE_CHECKING:
    from .launcher import Run


class Capture:
    """One per-host ``stallscope capture``, inside its rank's network and UTS namespaces."""

    def __init__(self, run: "Run", rank: int, planned_ns: int):
        self.run, self.rank, self.planned_ns = run, rank, planned_ns
        self.host = f"node{rank}"
        self.proc: subprocess.Popen | None = None
        self.argv: list[str] = []
        self.started_ns = self.capturing_ns = self.stop_sent_ns = self.stopped_ns = None
        self.killed = False
        self.exited_job = False          # the rank had exited: captured with its logs attached
        self.rc = None
        self.bundle: str | None = None
        self.error: str | None = None
        out = run.out
        self.err_path = out / "logs" / f"capture-{self.host}.err"
        self.out_path = out / "logs" / f"capture-{self.host}.out"
        self.dir = out / "bundles" / self.host

    # states: planned -> starting (process runs, not yet capturing) -> capturing -> stopping -> done
    @property
    def done(self) -> bool:
        return self.stopped_ns is not None or (self.proc is None and self.error is not None)

    def start(self) -> None:
        a, run = self.run.a, self.run
        pid = run.ranks[self.rank].pid
        exited = run.ranks[self.rank].poll() is not None
        if exited and (a.no_netns or run.lab is None):
            self.error = "the rank had exited before its capture was to start"
            self.stopped_ns = now_ns()
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "forensics", "capture", "-o", str(self.dir) + os.sep,
               "--progress", "lines", "--duration", f"{self.run.captures.longest_s() + CAPTURE_BACKSTOP_S:g}s"] \
            + shlex.split(a.capture_args or "")
        if exited:
            # the job already died (a reset makes NCCL fail and the ranks exit): what an on-call
            # engineer does then, on the host, in its namespaces: capture what the host still
            # has, with the job's NCCL_DEBUG_FILE log and Flight Recorder dump attached
            self.exited_job = True
            logs = [str(run.out / "logs" / f"nccl-rank{self.rank}.log")]
            agent = run.out / "logs" / f"torchrun-node{self.rank}.log"    # its launcher's report (rank-killed)
            logs += [str(agent)] if agent.exists() else []
            fr = run.out / "fr" / f"node{self.rank}"
            cmd += ["--attach", *logs, *([str(fr / "*")] if fr.is_dir() and any(fr.iterdir()) else [])]
            self.argv = cmd
            self.started_ns = now_ns()
            try:
                with open(self.out_path, "w") as so, open(self.err_path, "w") as se:
                    self.proc = run.lab.popen(self.rank, cmd, cwd=REPO, stdout=so, stderr=se,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                self.error = f"could not start: {e}"
                self.stopped_ns = now_ns()
            return
        cmd[4:4] = ["--pid", str(pid), "--nccl-lib", str(run.build / "libnccl.so.2")]
        if not a.no_netns:
            # exactly like a real host: the rank's network namespace and its UTS namespace
            # (host name node<r>); nsenter execs, so the Popen pid is capture's own
            cmd = ["nsenter", f"--net=/proc/{pid}/ns/net", f"--uts=/proc/{pid}/ns/uts", "--"] + cmd
        self.argv = cmd
        self.started_ns = now_ns()
        try:
            with open(self.out_path, "w") as so, open(self.err_path, "w") as se:
                self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        except OSError as e:
            self.error = f"could not start: {e}"
            self.stopped_ns = now_ns()

    def _err_text(self) -> str:
        try:
            return self.err_path.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def tick(self, now: int) -> None:
        a = self.run.a
        if self.done:
            return
        if self.proc is None:
            if now >= self.planned_ns:
                self.start()
            return
        rc = self.proc.poll()
        if self.capturing_ns is None and "capturing:" in self._err_text():
            self.capturing_ns = now
        if rc is not None:
            self.rc, self.stopped_ns = rc, now
            try:
                lines = [l.strip() for l in self.out_path.read_text(errors="replace").splitlines()]
            except OSError:
                lines = []
            b = [l for l in lines if l.endswith(".tar.gz") and Path(l).exists()]
            if b:
                self.bundle = b[-1]
            msg = (f"exited (rc {rc}) before it was capturing" if self.capturing_ns is None
                   else None if self.bundle else f"exited (rc {rc}) without a bundle")
            if msg:
                self.error = f"{self.error}; {msg}" if self.error else msg
            return
        if self.capturing_ns is None:
            if now - self.started_ns > a.capture_start_timeout_s * 1e9 and self.stop_sent_ns is None:
                self.error = f"not capturing after {a.capture_start_timeout_s:g}s: stopped"
                self.stop(now)
        elif self.stop_sent_ns is None:
            due = self.run.captures.stop_due_ns(self)
            if due is not None and now >= due:
                self.stop(now)
        if (self.stop_sent_ns is not None and not self.killed
                and now - self.stop_sent_ns > a.capture_stop_timeout_s * 1e9):
            self.signal(signal.SIGKILL)    # leaves its staging folder (stallscope capture --recover)
            self.killed = True
            msg = f"still running {a.capture_stop_timeout_s:g}s after SIGINT: killed"
            self.error = f"{self.error}; {msg}" if self.error else msg

    def stop(self, now: int) -> None:
        """Ctrl-C."""
        if self.stop_sent_ns is None:
            self.stop_sent_ns = now
            self.signal(signal.SIGINT)

    def record(self) -> dict:
        out = self.run.out

        def rel(p):
            try:
                return str(Path(p).resolve().relative_to(out))
            except (ValueError, OSError):
                return p
        tail = self._err_text().strip().splitlines()[-12:]
        return {"rank": self.rank, "host": self.host, "planned_ns": self.planned_ns, "started_ns": self.started_ns,
                "capturing_ns": self.capturing_ns, "stop_sent_ns": self.stop_sent_ns, "stopped_ns": self.stopped_ns,
                "rc": self.rc, "killed": self.killed, "job_exited": self.exited_job,
                "bundle": rel(self.bundle) if self.bundle else None,
                "ok": self.bundle is not None and self.capturing_ns is not None and self.error is None,
                "error": self.error, "command": self.argv, "stderr": rel(self.err_path), "stderr_tail": tail}


class Captures:
    """The per-host captures of one run, started seconds apart like a pdsh loop."""

    def __init__(self, run: "Run"):
        self.run = run
        a = run.a
        self.mode, self.offset_s = parse_capture_start(a.capture_start)
        self.stagger = parse_stagger(a.capture_stagger_s)
        self.rng = random.Random(a.seed)
        self.delays_s: list[float] = []
        self.items: list[Capture] = []
        self.base_ns: int | None = None

    def schedule(self, base_ns: int) -> None:
        """The first capture at base_ns, the others at random offsets in [A,B] s from it (so the
        starts spread over at most B s, like a pdsh loop over the hosts); which host starts when
        is shuffled too. delays_s: each host's offset from the first start."""
        if self.items:
            return
        self.base_ns = base_ns
        n = self.run.a.ranks
        offsets = [0.0] + sorted(self.rng.uniform(*self.stagger) for _ in range(n - 1))
        order = list(range(n))
        self.rng.shuffle(order)
        by_rank = {r: offsets[i] for i, r in enumerate(order)}
        self.delays_s = [round(by_rank[r], 3) for r in range(n)]
        for r in range(n):
            self.items.append(Capture(self.run, r, int(base_ns + by_rank[r] * 1e9)))

    def stop_due_ns(self, c: Capture) -> int | None:
        """When capture ``c`` gets its Ctrl-C: --capture-duration-s after it began capturing; with
        --capture-stop-spread-s S, in the order the captures began capturing, S s apart, the first
        --capture-duration-s after the *last* one began (None until every capture is capturing or
        done), so they overlap only partly however long each tracer took to attach."""
        a = self.run.a
        if a.capture_stop_spread_s is None:
            return int(c.capturing_ns + a.capture_duration_s * 1e9)
        if not self.all_capturing_or_failed():
            return None
        on = sorted((x for x in self.items if x.capturing_ns is not None), key=lambda x: (x.capturing_ns, x.rank))
        last = on[-1].capturing_ns
        return int(last + (a.capture_duration_s + on.index(c) * a.capture_stop_spread_s) * 1e9)

    def longest_s(self) -> float:
        """The longest a capture should run (its own --duration is this plus a backstop)."""
        a = self.run.a
        if a.capture_stop_spread_s is None:
            return a.capture_duration_s
        return (a.capture_duration_s + (a.ranks - 1) * a.capture_stop_spread_s + self.stagger[1]
                + a.capture_start_timeout_s)

    def tick(self) -> None:
        now = now_ns()
        for c in self.items:
            c.tick(now)

    @property
    def scheduled(self) -> bool:
        return bool(self.items)

    def all_capturing_or_failed(self) -> bool:
        return bool(self.items) and all(c.capturing_ns is not None or c.done for c in self.items)

    def all_done(self) -> bool:
        return bool(self.items) and all(c.done for c in self.items)

    def last_stop_ns(self) -> int | None:
        """When the last capture ended (None while one runs or is still to come)."""
        if not self.all_done():
            return None
        return max((c.stopped_ns or 0) for c in self.items)

    def stop_all(self, timeout_s: float) -> None:
        """Teardown: Ctrl-C every capture still running, wait, kill what remains."""
        now = now_ns()
        for c in self.items:
            if c.proc is None and not c.done:
                c.error = "never started (the run ended first)"
                c.stopped_ns = now
            elif c.proc is not None and c.proc.poll() is None:
                c.stop(now)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(c.proc is not None and c.proc.poll() is None for c in self.items):
            self.tick()
            time.sleep(0.1)
        for c in self.items:
            if c.proc is not None and c.proc.poll() is None:
                c.signal(signal.SIGKILL)
                c.killed = True
                msg = "still running at teardown: killed"
                c.error = f"{c.error}; {msg}" if c.error else msg
                try:
                    c.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        self.tick()

    def record(self) -> list[dict]:
        return [c.record() for c in self.items]

    def failed(self) -> list[int]:
        return [c.rank for c in self.items if not c.record()["ok"]]
