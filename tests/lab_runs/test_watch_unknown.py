"""The black box as an operator runs it (root, the lab): a watcher started long before jobs it
knows nothing about, with no --pid and no --nccl-lib, as deploy/ runs it. Each job brings its
own copy of the lab's NCCL from a path the watcher has never seen; the watcher must trace it
(capture.collectors.tracer: the tracer restarted on the libraries that appear), catch its hang,
and write a bundle that holds the onset and names the rank.

The default suite runs one job (a link-down hang from a fresh library path) a short while after
the watcher started. ``make watch-unknown-jobs`` runs the whole matrix (STALLSCOPE_UNKNOWN_ALL=1):
the first job 30-60 s after the watcher, a mismatch hang from another copy after it, a job in its
own mount namespace (a container: the library bind-mounted at a path that exists only there),
a job whose NCCL is linked in and stripped (nothing to trace: the tracer-free trigger), and a
clean job watched for 5 minutes (no bundle)."""
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

from capture_helpers import bundle_manifest, wait_for
from conftest import ROOT, require_root, require_tool

from capture.watch.watcher import RING_SLACK_S
from tests.lab.verdicts import names_link

PY = sys.executable
LAB = ROOT / "tests" / "lab"
S = 1_000_000_000
ALL = os.environ.get("STALLSCOPE_UNKNOWN_ALL") == "1"
HANG_AFTER_S, AFTER_S, BEFORE_S = 5, 5, 20
SMALL = ["--compute-ms", "30", "--buckets", "131072,65536"]


