"""Hidden variations (root): lab faults the shipped bundles do not show, captured and analysed.

Each case runs the fault-injection lab with another faulted rank, world size or rate than
tests/lab/make_bundles.sh uses, captures it with ``stallscope capture`` exactly as a user
would (tests/lab_runs/test_capture_lab.py's gated Run), and checks that ``analyze`` puts the right
kind of finding on top, naming the faulted rank from the lab's scenario.json. Small
tensors and few steps keep the five runs around 80 seconds together.
"""
from __future__ import annotations

import time

import pytest

from capture_helpers import bundle_manifest
from forensics.analysis import analyze
from test_capture_lab import Run
from test_capture_lab import lab_ready  # noqa: F401  (the module's root/tools fixture)

SMALL = ["--buckets", "32768,16384,8192", "--no-pcap"]
VARIATIONS = {
    # 3 ranks: every pair is a ring link; rank 1's two links are the lossy ones. 14 steps: the
    # fault lasts long enough for each of the two links to show loss of its own (with one
    # link's handful of retransmissions only, the evidence could not clear its other end)
    "loss-rank1-of-3": (["--scenario", "loss", "--ranks", "3", "--rank", "1", "--loss-permille", "50",
                         "--steps", "14", "--compute-ms", "100", "--start-s", "0.5"], "network_loss"),
    "straggler-rank0": (["--scenario", "straggler", "--ranks", "4", "--rank", "0", "--straggle-ms", "250",
                         "--steps", "10", "--compute-ms", "100", "--start-s", "0.8"], "straggler"),
    # the lab's default rate: a mild limiter whose queue shows only in the ACK RTT tail. It is
    # on for most of the job: started 0.8 s into a 10-step job it covered its last ~30% (less
    # the time tc takes to apply it, longer on a busy machine); on a job's last tenth the queue
    # reaches one connection of a link at most, which slow_link rightly does not call a slow path
    "slow-link-rank3-200mbit": (["--scenario", "slow-link", "--ranks", "4", "--rank", "3", "--rate", "200mbit",
                                 "--steps", "16", "--compute-ms", "100", "--start-s", "0.4"], "slow_link"),
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
    # every rank's namespace has its packets in the bundle, although capture found the ranks
    # (and started tcpdump) only after the job began: the short jobs here end within a second,
    # and before capture's tcpdump ran with --immediate-mode, libpcap's block ring held the
    # packets of the namespaces started last until the lab's teardown killed them unwritten
    packets = _pcap_packets(bundle)
    fault = truth["fault"]
    if fault["kind"] in ("loss", "slow-link"):  # on for at least half of the job, or the case
        start = truth["train_start_ns"]         # tests the lab's timing, not the analysis
        cover = (truth["job_ended_ns"] - fault["applied_ns"]) / (truth["job_ended_ns"] - start)
        assert cover >= 0.5, f"the lab applied the fault late: it covered {cover:.0%} of the job"
    assert len(packets) == truth["world_size"] and min(packets.values()) > 0, packets
    a = analyze([bundle])
    try:
        top = a.top
        assert top is not None, a.problems
        found = [(f.kind, f.severity, f.ranks, f.summary) for f in a.findings]
        assert top.kind == kind, found
        assert top.ranks == truth["fault"]["ranks"], found
        assert a.con.execute(top.sql).fetchall()
    finally:
        a.close()


def _pcap_packets(bundle) -> dict[str, int]:
    """Packets per pcap of the bundle, as capture's manifest counted them."""
    return {k: v.get("packets", 0) for k, v in bundle_manifest(bundle)["collectors"].items()
            if k.startswith("tcpdump@")}
