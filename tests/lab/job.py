"""The lab job's processes: each rank's environment and driver arguments, starting the ranks
(in their namespaces, or on loopback with --no-netns), tcpdump on each rank's link, and the
CPU-stress loops. Functions over the :class:`~tests.lab.launcher.Run`, which owns every
process they start (``run.ranks``, ``run.tcpdumps``, ``run.stress``) and tears them down.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from . import netns
from .scenarios import ScenarioError


def free_port() -> int:
    """A TCP port free on loopback now (the rendezvous port of a --no-netns run)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pid_exe(pid: int) -> str | None:
    """The executable a process runs (None once it is gone)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def rank_env(run, r: int, master_addr: str, master_port: int) -> dict:
    """Rank ``r``'s environment: torchrun's variables, NCCL_DEBUG into logs/, the truth file,
    the Flight Recorder's settings, and the fault's trigger on the faulty rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SSLAB_", "TORCH_"))}
    env.update(
        RANK=str(r), LOCAL_RANK="0" if not run.a.no_netns else str(r), WORLD_SIZE=str(run.a.ranks),
        LOCAL_WORLD_SIZE="1" if not run.a.no_netns else str(run.a.ranks),
        GROUP_RANK=str(r) if not run.a.no_netns else "0", ROLE_RANK=str(r),
        MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
        NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS=run.a.debug_subsys,
        NCCL_DEBUG_FILE=str(run.out / "logs" / f"nccl-rank{r}.log"),
        NCCL_SOCKET_IFNAME="lo" if run.a.no_netns else "eth0", NCCL_IB_DISABLE="1",
        SSLAB_TRUTH_FILE=str(run.out / "truth" / f"rank{r}.jsonl"),
    )
    if not run.a.socket_ifname and not run.a.no_netns:
        del env["NCCL_SOCKET_IFNAME"]     # NCCL picks the first non-loopback interface itself
    if run.a.buffsize:
        env["NCCL_BUFFSIZE"] = str(run.a.buffsize)
    if run.a.nchannels:
        env["NCCL_MIN_NCHANNELS"] = str(run.a.nchannels)
    if run.a.flight_recorder:
        # PyTorch's Flight Recorder, as a job sets it up for on-call dumps (see README.md)
        env.update(TORCH_NCCL_TRACE_BUFFER_SIZE=str(run.a.fr_buffer_size), TORCH_NCCL_DUMP_ON_TIMEOUT="1",
                   TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(run.out / "fr" / f"node{r}" / "nccl_trace_rank_"),
                   TORCH_NCCL_DEBUG_INFO_PIPE_FILE=str(run.out / "fr" / "pipe_"))
        if run.a.fr_timing:
            env["TORCH_NCCL_ENABLE_TIMING"] = "1"
    if run.a.scenario == "gpu-hang" and r in run.fault_ranks():
        # only on the faulty rank: the library stays NCCL-ABI clean everywhere else
        if run.a.hang_at == "time":
            env["SSLAB_GPU_HANG_TRIGGER"] = str(run.gpu_trigger)
        else:
            env["SSLAB_GPU_HANG_AT_OP"] = str(run.at_op())
    if run.a.scenario == "init-hang" and r in run.fault_ranks():
        env["SSLAB_INIT_HANG"] = "1"
    if run.a.scenario == "init-hang-dropped" and r in run.fault_ranks():
        env["SSLAB_INIT_DELAY_MS"] = str(run.a.init_delay_ms)
    return env


