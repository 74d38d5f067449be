"""A stall that resolves by itself (issue 43 item 3, issue 44 ``slow-checkpoint``; root, the lab):
rank 0 saves a "checkpoint" (busy in host code, outside every NCCL call) for 30 s while ranks 1
and 2 wait inside the next collective, then the job goes on and ends cleanly.

- Under the watcher with its defaults (``--hang-after`` max(10 s, 10x the slowest recent
  collective), ``--after 30s``), on the job alone (``--pid`` of its launcher, held at a gate until
  the watcher runs: the machine may be shared): at most one bundle, and if one, its manifest says
  the stall resolved after about the pause and that rank 0 was outside every collective; its
  analysis has no error finding, its top one is ``stall_resolved`` naming rank 0.
- A capture of each host attached before the pause, and one started during it (both outlive it):
  no error finding; the job's logs alone: none either.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from capture_helpers import wait_for
from conftest import LAB_MATRIX, ROOT, build_lab

PY = sys.executable
SMALL = ["--compute-ms", "30", "--buckets", "131072,65536"]


def _manifest(bundle: Path) -> dict:
    with tarfile.open(bundle) as t:
        return next(json.load(t.extractfile(m)) for m in t if m.name.endswith("/manifest.json")
                    and m.name.count("/") == 1)


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    from tests.lab import netns
    b = build_lab(tmp_path_factory)
    netns.sweep()          # only the namespaces of dead launchers: a shared machine runs others' labs
    return b


def _torn_down(launcher_pid: int) -> None:
    from tests.lab import netns
    assert netns.leftovers(owner=launcher_pid) == {"namespaces": [], "pids": [], "links": []}


def _errors(paths: list[Path], tmp_path: Path, name: str) -> tuple[list[dict], dict]:
    """(every finding, the --json report) of ``stallscope analyze`` on paths."""
    js = tmp_path / f"{name}.json"
    p = subprocess.run([PY, "-m", "forensics", "analyze", *map(str, paths), "--json", str(js), "-o",
                        str(tmp_path / f"{name}.html"), "--force"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert js.exists(), p.stdout + p.stderr
    rep = json.loads(js.read_text())
    return rep.get("findings") or [], rep


def _watched(build: Path, tmp_path: Path, lab_args: list[str]) -> tuple[Path, Path, Path]:
    """The lab job ``lab_args`` under a watcher with the defaults on it alone: (bundles, lab
    output, the watcher's log), once the job ended and an incident begun in it was completed."""
    bundles, out = tmp_path / "bundles", tmp_path / "lab"
    bundles.mkdir()
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    launcher = subprocess.Popen(
        ["sh", "-c", 'read x < "$0"; exec "$@"', str(gate), PY, "-m", "tests.lab.launcher", "--build", str(build),
         "--out", str(out), *lab_args], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "launcher.err", "wb"))
    err = tmp_path / "watch.err"
    watcher = subprocess.Popen([PY, "-m", "forensics", "capture", "--watch", "-o", str(bundles), "--pid",
                                str(launcher.pid), "--nccl-lib", str(build / "libnccl.so.2"), "--status-every", "30s"],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(err, "wb"))
    try:
        wait_for(lambda: b"capturing:" in err.read_bytes() or watcher.poll() is not None, 120, "the watcher to start")
        assert watcher.poll() is None, err.read_text()[-3000:]
        with open(gate, "w") as fh:
            fh.write("go\n")
        assert launcher.wait(timeout=400) == 0, (tmp_path / "launcher.err").read_text()[-3000:]
        # the job ends ~10 s after the pause: a bundle begun in the pause is completed by then or at the stop
        wait_for(lambda: not [d for d in bundles.glob(".*.staging-*") if "-watch.staging-" not in d.name]
                 or watcher.poll() is not None, 60, "the incident's completion")
    finally:
        for p in (watcher, launcher):
            if p.poll() is None:
                p.terminate()
        for p in (watcher, launcher):
            p.wait(timeout=180)
        _torn_down(launcher.pid)
    return bundles, out, err


