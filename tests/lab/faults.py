"""The lab's faults: each scenario's injection, in one table (:data:`FAULTS`), and what the
scenario.json ``fault`` record says of it. Functions over the
:class:`~tests.lab.launcher.Run`: they wait for the fault's start (a time after training began,
or an event the ranks log), apply it through the lab's namespaces (:mod:`.netns`) or observe
the driver apply it, and fill ``run.fault``; ``run.onset_ns`` is then the fault's start.
"""
from __future__ import annotations

import socket
import time

from . import netns

from .scenarios import INIT_HANGS, ScenarioError, now_ns, read_events

NETWORK_FAULTS = ("loss", "slow-link", "link-down-hang", "reset", "link-flap",
                  "init-hang-dropped")   # need the lab's namespaces


def link_info(run, r: int) -> dict:
    """Rank ``r``'s link: its host, interface and address (and namespace and switch port)."""
    if run.a.no_netns:
        return {"rank": r, "host": socket.gethostname(), "iface": "lo", "addr": "127.0.0.1"}
    h = run.lab.hosts[r]
    return {"rank": r, "host": h.hostname, "iface": h.iface, "addr": h.addr, "namespace": h.ns,
            "switch_port": h.port, "switch_namespace": run.lab.switch}


def truth_inflight(run, r: int) -> bool:
    """A collective is enqueued on rank r and not complete (per its truth file)."""
    evs = read_events(run.out / "truth" / f"rank{r}.jsonl")
    world = [e for e in evs if e.get("ev") == "init" and e.get("func") == "ncclCommInitRank"]
    if not world:
        return False
    comm = world[0]["comm"]
    enq = [e["opCount"] for e in evs if e.get("ev") == "enqueue" and e.get("comm") == comm]
    done = [e["opCount"] for e in evs if e.get("ev") == "complete" and e.get("comm") == comm]
    return bool(enq) and (not done or max(enq) > max(done))


def inject(run) -> None:
    """Apply the scenario's fault (:data:`FAULTS`) to rank --rank once the job trains, and
    record it in ``run.fault``; without a fault, the onset is when training began."""
    a, sc = run.a, run.a.scenario
    if sc in ("clean", "selftest"):
        run.fault = {"kind": "none", "ranks": [], "link": None, "start_time_ns": None}
        if run.captures is not None or a.fr_dump_after_s is not None or a.operator_trigger:
            run.onset_ns = run.train_start_ns()   # no fault: "onset" is when training began
        return
    if sc in NETWORK_FAULTS and a.no_netns:
        raise ScenarioError(f"scenario {sc} needs network namespaces (drop --no-netns)")
    t0 = None if sc in INIT_HANGS else run.train_start_ns()    # an init hang never trains
    run.fault = {"kind": sc, "ranks": [a.rank], "link": None, "start_time_ns": None}
    apply = FAULTS.get(sc)
    if apply is None:
        raise ScenarioError(f"unknown scenario {sc}")
    apply(run, a.rank, t0)
    run.onset_ns = run.fault["start_time_ns"]


def _loss(run, r: int, t0: int) -> None:
    """Packet loss on rank r's link (nft rules), --start-s after training began."""
    a = run.a
    run.sleep_until_ns(t0 + int(a.start_s * 1e9))
    run.fault["start_time_ns"] = now_ns()
    run.fault["link"] = link_info(run, r)
    run.fault.update(permille=a.loss_permille, probability=a.loss_permille / 1000.0,
                     **run.lab.loss(r, a.loss_permille, a.direction, a.loss_min_bytes))
    run.fault["applied_ns"] = now_ns()   # the nft rules are in


def _slow_link(run, r: int, t0: int) -> None:
    """A rate limit on rank r's link (tc), --start-s after training began."""
    a = run.a
    run.sleep_until_ns(t0 + int(a.start_s * 1e9))
    run.fault["start_time_ns"] = now_ns()
    run.fault["link"] = link_info(run, r)
    run.fault.update(**run.lab.rate(r, a.rate, a.direction))
    run.fault["applied_ns"] = now_ns()   # both tc qdiscs are in


