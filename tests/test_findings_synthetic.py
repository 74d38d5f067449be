"""Detectors on small synthetic model tables: the edge cases a lab run does not pin down.

Each case builds the event tables of a 4-rank job by hand (ring links between ranks,
collectives every 100 ms), runs one detector, and checks what it blames. Every negative
case has a positive twin, so a detector that never fires fails here too.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics.findings import Context
from forensics.findings.hang import collective_mismatch, hang_mismatch, hang_stuck
from forensics.findings.ib import ib_errors
from forensics.findings.network import connection_reset, network_loss, slow_link
from forensics.findings.straggler import straggler
from forensics.model import Model
from forensics.model.nccl import conform, empty
from forensics.model.schema import TABLES

T0 = 1_800_000_000_000_000_000
MS = 1_000_000
COMM = "0xc0ffee"
RANKS = 4


def addr(r: int) -> str:
    return f"10.9.0.{10 + r}"


def job(n_ops: int = 40, dur_ms=lambda k: 5.0, late=None, completed=lambda k, r: True, entered=lambda k, r: True):
    """nccl_events rows: op k entered by every rank at T0 + k*100 ms (+ late(k, r) ms)."""
    rows = []
    for k in range(n_ops):
        for r in range(RANKS):
            if not entered(k, r):
                continue
            ent = T0 + k * 100 * MS + int((late(k, r) if late else 0.0) * MS)
            start = T0 + k * 100 * MS + int(max((late(k, q) if late else 0.0) for q in range(RANKS)) * MS)
            done = completed(k, r)
            end = start + int(dur_ms(k) * MS) if done else None
            rows.append({"timestamp_ns": ent, "duration_ns": end - ent if done else None,
                         "duration_source": "host_sync", "end_ns": end, "op": "ALL_REDUCE", "rank": r,
                         "nranks": RANKS, "comm_id_hash": COMM, "comm_ptr": f"0x{r}", "op_count": k, "count": 1024,
                         "bytes": 4096, "host": f"node{r}", "pid": 100 + r, "tid": 100 + r, "completed": done})
    return rows


def tcp(t_ns: int, sender: int, receiver: int, event: str = "tcp_retransmit_skb", source: str = "bpf") -> dict:
    return {"timestamp_ns": t_ns, "event": event, "source": source, "saddr": addr(sender), "daddr": addr(receiver),
            "sport": 40000 + sender, "dport": 50000 + receiver, "host": f"node{sender}", "pid": 100 + sender,
            "rank": sender, "peer_rank": receiver, "capture": f"ns-r{sender}"}


def context(nccl, tcp_rows=(), flows=(), ib=(), ended_ns=None, offcpu=(), stacks=()) -> Context:
    tables = {name: empty(name) for name in TABLES}
    for name, rows in (("nccl_events", nccl), ("tcp_events", tcp_rows), ("flows", flows), ("ib_counters", ib),
                       ("offcpu", offcpu), ("stacks", stacks)):
        if rows:
            tables[name] = conform(pd.DataFrame(list(rows)), name)
    m = Model(tables=tables, hosts=[f"node{r}" for r in range(RANKS)], captures=[{"ended_ns": ended_ns}])
    return Context(model=m, con=m.connect())


def slow_after(k0: int, ms: float = 400.0):
    return lambda k: ms if k >= k0 else 5.0


def loss_in_slow_windows(links, k0=20, n_ops=40, per_op=3):
    """Retransmissions on the given (sender, receiver) links inside every slow collective."""
    rows = []
    for k in range(k0, n_ops):
        for i in range(per_op):
            for s, d in links:
                rows.append(tcp(T0 + k * 100 * MS + (10 + 20 * i) * MS, s, d))
    return rows


# --------------------------------------------------------------------------- network_loss

def test_loss_on_links_sharing_one_rank_blames_that_rank():
    ctx = context(job(dur_ms=slow_after(20)), loss_in_slow_windows([(1, 2), (2, 3), (3, 2)]))
    f = network_loss(ctx)
    assert len(f) == 1 and f[0].ranks == [2] and f[0].severity == "error"
    assert f[0].peer_ranks == [1, 3] and "rank 2" in f[0].summary
    assert len(ctx.con.execute(f[0].sql).fetchall()) > 0


def test_one_lossy_link_names_both_ends():
    ctx = context(job(dur_ms=slow_after(20)), loss_in_slow_windows([(1, 2), (2, 1)]))
    f = network_loss(ctx)
    assert len(f) == 1 and f[0].ranks == [1, 2]
    assert "rank 1" in f[0].summary and "rank 2" in f[0].summary and "link between them" in f[0].summary


def test_retransmissions_from_the_healthy_sender_still_blame_the_faulty_receiver():
    # rank 2's NIC drops what it receives: only its peers retransmit
    ctx = context(job(dur_ms=slow_after(20)), loss_in_slow_windows([(1, 2), (3, 2)]))
    assert network_loss(ctx)[0].ranks == [2]


def test_no_tcp_evidence_no_network_loss():
    ctx = context(job(dur_ms=slow_after(20)))
    assert network_loss(ctx) == []


def test_retransmissions_outside_slow_collectives_are_not_network_loss():
    # slow collectives late in the job, retransmissions only during the fast start
    rows = [tcp(T0 + k * 100 * MS + 50 * MS, 1, 2) for k in range(0, 10)]
    ctx = context(job(dur_ms=slow_after(20)), rows)
    assert [f for f in network_loss(ctx) if f.severity != "info"] == []


def test_counted_once_when_both_ends_captured_it():
    links = [(1, 2), (2, 3)]
    rows = loss_in_slow_windows(links)
    # the same retransmissions seen again in the sender's pcap
    rows += [{**r, "event": "retransmission", "source": "pcap", "capture": f"pcap/r{r['rank']}.pcap"} for r in rows]
    f = network_loss(context(job(dur_ms=slow_after(20)), rows))[0]
    assert f.details["retransmissions"] == len(rows) // 2


# --------------------------------------------------------------------------- slow_link

def flow(a: int, b: int, rtt_us: float, retx: int = 0) -> dict:
    return {"host": "h", "capture": f"pcap/r{a}.pcap", "stream": a * 10 + b, "orig_addr": addr(a), "orig_port": 40000,
            "resp_addr": addr(b), "resp_port": 50000, "first_ns": T0, "last_ns": T0 + 4000 * MS,
            "bytes_resp": 10**7, "retransmissions": retx, "rtt_mean_ns": rtt_us * 1e3, "rank": a, "peer_rank": b}


RING = [(0, 1), (1, 2), (2, 3), (3, 0)]


def test_slow_links_sharing_a_rank_blame_it():
    flows = [flow(a, b, 900.0 if 1 in (a, b) else 6.0) for a, b in RING]
    f = slow_link(context(job(dur_ms=slow_after(20, 60)), flows=flows))
    assert len(f) == 1 and f[0].ranks == [1] and f[0].peer_ranks == [0, 2] and f[0].severity == "warning"


def test_one_slow_link_names_both_ends_and_equal_links_name_none():
    flows = [flow(a, b, 900.0 if (a, b) == (2, 3) else 6.0) for a, b in RING]
    assert slow_link(context(job(), flows=flows))[0].ranks == [2, 3]
    jitter = [flow(a, b, rtt) for (a, b), rtt in zip(RING, (5.0, 9.0, 14.0, 40.0))]   # µs noise, no outlier
    assert slow_link(context(job(), flows=jitter)) == []


def timing(a: int, b: int, p99_us: float, p50_us: float = 5.0) -> dict:
    return {"host": "h", "capture": f"pcap/r{a}.pcap", "saddr": addr(a), "sport": 40000, "daddr": addr(b),
            "dport": 50000, "data_packets": 500, "data_bytes": 10**6, "rtt_samples": 250,
            "rtt_p50_ns": p50_us * 1e3, "rtt_p90_ns": p99_us * 5e2, "rtt_p99_ns": p99_us * 1e3,
            "rtt_max_ns": p99_us * 2e3, "busy_rate_bps": 1e8, "rank": a, "peer_rank": b}


@pytest.mark.skipif("flow_timing" not in TABLES, reason="no flow_timing table")
def test_one_slow_link_leans_to_the_end_whose_other_links_queue_too():
    # rank 3's port is slow: its link to 2 queues a lot, its link to 0 a little (3x the rest)
    p99 = {(0, 1): 20.0, (1, 2): 45.0, (2, 3): 1200.0, (3, 0): 140.0}
    flows = [flow(a, b, 6.0) for a, b in RING]
    m = context(job(dur_ms=slow_after(20, 60)), flows=flows).model
    m.tables["flow_timing"] = conform(pd.DataFrame([timing(a, b, p99[(a, b)]) for a, b in RING]), "flow_timing")
    f = slow_link(Context(model=m, con=m.connect()))[0]
    assert f.ranks == [3] and f.peer_ranks == [2] and "more likely than rank 2" in f.summary
    # no such lean: both ends' other links alike -> both named
    p99[(3, 0)] = 50.0
    m.tables["flow_timing"] = conform(pd.DataFrame([timing(a, b, p99[(a, b)]) for a, b in RING]), "flow_timing")
    assert slow_link(Context(model=m, con=m.connect()))[0].ranks == [2, 3]


@pytest.mark.skipif("flow_timing" not in TABLES, reason="no flow_timing table")
def test_slow_link_from_the_ack_rtt_tail_when_medians_are_alike():
    # the mean RTT says nothing (equal everywhere); the p99 of rank 3's links is 40x the others'
    flows = [flow(a, b, 6.0) for a, b in RING]
    rows = [timing(a, b, 800.0 if 3 in (a, b) else 20.0) for a, b in RING]
    ctx = Context(model=context(job(dur_ms=slow_after(20, 60)), flows=flows).model, con=None)
    ctx.model.tables["flow_timing"] = conform(pd.DataFrame(rows), "flow_timing")
    f = slow_link(Context(model=ctx.model, con=ctx.model.connect()))
    assert len(f) == 1 and f[0].ranks == [3] and "ACK round-trip p99 of 800 µs vs 20 µs" in f[0].summary
    assert "medians alike" in f[0].summary and f[0].details["metric"] == "ACK round-trip p99"
    # a connection with too few ACK samples does not count
    few = [{**r, "rtt_samples": 3} for r in rows]
    ctx.model.tables["flow_timing"] = conform(pd.DataFrame(few), "flow_timing")
    assert slow_link(Context(model=ctx.model, con=ctx.model.connect())) == []


def test_a_lossy_link_is_not_a_slow_link():
    flows = [flow(a, b, 900.0 if (a, b) == (2, 3) else 6.0, retx=40 if (a, b) == (2, 3) else 0) for a, b in RING]
    assert slow_link(context(job(), flows=flows)) == []


# --------------------------------------------------------------------------- straggler

def test_a_single_slow_collective_is_not_a_straggler():
    late = lambda k, r: 500.0 if (k, r) == (17, 3) else 0.1 * r   # noqa: E731
    assert straggler(context(job(late=late))) == []


def test_a_rank_late_again_and_again_is_a_straggler():
    late = lambda k, r: 150.0 if (k >= 30 and r == 0) else 0.1 * r   # noqa: E731
    f = straggler(context(job(late=late)))
    assert len(f) == 1 and f[0].ranks == [0] and f[0].details["late_collectives"] == 10
    assert abs(f[0].details["late_p50_ns"] / MS - 149.7) < 1.0


def test_straggler_with_run_queue_delay_says_cpu_contention():
    late = lambda k, r: 150.0 if (k >= 30 and r == 0) else 0.1 * r   # noqa: E731
    # schedstat samples of each main thread at 1 s and 4 s; rank 0 (late from 3 s) waited 900 ms for a CPU
    off = [{"timestamp_ns": T0 + (1000 + i * 3000) * MS, "host": f"node{r}", "pid": 100 + r, "tid": 100 + r, "rank": r,
            "name": "python", "state": "R" if r == 0 else "S", "offcpu_ns": i * 1000 * MS,
            "oncpu_ns": i * 500 * MS, "runq_ns": i * (900 if r == 0 else 20) * MS,
            "offcpu_delta_ns": i * 1000 * MS if i else None, "oncpu_delta_ns": i * 500 * MS if i else None,
            "runq_delta_ns": (900 if r == 0 else 20) * MS if i else None} for r in range(RANKS) for i in (0, 1)]
    f = straggler(context(job(late=late), offcpu=off))[0]
    assert "CPU contention" in f.summary and f.details["offcpu"]["0"]["runq_ns"] == 900 * MS
    assert "CPU contention" not in straggler(context(job(late=late)))[0].summary


def test_everyone_late_in_turn_is_not_a_straggler():
    late = lambda k, r: 30.0 if r == k % RANKS else 0.0   # noqa: E731   round-robin noise
    assert straggler(context(job(late=late, n_ops=12))) == []


# --------------------------------------------------------------------------- hangs

def test_mismatch_hang_names_the_rank_that_never_entered():
    n = job(n_ops=30, entered=lambda k, r: not (r == 2 and k >= 25), completed=lambda k, r: k < 25)
    f = hang_mismatch(context(n, ended_ns=T0 + 30 * 100 * MS + 5000 * MS))
    assert len(f) == 1 and f[0].ranks == [2] and f[0].details["op_count"] == 25
    assert f[0].peer_ranks == [0, 1, 3] and hang_stuck(context(n, ended_ns=T0 + 8000 * MS)) == []


@pytest.mark.skipif("stacks" not in TABLES, reason="no stacks table in this model")
def test_mismatch_hang_quotes_the_missing_ranks_stack():
    n = job(n_ops=30, entered=lambda k, r: not (r == 2 and k >= 25), completed=lambda k, r: k < 25)
    frames = [("pause", "<libc>", None, 0), ("wait_for_batch", "train.py", 88, 1), ("main", "train.py", 120, 2)]
    stacks = [{"host": "node2", "pid": 102, "rank": 2, "phase": "end", "thread_id": "0x1", "os_tid": 102,
               "thread_name": "MainThread", "status": "idle", "active": True, "owns_gil": False, "depth": d,
               "function": fn, "code_file": f, "lineno": ln} for fn, f, ln, d in frames]
    f = hang_mismatch(context(n, ended_ns=T0 + 8000 * MS, stacks=stacks))[0]
    assert "rank 2's stack: pause <- wait_for_batch (train.py:88) <- main (train.py:120)" in f.summary
    assert f.details["stacks"]["2"][0] == "pause"


def test_a_rank_stuck_in_a_collective_its_peers_completed_is_stuck_not_mismatch():
    """The link of rank 0 dies during the last step of #24: rank 1 never gets its last chunk
    and stays inside #24, which the others completed before entering #25 and waiting there.
    Rank 1 never entered #25, but it is not idle on another code path: the ring is stuck."""
    n = job(n_ops=26, entered=lambda k, r: not (r == 1 and k == 25),
            completed=lambda k, r: k < 24 or (k == 24 and r != 1))
    t = T0 + 24 * 100 * MS
    rows = [tcp(t + i * 200 * MS, s, d) for i in range(1, 6) for s, d in ((0, 1), (3, 0))]
    ctx = context(n, rows, ended_ns=t + 5000 * MS)
    assert hang_mismatch(ctx) == []
    f = hang_stuck(ctx)
    assert len(f) == 1 and f[0].ranks == [0] and f[0].details["op_count"] == 24
    assert "rank 1 inside #24; ranks 0, 2, 3 inside #25" in f[0].summary


