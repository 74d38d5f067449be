#!/usr/bin/env python3
"""Time to bundle: from the onset of a hang to its first bundle on disk, and to a verdict.

    sudo .venv/bin/python bench/time_to_bundle.py [--runs N] [--profile defaults|fast|both] [--seed S]
                                                  [--checkpoints N] [--scope host|job] [--keep]
                                                  [--onset-s A-B] [--slack-s S]

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
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.lab.watcher import WatcherError, stop_watcher  # noqa: E402
from tests.lab.watcher import start_watcher as lab_watcher  # noqa: E402

LAB = ROOT / "tests" / "lab"
PY = sys.executable
SMALL = ["--compute-ms", "30", "--buckets", "131072,65536"]
ONSET_S = (12.0, 20.0)      # the hang's onset, seconds into the job (--onset-s)
SLACK_S = 25.0              # the hang is held this long past --hang-after and --after (--slack-s)
PROFILES = {"defaults": {"args": [], "hang_after_s": 10.0, "after_s": 30.0},
            "fast": {"args": ["--hang-after", "10s", "--after", "5s"], "hang_after_s": 10.0, "after_s": 5.0}}


def start_watcher(bundles: Path, args: list[str], err: Path):
    """tests.lab.watcher's watcher; the bench ends with its message when it does not start."""
    try:
        return lab_watcher(bundles, args, err)
    except WatcherError as e:
        raise SystemExit(str(e)) from None


class FirstBundles(threading.Thread):
    """Polls a folder every 0.1 s: each bundle's first appearance (ns) and a copy of it then."""

    def __init__(self, folder: Path, copies: Path):
        super().__init__(daemon=True)
        self.folder, self.copies, self.seen, self.stop = folder, copies, {}, threading.Event()
        copies.mkdir(parents=True, exist_ok=True)

    def run(self) -> None:
        while not self.stop.is_set():
            for p in self.folder.glob("stallscope-*.tar.gz"):
                if p.name not in self.seen:
                    self.seen[p.name] = time.time_ns()
                    try:
                        shutil.copyfile(p, self.copies / p.name)
                    except OSError:
                        pass
            time.sleep(0.1)


def manifest_of(bundle: Path) -> dict:
    import tarfile
    try:
        with tarfile.open(bundle) as t:
            return next(json.load(t.extractfile(x)) for x in t if x.name.endswith("/manifest.json")
                        and x.name.count("/") == 1)
    except (OSError, tarfile.TarError, StopIteration, ValueError):
        return {}


def ours(bundles: list[Path], truth: dict, out: Path) -> list[Path]:
    """The bundles of this run's job: the machine may be shared, and a watcher as deployed
    follows every NCCL job of the host (another's hang gives a bundle too) and answers every
    ``stallscope capture --trigger`` run on it: those whose hang triggers name one of the job's
    ranks, or whose log trigger is one of the job's logs (under ``out``)."""
    pids = {r["pid"] for r in truth.get("ranks") or [] if r.get("pid")}
    keep = []
    for b in bundles:
        trig = manifest_of(b).get("trigger") or {}
        for t in [trig] + list(trig.get("also") or []):
            if set(t.get("pids") or []) & pids or (t.get("kind") == "log"
                                                    and str(t.get("source") or "").startswith(str(out))):
                keep.append(b)
                break
    return keep


def one_run(i: int, build: Path, work: Path, profile: dict, rng: random.Random, scope: str,
            scenario: str | None = None) -> dict:
    bundles = work / f"job-{i}" / "bundles"
    bundles.mkdir(parents=True)
    poll = FirstBundles(bundles, work / f"job-{i}" / "first")
    poll.start()
    try:
        if scenario == "slow-checkpoint":
            return checkpoint_run(i, build, work, bundles, profile, poll, scope)
        return job_run(i, build, work, bundles, profile, rng, poll, scope)
    finally:
        poll.stop.set()


