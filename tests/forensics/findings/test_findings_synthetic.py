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
from forensics.findings.base import STOPS_JOB_SCORE, Finding, impact_severity
from forensics.findings.runner import order
from forensics.findings.connection_reset import connection_reset
from forensics.findings.hang import collective_mismatch, hang_mismatch, hang_stuck
from forensics.findings.ib import ib_errors
from forensics.findings.network import network_loss, slow_link
from forensics.findings.straggler import straggler
from forensics.model.schema import conform
from forensics.model.schema import TABLES
from traced_job import MS, RANKS, T0, addr, context, job, subcomm_job, tcp, window


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


def test_a_lossy_link_that_a_rank_is_not_on_clears_it_however_lopsided_the_counts():
    # rank 1's NIC drops: its link to rank 2 carries most of the retransmissions (85%), but
    # its link to rank 0 has its own few, and rank 2 is not on that one: rank 1 alone
    heavy = loss_in_slow_windows([(1, 2)], per_op=3)                      # 60 events
    light = [tcp(T0 + k * 100 * MS + 70 * MS, 0, 1) for k in range(22, 40, 2)]   # 9 events
    f = network_loss(context(job(dur_ms=slow_after(20)), heavy + light))[0]
    assert f.ranks == [1] and f.peer_ranks == [0, 2] and f.details["coverage"]["2"] > 0.8
    # its twin: two stray events on the other link are noise, not a lossy link: both ends named
    stray = light[:2]
    f = network_loss(context(job(dur_ms=slow_after(20)), heavy + stray))[0]
    assert f.ranks == [1, 2] and "link between them" in f.summary


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
    assert len(f) == 1 and f[0].ranks == [1] and f[0].peer_ranks == [0, 2]
    # severity from impact: 20 of 40 collectives at 60 ms instead of 5 ms explain 20 x 55 ms of
    # the 1.3 s of collective time, and the summary says so
    assert f[0].impact_share == pytest.approx(20 * 55 / 1300) and f[0].severity == "error"
    assert "it explains 85% of the job's collective time" in f[0].summary


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


@pytest.mark.skipif("flow_timing" not in TABLES, reason="no flow_timing table")
def _two_connections_a_link(p99_us: dict, bulk_us: dict | None = None) -> list[dict]:
    """flow_timing of two connections a link, each seen in both directions: 20 µs tails
    everywhere but where ``p99_us`` says ((a, b, port, sender): µs), the bulk (p90) 10 µs
    but on the links ``bulk_us`` names ((a, b): µs, every direction of every connection)."""
    out = []
    for a, b in RING:
        for port in (40000, 40001):
            for src, dst in ((a, b), (b, a)):
                r = timing(src, dst, p99_us.get((a, b, port, src), 20.0))
                r["rtt_p90_ns"] = (bulk_us or {}).get((a, b), 10.0) * 1e3
                out.append({**r, "sport": port if src == a else 50000, "dport": 50000 if src == a else port})
    return out


@pytest.mark.skipif("flow_timing" not in TABLES, reason="no flow_timing table")
def test_one_connections_stalled_ack_is_not_a_slow_link_two_connections_queueing_are():
    flows = [flow(a, b, 6.0) for a, b in RING]
    m = context(job(dur_ms=slow_after(20, 60)), flows=flows).model

    def found(p99_us, bulk_us=None):
        m.tables["flow_timing"] = conform(pd.DataFrame(_two_connections_a_link(p99_us, bulk_us)), "flow_timing")
        return slow_link(Context(model=m, con=m.connect()))
    # a busy host stalled one ACK of one connection on link 2-3 (one direction): a single
    # connection's tail, not the path's
    assert found({(2, 3, 40000, 3): 1200.0}) == []
    # a queue at rank 3's port: both connections of its links, whichever direction's tail
    # shows it most, and the bulk of every direction through it waiting too
    tails = {(2, 3, 40000, 3): 1200.0, (2, 3, 40001, 2): 900.0, (3, 0, 40000, 3): 1000.0, (3, 0, 40001, 0): 1100.0}
    f = found(tails, {(2, 3): 400.0, (3, 0): 450.0})
    assert len(f) == 1 and f[0].ranks == [3] and f[0].peer_ranks == [0, 2]
    assert sorted(f[0].details["rtt_slow_ns"]) == [900e3, 1000e3]   # the second connection's tail


