"""The lab's faults of issue 44 that are not a lossy or slow link: a rank killed mid-collective
(``rank-killed``), a link that goes down for seconds and comes back (``link-flap``), a rank
starved of CPU by its cgroup's quota (``cpu-starved``), a rank stuck in host code before its next
collective (``host-stuck``). Functions over the
:class:`~tests.lab.launcher.Run`, rows of :data:`.faults.FAULTS`: each waits for the fault's
start, applies it and fills ``run.fault`` (``kind``, ``ranks``, ``link``, ``start_time_ns`` and
the kind's own fields, README.md "Scenarios and knobs"); what must be undone at teardown (the
cgroup) goes into ``run.cleanups``, which the launcher calls after the ranks are gone.
"""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from . import job
from .scenarios import ScenarioError, now_ns, quota_fraction, read_events

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000


def _world_ops(run, r: int) -> tuple[list[dict], list[dict]]:
    """Rank r's enqueue and complete records on the world communicator (its truth file)."""
    evs = read_events(run.out / "truth" / f"rank{r}.jsonl")
    comm = next((e["comm"] for e in evs if e.get("ev") == "init" and e.get("func") == "ncclCommInitRank"), None)
    enq = [e for e in evs if e.get("ev") == "enqueue" and e.get("comm") == comm]
    done = [e for e in evs if e.get("ev") == "complete" and e.get("comm") == comm]
    return enq, done


