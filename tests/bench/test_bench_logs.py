"""bench/logs.py on a small input: the generated logs, the side-by-side table, the verdict."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_the_logs_bench_runs_small_and_names_the_lagging_rank(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "logs.py"), "--mb", "2", "--ranks", "8", "--runs", "1",
                        "--dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for row in ("grep -c NCCL", "reading the merged log", "analyze --jobs 1", "analyze --jobs 2"):
        assert row in out, out
    assert "the lagging rank 5 named: yes" in out                 # 37 % 8
    merged = next(tmp_path.glob("slurm-merged-*.out"))
    assert 1 << 20 < merged.stat().st_size < 3 << 20 and len(list(tmp_path.glob("per-rank-*/*"))) == 8
