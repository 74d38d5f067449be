#!/usr/bin/env python3
"""Time to bundle: from the onset of a hang to a complete bundle on disk, and to a verdict.

    sudo .venv/bin/python bench/time_to_bundle.py [--runs N] [--profile defaults|fast|both] [--seed S]

Per run, a watcher starts as deploy/ runs it (``stallscope capture --watch`` with no --pid and
no --nccl-lib), then a lab job (tests/lab: 3 ranks in network namespaces, from its own copy of
the lab's NCCL, so the tracer is re-attached for it) with an injected hang (a fresh watcher per
run: a bundle of a hang right after another job's would hold both, README "Limits"): a link down and a skipped collective (mismatch) in turn, at a random
time. Per run: the onset (the lab's truth, the fault's start), the bundle complete on disk (the
archive's rename into place), and the verdict (``stallscope analyze`` run on it once it is
there: its wall time added). Printed: each run, then the median and the 90th percentile of
both per profile, beside the 15 s in which the best in-house systems detect 90% of incidents.

Profiles: ``defaults`` (``--hang-after`` auto, the larger of 30 s and 10x the slowest recent
collective; ``--after 30s``); ``fast`` (``--hang-after 10s --after 5s``).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
LAB = ROOT / "tests" / "lab"
PY = sys.executable
SMALL = ["--compute-ms", "30", "--buckets", "131072,65536"]
PROFILES = {"defaults": {"args": [], "hang_after_s": 30.0, "after_s": 30.0},
            "fast": {"args": ["--hang-after", "10s", "--after", "5s"], "hang_after_s": 10.0, "after_s": 5.0}}


def one_run(i: int, build: Path, work: Path, profile: dict, rng: random.Random) -> dict:
    bundles = work / f"job-{i}" / "bundles"
    bundles.mkdir(parents=True)
    from tests.lab.watcher import WatcherError, start_watcher, stop_watcher
    try:
        w = start_watcher(bundles, profile["args"], work / f"job-{i}" / "watch.err")
    except WatcherError as e:
        raise SystemExit(str(e)) from None
    try:
        return job_run(i, build, work, bundles, profile, rng)
    finally:
        stop_watcher(w)


def job_run(i: int, build: Path, work: Path, bundles: Path, profile: dict, rng: random.Random) -> dict:
    lib = work / f"job-{i}" / "nccl"
    shutil.copytree(build, lib, ignore=shutil.ignore_patterns("static"))
    hold = profile["hang_after_s"] + profile["after_s"] + 25
    if i % 2 == 0:
        fault = ["--scenario", "link-down-hang", "--rank", "2", "--start-s", f"{rng.uniform(12, 20):.1f}"]
    else:
        fault = ["--scenario", "mismatch-hang", "--rank", "1", "--at-op", str(rng.randint(200, 500))]
    before = set(bundles.glob("stallscope-*.tar.gz"))
    out = work / f"job-{i}" / "lab"
    p = subprocess.run([PY, "-m", "tests.lab.launcher", "--build", str(lib), "--out", str(out), "--ranks", "3",
                        "--hold-s", f"{hold:g}", *fault, *SMALL], cwd=ROOT, capture_output=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"lab job {i} failed:\n{p.stderr.decode()[-2000:]}")
    time.sleep(2)
    new = sorted(set(bundles.glob("stallscope-*.tar.gz")) - before)
    truth = json.loads((out / "scenario.json").read_text())
    onset = truth["fault"]["start_time_ns"]
    row = {"run": i, "scenario": truth["scenario"], "bundles": len(new)}
    if len(new) != 1:
        return row
    bundle_ns = new[0].stat().st_mtime_ns
    t0 = time.monotonic()
    a = subprocess.run([PY, "-m", "forensics", "analyze", str(new[0]), "--json", str(work / f"job-{i}.json"),
                        "-o", str(work / f"job-{i}.html"), "--force"], cwd=ROOT, capture_output=True)
    analyze_s = time.monotonic() - t0
    top = (json.loads((work / f"job-{i}.json").read_text()).get("findings") or [{}])[0]
    row.update(to_bundle_s=(bundle_ns - onset) / 1e9, analyze_s=analyze_s,
               to_verdict_s=(bundle_ns - onset) / 1e9 + analyze_s, verdict=top.get("kind"), rc=a.returncode,
               ranks=top.get("ranks"), truth_ranks=truth["fault"]["ranks"])
    return row


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(0.9 * len(xs) + 0.5)) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=None, help="hangs per profile (default: defaults 3, fast 5)")
    ap.add_argument("--profile", choices=["defaults", "fast", "both"], default="both")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("bpftrace"):
        print("bench/time_to_bundle.py: needs root and bpftrace (the lab's namespaces, the tracer)")
        return 0
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="stallscope-ttb-"))
    build = work / "build"
    subprocess.run(["make", "-C", str(LAB), "all", f"BUILD={build}"], check=True, capture_output=True)
    from tests.lab import netns
    netns.sweep()
    results: dict[str, list[dict]] = {}
    for name in (["defaults", "fast"] if a.profile == "both" else [a.profile]):
        profile = PROFILES[name]
        rows = []
        for i in range(a.runs or (3 if name == "defaults" else 5)):
            row = one_run(i, build, work / name, profile, rng)
            rows.append(row)
            print(f"{name:8s} run {i}: {json.dumps(row, default=str)}", flush=True)
        results[name] = rows
    print()
    for name, rows in results.items():
        ok = [r for r in rows if "to_bundle_s" in r]
        right = [r for r in ok if r["verdict"] in ("hang_stuck", "hang_mismatch")
                 and set(r["truth_ranks"]) <= set(r["ranks"] or [])]
        if not ok:
            print(f"{name}: no bundle in {len(rows)} runs")
            continue
        tb = [r["to_bundle_s"] for r in ok]
        tv = [r["to_verdict_s"] for r in ok]
        print(f"{name:8s} {len(ok)}/{len(rows)} hangs bundled, {len(right)} with the right kind and rank; "
              f"onset -> bundle median {statistics.median(tb):.1f} s, p90 {p90(tb):.1f} s; "
              f"onset -> verdict median {statistics.median(tv):.1f} s, p90 {p90(tv):.1f} s "
              f"(in-house best: 90% detected within 15 s)")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