def test_a_rank_that_skipped_a_collective_and_went_on_is_a_collective_mismatch():
    """Buckets of 3 sizes per step; rank 2 skips #10 and issues the rest: its #10 is the
    others' #11 (a size mismatch NCCL reports as 'message truncated', or hangs on)."""
    sizes = [4096, 2048, 1024]
    n = job(n_ops=14, completed=lambda k, r: k < 10)
    for row in n:
        k = row["op_count"] + (1 if row["rank"] == 2 and row["op_count"] >= 10 else 0)
        row["count"] = sizes[k % 3]
    f = collective_mismatch(context(n, ended_ns=T0 + 5000 * MS))
    assert len(f) == 1 and f[0].ranks == [2] and f[0].peer_ranks == [0, 1, 3] and f[0].severity == "error"
    assert f[0].details["op_count"] == 10 and f[0].details["skipped_one"]
    assert "rank 2 called ALL_REDUCE of 1024" in f[0].summary and "it skipped a collective" in f[0].summary
    # the same counts on every rank: nothing
    assert collective_mismatch(context(job(n_ops=14), ended_ns=T0 + 5000 * MS)) == []


def test_point_to_point_calls_may_differ_between_ranks():
    n = job(n_ops=6)
    for row in n:
        if row["op_count"] == 3:   # a ring exchange: even ranks send, odd ranks receive
            row["op"] = "SEND" if row["rank"] % 2 == 0 else "RECV"
            row["root_or_peer"] = (row["rank"] + 1) % RANKS
    assert collective_mismatch(context(n)) == []


