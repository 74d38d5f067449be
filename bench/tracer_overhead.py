#!/usr/bin/env python3
"""Tracer overhead: the lab's training loop with and without ``stallscope capture``, in one run.

    sudo .venv/bin/python bench/tracer_overhead.py [--pairs 7] [--steps 1000] [--compute-ms 4] [--no-call-returns]

The lab's ranks (tests/lab, loopback, no namespaces) run a DDP-like loop of small
collectives (5 per step, 1-4 KiB) paced to about 1,000 collectives/s per rank.
Each pair of rounds runs the same job twice, in random order: once alone, once
watched by the real ``python3 -m capture --pid <job> --nccl-lib ... --no-pcap``
(tracer, off-CPU sampling, rescans, snapshots: what a user runs, minus tcpdump).
The job waits behind a gate until capture says "capturing", so the whole
measured loop is traced; the bundle is checked to hold every collective.
The rate of a round is measured from the ranks' own train_start/done
timestamps. The slowdown is the median over pairs of untraced/traced rate
(paired rounds cancel slow drifts of a shared machine), printed with the
per-pair values, the CPU the capture and bpftrace used, and the verdict
against the 2% target.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "tests" / "lab" / "build"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds; 0 when gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def children_of(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


class LabRun:
    """One lab job on loopback, started behind a gate (a shell waiting for a file)."""

    def __init__(self, work: Path, steps: int, compute_ms: float, ranks: int):
        self.out = work / "lab"
        shutil.rmtree(self.out, ignore_errors=True)
        self.go = work / "GO"
        self.go.unlink(missing_ok=True)
        self.ranks = ranks
        launcher = [sys.executable, "-m", "tests.lab.launcher", "--scenario", "clean", "--no-netns",
                    "--ranks", str(ranks), "--steps", str(steps), "--compute-ms", str(compute_ms),
                    "--buckets", "1024,1024,512,256", "--out", str(self.out), "--debug-subsys", "INIT"]
        gate = f'while [ ! -e "{self.go}" ]; do sleep 0.05; done; exec "$@"'
        self.err = open(work / "launcher.err", "wb")
        self.proc = subprocess.Popen(["sh", "-c", gate, "sh"] + launcher, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=self.err)

    def go_and_wait(self, timeout: float = 600) -> None:
        self.go.touch()
        self.proc.wait(timeout=timeout)
        self.err.close()
        if self.proc.returncode != 0:
            raise SystemExit("lab run failed: " + Path(self.err.name).read_text()[-800:])

    def rate(self) -> tuple[float, int]:
        """(collectives per second per rank over the training loop, collectives issued in all)."""
        rates, ops = [], 0
        for r in range(self.ranks):
            evs = [json.loads(l) for l in (self.out / "logs" / f"rank{r}.out").read_text().splitlines()
                   if l.startswith("{")]
            start = next(e for e in evs if e["ev"] == "train_start")["t_ns"]
            done = next(e for e in evs if e["ev"] == "done")
            rates.append((done["ops_issued"] - 1) / ((done["t_ns"] - start) / 1e9))
            ops += done["ops_issued"]
        return statistics.mean(rates), ops


class Capture:
    """``python3 -m capture`` watching the gated job, as a user runs it (without tcpdump)."""

    def __init__(self, work: Path, job_pid: int, extra: list[str]):
        self.bundles = work / "bundles"
        shutil.rmtree(self.bundles, ignore_errors=True)
        self.bundles.mkdir()
        self.proc = subprocess.Popen([sys.executable, "-m", "capture", "--pid", str(job_pid),
                                      "--nccl-lib", str(BUILD / "libnccl.so.2"), "--no-pcap", "-o",
                                      str(self.bundles), "--duration", "30m", "--progress", "lines"] + extra,
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.capturing = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.capturing.wait(120):
            self.proc.kill()
            raise SystemExit("capture did not start:\n" + "".join(self.lines))
        self.cpu0 = cpu_s(self.proc.pid)
        self.tracer = next((c for c in children_of(self.proc.pid)
                            if "bpftrace" in Path(f"/proc/{c}/comm").read_text()), None)
        self.tracer_cpu0 = cpu_s(self.tracer) if self.tracer else 0.0

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "capturing:" in line:
                self.capturing.set()

    def finish(self) -> dict:
        used = {"capture_cpu_s": cpu_s(self.proc.pid) - self.cpu0,
                "bpftrace_cpu_s": (cpu_s(self.tracer) - self.tracer_cpu0) if self.tracer else None}
        self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=300)
        path = Path(out.strip().splitlines()[-1])
        with tarfile.open(path) as t:
            members = {m.name.split("/", 1)[1]: m for m in t.getmembers() if m.isfile()}
            manifest = json.load(t.extractfile(members["manifest.json"]))
            colls = sum(1 for l in t.extractfile(members["bpf/events.jsonl"]) if l.startswith(b'{"ev":"coll"')) \
                if "bpf/events.jsonl" in members else 0
        used.update(colls=colls, lost=manifest["collectors"]["tracer"].get("summary", {}).get("lost_events"),
                    tracer=manifest["collectors"]["tracer"]["status"], bundle=path)
        return used


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=7, help="untraced/traced round pairs (default 7)")
    ap.add_argument("--steps", type=int, default=1000, help="training steps per round (5 collectives each)")
    ap.add_argument("--compute-ms", type=float, default=4.0, help="'compute' per step (paces ~1,000 coll/s)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--no-call-returns", action="store_true",
                    help="trace with --no-call-returns (no uretprobes on the collectives)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--capture-arg", action="append", default=[], help=argparse.SUPPRESS)  # experiments
    a = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("bpftrace") is None:
        print("needs root and bpftrace", file=sys.stderr)
        return 2
    if subprocess.run(["make", "-s", "-C", str(ROOT / "tests" / "lab")]).returncode:
        return 2
    # a SIGTERM (kill, a job scheduler) unwinds like Ctrl-C: the finally blocks below stop the
    # round's capture and lab instead of leaving them running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rng = random.Random(a.seed)
    extra = (["--no-call-returns"] if a.no_call_returns else []) + a.capture_arg
    base, traced, ratios, usage = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="ss-bench-") as tmp:
        work = Path(tmp)
        for i in range(a.pairs):
            pair = {}
            for kind in rng.sample(["untraced", "traced"], 2):
                lab = LabRun(work, a.steps, a.compute_ms, a.ranks)
                cap = None
                try:
                    if kind == "traced":
                        cap = Capture(work, lab.proc.pid, extra)
                    lab.go_and_wait()
                    rate, ops = lab.rate()
                    if cap is not None:
                        used = cap.finish()
                        cap = None
                        if "--no-bpf" not in extra and (used["colls"] != ops or used["tracer"] != "ok"):
                            kept = Path(tempfile.gettempdir()) / f"ss-bench-failed-{os.getpid()}.tar.gz"
                            shutil.copy(used["bundle"], kept)
                            shutil.copytree(lab.out, str(kept) + ".lab")
                            raise SystemExit(f"the tracer missed collectives: {used} vs {ops} issued "
                                             f"(bundle and lab output kept: {kept}, {kept}.lab)")
                        usage.append(used)
                    pair[kind] = rate
                finally:
                    if cap is not None and cap.proc.poll() is None:
                        cap.proc.kill()
                    if lab.proc.poll() is None:
                        lab.go.touch()
                        lab.proc.kill()
            base.append(pair["untraced"])
            traced.append(pair["traced"])
            ratios.append(pair["untraced"] / pair["traced"])
            u = usage[-1]
            print(f"pair {i + 1}: untraced {pair['untraced']:7.1f} coll/s   traced {pair['traced']:7.1f} coll/s   "
                  f"ratio {ratios[-1]:.4f}   (bundle: {u['colls']} collectives, lost {u['lost']}; CPU: capture "
                  f"{u['capture_cpu_s']:.2f}s, bpftrace {u['bpftrace_cpu_s'] or 0:.2f}s)", flush=True)
    slow = statistics.median(ratios) - 1
    print(f"untraced {statistics.median(base):.1f} coll/s per rank, traced {statistics.median(traced):.1f} coll/s "
          f"per rank ({a.ranks} ranks, {a.steps * 5 + 1} collectives each, loopback"
          f"{', --no-call-returns' if a.no_call_returns else ''})")
    print(f"slowdown ratio {statistics.median(ratios):.4f} (median of {a.pairs} pairs; ratio of medians "
          f"{statistics.median(base) / statistics.median(traced):.4f}): {slow * 100:+.2f}% "
          f"{'within' if slow <= 0.02 else 'OVER'} the 2% target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