@pytest.mark.skipif("flow_timing" not in TABLES, reason="no flow_timing table")
def test_a_long_ack_tail_with_the_bulk_as_fast_as_elsewhere_is_not_a_slow_link():
    # a rank behind a late peer idles, and its ACKs of the peer's first segments wait for
    # Linux's delayed-ACK timer (~40 ms): every connection of its two links has a 44 ms p99
    # (lab: per-host captures of a straggler, 2 cores), while their data waits no longer
    # than on the other links: the endpoints' doing, not a slow path
    flows = [flow(a, b, 6.0) for a, b in RING]
    m = context(job(dur_ms=slow_after(20, 60)), flows=flows).model
    tails = {(a, b, port, src): 44_000.0 for a, b in ((0, 1), (1, 2)) for port in (40000, 40001) for src in (a, b)}
    m.tables["flow_timing"] = conform(pd.DataFrame(_two_connections_a_link(tails)), "flow_timing")
    assert slow_link(Context(model=m, con=m.connect())) == []
    # the same tails with that data held 10x longer than elsewhere: a queue on the path
    m.tables["flow_timing"] = conform(pd.DataFrame(_two_connections_a_link(tails, {(0, 1): 100.0, (1, 2): 120.0})),
                                      "flow_timing")
    f = slow_link(Context(model=m, con=m.connect()))
    assert len(f) == 1 and f[0].ranks == [1] and f[0].peer_ranks == [0, 2]


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
    # its impact: the late collectives' excess over the clean ones, as a share of the collective time
    d = f[0].details
    assert f[0].impact_share == pytest.approx(d["excess_ns"] / d["collective_time_ns"]) and f[0].impact_share > 0.5
    assert f[0].severity == "error" and f"it explains {f[0].impact_share:.0%}" in f[0].summary


def test_severity_and_order_follow_the_share_of_collective_time_explained():
    assert impact_severity(0.01, 40) == "info"                  # many slow collectives, nothing paid
    assert impact_severity(0.04, 3) == "info"                   # a few slow ones, a little paid
    assert impact_severity(0.04, 10) == impact_severity(0.2, 2) == "warning"
    assert impact_severity(0.3, 10) == "error" and impact_severity(0.3, 10, ceiling="warning") == "warning"
    hang = Finding(kind="hang_stuck", severity="error", confidence=0.5, summary="", score=STOPS_JOB_SCORE + 3)
    big = Finding(kind="straggler", severity="error", confidence=0.5, summary="", score=1, impact_share=0.6)
    small = Finding(kind="network_loss", severity="error", confidence=0.99, summary="", score=50, impact_share=0.3)
    other = Finding(kind="ib_errors", severity="error", confidence=1.0, summary="", score=1e3)
    assert [f.kind for f in order([other, small, big, hang])] == ["hang_stuck", "straggler", "network_loss", "ib_errors"]


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


def offcpu_rows(runq_ms: dict) -> list[dict]:
    """schedstat samples of each rank's main thread at 1 s and 4 s: rank r waited runq_ms[r]
    (default 20 ms) for a CPU in between."""
    return [{"timestamp_ns": T0 + (1000 + i * 3000) * MS, "host": f"node{r}", "pid": 100 + r, "tid": 100 + r,
             "rank": r, "name": "python", "state": "S", "offcpu_ns": i * 1000 * MS, "oncpu_ns": i * 500 * MS,
             "runq_ns": i * runq_ms.get(r, 20) * MS, "offcpu_delta_ns": i * 1000 * MS if i else None,
             "oncpu_delta_ns": i * 500 * MS if i else None, "runq_delta_ns": runq_ms.get(r, 20) * MS if i else None}
            for r in range(RANKS) for i in (0, 1)]


