"""bench/tracer_overhead.py's rate of a lab round, read from the ranks' own event lines."""
from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT


def _lab_run(out):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        mod = __import__("tracer_overhead")
    finally:
        sys.path.remove(str(ROOT / "bench"))
    lab = object.__new__(mod.LabRun)       # no job started: only its output folder is read
    lab.out, lab.ranks = out, 2
    return lab


def _write(out, r, lines):
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "logs" / f"rank{r}.out").write_text("".join(l + "\n" for l in lines))


def _ev(**kw):
    return json.dumps(kw)


def test_rate_reads_each_rank_as_the_launcher_does(tmp_path):
    # a stray indent and a line cut in two are what the launcher's reader skips or strips
    _write(tmp_path, 0, [_ev(ev="init_done", t_ns=1), "  " + _ev(ev="train_start", t_ns=1_000_000_000),
                         '{"ev":"st', _ev(ev="done", t_ns=2_000_000_000, ops_issued=101)])
    _write(tmp_path, 1, [_ev(ev="train_start", t_ns=1_000_000_000),
                         _ev(ev="done", t_ns=3_000_000_000, ops_issued=101)])
    rate, ops = _lab_run(tmp_path).rate()
    assert ops == 202
    assert rate == pytest.approx((100 / 1 + 100 / 2) / 2)


def test_a_rank_that_never_started_training_is_named_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "kept"))
    (tmp_path / "kept").mkdir()
    out = tmp_path / "lab"
    _write(out, 0, [_ev(ev="train_start", t_ns=1), _ev(ev="done", t_ns=2, ops_issued=3)])
    _write(out, 1, [_ev(ev="init_done", t_ns=1)])
    with pytest.raises(SystemExit, match=r"rank 1 wrote no train_start event in rank1.out \(1 events; "
                                         r"lab output kept: .*kept"):
        _lab_run(out).rate()
    assert list((tmp_path / "kept").glob("ss-bench-lab-*/logs/rank1.out"))