class Watch:
    """One watcher for the whole module (it sees every job of the host), and the jobs run under it
    one after the other; each job's bundle is the one that appeared during it."""

    def __init__(self, base: Path):
        self.base = base
        self.bundles = base / "bundles"
        self.bundles.mkdir()
        self.err = base / "watch.err"
        self.proc = subprocess.Popen(
            [PY, "-m", "forensics", "capture", "--watch", "-o", str(self.bundles), "--status-every", "30s",
             "--hang-after", f"{HANG_AFTER_S}s", "--after", f"{AFTER_S}s", "--before", f"{BEFORE_S}s",
             "--cooldown", "1s"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(self.err, "wb"))
        wait_for(lambda: b"capturing:" in self.err.read_bytes() or self.proc.poll() is not None, 120,
                  "the watcher to start")
        assert self.proc.poll() is None, self.err.read_text()
        self.started = time.monotonic()
        self.quiet_from = 0.0

    def run_job(self, name: str, build: Path, lab_args: list[str], wrap: list[str] | None = None) -> dict:
        """Run a lab job to its end (the launcher holds the hang, then tears it down); its truth and
        the bundles written meanwhile. A job starts once the one before it is out of the rings
        (--before + --after + the rings' slack): the jobs of the lab have the same addresses and
        rank numbers, and a bundle holding two of them is judged on both (the README's limits)."""
        time.sleep(max(0.0, self.quiet_from - time.monotonic()))
        before = set(self.bundles.glob("stallscope-*.tar.gz"))
        out = self.base / name
        argv = [PY, "-m", "tests.lab.launcher", "--build", str(build), "--out", str(out / "lab"), *lab_args]
        p = subprocess.run((wrap or []) + argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=400)
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        time.sleep(2)
        # the rings' age, then the prune (every 10 s) that forgets the job's processes
        self.quiet_from = time.monotonic() + BEFORE_S + AFTER_S + RING_SLACK_S + 15
        new = sorted(set(self.bundles.glob("stallscope-*.tar.gz")) - before)
        return {"truth": json.loads((out / "lab" / "scenario.json").read_text()), "bundles": new}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require_root()
    require_tool("gcc", "make", "ip", "unshare", "bridge", "ss", "nsenter", "tcpdump", "bpftrace", "nft", "tc",
                 "strip")
    from tests.lab import netns
    build = tmp_path_factory.mktemp("labbuild") / "build"
    p = subprocess.run(["make", "-C", str(LAB), "all", "static", f"BUILD={build}"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    netns.sweep()
    base = tmp_path_factory.mktemp("unknown")
    watch = Watch(base)
    try:
        yield {"build": build, "base": base, "watch": watch}
    finally:
        watch.close()
        assert netns.leftovers() == {"namespaces": [], "pids": [], "links": []}


def _fresh_copy(build: Path, where: Path) -> Path:
    """The lab's binaries and libraries in a path nobody has used (a job's own venv or image)."""
    dest = where / f"opt-{random.randrange(1 << 30):x}" / "nccl"
    shutil.copytree(build, dest, ignore=shutil.ignore_patterns("static"))
    return dest


def _check(job: dict, watch: Watch, kind: str | None, link: bool, source: str | None = None,
           slack_s: float = 0.0) -> dict:
    from forensics.analysis import analyze
    from forensics.report import html
    truth = job["truth"]
    onset = truth["fault"]["start_time_ns"]
    assert len(job["bundles"]) == 1, (job["bundles"], watch.err.read_text()[-3000:])
    m = bundle_manifest(job["bundles"][0])
    assert m["trigger"]["kind"] == "hang", m["trigger"]
    if source:
        assert m["trigger"]["source"].startswith(source), m["trigger"]
    # the first archive within --hang-after + 10 s of the onset; its completion --after later
    first = m["watch"].get("first_written_ns", m["ended_ns"])
    assert first - onset <= (HANG_AFTER_S + 10 + slack_s) * S, (first - onset) / S
    assert m["ended_ns"] - onset <= (HANG_AFTER_S + AFTER_S + 20 + slack_s) * S, (m["ended_ns"] - onset) / S
    assert m["watch"]["window_ns"][0] <= onset - 5 * S
    res = analyze([str(job["bundles"][0])])
    assert not [p for p in res.problems if "detector" in p], res.problems
    assert "<html" in html.render(res)                  # the report of a watcher's bundle renders
    top = res.findings[0]
    if kind is None:            # a hang, whatever its kind: the tracer-free trigger's bundle
        assert top.severity == "error" and top.kind.startswith(("hang", "connection")), top
        return m
    assert top.kind == kind, [(f.kind, f.summary) for f in res.findings[:3]]
    assert set(truth["fault"]["ranks"]) <= set(top.ranks), (top.ranks, top.summary)
    if link:                    # the dead link, by its address or by the ranks at its ends
        assert names_link(top, truth), top.links
    return m


def _traced(m: dict, lib_dir: Path) -> None:
    """The tracer covered the job's own library (found by itself, not given)."""
    rec = m["collectors"]["tracer"]
    libs = [p for r in rec.get("restarts") or [] for p in r["libraries"]] + list(rec.get("libraries") or [])
    assert any(str(lib_dir) in p or "/proc/" in p for p in libs), (libs, rec.get("restarts"))
    assert m["options"]["pids"] == [] and m["options"]["nccl_libs"] == []
    versions = {p.get("nccl_version") for p in m["processes"] if p.get("libnccl")}
    assert versions and None not in versions, versions


def test_a_job_from_an_unseen_library_path_is_traced_and_its_hang_caught(lab):
    watch, base = lab["watch"], lab["base"]
    delay = random.uniform(30, 60) if ALL else 8.0
    time.sleep(max(0.0, delay - (time.monotonic() - watch.started)))
    lib = _fresh_copy(lab["build"], base)
    job = watch.run_job("link-down-a", lib, ["--scenario", "link-down-hang", "--rank", "2", "--ranks", "3",
                                             "--start-s", "14", "--hold-s", "25"] + SMALL)
    m = _check(job, watch, "hang_stuck", True, source="tracer")
    _traced(m, lib)
    assert "tracer restarted" in watch.err.read_text()


@pytest.mark.skipif(not ALL, reason="the full matrix: make watch-unknown-jobs (STALLSCOPE_UNKNOWN_ALL=1)")
def test_a_second_job_from_another_copy_after_the_first(lab):
    watch = lab["watch"]
    lib = _fresh_copy(lab["build"], lab["base"])
    job = watch.run_job("mismatch-b", lib, ["--scenario", "mismatch-hang", "--rank", "1", "--ranks", "3",
                                            "--at-op", "450", "--hold-s", "25"] + SMALL)
    m = _check(job, watch, "hang_mismatch", False, source="tracer")
    _traced(m, lib)


@pytest.mark.skipif(not ALL, reason="the full matrix: make watch-unknown-jobs (STALLSCOPE_UNKNOWN_ALL=1)")
def test_a_job_in_its_own_mount_namespace(lab):
    """As a container: the library bind-mounted at a path that exists only in the job's mount
    namespace; the watcher reaches it through /proc/PID/root."""
    watch = lab["watch"]
    lib = _fresh_copy(lab["build"], lab["base"])
    inside = "/run/stallscope-test-container/nccl"
    script = (f"mkdir -p /run/stallscope-test-container && mount -t tmpfs tmpfs /run/stallscope-test-container && "
              f"mkdir {inside} && mount --bind {lib} {inside} && exec \"$@\"")
    job = watch.run_job("container-c", Path(inside),
                        ["--scenario", "link-down-hang", "--rank", "1", "--ranks", "3", "--start-s", "14",
                         "--hold-s", "25"] + SMALL,
                        wrap=["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"])
    assert not Path(inside).exists()                     # the path exists only in the job's namespace
    m = _check(job, watch, "hang_stuck", True, source="tracer")
    rec = m["collectors"]["tracer"]
    libs = [p for r in rec.get("restarts") or [] for p in r["libraries"]]
    assert any(p.startswith("/proc/") and p.endswith("libnccl.so.2") for p in libs), libs


@pytest.mark.skipif(not ALL, reason="the full matrix: make watch-unknown-jobs (STALLSCOPE_UNKNOWN_ALL=1)")
def test_a_job_the_tracer_cannot_attach_to_is_caught_without_it(lab):
    """NCCL linked into the executable, its symbols hidden and stripped: no library to trace. The
    job is found by its NCCL_* variables and its hang by the tracer-free trigger (its connections
    stopped with data waiting)."""
    watch = lab["watch"]
    static = _fresh_copy(lab["build"] / "static", lab["base"])
    job = watch.run_job("static-d", static, ["--scenario", "link-down-hang", "--rank", "2", "--ranks", "3",
                                             "--start-s", "10", "--hold-s", "30"] + SMALL)
    # found by its variables and sampled every 2 s: two samples more than a traced job's trigger
    m = _check(job, watch, None, False, source="tracer-free", slack_s=6)
    ranks = {p["pid"]: p for p in m["processes"]}
    assert m["trigger"]["pids"] and all("nccl-env" in (ranks[p].get("job_reasons") or [])
                                        and not ranks[p].get("libnccl") for p in m["trigger"]["pids"])


@pytest.mark.skipif(not ALL, reason="the full matrix: make watch-unknown-jobs (STALLSCOPE_UNKNOWN_ALL=1)")
def test_a_clean_job_started_after_it_writes_no_bundle(lab):
    """Five minutes (STALLSCOPE_UNKNOWN_CLEAN_S) of a healthy job from yet another library path,
    traced after a restart like the others: no trigger, no bundle."""
    watch = lab["watch"]
    clean_s = float(os.environ.get("STALLSCOPE_UNKNOWN_CLEAN_S", "300"))
    lib = _fresh_copy(lab["build"], lab["base"])
    restarts = watch.err.read_text().count("tracer restarted")
    # about 40 ms a step (30 ms of "compute" and the collectives): the job lasts clean_s
    job = watch.run_job("clean-e", lib, ["--scenario", "clean", "--ranks", "3", "--steps", str(int(clean_s / 0.04)),
                                         "--run-timeout-s", f"{clean_s + 120:g}"] + SMALL)
    err = watch.err.read_text()
    assert job["bundles"] == [] and "TRIGGER" not in err.split("tracer restarted")[-1], err[-3000:]
    assert err.count("tracer restarted") > restarts          # its library was traced too
    assert watch.proc.poll() is None, err[-2000:]