def test_a_slow_link_at_a_host_starved_of_cpu_is_a_warning_that_says_so():
    """A host starved of CPU ACKs late: its links' round-trip grows on the host, not the wire.
    The slow links of a rank whose threads waited far longer for a CPU than its peers' stay
    named, as a warning that says why; the same links at a host that was not starved stay an
    error, and so do they when another rank was the starved one."""
    flows = [flow(a, b, 900.0 if 1 in (a, b) else 6.0) for a, b in RING]
    starved = slow_link(context(job(dur_ms=slow_after(20, 60)), flows=flows, offcpu=offcpu_rows({1: 2000})))[0]
    assert starved.ranks == [1] and starved.severity == "warning"
    assert "starved of CPU" in starved.summary and starved.details["cpu_starved"]["1"]["runq_ns"] == 2000 * MS
    plain = slow_link(context(job(dur_ms=slow_after(20, 60)), flows=flows, offcpu=offcpu_rows({})))[0]
    assert plain.severity == "error" and "starved" not in plain.summary and starved.confidence < plain.confidence
    other = slow_link(context(job(dur_ms=slow_after(20, 60)), flows=flows, offcpu=offcpu_rows({3: 2000})))[0]
    assert other.severity == "error" and "cpu_starved" not in other.details


def test_loss_at_a_host_starved_of_cpu_is_a_warning_that_says_so():
    events = loss_in_slow_windows([(1, 2), (2, 3), (3, 2)])
    starved = network_loss(context(job(dur_ms=slow_after(20)), events, offcpu=offcpu_rows({2: 3000})))[0]
    assert starved.ranks == [2] and starved.severity == "warning" and "starved of CPU" in starved.summary
    # one link, one end starved (the lab's cpu-starved rank and its peer): that end's late ACKs explain it
    link = loss_in_slow_windows([(1, 2), (2, 1)])
    one = network_loss(context(job(dur_ms=slow_after(20)), link, offcpu=offcpu_rows({2: 3000})))[0]
    assert one.ranks == [1, 2] and one.severity == "warning" and list(one.details["cpu_starved"]) == ["2"]
    # a wait under RUNQ_MIN_NS is a busy CPU's turn, however far above the peers'
    busy = network_loss(context(job(dur_ms=slow_after(20)), events, offcpu=offcpu_rows({2: 45})))[0]
    assert busy.severity == "error" and "starved" not in busy.summary


def test_entry_margins_are_exact_nanoseconds_and_the_evidence_is_what_the_sql_returns():
    from forensics.findings.straggler import entry_margins
    from test_findings import assert_sql_returns_the_evidence
    # rank 3 late by 150 ms and a few odd nanoseconds: epoch ns near 1.8e18 are 256 ns apart
    # as float64, so a margin computed through a float comes out rounded (and the top-20
    # evidence rows ordered unlike the finding's SQL, which keeps integers)
    odd = {k: (k * 37) % 251 for k in range(40)}
    late = lambda k, r: (150.0 + odd[k] / 1e6) if r == 3 else 0.0   # noqa: E731
    ctx = context(job(late=late))
    e = entry_margins(ctx)
    mine = e[e["rank"] == 3].sort_values("op_count")
    assert str(mine["margin_ns"].dtype) == "int64"
    assert mine["margin_ns"].tolist() == [int((150.0 + odd[k] / 1e6) * MS) for k in range(40)]
    assert set(e.loc[e["rank"] != 3, "margin_ns"]) == {-int((150.0 + o / 1e6) * MS) for o in odd.values()}
    f = straggler(ctx)
    assert len(f) == 1 and f[0].ranks == [3]
    assert_sql_returns_the_evidence(ctx.con, f[0])


def test_a_rank_a_few_ms_late_every_time_is_not_a_straggler():
    # a lag under one scheduler period (a ring's fixed completion order, a busy CPU): CI saw a
    # clean job's rank 2-3 ms late in a third of its collectives; 3 ms in every one here
    late = lambda k, r: 3.0 if r == 2 else 0.0   # noqa: E731
    assert straggler(context(job(late=late))) == []
    late = lambda k, r: 12.0 if r == 2 else 0.0   # noqa: E731   past it: a straggler
    assert [f.ranks for f in straggler(context(job(late=late)))] == [[2]]


