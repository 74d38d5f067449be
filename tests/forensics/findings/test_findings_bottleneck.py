"""A link slow of *rate*, seen only after it slowed down (staggered captures): every collective
in the window crossed it, none is fast to compare with, and slow_link must still weigh what it
cost (forensics/findings/bottleneck.py): the time each collective's bytes took longer over it
than over the other links. Synthetic tables of the 4-rank job of tests/traced_job.py (ring
r -> r+1, one all-reduce communicator); each negative case has its positive twin."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics.findings import Context
from forensics.findings.bottleneck import link_rates, transfer_excess
from forensics.findings.collectives import collective_windows
from forensics.findings.network import slow_link
from forensics.model.schema import conform
from traced_job import MS, addr, context, job

RING = [(0, 1), (1, 2), (2, 3), (3, 0)]
NBYTES = 512 * 1024
SLOW_BPS, FAST_BPS = 36e6, 1e9


def _flow(a: int, b: int, rtt_us: float) -> dict:
    return {"host": "h", "capture": f"pcap/r{a}.pcap", "stream": a * 10 + b, "orig_addr": addr(a),
            "orig_port": 40000, "resp_addr": addr(b), "resp_port": 50000, "bytes_resp": 10**7, "retransmissions": 0,
            "rtt_mean_ns": rtt_us * 1e3, "rank": a, "peer_rank": b}


def _timing(a: int, b: int, rate_bps: float, rtt_us: float = 10.0, data_bytes: int = 10**6) -> dict:
    return {"host": "h", "capture": f"pcap/r{a}.pcap", "saddr": addr(a), "sport": 40000, "daddr": addr(b),
            "dport": 50000, "data_packets": 500, "data_bytes": data_bytes, "rtt_samples": 250,
            "rtt_p50_ns": rtt_us * 5e2, "rtt_p90_ns": rtt_us * 1e3, "rtt_p99_ns": rtt_us * 2e3, "rtt_max_ns": rtt_us * 4e3, "busy_rate_bps": rate_bps,
            "rank": a, "peer_rank": b}


def _context(slow_rate: float = SLOW_BPS, dur_ms: float = 300.0, nbytes: int = NBYTES) -> Context:
    """Every collective equally slow (no spread), rank 2 <-> 3 queueing at ``slow_rate``."""
    rows = [{**r, "bytes": nbytes} for r in job(dur_ms=lambda k: dur_ms)]
    flows = [_flow(a, b, 900.0 if (a, b) == (2, 3) else 6.0) for a, b in RING]
    m = context(rows, flows=flows).model
    m.tables["flow_timing"] = conform(pd.DataFrame(
        [_timing(a, b, slow_rate if (a, b) == (2, 3) else FAST_BPS, 15000.0 if (a, b) == (2, 3) else 10.0)
         for a, b in RING]), "flow_timing")
    return Context(model=m, con=m.connect())


def _done(ctx) -> pd.DataFrame:
    w = collective_windows(ctx)
    return w[w["complete"]].reset_index(drop=True)


def test_transfer_excess_is_the_time_the_bytes_take_longer():
    ctx = _context()
    assert link_rates(ctx, [(2, 3)], 0.1) == (SLOW_BPS, FAST_BPS)
    extra = transfer_excess(ctx, _done(ctx), [(2, 3)], 0.1)
    bits = NBYTES * 8 * 2 * 3 / 4             # an all-reduce of 4 ranks: 2 (n-1)/n of its bytes a link
    assert extra is not None and len(extra) == 40
    assert extra == pytest.approx(np.full(40, bits / SLOW_BPS * 1e9 - bits / FAST_BPS * 1e9))


def test_transfer_excess_never_exceeds_the_collective():
    ctx = _context(dur_ms=50.0)
    extra = transfer_excess(ctx, _done(ctx), [(2, 3)], 0.1)
    assert extra is not None and extra.max() == pytest.approx(50 * MS)


def test_no_bottleneck_of_rate_no_excess():
    ctx = _context(slow_rate=FAST_BPS * 0.8)
    assert transfer_excess(ctx, _done(ctx), [(2, 3)], 0.1) is None
    # collectives of a communicator that does not span the slow link cost nothing there
    ctx = _context()
    other = _done(ctx).assign(comm_id_hash="0xother")
    assert transfer_excess(ctx, _done(ctx), [(2, 3)], 0.1).all() and not transfer_excess(ctx, other, [(2, 3)], 0.1).any()


def test_slow_link_seen_only_slow_is_not_info():
    f = slow_link(_context())
    assert len(f) == 1 and set(f[0].ranks) <= {2, 3} and f[0].ranks
    # 40 collectives of 300 ms, each ~169 ms longer for its bytes over the 36 Mbit/s link
    assert f[0].impact_share == pytest.approx((NBYTES * 12 / SLOW_BPS - NBYTES * 12 / FAST_BPS) / 0.3, rel=1e-3)
    assert f[0].severity == "error" and "its rate (36 Mbit/s while busy vs 1000 on the other links)" in f[0].summary
    # its twin: the same queue on a link of full rate costs no more than its round trips
    g = slow_link(_context(slow_rate=FAST_BPS))
    assert len(g) == 1 and g[0].impact_share < 0.01 and "its rate" not in g[0].summary


def _links(rtts: dict) -> pd.DataFrame:
    return pd.DataFrame([{"a": a, "b": b, "rtt": r} for (a, b), r in rtts.items()]).sort_values("rtt") \
        .reset_index(drop=True)


def test_one_endpoints_links_are_a_slow_group_even_when_a_majority():
    from forensics.findings.link_delays import rtt_split
    # a job of three ranks, rank 0's NIC slow: two links of three (the lab's slow-link, 3 ranks)
    cand = _links({(0, 1): 20e6, (0, 2): 25e6, (1, 2): 0.2e6})
    k = rtt_split(cand)
    assert k == 1 and {tuple(x) for x in cand[["a", "b"]].iloc[k:].to_numpy()} == {(0, 1), (0, 2)}
    # its twin: a majority of slow links that share no endpoint is no group (four ranks, six links)
    mesh = _links({(0, 1): 20e6, (2, 3): 21e6, (0, 2): 22e6, (1, 3): 23e6, (0, 3): 0.2e6, (1, 2): 0.2e6})
    assert rtt_split(mesh) is None


def test_a_per_process_world_communicator_spans_the_slow_link():
    # a capture started after the job created its communicator keys each process's calls on its
    # own (host:pid:comm): one rank per key; of the world's size, each spans every rank
    ctx = _context()
    done = _done(ctx)
    own = done.assign(comm_id_hash=[f"node{k % 4}:10{k % 4}:0x{k % 4}" for k in range(len(done))])
    c = ctx.model.tables["collectives"]
    c["comm_id_hash"] = own["comm_id_hash"].to_numpy()[:len(c)]
    c["ranks"] = [np.array([k % 4]) for k in range(len(c))]
    extra = transfer_excess(ctx, own, [(2, 3)], 0.1)
    assert extra is not None and extra.all()
    # its twin: a per-process communicator smaller than the world's spans nothing known
    c["nranks"] = [2 if k % 4 == 0 else 4 for k in range(len(c))]
    small = transfer_excess(ctx, own, [(2, 3)], 0.1)
    assert not small[np.arange(len(c)) % 4 == 0].any() and small[np.arange(len(c)) % 4 != 0].all()


def _fr_context(before_ms: float, during_ms: float) -> Context:
    """The job of :func:`_context` seen only slow, its link's rate no slower than the others' (no
    rate cost), with a Flight Recorder whose entries reach back before the capture (T0 + 2 s)."""
    from traced_job import T0
    ctx = _context(slow_rate=FAST_BPS)
    cap0 = T0 + 2000 * MS
    fr = [{"host": f"node{r}", "rank": r, "pid": 100 + r, "pg_id": "0", "collective_seq_id": k,
           "profiling_name": "nccl:all_reduce", "state": "completed", "time_created_ns": T0 + k * 100 * MS,
           "duration_ms": before_ms if T0 + k * 100 * MS < cap0 else during_ms} for k in range(40) for r in range(4)]
    ctx.model.tables["fr_entries"] = conform(pd.DataFrame(fr), "fr_entries")
    ctx.model.captures[:] = [{"host": f"node{r}", "started_ns": cap0, "ended_ns": T0 + 4000 * MS} for r in range(4)]
    return Context(model=ctx.model, con=ctx.model.connect())


def test_the_flight_recorder_remembers_the_collectives_before_the_link_slowed():
    # seed-54 accuracy case 6: captures 9.9 s into a 38 Mbit/s link; every collective in them
    # 300 ms (no spread), the ring's other links as slow while busy (no rate cost): info, 0.0%.
    # The Flight Recorder's entries from before the capture took 8.7 ms
    f = slow_link(_fr_context(10.0, 300.0))
    assert len(f) == 1 and f[0].severity == "error", (f[0].severity, f[0].summary)
    assert f[0].impact_share == pytest.approx(1 - 10 / 300)
    assert "the Flight Recorder's nccl:all_reduce took 10 ms (median) before the capture began and 300 ms" \
        in f[0].summary
    # its twin: the collectives took as long before the capture: no slowdown to weigh
    g = slow_link(_fr_context(250.0, 300.0))
    assert len(g) == 1 and g[0].impact_share < 0.01 and "Flight Recorder" not in g[0].summary
