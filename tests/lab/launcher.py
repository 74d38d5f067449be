"""Run one lab scenario: N ranks of the lab "training job" in N namespaces, one fault.

    python -m tests.lab.launcher --scenario loss --rank 2 --ranks 4 --out out/lab-loss
    python -m tests.lab.launcher --scenario selftest --ranks 4 --no-netns --out /tmp/st   (no root)

Writes into OUT:

    scenario.json            ground truth (see README.md)
    pcap/rank<r>.pcap        tcpdump on each rank's eth0, snaplen 128, ns timestamps
    logs/nccl-rank<r>.log    NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,COLL,NET (NCCL_DEBUG_FILE)
    logs/rank<r>.out|.err    rank driver output (JSON events, CHECK lines, watchdog lines)
    truth/rank<r>.jsonl      the lab libnccl's own record (init, enqueue, complete, error)
    sys/ss-rank<r>.txt       ss -tinpe in each namespace at the end (before anything is killed)
    stacks/rank<r>.txt       gdb backtraces of hung ranks (hang scenarios, when gdb exists)

Exit status: 0 when the scenario ran as designed (the fault, if any, was applied
and observed to start), 1 otherwise. Everything is torn down on every path.
"""
from __future__ import annotations

import argparse
import json
import os
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
DEFAULT_BUILD = LAB_DIR / "build"