@LAB_MATRIX          # make test: test_watch.py's clean job under the watcher
def test_a_clean_job_with_compute_pauses_longer_than_the_trigger_gives_no_bundle(build, tmp_path):
    """12 s of compute between steps (no collective in flight) is no hang for the 10 s floor."""
    bundles, out, err = _watched(build, tmp_path, ["--scenario", "clean", "--ranks", "3", "--steps", "4",
                                                   "--compute-ms", "12000", "--buckets", "131072,65536"])
    steps = [json.loads(l) for l in (out / "logs" / "rank0.out").read_text().splitlines() if '"ev":"step"' in l]
    assert len(steps) == 4
    assert sorted(bundles.glob("stallscope-*.tar.gz")) == [], err.read_text()[-3000:]
    assert "TRIGGER" not in err.read_text()


def test_a_slow_checkpoint_under_the_watcher_resolves_with_no_error(build, tmp_path):
    bundles, out, err = _watched(build, tmp_path, ["--scenario", "slow-checkpoint", "--ranks", "3", *SMALL])
    truth = json.loads((out / "scenario.json").read_text())
    f = truth["fault"]
    assert f["kind"] == "slow-checkpoint" and f["ranks"] == [0] and f["end_time_ns"] > f["start_time_ns"]
    assert 29 <= f["held_s"] <= 35, f
    assert all(r["exit_code"] == 0 for r in truth["ranks"]), truth["ranks"]
    found = sorted(bundles.glob("stallscope-*.tar.gz"))
    text = err.read_text()
    assert len(found) <= 1, (found, text[-3000:])
    if not found:
        return                                # no bundle at all is right too
    m = _manifest(found[0])
    st = m["watch"]["stall"]
    assert m["watch"]["stage"] == "complete" and st["state"] == "resolved", (m["watch"], text[-3000:])
    assert abs(st["resolved_after_s"] - f["held_s"]) <= 5, (st, f["held_s"])
    assert [w["rank"] for w in st["waited_for"]] == [0] and 0 not in st["ranks"], st
    assert st["stalled_since_ns"] - f["start_time_ns"] <= 2e9         # the stall began with the checkpoint
    findings, _ = _errors(found, tmp_path, "watch")
    assert [x for x in findings if x["severity"] == "error"] == [], [(x["kind"], x["summary"]) for x in findings]
    top = findings[0]
    assert top["kind"] == "stall_resolved" and top["ranks"] == [0], top
    assert "resolved after" in top["summary"].lower()


@pytest.mark.parametrize("start", [pytest.param("before", marks=LAB_MATRIX), pytest.param("onset+3", marks=LAB_MATRIX)])
def test_a_slow_checkpoint_captured_or_logged_is_no_error(build, tmp_path, start):
    """Per-host captures attached before the pause, or started 3 s into it, each outliving it;
    then the job's logs alone."""
    out = tmp_path / "lab"
    dur = "30" if start == "before" else "24"
    p = subprocess.Popen([PY, "-m", "tests.lab.launcher", "--build", str(build), "--out", str(out),
                          "--scenario", "slow-checkpoint", "--ranks", "3", "--start-s", "3", "--hold-s", "15",
                          "--capture", "per-host", "--capture-start", start, "--capture-duration-s", dur, *SMALL],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.terminate()
            p.wait(timeout=120)
        _torn_down(p.pid)
    assert p.returncode == 0, stderr[-3000:]
    truth = json.loads((out / "scenario.json").read_text())
    assert truth["fault"]["kind"] == "slow-checkpoint" and truth["captures"], truth["fault"]
    found = sorted((out / "bundles").rglob("*.tar.gz"))
    assert len(found) == 3, found
    findings, _ = _errors(found, tmp_path, "capture")
    assert [x for x in findings if x["severity"] == "error"] == [], [(x["kind"], x["summary"]) for x in findings]
    warn = [x for x in findings if x["severity"] == "warning"]
    assert all(0 in x["ranks"] for x in warn), [(x["kind"], x["ranks"], x["summary"]) for x in warn]
    if start == "before":
        logs, _ = _errors([out / "logs"], tmp_path, "logs")
        assert [x for x in logs if x["severity"] == "error"] == [], [(x["kind"], x["summary"]) for x in logs]