def test_a_rank_late_in_every_collective_costs_the_wait_it_caused():
    # it straggled before the capture began: no collective without it to compare with; what
    # the collectives would have taken had it come in time (5 ms) is the baseline
    late = lambda k, r: 150.0 if r == 2 else 0.0   # noqa: E731
    f = straggler(context(job(late=late)))
    assert [x.ranks for x in f] == [[2]]
    assert f[0].details["excess_ns"] == pytest.approx(40 * 150 * MS, rel=1e-6)
    assert f[0].impact_share == pytest.approx(150 / 155, rel=1e-6) and f[0].severity == "error"


def test_a_collective_a_capture_did_not_see_is_not_a_clean_baseline():
    # seed-46 accuracy case 8: per-host captures started 5 s after rank 2 began to straggle;
    # rank 1's started first and saw ops 0-1 alone: their windows (its entry to its end) hold
    # the wait for rank 2, and taken as clean they made every late collective look normal
    late = lambda k, r: 150.0 if r == 2 else 0.0   # noqa: E731
    seen = lambda k, r: r == 1 or k >= 2   # noqa: E731
    windows = [window(r, 0 if r == 1 else 2, 39) for r in range(RANKS)]
    f = straggler(context(job(late=late, entered=seen), windows=windows))
    assert [x.ranks for x in f] == [[2]] and f[0].details["late_collectives"] == 38
    assert f[0].details["excess_ns"] == pytest.approx(38 * 150 * MS, rel=1e-6)
    assert f[0].severity == "error" and f[0].impact_share > 0.9


def test_a_straggler_explains_only_the_wait_it_caused():
    # rank 0 is 20 ms late in collectives 20-39, which also run 50 ms instead of 5 (after every
    # rank entered): their windows are 65 ms longer than clean ones, 20 of them the straggler's
    late = lambda k, r: 20.0 if (k >= 20 and r == 0) else 0.0   # noqa: E731
    f = straggler(context(job(late=late, dur_ms=slow_after(20, 50))))
    assert len(f) == 1 and f[0].ranks == [0]
    d = f[0].details
    assert d["excess_ns"] == pytest.approx(20 * 20 * MS, rel=1e-6)
    assert d["collective_time_ns"] == pytest.approx((20 * 5 + 20 * 70) * MS, rel=1e-6)
    assert f[0].impact_share == pytest.approx(400 / 1500, rel=1e-6)


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
    from forensics.findings.collectives import in_windows
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


# --------------------------------------------------------------------------- review fixes

def sql_rows(ctx, f) -> list[dict]:
    return ctx.con.execute(f.sql).df().to_dict("records")


HOSTILE = "0x58cf' OR '1'='1"


def test_sql_str_keeps_bundle_text_one_literal():
    import duckdb
    from forensics.findings.sql import sql_list, sql_str
    assert sql_str(HOSTILE) == "'0x58cf'' OR ''1''=''1'"
    assert sql_str(np.int64(7)) == "7" and sql_str(3) == "3" and sql_list(["a'b", 2]) == "'a''b', 2"
    for text in (HOSTILE, "a\x00b'; DROP TABLE x; --", "\\'"):
        assert duckdb.connect().execute(f"SELECT {sql_str(text)}").fetchone()[0] == text


