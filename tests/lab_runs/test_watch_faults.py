"""Every lab fault under the watcher as deployed gets the kind and rank a capture gets, early and
late in the job (issue 43: "Under the watcher as deployed, every lab fault ... faults early and
late in the job").

One watcher (no --pid, no --nccl-lib; ``--hang-after 5s --after 5s --before 20s``) is started
before the jobs, each from a library path it has never seen. A hang (a link down, a collective
mismatch, a GPU hang, a reset) triggers it by itself; a job that is slow but not hung (loss, a
slow link, a straggler) does not, so an operator asks for the bundle (the on-demand trigger
file, 8 s after the onset: ``tests/lab --operator-trigger``). "Early": the fault 2 s into
training (a mismatch at op 150), the least the watcher promises to see the collectives before;
"late": some 12 s in (op 900), long after the tracer's restart for the job. Each bundle is analysed alone and its verdict scored by the rule the
capture tests and the accuracy campaign use (tests/lab/verdicts.py): the top serious finding
has the kind a capture gives and names the faulted rank; for a link's fault, one of its links
has the faulted link's ends.

Slow (about half an hour; ``make watch-faults``): skipped unless STALLSCOPE_WATCH_FAULTS=1."""
from __future__ import annotations

import os

import pytest

from capture_helpers import bundle_manifest
from tests.lab.verdicts import names_fault, names_link, serious
from watched_jobs import watched_lab

pytestmark = pytest.mark.skipif(os.environ.get("STALLSCOPE_WATCH_FAULTS") != "1",
                                reason="half an hour of lab jobs under a watcher: make watch-faults")

OPERATOR_AT_S = 8.0           # an operator asks for the bundle this long after a slow job's onset
EARLY_S, LATE_S = 2.0, 12.0   # the fault's start after training began
EARLY_OP, LATE_OP = 150, 900  # a mismatch's op (about 75 ops a second here)
# steps a slow job needs to outlast the onset, the operator's trigger and the --after window:
# per second before the fault (about 25 steps a second with these sizes) and at the fault's
# pace after it (an idle machine: a loaded one is slower, the job only longer)
STEPS_BEFORE_PER_S = 30
STEPS_PER_S = {"loss": 20, "slow-link": 8, "straggler": 4}

# fault -> (the lab's arguments, the kinds a capture's verdict has, whether its link is scored,
# whether the watcher triggers by itself)
FAULTS = {
    "link-down-hang": (["--scenario", "link-down-hang", "--ranks", "3", "--rank", "2", "--hold-s", "25"],
                       ("hang_stuck",), True, True),
    "mismatch-hang": (["--scenario", "mismatch-hang", "--ranks", "3", "--rank", "1", "--hold-s", "25"],
                      ("hang_mismatch",), False, True),
    "gpu-hang": (["--scenario", "gpu-hang", "--ranks", "3", "--rank", "1", "--hold-s", "25"], ("hang_stuck",), False,
                 True),
    "reset": (["--scenario", "reset", "--ranks", "3", "--rank", "1", "--hold-s", "25"], ("connection_reset",), True,
              True),
    "loss": (["--scenario", "loss", "--ranks", "3", "--rank", "1", "--loss-permille", "40"], ("network_loss",), True,
             False),
    "slow-link": (["--scenario", "slow-link", "--ranks", "3", "--rank", "1", "--rate", "60mbit"], ("slow_link",), True,
                  False),
    "straggler": (["--scenario", "straggler", "--ranks", "3", "--rank", "2", "--straggle-ms", "250"], ("straggler",),
                  False, False),
}


def lab_args(fault: str, when: str) -> tuple[list[str], float | None]:
    """(the lab's arguments for ``fault`` ``when`` (early, late) in the job, the operator's
    trigger time after the onset: None where the watcher triggers by itself)."""
    args, _, _, triggers = FAULTS[fault]
    start = EARLY_S if when == "early" else LATE_S
    if fault == "mismatch-hang":
        return args + ["--at-op", str(EARLY_OP if when == "early" else LATE_OP)], None
    args = args + ["--start-s", f"{start:g}"]
    if triggers:
        return args, None
    steps = int(STEPS_BEFORE_PER_S * start + STEPS_PER_S[fault] * (OPERATOR_AT_S + 15))
    return args + ["--steps", str(steps)], OPERATOR_AT_S


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with watched_lab(tmp_path_factory, "faults") as lab:
        yield lab


@pytest.mark.parametrize("when", ["early", "late"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_watchers_bundle_gets_a_captures_verdict(lab, fault, when):
    from forensics.analysis import analyze
    watch = lab["watch"]
    args, operator_at = lab_args(fault, when)
    job = watch.run(f"{fault}-{when}", lab["build"], args, operator_at_s=operator_at)
    truth, bundles = job["truth"], job["bundles"]
    assert len(bundles) == 1, (bundles, watch.err.read_text()[-3000:])
    m = bundle_manifest(bundles[0])
    assert (m["trigger"]["kind"] == "on-demand") == (operator_at is not None), m["trigger"]
    res = analyze([str(bundles[0])])
    assert not [p for p in res.problems if "detector" in p], res.problems
    top = serious(res.findings)
    assert top, [f.headline for f in res.findings]
    _, kinds, link, _ = FAULTS[fault]
    brief = (top[0].kind, top[0].ranks, top[0].peer_ranks, top[0].headline)
    assert top[0].kind in kinds and names_fault(top[0], truth, link), (brief, truth["fault"])
    if link:
        assert names_link(top[0], truth), (top[0].links, truth["fault"])
