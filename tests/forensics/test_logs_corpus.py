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

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import FIXTURES
from forensics.cli import Env, main

CORPUS = FIXTURES / "logs"
SAMPLES = sorted(p for p in CORPUS.iterdir() if (p / "expect.json").is_file()) if CORPUS.is_dir() else []


def test_the_corpus_is_large_enough():
    assert len(SAMPLES) >= 30, f"{len(SAMPLES)} samples in {CORPUS}"
    readme = (CORPUS / "README.md").read_text()
    for s in SAMPLES:
        assert s.name in readme, f"{s.name} is not in the corpus README (its format's source)"


def _run(sample: Path, tmp_path: Path):
    exp = json.loads((sample / "expect.json").read_text())
    inputs = [str(sample / i) for i in exp.get("inputs", ["."])]
    out, err = io.StringIO(), io.StringIO()
    db = tmp_path / "events.duckdb"
    js = tmp_path / "findings.json"
    rc = main(["analyze", *inputs, "-o", str(tmp_path / "r.html"), "--json", str(js), "--db", str(db), "-q",
               "--jobs", "1"], Env(stdout=out, stderr=err, debug=True))
    assert rc in (0, 1), err.getvalue()
    import duckdb
    con = duckdb.connect(str(db), read_only=True)
    return exp, rc, json.loads(js.read_text()), con, err.getvalue()


def _table(con, name: str) -> pd.DataFrame:
    try:
        return con.execute(f"SELECT * FROM {name}").df()
    except Exception:   # noqa: BLE001 - an absent table reads as empty
        return pd.DataFrame()


def _finding_matches(f: dict, want: dict) -> bool:
    for k, v in want.items():
        got = f.get(k)
        if k in ("ranks", "hosts", "peer_ranks"):
            if set(got or []) != set(v):
                return False
        elif got != v:
            return False
    return True


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_sample(sample, tmp_path):
    exp, rc, doc, con, err = _run(sample, tmp_path)
    facts = exp.get("facts", {})
    if "nccl_version" in facts:
        versions = set(_table(con, "nccl_config").get("nccl_version", pd.Series(dtype=str)).dropna()) | \
            set(_table(con, "watchdog_events").get("nccl_version", pd.Series(dtype=str)).dropna())
        assert any(str(v).startswith(facts["nccl_version"]) for v in versions), versions
    w = _table(con, "nccl_warnings")
    if "warn_hosts" in facts:
        assert set(w["host"].dropna()) == set(facts["warn_hosts"]), w[["host", "message"]].to_string()
    for cls, n in facts.get("warn_classes", {}).items():
        assert (w["class"] == cls).sum() >= n, (cls, w[["class", "message"]].to_string())
    if "first_failure" in facts:
        first = w[w["first"].fillna(False).astype(bool)]
        assert len(first), w.to_string()
        for k, v in facts["first_failure"].items():
            assert first.iloc[0][k] == v, first.to_string()
    if "watchdog" in facts:
        wd = _table(con, "watchdog_events")
        to = wd[wd["kind"].isin(["timeout", "terminated"])]
        want = facts["watchdog"]
        if "ranks" in want:
            assert set(to["rank"].dropna().astype(int)) == set(want["ranks"]), to.to_string()
        if "seq" in want:
            assert int(to["seq_num"].mode().iloc[0]) == want["seq"]
        if "hosts" in want:
            assert set(to["host"].dropna()) == set(want["hosts"]), to[["rank", "host"]].to_string()
    ex = _table(con, "process_exits")
    for want in facts.get("exits", []):
        assert any(all(r.get(k) == v for k, v in want.items()) for r in ex.to_dict("records")), ex.to_string()
    if "nccl_tests" in facts:
        want = facts["nccl_tests"]
        rows, runs = _table(con, "nccl_tests"), _table(con, "nccl_tests_runs")
        assert len(rows) >= want.get("rows", 0), rows.to_string()
        if "max_busbw_gbps" in want:
            assert rows["busbw_gbps"].max() == pytest.approx(want["max_busbw_gbps"])
        if "avg_busbw_gbps" in want:
            assert runs["avg_busbw_gbps"].dropna().tolist()[-1] == pytest.approx(want["avg_busbw_gbps"])
        if "failures" in want:
            assert runs["failures"].fillna(0).sum() >= want["failures"], runs.to_string()
    ports = _table(con, "ib_ports")
    for want in facts.get("ib_ports", []):
        assert any(all(r.get(k) == v for k, v in want.items()) for r in ports.to_dict("records")), ports.to_string()
    if "hosts" in facts:
        named = {h for c in [_table(con, t) for t in ("nccl_config", "nccl_warnings", "watchdog_events")]
                 for h in c.get("host", pd.Series(dtype=str)).dropna()}
        assert set(facts["hosts"]) <= named, named
    findings = doc["findings"]
    for want in exp.get("findings", []):
        assert any(_finding_matches(f, want) for f in findings), \
            (want, [{k: f[k] for k in ("kind", "severity", "ranks", "hosts", "seq", "summary")} for f in findings])
    if "top" in exp:
        assert findings and findings[0]["kind"] == exp["top"], [f["summary"] for f in findings]
    for kind in exp.get("absent", []):
        assert not any(f["kind"] == kind for f in findings), [f["summary"] for f in findings if f["kind"] == kind]
    if "exit" in exp:
        assert rc == exp["exit"], doc["verdict"]
    # the first screen from the logs alone (issue 36): one line, no clause cut short, and the
    # top serious finding's ranks by their own hosts where the logs name them
    serious = [f for f in findings if f["severity"] in ("error", "warning")]
    assert len(doc["verdict"]) <= 200 and doc["verdict"].count("(") == doc["verdict"].count(")"), doc["verdict"]
    if serious:
        top = serious[0]
        assert doc["verdict"] == top["headline"] and not doc["verdict"].endswith((":", ";", ",")), doc["verdict"]
        assert "{" not in top["headline"], top["headline"]
        assert top["since_ns"] is not None or "time not in the logs" in top["headline"] \
            or "since" not in top["headline"], top["headline"]
    con.close()


