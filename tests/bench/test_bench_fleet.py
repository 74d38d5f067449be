"""bench/fleet.py's measure of the machine's own ceiling: two warmed-up readers of the per-host
stage started together, and one alone, on small scaled bundles."""
from __future__ import annotations

import sys

import pytest

from conftest import ROOT
from shipped import shipped_bundle

LOSS = shipped_bundle("loss")


def _bench(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.mark.skipif(LOSS is None, reason="no shipped loss bundle")
def test_machine_ceiling_times_the_same_work_alone_and_two_at_once(tmp_path):
    fleet = _bench("fleet")
    bundles = _bench("analyze").build(LOSS, tmp_path, ranks=12, packets=5_000, hosts=6, same_packets=True)
    alone, pair = fleet.ceiling_round(bundles)
    assert alone > 0 and pair > 0
    with pytest.raises(SystemExit, match="at least 6 host bundles"):
        fleet.ceiling_round(bundles[:5])


@pytest.mark.skipif(LOSS is None, reason="no shipped loss bundle")
def test_a_reader_that_fails_is_named_and_the_others_are_stopped(tmp_path):
    fleet = _bench("fleet")
    good = _bench("analyze").build(LOSS, tmp_path, ranks=2, packets=2_000, hosts=1)[0]
    missing = tmp_path / "no-such-bundle.tar.gz"
    with pytest.raises(SystemExit, match="no-such-bundle"):
        fleet.readers_at_once([[good, good], [missing, good]])
