"""What a log corpus sample's ``expect.json`` says, checked against one analysis of it.

Shared by the hand-written corpus (``tests/forensics/test_logs_corpus.py``, ``fixtures/logs/``)
and the real-world one (``tests/forensics/test_realworld.py``, ``fixtures/realworld/``): both
analyse a folder of evidence through the command line in-process (loose, or attached to a
synthetic capture) and check the tables and findings against the truth a reader states. The
schema of ``expect.json`` is in ``fixtures/realworld/README.md``.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from forensics.cli import Env, main

ARCHIVES = (".gz", ".tgz", ".zip", ".bz2", ".xz", ".tar")
META = ("expect.json", "source.json")      # a sample's own description, never evidence


@dataclass
class Outcome:
    """One analysis of a sample: its exit code, ``--json`` document and (loose runs) database."""

    rc: int
    doc: dict
    stderr: str
    con: object = None       # a read-only DuckDB connection, or None

    @property
    def findings(self) -> list[dict]:
        return self.doc["findings"]

    def table(self, name: str) -> pd.DataFrame:
        if self.con is None:
            return pd.DataFrame()
        try:
            return self.con.execute(f"SELECT * FROM {name}").df()
        except Exception:   # noqa: BLE001 - an absent table reads as empty
            return pd.DataFrame()

    def close(self) -> None:
        if self.con is not None:
            self.con.close()


def _analyze(inputs: list[str], tmp: Path, db: bool) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    js = tmp / "findings.json"
    args = ["analyze", *inputs, "-o", str(tmp / "r.html"), "--json", str(js), "-q", "--jobs", "1"]
    if db:
        args += ["--db", str(tmp / "events.duckdb")]
    rc = main(args, Env(stdout=out, stderr=err, debug=True))
    assert rc in (0, 1), err.getvalue()
    con = None
    if db:
        import duckdb
        con = duckdb.connect(str(tmp / "events.duckdb"), read_only=True)
    return Outcome(rc, json.loads(js.read_text()), err.getvalue(), con)


def analyze_loose(sample: Path, exp: dict, tmp: Path, folder: bool = True) -> Outcome:
    """The sample as a user gives it: ``stallscope analyze <its folder>`` (``folder``), or its
    evidence files one by one; ``expect.json``'s ``inputs`` name other paths in it."""
    if "inputs" in exp:
        files = [str(sample / i) for i in exp["inputs"]]
    elif folder:
        files = [str(sample)]
    else:
        files = [str(p) for p in evidence_files(sample)]
    return _analyze(files, tmp, db=True)


def evidence_files(sample: Path) -> list[Path]:
    return sorted(p for p in sample.rglob("*") if p.is_file() and p.name not in META)


def analyze_attached(sample: Path, tmp: Path) -> Outcome:
    """The sample's files attached to a one-host capture (copied under ``logs/``, as
    ``stallscope capture --attach`` does)."""
    from synthetic_bundle import make_bundle
    files = {f"logs/{p.relative_to(sample).as_posix().replace('/', '_')}": p for p in evidence_files(sample)}
    b = make_bundle(tmp, "capture-node", [], files, attached=True)
    return _analyze([str(b)], tmp, db=False)


def packed(sample: Path) -> bool:
    return any(p.name.endswith(ARCHIVES) for p in sample.rglob("*"))


def finding_matches(f: dict, want: dict) -> bool:
    for k, v in want.items():
        got = f.get(k)
        if k in ("ranks", "hosts", "peer_ranks"):
            if set(got or []) != set(v):
                return False
        elif got != v:
            return False
    return True


def _brief(findings: list[dict]) -> list[dict]:
    return [{k: f.get(k) for k in ("kind", "severity", "ranks", "hosts", "seq", "summary")} for f in findings]