def agent_log(host: str, rank: int, pid: int, code: int, t_ns: int) -> str:
    """What torchrun's agent on ``host`` prints when its only worker (global ``rank``, local
    rank 0) died with ``code`` (a negative signal number): its ERROR line and the
    ChildFailedError summary (torch 2.x wording; local time, the lab's is UTC)."""
    t = time.gmtime(t_ns / 1e9)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", t) + f",{(t_ns // 1_000_000) % 1000:03d}"
    if code < 0:
        sig = signal.Signals(-code).name
        tb = f"Signal {-code} ({sig}) received by PID {pid}"
    else:
        tb = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    return (f"[{stamp}] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: {code}) "
            f"local_rank: 0 (pid: {pid}) of binary: /usr/bin/python3\n"
            "Traceback (most recent call last):\n"
            '  File "/usr/local/bin/torchrun", line 8, in <module>\n'
            "    sys.exit(main())\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "============================================================\n"
            "train.py FAILED\n"
            "------------------------------------------------------------\n"
            "Failures:\n"
            "  <NO_OTHER_FAILURES>\n"
            "------------------------------------------------------------\n"
            "Root Cause (first observed failure):\n"
            "[0]:\n"
            f"  time      : {time.strftime('%Y-%m-%d_%H:%M:%S', t)}\n"
            f"  host      : {host}\n"
            f"  rank      : {rank} (local_rank: 0)\n"
            f"  exitcode  : {code} (pid: {pid})\n"
            "  error_file: <N/A>\n"
            f"  traceback : {tb}\n"
            "============================================================\n")


def rank_killed(run, r: int, t0: int) -> None:
    """Rank r's process gets --kill-signal (KILL, or SEGV: a crash) while a collective is in
    flight: once it enqueued collective #--at-op, else --start-s after training began (then
    the next moment, within 2 s, it has one in flight: it is stopped, checked and let go again
    until it has; ``mid_collective`` is the state it was killed in). Its host's torchrun agent reports
    the death (``logs/torchrun-node<r>.log``); the peers are left to fail or hang."""
    a = run.a
    job.wait_ranks_exec(run)
    p = run.ranks[r]
    if a.at_op is not None:
        run.wait_for(lambda: any(e["opCount"] >= a.at_op for e in _world_ops(run, r)[0]), 60,
                     f"rank {r} to enqueue collective #{a.at_op}", poll=0.001)
    else:
        run.sleep_until_ns(t0 + int(a.start_s * 1e9))
    mid = _stop_in_flight(run, r, p.pid, 2.0)
    sig = getattr(signal, f"SIG{a.kill_signal}")
    t_kill = now_ns()
    os.kill(p.pid, sig)
    os.kill(p.pid, signal.SIGCONT)           # a stopped process takes a SIGSEGV once it runs
    code = p.wait(timeout=30)
    enq, done = _world_ops(run, r)
    host = faults.link_info(run, r)["host"]
    (run.out / "logs" / f"torchrun-node{r}.log").write_text(agent_log(host, r, p.pid, code, now_ns()))
    run.fault.update(
        start_time_ns=t_kill, link=faults.link_info(run, r), signal=f"SIG{a.kill_signal}", pid=p.pid, exit_code=code,
        mid_collective=mid, trigger="op" if a.at_op is not None else "time",
        op_index=max((e["opCount"] for e in enq), default=None),
        last_completed_op=max((e["opCount"] for e in done), default=None),
        agent_log=f"logs/torchrun-node{r}.log",
        note="rank r's process was killed from outside while op_index (opCount on the world communicator) was "
             "in flight; its peers then see closed connections (NCCL WARN, watchdog error) or wait on it")


def _stop_in_flight(run, r: int, pid: int, within_s: float) -> bool:
    """Stop rank r's process (SIGSTOP) at a moment it has a collective in flight, trying for
    ``within_s`` seconds; whether it has. Its truth file is read while it is stopped, so the
    answer is the state it is killed in (a check while it runs was a few ms old by the kill,
    and on a loaded machine the collective had completed in between). It is left stopped."""
    deadline = time.monotonic() + within_s
    while True:
        os.kill(pid, signal.SIGSTOP)
        _wait_stopped(pid)
        if faults.truth_inflight(run, r) or time.monotonic() >= deadline:
            return faults.truth_inflight(run, r)
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.001)


def _wait_stopped(pid: int, timeout_s: float = 1.0) -> None:
    """Until every thread of ``pid`` is stopped (state T), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            states = [Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                      for t in os.listdir(f"/proc/{pid}/task")]
        except (OSError, IndexError):
            return                       # gone, or a thread gone meanwhile: nothing left to wait for
        if all(st in ("T", "t") for st in states):
            return
        time.sleep(0.0005)


def _last_complete_after(run, t_ns: int) -> dict[int, int]:
    """Per rank, its first collective completion after ``t_ns`` (ranks without one left out)."""
    out = {}
    for q in range(run.a.ranks):
        later = [e["t_ns"] for e in _world_ops(run, q)[1] if e["t_ns"] > t_ns]
        if later:
            out[q] = min(later)
    return out


def link_flap(run, r: int, t0: int) -> None:
    """Switch port p<r> down --down-s, then up, --flaps times --up-s apart, from --start-s
    after training began; then whether the job recovered: every rank completed a collective
    after the last up, before the hold's end (``recovered``, ``recovered_ns``)."""
    a = run.a
    total = a.flaps * a.down_s + (a.flaps - 1) * a.up_s
    if a.hold_s < total + 2:
        raise ScenarioError(f"--hold-s {a.hold_s:g} must cover the flaps ({total:g} s) and 2 s more")
    side = a.link_side
    run.sleep_until_ns(t0 + int(a.start_s * 1e9))
    run.fault["link"] = faults.link_info(run, r)
    flaps = []
    for i in range(a.flaps):
        if i:
            run.sleep_until_ns(flaps[-1]["up_ns"] + int(a.up_s * 1e9))
        mid = faults.truth_inflight(run, r)
        run.lab.link_down(r, side)
        down = now_ns()
        if not flaps:
            run.fault["start_time_ns"] = down
        run.sleep_until_ns(down + int(a.down_s * 1e9))
        run.lab.link_up(r, side)
        flaps.append({"down_ns": down, "up_ns": now_ns(), "mid_collective": mid})
    last_up = flaps[-1]["up_ns"]
    hold_end = run.fault["start_time_ns"] + int(a.hold_s * 1e9)
    after: dict[int, int] = {}
    while now_ns() < hold_end - int(1e9):
        run.tick()
        after = _last_complete_after(run, last_up)
        if len(after) == a.ranks:
            break
        time.sleep(0.05)
    recovered = len(after) == a.ranks
    run.fault.update(
        side=side, switch_port=run.lab.hosts[r].port, down_s=a.down_s, up_s=a.up_s, flap_count=a.flaps,
        flaps=flaps, end_time_ns=last_up, recovered=recovered,
        recovered_ns=max(after.values()) if recovered else None,
        note="the link went down and came back up (flaps: each down and up time); recovered: every rank "
             "completed a collective after the last up before the hold ended (else the job hung)")


def _cgroup_dir(run, r: int) -> tuple[Path, str]:
    """A new cgroup for rank r, and its version: v2 where the unified hierarchy has the cpu
    controller, else v1's cpu hierarchy."""
    name = f"sslab-{os.getpid()}-r{r}"
    ctl = CGROUP_ROOT / "cgroup.controllers"
    if ctl.exists() and "cpu" in ctl.read_text().split():
        sub = CGROUP_ROOT / "cgroup.subtree_control"
        if "cpu" not in sub.read_text().split():
            sub.write_text("+cpu")
        return CGROUP_ROOT / name, "v2"
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return CGROUP_ROOT / "cpu" / name, "v1"
    raise ScenarioError("cpu-starved needs a cgroup cpu controller (cgroup v2 cpu.max or v1 cpu.cfs_quota_us)")


def cpu_stat(d: Path) -> dict[str, int]:
    """The cgroup's cpu.stat (nr_periods, nr_throttled, throttled_time/throttled_usec, ...)."""
    out = {}
    for line in (d / "cpu.stat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def cpu_starved(run, r: int, t0: int) -> None:
    """Rank r's process moves into a cgroup of its own whose CPU quota is --cpu-quota of one
    CPU, --start-s after training began (every rank's compute is CPU work here). At teardown
    the cgroup's cpu.stat (throttling) goes into the truth and the cgroup is removed."""
    a = run.a
    q = quota_fraction(a.cpu_quota)
    job.wait_ranks_exec(run)
    run.sleep_until_ns(t0 + int(a.start_s * 1e9))
    d, version = _cgroup_dir(run, r)
    d.mkdir(exist_ok=True)
    quota_us = max(1000, int(q * CPU_PERIOD_US))
    if version == "v2":
        (d / "cpu.max").write_text(f"{quota_us} {CPU_PERIOD_US}")
    else:
        (d / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (d / "cpu.cfs_quota_us").write_text(str(quota_us))

    def undo() -> None:
        try:
            run.fault["cpu_stat"] = cpu_stat(d)
        except OSError:
            pass
        parent = d.parent / "cgroup.procs"
        for pid in (d / "cgroup.procs").read_text().split() if d.exists() else []:
            try:
                parent.write_text(pid)
            except OSError:
                pass
        for _ in range(50):
            try:
                d.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
    run.cleanups.append(undo)
    pid = run.ranks[r].pid
    (d / "cgroup.procs").write_text(str(pid))     # every thread of the process moves with it
    run.fault.update(start_time_ns=now_ns(), cgroup=str(d), cgroup_version=version, pid=pid,
                     cpu_quota=q, quota_us=quota_us, period_us=CPU_PERIOD_US,
                     host=socket.gethostname() if a.no_netns else run.lab.hosts[r].hostname,
                     compute="busy", compute_ms=a.compute_ms,
                     note="rank r's process (all its threads) runs under a CPU quota of cpu_quota of one CPU "
                          "from start_time_ns; every rank's compute is CPU work, so rank r enters its "
                          "collectives late: a straggler whose cause is the host's CPU, not the GPU or network")


def host_stuck(run, r: int, t0: int) -> None:
    """Rank r stops before enqueuing a collective and stays in host code (the driver does it:
    --stuck-mode spin or block, before collective #--at-op or the first one after --start-s):
    its ``host_stuck`` event is the onset (set at once: captures scheduled from the onset start
    during the stall). Then which ranks enqueued that collective (its peers, who wait inside it;
    rank r must not be among them)."""
    a = run.a
    what = f"rank {r} to get stuck in host code before a collective"
    ev = run.wait_for(lambda: next((e for e in run.events(r) if e.get("ev") == "host_stuck"), None),
                      (a.start_s if a.hang_at == "time" else 0.0) + 60, what)
    run.onset_ns = ev["t_ns"]
    n = ev["op_index"]

    def entered() -> list[int] | None:   # every other rank enqueued #n
        got = [q for q in range(a.ranks) if any(e["opCount"] == n for e in _world_ops(run, q)[0])]
        return got if len(got) >= a.ranks - 1 and r not in got else None
    try:
        peers = run.wait_for(entered, 10, f"the other ranks to enter collective #{n}")
    except ScenarioError:
        peers = [q for q in range(a.ranks) if any(e["opCount"] == n for e in _world_ops(run, q)[0])]
    enq, done = _world_ops(run, r)
    if any(e["opCount"] >= n for e in enq):
        raise ScenarioError(f"rank {r} enqueued collective #{n} although stuck before it")
    spin = ev["mode"] == "spin"
    run.fault.update(
        start_time_ns=ev["t_ns"], op_index=n, opCount=n, collective_seq_id=n + 1, op=ev["op"], step=ev["step"],
        mode=ev["mode"], trigger=a.hang_at, stuck_s=a.stuck_s if a.stuck_s > 0 else None,
        ranks_entered=sorted(peers), mid_collective=False,
        last_enqueued_op=max((e["opCount"] for e in enq), default=None),
        last_completed_op=max((e["opCount"] for e in done), default=None),
        stuck_thread={"tid": ev["tid"], "name": "sslab_rank", "function": ev["function"], "syscall": ev["syscall"],
                      "on_cpu": spin},
        note="rank r never enqueued collective op_index (opCount on the world communicator; torch's "
             "collective_seq_id = opCount + 1): its main thread stays in host code, on a CPU in host_busy_loop "
             "(mode spin) or blocked in read(2) of a pipe nobody writes in host_blocked_read (mode block), for "
             "stuck_s (null: until the hold ended the run); ranks_entered enqueued it and wait inside it")


# last: faults.py's table imports this module's functions, and they use its link_info and
# truth_inflight (either module may be imported first)
from . import faults  # noqa: E402