def test_hostile_comm_id_stays_a_literal_in_the_findings_sql():
    """A comm_id_hash with quotes (bundle text) must not turn the finding's SQL into
    'WHERE comm_id_hash = ... OR true': the SQL returns that communicator's rows only."""
    n = [{**r, "comm_id_hash": HOSTILE} for r in job(n_ops=30, entered=lambda k, r: not (r == 2 and k >= 25),
                                                     completed=lambda k, r: k < 25)]
    other = [{**r, "comm_id_hash": "0x58cf", "rank": r["rank"] + 4 * i, "nranks": 8, "pid": 200 + r["rank"] + 4 * i}
             for i in range(2) for r in job(n_ops=3)]
    ctx = context(n + other, ended_ns=T0 + 8000 * MS)
    f = hang_mismatch(ctx)
    assert len(f) == 1 and f[0].ranks == [2]
    rows = sql_rows(ctx, f[0])
    assert [r["rank"] for r in rows] == [0, 1, 2, 3] == [e["rank"] for e in f[0].evidence]
    assert "''1''=''1'" in f[0].sql
    # collective_mismatch and straggler put the comm id in their SQL too
    sizes = [4096, 2048, 1024]
    mm = [{**r, "comm_id_hash": HOSTILE} for r in job(n_ops=14, completed=lambda k, r: k < 10)]
    for row in mm:
        row["count"] = sizes[(row["op_count"] + (row["rank"] == 2 and row["op_count"] >= 10)) % 3]
    ctx = context(mm + other, ended_ns=T0 + 5000 * MS)
    f = collective_mismatch(ctx)
    assert len(f) == 1 and [r["rank"] for r in sql_rows(ctx, f[0])] == [e["rank"] for e in f[0].evidence]
    late = [{**r, "comm_id_hash": HOSTILE} for r in job(late=lambda k, r: 30.0 if r == 1 and k % 2 else 0.0)]
    ctx = context(late + other)
    f = straggler(ctx)
    assert len(f) == 1 and len(sql_rows(ctx, f[0])) == len(f[0].evidence) == 20


def _fake_bundle():
    from types import SimpleNamespace
    return SimpleNamespace(clock=None, host="node0", problems=[], manifest=SimpleNamespace(processes=[]))


def test_loader_nulls_malformed_comm_ids_and_absurd_nranks():
    from forensics.model.nccl import nccl_events
    base = {"ev": "coll", "t1": 2, "pid": 10, "tid": 10, "op": "ALL_REDUCE", "rank": 0, "op_count": 0, "count": 1,
            "datatype": 7, "comm": "0x1"}
    events = [{**base, "t0": 1, "comm_id_hash": HOSTILE, "nranks": 4},
              {**base, "t0": 2, "comm_id_hash": "0xABC", "nranks": 4},            # not the tracer's lowercase
              {**base, "t0": 3, "comm_id_hash": "0x" + "f" * 17, "nranks": 4},    # longer than 64 bits
              {**base, "t0": 4, "comm_id_hash": "0x58cf8cf9173a8874", "nranks": 2**20 + 1},
              {**base, "t0": 5, "comm_id_hash": "0x58cf8cf9173a8874", "nranks": 2**20}]
    b = _fake_bundle()
    out = nccl_events(b, events)
    assert out["comm_id_hash"].isna().tolist() == [True, True, True, False, False]
    assert out["comm_id_hash"].tolist()[3:] == ["0x58cf8cf9173a8874"] * 2
    assert out["nranks"].isna().tolist() == [False, False, False, True, False]
    assert len(b.problems) == 2 and "comm_id_hash" in b.problems[0] and "nranks" in b.problems[1]


def test_a_hostile_nranks_is_not_trusted_as_the_communicator_size():
    from forensics.model.progress import communicator_members
    assert communicator_members(10**12, [0, 1, 2, 3]) == ([0, 1, 2, 3], 10**12)
    assert communicator_members(8, [0, 1, 2, 3]) == (list(range(8)), None)
    assert communicator_members(4, [0, 1, 7]) == ([0, 1, 7], 4)        # a rank beyond the claimed size
    assert communicator_members(None, [2, 0]) == ([0, 2], None)
    n = [{**r, "nranks": 100_000} for r in job(n_ops=30, entered=lambda k, r: not (r == 2 and k >= 25),
                                                 completed=lambda k, r: k < 25)]
    f = hang_mismatch(context(n, ended_ns=T0 + 8000 * MS))
    assert len(f) == 1 and f[0].ranks == [2] and f[0].details["nranks_claimed"] == 100_000
    assert "claims 100000 ranks" in f[0].summary and f[0].peer_ranks == [0, 1, 3]


