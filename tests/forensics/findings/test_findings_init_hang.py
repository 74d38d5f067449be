"""``init_hang`` (forensics/findings/init_hang.py) from the job's logs alone: NCCL's Init START
lines with no Init COMPLETE name the rank that never began its init; a rank whose log goes on
(COMPLETE, COLL lines) is no init hang. The lab runs in every regime:
tests/lab_runs/test_init_hang_regimes.py and tests/lab_runs/test_watch_blind.py."""
from __future__ import annotations

from forensics.analysis import analyze

START = ("node{r}:{pid}:{pid} [0] NCCL INFO comm 0x55f3262c67{r}0 rank {r} nranks 3 cudaDev 0 nvmlDev 0 busId 18000 "
         "commId 0x5a72fb5a69d10264 - Init START\n")
HEAD = "node{r}:{pid}:{pid} [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
DONE = ("node{r}:{pid}:{pid} [0] NCCL INFO comm 0x55f3262c67{r}0 rank {r} nranks 3 cudaDev 0 nvmlDev 0 busId 18000 "
        "commId 0x5a72fb5a69d10264 - Init COMPLETE\n")


def _logs(tmp_path, ranks, complete=()):
    for r in ranks:
        pid = 1000 + r
        text = HEAD.format(r=r, pid=pid) + START.format(r=r, pid=pid)
        if r in complete:
            text += DONE.format(r=r, pid=pid)
        (tmp_path / f"nccl-rank{r}.log").write_text(text)
    return [str(tmp_path)]


def test_the_rank_that_never_began_its_init_is_named(tmp_path):
    res = analyze(_logs(tmp_path, [0, 2]))
    top = res.findings[0]
    assert top.kind == "init_hang" and top.severity == "error" and top.ranks == [1], top
    assert top.peer_ranks == [0, 2] and top.details["missing"] == [1]


def test_every_rank_in_init_is_a_warning_naming_them_all(tmp_path):
    res = analyze(_logs(tmp_path, [0, 1, 2]))
    f = [f for f in res.findings if f.kind == "init_hang"]
    assert f and f[0].severity == "warning" and f[0].ranks == [0, 1, 2], f


def test_inits_that_completed_are_no_init_hang(tmp_path):
    res = analyze(_logs(tmp_path, [0, 1, 2], complete=(0, 1, 2)))
    assert not [f for f in res.findings if f.kind == "init_hang"], [(f.kind, f.summary) for f in res.findings]
