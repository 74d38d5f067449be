"""The real-world corpus: excerpts of public bug reports as posted (``fixtures/realworld/``).

Each folder is one verbatim excerpt with its source (``source.json``) and what a careful
reader finds in it (``expect.json``; schema in the folder's README). Every case is analysed as
a user gives it (its files, loose) and attached to a one-host capture; both must read every
fact, say nothing is wrong only where nothing is, and name the culprit the thread establishes.

A case the analyzer still gets wrong is listed in ``known_misses.txt`` (``loose|attached
NNN-slug: why``): it runs as a strict xfail, so the list can only shrink (a case that starts
passing fails until its line goes).
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

from conftest import FIXTURES
from corpus_checks import analyze_attached, analyze_loose, check_facts, check_findings, check_first_screen, packed

CORPUS = FIXTURES / "realworld"
CASES = sorted(p for p in CORPUS.iterdir() if (p / "expect.json").is_file()) if CORPUS.is_dir() else []
CLASSES = ("watchdog", "flight-recorder", "ras", "net-warn", "other-warn", "init", "launcher", "nccl-tests",
           "ib-tools", "kernel", "healthy")
MIN_CASES, MIN_PER_CLASS = 150, 5


def _misses() -> dict[tuple[str, str], str]:
    """(mode, case) -> why, from ``known_misses.txt``."""
    f = CORPUS / "known_misses.txt"
    out = {}
    for line in f.read_text().splitlines() if f.is_file() else []:
        if line.strip() and not line.startswith("#"):
            head, _, why = line.partition(":")
            mode, _, name = head.strip().partition(" ")
            out[(mode, name.strip())] = why.strip()
    return out


MISSES = _misses()


def _param(cases, mode):
    return [pytest.param(c, id=c.name, marks=pytest.mark.xfail(reason=MISSES[(mode, c.name)], strict=True))
            if (mode, c.name) in MISSES else pytest.param(c, id=c.name) for c in cases]


def test_the_corpus_covers_every_class():
    """≥150 cases, every class from ≥5 sources, each with its URL, class and damage noted."""
    assert len(CASES) >= MIN_CASES, f"{len(CASES)} cases in {CORPUS}"
    classes, urls = Counter(), {}
    for c in CASES:
        src = json.loads((c / "source.json").read_text())
        assert src.get("url", "").startswith("http"), (c.name, src)
        assert src.get("class") in CLASSES, (c.name, src.get("class"))
        assert isinstance(src.get("damage", []), list), c.name
        classes[src["class"]] += 1
        urls.setdefault(src["class"], set()).add(src["url"].split("#")[0])
    for cls in CLASSES:
        assert len(urls.get(cls, ())) >= MIN_PER_CLASS, (cls, classes[cls], sorted(urls.get(cls, ())))
    assert {n for _, n in MISSES} <= {c.name for c in CASES}, {n for _, n in MISSES} - {c.name for c in CASES}
    assert {m for m, _ in MISSES} <= {"loose", "attached"}, {m for m, _ in MISSES}


@pytest.mark.parametrize("case", _param(CASES, "loose"))
def test_case_loose(case, tmp_path):
    exp = json.loads((case / "expect.json").read_text())
    o = analyze_loose(case, exp, tmp_path, folder=False)
    try:
        check_facts(o, exp.get("facts", {}))
        check_findings(o, exp)
        check_first_screen(o)
    finally:
        o.close()


ATTACHED = [c for c in CASES if not packed(c)]


@pytest.mark.parametrize("case", _param(ATTACHED, "attached"))
def test_case_attached_to_a_capture(case, tmp_path):
    """Loose and attached agree: the same files under a capture's ``logs/`` give the same
    verdict on failure, and the same culprit."""
    exp = json.loads((case / "expect.json").read_text())
    o = analyze_attached(case, tmp_path)
    check_findings(o, {k: exp[k] for k in ("findings", "absent", "serious", "culprit") if k in exp})