def _straggler(run, r: int, t0: int) -> None:
    """Rank r computes longer each step (the driver does it): its first straggle event."""
    a = run.a
    ev = run.wait_for(lambda: [e for e in run.events(r) if e.get("ev") == "straggle"],
                      a.start_s + 30, "the straggler to start")
    run.fault.update(start_time_ns=ev[0]["t_ns"], extra_compute_ms=a.straggle_ms,
                     compute_ms=a.compute_ms, from_step=ev[0]["step"])


def _mismatch_hang(run, r: int, t0: int) -> None:
    """Rank r skips a collective (the driver does it): its skip event."""
    a = run.a
    ev = run.wait_for(lambda: [e for e in run.events(r) if e.get("ev") == "skip"],
                      60, f"rank {r} to skip collective #{run.at_op()}")
    run.fault.update(start_time_ns=ev[0]["t_ns"], op_index=ev[0]["op_index"], op=ev[0]["op"],
                     step=ev[0]["step"], skip_mode=a.skip_mode,
                     note="op_index counts collectives issued on the world communicator from 0 "
                          "(op 0 is the initial broadcast); opCount in the NCCL logs equals it")


def _link_down_hang(run, r: int, t0: int) -> None:
    """Rank r's link set down --start-s after training began, mid-collective if one comes
    within 2 s."""
    a = run.a
    run.sleep_until_ns(t0 + int(a.start_s * 1e9))
    mid = False
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if truth_inflight(run, r):
            mid = True
            break
        time.sleep(0.001)
    run.fault["start_time_ns"] = now_ns()
    run.fault["link"] = link_info(run, r)
    run.fault.update(mid_collective=mid, **run.lab.link_down(r, a.link_side))
    run.fault["applied_ns"] = now_ns()   # `ip link set down` has returned


def _gpu_hang(run, r: int, t0: int) -> None:
    """Rank r's stream hangs in a collective (the lab libnccl does it, at an op count or on
    the trigger file): its gpu_hang record, and which ranks entered that collective."""
    a = run.a
    if a.hang_at == "time":
        run.sleep_until_ns(t0 + int(a.start_s * 1e9))
        run.gpu_trigger.touch()
    truth = run.out / "truth" / f"rank{r}.jsonl"
    what = (f"rank {r}'s stream to hang in collective #{run.at_op()}" if a.hang_at == "op"
            else f"rank {r}'s stream to hang in its next collective")
    ev = run.wait_for(lambda: [e for e in read_events(truth) if e.get("ev") == "gpu_hang"], 60, what)[0]
    n = ev["opCount"]

    def entered():   # the peers enqueue the same collective (the hung rank is already inside it)
        got = []
        for q in range(a.ranks):
            evs = read_events(run.out / "truth" / f"rank{q}.jsonl")
            comm = next((e["comm"] for e in evs if e.get("ev") == "init"
                         and e.get("func") == "ncclCommInitRank"), None)
            if any(e.get("ev") == "enqueue" and e.get("opCount") == n and e.get("comm") == comm for e in evs):
                got.append(q)
        return got if len(got) == a.ranks else None
    try:
        peers = run.wait_for(entered, 10, f"every rank to enter collective #{n}")
    except ScenarioError:
        peers = entered() or []
    run.fault.update(
        kind="gpu-hang", start_time_ns=ev["t_ns"], op_index=n, opCount=n, collective_seq_id=n + 1,
        op=ev["op"], mid_collective=True, ranks_entered=peers if peers else None, trigger=a.hang_at,
        stuck_thread={"tid": ev["tid"], "name": "cuda-stream", "function": "sslab_gpu_kernel_hang",
                      "blocks_in": "nanosleep (clock_nanosleep), forever"},
        note="rank r's stream thread (the \"GPU\") entered collective opCount n and hangs before sending "
             "anything; its peers wait inside #n on their ring sockets (poll), their main threads in "
             "cudaStreamSynchronize. op_index = opCount on the world communicator; torch's "
             "collective_seq_id = opCount + 1")


def _reset(run, r: int, t0: int) -> None:
    """TCP resets on the ring connection from rank r's predecessor (nft reject, --reset-scope),
    --start-s after training began."""
    a = run.a
    run.sleep_until_ns(t0 + int(a.start_s * 1e9))
    prev = (r - 1) % a.ranks
    run.fault["start_time_ns"] = now_ns()
    run.fault["link"] = link_info(run, r)
    run.fault.update(peer_rank=prev, reset_sent_to_rank=prev, method="nft-reject-tcp-reset",
                     connection=f"ring {prev} -> {r}", **run.lab.reset_from(r, prev, a.reset_scope))