def check_facts(o: Outcome, facts: dict) -> None:
    """Every fact of ``expect.json``'s ``facts`` in the analysis's tables."""
    if "nccl_version" in facts:
        versions = set(o.table("nccl_config").get("nccl_version", pd.Series(dtype=str)).dropna()) | \
            set(o.table("watchdog_events").get("nccl_version", pd.Series(dtype=str)).dropna())
        assert any(str(v).startswith(facts["nccl_version"]) for v in versions), versions
    w = o.table("nccl_warnings")
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
        wd = o.table("watchdog_events")
        to = wd[wd["kind"].isin(["timeout", "terminated"])] if len(wd) else wd
        want = facts["watchdog"]
        if "ranks" in want:
            assert set(to["rank"].dropna().astype(int)) == set(want["ranks"]), to.to_string()
        if "seq" in want:
            assert len(to) and int(to["seq_num"].mode().iloc[0]) == want["seq"], to.to_string()
        if "hosts" in want:
            assert set(to["host"].dropna()) == set(want["hosts"]), to[["rank", "host"]].to_string()
    ex = o.table("process_exits")
    for want in facts.get("exits", []):
        assert any(all(r.get(k) == v for k, v in want.items()) for r in ex.to_dict("records")), ex.to_string()
    if "nccl_tests" in facts:
        want = facts["nccl_tests"]
        rows, runs = o.table("nccl_tests"), o.table("nccl_tests_runs")
        assert len(rows) >= want.get("rows", 0), rows.to_string()
        if "max_busbw_gbps" in want:
            assert rows["busbw_gbps"].max() == pytest.approx(want["max_busbw_gbps"])
        if "avg_busbw_gbps" in want:
            assert runs["avg_busbw_gbps"].dropna().tolist()[-1] == pytest.approx(want["avg_busbw_gbps"])
        if "failures" in want:
            assert runs["failures"].fillna(0).sum() >= want["failures"], runs.to_string()
    ports = o.table("ib_ports")
    for want in facts.get("ib_ports", []):
        assert any(all(r.get(k) == v for k, v in want.items()) for r in ports.to_dict("records")), ports.to_string()
    if "hosts" in facts:
        named = {h for c in [o.table(t) for t in ("nccl_config", "nccl_warnings", "watchdog_events")]
                 for h in c.get("host", pd.Series(dtype=str)).dropna()}
        assert set(facts["hosts"]) <= named, named


def check_findings(o: Outcome, exp: dict) -> None:
    """``findings`` (each matched by one finding), ``top``, ``absent``, ``exit``, ``serious`` and
    ``culprit`` of ``expect.json`` against the findings of one analysis."""
    findings = o.findings
    for want in exp.get("findings", []):
        assert any(finding_matches(f, want) for f in findings), (want, _brief(findings))
    if "top" in exp:
        assert findings and findings[0]["kind"] == exp["top"], [f["summary"] for f in findings]
    for kind in exp.get("absent", []):
        assert not any(f["kind"] == kind for f in findings), [f["summary"] for f in findings if f["kind"] == kind]
    if "exit" in exp:
        assert o.rc == exp["exit"], o.doc["verdict"]
    serious = [f for f in findings if f["severity"] in ("error", "warning")]
    if exp.get("serious") is True:
        assert serious and not o.doc["verdict"].startswith("No failure"), (o.doc["verdict"], _brief(findings))
    elif exp.get("serious") is False:
        assert not [f for f in findings if f["severity"] == "error"], (o.doc["verdict"], _brief(findings))
    if "culprit" in exp:
        assert serious, (o.doc["verdict"], _brief(findings))
        top = serious[0]
        for key in ("ranks", "hosts"):
            want = set(exp["culprit"].get(key, []))
            assert want <= set(top.get(key) or []), (key, want, _brief([top]), o.doc["verdict"])


def check_first_screen(o: Outcome) -> None:
    """The first screen from the logs alone: one line of at most 200 characters, no clause cut
    short, the top serious finding's own headline, no path for a host."""
    findings = o.findings
    verdict = o.doc["verdict"]
    serious = [f for f in findings if f["severity"] in ("error", "warning")]
    assert len(verdict) <= 200 and verdict.count("(") == verdict.count(")"), verdict
    if serious:
        top = serious[0]
        assert verdict == top["headline"] and not verdict.endswith((":", ";", ",")), verdict
        assert "{" not in top["headline"], top["headline"]
        assert top["since_ns"] is not None or "time not in the logs" in top["headline"] \
            or "since" not in top["headline"], top["headline"]
        for h in top.get("hosts") or []:
            assert "/" not in h, (h, verdict)
        hosts = top.get("hosts") or []
        if top.get("ranks") and (not hosts or all(str(h).startswith(("unknown", "host unknown")) for h in hosts)):
            assert "rank" in verdict, ("no host is known: the headline names the ranks", verdict, top["ranks"])
