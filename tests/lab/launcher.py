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
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.lab import netns  # type: ignore
else:
    from . import netns

LAB_DIR = Path(__file__).resolve().parent
REPO = LAB_DIR.parents[1]
DEFAULT_BUILD = LAB_DIR / "build"

SCENARIOS = ("clean", "loss", "slow-link", "straggler", "mismatch-hang", "link-down-hang", "gpu-hang", "reset",
             "selftest")
HANGS = ("mismatch-hang", "link-down-hang", "gpu-hang")
HOLDS = HANGS + ("reset",)          # scenarios that end --hold-s after the fault, not when the job ends
STOP_MARGIN_STEPS = 5               # --stop-file: steps between the last one logged and the one all ranks stop at,
STOP_MARGIN_S = 1.0                 # ... fewer (1 at least) when this much time is fewer steps (25 s steps: 1, not 5)
CAPTURE_END_MARGIN_S = 1.0          # the job (or the hang) lasts this long after the last capture ended
# A capture ends with the launcher's Ctrl-C after --capture-duration-s; its own --duration is
# that plus this, only a backstop: were both due at once, the Ctrl-C could land after capture
# has written its bundle and restored Python's SIGINT handler (rc -2, the bundle complete).
CAPTURE_BACKSTOP_S = 30.0

# Scenario defaults; every one can be overridden on the command line.
DEFAULTS = {
    "common": dict(steps=16, compute_ms=40.0, buckets="262144,262144,131072,65536", dtype="float32",
                   pattern="ddp", start_s=0.5, hold_s=3.0),
    "clean": dict(),
    "loss": dict(loss_permille=20, direction="both", steps=12),
    "slow-link": dict(rate="200mbit", direction="both", steps=12),
    "straggler": dict(straggle_ms=250.0, steps=12),
    "mismatch-hang": dict(steps=100000, skip_mode="stop"),
    "link-down-hang": dict(steps=100000, start_s=1.0, compute_ms=5.0, link_side="switch"),
    "gpu-hang": dict(steps=100000),
    "reset": dict(steps=100000, start_s=1.0, compute_ms=20.0),
    "selftest": dict(),
}


class ScenarioError(RuntimeError):
    pass


def now_ns() -> int:
    return time.time_ns()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def read_events(path: Path) -> list[dict]:
    out = []
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def pid_exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def parse_stagger(text: str) -> tuple[float, float]:
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(?:-\s*(\d+(?:\.\d*)?))?\s*", text or "")
    if not m:
        raise ValueError(f"bad stagger {text!r} (A-B seconds, e.g. 0-5)")
    lo = float(m[1])
    hi = float(m[2]) if m[2] is not None else lo
    if hi < lo:
        raise ValueError(f"bad stagger {text!r}: B < A")
    return lo, hi