def watched_lab(lab_argv: list[str], bundles: Path, profile: dict, scope: str, lib: Path) -> None:
    """The lab job ``lab_argv`` under a fresh watcher: as deployed (``host``: no --pid, no
    --nccl-lib, every NCCL job of the host followed), or on the job alone (``job``: --pid of
    its launcher, held at a gate until the watcher runs, and --nccl-lib: on a shared machine
    the other jobs' hangs cannot fold this one's into their incident)."""
    err = bundles.parent / "watch.err"
    launcher = [PY, "-m", "tests.lab.launcher", *lab_argv]
    if scope == "host":
        w = start_watcher(bundles, profile["args"], err)
        try:
            p = subprocess.run(launcher, cwd=ROOT, capture_output=True, timeout=900)
        finally:
            stop_watcher(w, 180)
        if p.returncode != 0:
            raise SystemExit(f"lab job failed:\n{p.stderr.decode()[-2000:]}")
        return
    gate = bundles.parent / "gate"
    os.mkfifo(gate)
    lp = subprocess.Popen(["sh", "-c", 'read x < "$0"; exec "$@"', str(gate), *launcher], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=open(bundles.parent / "launcher.err", "wb"))
    w = None
    try:
        w = start_watcher(bundles, ["--pid", str(lp.pid), "--nccl-lib", str(lib / "libnccl.so.2"), *profile["args"]],
                          err)
        with open(gate, "w") as fh:
            fh.write("go\n")
        rc = lp.wait(timeout=900)
    finally:
        if lp.poll() is None:
            lp.terminate()
            lp.wait(timeout=120)
        if w is not None:
            stop_watcher(w, 180)
    if rc != 0:
        raise SystemExit(f"lab job failed:\n{(bundles.parent / 'launcher.err').read_text()[-2000:]}")


def job_run(i: int, build: Path, work: Path, bundles: Path, profile: dict, rng: random.Random,
            poll: FirstBundles, scope: str) -> dict:
    lib = work / f"job-{i}" / "nccl"
    shutil.copytree(build, lib, ignore=shutil.ignore_patterns("static"))
    hold = profile["hang_after_s"] + profile["after_s"] + profile.get("slack_s", SLACK_S)
    lo, hi = profile.get("onset_s", ONSET_S)
    if i % 2 == 0:
        fault = ["--scenario", "link-down-hang", "--rank", "2", "--start-s", f"{rng.uniform(lo, hi):.1f}"]
    else:       # about 40 ms a step: ops 200-500 are 8-20 s into the job
        fault = ["--scenario", "mismatch-hang", "--rank", "1",
                 "--at-op", str(rng.randint(int(lo * 50 / 3), int(hi * 25)))]
    before = set(bundles.glob("stallscope-*.tar.gz"))
    out = work / f"job-{i}" / "lab"
    watched_lab(["--build", str(lib), "--out", str(out), "--ranks", "3", "--hold-s", f"{hold:g}", *fault, *SMALL],
                bundles, profile, scope, lib)
    time.sleep(2)
    truth = json.loads((out / "scenario.json").read_text())
    new = ours(sorted(set(bundles.glob("stallscope-*.tar.gz")) - before), truth, out)
    onset = truth["fault"]["start_time_ns"]
    row = {"run": i, "scenario": truth["scenario"], "bundles": len(new)}
    for b in sorted(set(bundles.glob("stallscope-*.tar.gz")) - before):
        opened = manifest_of(b).get("trigger") or {}
        if opened.get("kind") == "on-demand":    # `stallscope capture --trigger` run by someone else on the host
            row["disturbed"] = "an on-demand trigger from outside opened an incident during the run"
            return row
    if len(new) != 1 or new[0].name not in poll.seen:
        return row
    bundle_ns = poll.seen[new[0].name]
    first = poll.copies / new[0].name            # the first archive, as it was when it appeared

    t0 = time.monotonic()
    a = subprocess.run([PY, "-m", "forensics", "analyze", str(first), "--json", str(work / f"job-{i}.json"),
                        "-o", str(work / f"job-{i}.html"), "--force"], cwd=ROOT, capture_output=True)
    analyze_s = time.monotonic() - t0
    top = (json.loads((work / f"job-{i}.json").read_text()).get("findings") or [{}])[0]
    row.update(to_bundle_s=(bundle_ns - onset) / 1e9, analyze_s=analyze_s,
               to_verdict_s=(bundle_ns - onset) / 1e9 + analyze_s, verdict=top.get("kind"), rc=a.returncode,
               ranks=top.get("ranks"), truth_ranks=truth["fault"]["ranks"])
    return row


