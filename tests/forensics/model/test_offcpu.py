"""The ``offcpu`` table: capture's schedstat samples, in UTC, attributed to ranks."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from forensics.inputs.bundle import Bundle
from forensics.execution.host_reading import read_model
from forensics.model.offcpu import offcpu_samples
from forensics.model.schema import SCHEMAS
from shipped import BUNDLES, shipped_bundle

BUNDLE = shipped_bundle("straggler")
needs_bundle = pytest.mark.skipif(BUNDLE is None, reason="no shipped straggler bundle")


@needs_bundle
def test_offcpu_rows_are_the_tracers_samples_in_utc_per_rank():
    truth = json.loads((BUNDLES / "straggler" / "scenario.json").read_text())
    with Bundle.open(BUNDLE) as b:
        events = b.read_bpf_events()
        raw = [e for e in events if e.get("ev") == "offcpu"]
        df = offcpu_samples(b, events)
        started, ended = b.manifest.started_ns, b.manifest.ended_ns
    assert list(df.columns) == list(SCHEMAS["offcpu"]) and len(df) == len(raw) > 0
    assert df["timestamp_ns"].between(started - 10**9, ended + 10**9).all()
    # every rank's process is there, with the lab's pid
    pids = df.dropna(subset=["rank"]).groupby("rank")["pid"].first()
    assert {int(r): int(p) for r, p in pids.items()} == {r["rank"]: r["pid"] for r in truth["ranks"]}
    # deltas are the growth of the cumulative counters since the thread's previous sample
    for _, g in df.groupby(["pid", "tid"]):
        g = g.sort_values("timestamp_ns")
        assert pd.isna(g["offcpu_delta_ns"].iloc[0])
        assert (g["offcpu_delta_ns"].iloc[1:].astype("int64").tolist() ==
                g["offcpu_ns"].diff().iloc[1:].astype("int64").tolist())


@needs_bundle
def test_offcpu_is_a_sql_table_of_the_model():
    m = read_model([BUNDLE])
    con = m.connect()
    n, ranks = con.execute("SELECT count(*), count(DISTINCT rank) FROM offcpu").fetchone()
    assert n == len(m["offcpu"]) > 0 and ranks == 4
