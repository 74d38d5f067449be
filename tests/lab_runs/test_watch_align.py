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

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capture_helpers import bundle_manifest
from conftest import ROOT, require_root, require_tool

from capture.watch.watcher import RING_SLACK_S

pytestmark = pytest.mark.skipif(os.environ.get("STALLSCOPE_WATCH_ALIGN") != "1",
                                reason="minutes of lab jobs under a watcher: make watch-align")

PY = sys.executable
LAB = ROOT / "tests" / "lab"
HANG_AFTER_S, AFTER_S, BEFORE_S = 5, 5, 20
SMALL = ["--compute-ms", "30", "--buckets", "131072,65536"]


class Watch:
    """One watcher for the module; each job's bundles are those that appeared while it ran and
    name one of its processes (the host may run other jobs)."""

    def __init__(self, base: Path):
        self.base, self.bundles, self.err = base, base / "bundles", base / "watch.err"
        self.bundles.mkdir()
        from tests.lab.watcher import start_watcher
        self.proc = start_watcher(self.bundles, ["--status-every", "30s", "--hang-after", f"{HANG_AFTER_S}s",
                                                 "--after", f"{AFTER_S}s", "--before", f"{BEFORE_S}s"], self.err)

    def run(self, name: str, build: Path, lab_args: list[str], then_quiet: bool = True) -> dict:
        lib = build.parent / f"opt-{random.randrange(1 << 30):x}" / "nccl"
        shutil.copytree(build, lib, ignore=shutil.ignore_patterns("static"))
        before = set(self.bundles.glob("stallscope-*.tar.gz"))
        out = self.base / name
        p = subprocess.run([PY, "-m", "tests.lab.launcher", "--build", str(lib), "--out", str(out / "lab"),
                            *lab_args, *SMALL], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=400)
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        truth = json.loads((out / "lab" / "scenario.json").read_text())
        pids = {r["pid"] for r in truth["ranks"]}

        def mine() -> list[Path]:
            new = sorted(set(self.bundles.glob("stallscope-*.tar.gz")) - before)
            return [b for b in new if set(bundle_manifest(b)["trigger"]["pids"]) & pids]
        # a hang's bundle may come after the job: the watcher writes one incident at a time, and
        # another job's on the host may be before it
        deadline = time.monotonic() + (90 if truth["fault"].get("kind") not in (None, "none") else 2)
        while not mine() and time.monotonic() < deadline:
            time.sleep(2)
        if then_quiet:
            time.sleep(BEFORE_S + AFTER_S + RING_SLACK_S)
        return {"truth": truth, "pids": pids, "bundles": mine()}

    def close(self) -> None:
        from tests.lab.watcher import stop_watcher
        stop_watcher(self.proc)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require_root()
    require_tool("gcc", "make", "ip", "unshare", "bridge", "ss", "nsenter", "tcpdump", "bpftrace", "nft", "tc")
    from tests.lab import netns
    build = tmp_path_factory.mktemp("labbuild") / "build"
    p = subprocess.run(["make", "-C", str(LAB), "all", f"BUILD={build}"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    watch = Watch(tmp_path_factory.mktemp("align"))
    time.sleep(8)
    try:
        yield {"build": build, "watch": watch}
    finally:
        watch.close()
        assert netns.leftovers() == {"namespaces": [], "pids": [], "links": []}


def _verdict(job: dict, watch: Watch):
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