def checkpoint_run(i: int, build: Path, work: Path, bundles: Path, profile: dict, poll: FirstBundles,
                   scope: str) -> dict:
    """A slow checkpoint (no hang) under the watcher: the bundles it gave and what the completed
    one's analysis says."""
    lib = work / f"job-{i}" / "nccl"
    shutil.copytree(build, lib, ignore=shutil.ignore_patterns("static"))
    out = work / f"job-{i}" / "lab"
    watched_lab(["--build", str(lib), "--out", str(out), "--ranks", "3", "--scenario", "slow-checkpoint", *SMALL],
                bundles, profile, scope, lib)      # the job outlives the pause by ~10 s: the watcher then stops,
    truth = json.loads((out / "scenario.json").read_text())
    new = ours(sorted(bundles.glob("stallscope-*.tar.gz")), truth, out)
    row = {"run": i, "scenario": "slow-checkpoint", "bundles": len(new)}
    if len(new) == 1:
        subprocess.run([PY, "-m", "forensics", "analyze", str(new[0]), "--json", str(work / f"ck-{i}.json"),
                        "-o", str(work / f"ck-{i}.html"), "--force"], cwd=ROOT, capture_output=True)
        rep = json.loads((work / f"ck-{i}.json").read_text())
        fs = rep.get("findings") or []
        row.update(errors=[f["kind"] for f in fs if f.get("severity") == "error"],
                   top=(fs[0]["kind"], fs[0]["summary"][:160]) if fs else None,
                   resolved="resolved after" in json.dumps(rep))
    return row


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(0.9 * len(xs) + 0.5)) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=None, help="hangs per profile (default: defaults 3, fast 5)")
    ap.add_argument("--profile", choices=["defaults", "fast", "both", "none"], default="both")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--scope", choices=["host", "job"], default="host",
                    help="host: the watcher as deployed (every NCCL job of the host); job: --pid of the lab job")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (bundles, reports)")
    ap.add_argument("--checkpoints", type=int, default=0, help="slow-checkpoint runs under the defaults")
    ap.add_argument("--onset-s", default="12-20", help="the hang's onset, A-B seconds into the job (default 12-20)")
    ap.add_argument("--slack-s", type=float, default=SLACK_S,
                    help="seconds the hang is held past --hang-after and --after (default 25)")
    a = ap.parse_args()
    try:
        lo, hi = (float(x) for x in (a.onset_s.split("-", 1) * 2)[:2])
        if not 0 < lo <= hi:
            raise ValueError
    except ValueError:
        ap.error(f"--onset-s {a.onset_s!r}: A-B seconds, 0 < A <= B")
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
    for name in {"both": ["defaults", "fast"], "none": []}.get(a.profile, [a.profile]):
        profile = dict(PROFILES[name], onset_s=(lo, hi), slack_s=a.slack_s)
        rows = []
        for i in range(a.runs or (3 if name == "defaults" else 5)):
            row = one_run(i, build, work / name, profile, rng, a.scope)
            rows.append(row)
            print(f"{name:8s} run {i}: {json.dumps(row, default=str)}", flush=True)
        results[name] = rows
    checks = []
    for i in range(a.checkpoints):
        row = one_run(100 + i, build, work / "checkpoint", PROFILES["defaults"], rng, a.scope,
                      scenario="slow-checkpoint")
        checks.append(row)
        print(f"slow-checkpoint run {i}: {json.dumps(row, default=str)}", flush=True)
    print()
    if checks:
        ok = [r for r in checks if r["bundles"] <= 1 and not r.get("errors") and (r["bundles"] == 0 or r["resolved"])]
        print(f"slow-checkpoint: {len(ok)}/{len(checks)} runs with at most one bundle, no error finding and "
              f"'resolved after' in its report; bundles per run {[r['bundles'] for r in checks]}")
    for name, rows in results.items():
        ok = [r for r in rows if "to_bundle_s" in r]
        disturbed = [r for r in rows if "disturbed" in r]
        if disturbed:
            print(f"{name}: {len(disturbed)} run(s) left out, disturbed from outside: "
                  f"{sorted({r['disturbed'] for r in disturbed})}")
            rows = [r for r in rows if "disturbed" not in r]
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
    if a.keep:
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