SCENARIOS = ("clean", "loss", "slow-link", "straggler", "mismatch-hang", "link-down-hang", "reset", "selftest")
HANGS = ("mismatch-hang", "link-down-hang")

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
        self.fault: dict = {"kind": "none", "ranks": [], "link": None, "start_time_ns": None}
        self.notes: list[str] = []
        self.started_ns = now_ns()
        self.ended_ns = None

    # ---------------- setup ----------------
    def prepare_out(self) -> None:
        if self.out.exists():
            for sub in ("pcap", "logs", "truth", "sys", "stacks"):
                shutil.rmtree(self.out / sub, ignore_errors=True)
            (self.out / "scenario.json").unlink(missing_ok=True)
        for sub in ("logs", "truth"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)
        if not self.a.no_netns:
            (self.out / "sys").mkdir(exist_ok=True)
            if not self.a.no_pcap:
                (self.out / "pcap").mkdir(exist_ok=True)

    def rank_env(self, r: int, master_addr: str, master_port: int) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SSLAB_"))}
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
        if self.a.buffsize:
            env["NCCL_BUFFSIZE"] = str(self.a.buffsize)
        if self.a.nchannels:
            env["NCCL_MIN_NCHANNELS"] = str(self.a.nchannels)
        return env

    def driver_args(self, r: int) -> list[str]:
        a = self.a
        if a.scenario == "selftest":
            args = ["--mode", "selftest", "--selftest-dtypes", a.selftest_dtypes,
                    "--selftest-count", str(a.selftest_count), "--selftest-large", str(a.selftest_large)]
            return args
        args = ["--mode", "train", "--steps", str(a.steps), "--compute-ms", str(a.compute_ms),
                "--buckets", a.buckets, "--dtype", a.dtype, "--pattern", a.pattern,
                "--watchdog-timeout-s", str(a.watchdog_timeout_s)]
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

    # ---------------- observation ----------------
    def events(self, r: int) -> list[dict]:
        return read_events(self.out / "logs" / f"rank{r}.out")

    def wait_for(self, pred, timeout: float, what: str, poll: float = 0.02):
        deadline = time.monotonic() + timeout
        while True:
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
        return self.wait_for(all_started, self.a.init_timeout_s, "all ranks to start training")

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
        elif sc == "slow-link":
            self.sleep_until_ns(t0 + int(a.start_s * 1e9))
            self.fault["start_time_ns"] = now_ns()
            self.fault["link"] = self.link_info(r)
            self.fault.update(**self.lab.rate(r, a.rate, a.direction))
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
        elif sc == "reset":
            self.sleep_until_ns(t0 + int(a.start_s * 1e9))
            prev = (r - 1) % a.ranks
            self.fault["start_time_ns"] = now_ns()
            self.fault["link"] = self.link_info(r)
            self.fault.update(peer_rank=prev, reset_sent_to_rank=prev, method="nft-reject-tcp-reset",
                              connection=f"ring {prev} -> {r}", **self.lab.reset_from(r, prev, a.reset_scope))
        else:
            raise ScenarioError(f"unknown scenario {sc}")

    # ---------------- end of run ----------------
    def wait_end(self) -> None:
        a, sc = self.a, self.a.scenario
        if sc in HANGS or sc == "reset":
            # reset: the rank that got the RST fails and exits; peers of a half-open
            # connection may hang instead (as in real jobs): bounded by hold_s too.
            end = self.fault["start_time_ns"] + int(a.hold_s * 1e9)
            while now_ns() < end:
                if all(p.poll() is not None for p in self.ranks):
                    break
                time.sleep(0.05)
            return
        deadline = time.monotonic() + a.run_timeout_s
        while any(p.poll() is None for p in self.ranks):
            if time.monotonic() > deadline:
                self.notes.append(f"run timeout {a.run_timeout_s}s: ranks still running were killed")
                return
            time.sleep(0.05)

    def snapshot(self) -> None:
        """Evidence of the end state, taken before anything is killed."""
        if self.a.no_netns:
            return
        for h in self.lab.hosts:
            p = self.lab.exec(h.rank, ["ss", "-tinpe"], check=False)
            (self.out / "sys" / f"ss-rank{h.rank}.txt").write_text(p.stdout)
        if self.a.scenario in HANGS + ("reset",) and self.a.stacks and shutil.which("gdb"):
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

    def stop_all(self) -> dict:
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
            p = self.ranks[r] if r < len(self.ranks) else None
            host = self.link_info(r) if (a.no_netns or self.lab) else {}
            ranks.append({
                "rank": r, "host": host.get("host"), "addr": host.get("addr"), "iface": host.get("iface"),
                "namespace": host.get("namespace"), "pid": p.pid if p else None,
                "exit_code": p.returncode if p else None, "state": states.get(r),
                "comm": comm, "ops_issued": len(enq), "ops_completed": completed[-1],
                "last_op_count_issued": max((e["opCount"] for e in enq), default=None),
                "steps_done": len(steps),
                "check_failures": sum(1 for e in steps if e.get("ok") is False),
                "nccl_log": f"logs/nccl-rank{r}.log", "pcap": None if (a.no_netns or a.no_pcap) else f"pcap/rank{r}.pcap",
                "errors": [e for e in tr if e.get("ev") == "error"][:5],
            })
        pcap_stats = {}
        for r in range(a.ranks):
            f = self.out / "logs" / f"tcpdump-rank{r}.err"
            if f.exists():
                pcap_stats[r] = f.read_text(errors="replace").strip().splitlines()[-3:]
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
            "ended_ns": self.ended_ns,
            "netns": not a.no_netns,
            "subnet": None if a.no_netns else f"{netns.SUBNET}.0/24",
            "config": {k: v for k, v in vars(a).items() if k not in ("out", "build")},
            "tcpdump": pcap_stats,
            "notes": self.notes,
        }

    def execute(self) -> int:
        a = self.a
        if not self.driver.exists():
            raise ScenarioError(f"{self.driver} missing: run `make -C tests/lab` first")
        self.prepare_out()
        rc = 1
        states: dict = {}
        try:
            if not a.no_netns:
                netns.sweep()
                self.lab = netns.Lab(a.ranks, quickack=a.quickack).__enter__()
                if a.fail_at == "setup":
                    raise ScenarioError("injected failure after setup (--fail-at setup)")
                if not a.no_pcap:
                    self.start_tcpdump()
            self.start_ranks()
            if a.fail_at == "running":
                self.train_start_ns()
                raise ScenarioError("injected failure while running (--fail-at running)")
            self.inject()
            self.wait_end()
            self.snapshot()
            rc = 0
        finally:
            states = self.stop_all()
            self.ended_ns = now_ns()
            if self.lab is not None and self.fault.get("kind") == "loss":
                self.fault["nft_counters"] = self.lab.nft_counters()
            try:
                summary = self.summarize(states)
                (self.out / "scenario.json").write_text(json.dumps(summary, indent=2) + "\n")
            finally:
                if self.lab is not None:
                    self.lab.teardown()
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
    ap.add_argument("--no-quickack", dest="quickack", action="store_false",
                    help="keep delayed ACKs on the lab routes (expect tail-loss probes without any fault)")
    ap.add_argument("--debug-subsys", default="INIT,COLL,NET")
    # training job
    ap.add_argument("--steps", type=int)
    ap.add_argument("--compute-ms", type=float)
    ap.add_argument("--buckets", help="comma-separated element counts of the gradient buckets")
    ap.add_argument("--dtype", help="float32, float16, bfloat16, int32, ...")
    ap.add_argument("--pattern", choices=("ddp", "fsdp", "mixed"))
    ap.add_argument("--buffsize", type=int, help="NCCL_BUFFSIZE (bytes per ring chunk)")
    ap.add_argument("--nchannels", type=int, help="NCCL_MIN_NCHANNELS (TCP connections per ring neighbour)")
    ap.add_argument("--watchdog-timeout-s", type=float, default=600.0)
    # faults
    ap.add_argument("--start-s", type=float, help="fault start, seconds after all ranks began training")
    ap.add_argument("--hold-s", type=float, help="hang scenarios: seconds to keep the hang before ending")
    ap.add_argument("--loss-permille", type=int)
    ap.add_argument("--loss-min-bytes", type=int, default=0,
                    help="loss: drop only packets longer than this (0: any frame, like a bad cable)")
    ap.add_argument("--direction", choices=("both", "egress", "ingress"),
                    help="loss/slow-link: which direction of the rank's link (egress = what it sends)")
    ap.add_argument("--rate", help="slow-link: tc rate, e.g. 200mbit")
    ap.add_argument("--straggle-ms", type=float)
    ap.add_argument("--at-op", type=int, help="mismatch-hang: index of the collective the rank skips")
    ap.add_argument("--skip-mode", choices=("stop", "continue"))
    ap.add_argument("--link-side", choices=("switch", "host"))
    ap.add_argument("--reset-method", choices=("nft",), default="nft")
    ap.add_argument("--reset-scope", choices=("connection", "peer"), default="connection",
                    help="reset: the busiest connection from the peer, or all of its connections")
    # selftest
    ap.add_argument("--selftest-dtypes", default="int8,uint8,int32,uint32,int64,uint64,float16,float32,float64,bfloat16")
    ap.add_argument("--selftest-count", type=int, default=1003)
    ap.add_argument("--selftest-large", type=int, default=70001)
    # limits and test hooks
    ap.add_argument("--init-timeout-s", type=float, default=60.0)
    ap.add_argument("--run-timeout-s", type=float, default=120.0)
    ap.add_argument("--no-stacks", dest="stacks", action="store_false")
    ap.add_argument("--fail-at", choices=("setup", "running"), help="test hook: fail deliberately")
    a = ap.parse_args(argv)
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
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)

    def on_signal(signum, frame):  # turn SIGTERM/SIGHUP into a normal unwind (teardown runs)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
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