def stop_margin_steps(step_events: list[list[dict]], compute_ms: float) -> int:
    """Steps between the last one any rank logged and the one every rank stops at: enough
    for STOP_MARGIN_S of steps (a rank must not have begun the stop step before the stop file
    appears), at most STOP_MARGIN_STEPS, at least 1. The step time: the median interval
    between a rank's logged steps, else --compute-ms (a step takes at least that)."""
    gaps = sorted(b["t_ns"] - a["t_ns"] for ev in step_events for a, b in zip(ev, ev[1:]))
    step_s = gaps[len(gaps) // 2] / 1e9 if gaps else compute_ms / 1e3
    if step_s <= 0:
        return STOP_MARGIN_STEPS
    return max(1, min(STOP_MARGIN_STEPS, math.ceil(STOP_MARGIN_S / step_s)))


def parse_capture_start(text: str) -> tuple[str, float]:
    if text == "before":
        return "before", 0.0
    m = re.fullmatch(r"onset\+(\d+(?:\.\d*)?)", text or "")
    if not m:
        raise ValueError(f"bad --capture-start {text!r} (before, or onset+S, e.g. onset+10)")
    return "onset", float(m[1])


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


class Run:
    """One scenario execution; owns every process and namespace it creates."""

    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.out = Path(a.out).resolve()
        self.build = Path(a.build).resolve()
        self.driver = self.build / "sslab_rank"
        self.lab: netns.Lab | None = None
        self.ranks: list[subprocess.Popen] = []
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
        self.fr_requests: list[dict] = []

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

    def rank_env(self, r: int, master_addr: str, master_port: int) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SSLAB_", "TORCH_"))}
        env.update(
            RANK=str(r), LOCAL_RANK="0" if not self.a.no_netns else str(r), WORLD_SIZE=str(self.a.ranks),
            LOCAL_WORLD_SIZE="1" if not self.a.no_netns else str(self.a.ranks),
            GROUP_RANK=str(r) if not self.a.no_netns else "0", ROLE_RANK=str(r),
            MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
            NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS=self.a.debug_subsys,
            NCCL_DEBUG_FILE=str(self.out / "logs" / f"nccl-rank{r}.log"),
            NCCL_SOCKET_IFNAME="lo" if self.a.no_netns else "eth0", NCCL_IB_DISABLE="1",
            SSLAB_TRUTH_FILE=str(self.out / "truth" / f"rank{r}.jsonl"),
        )
        if not self.a.socket_ifname and not self.a.no_netns:
            del env["NCCL_SOCKET_IFNAME"]     # NCCL picks the first non-loopback interface itself
        if self.a.buffsize:
            env["NCCL_BUFFSIZE"] = str(self.a.buffsize)
        if self.a.nchannels:
            env["NCCL_MIN_NCHANNELS"] = str(self.a.nchannels)
        if self.a.flight_recorder:
            # PyTorch's Flight Recorder, as a job sets it up for on-call dumps (see README.md)
            env.update(TORCH_NCCL_TRACE_BUFFER_SIZE=str(self.a.fr_buffer_size), TORCH_NCCL_DUMP_ON_TIMEOUT="1",
                       TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(self.out / "fr" / f"node{r}" / "nccl_trace_rank_"),
                       TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(self.out / "fr" / "pipe_"))
            if self.a.fr_timing:
                env["TORCH_NCCL_ENABLE_TIMING"] = "1"
        if self.a.scenario == "gpu-hang" and r in self.fault_ranks():
            # only on the faulty rank: the library stays NCCL-ABI clean everywhere else
            if self.a.hang_at == "time":
                env["SSLAB_GPU_HANG_TRIGGER"] = str(self.gpu_trigger)
            else:
                env["SSLAB_GPU_HANG_AT_OP"] = str(self.at_op())
        return env

    def driver_args(self, r: int) -> list[str]:
        a = self.a
        if a.scenario == "selftest":
            args = ["--mode", "selftest", "--selftest-dtypes", a.selftest_dtypes,
                    "--selftest-count", str(a.selftest_count), "--selftest-large", str(a.selftest_large)]
            return args
        args = ["--mode", "train", "--steps", str(10 ** 9 if self.stop_mode else a.steps),
                "--compute-ms", str(a.compute_ms), "--buckets", a.buckets, "--dtype", a.dtype, "--pattern", a.pattern,
                "--watchdog-timeout-s", str(a.watchdog_timeout_s)]
        if self.gate_file is not None:
            args += ["--gate-file", str(self.gate_file)]
        if self.stop_file is not None:
            args += ["--stop-file", str(self.stop_file)]
        if a.scenario == "straggler" and r in self.fault_ranks():
            args += ["--straggle-ms", str(a.straggle_ms), "--straggle-from-s", str(a.start_s)]
        if a.scenario == "mismatch-hang" and r in self.fault_ranks():
            args += ["--skip-op", str(self.at_op()), "--skip-mode", a.skip_mode]
        return args

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

    def start_tcpdump(self) -> None:
        assert self.lab
        for h in self.lab.hosts:
            f = self.out / "pcap" / f"rank{h.rank}.pcap"
            err = open(self.out / "logs" / f"tcpdump-rank{h.rank}.err", "w")
            p = self.lab.popen(h.rank, ["tcpdump", "-i", h.iface, "-s", str(self.a.snaplen),
                                        "--time-stamp-precision=nano", "--immediate-mode", "-U", "-n",
                                        "-w", str(f)],
                               hostname=False, stdout=subprocess.DEVNULL, stderr=err)
            self.tcpdumps.append(p)
        deadline = time.monotonic() + 10
        for h in self.lab.hosts:
            errf = self.out / "logs" / f"tcpdump-rank{h.rank}.err"
            while "listening on" not in errf.read_text(errors="replace"):
                if time.monotonic() > deadline:
                    raise ScenarioError(f"tcpdump in rank {h.rank} did not start: {errf.read_text()}")
                time.sleep(0.05)

    def start_ranks(self) -> None:
        a = self.a
        if a.no_netns:
            master_addr, master_port = "127.0.0.1", free_port()
        else:
            assert self.lab
            master_addr, master_port = self.lab.hosts[0].addr, netns.MASTER_PORT
        for r in range(a.ranks):
            env = self.rank_env(r, master_addr, master_port)
            out = open(self.out / "logs" / f"rank{r}.out", "w")
            err = open(self.out / "logs" / f"rank{r}.err", "w")
            argv = [str(self.driver)] + self.driver_args(r)
            if a.no_netns:
                p = subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True)
            else:
                p = self.lab.popen(r, argv, env=env, stdout=out, stderr=err, start_new_session=True)
            self.ranks.append(p)

    def wait_ranks_exec(self, timeout: float = 30) -> None:
        """Every rank's pid is the driver itself (ip netns exec/unshare/sh have exec'd): its
        namespaces and host name are the rank's, so captures can enter them."""
        want = os.path.realpath(self.driver)
        deadline = time.monotonic() + timeout
        for r, p in enumerate(self.ranks):
            while pid_exe(p.pid) != want:
                if p.poll() is not None:
                    raise ScenarioError(f"rank {r} exited at start (rc {p.returncode}): see logs/rank{r}.err")
                if time.monotonic() > deadline:
                    raise ScenarioError(f"rank {r} (pid {p.pid}) did not start {self.driver.name}")
                time.sleep(0.01)

    def start_stress(self) -> None:
        """CPU contention: N busy loops at normal priority (in the switch namespace, so a
        sweep finds them too), started before the job, killed at teardown."""
        for _ in range(self.a.stress):
            argv = ["sh", "-c", "while :; do :; done"]
            if self.lab is not None:
                argv = ["ip", "netns", "exec", self.lab.switch] + argv
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            self.stress.append(p)
            if self.lab is not None:
                self.lab.track(p)

    def stop_stress(self) -> None:
        for p in self.stress:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.stress:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def open_gate(self) -> None:
        if self.gate_file is not None and not self.gate_file.exists():
            self.gate_file.touch()
            self.gate_opened_ns = now_ns()

    def start_captures_before(self) -> None:
        """--capture-start before: the ranks wait at a gate (before NCCL init) while the
        captures start one after the other; the gate opens once every one captures."""
        self.wait_ranks_exec()
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
                self.wait_ranks_exec()
                self.captures.schedule(self.onset_ns + int(self.captures.offset_s * 1e9))
            self.captures.tick()
        a = self.a
        if (a.fr_dump_after_s is not None and a.flight_recorder and self.onset_ns is not None and not self.fr_after_done
                and now_ns() >= self.onset_ns + a.fr_dump_after_s * 1e9):
            self.fr_after_done = True
            self.fr_trigger(range(a.ranks), f"onset+{a.fr_dump_after_s:g}s")

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
            if dead and self.a.scenario != "reset":
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

    def truth_inflight(self, r: int) -> bool:
        """A collective is enqueued on rank r and not complete (per its truth file)."""
        evs = read_events(self.out / "truth" / f"rank{r}.jsonl")
        world = [e for e in evs if e.get("ev") == "init" and e.get("func") == "ncclCommInitRank"]
        if not world:
            return False
        comm = world[0]["comm"]
        enq = [e["opCount"] for e in evs if e.get("ev") == "enqueue" and e.get("comm") == comm]
        done = [e["opCount"] for e in evs if e.get("ev") == "complete" and e.get("comm") == comm]
        return bool(enq) and (not done or max(enq) > max(done))

    def sleep_until_ns(self, t_ns: int) -> None:
        while True:
            self.tick()
            d = (t_ns - now_ns()) / 1e9
            if d <= 0:
                return
            if any(p.poll() not in (None, 0) for p in self.ranks) and self.a.scenario not in ("reset",):
                raise ScenarioError("a rank exited before the fault was injected")
            if all(p.poll() is not None for p in self.ranks):
                raise ScenarioError("the job finished before the fault start "
                                    "(use more --steps or an earlier --start-s)")
            time.sleep(min(d, 0.05))

    # ---------------- scenarios ----------------
    def link_info(self, r: int) -> dict:
        if self.a.no_netns:
            return {"rank": r, "host": socket.gethostname(), "iface": "lo", "addr": "127.0.0.1"}
        h = self.lab.hosts[r]
        return {"rank": r, "host": h.hostname, "iface": h.iface, "addr": h.addr, "namespace": h.ns,
                "switch_port": h.port, "switch_namespace": self.lab.switch}

    def inject(self) -> None:
        a, sc = self.a, self.a.scenario
        r = a.rank
        if sc in ("clean", "selftest"):
            self.fault = {"kind": "none", "ranks": [], "link": None, "start_time_ns": None}
            if self.captures is not None or a.fr_dump_after_s is not None:
                self.onset_ns = self.train_start_ns()   # no fault: "onset" is when training began
            return
        if sc in ("loss", "slow-link", "link-down-hang", "reset") and a.no_netns:
            raise ScenarioError(f"scenario {sc} needs network namespaces (drop --no-netns)")
        t0 = self.train_start_ns()
        self.fault = {"kind": sc, "ranks": [r], "link": None, "start_time_ns": None}
        if sc == "loss":
            self.sleep_until_ns(t0 + int(a.start_s * 1e9))
            self.fault["start_time_ns"] = now_ns()
            self.fault["link"] = self.link_info(r)
            self.fault.update(permille=a.loss_permille, probability=a.loss_permille / 1000.0,
                              **self.lab.loss(r, a.loss_permille, a.direction, a.loss_min_bytes))
            self.fault["applied_ns"] = now_ns()   # the nft rules are in
        elif sc == "slow-link":
            self.sleep_until_ns(t0 + int(a.start_s * 1e9))
            self.fault["start_time_ns"] = now_ns()
            self.fault["link"] = self.link_info(r)
            self.fault.update(**self.lab.rate(r, a.rate, a.direction))
            self.fault["applied_ns"] = now_ns()   # both tc qdiscs are in
        elif sc == "straggler":
            ev = self.wait_for(lambda: [e for e in self.events(r) if e.get("ev") == "straggle"],
                               a.start_s + 30, "the straggler to start")
            self.fault.update(start_time_ns=ev[0]["t_ns"], extra_compute_ms=a.straggle_ms,
                              compute_ms=a.compute_ms, from_step=ev[0]["step"])
        elif sc == "mismatch-hang":
            ev = self.wait_for(lambda: [e for e in self.events(r) if e.get("ev") == "skip"],
                               60, f"rank {r} to skip collective #{self.at_op()}")
            self.fault.update(start_time_ns=ev[0]["t_ns"], op_index=ev[0]["op_index"], op=ev[0]["op"],
                              step=ev[0]["step"], skip_mode=a.skip_mode,
                              note="op_index counts collectives issued on the world communicator from 0 "
                                   "(op 0 is the initial broadcast); opCount in the NCCL logs equals it")
        elif sc == "link-down-hang":
            self.sleep_until_ns(t0 + int(a.start_s * 1e9))
            mid = False
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                if self.truth_inflight(r):
                    mid = True
                    break
                time.sleep(0.001)
            self.fault["start_time_ns"] = now_ns()
            self.fault["link"] = self.link_info(r)
            self.fault.update(mid_collective=mid, **self.lab.link_down(r, a.link_side))
            self.fault["applied_ns"] = now_ns()   # `ip link set down` has returned
        elif sc == "gpu-hang":
            if a.hang_at == "time":
                self.sleep_until_ns(t0 + int(a.start_s * 1e9))
                self.gpu_trigger.touch()
            truth = self.out / "truth" / f"rank{r}.jsonl"
            what = (f"rank {r}'s stream to hang in collective #{self.at_op()}" if a.hang_at == "op"
                    else f"rank {r}'s stream to hang in its next collective")
            ev = self.wait_for(lambda: [e for e in read_events(truth) if e.get("ev") == "gpu_hang"], 60, what)[0]
            n = ev["opCount"]

            def entered():   # the peers enqueue the same collective (the hung rank is already inside it)
                got = []
                for q in range(a.ranks):
                    evs = read_events(self.out / "truth" / f"rank{q}.jsonl")
                    comm = next((e["comm"] for e in evs if e.get("ev") == "init"
                                 and e.get("func") == "ncclCommInitRank"), None)
                    if any(e.get("ev") == "enqueue" and e.get("opCount") == n and e.get("comm") == comm for e in evs):
                        got.append(q)
                return got if len(got) == a.ranks else None
            try:
                peers = self.wait_for(entered, 10, f"every rank to enter collective #{n}")
            except ScenarioError:
                peers = entered() or []
            self.fault.update(
                kind="gpu-hang", start_time_ns=ev["t_ns"], op_index=n, opCount=n, collective_seq_id=n + 1,
                op=ev["op"], mid_collective=True, ranks_entered=peers if peers else None, trigger=a.hang_at,
                stuck_thread={"tid": ev["tid"], "name": "cuda-stream", "function": "sslab_gpu_kernel_hang",
                              "blocks_in": "nanosleep (clock_nanosleep), forever"},
                note="rank r's stream thread (the \"GPU\") entered collective opCount n and hangs before sending "
                     "anything; its peers wait inside #n on their ring sockets (poll), their main threads in "
                     "cudaStreamSynchronize. op_index = opCount on the world communicator; torch's "
                     "collective_seq_id = opCount + 1")
        elif sc == "reset":
            self.sleep_until_ns(t0 + int(a.start_s * 1e9))
            prev = (r - 1) % a.ranks
            self.fault["start_time_ns"] = now_ns()
            self.fault["link"] = self.link_info(r)
            self.fault.update(peer_rank=prev, reset_sent_to_rank=prev, method="nft-reject-tcp-reset",
                              connection=f"ring {prev} -> {r}", **self.lab.reset_from(r, prev, a.reset_scope))
        else:
            raise ScenarioError(f"unknown scenario {sc}")
        self.onset_ns = self.fault["start_time_ns"]

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

    def snapshot(self) -> None:
        """Evidence of the end state, taken before anything is killed."""
        if self.a.scenario in HOLDS:
            self.thread_states()
        if self.a.no_netns:
            return
        for h in self.lab.hosts:
            p = self.lab.exec(h.rank, ["ss", "-tinpe"], check=False)
            (self.out / "sys" / f"ss-rank{h.rank}.txt").write_text(p.stdout)
        if self.a.scenario in HOLDS and self.a.stacks and shutil.which("gdb"):
            (self.out / "stacks").mkdir(exist_ok=True)
            procs = []
            for r, p in enumerate(self.ranks):
                if p.poll() is None:
                    f = open(self.out / "stacks" / f"rank{r}.txt", "w")
                    procs.append((subprocess.Popen(
                        ["gdb", "-p", str(p.pid), "-batch", "-nx", "-ex", "set pagination off",
                         "-ex", "thread apply all bt"], stdout=f, stderr=subprocess.STDOUT), f))
            for gp, f in procs:
                try:
                    gp.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    gp.kill()
                    gp.wait()
                f.close()

    def thread_states(self) -> None:
        """Every thread of every live rank: name, state, wchan, syscall (from /proc; no ptrace)."""
        (self.out / "stacks").mkdir(exist_ok=True)
        for r, p in enumerate(self.ranks):
            if p.poll() is not None:
                continue
            rows = []
            for task in sorted(Path(f"/proc/{p.pid}/task").glob("*"), key=lambda t: int(t.name)):
                row = {"tid": int(task.name)}
                for key, fname in (("name", "comm"), ("wchan", "wchan"), ("syscall", "syscall")):
                    try:
                        row[key] = (task / fname).read_text(errors="replace").strip()
                    except OSError:
                        row[key] = None
                try:
                    row["state"] = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    row["state"] = None
                sc = (row.get("syscall") or "").split()
                row["syscall_nr"] = int(sc[0]) if sc and sc[0].lstrip("-").isdigit() else None
                rows.append(row)
            (self.out / "stacks" / f"threads-rank{r}.json").write_text(json.dumps(rows, indent=1) + "\n")

    def fr_dump_events(self) -> list[dict]:
        return [e for r in range(self.a.ranks) for e in self.events(r) if e.get("ev") == "fr_dump"]

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
        self.stop_stress()
        return states

    def summarize(self, states: dict) -> dict:
        a = self.a
        ranks, issued, completed, comm_ids, nccl_ids = [], [], [], set(), set()
        for r in range(a.ranks):
            tr = read_events(self.out / "truth" / f"rank{r}.jsonl")
            inits = [e for e in tr if e.get("ev") == "init" and e.get("func") == "ncclCommInitRank"]
            comm = inits[0]["comm"] if inits else None
            if inits:
                comm_ids.add(inits[0]["comm_id_hash"])
                nccl_ids.add(inits[0]["nccl_comm_id"])
            enq = [e for e in tr if e.get("ev") == "enqueue" and e.get("comm") == comm]
            done = [e for e in tr if e.get("ev") == "complete" and e.get("comm") == comm]
            issued.append(len(enq))
            completed.append(sum(e.get("nops", 1) for e in done))
            evs = self.events(r)
            steps = [e for e in evs if e.get("ev") == "step"]
            exits = [e for e in evs if e.get("ev") == "exit"]
            p = self.ranks[r] if r < len(self.ranks) else None
            host = self.link_info(r) if (a.no_netns or self.lab) else {}
            ranks.append({
                "rank": r, "host": host.get("host"), "addr": host.get("addr"), "iface": host.get("iface"),
                "namespace": host.get("namespace"), "pid": p.pid if p else None,
                "exit_code": p.returncode if p else None, "state": states.get(r),
                "exit_ns": exits[-1]["t_ns"] if exits else None,
                "comm": comm, "ops_issued": len(enq), "ops_completed": completed[-1],
                "last_op_count_issued": max((e["opCount"] for e in enq), default=None),
                "steps_done": len(steps),
                "check_failures": sum(1 for e in steps if e.get("ok") is False),
                "nccl_log": f"logs/nccl-rank{r}.log", "pcap": None if (a.no_netns or a.no_pcap) else f"pcap/rank{r}.pcap",
                "flight_recorder": (f"fr/node{r}/nccl_trace_rank_{r}"
                                    if (self.out / "fr" / f"node{r}" / f"nccl_trace_rank_{r}").exists() else None),
                "errors": [e for e in tr if e.get("ev") == "error"][:5],
            })
        pcap_stats = {}
        for r in range(a.ranks):
            f = self.out / "logs" / f"tcpdump-rank{r}.err"
            if f.exists():
                pcap_stats[r] = f.read_text(errors="replace").strip().splitlines()[-3:]
        cap = None
        if self.captures is not None:
            c = self.captures
            cap = {"mode": "per-host", "start": a.capture_start, "offset_s": c.offset_s,
                   "stagger_s": list(c.stagger), "delays_s": c.delays_s, "duration_s": a.capture_duration_s,
                   "stop_spread_s": a.capture_stop_spread_s, "args": a.capture_args, "seed": a.seed, "base_ns": c.base_ns,
                   "gate_opened_ns": self.gate_opened_ns, "failed_ranks": c.failed(),
                   "job_stop": {"step": self.stop_step, "written_ns": self.stop_written_ns} if self.stop_mode else None}
        fr = None
        if a.flight_recorder:
            fr = {"buffer_size": a.fr_buffer_size, "timing": a.fr_timing, "dump_on_timeout": True,
                  "dump_files": "fr/node<r>/nccl_trace_rank_<r>",
                  "pipes": "fr/pipe_<r>.pipe (removed at the end)",
                  "requests": self.fr_requests, "dumps": self.fr_dump_events(),
                  "note": "collective_seq_id = opCount + 1 on the world communicator; times CLOCK_REALTIME ns"}
        return {
            "schema_version": 1,
            "scenario": a.scenario,
            "fault": self.fault,
            "world_size": a.ranks,
            "comm_id_hash": sorted(comm_ids)[0] if len(comm_ids) == 1 else sorted(comm_ids),
            "nccl_comm_id": sorted(nccl_ids)[0] if len(nccl_ids) == 1 else sorted(nccl_ids),
            "ranks": ranks,
            "ops_issued": issued,
            "ops_completed": completed,
            "started_ns": self.started_ns,
            "train_start_ns": self.train_t0,
            "onset_ns": self.onset_ns,
            "hold": {"requested_s": a.hold_s, "end_ns": self.hold_end_ns,
                     "watchdog_timeout_s": a.watchdog_timeout_s} if a.scenario in HOLDS else None,
            "ended_ns": self.ended_ns,
            "job_ended_ns": self.job_ended_ns,
            "netns": not a.no_netns,
            "subnet": None if a.no_netns else f"{netns.SUBNET}.0/24",
            "tcp": a.tcp,
            "stress": {"processes": a.stress, "pids": [p.pid for p in self.stress],
                       "where": "switch namespace" if not a.no_netns else "root namespace"} if a.stress else None,
            "capture": cap,
            "captures": self.captures.record() if self.captures is not None else [],
            "flight_recorder": fr,
            "config": {k: v for k, v in vars(a).items() if k not in ("out", "build")},
            "tcpdump": pcap_stats,
            "notes": self.notes,
        }

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
                    self.start_tcpdump()
            self.start_stress()
            self.start_ranks()
            if self.captures is not None and self.captures.mode == "before":
                self.start_captures_before()
            if a.fail_at == "running":
                self.train_start_ns()
                raise ScenarioError("injected failure while running (--fail-at running)")
            self.inject()
            self.wait_end()
            self.snapshot()
            rc = 0
        finally:
            if _SIGNALLED:
                self.notes.append(f"launcher got signal {_SIGNALLED[0]}: ended early, torn down")
            try:
                states = self.stop_all()
            finally:
                self.ended_ns = now_ns()
                if self.lab is not None and self.fault.get("kind") == "loss":
                    self.fault["nft_counters"] = self.lab.nft_counters()
                try:
                    exits = [e["t_ns"] for r in range(a.ranks) for e in self.events(r) if e.get("ev") == "exit"]
                    self.job_ended_ns = max(exits) if exits and len(exits) == len(self.ranks) else None
                    summary = self.summarize(states)
                    (self.out / "scenario.json").write_text(json.dumps(summary, indent=2) + "\n")
                finally:
                    if self.lab is not None:
                        self.lab.teardown()
                    self.stop_stress()
                    self.remove_fr_pipes()
        if rc == 0 and a.require_captures and self.captures is not None and self.captures.failed():
            print(f"launcher: capture(s) of rank(s) {self.captures.failed()} failed (see scenario.json captures)",
                  file=sys.stderr)
            rc = 1
        return rc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.lab.launcher",
                                 description="Run a stallscope lab scenario (root, except with --no-netns).")
    ap.add_argument("--scenario", choices=SCENARIOS, default="clean")
    ap.add_argument("--rank", type=int, default=1, help="the faulty rank")
    ap.add_argument("--ranks", type=int, default=4, help="world size (1..8)")
    ap.add_argument("--out", default=None, help="output folder (default out/lab-<scenario>)")
    ap.add_argument("--build", default=str(DEFAULT_BUILD), help="folder with sslab_rank and the libraries")
    ap.add_argument("--no-netns", action="store_true", help="run the ranks on loopback (no root; no network faults)")
    ap.add_argument("--no-pcap", action="store_true")
    ap.add_argument("--snaplen", type=int, default=128)
    ap.add_argument("--tcp", choices=("defaults", "lab"),
                    help="lab: quickack routes and no tail-loss probes in the rank namespaces (no retransmission "
                         "without a fault); defaults: Linux's own settings, as on a real host "
                         "(default: lab, or defaults with --capture per-host)")
    ap.add_argument("--no-quickack", dest="quickack", action="store_false",
                    help="same as --tcp defaults (kept for old command lines)")
    ap.add_argument("--stress", type=int, default=0,
                    help="N busy-loop processes at normal priority during the run (CPU contention)")
    ap.add_argument("--seed", type=int, help="seed of the random choices (capture stagger); recorded")
    ap.add_argument("--debug-subsys", default="INIT,COLL,NET")
    # training job
    ap.add_argument("--steps", type=int)
    ap.add_argument("--compute-ms", type=float)
    ap.add_argument("--buckets", help="comma-separated element counts of the gradient buckets")
    ap.add_argument("--dtype", help="float32, float16, bfloat16, int32, ...")
    ap.add_argument("--pattern", choices=("ddp", "fsdp", "mixed"))
    ap.add_argument("--buffsize", type=int, help="NCCL_BUFFSIZE (bytes per ring chunk)")
    ap.add_argument("--no-socket-ifname", dest="socket_ifname", action="store_false",
                    help="leave NCCL_SOCKET_IFNAME unset (a capture then finds the interface from the sockets)")
    ap.add_argument("--nchannels", type=int, help="NCCL_MIN_NCHANNELS (TCP connections per ring neighbour)")
    ap.add_argument("--watchdog-timeout-s", type=float,
                    help="the driver's collective timeout (torch's ProcessGroupNCCL timeout; default 600, raised "
                         "past the hold and the captures so that it cannot end a hang early)")
    # PyTorch Flight Recorder
    ap.add_argument("--no-flight-recorder", dest="flight_recorder", action="store_false",
                    help="do not set TORCH_NCCL_TRACE_BUFFER_SIZE & co. on the ranks")
    ap.add_argument("--fr-buffer-size", type=int, default=2000, help="TORCH_NCCL_TRACE_BUFFER_SIZE")
    ap.add_argument("--no-fr-timing", dest="fr_timing", action="store_false",
                    help="no TORCH_NCCL_ENABLE_TIMING: no entry is ever 'started', last_started_collective -1")
    ap.add_argument("--fr-dump-after-s", type=float,
                    help="write to every rank's FR pipe this long after the fault's onset (a dump each)")
    # faults
    ap.add_argument("--start-s", type=float, help="fault start, seconds after all ranks began training")
    ap.add_argument("--hold-s", type=float, help="hang/reset scenarios: seconds to keep the hang before ending")
    ap.add_argument("--loss-permille", type=int)
    ap.add_argument("--loss-min-bytes", type=int, default=0,
                    help="loss: drop only packets longer than this (0: any frame, like a bad cable)")
    ap.add_argument("--direction", choices=("both", "egress", "ingress"),
                    help="loss/slow-link: which direction of the rank's link (egress = what it sends)")
    ap.add_argument("--rate", help="slow-link: tc rate, e.g. 200mbit")
    ap.add_argument("--straggle-ms", type=float)
    ap.add_argument("--at-op", type=int,
                    help="mismatch-hang: index of the collective the rank skips; gpu-hang: the collective (opCount) "
                         "its stream hangs in")
    ap.add_argument("--skip-mode", choices=("stop", "continue"))
    ap.add_argument("--link-side", choices=("switch", "host"))
    ap.add_argument("--reset-method", choices=("nft",), default="nft")
    ap.add_argument("--reset-scope", choices=("connection", "peer"), default="connection",
                    help="reset: the busiest connection from the peer, or all of its connections")
    # per-host captures
    ap.add_argument("--capture", choices=("none", "per-host"), default="none",
                    help="per-host: one `stallscope capture` per rank inside its namespaces (host node<r>)")
    ap.add_argument("--capture-start", default="before",
                    help="before: attached before the job starts; onset+S: S seconds after the fault's onset")
    ap.add_argument("--capture-stagger-s", default="0-5",
                    help="successive hosts' captures start a random [A,B] s apart (seeded by --seed)")
    ap.add_argument("--capture-duration-s", type=float, default=15.0,
                    help="each capture gets a Ctrl-C this long after it said 'capturing:'")
    ap.add_argument("--capture-stop-spread-s", type=float,
                    help="the captures stop this far apart, in the order they began capturing, the first "
                         "--capture-duration-s after the last one began: a partial overlap that holds however "
                         "long each tracer takes to attach")
    ap.add_argument("--capture-args", default="",
                    help='extra capture arguments, shell-quoted (write --capture-args="--no-bpf")')
    ap.add_argument("--require-captures", action="store_true", help="exit 1 when a capture failed")
    ap.add_argument("--capture-start-timeout-s", type=float, default=120.0)
    ap.add_argument("--capture-stop-timeout-s", type=float, default=90.0)
    # selftest
    ap.add_argument("--selftest-dtypes", default="int8,uint8,int32,uint32,int64,uint64,float16,float32,float64,bfloat16")
    ap.add_argument("--selftest-count", type=int, default=1003)
    ap.add_argument("--selftest-large", type=int, default=70001)
    # limits and test hooks
    ap.add_argument("--init-timeout-s", type=float, default=60.0)
    ap.add_argument("--run-timeout-s", type=float, default=120.0,
                    help="non-hang scenarios: kill ranks still running this long after the job should have ended")
    ap.add_argument("--no-stacks", dest="stacks", action="store_false")
    ap.add_argument("--fail-at", choices=("setup", "running"), help="test hook: fail deliberately")
    a = ap.parse_args(argv)
    explicit = {k for k, v in vars(a).items() if v is not None}
    merged = dict(DEFAULTS["common"], **DEFAULTS[a.scenario])
    for k, v in merged.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    for k in ("loss_permille", "rate", "direction", "straggle_ms", "skip_mode", "link_side"):
        if getattr(a, k, None) is None:
            setattr(a, k, {"loss_permille": 20, "rate": "200mbit", "direction": "both", "straggle_ms": 250.0,
                           "skip_mode": "stop", "link_side": "switch"}[k])
    if a.out is None:
        a.out = f"out/lab-{a.scenario}"
    if not 1 <= a.ranks <= 8:
        ap.error("--ranks must be 1..8")
    if a.scenario not in ("clean", "selftest") and not 0 <= a.rank < a.ranks:
        ap.error("--rank must be a rank of the job")
    if not a.no_netns and os.geteuid() != 0:
        ap.error("network namespaces need root (or use --no-netns for loopback runs)")
    # gpu-hang: at an op count (default), or at the first collective after --start-s when only that is given
    a.hang_at = "time" if a.scenario == "gpu-hang" and "start_s" in explicit and "at_op" not in explicit else "op"
    if a.scenario in ("gpu-hang", "mismatch-hang") and a.at_op is not None and a.at_op < 1:
        ap.error("--at-op must be >= 1 (op 0 is the initial broadcast, before training starts)")
    try:
        parse_capture_start(a.capture_start)
        parse_stagger(a.capture_stagger_s)
        shlex.split(a.capture_args or "")
    except ValueError as e:
        ap.error(str(e))
    if a.capture_duration_s <= 0:
        ap.error("--capture-duration-s must be > 0")
    if a.capture_stop_spread_s is not None and a.capture_stop_spread_s < 0:
        ap.error("--capture-stop-spread-s must be >= 0")
    if a.stress < 0:
        ap.error("--stress must be >= 0")
    if a.tcp is None:
        a.tcp = "defaults" if (a.capture == "per-host" or not a.quickack) else "lab"
    elif a.tcp == "lab" and not a.quickack:
        ap.error("--no-quickack contradicts --tcp lab")
    a.quickack = a.tcp == "lab"
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(2 ** 31)
    # The driver's watchdog must not end a hang before --hold-s (nor while captures run):
    # by default it is set well past both. An explicit value is kept (the watchdog firing
    # during a hang is a scenario of its own), with a warning if it comes first.
    window = a.hold_s if a.scenario in HOLDS else 0.0
    if a.capture == "per-host":
        _, off = parse_capture_start(a.capture_start)
        window += off + parse_stagger(a.capture_stagger_s)[1] + a.capture_duration_s \
            + (a.ranks - 1) * (a.capture_stop_spread_s or 0.0) \
            + a.capture_start_timeout_s + a.capture_stop_timeout_s
    if a.watchdog_timeout_s is None:
        a.watchdog_timeout_s = max(600.0, float(int(window + 120)))
    elif a.scenario in HOLDS and a.watchdog_timeout_s <= a.hold_s:
        print(f"launcher: warning: --watchdog-timeout-s {a.watchdog_timeout_s:g} <= --hold-s {a.hold_s:g}: "
              "the ranks' watchdog ends the hang first", file=sys.stderr)
    return a


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