def test_mismatch_on_a_sub_communicator_names_global_ranks_throughout():
    """Sub-communicator of global ranks 1 and 3 (comm ranks 0 and 1): global rank 3 skips.
    Every rank in the sentence is a global rank (the reviewer saw 'rank 3 never entered ...
    last op reached: rank 1: #24' mixing the two)."""
    ctx = context(subcomm_job(), ended_ns=T0 + 35 * 100 * MS + 5000 * MS)
    f = hang_mismatch(ctx)
    assert len(f) == 1 and f[0].ranks == [3] and f[0].peer_ranks == [1]
    s = f[0].summary
    assert "rank 3 (node3) never entered" in s and "rank 1 entered it" in s
    assert "last op reached: rank 3: #24 ALL_GATHER" in s
    assert "rank 0" not in s
    assert [(e["rank"], e["global_rank"]) for e in f[0].evidence] == [(0, 1), (1, 3)]
    assert [(r["rank"], r["global_rank"]) for r in sql_rows(ctx, f[0])] == [(0, 1), (1, 3)]
    # a third member that was never traced has no known global rank: named as a comm rank
    f = hang_mismatch(context(subcomm_job(nranks=3), ended_ns=T0 + 35 * 100 * MS + 5000 * MS))
    assert len(f) == 1 and "comm rank 2" in f[0].summary and f[0].details["untraced_ranks"] == [2]
    assert f[0].ranks == [3]


def test_collective_mismatch_on_a_sub_communicator_maps_each_rank_to_its_own_global_rank():
    """Global ranks 3, 1, 2 hold comm ranks 0, 1, 2 (not in order): comm rank 0 (global 3)
    calls a different size; the sentence and evidence name rank 3, not rank 1."""
    rows = subcomm_job(members=(3, 1, 2), skip_at=99, n_ops=6)
    for r in rows:
        if r["comm_id_hash"] == "0xbeef" and r["rank"] == 0 and r["op_count"] == 4:
            r["count"] = 32
    ctx = context(rows)
    f = collective_mismatch(ctx)
    assert len(f) == 1 and f[0].ranks == [3] and f[0].peer_ranks == [1, 2]
    assert "rank 3 called ALL_GATHER of 32" in f[0].summary
    assert "while ranks 1, 2 called ALL_GATHER of 16" in f[0].summary
    want = [(3, "ALL_GATHER of 32"), (1, "ALL_GATHER of 16"), (2, "ALL_GATHER of 16")]
    assert [(e["rank"], e["call"]) for e in f[0].evidence] == want
    assert [(r["rank"], r["call"]) for r in sql_rows(ctx, f[0])] == want


def test_a_rank_that_skipped_a_collective_shows_as_different_sizes_at_one_op_count():
    """README: hang_mismatch catches ranks 'calling different sizes at one op count'. Same op,
    same datatype, only the element count differs at #7: still a mismatch (bytes differ)."""
    n = job(n_ops=12)
    for row in n:
        if row["rank"] == 1 and row["op_count"] == 7:
            row["count"], row["bytes"] = 2048, 8192
    f = collective_mismatch(context(n))
    assert len(f) == 1 and f[0].kind == "hang_mismatch" and f[0].ranks == [1] and f[0].details["op_count"] == 7
    # the datatype alone differing (same count, other byte size) too
    n = job(n_ops=12)
    for row in n:
        if row["rank"] == 3 and row["op_count"] == 5:
            row["datatype"] = "float16"
    assert collective_mismatch(context(n))[0].ranks == [3]


def test_network_loss_sql_counts_each_connection_once_like_its_evidence():
    """Retransmissions seen by the tracer and both pcaps: the SQL gives one row per directed
    connection (with ports), the largest count one source saw, as the evidence does."""
    rows = loss_in_slow_windows([(1, 2), (2, 3)])
    rows += [{**r, "source": "pcap", "event": "retransmission", "capture": "pcap/x"} for r in rows]
    rows += [{**r, "source": "pcap", "event": "retransmission", "host": "node9", "capture": "pcap/y"}
             for r in rows if r["source"] == "bpf"][:5]
    ctx = context(job(dur_ms=slow_after(20)), rows)
    f = network_loss(ctx)[0]
    got = sql_rows(ctx, f)
    assert len(got) == len(f.evidence) == 2
    assert [(g["sender_rank"], g["receiver_rank"], g["from"], g["to"], g["retransmissions"]) for g in got] == \
        [(e["sender_rank"], e["receiver_rank"], e["from"], e["to"], e["retransmissions"]) for e in f.evidence]
    assert {g["retransmissions"] for g in got} == {60} and got[0]["from"] == f"{addr(1)}:40001"