def driver_args(run, r: int) -> list[str]:
    """Rank ``r``'s sslab_rank arguments: the training job (or the selftest) and its fault."""
    a = run.a
    if a.scenario == "selftest":
        args = ["--mode", "selftest", "--selftest-dtypes", a.selftest_dtypes,
                "--selftest-count", str(a.selftest_count), "--selftest-large", str(a.selftest_large)]
        return args
    args = ["--mode", "train", "--steps", str(10 ** 9 if run.stop_mode else a.steps),
            "--compute-ms", str(a.compute_ms), "--buckets", a.buckets, "--dtype", a.dtype, "--pattern", a.pattern,
            "--watchdog-timeout-s", str(a.watchdog_timeout_s)]
    if run.gate_file is not None:
        args += ["--gate-file", str(run.gate_file)]
    if run.stop_file is not None:
        args += ["--stop-file", str(run.stop_file)]
    if a.scenario == "straggler" and r in run.fault_ranks():
        args += ["--straggle-ms", str(a.straggle_ms), "--straggle-from-s", str(a.start_s)]
    if a.scenario == "cpu-starved":    # every rank's compute is CPU work: the quota stretches rank r's
        args += ["--compute-busy"]
    if a.scenario == "slow-checkpoint" and r in run.fault_ranks():
        args += ["--pause-s", str(a.hold_s), "--pause-from-s", str(a.start_s)]
    if a.scenario == "host-stuck" and r in run.fault_ranks():
        args += ["--stuck-mode", a.stuck_mode, "--stuck-s", str(a.stuck_s)]
        # default: the first collective of step 3 (a burst's first: every earlier one synchronized)
        op = a.at_op if a.at_op is not None else 1 + 3 * run.ops_per_step()
        args += ["--stuck-from-s", str(a.start_s)] if a.hang_at == "time" else ["--stuck-at-op", str(op)]
    if a.scenario == "mismatch-hang" and r in run.fault_ranks():
        args += ["--skip-op", str(run.at_op()), "--skip-mode", a.skip_mode]
    return args


def start_tcpdump(run) -> None:
    """tcpdump on each rank's link (pcap/rank<r>.pcap), returning once each is listening."""
    assert run.lab
    for h in run.lab.hosts:
        f = run.out / "pcap" / f"rank{h.rank}.pcap"
        err = open(run.out / "logs" / f"tcpdump-rank{h.rank}.err", "w")
        p = run.lab.popen(h.rank, ["tcpdump", "-i", h.iface, "-s", str(run.a.snaplen),
                                    "--time-stamp-precision=nano", "--immediate-mode", "-U", "-n",
                                    "-w", str(f)],
                           hostname=False, stdout=subprocess.DEVNULL, stderr=err)
        run.tcpdumps.append(p)
    deadline = time.monotonic() + 10
    for h in run.lab.hosts:
        errf = run.out / "logs" / f"tcpdump-rank{h.rank}.err"
        while "listening on" not in errf.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise ScenarioError(f"tcpdump in rank {h.rank} did not start: {errf.read_text()}")
            time.sleep(0.05)


def start_ranks(run) -> None:
    """Start every rank's driver (its output in logs/rank<r>.out|.err)."""
    a = run.a
    if a.no_netns:
        master_addr, master_port = "127.0.0.1", free_port()
    else:
        assert run.lab
        master_addr, master_port = run.lab.hosts[0].addr, netns.MASTER_PORT
    for r in range(a.ranks):
        env = rank_env(run, r, master_addr, master_port)
        out = open(run.out / "logs" / f"rank{r}.out", "w")
        err = open(run.out / "logs" / f"rank{r}.err", "w")
        argv = [str(run.driver)] + driver_args(run, r)
        if a.no_netns:
            p = subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True)
        else:
            p = run.lab.popen(r, argv, env=env, stdout=out, stderr=err, start_new_session=True)
        run.ranks.append(p)


def wait_ranks_exec(run, timeout: float = 30) -> None:
    """Every rank's pid is the driver itself (ip netns exec/unshare/sh have exec'd): its
    namespaces and host name are the rank's, so captures can enter them. A rank seen so once
    (``run.execed``) is not asked again: a fault may have killed it since (rank-killed before a
    capture started during the hang), which is no failure to start."""
    want = os.path.realpath(run.driver)
    deadline = time.monotonic() + timeout
    for r, p in enumerate(run.ranks):
        if r in run.execed:
            continue
        while pid_exe(p.pid) != want:
            if p.poll() is not None:
                raise ScenarioError(f"rank {r} exited at start (rc {p.returncode}): see logs/rank{r}.err")
            if time.monotonic() > deadline:
                raise ScenarioError(f"rank {r} (pid {p.pid}) did not start {run.driver.name}")
            time.sleep(0.01)
        run.execed.add(r)


def start_stress(run) -> None:
    """CPU contention: N busy loops at normal priority (in the switch namespace, so a
    sweep finds them too), started before the job, killed at teardown."""
    for _ in range(run.a.stress):
        argv = ["sh", "-c", "while :; do :; done"]
        if run.lab is not None:
            argv = ["ip", "netns", "exec", run.lab.switch] + argv
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        run.stress.append(p)
        if run.lab is not None:
            run.lab.track(p)


def stop_stress(run) -> None:
    """Kill the stress loops and reap them."""
    for p in run.stress:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in run.stress:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
