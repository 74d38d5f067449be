"""The report of a large job (issue 14): a 256-rank job on 16 hosts, synthesised from the lab's
loss bundle by bench/analyze.py's generator, keeps the first screen and stays small and
readable: the heatmap has every rank by time in bounded columns, the timeline only the
outliers' lanes, tables their most telling rows with a totals row and a "… and N more" line,
the TCP links a rank x rank matrix; a hang scaled to 64 ranks marks the ranks that never
entered; the 5-rank loss report stays under 1.5 MB and as it was. In chromium (when Debian's
chromium and Playwright are there): the verdict on the first screen, the heatmap drawn, no
console error."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from markupsafe import escape

from conftest import ROOT
from forensics.analysis import analyze as run_analysis
from forensics.execution import Execution
from forensics.report import data, figures
from forensics.report import html as html_report
from tests.report_helpers import ARTIFACTS, SCENARIOS, bundle, copy_report

pytestmark = pytest.mark.skipif("loss" not in SCENARIOS, reason="no shipped loss bundle")
RANKS, HOSTS = 256, 16
MAX_REPORT_BYTES = 6 * 1024 * 1024
VIEWPORT = {"width": 1280, "height": 800}


def scaled(src: Path, out: Path, ranks: int, hosts: int) -> list[Path]:
    """bench/analyze.py's build(): ``src`` grown to ``ranks`` ranks on ``hosts`` host bundles
    (a small capture each, one packet stream readdressed per host: seconds, not minutes)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import analyze as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    out.mkdir(parents=True, exist_ok=True)
    return bench.build(src, out, ranks=ranks, packets=1000, hosts=hosts, same_packets=True)


class Report:
    def __init__(self, analysis, path: Path):
        self.a = analysis
        self.path = path
        self.html = path.read_text()
        self.ranks = data.rank_table(analysis)

    def section(self, name: str) -> str:
        return self.html.split(f'<section id="{name}"', 1)[1].split("</section>", 1)[0]

    def table(self, key: str) -> tuple[list[str], list[str], str]:
        """(body rows, footer cells, the note after the table) of ``id="table-KEY"``."""
        m = re.search(rf'<table id="table-{key}">(.*?)</table></div>\s*(?:<p class="note">(.*?)</p>)?',
                      self.html, re.S)
        assert m, key
        body = re.search(r"<tbody>(.*?)</tbody>", m.group(1), re.S).group(1)
        foot = re.search(r"<tfoot>(.*?)</tfoot>", m.group(1), re.S)
        cells = re.findall(r"<td[^>]*>(.*?)</td>", foot.group(1), re.S) if foot else []
        return re.findall(r"<tr[^>]*>.*?</tr>", body, re.S), cells, m.group(2) or ""


def _render(analysis, path: Path) -> Report:
    path.write_text(html_report.render(analysis))
    return Report(analysis, path)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    base = tmp_path_factory.mktemp("scale")
    a = run_analysis(scaled(bundle("loss"), base / "bundles", RANKS, HOSTS), execution=Execution(jobs=2))
    try:
        yield _render(a, base / "report.html")
    finally:
        a.close()


def _serious(a) -> list:
    return [f for f in a.findings if f.severity in ("error", "warning")]


# ---- size and the first screen -----------------------------------------------------------------

def test_a_256_rank_report_is_under_6_mb_with_the_first_screen_unchanged(big):
    size = big.path.stat().st_size
    assert size < MAX_REPORT_BYTES, size
    assert big.ranks["rank"].nunique() == RANKS
    copy_report(big.path, "report-256-ranks.html")
    banner = big.section("verdict")
    top = _serious(big.a)[0]
    assert f'class="verdict {top.severity}"' in big.html
    assert re.search(r'id="verdict-text">(.*?)</p>', banner, re.S).group(1) == escape(big.a.verdict())
    assert f"confidence {100 * top.confidence:.0f}%" in banner and "<dt>Next</dt>" in banner
    # before any plot or table, and the header names a few hosts, not all 16
    assert big.html.index('id="verdict"') < big.html.index('id="plots"') < big.html.index('id="ranks"')
    header = re.search(r'<header class="top">(.*?)</header>', big.html, re.S).group(1)
    assert f"{HOSTS} hosts" in header and f"and {HOSTS - html_report.MAX_HOST_DETAILS} more" in header
    # the figures' data: strict JSON, and no plot of thousands of points per rank
    for key, block in re.findall(r'<script type="application/json" id="plot-data-(\w+)">(.*?)</script>',
                                 big.html, re.S):
        spec = json.loads(block)
        assert {t.get("type", "scatter") for t in spec["data"]} <= set(html_report.PLOTLY_TRACES), key
        assert len(block) < 1_000_000, (key, len(block))