ARCHIVES = (".gz", ".tgz", ".zip", ".bz2", ".xz", ".tar")
ATTACHED = [s for s in SAMPLES if not any(p.name.endswith(ARCHIVES) for p in s.rglob("*"))]


@pytest.mark.parametrize("sample", ATTACHED, ids=[s.name for s in ATTACHED])
def test_sample_attached_to_a_capture(sample, tmp_path):
    """The same files attached to a capture (``stallscope capture --attach``: copied under logs/)
    give the same findings: each line's host is the one it names, not the capture's."""
    from synthetic_bundle import make_bundle
    exp = json.loads((sample / "expect.json").read_text())
    files = {f"logs/{p.relative_to(sample).as_posix().replace('/', '_')}": p for p in sorted(sample.rglob("*"))
             if p.is_file() and p.name not in ("expect.json",)}
    b = make_bundle(tmp_path, "capture-node", [], files)
    out, err = io.StringIO(), io.StringIO()
    js = tmp_path / "f.json"
    rc = main(["analyze", str(b), "-o", str(tmp_path / "r.html"), "--json", str(js), "-q", "--jobs", "1"],
              Env(stdout=out, stderr=err, debug=True))
    assert rc in (0, 1), err.getvalue()
    findings = json.loads(js.read_text())["findings"]
    for want in exp.get("findings", []):
        assert any(_finding_matches(f, want) for f in findings), \
            (want, [{k: f[k] for k in ("kind", "severity", "ranks", "hosts", "seq", "summary")} for f in findings])
    for kind in exp.get("absent", []):
        assert not any(f["kind"] == kind for f in findings), [f["summary"] for f in findings if f["kind"] == kind]
    if "exit" in exp:
        assert rc == exp["exit"]
