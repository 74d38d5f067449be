"""bench/analyze.py's scaled bundle is a valid bundle of the requested shape (small here)."""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT
from forensics.execution.host_reading import read_model
from shipped import shipped_bundle

LOSS = shipped_bundle("loss")


@pytest.mark.skipif(LOSS is None, reason="no shipped loss bundle")
@pytest.mark.parametrize("hosts", [1, 2])
def test_scaled_bundle_has_every_rank_and_the_packets(tmp_path, hosts):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import analyze as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    bundles = bench.build(LOSS, tmp_path, ranks=8, packets=20_000, hosts=hosts, repeat=2)
    assert len(bundles) == hosts
    m = read_model(bundles)
    n = m["nccl_events"]
    per_rank = n.groupby("rank")["op_count"].nunique()
    assert sorted(per_rank.index) == list(range(8)) and per_rank.nunique() == 1
    assert set(n["nranks"]) == {8}
    # the op counts continue across the repeated timeline; every collective has all 8 ranks
    c = m.connect().execute("SELECT min(ranks_entered), max(op_count) FROM collectives").fetchone()
    assert c[0] == 8 and c[1] + 1 == per_rank.iat[0]
    # each host's capture carries the requested packets, between the ranks' addresses
    assert sum(m["flows"].groupby("host")[["packets_orig", "packets_resp"]].sum().sum(axis=1) >= 19_000) == hosts
    assert m["flows"]["rank"].notna().all()
    # consistent: no corrupt event, every file the manifest lists is there with its size
    assert not [p for p in m.problems if "wrong type" in p or "manifest" in p], m.problems
