"""Run one lab scenario: N ranks of the lab "training job" in N namespaces, one fault.

    python -m tests.lab.launcher --scenario loss --rank 2 --ranks 4 --out out/lab-loss
    python -m tests.lab.launcher --scenario gpu-hang --rank 1 --capture per-host --capture-start onset+10
    python -m tests.lab.launcher --scenario selftest --ranks 4 --no-netns --out /tmp/st   (no root)

Writes into OUT:

    scenario.json            ground truth (see README.md)
    pcap/rank<r>.pcap        tcpdump on each rank's eth0, snaplen 128, ns timestamps
    logs/nccl-rank<r>.log    NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,COLL,NET (NCCL_DEBUG_FILE)
    logs/rank<r>.out|.err    rank driver output (JSON events, CHECK lines, watchdog lines)
    logs/capture-node<r>.out|.err  each per-host capture's stdout (the bundle path) and stderr
    truth/rank<r>.jsonl      the lab libnccl's own record (init, enqueue, complete, error, gpu_hang)
    sys/ss-rank<r>.txt       ss -tinpe in each namespace at the end (before anything is killed)
    stacks/rank<r>.txt       gdb backtraces of hung ranks (hang scenarios, when gdb exists)
    stacks/threads-rank<r>.json  every thread's name, state, wchan and syscall (hang scenarios)
    bundles/node<r>/stallscope-node<r>-<UTC>.tar.gz   --capture per-host: one bundle per host
    fr/node<r>/nccl_trace_rank_<r>   Flight Recorder dumps (pickle); fr/pipe_<r>.pipe: their triggers

Exit status: 0 when the scenario ran as designed (the fault, if any, was applied
and observed to start), 1 otherwise (also when --require-captures and a capture
failed), 128+N on signal N (SIGTERM/SIGINT/SIGHUP: torn down, scenario.json
written). Everything is torn down on every path.

The run's parts: :mod:`.scenarios` (the scenario table and shared rules), :mod:`.options`
(the command line), :mod:`.job` (the ranks' processes), :mod:`.faults` (each scenario's
injection), :mod:`.captures` (the per-host captures), :mod:`.results` (end-state evidence
and scenario.json), :mod:`.netns` (the namespaces). :class:`Run` drives them in order and
tears everything down.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.lab import faults, job, netns, results  # type: ignore
    from tests.lab.captures import Captures  # type: ignore
    from tests.lab.options import parse_args  # type: ignore
    from tests.lab.scenarios import (CAPTURE_END_MARGIN_S, DYING, HOLDS, ScenarioError, now_ns,  # type: ignore
                                     read_events, stop_margin_steps)
else:
    from . import faults, job, netns, results
    from .captures import Captures
    from .options import parse_args
    from .scenarios import (CAPTURE_END_MARGIN_S, DYING, HOLDS, ScenarioError, now_ns, read_events,
                            stop_margin_steps)


class Run:
    """One scenario execution; owns every process and namespace it creates. Its state (the
    options ``a``, the processes, ``fault``, the times, ``notes``) is read and filled by the
    functions of :mod:`.job`, :mod:`.faults` and :mod:`.results`; every waiting loop calls
    :meth:`tick` so that the captures and Flight Recorder dumps happen on time."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.out = Path(a.out).resolve()
        self.build = Path(a.build).resolve()
        self.driver = self.build / "sslab_rank"
        self.lab: netns.Lab | None = None
        self.ranks: list[subprocess.Popen] = []
        self.execed: set[int] = set()        # the ranks seen running the driver (job.wait_ranks_exec)
        self.tcpdumps: list[subprocess.Popen] = []
        self.stress: list[subprocess.Popen] = []
        self.fault: dict = {"kind": "none", "ranks": [], "link": None, "start_time_ns": None}
        self.notes: list[str] = []
        self.started_ns = now_ns()
        self.ended_ns = None
        self.captures = Captures(self) if a.capture == "per-host" else None
        # the job runs until told to stop (non-hang scenarios with captures: it must outlive them)
        self.stop_mode = self.captures is not None and a.scenario not in HOLDS + ("selftest",)
        self.gate_file = self.out / ".gate" if self.captures is not None and self.captures.mode == "before" else None
        self.stop_file = self.out / ".stop" if self.stop_mode else None
        self.stop_step: int | None = None
        self.stop_written_ns: int | None = None
        self.gpu_trigger = self.out / ".gpu-hang-trigger"
        self.train_t0: int | None = None
        self.hold_end_ns: int | None = None
        self.onset_ns: int | None = None     # the fault's onset (training start when there is no fault)
        self.gate_opened_ns: int | None = None
        self.job_ended_ns: int | None = None
        self.fr_after_done = False
        self.operator_trigger_ns: int | None = None     # --operator-trigger: when the file was written
        self.fr_requests: list[dict] = []
        self.cleanups: list = []             # a fault's undo steps (a cgroup), called once the ranks are gone

    # ---------------- setup ----------------
    def prepare_out(self) -> None:
        if self.out.exists():
            for sub in ("pcap", "logs", "truth", "sys", "stacks", "bundles", "fr"):
                shutil.rmtree(self.out / sub, ignore_errors=True)
            for f in ("scenario.json", ".gate", ".stop", ".gpu-hang-trigger"):
                (self.out / f).unlink(missing_ok=True)
        for sub in ("logs", "truth"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)
        if self.captures is not None:
            (self.out / "bundles").mkdir(exist_ok=True)
        if self.a.flight_recorder:
            for r in range(self.a.ranks):
                (self.out / "fr" / f"node{r}").mkdir(parents=True, exist_ok=True)
        if not self.a.no_netns:
            (self.out / "sys").mkdir(exist_ok=True)
            if not self.a.no_pcap:
                (self.out / "pcap").mkdir(exist_ok=True)

    def fault_ranks(self) -> list[int]:
        return [self.a.rank]

    def ops_per_step(self) -> int:
        return len([b for b in self.a.buckets.split(",") if b.strip()]) + 1

    def at_op(self) -> int:
        if self.a.at_op is not None:
            return self.a.at_op
        # default: the middle of step 3's burst (op 0 is the initial broadcast)
        # (gpu-hang: SSLAB_GPU_HANG_AT_OP is NCCL's opCount, the same count)
        return 1 + 3 * self.ops_per_step() + self.ops_per_step() // 2

    def open_gate(self) -> None:
        if self.gate_file is not None and not self.gate_file.exists():
            self.gate_file.touch()
            self.gate_opened_ns = now_ns()

    def start_captures_before(self) -> None:
        """--capture-start before: the ranks wait at a gate (before NCCL init) while the
        captures start one after the other; the gate opens once every one captures."""
        job.wait_ranks_exec(self)
        self.captures.schedule(now_ns())
        self.wait_for(lambda: self.captures.all_capturing_or_failed(), 10 ** 6, "the captures to start",
                      poll=0.05)
        failed = [c.rank for c in self.captures.items if c.capturing_ns is None]
        if failed:
            self.notes.append(f"capture(s) of rank(s) {failed} never captured (see scenario.json captures)")
        self.open_gate()

    # ---------------- background duties of every wait ----------------
    def tick(self) -> None:
        """Called by every waiting loop: captures start/stop on time, FR dumps fire."""
        if self.captures is not None:
            if not self.captures.scheduled and self.captures.mode == "onset" and self.onset_ns is not None:
                job.wait_ranks_exec(self)
                self.captures.schedule(self.onset_ns + int(self.captures.offset_s * 1e9))
            self.captures.tick()
        a = self.a
        if (a.fr_dump_after_s is not None and a.flight_recorder and self.onset_ns is not None and not self.fr_after_done
                and now_ns() >= self.onset_ns + a.fr_dump_after_s * 1e9):
            self.fr_after_done = True
            self.fr_trigger(range(a.ranks), f"onset+{a.fr_dump_after_s:g}s")
        if a.operator_trigger and self.operator_trigger_ns is None and self.onset_ns is not None:
            path, _, after_s = a.operator_trigger.rpartition("@")
            if now_ns() >= self.onset_ns + float(after_s) * 1e9:
                Path(path).write_text(f"operator (lab {self.out}): onset+{after_s}s\n")
                self.operator_trigger_ns = now_ns()

    def fr_trigger(self, ranks, why: str) -> list[int]:
        """Write to the ranks' Flight Recorder pipes (what `echo 1 > pipe` does); the ranks reached."""
        hit = []
        for r in ranks:
            path = self.out / "fr" / f"pipe_{r}.pipe"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)   # ENXIO: nobody reads it (rank gone)
            except OSError:
                continue
            try:
                os.write(fd, b"1\n")
                hit.append(r)
            except OSError:
                pass
            finally:
                os.close(fd)
        self.fr_requests.append({"t_ns": now_ns(), "why": why, "ranks": hit})
        return hit

    # ---------------- observation ----------------
    def events(self, r: int) -> list[dict]:
        return read_events(self.out / "logs" / f"rank{r}.out")

    def wait_for(self, pred, timeout: float, what: str, poll: float = 0.02):
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            v = pred()
            if v:
                return v
            if self.ranks and all(p.poll() is not None for p in self.ranks):
                raise ScenarioError(f"all ranks exited while waiting for {what} "
                                    "(the job was too short: use more --steps or an earlier --start-s)")
            dead = [r for r, p in enumerate(self.ranks) if p.poll() not in (None, 0)]
            if dead and self.a.scenario not in DYING:
                raise ScenarioError(f"rank(s) {dead} exited early while waiting for {what}")
            if time.monotonic() > deadline:
                raise ScenarioError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(poll)

    def train_start_ns(self) -> int:
        def all_started():
            ts = []
            for r in range(self.a.ranks):
                ev = [e for e in self.events(r) if e.get("ev") == "train_start"]
                if not ev:
                    return None
                ts.append(ev[0]["t_ns"])
            return max(ts)
        if self.train_t0 is None:
            self.train_t0 = self.wait_for(all_started, self.a.init_timeout_s, "all ranks to start training")
        return self.train_t0

    def sleep_until_ns(self, t_ns: int) -> None:
        while True:
            self.tick()
            d = (t_ns - now_ns()) / 1e9
            if d <= 0:
                return
            if any(p.poll() not in (None, 0) for p in self.ranks) and self.a.scenario not in DYING:
                raise ScenarioError("a rank exited before the fault was injected")
            if all(p.poll() is not None for p in self.ranks):
                raise ScenarioError("the job finished before the fault start "
                                    "(use more --steps or an earlier --start-s)")
            time.sleep(min(d, 0.05))

    # ---------------- end of run ----------------
    def wait_end(self) -> None:
        a, sc = self.a, self.a.scenario
        if sc in HOLDS:
            # Hang and reset scenarios end --hold-s after the onset, whatever else happens:
            # --run-timeout-s does not apply, and the driver's watchdog is set past the hold
            # (parse_args). Per-host captures extend the hold until the last one ended (+1 s).
            # reset: the rank that got the RST fails and exits; peers of a half-open
            # connection may hang instead (as in real jobs): bounded by hold_s too.
            hold_end = self.fault["start_time_ns"] + int(a.hold_s * 1e9)
            while True:
                self.tick()
                now = now_ns()
                end = hold_end
                if self.captures is not None:
                    last = self.captures.last_stop_ns()
                    if last is None:
                        end = None                       # a capture is still to come or running
                    else:
                        end = max(end, last + int(CAPTURE_END_MARGIN_S * 1e9))
                if end is not None and now >= end:
                    break
                if all(p.poll() is not None for p in self.ranks) and (self.captures is None or end is not None):
                    break
                time.sleep(0.05)
            self.hold_end_ns = now_ns()
            if self.hold_end_ns > hold_end + 2e9:
                self.notes.append(f"the hold lasted {(self.hold_end_ns - self.fault['start_time_ns']) / 1e9:.1f}s "
                                  f"(--hold-s {a.hold_s:g}): extended until the last capture ended")
            return
        if self.stop_mode:
            # The job trains until every capture has ended (+ a margin), then stops at a
            # step all ranks agree on: the launcher writes it STOP_MARGIN_STEPS beyond the
            # last step any rank has logged (ranks are at most one step apart).
            while not self.captures.all_done():
                self.tick()
                if all(p.poll() is not None for p in self.ranks):
                    self.notes.append("the job ended before the captures did")
                    break
                time.sleep(0.05)
            last = self.captures.last_stop_ns() or now_ns()
            while now_ns() < last + CAPTURE_END_MARGIN_S * 1e9 and any(p.poll() is None for p in self.ranks):
                time.sleep(0.05)
            evs = [[e for e in self.events(r) if e.get("ev") == "step"] for r in range(a.ranks)]
            steps = [max((e["step"] for e in ev), default=-1) for ev in evs]
            self.stop_step = max(steps) + 1 + stop_margin_steps(evs, a.compute_ms)
            tmp = self.stop_file.with_name(".stop.tmp")
            tmp.write_text(f"{self.stop_step}\n")
            tmp.rename(self.stop_file)
            self.stop_written_ns = now_ns()
        deadline = time.monotonic() + a.run_timeout_s
        while any(p.poll() is None for p in self.ranks):
            self.tick()
            if time.monotonic() > deadline:
                self.notes.append(f"run timeout {a.run_timeout_s}s: ranks still running were killed")
                return
            time.sleep(0.05)

    def remove_fr_pipes(self) -> None:
        """The gate/stop/trigger files and the ranks' FIFOs go with the run (torch leaves its FIFO
        behind; an output folder that is copied, e.g. into fixtures, should not carry them), and
        empty dump folders too."""
        for f in (self.gate_file, self.stop_file, self.gpu_trigger):   # the launcher's own signals to the ranks
            if f is not None:
                f.unlink(missing_ok=True)
        fr = self.out / "fr"
        for f in fr.glob("pipe_*.pipe"):
            f.unlink(missing_ok=True)
        for d in sorted(fr.glob("node*")) + [fr]:
            try:
                d.rmdir()          # only when empty
            except OSError:
                pass

    def stop_all(self) -> dict:
        # Captures first, while the job is still in its end state (normally they have all
        # ended already; after a failure or a signal they get a Ctrl-C and some time).
        if self.captures is not None:
            self.captures.stop_all(self.a.capture_stop_timeout_s)
        # Freeze every live rank first, then kill: a rank killed while its peers
        # still run would reset their connections and make them fail on their
        # own, blurring the end state (e.g. a hang turning into errors).
        states = {r: ("killed" if p.poll() is None else "exited") for r, p in enumerate(self.ranks)}
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for r, p in enumerate(self.ranks):
                if states[r] == "killed":
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
        for p in self.ranks:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for p in self.tcpdumps:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.tcpdumps:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        job.stop_stress(self)
        return states

    def execute(self) -> int:
        a = self.a
        if not self.driver.exists():
            raise ScenarioError(f"{self.driver} missing: run `make -C tests/lab` first")
        if self.captures is not None and not a.no_netns and not shutil.which("nsenter"):
            raise ScenarioError("--capture per-host needs nsenter (util-linux)")
        self.prepare_out()
        rc = 1
        states: dict = {}
        try:
            if not a.no_netns:
                netns.sweep()
                self.lab = netns.Lab(a.ranks, quickack=a.tcp == "lab").__enter__()
                if a.fail_at == "setup":
                    raise ScenarioError("injected failure after setup (--fail-at setup)")
                if not a.no_pcap:
                    job.start_tcpdump(self)
            job.start_stress(self)
            job.start_ranks(self)
            if self.captures is not None and self.captures.mode == "before":
                self.start_captures_before()
            if a.fail_at == "running":
                self.train_start_ns()
                raise ScenarioError("injected failure while running (--fail-at running)")
            faults.inject(self)
            self.wait_end()
            results.snapshot(self)
            rc = 0
        finally:
            if _SIGNALLED:
                self.notes.append(f"launcher got signal {_SIGNALLED[0]}: ended early, torn down")
            try:
                states = self.stop_all()
            finally:
                for undo in self.cleanups:
                    undo()
                self.ended_ns = now_ns()
                if self.lab is not None and self.fault.get("kind") == "loss":
                    self.fault["nft_counters"] = self.lab.nft_counters()
                try:
                    exits = [e["t_ns"] for r in range(a.ranks) for e in self.events(r) if e.get("ev") == "exit"]
                    self.job_ended_ns = max(exits) if exits and len(exits) == len(self.ranks) else None
                    summary = results.summarize(self, states)
                    (self.out / "scenario.json").write_text(json.dumps(summary, indent=2) + "\n")
                finally:
                    if self.lab is not None:
                        self.lab.teardown()
                    job.stop_stress(self)
                    self.remove_fr_pipes()
        if rc == 0 and a.require_captures and self.captures is not None and self.captures.failed():
            print(f"launcher: capture(s) of rank(s) {self.captures.failed()} failed (see scenario.json captures)",
                  file=sys.stderr)
            rc = 1
        return rc


_SIGNALLED: list[int] = []


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)

    def on_signal(signum, frame):
        # The first SIGTERM/SIGINT/SIGHUP unwinds normally (teardown runs, scenario.json is
        # written); later ones are only noted, so that they cannot interrupt the teardown.
        if _SIGNALLED:
            _SIGNALLED.append(signum)
            return
        _SIGNALLED.append(signum)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    run = Run(a)
    try:
        rc = run.execute()
    except (ScenarioError, RuntimeError) as e:
        print(f"launcher: {e}", file=sys.stderr)
        return 1
    print(f"launcher: scenario {a.scenario} done, output in {run.out}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
