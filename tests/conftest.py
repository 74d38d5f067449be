"""Shared test helpers: where fixtures live, and skips that say exactly why."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"
# The test modules sit in folders that mirror the product's packages (tests/forensics/parsers/,
# tests/capture/, ..., docs/DESIGN.md "Tests"); the helpers they share (shipped.py, oracle.py,
# capture_helpers.py, fuzz/, craft/, ...) sit here, importable from every folder, after the
# repository root (the product's packages and ``tests.lab``).
for _path in (TESTS, ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def run_python(code: str, timeout: float) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in the repository root (a process of its own: its
    imports, its collector, its allocator); one that fails fails the test, with its stderr."""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr
    return p


LAB_TOOLS = ("gcc", "make", "ip", "unshare", "bridge", "ss", "nsenter", "tcpdump", "bpftrace", "nft", "tc")


def build_lab(tmp_path_factory, *targets: str) -> Path:
    """The lab (tests/lab: its libnccl, libcudart and rank driver, ``all`` and ``targets``) built
    into a fresh folder of the session, after the root and tool checks every lab run needs."""
    require_root()
    require_tool(*LAB_TOOLS)
    b = tmp_path_factory.mktemp("labbuild") / "build"
    p = subprocess.run(["make", "-C", str(ROOT / "tests" / "lab"), "all", *targets, f"BUILD={b}"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return b


# The full regime matrix of the lab faults (each class in every regime it applies to) runs in
# `make lab-matrix` and in bench/accuracy.py's campaign; `make test` runs each class once (CI's
# 30 minutes). A case that is not its class's one run in make test carries this mark.
LAB_MATRIX = pytest.mark.skipif(os.environ.get("STALLSCOPE_LAB_MATRIX") != "1",
                                reason="the full regime matrix of the lab faults: make lab-matrix "
                                       "(make test runs each class once)")


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, nftables, bpftrace); CI runs as root")


def require_tool(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH (make test installs the Debian packages as root)")


from fuzz.report import pytest_terminal_summary  # noqa: E402,F401  (fuzz counts at the end of a run)


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium through Playwright (never a downloaded browser), for the report's
    browser tests; skips with the reason when either is missing."""
    require_tool("chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install '.[test]')")
    with sync_api.sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []     # root needs --no-sandbox
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=args)
        yield b
        b.close()


# ------------------------------------------------------------------ overlap: lab pool + pure-CPU tests
# The regimes tests' lab runs (lab_runs/test_regimes_findings.py, ~12 minutes) spend most of their time
# waiting: on held hangs, on captures, and on the kernel, which detaches uprobes one at a time for
# the whole machine (~0.1 s each, bpf/README.md). In a run that selects them as root, their pool
# starts before these pure-CPU modules (no root, no lab, no bpftrace, no namespace, no subprocess
# with a tight timeout), which then run at the lowest CPU priority while it goes on; the regimes
# tests come last and check the results. STALLSCOPE_OVERLAP=0 keeps the plain order. Modules are
# named by file name, unique under tests/ whatever their folder.
OVERLAP_MODULES = {
    "test_fuzz_parsers.py", "test_parsers_fuzz.py", "test_parsers_flight_recorder.py", "test_parsers_ib_counters.py",
    "test_parsers_native_stacks.py", "test_parsers_nccl_debug.py", "test_parsers_nccl_inspector.py",
    "test_parsers_nccl_tests.py", "test_parsers_ncclras.py", "test_parsers_pyspy.py", "test_parsers_registry.py",
    "test_parsers_ss.py", "test_parsers_torch_watchdog.py", "test_model.py", "test_model_artifacts.py",
    "test_model_comm_align.py", "test_findings.py", "test_findings_config.py", "test_findings_per_host.py",
    "test_findings_synthetic.py", "test_findings_state.py", "test_tcp_oracle.py", "test_tcp_classes.py",
    "test_decode_vs_dpkt.py", "test_pcap_formats.py", "test_flow_timing.py", "test_lab_ids.py", "test_offcpu.py",
    "test_output.py", "test_ranks.py", "test_streaming.py", "test_bundle.py", "test_query.py",
    # the corpora and the findings' own tests (pure CPU, in-process): they fill the pool's tail
    "test_realworld.py", "test_normalize.py", "test_logs_corpus.py", "test_missing_values.py",
    "test_parsers_nccl_topo.py", "test_golden.py", "test_findings_unsaid.py", "test_findings_precedence.py",
    "test_findings_contract.py", "test_findings_init.py", "test_findings_init_hang.py", "test_findings_new_faults.py",
    "test_findings_fr_dumps.py", "test_findings_cascade.py", "test_findings_silent_rank.py",
    "test_findings_bottleneck.py", "test_op_align.py", "test_watcher_view.py", "test_job_scope.py",
    "test_report.py", "test_cli.py", "test_cli_outputs.py", "test_intake.py", "test_logscan.py",
    "test_house_rules.py", "test_import_graph.py", "test_design_names.py",
}
LAB_POOL_MODULE = "test_regimes_findings.py"
_overlap: dict = {}


def pytest_collection_modifyitems(session, config, items):
    if os.environ.get("STALLSCOPE_OVERLAP", "1") == "0" or os.geteuid() != 0:
        return
    pool = [it for it in items if it.path.name == LAB_POOL_MODULE]
    cpu = [it for it in items if it.path.name in OVERLAP_MODULES]
    if not pool or not cpu:
        return
    # other modules' cases the pool runs too (their POOL_CASES): checked after the CPU tests
    pooled = [it for it in items if it.path.name != LAB_POOL_MODULE and getattr(getattr(it, "callspec", None),
              "params", {}).get("name") in getattr(getattr(it, "module", None), "POOL_CASES", {})]
    moved = {id(it) for it in pool + cpu + pooled}
    items[:] = [it for it in items if id(it) not in moved] + cpu + pooled + pool
    _overlap.update(first=cpu[0], cpu={id(it) for it in cpu}, pool_module=pool[0].module)
    _fuzz_in_background(session, items)


def _fuzz_in_background(session, items) -> None:
    """The selected fuzz runs (test_fuzz_parsers.py's mutated and deep targets) start now in a
    background process of the lowest priority (fuzz/background.py): the lab and capture tests
    that come first leave CPU idle while their jobs run, and the fuzz tests, in the overlap
    phase, then only read their outcome. STALLSCOPE_FUZZ_BACKGROUND=0 runs them in place."""
    if os.environ.get("STALLSCOPE_FUZZ_BACKGROUND", "1") == "0":
        return
    kinds = {"test_mutated_inputs_keep_the_contract": "mutated", "test_deeper_paths_keep_the_contract": "deep"}
    selected = [f"{kinds[it.originalname]}:{it.callspec.params['name']}" for it in items
                if it.path.name == "test_fuzz_parsers.py" and getattr(it, "originalname", "") in kinds]
    if selected:
        from fuzz import background
        base = session.config._tmp_path_factory.mktemp("fuzz-background")
        background.start(base / "runs.jsonl", base / "crashes", selected, ROOT)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if id(item) not in _overlap.get("cpu", ()):
        yield
        return
    if item is _overlap["first"]:
        try:
            _overlap["pool_module"].start(item.session, item.config._tmp_path_factory)
        except (Exception, pytest.skip.Exception) as e:    # the regimes tests say it again, properly
            print(f"\nlab pool not started early ({type(e).__name__}: {str(e)[:200]}); "
                  "the regimes tests start it themselves")
    # this thread only (Linux: a thread's own nice value); the pool's threads keep theirs, and
    # what this test starts (fuzz workers, tshark) inherits the lowest priority
    was = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        niced = True
    except OSError:
        niced = False
    try:
        yield
    finally:
        if niced:
            os.setpriority(os.PRIO_PROCESS, 0, was)


def pytest_sessionfinish(session, exitstatus):
    from fuzz import background
    background.stop()
    # a run stopped before the regimes tests (-x, Ctrl-C): the runs under way end and tear their
    # namespaces down, the ones not begun are cancelled
    mod = _overlap.get("pool_module")
    if mod is not None and mod._STARTED:
        mod._STARTED.pop().close()