# ---- the heatmap: every rank, by time, bounded ---------------------------------------------------

def test_the_heatmap_has_every_rank_by_time_in_bounded_columns(big):
    fig = figures.heatmap(big.a, ranks=big.ranks)
    assert fig.key == "heatmap" and fig.title == "Lateness by rank and time"
    heats = [t for t in fig.spec["data"] if t["type"] == "heatmap"]
    assert [t["name"] for t in heats] == ["entered late", "finished late", "duration"]
    every = [f"rank {r}" for r in sorted(big.ranks["rank"])]
    for t in heats:
        assert t["y"] == every                          # every rank on y, in order
        cols = {len(row) for row in t["z"]}
        assert len(cols) == 1 and cols.pop() <= figures.MAX_HEATMAP_COLUMNS
        assert len(t["z"]) * len(t["z"][0]) <= figures.MAX_HEATMAP_CELLS
    # the x axis is the timeline's: seconds since the capture began, bins of dx seconds
    span = data.time_span(big.a)
    assert heats[0]["x0"] == pytest.approx(heats[0]["dx"] / 2)
    assert len(heats[0]["z"][0]) * heats[0]["dx"] >= (span.end_ns - span.start_ns) / 1e9
    # each rank's worst "entered late" cell is its worst lateness over every collective (the
    # model's own list, read back with SQL), to the 3 significant digits drawn
    worst = dict(big.a.con.execute(
        "SELECT r, max(l) / 1e6 FROM (SELECT unnest(ranks) AS r, unnest(lateness_ns) AS l FROM collectives) "
        "GROUP BY r").fetchall())
    z = np.array([[np.nan if v is None else v for v in row] for row in heats[0]["z"]], dtype=float)
    drawn = dict(zip(sorted(big.ranks["rank"]), np.nanmax(z, axis=1)))
    assert worst and set(worst) <= set(drawn)
    for r, ms in worst.items():
        assert drawn[r] == pytest.approx(ms, rel=0.01, abs=0.01), r


# ---- the timeline: the outliers' lanes only ------------------------------------------------------

def test_the_timeline_draws_only_the_outlier_lanes_and_says_so(big):
    fig = figures.timeline(big.a, big.a.options.slow_ms, ranks=big.ranks)
    ticks = fig.spec["layout"]["yaxis"]["ticktext"]
    lanes = [int(re.match(r"rank (\d+)", t).group(1)) for t in ticks]
    assert len(lanes) <= figures.MAX_BLAMED_LANES + figures.LATEST_LANES < RANKS
    blamed = {r for f in _serious(big.a) for r in f.ranks}
    # the blamed ranks' lanes (at most MAX_BLAMED_LANES of them: a fault on every 4th rank here)
    assert blamed and len(blamed & set(lanes)) == min(len(blamed), figures.MAX_BLAMED_LANES)
    # the others are the latest: no rank left out is later (lateness p99) than one drawn
    late = big.ranks.set_index("rank")["lateness_p99_ms"].fillna(0)
    others = [r for r in lanes if r not in blamed]
    assert len(others) == figures.LATEST_LANES
    assert late.drop(index=list(blamed | set(others))).max() <= late.loc[others].min()
    assert fig.title == f"Timeline: {len(lanes)} of {RANKS} ranks"
    assert any(f"{RANKS - len(lanes)} ranks are not drawn" in n and "heatmap" in n for n in fig.notes)
    # every call and TCP marker drawn sits on a drawn lane
    on = {int(c[3]) for t in fig.spec["data"] if "customdata" in t for c in t["customdata"]}
    assert on and on <= set(lanes)
    ys = [y for t in fig.spec["data"] if t.get("hoverinfo") == "text" and t["mode"] == "markers" for y in t["y"]]
    assert ys and all(-1 < y < len(lanes) for y in ys)


# ---- tables: the most telling rows, totals, "… and N more" -------------------------------------

