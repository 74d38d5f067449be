"""The log corpus: what real incidents leave behind, read loose (tests/fixtures/logs/<sample>/).

Each sample folder holds files in a format seen in public bug reports (NCCL 2.3 to 2.30,
PyTorch 1.x and 2.x, launchers: srun, mpirun, torchrun, Ray, Kubernetes, log shippers; the
corpus README names each format's source), written for this corpus, and ``expect.json``: the
truth a reader of those lines would state. Every sample is analyzed as a user would give it
(``stallscope analyze <files or folder>``, no bundle) and the tables and findings are checked
against it:

``facts`` (each optional):
    ``nccl_version``: a version some table reads (nccl_config or watchdog_events);
    ``warn_hosts``: the hosts of the NCCL WARN lines, exactly; ``warn_classes``: {class:
    at least this many lines}; ``first_failure``: {host, class} of the line marked first;
    ``watchdog``: {ranks: the ranks with a timeout line, seq: their SeqNum (the most common),
    hosts: the hosts those rows got}; ``exits``: [{rank, host, exitcode, kind}] rows of
    process_exits; ``nccl_tests``: {rows: at least, max_busbw_gbps, avg_busbw_gbps, failures};
    ``ib_ports``: [{host, device, port, state}]; ``hosts``: the hosts the model names (a subset).
``findings``: each a subset of one finding's fields (kind, severity, ranks, hosts, seq; ``ranks``
    and ``hosts`` as sets); ``top``: the kind of the first finding; ``absent``: kinds that must
    not appear; ``exit``: the command's exit code.
``inputs``: what to give, relative to the folder (default: the folder itself).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FIXTURES
from corpus_checks import analyze_attached, analyze_loose, check_facts, check_findings, check_first_screen, packed

CORPUS = FIXTURES / "logs"
SAMPLES = sorted(p for p in CORPUS.iterdir() if (p / "expect.json").is_file()) if CORPUS.is_dir() else []


def test_the_corpus_is_large_enough():
    assert len(SAMPLES) >= 30, f"{len(SAMPLES)} samples in {CORPUS}"
    readme = (CORPUS / "README.md").read_text()
    for s in SAMPLES:
        assert s.name in readme, f"{s.name} is not in the corpus README (its format's source)"


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_sample(sample, tmp_path):
    exp = json.loads((sample / "expect.json").read_text())
    o = analyze_loose(sample, exp, tmp_path)
    try:
        check_facts(o, exp.get("facts", {}))
        check_findings(o, exp)
        # the first screen from the logs alone (issue 36): one line, no clause cut short, and the
        # top serious finding's ranks by their own hosts where the logs name them
        check_first_screen(o)
    finally:
        o.close()


ATTACHED = [s for s in SAMPLES if not packed(s)]


@pytest.mark.parametrize("sample", ATTACHED, ids=[s.name for s in ATTACHED])
def test_sample_attached_to_a_capture(sample, tmp_path):
    """The same files attached to a capture (``stallscope capture --attach``: copied under logs/)
    give the same findings: each line's host is the one it names, not the capture's."""
    exp = json.loads((sample / "expect.json").read_text())
    o = analyze_attached(sample, tmp_path)
    check_findings(o, {k: exp[k] for k in ("findings", "absent", "exit") if k in exp})