def _init_hang(run, r: int, t0) -> None:
    """Rank r gets the unique id and never calls ncclCommInitRank (SSLAB_INIT_HANG): the others
    wait in their init for it. The onset: rank r's decision (its init_skip record)."""
    ev = run.wait_for(lambda: next((e for e in run.events(r) if e.get("ev") == "init_skip"), None), run.a.init_timeout_s, f"rank {r} to skip init")
    run.fault.update(start_time_ns=ev["t_ns"], missing_rank=r, address=None, method="rank never calls ncclCommInitRank")


def _init_hang_dropped(run, r: int, t0) -> None:
    """Rank r's packets to rank 0's host (the bootstrap root lives in rank 0's process), the
    store's port excepted, dropped in the switch before rank r calls ncclCommInitRank (it
    waits --init-delay-ms): its connection to the root never opens, the others wait in init.
    The onset: rank r's call (its init_start record)."""
    lab, root = run.lab, run.lab.hosts[0]
    port = lab.hosts[r].port
    rule = f'iifname "{port}" ip daddr {root.addr} tcp dport != {netns.MASTER_PORT} counter drop'
    netns.run(["ip", "netns", "exec", lab.switch, "nft", "-f", "-"],
              input=f"table bridge sslab_init_fault {{\n  chain bootstrap {{\n    type filter hook forward priority 0; "
                    f"policy accept;\n    {rule}\n  }}\n}}\n")
    ev = run.wait_for(lambda: next((e for e in run.events(r) if e.get("ev") == "init_start"), None), run.a.init_timeout_s,
                      f"rank {r} to call ncclCommInitRank")
    run.fault.update(start_time_ns=ev["t_ns"], missing_rank=r, address=root.addr, root_rank=0,
                     link=link_info(run, r), method="nft drop in the switch", nft=rule,
                     switch_namespace=lab.switch)


def _slow_checkpoint(run, r: int, t0: int) -> None:
    """Rank r busy in host code for --hold-s (the driver does it, a "checkpoint" after --start-s)
    while its peers wait inside the next collective: its checkpoint_start event is the onset
    (set at once: captures scheduled from the onset start during the pause), its checkpoint_end
    the end. Benign: the job goes on and ends cleanly."""
    a = run.a
    ev = run.wait_for(lambda: [e for e in run.events(r) if e.get("ev") == "checkpoint_start"],
                      a.start_s + 60, f"rank {r} to start its checkpoint")[0]
    run.fault.update(start_time_ns=ev["t_ns"], step=ev["step"], ops_issued_before=ev["ops_issued"],
                     hold_s=a.hold_s, benign=True, end_time_ns=None,
                     note="rank r sleeps in host code (sslab_save_checkpoint), outside every NCCL call, after "
                          "its compute of that step; its peers have issued the step's collectives and wait "
                          "inside them (collective op_index = ops_issued_before) until it joins")
    run.onset_ns = ev["t_ns"]
    end = run.wait_for(lambda: [e for e in run.events(r) if e.get("ev") == "checkpoint_end"],
                       a.hold_s + 60, f"rank {r} to end its checkpoint")[0]
    run.fault.update(end_time_ns=end["t_ns"], held_s=(end["t_ns"] - ev["t_ns"]) / 1e9)


# scenario -> its injection (run, the faulty rank, when every rank began training): it fills
# run.fault, start_time_ns included (clean and selftest have none)
FAULTS = {
    "loss": _loss,
    "slow-link": _slow_link,
    "straggler": _straggler,
    "mismatch-hang": _mismatch_hang,
    "link-down-hang": _link_down_hang,
    "gpu-hang": _gpu_hang,
    "reset": _reset,
    "init-hang": _init_hang,
    "init-hang-dropped": _init_hang_dropped,
    "slow-checkpoint": _slow_checkpoint,
}
from .host_faults import cpu_starved, host_stuck, link_flap, rank_killed  # noqa: E402  (they use link_info above)

FAULTS.update({"rank-killed": rank_killed, "link-flap": link_flap, "cpu-starved": cpu_starved,
               "host-stuck": host_stuck})
