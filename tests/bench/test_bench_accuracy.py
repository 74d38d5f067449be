"""bench/accuracy.py (issue 44): the draw is a function of the seed and a full campaign covers
every (class, regime) pair; the scoring on hand-made case results, edge cases included; and one
real case in the lab, end to end (root)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
try:
    import accuracy as acc
finally:
    sys.path.remove(str(ROOT / "bench"))

TABLE = acc.classes()


# ------------------------------------------------------------------ the draw

def test_the_draw_is_a_function_of_the_seed():
    a = acc.draw(7, 60, TABLE, acc.REGIMES)
    b = acc.draw(7, 60, TABLE, acc.REGIMES)
    c = acc.draw(8, 60, TABLE, acc.REGIMES)
    assert a == b and len(a) == 60
    assert a != c
    assert [x.index for x in a] == list(range(60))


def test_a_full_campaign_covers_every_class_and_regime_pair():
    want = set(acc.pairs(TABLE, acc.REGIMES))
    # the seven faults and the clean runs, each in the regimes that apply to it (34 pairs today)
    assert {c for c, _ in want} >= {"clean", "loss", "slow-link", "straggler", "mismatch-hang", "link-down-hang",
                                    "gpu-hang", "reset"}
    assert ("mismatch-hang", "watch") in want and ("loss", "logs") not in want
    for seed in (1, 2, 3):
        cases = acc.draw(seed, 100, TABLE, acc.REGIMES)
        assert {(x.cls, x.regime) for x in cases} == want
        # the first round takes one pair per class in turn: a quick campaign sees every class
        assert {x.cls for x in cases[:len(TABLE)]} == set(TABLE)


def test_drawn_cases_stay_in_their_ranges():
    for x in acc.draw(11, 200, TABLE, acc.REGIMES):
        c = TABLE[x.cls]
        assert 2 <= x.ranks <= 8 and c.lowest_rank <= x.rank < x.ranks
        args = list(x.lab_args)
        assert args[args.index("--scenario") + 1] == c.scenario
        assert args[args.index("--ranks") + 1] == str(x.ranks) and args[args.index("--rank") + 1] == str(x.rank)
        if c.strength:
            v = float(args[args.index(c.strength[0]) + 1].removesuffix("mbit").removesuffix("%"))
            assert c.strength[1] - 0.5 <= v <= c.strength[2] + 0.5
        captured = "--capture" in args
        assert captured == (x.regime in acc.CAPTURED)
        if x.regime == "before":
            assert args[args.index("--capture-start") + 1] == "before"
        if x.regime in ("onset", "stagger"):
            assert args[args.index("--capture-start") + 1] == f"onset+{x.offset_s:g}" and 2 <= x.offset_s <= 10
        if x.regime == "stagger":
            lo, hi = map(float, x.stagger.split("-"))
            assert 1 <= lo < hi <= 7
        else:
            assert x.stagger is None


def test_plan_prints_the_cases_and_runs_nothing():
    p = subprocess.run([sys.executable, "bench/accuracy.py", "--plan", "--seed", "5", "--quick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("seed 5: 20 cases") and len(lines) == 21
    bad = subprocess.run([sys.executable, "bench/accuracy.py", "--plan", "--classes", "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown class nope" in bad.stderr and "Traceback" not in bad.stderr


# ------------------------------------------------------------------ the scoring

def _truth(cls: str, rank: int = 2, peer: int | None = None) -> dict:
    link = {"rank": rank, "addr": f"10.203.0.{10 + rank}"} if TABLE[cls].link else None
    return {"fault": {"kind": cls, "ranks": [rank], "link": link, "peer_rank": peer},
            "ranks": [{"rank": r, "addr": f"10.203.0.{10 + r}", "host": f"node{r}"} for r in range(4)],
            "world_size": 4, "onset_ns": 1}


def _f(kind: str, severity: str = "error", ranks=(2,), peers=(), links=()) -> dict:
    return {"kind": kind, "severity": severity, "ranks": list(ranks), "peer_ranks": list(peers), "links": list(links)}


def _r(cls: str, regime: str, findings: list[dict], truth: dict | None = None, status: str = "ok",
       ttv: float | None = 10.0, analyze_rc: int | None = 1, index: int = 0) -> dict:
    case = {"index": index, "cls": cls, "regime": regime}
    return {"case": case, "status": status, "error": "boom" if status != "ok" else "", "truth": truth or _truth(cls),
            "findings": findings, "analyze_rc": analyze_rc, "to_verdict_s": ttv}


INFO = _f("transport", "info", ranks=(0, 1, 2, 3))


def test_judge_right_wrong_and_edge_cases():
    j = acc.judge(_r("mismatch-hang", "onset", [INFO, _f("hang_mismatch")]), TABLE)
    assert j.right and j.predicted == "hang_mismatch" and j.link_ok is None and j.false_alarm is None
    # the right kind on the wrong rank
    j = acc.judge(_r("mismatch-hang", "onset", [_f("hang_mismatch", ranks=(1,))]), TABLE)
    assert j.right is False and j.kind_ok
    # no finding at all, or only info: "none", wrong
    assert acc.judge(_r("gpu-hang", "logs", [INFO]), TABLE).predicted == "none"
    assert acc.judge(_r("gpu-hang", "logs", []), TABLE).right is False
    # a warning only: it is the top serious finding (its kind is scored)
    j = acc.judge(_r("straggler", "before", [INFO, _f("straggler", "warning")]), TABLE)
    assert j.right and j.predicted == "straggler"
    j = acc.judge(_r("gpu-hang", "before", [_f("misconfiguration", "warning", ranks=(0,)), _f("hang_stuck")]), TABLE)
    assert j.right is False and j.predicted == "misconfiguration"
    # a lab error is neither right nor wrong; a failed analysis is wrong
    assert acc.judge(_r("reset", "watch", [], status="lab_error"), TABLE).right is None
    assert acc.judge(_r("reset", "watch", [], analyze_rc=2), TABLE).predicted == "analyze-error"


def test_judge_links_by_rank_or_address():
    lk = {"rank": 2, "peer_rank": 1}
    j = acc.judge(_r("loss", "onset", [_f("network_loss", "warning", ranks=(2,), peers=(1,), links=[lk])]), TABLE)
    assert j.right and j.link_ok
    by_addr = {"saddr": "10.203.0.11", "daddr": "10.203.0.12"}
    j = acc.judge(_r("link-down-hang", "before", [_f("hang_stuck", ranks=(2,), links=[by_addr])]), TABLE)
    assert j.right and j.link_ok
    j = acc.judge(_r("link-down-hang", "before", [_f("hang_stuck", ranks=(2,), links=[{"rank": 0, "peer_rank": 3}])]),
                  TABLE)
    assert j.right and j.link_ok is False
    # a reset's link has both ends: the host that reset, and the peer whose connection it reset
    t = _truth("reset", rank=2, peer=1)
    assert acc.judge(_r("reset", "logs", [_f("connection_reset", ranks=(2,), peers=(1,), links=[lk])], t), TABLE).link_ok
    half = {"rank": 2, "peer_rank": 3}
    j = acc.judge(_r("reset", "logs", [_f("connection_reset", ranks=(2,), peers=(1,), links=[half])], t), TABLE)
    assert j.right and j.link_ok is False
    # no finding: the link is not named
    assert acc.judge(_r("loss", "stagger", []), TABLE).link_ok is False


def test_false_alarms_on_runs_with_nothing_to_find():
    assert acc.judge(_r("clean", "watch", [INFO]), TABLE).false_alarm is False
    j = acc.judge(_r("clean", "onset", [INFO, _f("straggler", "warning", ranks=(0,))]), TABLE)
    assert j.false_alarm and j.right is False
    # slow-checkpoint: a warning naming rank 0 is allowed, an error is a false alarm
    ck = acc.FaultClass("slow-checkpoint", "slow-checkpoint", acc.REGIMES, (), alarm=("error",), fixed_rank=0)
    table = {**TABLE, "slow-checkpoint": ck}
    r = _r("slow-checkpoint", "before", [_f("straggler", "warning", ranks=(0,))], truth=_truth("clean", 0))
    assert acc.judge(r, table).right and acc.judge(r, table).false_alarm is False
    r = _r("slow-checkpoint", "before", [_f("hang_stuck", ranks=(0,))], truth=_truth("clean", 0))
    assert acc.judge(r, table).false_alarm is True


def test_score_tallies_confusion_top1_links_alarms_and_lab_errors():
    results = [
        _r("mismatch-hang", "onset", [_f("hang_mismatch")], ttv=20.0, index=0),
        _r("mismatch-hang", "logs", [], ttv=None, index=1),
        _r("loss", "onset", [_f("network_loss", "warning", ranks=(2,), peers=(1,), links=[{"rank": 2, "peer_rank": 1}])],
           ttv=30.0, index=2),
        _r("loss", "before", [_f("slow_link", "warning")], ttv=99.0, index=3),
        _r("clean", "onset", [INFO], index=4),
        _r("clean", "logs", [_f("misconfiguration", "warning", ranks=(0,))], index=5),
        _r("reset", "watch", [], status="lab_error", index=6),
    ]
    s = acc.score(results, TABLE)
    assert s.confusion == {"mismatch-hang": {"hang_mismatch": 1, "none": 1}, "loss": {"network_loss": 1, "slow_link": 1},
                           "clean": {"none": 1, "misconfiguration": 1}}
    assert s.top1 == [3, 6]
    assert s.per_class == {"mismatch-hang": [1, 2], "loss": [1, 2], "clean": [1, 2]}
    assert s.per_regime == {"onset": [3, 3], "logs": [0, 2], "before": [0, 1]}
    assert s.per_pair["loss/before"] == [0, 1]
    assert s.link == [1, 2]
    assert s.false_alarms == {"clean": [1, 2]}
    assert len(s.lab_errors) == 1 and "reset/watch" in s.lab_errors[0]
    # time to verdict: the right verdicts of faulted classes only (20 s and 30 s)
    assert (s.to_verdict_median_s, s.to_verdict_p90_s) == (25.0, 30.0)
    text = acc.report(s, 5, "bench/accuracy.py --seed 5", len(results))
    assert "seed 5" in text and "3/6 (50%)" in text and "lab errors (not scored): 1" in text
    assert "clean 1 of 2" in text


def test_score_of_nothing():
    s = acc.score([], TABLE)
    assert s.top1 == [0, 0] and s.to_verdict_median_s is None
    assert "top-1" in acc.report(s, 1, "x", 0)


def test_new_classes_join_only_when_the_lab_has_them():
    from tests.lab.scenarios import SCENARIOS
    names = {c.name for c in acc.ROWS}
    assert {"init-hang", "init-hang-dropped", "rank-killed", "link-flap", "cpu-starved", "host-stuck",
            "slow-checkpoint"} <= names
    assert set(TABLE) == {c.name for c in acc.ROWS if c.scenario in SCENARIOS}
    assert asdict(acc.ROWS[0])["name"] == "clean"


# ------------------------------------------------------------------ one real case

@pytest.mark.root
def test_one_real_case_end_to_end(tmp_path):
    """The cheapest class (a clean run, its logs alone) through the lab, the analysis and the
    scoring: a case that ran, scored, and no false alarm."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab's network namespaces")
    missing = [t for t in ("gcc", "make", "ip", "unshare", "bridge", "ss", "nsenter", "tcpdump", "bpftrace", "nft")
               if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (not installed)")
    out = tmp_path / "cases.json"
    p = subprocess.run([sys.executable, "bench/accuracy.py", "--cases", "1", "--classes", "clean", "--regimes", "logs",
                        "--seed", "3", "--out", str(out), "--keep", str(tmp_path / "work")], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = json.loads(out.read_text())
    assert d["seed"] == 3 and len(d["cases"]) == 1
    case = d["cases"][0]
    assert case["status"] == "ok", case["error"]
    assert case["analyze_rc"] in (0, 1) and case["inputs"] == 1 and case["truth"]["fault"]["kind"] == "none"
    assert d["score"]["top1"] == [1, 1] and d["score"]["false_alarms"] == {"clean": [0, 1]}, case["findings"]
    assert "seed 3" in p.stdout and "top-1" in p.stdout and "false alarms: clean 0 of 1" in p.stdout


def test_a_reset_seen_from_the_rank_whose_connection_was_reset():
    """The logs of the rank that received the reset name it, and the faulted host as its peer."""
    t = _truth("reset", rank=1, peer=0)
    f = _f("connection_reset", ranks=(0,), peers=(1,), links=[{"rank": 0, "peer_rank": 1}])
    j = acc.judge(_r("reset", "logs", [f], t), TABLE)
    assert j.right and j.link_ok
    # a rank that is neither end of the link is wrong
    f = _f("connection_reset", ranks=(3,), peers=(1,), links=[{"rank": 3, "peer_rank": 1}])
    assert acc.judge(_r("reset", "logs", [f], t), TABLE).right is False


# ------------------------------------------------------------------ re-scoring kept evidence

def test_rescore_analyses_the_kept_evidence_again_and_keeps_what_was_kept(tmp_path, capsys):
    """A campaign's kept case (logs regime: a 4-rank link down, tests/fixtures/lab_logs) whose
    recorded verdict was wrong is analysed again: its findings are now the analyzer's, its score
    with them; the kept report is not overwritten."""
    src = ROOT / "tests" / "fixtures" / "lab_logs" / "link-down-hang-4"
    case = tmp_path / "keep" / "case-000"
    shutil.copytree(src / "logs", case / "lab" / "logs")
    shutil.copy(src / "scenario.json", case / "lab" / "scenario.json")
    (case / "report.html").write_text("the campaign's own report")
    truth = json.loads((src / "scenario.json").read_text())
    c = acc.Case(index=0, cls="link-down-hang", regime="logs", ranks=4, rank=truth["fault"]["ranks"][0],
                 strength=None, timing=None, offset_s=None, stagger=None, seed=1, lab_args=[])
    r = asdict(acc.CaseResult(case=asdict(c)))
    r.update(status="ok", truth=acc._truth_part(truth), findings=[{"kind": "hang_stuck", "severity": "error",
                                                                    "ranks": [3], "peer_ranks": [], "links": []}])
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps({"seed": 46, "command": "bench/accuracy.py --quick", "cases": [r]}))
    assert acc.judge(r, TABLE).right is False
    out = tmp_path / "rescored.json"
    assert acc.main(["--rescore", str(cases), "--keep", str(tmp_path / "keep"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    again = json.loads(out.read_text())["cases"][0]
    assert again["findings"] and again["findings"] != r["findings"]
    assert acc.judge(again, TABLE).right is True, again["findings"][:2]
    assert "case   0 link-down-hang  logs    : right" in printed and "re-analysed" in printed
    assert (case / "report.html").read_text() == "the campaign's own report"
    assert (case / "rescore" / "report.html").exists()


def test_rescore_needs_the_kept_folder():
    with pytest.raises(SystemExit, match="--keep"):
        acc.main(["--rescore", "cases.json"])