def test_capture_cut_mid_collective_is_not_a_hang():
    n = job(n_ops=30, entered=lambda k, r: not (r == 2 and k == 29), completed=lambda k, r: k < 29)
    assert hang_mismatch(context(n, ended_ns=T0 + 29 * 100 * MS + 20 * MS)) == []
    assert len(hang_mismatch(context(n, ended_ns=T0 + 29 * 100 * MS + 3000 * MS))) == 1


def test_stuck_hang_without_network_trouble_blames_no_rank():
    n = job(n_ops=30, completed=lambda k, r: k < 25)
    f = hang_stuck(context(n, ended_ns=T0 + 6000 * MS))
    assert len(f) == 1 and f[0].ranks == [] and f[0].severity == "error" and "no TCP retransmission" in f[0].summary


def test_stuck_hang_blames_the_endpoint_of_unanswered_retransmissions():
    n = job(n_ops=30, completed=lambda k, r: k < 25)
    t = T0 + 25 * 100 * MS
    rows = [tcp(t + i * 200 * MS, s, d) for i in range(1, 6) for s, d in ((0, 3), (3, 0), (2, 3))]
    rows.append(tcp(t + 2000 * MS, 1, 0, event="tcp_send_reset"))   # the kill, later: not the cause
    f = hang_stuck(context(n, rows, ended_ns=t + 4000 * MS))
    assert f[0].ranks == [3] and f[0].peer_ranks == [0, 2]