def test_slow_link_sql_returns_the_links_with_the_slow_flag_and_a_readable_action():
    flows = [flow(a, b, 900.0 if (a, b) == (2, 3) else 6.0) for a, b in RING]
    ctx = context(job(), flows=flows)
    f = slow_link(ctx)[0]
    got = sql_rows(ctx, f)
    assert [(g["rank_a"], g["rank_b"], g["slow"], g["lossy"]) for g in got] == \
        [(e["rank_a"], e["rank_b"], e["slow"], e["lossy"]) for e in f.evidence]
    assert [g["slow"] for g in got] == [True, False, False, False]
    assert "them's" not in f.action
    assert f"the link between rank 2 (node2, {addr(2)}) and rank 3 (node3, {addr(3)})" in f.action
    one = slow_link(context(job(), flows=[flow(a, b, 900.0 if 1 in (a, b) else 6.0) for a, b in RING]))[0]
    assert f"the NIC and switch port of rank 1 (node1, {addr(1)})" in one.action and "them's" not in one.action


def test_hang_stuck_sql_returns_its_evidence_rows():
    n = job(n_ops=30, completed=lambda k, r: k < 25)
    t = T0 + 25 * 100 * MS
    rows = [tcp(t + i * 50 * MS, s, d) for i in range(1, 20) for s, d in ((0, 3), (3, 0), (2, 3))]
    ctx = context(n, rows, ended_ns=t + 4000 * MS)
    f = hang_stuck(ctx)[0]
    got = sql_rows(ctx, f)
    assert len(got) == len(f.evidence) == 20
    assert [(g["timestamp_ns"], g["sender_rank"], g["from"]) for g in got] == \
        [(e["timestamp_ns"], e["sender_rank"], e["from"]) for e in f.evidence]
    # no network trouble: the evidence and the SQL are how far each rank got
    ctx = context(n, ended_ns=t + 4000 * MS)
    f = hang_stuck(ctx)[0]
    assert [g["rank"] for g in sql_rows(ctx, f)] == [e["rank"] for e in f.evidence] == [0, 1, 2, 3]


def test_a_finding_that_does_not_serialize_becomes_a_problem_and_the_rest_are_stored():
    from forensics.analysis import _storable, _store_findings
    from forensics.findings import Finding
    good = Finding(kind="straggler", severity="warning", confidence=0.7, summary="rank 3 late",
                   ranks=[3], evidence=[{"op_count": np.int64(4), "late_ms": np.float64(1.5)}])
    bad = Finding(kind="slow_link", severity="info", confidence=0.5, summary="odd", details={(0, 1): 1})
    problems: list[str] = []
    stored = _storable([bad, good], problems)
    assert [f for f, _ in stored] == [good] and stored[0][1]["evidence"] == [{"op_count": 4, "late_ms": 1.5}]
    assert len(problems) == 1 and problems[0].startswith("finding slow_link left out")
    ctx = context(job())
    _store_findings(ctx.con, stored)
    assert ctx.con.execute("SELECT position, kind, ranks, evidence FROM findings").fetchall() == \
        [(1, "straggler", [3], '[{"op_count": 4, "late_ms": 1.5}]')]


# ---- issue 36: a link that drops is a fault whatever it costs today ---------------------------

def _lossy_fast_job(data_packets: int):
    """A fast job (every collective 5 ms) whose rank 1 resends 3 segments inside each of 30
    collectives, on its links to ranks 0 and 2, each link carrying ``data_packets`` segments."""
    rows = [tcp(T0 + k * 100 * MS + 2 * MS + i * 100_000, 1, peer) for k in range(10, 40) for peer in (0, 2)
            for i in range(3)]
    ctx = context(job(), rows)
    ft = [{"host": "node1", "capture": "ns-r1", "saddr": addr(1), "sport": 40001, "daddr": addr(p),
           "dport": 50000 + p, "data_packets": data_packets, "data_bytes": data_packets * 1448, "rank": 1,
           "peer_rank": p, "pid": 101} for p in (0, 2)]
    ctx.model.tables["flow_timing"] = conform(pd.DataFrame(ft), "flow_timing")
    return ctx, rows


