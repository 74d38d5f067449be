"""The watcher's verdicts are a capture's (issue 43, items 4 and 5), as deployed (root, the lab):
a watcher started before jobs it was never told about (no --pid, no --nccl-lib), each job from a
library path it has never seen, so the tracer restarts for it and counts the job's calls from its
attach, mid-job, not from the communicator's init.

- a mismatch late in the job (op 700, some 15 s in, well after the tracer's restart): the
  bundle's verdict is hang_mismatch naming the rank that skipped and the op the lab's truth
  names (op numbers aligned to the job's own: model/op_align.py);
- a link down 3 s into a job: hang_stuck naming the dead link's rank;
- two jobs back to back (a clean one, then one that hangs, no pause between): the bundle's
  manifest ``job`` is the hung one's processes, and the report is of it alone.

Slow (minutes; ``make watch-align``): skipped unless STALLSCOPE_WATCH_ALIGN=1."""
from __future__ import annotations

import os

import pytest

from capture_helpers import bundle_manifest
from watched_jobs import WatchedJobs, watched_lab

pytestmark = pytest.mark.skipif(os.environ.get("STALLSCOPE_WATCH_ALIGN") != "1",
                                reason="minutes of lab jobs under a watcher: make watch-align")

HANG_AFTER_S, AFTER_S, BEFORE_S = 5, 5, 20


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with watched_lab(tmp_path_factory, "align", settle_s=8, hang_after_s=HANG_AFTER_S, after_s=AFTER_S,
                     before_s=BEFORE_S) as lab:
        yield lab


def _verdict(job: dict, watch: WatchedJobs):
    from forensics.analysis import analyze
    assert len(job["bundles"]) == 1, (job["bundles"], watch.err.read_text()[-3000:])
    m = bundle_manifest(job["bundles"][0])
    assert set(m["job"]["pids"]) == job["pids"], m.get("job")       # the bundle says which job hung
    res = analyze([str(job["bundles"][0])])
    assert not [p for p in res.problems if "detector" in p], res.problems
    pids = set(res.model.tables["nccl_events"]["pid"].dropna().astype(int))
    assert pids <= job["pids"], pids - job["pids"]                    # its events only
    return m, res.findings[0]


def test_a_late_mismatch_gets_the_rank_and_the_op_of_the_truth(lab):
    job = lab["watch"].run("mismatch", lab["build"], ["--scenario", "mismatch-hang", "--rank", "1", "--ranks", "3",
                                                      "--at-op", "700", "--hold-s", "25"])
    _, top = _verdict(job, lab["watch"])
    fault = job["truth"]["fault"]
    assert top.kind == "hang_mismatch" and top.ranks == fault["ranks"], (top.kind, top.ranks, top.summary)
    assert top.op_count == fault["op_index"], top.summary                  # the job's own number


def test_a_link_down_early_names_its_rank(lab):
    job = lab["watch"].run("linkdown", lab["build"], ["--scenario", "link-down-hang", "--rank", "2", "--ranks", "3",
                                                      "--start-s", "3", "--hold-s", "25"])
    _, top = _verdict(job, lab["watch"])
    fault = job["truth"]["fault"]
    assert top.kind == "hang_stuck" and set(fault["ranks"]) <= set(top.ranks), (top.kind, top.ranks, top.summary)
    addr, bad = fault["link"]["addr"], fault["link"]["rank"]
    assert any(addr in (lk.get("saddr"), lk.get("daddr")) or bad in (lk.get("rank"), lk.get("peer_rank"))
               for lk in top.links), top.links


def test_back_to_back_jobs_the_bundle_and_report_are_the_hung_ones(lab):
    watch = lab["watch"]
    clean = watch.run("first-clean", lab["build"], ["--scenario", "clean", "--ranks", "3", "--steps", "300"],
                      then_quiet=False)
    assert clean["bundles"] == []
    job = watch.run("second-hangs", lab["build"], ["--scenario", "mismatch-hang", "--rank", "2", "--ranks", "3",
                                                   "--at-op", "300", "--hold-s", "25"])
    m, top = _verdict(job, watch)
    assert any(set(o["pids"]) & clean["pids"] for o in m["job"]["others"]), m["job"]    # the first, marked
    assert top.kind == "hang_mismatch" and top.ranks == job["truth"]["fault"]["ranks"], top.summary