def test_reset_first_is_the_cause_and_kill_time_resets_are_not():
    n = job(n_ops=30, completed=lambda k, r: k < 25)
    t = T0 + 25 * 100 * MS
    first = tcp(t + 5 * MS, 2, 1, event="rst", source="pcap")
    ctx = context(n, [first, tcp(t + 300 * MS, 1, 2)], ended_ns=t + 4000 * MS)
    f = connection_reset(ctx)
    assert len(f) == 1 and f[0].ranks == [2] and f[0].peer_ranks == [1] and f[0].severity == "error"
    assert hang_stuck(ctx)[0].ranks == [2]
    # the same reset 3 s into the stall is a teardown (processes killed), not a cause
    late = context(n, [tcp(t + 3000 * MS, 2, 1, event="rst", source="pcap")], ended_ns=t + 4000 * MS)
    assert connection_reset(late) == []


# --------------------------------------------------------------------------- ib_errors

def ib_row(counter: str, delta: int, kind: str, host="node1") -> dict:
    return {"host": host, "device": "mlx5_0", "port": 1, "counter": counter, "start": 100, "end": 100 + delta,
            "delta": delta, "kind": kind, "problem": kind in ("error", "congestion", "retransmission") and delta > 0,
            "meaning": f"{counter} meaning", "action": f"do something about {counter}"}


