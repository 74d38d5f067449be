"""Fleet scale (issue 14): the per-host stage on worker processes (``--jobs``) and on a Dask
cluster (``--dask``) gives the same model and findings as one process; the skew from
sampled fingerprints; the vendored partial plotly.js.

The timing targets (per-host cost flat from 8 to 64 hosts, ``--jobs 2`` 1.8x ``--jobs 1``)
are measured by bench/fleet.py, not here.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, run_python
from forensics.analysis import analyze
from forensics.execution import Execution, choice, on_dask
from forensics.execution.reader_pool import ReaderPool
from forensics.inputs.bundle import Bundle
from forensics.cli import Env, main
from forensics.execution.host_reading import read_model
from forensics.model import hosts
from forensics.report import figures, html
from shipped import shipped_bundle
from tests.report_helpers import comparable

PER_HOST = ROOT / "tests" / "fixtures" / "bundles-per-host"
HANG = sorted((PER_HOST / "link-down-hang-late").glob("*.tar.gz"))
CLEAN = sorted((PER_HOST / "clean").glob("*.tar.gz"))
# one early capture of a link-down hang: collectives, a hung communicator, retransmissions
EARLY_HANG = sorted((ROOT / "tests" / "fixtures" / "bundles" / "link-down-hang").glob("*.tar.gz"))


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), Env(stdout=out, stderr=err))
    return code, out.getvalue(), err.getvalue()


def _result(paths, **kw) -> tuple[dict, dict[str, pd.DataFrame]]:
    a = analyze(paths, **kw)
    try:
        return a.to_json(), {k: v.copy() for k, v in a.model.tables.items()}
    finally:
        a.close()


def _same(left: tuple[dict, dict], right: tuple[dict, dict]) -> None:
    assert json.dumps(left[0], sort_keys=True) == json.dumps(right[0], sort_keys=True)
    assert left[1].keys() == right[1].keys()
    for name in left[1]:
        pd.testing.assert_frame_equal(left[1][name], right[1][name], obj=name)


@pytest.fixture(scope="module")
def one_process():
    assert len(HANG) >= 3, "the shipped per-host link-down-hang set is missing"
    return _result(HANG, execution=Execution(jobs=1))


def test_worker_processes_give_the_same_tables_and_findings(one_process):
    _same(one_process, _result(HANG, execution=Execution(jobs=2)))
    j = one_process[0]
    assert j["findings"][0]["kind"] == "hang_stuck"            # a real verdict, not two empty runs
    assert len(one_process[1]["tcp_events"]) > 0 and len(one_process[1]["flows"]) > 0


@pytest.mark.parametrize("scenario", [
    # one capture that saw the fault
    "bundles/loss", "bundles/slow-link", "bundles/reset", "bundles/straggler", "bundles/mismatch-hang",
    # one capture per host, started seconds apart during the hang or on a healthy job still running
    "bundles-per-host/clean", "bundles-per-host/gpu-hang-late", "bundles-per-host/mismatch-hang-late"])
def test_findings_made_beside_are_those_one_process_makes(scenario):
    # with two jobs the network detectors run in the forked child, the state detector here
    # and the rest wherever the two meet: every finding and problem the same, in order
    paths = sorted((ROOT / "tests" / "fixtures" / scenario).glob("*.tar.gz"))
    one, two = analyze(paths, execution=Execution(jobs=1)), analyze(paths, execution=Execution(jobs=2))
    try:
        assert one.findings, scenario                               # a verdict to compare
        assert json.dumps(one.to_json(), sort_keys=True) == json.dumps(two.to_json(), sort_keys=True)
    finally:
        one.close()
        two.close()


def test_dask_local_cluster_gives_the_same_tables_and_findings(one_process):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is not installed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")   # loopback only
        _same(one_process, _result(HANG, execution=Execution.on_dask(cluster.scheduler_address)))


def _page(path: Path) -> str:
    return comparable(path.read_text())


def test_cli_jobs_2_writes_the_same_json_report_and_summary_as_jobs_1(tmp_path):
    # with --jobs 2 the report's per-rank tables, intervals and heatmap are made in a forked
    # process beside the detectors (report.model_steps): the same report as one process makes
    outs = []
    for j in ("1", "2"):
        dest = tmp_path / f"j{j}.json"
        code, out, err = cli("analyze", *map(str, HANG), "-o", str(tmp_path / f"r{j}.html"), "--json", str(dest),
                             "--markdown", str(tmp_path / f"s{j}.md"), "--jobs", j)
        assert code in (0, 1), err
        outs.append(json.loads(dest.read_text()))
    assert outs[0] == outs[1]
    assert outs[0]["findings"] and "on 2 processes (this one and 1 worker)" in err    # a verdict; the progress line says how it ran
    assert _page(tmp_path / "r1.html") == _page(tmp_path / "r2.html")
    assert (tmp_path / "s1.md").read_text() == (tmp_path / "s2.md").read_text()


def test_the_reports_model_tables_are_made_beside_the_detectors_with_two_jobs():
    from forensics.report import data, model_steps
    from forensics.report.sections import ranks as report_ranks
    a = analyze(HANG, execution=Execution(jobs=2, model_steps=tuple(model_steps())))
    try:
        assert {"rank_table", "intervals", "heatmap"} <= set(a.memos)
        made_here = report_ranks._rank_table(a.model)
        pd.testing.assert_frame_equal(a.memos["rank_table"], made_here)
        assert len(made_here) == 3                               # the ranks of the three hosts
        got = data.rank_table(a)
        got.loc[:, "rank"] = -1                                 # a caller's copy: the kept one is unchanged
        assert (data.rank_table(a)["rank"] >= 0).all()
    finally:
        a.close()
    one = analyze(HANG, execution=Execution(jobs=1, model_steps=tuple(model_steps())))   # one job: left
    try:
        assert one.memos == {}
    finally:
        one.close()


def _value_and_pid(x):
    return x * 2, os.getpid()


def _fails():
    raise RuntimeError("no")


def _sleeps():
    time.sleep(30)


def test_forked_computes_in_another_process_and_gives_up_on_a_failure_or_a_stuck_child():
    from forensics.execution.forked_call import ForkedCall
    value, pid = ForkedCall(_value_and_pid, 21).result()
    assert value == 42 and pid != os.getpid()
    assert ForkedCall(_fails).result() is None                      # the caller computes it itself
    t0 = time.monotonic()
    stuck = ForkedCall(_sleeps, timeout=0.5)
    child = stuck._pid
    assert stuck.result() is None and time.monotonic() - t0 < 10
    with pytest.raises(ChildProcessError):                      # killed and reaped, no zombie
        os.waitpid(child, os.WNOHANG)
    dropped = ForkedCall(_sleeps)
    child = dropped._pid
    dropped.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)


def _items_then_fails(n):
    for i in range(n):
        yield i, os.getpid()
    raise RuntimeError("no")


def _slow_items(n, pause):
    for i in range(n):
        time.sleep(pause)
        yield i


def test_forked_streams_items_as_they_are_made_and_keeps_them_when_the_child_fails():
    from forensics.execution.forked_call import ForkedCall
    f = ForkedCall(_items_then_fails, 3, stream=True)
    got = []
    while f.running:
        got += f.received(wait=True)
    assert [i for i, _ in got] == [0, 1, 2] and all(pid != os.getpid() for _, pid in got)
    assert f.result() is None                                  # it failed: no value
    slow = ForkedCall(_slow_items, 3, 0.5, stream=True)
    assert slow.received() == []                               # nothing yet: no wait
    assert slow.received(wait=True) == [0]                     # at least one with a wait
    slow.cancel()
    assert not slow.running and slow.received(wait=True) == []


def _big_then_when(n):
    yield b"x" * n
    yield time.monotonic()


def test_a_streaming_child_goes_on_while_this_process_reads_nothing():
    # items larger than a pipe holds: the child spools them and is done long before this
    # process, busy with its own work (the detectors), reads anything
    from forensics.execution.forked_call import ForkedCall
    f = ForkedCall(_big_then_when, 8 << 20, stream=True)
    time.sleep(1.5)
    t = time.monotonic()
    got = []
    while f.running:
        got += f.received(wait=True)
    assert len(got) == 2 and len(got[0]) == 8 << 20
    assert got[1] < t                                          # made before anything was read


def _step(name, delay=0.0):
    def run(a):
        if delay:
            time.sleep(delay)
        a.memos[name] = (name, os.getpid())
    return run


def _workspace(model, con=None):
    from forensics.analysis import Analysis
    from forensics.execution.shared_steps import Workspace
    from forensics.findings import NO_DATABASE, Context, Options
    return Workspace(Analysis.of_model(model, Options()), Context(model=model, con=con or NO_DATABASE))


def test_the_last_report_steps_are_made_here_once_this_process_is_free(tmp_path):
    # the child makes the steps in order, slowly; this process takes the last ones from the
    # end (their needs come first), never the one the child is on, and stops the child once
    # every step is made: all steps made once, the first ones there, the last ones here
    from forensics.execution.forked_call import ForkedCall
    from forensics.execution.shared_steps import ModelStep, child_values, make_from_both_ends
    model = read_model(EARLY_HANG)
    steps = [ModelStep("a", _step("a", 0.8)), ModelStep("b", _step("b", 0.8)), ModelStep("c", _step("c"), ("a",)),
             ModelStep("d", _step("d"), ("b",)), ModelStep("e", _step("e"))]
    child = ForkedCall(child_values, _workspace(model), steps, stream=True)
    here = _workspace(model)
    values = make_from_both_ends(child, steps, here)
    assert not child.running
    memos = here.analysis.memos
    assert set(values) == set(memos) == {"a", "b", "c", "d", "e"}
    where = {k: pid == os.getpid() for k, (_, pid) in memos.items()}
    # the child is on a: e, then b (not a, the child's), then d (b made), then c once a came
    assert not where["a"] and all(where[k] for k in "bcde")
    # a child that fails at once: every step made here, in order
    broken = ForkedCall(_items_then_fails, 0, stream=True)
    here = _workspace(model)
    make_from_both_ends(broken, steps[2:3] + steps[4:], here)
    assert set(here.analysis.memos) == {"c", "e"}
    assert all(pid == os.getpid() for _, pid in here.analysis.memos.values())


def _probe(name, pause=0.0, query=False, fail=False):
    def detect(ctx):
        time.sleep(pause)
        if query:
            ctx.sql("SELECT 1")
        if fail:
            raise ValueError("broken on purpose")
        from forensics.findings import Finding
        return [Finding(kind=name, severity="info", confidence=1.0, summary=name, details={"pid": os.getpid()})]
    return detect


def test_the_detectors_are_shared_with_the_child_and_those_that_query_made_here(monkeypatch):
    # the child never uses the database: a detector declared to query is made here first; one
    # that queries anyway is handed back (not a failure); a failing one is one problem line
    from forensics.analysis import Analysis
    from forensics.execution.shared_steps import Workspace, detect_with_child
    from forensics.findings import NO_DATABASE, Context, base
    monkeypatch.setattr(base, "_DETECTORS", {
        "slow": _probe("slow", pause=0.6), "asks": _probe("asks", query=True),
        "declared": _probe("declared", pause=1.2, query=True), "broken": _probe("broken", fail=True),
        "quick": _probe("quick")})
    monkeypatch.setattr(base, "_QUERIES", {"declared"})
    model = read_model(EARLY_HANG)
    con = model.connect()
    try:
        # while this process makes declared, the child makes slow, hands asks back (it
        # queries), fails on broken and makes quick; then this process makes asks
        here, child = (Workspace(Analysis.of_model(model), Context(model=model, con=c)) for c in (con, NO_DATABASE))
        (found, problems), memos = detect_with_child(here, child, [])
    finally:
        con.close()
    where = {f.kind: f.details["pid"] == os.getpid() for f in found}
    assert where == {"slow": False, "asks": True, "declared": True, "quick": False}
    assert [f.kind for f in found] == ["asks", "declared", "quick", "slow"]        # order(), whoever made them
    assert problems == ["detector broken failed: ValueError: broken on purpose"] and memos == {}


def test_small_bundles_are_read_in_process_unless_jobs_is_given(tmp_path, monkeypatch):
    assert choice.default_jobs(CLEAN) == 1                       # four small bundles: no pool
    assert choice.default_jobs(CLEAN[:1]) == 1
    monkeypatch.setattr(choice, "POOL_MIN_BYTES", 1)
    assert choice.default_jobs(CLEAN) == choice.default_jobs()       # large enough: every core
    monkeypatch.undo()
    code, _, err = cli("analyze", *map(str, CLEAN), "-o", str(tmp_path / "r.html"))
    assert code in (0, 1), err
    assert "reading 4 bundle(s)" in err and "processes (this one" not in err


def test_a_bad_bundle_on_a_worker_is_one_clear_line(tmp_path):
    bad = tmp_path / "broken.tar.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    code, out, err = cli("analyze", str(CLEAN[0]), str(bad), "-o", str(tmp_path / "r.html"), "--jobs", "2", "-q")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "broken.tar.gz" in lines[0] and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("argv, says", [
    (["--jobs", "0"], "--jobs must be at least 1"),
    (["--jobs", "2", "--dask", "tcp://127.0.0.1:1"], "exclude each other"),
])
def test_bad_parallel_options_are_refused(tmp_path, argv, says):
    code, _, err = cli("analyze", str(CLEAN[0]), "-o", str(tmp_path / "r.html"), *argv)
    assert code == 2 and says in err


def test_an_execution_choice_is_checked_when_made():
    assert Execution().kind == "local" and not Execution().shares_with_child    # this process alone
    assert Execution(jobs=2).shares_with_child
    assert not Execution.on_dask("tcp://127.0.0.1:1").shares_with_child       # never beside a client's threads
    for bad in ({"kind": "threads"}, {"jobs": 0}, {"kind": "dask"}, {"address": "tcp://127.0.0.1:1"}):
        with pytest.raises(ValueError):
            Execution(**bad)
    said = []
    Execution(meanwhile=lambda: said.append(1 / 0)).run_meanwhile()            # a head start only: no error
    assert said == []


def test_an_unreachable_dask_scheduler_is_one_clear_line(tmp_path, monkeypatch):
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    monkeypatch.setattr(on_dask, "DASK_CONNECT_TIMEOUT_S", 2)
    t = time.monotonic()
    code, _, err = cli("analyze", str(CLEAN[0]), "-o", str(tmp_path / "r.html"), "--dask", "tcp://127.0.0.1:9", "-q")
    assert code == 2 and "cannot reach the scheduler" in err and len(err.strip().splitlines()) == 1
    assert time.monotonic() - t < 30


def test_a_closed_bundle_refuses_to_read_files():
    with Bundle.open(CLEAN[0]) as b:
        assert b.pcaps()
    with pytest.raises(RuntimeError, match="closed"):
        b.pcaps()
    with pytest.raises(RuntimeError, match="closed"):
        b.path("manifest.json")


def test_host_parts_keep_no_per_packet_table():
    part = hosts.read_host(HANG[0])
    assert part.pcap.packets_seen > 0
    flagged = sum(len(p) for p in part.pcap.packets)
    assert flagged < part.pcap.packets_seen                     # flagged packets only, not every one
    assert part.pcap.fingerprints is not None and len(part.pcap.fingerprints) <= part.pcap.packets_seen


def test_sampled_fingerprints_give_the_skew_of_all_segments(monkeypatch):
    full = read_model(CLEAN)
    monkeypatch.setattr(hosts, "FINGERPRINTS_PER_HOST", 500)     # one segment in 2**k, the same on every host
    sampled = read_model(CLEAN)
    pairs = 0
    for f, s in zip(full.skew, sampled.skew):
        assert (f.host_a, f.host_b) == (s.host_a, s.host_b)
        if f.skew_ns is None:
            continue
        pairs += 1
        # a sample chosen by content keeps the same segments on both sides: they still match
        assert s.skew_ns is not None and 0 < s.matched_segments < f.matched_segments
        assert abs(s.skew_ns - f.skew_ns) <= max(20_000, abs(f.skew_ns) // 5), (f, s)
    assert pairs >= 1


# --------------------------------------------------------------------------- the vendored plotly.js

def test_vendored_plotly_matches_its_recorded_hash_and_license():
    vendor = html.VENDOR
    digest, name = (vendor / "plotly-stallscope.min.js.sha256").read_text().split()
    assert name == "plotly-stallscope.min.js"
    assert hashlib.sha256(html.PLOTLY_BUNDLE.read_bytes()).hexdigest() == digest
    head = html.PLOTLY_BUNDLE.read_text()[:600]
    assert re.search(r"plotly\.js .*v4\.1\.1", head) and "MIT" in head
    assert "MIT License" in (vendor / "PLOTLY_LICENSE").read_text()
    assert html.plotly_js() == html.PLOTLY_BUNDLE.read_text()


@pytest.mark.parametrize("scenario", ["loss", "slow-link", "mismatch-hang"])
def test_the_report_draws_only_trace_types_the_bundle_has(scenario):
    path = shipped_bundle(scenario)
    if path is None:
        pytest.skip(f"no shipped {scenario} bundle")
    a = analyze([path])
    try:
        figs = [f for f in (figures.timeline(a, 50.0), figures.heatmap(a),
                            figures.nccl_tests_chart(a.model, a.findings)) if f is not None]
    finally:
        a.close()
    assert figs
    used = {t.get("type", "scatter") for f in figs for t in f.spec["data"]}
    assert used <= set(html.PLOTLY_TRACES), used


def test_a_five_rank_report_is_under_1_5_mb(tmp_path):
    """The lab's loss bundle grown to 5 ranks (bench/analyze.py's generator, a small capture)."""
    import sys
    sys.path.insert(0, str(ROOT / "bench"))
    from analyze import build
    bundles = build(shipped_bundle("loss"), tmp_path, ranks=5, packets=20_000, hosts=1)
    dest = tmp_path / "report.html"
    code, _, err = cli("analyze", *map(str, bundles), "-o", str(dest), "-q", "--jobs", "1")
    assert code in (0, 1), err
    a = analyze(bundles)
    try:
        assert a.model["nccl_events"]["rank"].nunique() == 5
    finally:
        a.close()
    page = dest.read_text()
    assert page.count('class="js-plotly') == 0 and "data-plot" in page      # plots to draw, plotly inline
    assert dest.stat().st_size < 1.5e6


def _first_host_taken(setup: str) -> list[str]:
    """In a fresh process: ``setup``, then a ReaderPool of the hang set; once a worker has taken
    the first host: whether pandas and the analyzer were imported, the start method, and
    whether the collector holds frozen objects before and after :meth:`ReaderPool.close`."""
    code = ("import gc, sys, time, forensics.execution.reader_pool as w\n"
            f"{setup}\n"
            f"r = w.ReaderPool({[str(p) for p in HANG]!r}, 2)\n"
            "t = time.monotonic() + 50\n"
            "while r._next.value == 0 and time.monotonic() < t: time.sleep(0.01)\n"
            "print('pandas' in sys.modules, 'forensics.analysis' in sys.modules, r._next.value > 0,\n"
            "      r._ctx.get_start_method(), gc.get_freeze_count() > 0, end=' ')\n"
            "r.close()\n"
            "print(gc.get_freeze_count() > 0)\n")
    p = run_python(code, timeout=120)
    assert p.stderr == "", p.stderr                    # closed: no worker, semaphore or warning left
    return p.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_forked_workers_start_before_anything_is_imported_and_freeze_nothing():
    # the command line starts the reading first: with no other thread, the workers are forked
    # at once, before this process imports pandas (each imports it on its own core), and no
    # object is frozen for them (they share no imported page to keep from being copied)
    assert _first_host_taken("") == ["False", "False", "True", "fork", "False", "False"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_what_the_caller_froze_itself_stays_frozen_after_the_reading():
    assert _first_host_taken("gc.freeze()")[-3:] == ["fork", "True", "True"]


def test_beside_a_thread_a_fork_server_starts_the_workers_before_pandas_is_imported():
    # another thread could hold a lock across a fork: the fork server imports the per-host
    # stage instead, while this process has imported nothing (forensics.execution.reader_pool needs no pandas)
    setup = "import threading; e = threading.Event(); threading.Thread(target=e.wait, daemon=True).start()"
    assert _first_host_taken(setup) == ["False", "False", "True", "forkserver", "False", "False"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")
def test_the_pools_thread_imports_nothing_when_the_workers_results_come():
    """The calling thread may still be importing the analyzer when a worker's host arrives; the
    pool's thread, which receives it, must import nothing (two threads importing one package
    tree can deadlock): every worker's host received, and still neither the analyzer nor pandas
    imported in this process until the calling thread takes the parts."""
    code = ("import concurrent.futures, sys, forensics.execution.reader_pool as w\n"
            f"r = w.ReaderPool({[str(p) for p in HANG]!r}, 2)\n"
            "done = concurrent.futures.wait(r._futures, timeout=100).not_done == set()\n"
            "print(done, 'forensics.model.hosts' in sys.modules, 'pandas' in sys.modules, end=' ')\n"
            "parts = list(r.rest())\n"
            "print(sorted(i for i, _ in parts) == list(range(len(r.paths))), type(parts[0][1]).__name__)\n"
            "r.close()\n")
    p = run_python(code, timeout=150)
    assert p.stderr == "", p.stderr
    assert p.stdout.split() == ["True", "False", "False", "True", "HostPart"], p.stdout


def test_a_workers_error_is_raised_by_the_caller_with_its_traceback(tmp_path):
    from forensics.errors import InputError
    from forensics.execution.reader_pool import RemoteTraceback
    bad = tmp_path / "broken.tar.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    reading = ReaderPool([str(bad)], 2)
    try:
        with pytest.raises(InputError, match="broken.tar.gz") as got:
            list(reading.rest())
    finally:
        reading.close()
    assert isinstance(got.value.__cause__, RemoteTraceback) and "Traceback" in str(got.value.__cause__)


def _read_by(reading: ReaderPool) -> tuple[list[int], list[int]]:
    """(hosts the calling process read, hosts the workers read), by index."""
    mine, theirs = [], []
    try:
        while (i := reading.claim()) is not None:
            hosts.read_host(reading.paths[i])
            mine.append(i)
            theirs += [j for j, _ in reading.finished()]
        theirs += [j for j, _ in reading.rest()]
    finally:
        reading.close()
    return mine, theirs


def _taken(reading: ReaderPool) -> None:
    """Wait until a worker has taken a host."""
    t = time.monotonic() + 60
    while reading._next.value == 0 and time.monotonic() < t:
        time.sleep(0.005)
    assert reading._next.value > 0, "no worker took a host in 60 s"


def test_the_calling_process_and_the_workers_each_read_other_hosts():
    reading = ReaderPool(HANG, 2)
    _taken(reading)
    mine, theirs = _read_by(reading)
    assert sorted(mine + theirs) == list(range(len(HANG)))      # every host once, by one reader
    assert 0 in theirs and mine


def test_without_workers_the_calling_process_reads_every_host(monkeypatch):
    import concurrent.futures

    def no_pool(*a, **kw):
        raise OSError("no processes for you")
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_pool)
    said = []
    from forensics.execution.host_reading import read_hosts
    parts = read_hosts(HANG, Execution(jobs=2), progress=said.append)
    assert [p.bundle.host for p in parts] == [hosts.read_host(p).bundle.host for p in HANG]
    assert any("no worker process could start (no processes for you)" in m for m in said)


def test_a_worker_killed_while_reading_is_one_clear_error():
    import signal
    from forensics.execution.host_reading import WorkerError, read_hosts
    reading = ReaderPool(HANG, 2)
    _taken(reading)
    reading._join()
    for pid in list(reading._pool._processes):
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerError, match="a worker process died while reading the bundles"):
        read_hosts(HANG, Execution(jobs=2, readers=reading))


def test_a_reading_started_on_other_bundles_is_refused():
    from forensics.execution.host_reading import read_hosts
    reading = ReaderPool(HANG[:2], 2)
    try:
        with pytest.raises(ValueError, match="other bundles"):
            read_hosts(HANG, Execution(jobs=2, readers=reading))
    finally:
        reading.close()


def test_with_workers_the_database_is_opened_during_the_merge_and_written_whole(tmp_path, monkeypatch):
    # the tables are created on a thread while the hosts are merged (open_database_on_thread), and
    # that connection is the one filled: a database file with every row
    import duckdb
    from forensics import analysis
    opened = []
    take = analysis.opened_or_none

    def spy(opening):
        con = take(opening)
        opened.append(con)
        return con

    monkeypatch.setattr(analysis, "opened_or_none", spy)
    path = tmp_path / "m.duckdb"
    a = analyze(HANG, execution=Execution(jobs=2), db=path)
    try:
        assert len(opened) == 1 and opened[0] is not None and a.con._con is opened[0]
        tables = {k: len(v) for k, v in a.model.tables.items()}
    finally:
        a.close()
    with duckdb.connect(str(path), read_only=True) as disk:
        for table, n in tables.items():
            assert disk.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] == n, table
    assert tables["tcp_events"] > 0 and tables["sockets"] > 0            # rows to compare


def test_work_on_a_thread_gives_its_value_raises_its_error_here_and_closes_what_is_dropped():
    from forensics.execution.thread_call import ThreadCall, opened_or_none

    class Con:
        closed = False

        def close(self):
            self.closed = True

    def fails():
        raise OSError("cannot open")

    assert ThreadCall("t", lambda a, b=0: a + b, 1, b=2).result() == 3
    with pytest.raises(OSError, match="cannot open"):
        ThreadCall("t", fails).result()
    assert opened_or_none(ThreadCall("t", fails)) is None                # opened again where it is used
    con = Con()
    ThreadCall("t", lambda: con).discard()
    assert con.closed
