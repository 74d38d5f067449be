"""What a lab run leaves besides the ranks' own output: the end state's evidence (ss, gdb
backtraces and thread states of hung ranks, taken before anything is killed) and the ground
truth, scenario.json (:func:`summarize`; its fields are described in README.md). Functions
over the :class:`~tests.lab.launcher.Run`.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from . import netns
from .faults import link_info
from .scenarios import HOLDS, read_events


def snapshot(run) -> None:
    """Evidence of the end state, taken before anything is killed."""
    if run.a.scenario in HOLDS:
        thread_states(run)
    if run.a.no_netns:
        return
    for h in run.lab.hosts:
        p = run.lab.exec(h.rank, ["ss", "-tinpe"], check=False)
        (run.out / "sys" / f"ss-rank{h.rank}.txt").write_text(p.stdout)
    if run.a.scenario in HOLDS and run.a.stacks and shutil.which("gdb"):
        (run.out / "stacks").mkdir(exist_ok=True)
        procs = []
        for r, p in enumerate(run.ranks):
            if p.poll() is None:
                f = open(run.out / "stacks" / f"rank{r}.txt", "w")
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


def thread_states(run) -> None:
    """Every thread of every live rank: name, state, wchan, syscall (from /proc; no ptrace)."""
    (run.out / "stacks").mkdir(exist_ok=True)
    for r, p in enumerate(run.ranks):
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
        (run.out / "stacks" / f"threads-rank{r}.json").write_text(json.dumps(rows, indent=1) + "\n")


def fr_dump_events(run) -> list[dict]:
    """The ranks' fr_dump events (each Flight Recorder dump they wrote)."""
    return [e for r in range(run.a.ranks) for e in run.events(r) if e.get("ev") == "fr_dump"]


def summarize(run, states: dict) -> dict:
    """scenario.json: the fault, each rank's record and end ``states`` (rank -> killed|exited),
    the captures' and the Flight Recorder's records, the configuration and the notes."""
    a = run.a
    ranks, issued, completed, comm_ids, nccl_ids = [], [], [], set(), set()
    for r in range(a.ranks):
        tr = read_events(run.out / "truth" / f"rank{r}.jsonl")
        inits = [e for e in tr if e.get("ev") == "init" and e.get("func") == "ncclCommInitRank"]
        comm = inits[0]["comm"] if inits else None
        if inits:
            comm_ids.add(inits[0]["comm_id_hash"])
            nccl_ids.add(inits[0]["nccl_comm_id"])
        enq = [e for e in tr if e.get("ev") == "enqueue" and e.get("comm") == comm]
        done = [e for e in tr if e.get("ev") == "complete" and e.get("comm") == comm]
        issued.append(len(enq))
        completed.append(sum(e.get("nops", 1) for e in done))
        evs = run.events(r)
        steps = [e for e in evs if e.get("ev") == "step"]
        exits = [e for e in evs if e.get("ev") == "exit"]
        p = run.ranks[r] if r < len(run.ranks) else None
        host = link_info(run, r) if (a.no_netns or run.lab) else {}
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
                                if (run.out / "fr" / f"node{r}" / f"nccl_trace_rank_{r}").exists() else None),
            "errors": [e for e in tr if e.get("ev") == "error"][:5],
        })
    pcap_stats = {}
    for r in range(a.ranks):
        f = run.out / "logs" / f"tcpdump-rank{r}.err"
        if f.exists():
            pcap_stats[r] = f.read_text(errors="replace").strip().splitlines()[-3:]
    cap = _capture_record(run)
    fr = _flight_recorder_record(run)
    return {
        "schema_version": 1,
        "scenario": a.scenario,
        "fault": run.fault,
        "world_size": a.ranks,
        "comm_id_hash": sorted(comm_ids)[0] if len(comm_ids) == 1 else sorted(comm_ids),
        "nccl_comm_id": sorted(nccl_ids)[0] if len(nccl_ids) == 1 else sorted(nccl_ids),
        "ranks": ranks,
        "ops_issued": issued,
        "ops_completed": completed,
        "started_ns": run.started_ns,
        "train_start_ns": run.train_t0,
        "onset_ns": run.onset_ns,
        "hold": {"requested_s": a.hold_s, "end_ns": run.hold_end_ns,
                 "watchdog_timeout_s": a.watchdog_timeout_s} if a.scenario in HOLDS else None,
        "ended_ns": run.ended_ns,
        "job_ended_ns": run.job_ended_ns,
        "operator_trigger_ns": run.operator_trigger_ns,
        "netns": not a.no_netns,
        "subnet": None if a.no_netns else f"{netns.SUBNET}.0/24",
        "tcp": a.tcp,
        "stress": {"processes": a.stress, "pids": [p.pid for p in run.stress],
                   "where": "switch namespace" if not a.no_netns else "root namespace"} if a.stress else None,
        "capture": cap,
        "captures": run.captures.record() if run.captures is not None else [],
        "flight_recorder": fr,
        "config": {k: v for k, v in vars(a).items() if k not in ("out", "build")},
        "tcpdump": pcap_stats,
        "notes": run.notes,
    }


def _capture_record(run) -> dict | None:
    """scenario.json ``capture``: how the per-host captures were scheduled (None without)."""
    a = run.a
    if run.captures is None:
        return None
    c = run.captures
    return {"mode": "per-host", "start": a.capture_start, "offset_s": c.offset_s,
            "stagger_s": list(c.stagger), "delays_s": c.delays_s, "duration_s": a.capture_duration_s,
            "stop_spread_s": a.capture_stop_spread_s, "args": a.capture_args, "seed": a.seed, "base_ns": c.base_ns,
            "gate_opened_ns": run.gate_opened_ns, "failed_ranks": c.failed(),
            "job_stop": {"step": run.stop_step, "written_ns": run.stop_written_ns} if run.stop_mode else None}


def _flight_recorder_record(run) -> dict | None:
    """scenario.json ``flight_recorder``: its settings, the dump requests and dumps (None without)."""
    a = run.a
    if not a.flight_recorder:
        return None
    return {"buffer_size": a.fr_buffer_size, "timing": a.fr_timing, "dump_on_timeout": True,
            "dump_files": "fr/node<r>/nccl_trace_rank_<r>",
            "pipes": "fr/pipe_<r>.pipe (removed at the end)",
            "requests": run.fr_requests, "dumps": fr_dump_events(run),
            "note": "collective_seq_id = opCount + 1 on the world communicator; times CLOCK_REALTIME ns"}