def test_ib_link_downed_is_an_error_naming_the_hosts_ranks():
    rows = [ib_row("link_downed", 2, "error"), ib_row("port_xmit_discards", 5, "congestion"),
            ib_row("port_xmit_data", 10**9, "traffic"), ib_row("symbol_error", 0, "error")]
    f = ib_errors(context(job(), ib=rows))
    assert len(f) == 1 and f[0].severity == "error" and f[0].ranks == [1] and f[0].hosts == ["node1"]
    assert [e["counter"] for e in f[0].evidence] == ["link_downed", "port_xmit_discards"]
    assert "link_downed +2" in f[0].summary and "do something about link_downed" in f[0].action


def test_ib_congestion_only_is_a_warning_and_quiet_counters_nothing():
    assert ib_errors(context(job(), ib=[ib_row("port_xmit_discards", 5, "congestion")]))[0].severity == "warning"
    assert ib_errors(context(job(), ib=[ib_row("symbol_error", 0, "error"),
                                        ib_row("port_rcv_data", 10**6, "traffic")])) == []


@pytest.mark.parametrize("detector", [network_loss, slow_link, connection_reset, straggler, hang_mismatch,
                                      hang_stuck, collective_mismatch, ib_errors])
def test_empty_model_gives_no_finding(detector):
    assert detector(context([])) == []


def test_in_windows_handles_nested_and_overlapping_windows():
    from forensics.findings.evidence import in_windows
    t0 = np.array([0, 10, 12, 40]); t1 = np.array([30, 11, 13, 50])
    got = in_windows(np.array([-1, 0, 25, 31, 45, 51]), t0, t1)
    assert got.tolist() == [False, True, True, False, True, False]


def test_communicator_created_before_the_tracer_attached():
    """No comm id (tracer attached mid-run): collectives are per process, so no cross-rank
    verdict (hang, straggler), but per-process windows still carry the loss evidence."""
    n = [{**r, "comm_id_hash": None} for r in job(dur_ms=slow_after(20))]
    ctx = context(n, loss_in_slow_windows([(1, 2), (2, 3)]), ended_ns=T0 + 10_000 * MS)
    assert network_loss(ctx)[0].ranks == [2]
    cut = [{**r, "comm_id_hash": None} for r in job(n_ops=30, entered=lambda k, r: not (r == 2 and k >= 25),
                                                     completed=lambda k, r: k < 25)]
    ctx = context(cut, ended_ns=T0 + 10_000 * MS)
    assert hang_mismatch(ctx) == [] and hang_stuck(ctx) == [] and straggler(ctx) == []
