"""Hidden variations (root): lab faults the shipped bundles do not show, captured and analysed.

Each case runs the fault-injection lab with another faulted rank, world size or rate than
tests/lab/make_bundles.sh uses, captures it with ``stallscope capture`` exactly as a user
would (tests/test_capture_lab.py's gated Run), and checks that ``analyze`` puts the right
kind of finding on top, naming the faulted rank from the lab's scenario.json. Small
tensors and few steps keep the five runs around 80 seconds together.
"""
from __future__ import annotations

import tarfile
import time

import pytest

from forensics.analysis import analyze
from test_capture_lab import Run
from test_capture_lab import lab_ready  # noqa: F401  (the module's root/tools fixture)

SMALL = ["--buckets", "32768,16384,8192", "--no-pcap"]
VARIATIONS = {
    # 3 ranks: every pair is a ring link; rank 1's two links are the lossy ones
    "loss-rank1-of-3": (["--scenario", "loss", "--ranks", "3", "--rank", "1", "--loss-permille", "50",
                         "--steps", "10", "--compute-ms", "100", "--start-s", "0.8"], "network_loss"),
    "straggler-rank0": (["--scenario", "straggler", "--ranks", "4", "--rank", "0", "--straggle-ms", "250",
                         "--steps", "10", "--compute-ms", "100", "--start-s", "0.8"], "straggler"),
    # the lab's default rate: a mild limiter whose queue shows only in the ACK RTT tail
    "slow-link-rank3-200mbit": (["--scenario", "slow-link", "--ranks", "4", "--rank", "3", "--rate", "200mbit",
                                 "--steps", "10", "--compute-ms", "100", "--start-s", "0.8"], "slow_link"),
    # the skipping rank goes on with the next collectives: sizes disagree from #30 on
    "skip-and-continue-rank2": (["--scenario", "mismatch-hang", "--ranks", "4", "--rank", "2", "--at-op", "30",
                                 "--skip-mode", "continue", "--compute-ms", "100", "--hold-s", "1.5"],
                                "hang_mismatch"),
    "link-down-rank0": (["--scenario", "link-down-hang", "--ranks", "4", "--rank", "0", "--start-s", "0.8",
                         "--hold-s", "1.5", "--buckets", "131072,65536,32768", "--compute-ms", "60"], "hang_stuck"),
}


@pytest.mark.parametrize("name", list(VARIATIONS))
@pytest.mark.usefixtures("lab_ready")
def test_hidden_variation_top_finding(tmp_path, name):
    args, kind = VARIATIONS[name]
    run = Run(tmp_path, SMALL + args, ["--duration", "2m", "--max-bytes", "4M"])
    try:
        run.start_lab()
        truth = run.wait_lab()
        time.sleep(1)   # the last tracer flush and lingering segments, as make_bundles.sh
        _, bundle = run.finish()
    finally:
        run.cleanup()
    a = analyze([bundle])
    try:
        top = a.top
        assert top is not None, a.problems
        found = [(f.kind, f.severity, f.ranks, f.summary) for f in a.findings]
        assert top.kind == kind, found
        if _all_pcaps_have_packets(bundle):
            assert top.ranks == truth["fault"]["ranks"], found
        else:
            # capture's tcpdump sometimes records nothing in a namespace (a capture issue, seen
            # in about one lab run in six): with one side of the links missing, the finding may
            # name the faulted rank together with its link peer, no more
            assert set(truth["fault"]["ranks"]) <= set(top.ranks) and len(top.ranks) <= 2, found
        assert a.con.execute(top.sql).fetchall()
    finally:
        a.close()


def _all_pcaps_have_packets(bundle) -> bool:
    with tarfile.open(bundle) as t:
        sizes = [m.size for m in t.getmembers() if m.name.endswith(".pcap")]
    return bool(sizes) and min(sizes) > 24   # 24 bytes: a pcap header and no packet
