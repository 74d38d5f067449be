#!/usr/bin/env python3
"""Tracer overhead: the lab's training loop with and without the stallscope tracer, in one run.

    sudo .venv/bin/python bench/tracer_overhead.py [--rounds 3] [--steps 600] [--compute-ms 4]

The lab's ranks (tests/lab, loopback, no namespaces) run a DDP-like loop of small
collectives (5 per step, 1-4 KiB) paced to about 1,000 collectives/s per rank.
Rounds alternate untraced / traced (the full tracer bpftrace program of
``stallscope capture`` attached to the lab's libnccl and libcudart, plus its
kernel probes), and the collective rate of each round is measured from the
ranks' own train_start/done timestamps. Prints both rates, the slowdown ratio
(median over rounds) and the verdict against the 2% target.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from capture import children, tracer  # noqa: E402
from capture.elf import exported_functions  # noqa: E402

BUILD = ROOT / "tests" / "lab" / "build"


def run_lab(out: Path, steps: int, compute_ms: float, ranks: int) -> float:
    """Collectives per second per rank over the training loop."""
    shutil.rmtree(out, ignore_errors=True)
    p = subprocess.run([sys.executable, "-m", "tests.lab.launcher", "--scenario", "clean", "--no-netns",
                        "--ranks", str(ranks), "--steps", str(steps), "--compute-ms", str(compute_ms),
                        "--buckets", "1024,1024,512,256", "--out", str(out), "--debug-subsys", "INIT"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"lab run failed: {p.stderr[-800:]}")
    rates = []
    for r in range(ranks):
        evs = [json.loads(l) for l in (out / "logs" / f"rank{r}.out").read_text().splitlines() if l.startswith("{")]
        start = next(e for e in evs if e["ev"] == "train_start")["t_ns"]
        done = next(e for e in evs if e["ev"] == "done")
        rates.append((done["ops_issued"] - 1) / ((done["t_ns"] - start) / 1e9))
    return statistics.mean(rates)


class Tracer:
    def __init__(self, workdir: Path, offcpu: bool = True):
        lib, cudart = BUILD / "libnccl.so.2", BUILD / "libcudart.so.12"
        t = tracer.TraceTargets(nccl={str(lib): set(exported_functions(lib)) & set(tracer.NCCL_SYMBOLS)},
                                cudart={str(cudart): set(exported_functions(cudart)) & set(tracer.CUDART_SYMBOLS)})
        feats = tracer.KernelFeatures.probe()
        if not offcpu:  # attribute the cost: the same program without the sched_switch probe
            feats.tracepoints.pop("sched/sched_switch", None)
        script, _ = tracer.render_script(t, feats)
        path = workdir / "bench.bt"
        path.write_text(script)
        self.writer = tracer.EventWriter(workdir / "events.jsonl", 1 << 30)
        self.proc = children.spawn(["bpftrace", "-B", "line", str(path)], stdout=subprocess.PIPE,
                                   stderr=open(workdir / "bpftrace.err", "wb"))
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()
        if not self.writer.ready.wait(90):
            raise SystemExit("bpftrace did not start: " + (workdir / "bpftrace.err").read_text()[-800:])

    def _pump(self):
        for raw in self.proc.stdout:
            self.writer.feed(raw.decode("utf-8", "replace"))

    def stop(self) -> dict:
        children.stop(self.proc, signal.SIGINT, grace_s=10)
        self.thread.join(timeout=10)
        self.writer.close()
        return self.writer.summary()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--compute-ms", type=float, default=4.0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--no-offcpu", action="store_true", help="leave out the sched_switch (off-CPU) probe")
    a = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        print("needs root and bpftrace", file=sys.stderr)
        return 2
    if subprocess.run(["make", "-s", "-C", str(ROOT / "tests" / "lab")]).returncode:
        return 2
    base, traced, colls = [], [], 0
    with tempfile.TemporaryDirectory(prefix="ss-bench-") as tmp:
        tmp = Path(tmp)
        for i in range(a.rounds):
            base.append(run_lab(tmp / "lab", a.steps, a.compute_ms, a.ranks))
            tr = Tracer(tmp, offcpu=not a.no_offcpu)
            try:
                traced.append(run_lab(tmp / "lab", a.steps, a.compute_ms, a.ranks))
            finally:
                summ = tr.stop()
            colls = summ["by_type"].get("coll", 0)
            print(f"round {i + 1}: untraced {base[-1]:7.1f} coll/s   traced {traced[-1]:7.1f} coll/s   "
                  f"(tracer saw {colls} collectives, lost {summ['lost_events']})", flush=True)
    ratios = [b / t for b, t in zip(base, traced)]
    slow = statistics.median(ratios) - 1
    print(f"untraced {statistics.median(base):.1f} coll/s per rank, traced {statistics.median(traced):.1f} coll/s "
          f"per rank ({a.ranks} ranks, {a.steps * 5 + 1} collectives each, loopback)")
    print(f"slowdown ratio {statistics.median(ratios):.4f} (median of {a.rounds}; per round "
          f"{', '.join(f'{r:.4f}' for r in ratios)}): {slow * 100:+.2f}% "
          f"{'within' if slow <= 0.02 else 'OVER'} the 2% target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
