"""The ``flow_timing`` table: per-connection ACK RTT percentiles and busy rate, checked
against the TCP engine's own per-packet output and against the slow-link ground truth."""
from __future__ import annotations

import json

import numpy as np
import pytest

from forensics.inputs.bundle import Bundle
from forensics.execution.host_reading import read_model
from forensics.model.schema import SCHEMAS
from forensics.model.hosts import scan_pcaps
from forensics.model.tcp_ranks import Attribution
from forensics.model.timing import flow_timing
from forensics.tcp import analyze_file
from shipped import BUNDLES, shipped_bundle

SLOW = shipped_bundle("slow-link")
needs_bundle = pytest.mark.skipif(SLOW is None, reason="no shipped slow-link bundle")


@needs_bundle
def test_rtt_percentiles_equal_the_engines_per_packet_ack_rtt():
    import pandas as pd
    with Bundle.open(SLOW) as b:
        empty = pd.DataFrame(columns=["host", "addr", "port", "pid"])
        attr = Attribution(empty, pd.DataFrame(columns=["host", "pid", "rank"]),
                           pd.DataFrame(columns=["host", "netns", "pid"]))
        # the timing rides along the model's one engine pass over each capture
        df = flow_timing(attr, scan_pcaps(b).timing)
        rel, path = b.pcaps()[0]
        pk = analyze_file(path, keep="all").packets
    assert list(df.columns) == list(SCHEMAS["flow_timing"])
    acks = pk[pk["ack_rtt_ns"] > 0]
    # the RTT on an ACK belongs to the data flowing the other way
    for (src, sport, dst, dport), g in acks.groupby(["dst", "dport", "src", "sport"], observed=True):
        row = df[(df["capture"] == rel) & (df["saddr"] == str(src)) & (df["sport"] == sport)
                 & (df["daddr"] == str(dst)) & (df["dport"] == dport)]
        assert len(row) == 1
        v = np.sort(g["ack_rtt_ns"].to_numpy())
        assert int(row["rtt_samples"].iat[0]) == len(v)
        assert row["rtt_p50_ns"].iat[0] == v[int(np.floor(0.5 * (len(v) - 1)))]
        assert row["rtt_max_ns"].iat[0] == v[-1]
    # data bytes per connection equal the engine's payload sums
    data = pk[pk["len"] > 0].groupby(["src", "sport", "dst", "dport"], observed=True)["len"].sum()
    for (src, sport, dst, dport), n in data.items():
        row = df[(df["capture"] == rel) & (df["saddr"] == str(src)) & (df["sport"] == sport)
                 & (df["daddr"] == str(dst)) & (df["dport"] == dport)]
        assert int(row["data_bytes"].iat[0]) == int(n)


@needs_bundle
def test_the_slow_ranks_connections_hold_the_queue():
    truth = json.loads((BUNDLES / "slow-link" / "scenario.json").read_text())
    slow = truth["fault"]["ranks"][0]
    m = read_model([SLOW])
    t = m["flow_timing"].dropna(subset=["rank", "peer_rank", "rtt_p99_ns"])
    t = t[t["rtt_samples"] >= 20]
    touching = (t["rank"] == slow) | (t["peer_rank"] == slow)
    assert touching.any() and (~touching).any()
    # the tail shows the queue on every link of the slow rank (in its worst connection), the
    # medians do not differ much
    t = t.assign(link=[tuple(sorted(x)) for x in zip(t["rank"], t["peer_rank"])])
    worst = t[touching].groupby("link")["rtt_p99_ns"].max()
    assert len(worst) == 2 and worst.min() > 10 * t.loc[~touching, "rtt_p99_ns"].max()
    assert t.loc[touching, "rtt_p50_ns"].median() < 5 * t.loc[~touching, "rtt_p50_ns"].median()
    assert (t["busy_rate_bps"].dropna() > 0).all()