def test_tables_show_their_top_rows_with_totals_and_a_more_line(big):
    top = html_report.TOP_ROWS
    rows, foot, note = big.table("ranks")
    assert len(rows) == top
    assert note.startswith(f"… and {RANKS - top} more ranks") and "stallscope query" in note
    # blamed ranks first and highlighted, then the latest
    blamed = sorted({r for f in _serious(big.a) for r in f.ranks})
    first = [int(re.search(r"<td[^>]*>(\d+)</td>", r).group(1)) for r in rows]
    k = min(len(blamed), top)          # more blamed ranks than rows: the rows are all blamed ones
    assert len(set(first[:k])) == k and set(first[:k]) <= set(blamed)
    assert all('class="hl"' in r for r in rows[:k]) and not any('class="hl"' in r for r in rows[k:])
    # the totals row: every rank together (calls summed, the percentiles over every call)
    cols = re.findall(r"<th>(.*?)</th>", big.html.split('id="table-ranks"', 1)[1].split("</thead>", 1)[0])
    total = dict(zip(cols, foot))
    n = big.a.model.tables["nccl_events"]
    assert total["rank"] == f"all {RANKS}" and int(total["calls"]) == len(n)
    assert float(total["max_ms"]) == pytest.approx(n["duration_ns"].max() / 1e6, abs=1e-3)
    assert int(total["retx_pcap"]) == int(big.ranks["retx_pcap"].sum())

    flows = big.a.model.tables["flows"]
    rows, foot, note = big.table("flows")
    assert len(flows) > top and len(rows) == top
    assert note.startswith(f"showing {top} of {len(flows)} flows")
    cols = re.findall(r"<th>(.*?)</th>", big.html.split('id="table-flows"', 1)[1].split("</thead>", 1)[0])
    retx = [int(re.findall(r"<td[^>]*>(.*?)</td>", r)[cols.index("retransmissions")]) for r in rows]
    assert retx == sorted(retx, reverse=True) and retx[0] == flows["retransmissions"].max()
    assert int(dict(zip(cols, foot))["retransmissions"]) == int(flows["retransmissions"].sum())

    for key, what in (("nccl_config", "processes"), ("offcpu", "threads")):
        rows, _, note = big.table(key)
        assert len(rows) == top and re.match(rf"… and \d+ more {what}", note), key
    # 16 hosts: a summary row each, the details of 8
    rows, _, _ = big.table("capture_hosts")
    assert len(rows) == HOSTS
    capture = big.section("capture")
    assert len(re.findall(r"<h3>bench\d+</h3>", capture)) == html_report.MAX_HOST_DETAILS
    assert f"the other {HOSTS - html_report.MAX_HOST_DETAILS} hosts" in capture


def test_the_markdown_summary_lists_the_top_ranks_too(big):
    from forensics.report import markdown as md_report
    md = md_report.render(big.a)
    per_rank = md.split("## Per rank", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in per_rank.splitlines() if line.startswith("| ") and not line.startswith("| rank")]
    assert len(rows) == md_report.MD_RANK_ROWS
    assert f"... and {RANKS - md_report.MD_RANK_ROWS} more ranks" in per_rank
    assert len(md.splitlines()) < 60                # a ticket, however large the job
    blamed = sorted({r for f in _serious(big.a) for r in f.ranks})
    k = min(len(blamed), md_report.MD_RANK_ROWS)
    first = {int(r.split("|")[1]) for r in rows[:k]}
    assert len(first) == k and first <= set(blamed)


# ---- links: a rank x rank matrix -----------------------------------------------------------------

def test_many_flows_add_a_link_matrix_of_every_rank_pair(big):
    fig = figures.link_matrix(big.a)
    assert fig.section == "network" and 'id="plot-links"' in big.section("network")
    retx, rtt = fig.spec["data"]
    assert retx["name"] == "retransmissions" and rtt["name"] == "ACK RTT p99 ms"
    assert len(retx["x"]) == len(retx["y"]) <= figures.MAX_LINK_AXIS
    flows = big.a.model.tables["flows"].dropna(subset=["rank", "peer_rank"])
    z = np.array([[np.nan if v is None else v for v in row] for row in retx["z"]], dtype=float)
    assert np.nansum(z) == flows["retransmissions"].sum()
    # a cell per link with flows (a row / column per rank, or per run of consecutive ranks beyond
    # MAX_LINK_AXIS ranks, as the labels and a note say), blank elsewhere
    spans = [_span(lab) for lab in retx["y"]]
    where = {r: i for i, (lo, hi) in enumerate(spans) for r in range(lo, hi + 1)}
    assert (len(spans) < flows[["rank", "peer_rank"]].stack().nunique()) == any("consecutive" in n for n in fig.notes)
    cells = {(where[a], where[b]) for a, b in zip(flows["rank"].astype(int), flows["peer_rank"].astype(int))}
    assert np.count_nonzero(~np.isnan(z)) == len(cells)
    assert all(not np.isnan(z[i, j]) for i, j in cells)


def _span(label: str) -> tuple[int, int]:
    """A matrix label: 'rank 7' -> (7, 7), 'ranks 4-5' -> (4, 5)."""
    lo, hi = re.fullmatch(r"ranks? (\d+)(?:-(\d+))?", label).groups()
    return int(lo), int(hi or lo)


# ---- a hang at scale -----------------------------------------------------------------------------

