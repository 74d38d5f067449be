"""The HTML report in a real browser: headless Debian chromium driven by Playwright, every
request that is not the report's own file blocked and recorded. For each lab scenario:
no console error, no request leaves the file, every plot drawn, the verdict on the first
screen; hostile strings from a bundle never run; without JavaScript the verdict and tables
still read. Screenshots land in build/test-artifacts/."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pytest

from conftest import FIXTURES
from tests.report_helpers import ARTIFACTS, PAYLOAD, SCENARIOS, analyze, bundle, hostile_bundle

pytestmark = pytest.mark.skipif(not SCENARIOS, reason="no shipped bundles")
VIEWPORT = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    base = tmp_path_factory.mktemp("browser")
    out = {}
    for s in SCENARIOS:
        r = analyze([bundle(s)], base / s, "--json", str(base / s / "findings.json"), all_outputs=False)
        assert r.rc in (0, 1), r.stderr
        out[s] = r
    return out


@dataclass
class Visit:
    page: object
    requests: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


def open_report(browser, path, *, javascript: bool = True) -> Visit:
    ctx = browser.new_context(viewport=VIEWPORT, java_script_enabled=javascript)
    page = ctx.new_page()
    v = Visit(page)

    def route(r):
        url = r.request.url
        v.requests.append(url)
        if url.startswith("file://") and url.split("#")[0] == path.as_uri():
            r.continue_()
        else:
            v.blocked.append(url)
            r.abort()
    page.route("**/*", route)
    page.on("console", lambda m: m.type == "error" and v.console_errors.append(m.text))
    page.on("pageerror", lambda e: v.console_errors.append(f"pageerror: {e}"))
    page.on("dialog", lambda d: (v.dialogs.append(d.message), d.dismiss()))
    page.goto(path.as_uri(), wait_until="load")
    return v


def plots_drawn(page) -> list[dict]:
    return page.evaluate("""() => [...document.querySelectorAll('[data-plot]')].map(el => ({
        key: el.dataset.plot,
        plotly: el.classList.contains('js-plotly-plot'),
        svgs: el.querySelectorAll('svg.main-svg').length,
        traces: el.querySelectorAll('.scatterlayer .trace, .heatmaplayer .hm, .heatmaplayer image').length,
        width: el.getBoundingClientRect().width,
    }))""")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_report_in_chromium(browser, reports, scenario):
    r = reports[scenario]
    path = r.path("report.html")
    verdict = json.loads(r.path("findings.json").read_text())["verdict"]
    v = open_report(browser, path)
    page = v.page
    page.wait_for_function("document.querySelectorAll('[data-plot]').length === "
                           "document.querySelectorAll('[data-plot].js-plotly-plot').length", timeout=20000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"report-{scenario}.png"))
    assert v.console_errors == []
    assert v.blocked == [] and set(v.requests) == {path.as_uri()}
    plots = plots_drawn(page)
    assert {p["key"] for p in plots} >= {"timeline", "heatmap"}
    for p in plots:
        assert p["plotly"] and p["svgs"] >= 1 and p["traces"] >= 1 and p["width"] > 300, p
    el = page.locator("#verdict-text")
    assert el.inner_text().strip() == verdict
    box = el.bounding_box()
    assert box and box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"]
    assert page.evaluate("window.__pwned") is None
    page.context.close()


def test_hostile_bundle_runs_no_script(browser, tmp_path):
    scenario = "loss" if "loss" in SCENARIOS else SCENARIOS[0]
    root = hostile_bundle(bundle(scenario), tmp_path / "in")
    r = analyze([root], tmp_path / "out", all_outputs=False)
    assert r.rc in (0, 1), r.stderr
    path = r.path("report.html")
    v = open_report(browser, path)
    page = v.page
    page.wait_for_function("document.querySelectorAll('[data-plot].js-plotly-plot').length >= 1", timeout=20000)
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / "report-hostile.png"), full_page=True)
    assert page.evaluate("window.__pwned") is None
    assert v.dialogs == [] and v.blocked == [] and v.console_errors == []
    text = page.inner_text("body")
    assert f"node{PAYLOAD}" in text                       # the host name shown as text
    assert f"train{PAYLOAD}" in text                      # a process name
    # plot labels (lane names carry the host) are text too
    ticks = page.evaluate("() => [...document.querySelectorAll('#plot-timeline .ytick text')].map(t => t.textContent)")
    assert any("@ node<script" in t for t in ticks), ticks              # the capture node, shortened, as text
    assert not any("&lt;" in t or "&quot;" in t for t in ticks), ticks  # no entity shown undecoded
    assert page.locator("#plot-timeline img, #plot-timeline script").count() == 0
    page.context.close()


def test_readable_without_javascript(browser, reports):
    scenario = "loss" if "loss" in SCENARIOS else SCENARIOS[0]
    r = reports[scenario]
    path = r.path("report.html")
    verdict = json.loads(r.path("findings.json").read_text())["verdict"]
    v = open_report(browser, path, javascript=False)
    page = v.page
    assert page.locator("#verdict-text").inner_text().strip() == verdict
    assert page.locator("#verdict-text").is_visible()
    assert page.locator("#table-ranks").is_visible()
    assert page.locator("#table-ranks tbody tr").count() >= 2
    assert page.locator("#plot-timeline noscript, #plot-timeline p").count() >= 1
    assert page.locator(".js-plotly-plot").count() == 0
    page.screenshot(path=str(ARTIFACTS / f"report-{scenario}-nojs.png"))
    page.context.close()


def test_timeline_hover_shows_the_evidence(browser, reports):
    """Hovering a collective shows its op count, duration and source; hovering a TCP marker
    shows the flow, the ranks and the collective in flight."""
    scenario = next((s for s in ("loss", "link-down-hang", "reset") if s in SCENARIOS), None)
    if scenario is None:
        pytest.skip("no scenario with TCP events")
    v = open_report(browser, reports[scenario].path("report.html"))
    page = v.page
    page.wait_for_function("document.querySelector('#plot-timeline.js-plotly-plot') !== null", timeout=20000)

    def hover(kind: str) -> str:
        return page.evaluate("""(kind) => {
            const el = document.getElementById('plot-timeline');
            const i = el.data.findIndex(t => kind === 'call' ? !!t.customdata : t.hoverinfo === 'text');
            if (i < 0) return '';
            Plotly.Fx.unhover(el);
            Plotly.Fx.hover(el, [{curveNumber: i, pointNumber: 0}]);
            return el.querySelector('.hoverlayer').textContent;
        }""", kind)
    call = hover("call")
    assert re.search(r"#\d+ on rank \d+", call) and " ms: " in call and "bytes" in call, call
    tcp = hover("tcp")
    assert re.search(r"\d+\.\d+\.\d+\.\d+:\d+ → \d+\.\d+\.\d+\.\d+:\d+", tcp) and "rank" in tcp, tcp
    assert v.console_errors == []
    page.context.close()


def test_artifact_sections_in_chromium(browser, tmp_path):
    """IB counters, nccl-tests (its bandwidth chart drawn), stacks and Flight Recorder
    entries from real samples: drawn without a console error or a request."""
    from synthetic_bundle import PARSERS, lab_bundle, lab_pids
    pid0 = lab_pids("clean")[0]
    root = lab_bundle(tmp_path / "in", "clean", extra={
        "ib": PARSERS / "ib_counters" / "tree_bundle" / "ib",
        "nccl-tests/output.txt": PARSERS / "nccl_tests" / "nccl_tests_output_mixed.txt",
        f"stacks/py-spy-{pid0}-end.txt": PARSERS / "pyspy" / "pyspy_dump_rank0.txt",
    })
    r = analyze([root], tmp_path / "out", all_outputs=False)
    assert r.rc in (0, 1), r.stderr
    v = open_report(browser, r.path("report.html"))
    page = v.page
    page.wait_for_function("document.querySelectorAll('[data-plot]').length === "
                           "document.querySelectorAll('[data-plot].js-plotly-plot').length", timeout=20000)
    plots = {p["key"]: p for p in plots_drawn(page)}
    assert "nccltests" in plots and plots["nccltests"]["traces"] >= 1
    assert page.locator("#table-ib tbody tr").count() >= 1
    assert page.locator("#table-stacks pre").count() >= 1
    page.locator("#nccl").screenshot(path=str(ARTIFACTS / "report-artifacts-nccl.png"))
    assert v.console_errors == [] and v.blocked == []
    page.context.close()


# ---- issue 36: the first screen an on-call engineer reads, at a desk and on a phone ------------
PER_HOST = FIXTURES / "bundles-per-host"
FIRST_SCREENS = {   # case -> (bundles, whether a serious finding leads)
    "late-hang": (lambda: sorted((PER_HOST / "mismatch-hang-late").glob("*.tar.gz")), True),
    "per-host-clean": (lambda: sorted((PER_HOST / "clean").glob("*.tar.gz")), False),
    "loss": (lambda: [bundle("loss")], True),
}
SIZES = {"desk": {"width": 1400, "height": 900}, "phone": {"width": 390, "height": 844}}


@pytest.fixture(scope="module")
def first_screens(tmp_path_factory):
    base = tmp_path_factory.mktemp("first-screen")
    out = {}
    for case, (bundles, _) in FIRST_SCREENS.items():
        paths = bundles()
        if not paths:
            continue
        r = analyze(paths, base / case, "--json", str(base / case / "findings.json"), all_outputs=False)
        assert r.rc in (0, 1), r.stderr
        out[case] = r
    return out


def _in_view(page, selector: str, height: int) -> dict | None:
    return page.evaluate("""([sel, h]) => { const el = document.querySelector(sel); if (!el) return null;
        const b = el.getBoundingClientRect();
        return {top: b.top, bottom: b.bottom, text: el.innerText, inside: b.top >= 0 && b.bottom <= h}; }""",
                         [selector, height])


def _first_screen(browser, r, doc: dict, vp: dict, shot: str):
    """(context, page, the headline's box) of the report ``r`` opened at the viewport ``vp``
    and its screenshot saved as ``shot``; checked on the way: nothing overflows sideways (the
    page is never wider than the screen), and the headline is in view, the document's verdict,
    at most 200 characters."""
    ctx = browser.new_context(viewport=vp)
    page = ctx.new_page()
    page.goto(r.path("report.html").as_uri(), wait_until="load")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / shot))
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), \
        page.evaluate("document.documentElement.scrollWidth")
    head = _in_view(page, "#verdict-text", vp["height"])
    assert head and head["inside"] and head["text"].strip() == doc["verdict"]
    assert len(doc["verdict"]) <= 200
    return ctx, page, head


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("case", sorted(FIRST_SCREENS))
def test_first_screen_says_who_where_since_and_next(browser, first_screens, case, size):
    if case not in first_screens:
        pytest.skip(f"no shipped bundles for {case}")
    r = first_screens[case]
    doc = json.loads(r.path("findings.json").read_text())
    vp = SIZES[size]
    ctx, page, head = _first_screen(browser, r, doc, vp, f"first-screen-{case}-{size}.png")
    serious = [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
    if not FIRST_SCREENS[case][1]:
        assert not serious and _in_view(page, "#first-screen", vp["height"]) is None
        assert page.evaluate("document.querySelector('#verdict').className").endswith(" ok")
        ctx.close()
        return
    top = serious[0]
    # the headline at most two lines at a desk (its line height is about 26 px)
    if size == "desk":
        assert head["bottom"] - head["top"] <= 2 * 30, head
    for name in ("where", "since", "next"):
        f = _in_view(page, f"#first-screen .field-{name}", vp["height"])
        assert f is not None, name
        # a desk sees each field whole; a phone at least sees each one begin (a long Next may wrap past)
        assert f["inside"] if size == "desk" else 0 <= f["top"] < vp["height"], (name, f)
    where = _in_view(page, "#first-screen .field-where", vp["height"])
    assert where["inside"] and top["hosts"] and top["hosts"][0] in where["text"], (where, top["hosts"])
    assert top["hosts"][0] in head["text"]
    since = _in_view(page, "#first-screen .field-since", vp["height"])
    assert ("UTC" in since["text"]) == (top["since_ns"] is not None), since
    ctx.close()


# ---- issue 42: the first screen of logs alone (the real-world corpus, loose) ---------------------
CORPUS = FIXTURES / "realworld"
# a dozen public excerpts, one or two per class, damaged as pasted; the last two healthy
CORPUS_SCREENS = ("001-llamafactory-numbered-allreduce", "009-sglang3836-two-h100-allreduce",
                  "027-torchtune2651-wrapped-dump-signal", "043-ib-error4-vendor81-prose-glued",
                  "059-cloudwatch-ofi-couldnt-open-cq", "083-knet-slurm-oom-step-cancelled",
                  "099-torchrun-elastic-launch-config-connect-timeout", "123-ras-2273-incomplete-outlier-node",
                  "139-ibstat-ibwarn-debug-mlx4-port1-disabled", "155-ncclras-2307-straggler-single-rank-mismatch",
                  "163-returnn1486-zsh-prompt-nvidia-smi-unknown-error-aer",
                  "175-nccl1928-rank-prefixed-ofi-undeliverable-2288",
                  "035-nccltests293-a100pcie-ib-sharp-init", "131-nccltests-mpirun-2node-header-info-2215")


@pytest.fixture(scope="module")
def corpus_screens(tmp_path_factory):
    base = tmp_path_factory.mktemp("corpus-screen")
    out = {}
    for case in CORPUS_SCREENS:
        r = analyze([CORPUS / case], base / case, "--json", str(base / case / "findings.json"), all_outputs=False)
        assert r.rc in (0, 1), r.stderr
        out[case] = r
    return out


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("case", CORPUS_SCREENS)
def test_first_screen_of_logs_alone(browser, corpus_screens, case, size):
    """Logs alone, at a desk and on a phone: the verdict in view and at most 200 characters; for
    a failure the Where, Since and Next fields begin on the first screen, Where names the
    culprit the excerpt establishes (its ``expect.json``), and no field shows a file path for a
    host or an empty host list; a healthy log shows no failure."""
    r = corpus_screens[case]
    doc = json.loads(r.path("findings.json").read_text())
    expect = json.loads((CORPUS / case / "expect.json").read_text())
    vp = SIZES[size]
    ctx, page, head = _first_screen(browser, r, doc, vp, f"first-screen-corpus-{case[:3]}-{size}.png")
    screen = _in_view(page, "#first-screen", vp["height"])
    if not expect.get("serious"):
        assert screen is None and page.evaluate("document.querySelector('#verdict').className").endswith(" ok")
        ctx.close()
        return
    assert screen is not None and 0 <= screen["top"] < vp["height"], screen
    for name in ("where", "since", "next"):
        f = _in_view(page, f"#first-screen .field-{name}", vp["height"])
        assert f is not None and 0 <= f["top"] < vp["height"], (name, f)
    text = screen["text"] + "\n" + head["text"]
    assert str(CORPUS) not in text and "unknown:/" not in text and "0 hosts" not in text, text
    where = _in_view(page, "#first-screen .field-where", vp["height"])["text"]
    culprit = expect.get("culprit") or {}
    for host in culprit.get("hosts", []):
        assert host in where, (host, where)
    for rank in culprit.get("ranks", []):
        assert re.search(rf"\b{rank}\b", where), (rank, where)
    ctx.close()
