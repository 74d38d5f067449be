"""``stallscope analyze`` end to end on every shipped bundle, and its four outputs: the
HTML report, the findings JSON (DESIGN.md contract), the Markdown summary and the
Perfetto trace; outputs never overwritten; hostile strings rendered as text."""
from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path

import pytest

from conftest import ROOT
from forensics.analysis import analyze as run_analysis
from forensics.findings import Finding
from forensics.report import html as html_report
from forensics.report import markdown as md_report
from forensics.report import perfetto, write_json
from tests.report_helpers import (
    PAYLOAD, PAYLOAD_IMG, PAYLOAD_MD, SCENARIOS, analyze, bundle, comparable, copy_report, hostile_bundle,
    validate_trace,
)

pytestmark = pytest.mark.skipif(not SCENARIOS, reason="no shipped bundles")
CONTRACT_KEYS = {"kind", "severity", "confidence", "ranks", "hosts", "peer_ranks", "links", "summary", "evidence",
                 "sql", "headline", "nodes", "op_count", "seq", "since_ns", "since_source", "since_precision_ns",
                 "confidence_note"}
MAX_REPORT_BYTES = 6 * 1024 * 1024


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every scenario analysed once with every output."""
    base = tmp_path_factory.mktemp("analyze")
    return {s: analyze([bundle(s)], base / s) for s in SCENARIOS}


@pytest.fixture(scope="module", params=SCENARIOS)
def run(request, runs):
    return request.param, runs[request.param]


def test_analyze_writes_every_output_and_exits_by_severity(run):
    scenario, r = run
    assert r.rc in (0, 1), r.stderr
    doc = json.loads(r.path("findings.json").read_text())
    has_error = any(f["severity"] == "error" for f in doc["findings"])
    assert r.rc == (1 if has_error else 0)
    for name in ("report.html", "findings.json", "summary.md", "trace.json"):
        assert r.path(name).stat().st_size > 0
    # ends by printing the verdict and the report path; progress went to stderr
    assert r.stdout.splitlines()[0] == f"verdict: {doc['verdict']}"
    assert f"html: {r.path('report.html')}" in r.stdout
    for phase in ("reading", "looking for findings", "rendering html"):
        assert phase in r.stderr
    size = r.path("report.html").stat().st_size
    assert size <= MAX_REPORT_BYTES, f"{scenario}: report is {size} bytes"
    copy_report(r.path("report.html"), f"report-{scenario}.html")


def test_clean_and_faulted_exit_codes(runs):
    """The clean lab run is not an error; a hang is (when its detector has landed, the
    exit code follows from the JSON above; here: clean must never exit 1)."""
    if "clean" in runs:
        doc = json.loads(runs["clean"].path("findings.json").read_text())
        assert not [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
        assert runs["clean"].rc == 0


def test_findings_json_follows_the_contract_and_carries_every_finding(run):
    scenario, r = run
    doc = json.loads(r.path("findings.json").read_text())
    assert doc["schema_version"] == 1
    assert isinstance(doc["verdict"], str) and doc["verdict"]
    assert isinstance(doc["capture"], dict) and doc["capture"]["hosts"]
    sev_order = {"error": 0, "warning": 1, "info": 2}
    prev = -1
    for f in doc["findings"]:
        assert CONTRACT_KEYS <= set(f)
        assert f["severity"] in sev_order and 0 <= f["confidence"] <= 1
        assert all(isinstance(x, int) for x in f["ranks"] + f["peer_ranks"])
        assert isinstance(f["evidence"], list) and isinstance(f["sql"], str)
        assert sev_order[f["severity"]] >= prev   # most important first
        prev = sev_order[f["severity"]]
    html = r.path("report.html").read_text()
    # every finding is in the report (one block each) with its SQL in the appendix
    assert html.count('<div class="finding ') == len(doc["findings"])
    assert html.count('<h3 id="sql-') == len(doc["findings"])
    # the ticket: every finding one line in its table, the serious ones (up to 3) in full, under 60 lines
    md = r.path("summary.md").read_text()
    serious = [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
    assert len(re.findall(r"(?m)^### \d+\. ", md)) == min(3, len(serious))
    table = md.split("## Findings", 1)[1].split("\n\n", 2)[1] if doc["findings"] else ""
    assert len([x for x in table.splitlines() if x.startswith("| ") and x[2:3].isdigit()]) == \
        min(len(doc["findings"]), md_report.MD_FINDINGS)
    assert len(md.splitlines()) < 60, md
    # nothing said twice: the verdict, once as the title; the top summary once
    if serious:
        assert md.count(serious[0]["summary"][:60].replace("_", "\\_")) <= 1


def test_markdown_summary_renders(run):
    markdown_it = pytest.importorskip("markdown_it")
    scenario, r = run
    doc = json.loads(r.path("findings.json").read_text())
    md = r.path("summary.md").read_text()
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    h1 = re.search(r"<h1>(.*?)</h1>", html).group(1)
    assert doc["verdict"][:40].replace("&", "&amp;") in h1.replace("\\", "")
    assert "<h2>Capture</h2>" in html
    if doc["findings"]:
        assert html.count("<table>") >= 1
        assert "<h2>Findings</h2>" in html
    # every table row has as many cells as its header
    for table in re.findall(r"<table>.*?</table>", html, re.S):
        head = len(re.findall(r"<th[ >]", re.search(r"<thead>.*?</thead>", table, re.S).group(0)))
        for row in re.findall(r"<tr>.*?</tr>", re.search(r"<tbody>.*?</tbody>", table, re.S).group(0)
                              if "<tbody>" in table else "", re.S):
            assert len(re.findall(r"<td[ >]", row)) == head


def test_perfetto_trace_is_valid(run):
    scenario, r = run
    doc = json.loads(r.path("trace.json").read_text())
    assert validate_trace(doc) == []
    ev = doc["traceEvents"]
    a = run_analysis([bundle(scenario)])
    try:
        n = a.model.tables["nccl_events"].dropna(subset=["timestamp_ns", "rank"])
        t = a.model.tables["tcp_events"].dropna(subset=["timestamp_ns"])
        assert sum(e["ph"] == "X" for e in ev) == len(n)
        assert sum(e["ph"] == "i" for e in ev) == len(t)
        ranks = {int(x) for x in n["rank"]}
        names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
        assert {f"rank {r}" for r in ranks} <= names
        procs = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
        assert set(a.model.hosts) <= procs
        # the TCP instants sit on the track of the rank that owns the flow
        owned = [e for e in ev if e["ph"] == "i" and e["args"]["rank"] is not None]
        assert all(e["tid"] == e["args"]["rank"] + 1 for e in owned)
    finally:
        a.close()


def test_validator_catches_broken_traces():
    ok = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "h"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "rank 0"}},
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
        {"ph": "i", "name": "c", "pid": 1, "tid": 1, "ts": 4, "s": "t"}]}
    assert validate_trace(ok) == []
    bad = copy.deepcopy(ok)
    bad["traceEvents"][3]["dur"] = 20          # b starts inside a and ends after it
    assert any("nesting" in e for e in validate_trace(bad))
    bad = copy.deepcopy(ok)
    bad["traceEvents"][4]["ts"] = 1            # back in time on the track
    assert any("goes back" in e for e in validate_trace(bad))
    bad = copy.deepcopy(ok)
    del bad["traceEvents"][1]
    assert any("thread_name" in e for e in validate_trace(bad))


def test_outputs_are_never_overwritten(tmp_path):
    b = bundle(SCENARIOS[0])
    first = analyze([b], tmp_path)
    assert first.rc in (0, 1), first.stderr
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    again = analyze([b], tmp_path)
    assert again.rc == 2
    assert len(again.stderr.strip().splitlines()) == 1 and "already exists" in again.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    # only the JSON exists elsewhere: still refused, before any analysis ran
    other = tmp_path / "other"
    other.mkdir()
    (other / "findings.json").write_text("keep")
    r = analyze([b], other)
    assert r.rc == 2 and (other / "findings.json").read_text() == "keep"
    assert not (other / "report.html").exists() and "reading" not in r.stderr
    forced = analyze([b], other, "--force")
    assert forced.rc in (0, 1) and json.loads((other / "findings.json").read_text())["schema_version"] == 1


def test_default_report_name_in_the_current_directory(tmp_path, monkeypatch):
    from forensics.cli import Env, main
    monkeypatch.chdir(tmp_path)
    so, se = io.StringIO(), io.StringIO()
    rc = main(["analyze", "-q", str(bundle(SCENARIOS[0]))], Env(stdout=so, stderr=se))
    assert rc in (0, 1) and (tmp_path / "stallscope-report.html").is_file()
    assert se.getvalue() == "" or "warning" in se.getvalue()    # -q: no progress lines
    assert "[" not in se.getvalue().split("warning")[0]


@pytest.mark.parametrize("argv, message", [
    (["analyze", "/nonexistent/bundle.tar.gz"], "bundle"),
    (["analyze", "BUNDLE", "-o", "/nonexistent-dir/r.html"], "does not exist"),
    (["analyze", "BUNDLE", "--json", "x.json", "--markdown", "x.json"], "same file"),
    (["analyze", "BUNDLE", "--slow-ms", "-1"], "slow-ms"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, monkeypatch):
    from forensics.cli import Env, main
    monkeypatch.chdir(tmp_path)
    argv = [str(bundle(SCENARIOS[0])) if a == "BUNDLE" else a for a in argv]
    so, se = io.StringIO(), io.StringIO()
    rc = main(argv, Env(stdout=so, stderr=se))
    assert rc == 2
    errs = [line for line in se.getvalue().splitlines() if "error" in line]
    assert len(errs) == 1 and message in errs[0], se.getvalue()
    assert not (tmp_path / "stallscope-report.html").exists()


def test_db_keeps_events_and_findings(tmp_path):
    import duckdb
    db = tmp_path / "events.duckdb"
    r = analyze([bundle(SCENARIOS[0])], tmp_path, "--db", str(db))
    assert r.rc in (0, 1), r.stderr
    doc = json.loads(r.path("findings.json").read_text())
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM findings").fetchone()[0] == len(doc["findings"])
        assert con.execute("SELECT count(*) FROM nccl_events").fetchone()[0] > 0
    finally:
        con.close()


# ---- hostile strings -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    scenario = "loss" if "loss" in SCENARIOS else SCENARIOS[0]
    root = hostile_bundle(bundle(scenario), base / "in")
    r = analyze([root], base / "out")
    assert r.rc in (0, 1), r.stderr
    copy_report(r.path("report.html"), "report-hostile.html")
    return r


def test_hostile_strings_render_as_text_in_html(hostile):
    html = hostile.path("report.html").read_text()
    body = html.split("<body>", 1)[1].rsplit('<script nonce=', 2)[0]
    for raw in (PAYLOAD, "<img src=x", 'onerror="window'):
        assert raw not in body
    assert "node&lt;script&gt;window.__pwned=1&lt;/script&gt;" in body     # the host, as text
    assert "train&lt;script&gt;" in body                                   # a process name
    assert "failed &lt;script&gt;" in body                                 # a collector's reason
    assert "&lt;script&gt;" in body.split('id="capture"', 1)[1]            # paths in the capture section
    # figure data: no raw '<' can close the data block
    for block in re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', html, re.S):
        assert "<" not in block
        json.loads(block)
    # the only executable scripts are the report's own (nonce), the CSP forbids the rest
    nonce = re.search(r"'nonce-([^']+)'", html).group(1)
    for tag in re.findall(r"<script(?![^>]*type=\"application/json\")[^>]*>", html):
        assert f'nonce="{nonce}"' in tag


def test_hostile_strings_render_as_text_in_markdown(hostile):
    markdown_it = pytest.importorskip("markdown_it")
    md = hostile.path("summary.md").read_text()
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert "<script" not in html and "<img" not in html and 'href="javascript' not in html
    assert "&lt;script&gt;" in html


def test_hostile_strings_in_perfetto_and_json(hostile):
    doc = json.loads(hostile.path("trace.json").read_text())
    assert validate_trace(doc) == []
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert any(PAYLOAD in n for n in names)     # JSON carries it verbatim: a viewer's job to show text
    assert PAYLOAD in json.dumps(json.loads(hostile.path("findings.json").read_text()))


# ---- rendering findings built by hand (independent of which detectors exist) -----------------

def _findings() -> list[Finding]:
    return [
        Finding(kind="network_loss", severity="error", confidence=0.9,
                summary=f"rank 2 on {PAYLOAD}: AllReduce p99 187 ms vs 21 ms on peers", ranks=[2], hosts=["node2"],
                peer_ranks=[3], links=[{"rank": 2, "peer_rank": 3, "saddr": "10.0.0.2", "daddr": "10.0.0.3"}],
                evidence=[{"rank": 2, "retransmits": 3, "note": PAYLOAD_IMG, "ratio": float("nan")}] * 40,
                sql="SELECT rank, count(*) FROM tcp_events WHERE rank < 3 GROUP BY 1", action="Check the NIC",
                details={"p99_ns": 187_000_000, "first_ns": 1_795_375_343_638_837_704, "per_rank": {"2": 1}}),
        Finding(kind="straggler", severity="warning", confidence=0.5, summary="rank 1 enters late",
                ranks=[1], sql="SELECT 1", action="Look at rank 1's input pipeline"),
        Finding(kind="misconfiguration", severity="info", confidence=0.3, summary="NCCL on sockets", ranks=[0]),
    ]


@pytest.fixture(scope="module")
def built():
    a = run_analysis([bundle(SCENARIOS[0])])
    a.findings = _findings()
    yield a
    a.close()


def test_html_with_constructed_findings(built):
    html = html_report.render(built)
    banner = html.split('<section id="verdict"', 1)[1].split("</section>", 1)[0]
    assert "rank 2 on node" not in banner or "&lt;script&gt;" in banner
    assert PAYLOAD not in html.split("<body>", 1)[1].rsplit("<script nonce=", 2)[0]
    assert "Check the NIC" in banner and "rank 1 enters late" in banner     # top finding + the other serious one
    assert "NCCL on sockets" not in banner                                  # info stays out of the banner
    assert 'class="verdict error"' in html
    assert "first 25 of 40 rows" in html                                    # evidence capped, says so
    assert "<th>p99</th><td>187 ms</td>" in html                          # *_ns durations with their unit
    assert "SELECT rank, count(*) FROM tcp_events WHERE rank &lt; 3 GROUP BY 1" in html
    assert html.count('<div class="finding ') == 3


def test_markdown_with_constructed_findings(built):
    md = md_report.render(built)
    assert md.startswith("# stallscope: rank 2 on &lt;script&gt;")
    assert "- **Next:** Check the NIC" in md
    assert "- **Where:** rank 2; on node2; address 10.0.0.2; links 2 ↔ 3" in md
    assert "**What to do:** Look at rank 1's input pipeline" in md      # the other serious finding's
    assert "Evidence (40 rows, first 8;" in md
    assert len(md.splitlines()) < 60
    assert PAYLOAD_MD not in md                      # pipes and links escaped in table cells


def test_json_is_strict_with_nan_in_evidence(built):
    buf = io.StringIO()
    write_json(built, buf)
    doc = json.loads(buf.getvalue())                 # json.loads accepts NaN; check the text itself
    assert "NaN" not in buf.getvalue()
    assert doc["findings"][0]["evidence"][0]["ratio"] is None
    assert [f["kind"] for f in doc["findings"]] == ["network_loss", "straggler", "misconfiguration"]


def test_perfetto_with_constructed_findings(built):
    doc = perfetto.trace(built)
    assert validate_trace(doc) == []
    assert doc["otherData"]["verdict"].startswith("rank 2 on")


def test_a_compiled_template_is_kept_for_the_next_run_and_renders_the_same(built, tmp_path, monkeypatch):
    """The second run takes the templates from the bytecode cache instead of compiling them,
    and the report is the same; a damaged entry, or a cache that cannot be read or written,
    costs only the compiling."""
    import jinja2
    compiled: list[str] = []
    compile_ = jinja2.Environment.compile

    def counting(self, source, name=None, *args, **kwargs):
        compiled.append(name)
        return compile_(self, source, name, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    folder = str(html_report.template_dir())
    cache = tmp_path / "cache"
    cache.mkdir()
    broken = tmp_path / "not-a-folder"                      # neither readable nor writable as a cache
    broken.write_text("")

    def run(where: Path) -> str:
        html_report._environment.cache_clear()            # a new process, as far as Jinja knows
        env = html_report._environment(folder, str(where))
        monkeypatch.setattr(html_report, "template", lambda: env.get_template(html_report.TEMPLATE))
        return comparable(html_report.render(built))

    try:
        pages = [run(cache)]
        assert {html_report.TEMPLATE, "table.html.j2"} <= set(compiled)
        kept = list(cache.iterdir())
        assert len(kept) == 2                              # both kept
        first = len(compiled)
        pages.append(run(cache))
        assert len(compiled) == first, compiled[first:]   # nothing compiled again
        for entry in kept:                                # damaged past Jinja's own header check
            entry.write_bytes(jinja2.bccache.bc_magic + b"garbage!")
        pages.append(run(cache))
        assert len(compiled) == 2 * first                 # compiled again, no error
        pages.append(run(broken))
        assert len(compiled) == 3 * first                 # the broken cache: compiled again, no error
    finally:
        html_report._environment.cache_clear()
    assert pages[0] == pages[1] == pages[2] == pages[3]


def test_templates_ship_with_the_package():
    """The templates are found from the checkout, and pyproject installs every one of them
    as data files where html.template_dir() looks in an installed package."""
    tomllib = pytest.importorskip("tomllib")     # Python 3.11+
    root = ROOT
    assert html_report.template_dir() == root / "templates"
    conf = tomllib.loads((root / "pyproject.toml").read_text())
    globs = conf["tool"]["setuptools"]["data-files"]["share/stallscope/templates"]
    shipped = {p for g in globs for p in root.glob(g)}
    assert shipped == set((root / "templates").iterdir())


def test_large_timelines_are_thinned_to_stay_small(tmp_path):
    """A capture 200x the lab's (52k calls, 60k TCP events): the report stays under 6 MB,
    keeps every slow call, and says what it thinned."""
    import numpy as np
    import pandas as pd

    from forensics.report import figures
    scenario = "loss" if "loss" in SCENARIOS else SCENARIOS[0]
    a = run_analysis([bundle(scenario)])
    try:
        n, t = a.model.tables["nccl_events"], a.model.tables["tcp_events"]
        span = int(n["end_ns"].max() - n["timestamp_ns"].min()) + 1
        opspan = int(n["op_count"].max()) + 1
        reps = 200
        big_n = pd.concat([n.assign(timestamp_ns=n["timestamp_ns"] + k * span, end_ns=n["end_ns"] + k * span,
                                    op_count=n["op_count"] + k * opspan) for k in range(reps)], ignore_index=True)
        big_t = pd.concat([t.assign(timestamp_ns=t["timestamp_ns"] + k * span) for k in range(reps)],
                          ignore_index=True)
        a.model.tables["nccl_events"], a.model.tables["tcp_events"] = big_n, big_t
        fig = figures.timeline(a, a.options.slow_ms)
        drawn = sum(len(tr["customdata"]) for tr in fig.spec["data"] if "customdata" in tr)
        assert drawn <= figures.MAX_INTERVALS and any("drawn" in note for note in fig.notes)
        slow = int((big_n["duration_ns"] >= a.options.slow_ms * 1e6).sum())
        assert drawn >= min(slow, figures.MAX_INTERVALS // 2)
        markers = sum(len(tr["x"]) for tr in fig.spec["data"] if tr.get("hoverinfo") == "text")
        assert markers <= figures.MAX_MARKERS
        heat = figures.heatmap(a)
        assert len(heat.spec["data"][0]["x"]) <= figures.MAX_HEATMAP_COLUMNS
        size = len(html_report.render(a).encode())
        assert size <= MAX_REPORT_BYTES, size
        assert np.isfinite(size)
    finally:
        a.close()


@pytest.mark.parametrize("s", ["# heading?", "1. not a list", "- nor this", "a | b", "<b>bold</b> & co",
                               "[x](javascript:alert(1))", "`code`", "*em* _em_ ~~del~~", "rank_2 on node-3"])
def test_markdown_text_renders_back_to_itself(s):
    markdown_it = pytest.importorskip("markdown_it")
    import html as htmllib
    out = markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md_report.para(s))
    assert out.startswith("<p>") and htmllib.unescape(out.strip()[3:-4]) == s


def test_optional_sections_render_when_their_tables_have_rows(tmp_path):
    """A bundle with IB counters, nccl-tests output, py-spy dumps and a Flight Recorder dump
    (real samples): each section appears exactly when its table has rows."""
    from synthetic_bundle import PARSERS, lab_bundle, lab_pids
    pid0 = lab_pids("clean")[0]
    root = lab_bundle(tmp_path / "in", "clean", extra={
        "ib": PARSERS / "ib_counters" / "tree_bundle" / "ib",
        "nccl-tests/output.txt": PARSERS / "nccl_tests" / "nccl_tests_output_mixed.txt",
        f"stacks/py-spy-{pid0}-end.txt": PARSERS / "pyspy" / "pyspy_dump_rank0.txt",
        "flight-recorder/nccl_trace_rank_0": PARSERS / "flight_recorder" / "nccl_trace_rank_0",
    })
    r = analyze([root], tmp_path / "out")
    assert r.rc in (0, 1), r.stderr
    html = r.path("report.html").read_text()
    a = run_analysis([root])
    try:
        tables = a.model.tables
        sections = {"ib_counters": 'id="table-ib"', "nccl_tests": 'id="plot-nccltests"',
                    "stacks": 'id="table-stacks"', "fr_entries": 'id="table-fr_entries"',
                    "nccl_config": 'id="table-nccl_config"', "offcpu": 'id="table-offcpu"'}
        for name, marker in sections.items():
            df = tables.get(name)
            assert (marker in html) == (df is not None and len(df) > 0), name
        for name in ("ib_counters", "nccl_tests", "stacks", "nccl_config"):   # these samples do parse
            assert len(tables[name]) > 0, name
        # a stack reads innermost first, one block per thread
        assert "synchronize (torch/cuda/__init__.py:" in html
    finally:
        a.close()
    copy_report(r.path("report.html"), "report-artifacts.html")


def test_several_bundles_at_once(tmp_path):
    """Two hosts' bundles (here two lab runs, both named 'vm': kept apart as vm#1, vm#2):
    one report, one Perfetto process per host, plotly inlined once."""
    pair = [s for s in ("loss", "clean") if s in SCENARIOS] or SCENARIOS[:2]
    if len(pair) < 2:
        pytest.skip("needs two shipped bundles")
    r = analyze([bundle(s) for s in pair], tmp_path)
    assert r.rc in (0, 1), r.stderr
    trace = json.loads(r.path("trace.json").read_text())
    assert validate_trace(trace) == []
    procs = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert len(procs) == 2 and len(set(procs)) == 2
    html = r.path("report.html").read_text()
    for host in procs:
        assert f"<h3>{host}</h3>" in html          # a capture section per host
    assert html.count("<script nonce=") == 2        # plotly.js once, then the figures' loader
    assert html.count("Plotly.newPlot") == 1


def test_rank_table_and_timeline_use_global_ranks_with_sub_communicators():
    """A sub-communicator of global ranks 3 and 1 (comm ranks 0 and 1): its calls belong to
    processes 3 and 1, not to world ranks 0 and 1; TCP markers (global rank of the owning
    process) land on the lane of the process that made the calls."""
    from types import SimpleNamespace

    from forensics.report import data, figures
    from traced_job import MS, T0, context, subcomm_job, tcp
    rows = subcomm_job(members=(3, 1), skip_at=99, n_ops=6, world_ops=5)
    ctx = context(rows, [tcp(T0 + 700 * MS, 3, 1)], ended_ns=T0 + 2000 * MS)
    analysis = SimpleNamespace(model=ctx.model, findings=[])
    t = data.rank_table(analysis).set_index("rank")
    assert sorted(t.index) == [0, 1, 2, 3]
    # world ops (5 each) + the sub-communicator's 6 on ranks 3 and 1
    assert t["calls"].to_dict() == {0: 5, 1: 11, 2: 5, 3: 11}
    assert t.loc[3, "host"] == "node3" and t.loc[3, "pid"] == "103" and t.loc[0, "pid"] == "100"
    assert t.loc[3, "retx_kernel"] == 1 and t.loc[0, "retx_kernel"] == 0
    iv = data.intervals(analysis)
    per_pid = iv.groupby("pid")["rank"].unique().map(list).to_dict()
    assert per_pid == {100: [0], 101: [1], 102: [2], 103: [3]}
    sub = iv[iv["comm_id_hash"] == "0xbeef"]
    assert sorted(set(zip(sub["pid"], sub["comm_rank"]))) == [(101, 1), (103, 0)]
    # the timeline draws the sub-communicator's calls on the rows of ranks 1 and 3, where rank 3's
    # TCP marker is too
    fig = figures.timeline(analysis, slow_ms=50.0)
    rows_of = {int(c[3]) for tr in fig.spec["data"] if tr.get("hovertemplate", "").startswith("<b>ALL_GATHER")
               for c in tr["customdata"]}
    assert rows_of == {1, 3}
    ticks = dict(zip(fig.spec["layout"]["yaxis"]["tickvals"], fig.spec["layout"]["yaxis"]["ticktext"]))
    marker = next(tr for tr in fig.spec["data"] if tr.get("name") == "retransmission")
    assert ticks[round(marker["y"][0] + 0.42)].startswith("rank 3")


def test_progress_names_global_ranks_and_survives_an_unknown_nranks():
    from types import SimpleNamespace

    from forensics.report import data
    from traced_job import MS, T0, context, subcomm_job
    rows = subcomm_job(members=(3, 1), skip_at=3, n_ops=6, world_ops=5)
    p = {x.comm_id_hash: x for x in data.progress(context(rows, ended_ns=T0 + 3000 * MS).model)}["0xbeef"]
    # global rank 1 (comm rank 1) skipped #3; global rank 3 (comm rank 0) waits in it
    assert p.stuck_op_count == 3 and p.missing_ranks == [1] and p.waiting_ranks == [3]
    assert p.per_rank[["rank", "comm_rank"]].values.tolist() == [[1, 1], [3, 0]]
    # nranks unknown (NULL after the loader rejected it): no missing ranks list, no crash
    rows = [{**r, "nranks": None} for r in rows]
    ctx = context(rows, ended_ns=T0 + 3000 * MS)
    assert {x.comm_id_hash for x in data.progress(ctx.model)} == {"0xc0ffee", "0xbeef"}
    t = data.rank_table(SimpleNamespace(model=ctx.model, findings=[])).set_index("rank")
    assert t["calls"].to_dict() == {0: 5, 1: 8, 2: 5, 3: 11}   # sizes from the ranks seen; rank 1 skipped 3


def test_the_report_marks_the_hang_point_the_detector_names():
    """One hang point (forensics.model.progress): rank 3's tracer began at op 10, so ops 0-9
    lack it, and rank 1 never entered #30 where the others wait. The first collective a rank
    is absent from (#0) is no hang point; the report's is the detector's, #30, rank 1 behind."""
    from forensics.findings.hang import hang_mismatch
    from forensics.report import data
    from traced_job import MS, T0, context, job
    rows = job(n_ops=31, completed=lambda k, r: k < 30,
               entered=lambda k, r: not (r == 3 and k < 10) and not (r == 1 and k >= 30))
    ctx = context(rows, ended_ns=T0 + 6000 * MS)
    (f,) = hang_mismatch(ctx)
    (p,) = data.progress(ctx.model)
    assert (f.op_count, f.ranks) == (30, [1])
    assert (p.stuck_op_count, p.missing_ranks, p.waiting_ranks) == (30, [1], [0, 2, 3])
    # no hang (every op completed): no hang point, though ops 0-9 still lack rank 3
    ctx = context(job(n_ops=30, entered=lambda k, r: not (r == 3 and k < 10)), ended_ns=T0 + 6000 * MS)
    assert [x.stuck_op_count for x in data.progress(ctx.model)] == [None]


def test_plot_json_writes_nan_and_infinities_as_null_and_leaves_the_rest_as_dumped():
    import numpy as np
    from forensics.report.html import _json_script, _plot_json
    clean = {"data": [{"x": [0.5, 1.0], "y": [1, 2], "name": "a</script>"}]}
    assert _plot_json(clean) == _json_script(clean)
    odd = {"data": [{"x": [float("nan"), 1.0, float("inf")], "y": (np.float64("-inf"), 2)}]}
    assert json.loads(_plot_json(odd)) == {"data": [{"x": [None, 1.0, None], "y": [None, 2]}]}


def test_every_tcp_marker_has_its_hover_text_a_missing_number_written_as_a_dash():
    # the reset bundle's first resets come before any collective, on the store's connection:
    # no collective, no op count; their text must still be whole (it was null, or "<NA>")
    from forensics.report import figures
    a = run_analysis([bundle("reset")])
    try:
        fig = figures.timeline(a, a.options.slow_ms)
    finally:
        a.close()
    texts = [t for tr in fig.spec["data"] if "hovertext" in tr for t in tr["hovertext"]]
    assert texts and all(isinstance(t, str) and "NA" not in t and "nan" not in t for t in texts)
    assert any(t.endswith(" · - #- done") for t in texts)          # outside any collective
    assert any(" · ALL_REDUCE #" in t for t in texts)


def test_a_failed_detector_never_leaves_a_green_screen(monkeypatch):
    """A clean capture whose network detector broke: the verdict says the analysis is
    incomplete, the first screen is not green, and the same run without the fault is."""
    from forensics.findings import base

    def broken(ctx):
        raise RuntimeError("broken on purpose")

    clean = run_analysis([bundle("clean" if "clean" in SCENARIOS else SCENARIOS[0])])
    try:
        assert clean.verdict().startswith("No problem found") and 'class="verdict ok"' in html_report.render(clean)
    finally:
        clean.close()
    monkeypatch.setitem(base._DETECTORS, "network_loss", broken)
    a = run_analysis([bundle("clean" if "clean" in SCENARIOS else SCENARIOS[0])])
    try:
        assert a.verdict().startswith("No finding, but 1 detector(s) failed"), a.verdict()
        assert "network_loss" in a.verdict() and len(a.verdict()) <= 200
        page = html_report.render(a)
        assert 'class="verdict warning"' in page and 'class="verdict ok"' not in page
    finally:
        a.close()


def test_evidence_table_shows_a_hostless_file_as_the_first_screen_does(tmp_path):
    """A log file whose lines name no host is keyed ``unknown:<path>`` inside; the evidence
    table (and a table's host column) says what the first screen says (model/logs.py host_text): "host unknown (<file>)",
    never the key or the file's path; other cells keep their text."""
    from forensics.model.logs import UNKNOWN, host_text
    key = UNKNOWN + "/home/user/jobs/slurm-1234.out"
    t = html_report.records_table("evidence-0", "evidence", [
        {"host": key, "rank": 3, "line": "Last error: from unknown:/home/user/jobs/slurm-1234.out:17"},
        {"host": "gpu-node02", "rank": 1, "line": "unknownfoo: kept"}], 25)
    assert t.rows[0][0] == host_text(key) == "host unknown (slurm-1234.out)"
    assert "/home/user" not in " ".join(t.rows[0]) and t.rows[1][0] == "gpu-node02"
    assert t.rows[1][2] == "unknownfoo: kept"
    log = tmp_path / "slurm-1234.out"
    log.write_text("[rank3]:[E1112 10:21:07.284617000 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
                   "operation timeout: WorkNCCL(SeqNum=2741, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                   "Timeout(ms)=600000) ran for 600070 milliseconds before timing out.\n")
    page = html_report.render(run_analysis([str(log)]), with_plotly=False)
    table = page.split('id="table-evidence-0"', 1)[1].split("</table>", 1)[0]
    assert "<td>host unknown (slurm-1234.out)</td>" in table and "unknown:" not in table
    watchdog = page.split('id="table-watchdog_events"', 1)[1].split("</table>", 1)[0]
    assert "<td>host unknown (slurm-1234.out)</td>" in watchdog and "unknown:" not in watchdog


def test_where_of_a_finding_without_rank_or_host_comes_from_its_evidence(tmp_path):
    """An init failure read from a file that prints no host names no rank and no host; the first
    screen's *Where* still says where: the file (never its path) and the address it failed on."""
    from forensics.report.sections.verdict import first_screen
    log = tmp_path / "slurm-77.out"
    log.write_text("[E socket.cpp:793] [c10d] The client socket has timed out after 60s while trying to connect "
                   "to (10.1.2.3, 29500).\n")
    a = run_analysis([str(log)])
    try:
        top = next(f for f in a.findings if f.severity == "error")
        assert not top.ranks and not top.hosts, top
        where = {fl.label: fl.text for fl in first_screen(a, top)}["Where"]
        assert where == "host unknown (slurm-77.out); address 10.1.2.3:29500", where
        assert str(tmp_path) not in html_report.render(a, with_plotly=False).split('id="first-screen"', 1)[1][:2000]
    finally:
        a.close()