@pytest.mark.skipif("mismatch-hang" not in SCENARIOS, reason="no shipped mismatch-hang bundle")
def test_a_64_rank_hang_marks_the_ranks_that_never_entered(tmp_path):
    a = run_analysis(scaled(bundle("mismatch-hang"), tmp_path / "bundles", 64, 8), execution=Execution(jobs=2))
    try:
        r = _render(a, tmp_path / "report.html")
        hang = next(f for f in a.findings if f.kind == "hang_mismatch")
        missing = {int(x) for p in data.progress(a.model) for x in p.missing_ranks}
        assert missing and missing <= set(hang.ranks)
        fig = figures.heatmap(a, ranks=r.ranks)
        marks = [t for t in fig.spec["data"] if t["type"] == "scatter"]
        never = next(t for t in marks if t["name"].startswith("never entered"))
        assert {int(y.split()[1]) for y in never["y"]} == missing
        assert any("never entered" in n for n in fig.notes)
        # the progress table: the ranks that never entered the hang point first
        rows, _, note = r.table("progress-0")
        first = [int(re.search(r"<td[^>]*>(\d+)</td>", x).group(1)) for x in rows[:len(missing)]]
        assert set(first) == missing and len(rows) == html_report.TOP_ROWS
        assert note.startswith(f"… and {64 - html_report.TOP_ROWS} more ranks")
        assert r.path.stat().st_size < MAX_REPORT_BYTES
    finally:
        a.close()


# ---- small jobs stay as they were ----------------------------------------------------------------

def test_the_five_rank_loss_report_is_under_1_5_mb_and_unchanged(tmp_path):
    a = run_analysis([bundle("loss")])
    try:
        r = _render(a, tmp_path / "report.html")
        assert r.path.stat().st_size < 1.5e6
        nranks = len(r.ranks)
        assert nranks <= figures.MAX_LANES
        tl = figures.timeline(a, a.options.slow_ms, ranks=r.ranks)
        assert tl.title == "Timeline" and len(tl.spec["layout"]["yaxis"]["ticktext"]) == nranks
        heat = figures.heatmap(a, ranks=r.ranks)
        assert heat.title.startswith("Collective duration by op count")
        assert heat.spec["layout"]["xaxis"]["title"]["text"] == "op count"
        assert figures.link_matrix(a) is None and 'id="plot-links"' not in r.html
        assert "<tfoot>" not in r.html and "more ranks" not in r.html
        rows, _, note = r.table("ranks")
        assert len(rows) == nranks and note == ""
    finally:
        a.close()


# ---- in chromium -------------------------------------------------------------------------------

def _open(browser, path: Path, javascript: bool = True):
    ctx = browser.new_context(viewport=VIEWPORT, java_script_enabled=javascript)
    page = ctx.new_page()
    errors, blocked = [], []

    def route(r):
        if r.request.url.split("#")[0] == path.as_uri():
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()
    page.route("**/*", route)
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.goto(path.as_uri(), wait_until="load")
    return page, errors, blocked


def test_the_256_rank_report_in_chromium(browser, big):
    page, errors, blocked = _open(browser, big.path)
    page.wait_for_function("document.querySelectorAll('[data-plot]').length === "
                           "document.querySelectorAll('[data-plot].js-plotly-plot').length", timeout=60000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-256-ranks.png"))
    assert errors == [] and blocked == []
    el = page.locator("#verdict-text")
    assert el.inner_text().strip() == big.a.verdict()
    box = el.bounding_box()
    assert box and 0 <= box["y"] and box["y"] + box["height"] <= VIEWPORT["height"]
    heat = page.evaluate("""() => { const el = document.getElementById('plot-heatmap');
        return {cells: el.querySelectorAll('.heatmaplayer image, .heatmaplayer .hm').length,
                rows: el.data[0].y.length, width: el.getBoundingClientRect().width}; }""")
    assert heat["cells"] >= 1 and heat["rows"] == RANKS and heat["width"] > 300, heat
    lanes = page.evaluate("() => document.querySelectorAll('#plot-timeline .ytick text').length")
    assert 0 < lanes <= figures.MAX_BLAMED_LANES + figures.LATEST_LANES
    assert page.locator("#plot-links .heatmaplayer image, #plot-links .heatmaplayer .hm").count() >= 1
    page.locator("#plot-heatmap").screenshot(path=str(ARTIFACTS / "report-256-ranks-heatmap.png"))
    page.context.close()


def test_the_256_rank_report_reads_without_javascript(browser, big):
    page, errors, blocked = _open(browser, big.path, javascript=False)
    assert page.locator("#verdict-text").is_visible()
    assert page.locator("#table-ranks tbody tr").count() == html_report.TOP_ROWS
    assert page.locator("#table-ranks tfoot tr").is_visible()
    assert page.get_by_text(f"… and {RANKS - html_report.TOP_ROWS} more ranks").is_visible()
    assert page.locator(".js-plotly-plot").count() == 0 and blocked == []
    page.context.close()
