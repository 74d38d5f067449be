"""Every script in bench/ runs to its end at its smallest size, so a refactor cannot silently
break a benchmark whose figures the READMEs quote. Nothing about speed is asserted (figures
belong to bench/README.md): a run passes when it exits as the script documents (0, or 1 for
the scripts whose exit status reports a missed target) with its summary printed and no
traceback. Scripts that drive the lab under a real tracer need root and bpftrace."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

from conftest import ROOT


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]        # the smallest run ({tmp}: a scratch folder)
    expect: str                  # a line of its summary
    target_rc: bool = False      # exit 1 reports a missed target, not a failure
    root: bool = False           # drives the lab under bpftrace
    timeout_s: int = 300


SMOKE = {
    # its real one-case lab run is tests/bench/test_bench_accuracy.py's (root): here the plan alone
    "accuracy.py": Smoke(("--plan", "--cases", "3", "--seed", "1"), "--scenario"),
    "analyze.py": Smoke(("--packets", "20000", "--ranks", "4"), "analyze (taskset -c 0", target_rc=True),
    "fleet.py": Smoke(("--hosts", "2", "--ranks-per-host", "2", "--packets", "5000", "--jobs", "1,2",
                       "--repeat", "1", "--no-ceiling"), "peak memory:", target_rc=True),
    "fuzz.py": Smoke(("--examples", "2", "--jobs", "1"), "total"),
    "logs.py": Smoke(("--mb", "1", "--runs", "1", "--dir", "{tmp}"), "the lagging rank 37 named: yes"),
    "pcap_throughput.py": Smoke(("--packets", "5000", "--runs", "1"), "packets/s"),
    "synth_capture.py": Smoke(("{tmp}/s.pcap", "--packets", "2000"), "2000 packets written"),
    "time_to_bundle.py": Smoke(("--runs", "1", "--profile", "fast", "--scope", "job", "--onset-s", "5-6",
                                "--slack-s", "10"), "median", root=True,
                               timeout_s=400),
    "tracer_overhead.py": Smoke(("--pairs", "1", "--steps", "50"), "slowdown ratio", root=True),
}
EXTRA = {"logs.py --shape init": ("logs.py", ("--shape", "init"))}


def test_every_bench_script_has_a_smoke_run():
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")}
    assert scripts == set(SMOKE), f"bench scripts without a smoke run: {sorted(scripts - set(SMOKE))}; " \
                                  f"smoke runs of no script: {sorted(set(SMOKE) - scripts)}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMOKE) + sorted(EXTRA))
def test_bench_script_runs_at_its_smallest_size(name, tmp_path):
    script, more = EXTRA.get(name, (name, ()))
    smoke = SMOKE[script]
    if smoke.root and (os.geteuid() != 0 or shutil.which("bpftrace") is None):
        pytest.skip(f"bench/{script} drives the lab under bpftrace: needs root and bpftrace")
    if script == "pcap_throughput.py" and shutil.which("tshark") is None:
        more = (*more, "--no-tshark")
    args = [a.replace("{tmp}", str(tmp_path)) for a in (*smoke.args, *more)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=smoke.timeout_s)
    out = p.stdout + p.stderr
    assert "Traceback (most recent call last)" not in out, out[-3000:]
    assert p.returncode in ((0, 1) if smoke.target_rc else (0,)), out[-3000:]
    assert smoke.expect in out, out[-3000:]
