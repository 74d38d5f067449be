"""Initialization hangs (issue 43 item 2, issue 44's init-hang faults) in the capture regimes
(root, the lab): ``init-hang`` (rank 1 never calls ncclCommInitRank; the others wait in it) and
``init-hang-dropped`` (rank 1's packets to the bootstrap root's host dropped in the lab switch),
each captured one capture per host started before the job, one capture per host started
during the hang, and from the job's logs alone. The verdict is ``init_hang`` naming rank 1
(and, where the evidence has the socket, the address it cannot reach). The watcher's regime
is in tests/lab_runs/test_watch_blind.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LAB_MATRIX, ROOT, build_lab

PY = sys.executable
SMALL = ["--buckets", "131072,65536", "--compute-ms", "30"]
REGIMES = {
    "before": ["--capture", "per-host", "--capture-start", "before", "--capture-duration-s", "14"],
    "during": ["--capture", "per-host", "--capture-start", "onset+4", "--capture-duration-s", "10",
               "--capture-stagger-s", "0-2"],
    "logs": [],
}
SCENARIOS = {"init-hang": ["--scenario", "init-hang", "--rank", "1"],
             "init-hang-dropped": ["--scenario", "init-hang-dropped", "--rank", "1"]}

ONCE = (("init-hang", "logs"),)     # make test: the class once (CI time); the rest in make lab-matrix


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    return build_lab(tmp_path_factory)


@pytest.mark.parametrize("scenario, regime", [
    (sc, rg) if (sc, rg) in ONCE else pytest.param(sc, rg, marks=LAB_MATRIX) for sc in SCENARIOS for rg in REGIMES])
def test_an_init_hang_names_the_rank_that_never_joined(build, tmp_path, scenario, regime):
    from forensics.analysis import analyze
    out = tmp_path / "run"
    argv = [PY, "-m", "tests.lab.launcher", "--build", str(build), "--out", str(out), "--ranks", "3",
            "--hold-s", "12", *SCENARIOS[scenario], *REGIMES[regime], *SMALL]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    truth = json.loads((out / "scenario.json").read_text())
    assert truth["fault"]["kind"] == scenario and truth["fault"]["missing_rank"] == 1
    if regime == "logs":
        sources = [str(out / "logs")]
    else:
        sources = [str(b) for b in sorted(out.glob("bundles/*/*.tar.gz"))]
        assert len(sources) == 3, sources
    res = analyze(sources)
    top = res.findings[0]
    assert top.kind == "init_hang" and 1 in top.ranks, [(f.kind, f.ranks, f.summary) for f in res.findings[:3]]
    if scenario == "init-hang":
        assert top.severity == "error" and top.ranks == [1] and top.details["missing"] == [1], top.details
    elif regime != "logs":     # the socket that never opened: in the tracer's events or ss at the end
        assert top.ranks == [1] and any(a.startswith(truth["fault"]["address"] + ":")
                                        for a in top.details["unreached"]), top.details