def test_a_lossy_link_that_costs_little_is_a_warning_with_its_rate():
    from forensics.findings.link_loss import link_loss_rates
    ctx, rows = _lossy_fast_job(data_packets=4000)           # 90 of 4000: 2.2% per link
    rates = link_loss_rates(ctx)
    assert rates["lossy"].all() and sorted(rates["lost"]) == [90, 90]
    (f,) = network_loss(ctx)
    assert f.severity == "warning" and f.ranks == [1] and f.peer_ranks == [0, 2]
    assert "90 of 4000 data segments (2.2%)" in f.summary and "2.2%" in f.headline
    assert f.since_ns == min(r["timestamp_ns"] for r in rows) and f.since_source == "packets"
    # its twin: the same 90 resent segments among 400,000 (0.02%) are no fault of the link
    ctx, _ = _lossy_fast_job(data_packets=400_000)
    (f,) = network_loss(ctx)
    assert f.severity == "info" and "data segments" not in f.summary


# --------------------------------------------------------------------------- per-host captures apart

def _apart(first_half=(0, 1), k_split=20, n_ops=40):
    """Captures per host that do not overlap: ``first_half``'s hosts watched ops 0..k_split-1,
    the others' ops k_split..n_ops-1; each rank's tracer saw only its own host's share."""
    windows = [window(r, 0, k_split - 1) if r in first_half else window(r, k_split, n_ops - 1) for r in range(RANKS)]
    return windows, (lambda k, r: (k < k_split) == (r in first_half))


def test_collectives_seen_only_by_the_hosts_watching_then_are_complete_for_them():
    windows, seen = _apart()
    ctx = context(job(dur_ms=slow_after(20), entered=seen),
                  loss_in_slow_windows([(2, 3), (3, 2)]), windows=windows)
    c = ctx.table("collectives")
    assert (c["ranks_entered"] == 2).all() and (c["ranks_unwatched"] == 2).all()
    f = network_loss(ctx)
    assert len(f) == 1 and f[0].ranks == [2, 3], f
    assert len(ctx.con.execute(f[0].sql).fetchall()) > 0
    # its twins: the same calls with no capture windows known, or with every host watching
    # the whole job (ranks 0 and 1 then truly absent from the last 20), are not complete
    for w in ((), [window(r, 0, 45) for r in range(RANKS)]):
        ctx = context(job(dur_ms=slow_after(20), entered=seen), loss_in_slow_windows([(2, 3), (3, 2)]), windows=w)
        assert (ctx.table("collectives")["ranks_unwatched"] == 0).all()
        assert network_loss(ctx) == []


def test_a_rank_absent_while_its_host_watched_is_not_excused():
    # every host watched the whole job; rank 3 never entered the last ten: not complete
    windows = [window(r, 0, 39) for r in range(RANKS)]
    ctx = context(job(entered=lambda k, r: not (k >= 30 and r == 3)), windows=windows)
    c = ctx.table("collectives").set_index("op_count")
    assert c.loc[35, "ranks_entered"] == 3 and c.loc[35, "ranks_unwatched"] == 0
    assert c.loc[5, "ranks_entered"] == 4


def test_a_straggler_seen_beside_one_peer_while_the_others_were_unwatched():
    windows, seen = _apart(first_half=(0, 1))
    ctx = context(job(late=lambda k, r: 60.0 if r == 0 else 0.0, entered=seen), windows=windows)
    f = straggler(ctx)
    assert len(f) == 1 and f[0].ranks == [0], f
    assert len(ctx.con.execute(f[0].sql).fetchall()) > 0
    ctx = context(job(late=lambda k, r: 60.0 if r == 0 else 0.0, entered=seen))      # no windows: nothing full
    assert straggler(ctx) == []
