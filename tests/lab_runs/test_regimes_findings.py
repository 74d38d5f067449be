"""Verdicts in the regimes users meet (root): the lab's faults captured the way an on-call
engineer captures them, then analysed, with the lab's scenario.json as the truth.

- **late** (issue 11): the capture starts 10 s after the fault's onset and runs 15 s, one
  ``stallscope capture`` per host (each inside its rank's namespaces), started seconds
  apart; every hang case three ways: with Flight Recorder dumps and NCCL_DEBUG COLL logs;
  with neither (stacks, thread states and sockets alone); with the tracer off (--no-bpf).
- **per-host** (issue 12): the captures start 0-5 s apart while the job runs and stop while
  it still runs, Linux's TCP defaults (tail-loss probes on), a CPU hog per host.
- a capture whose hosts overlap only partly, and captures started before the job opened
  its sockets.

The runs are slow (tens of seconds each, mostly a held hang or a capture running, most of
that the kernel detaching uprobes one at a time for the whole machine), so the selected cases
start together in a small pool when the first test asks for one, or earlier: in a full run,
tests/conftest.py starts the pool before the pure-CPU tests (fuzzing, parsers, the model, the
TCP engine) and runs those meanwhile, at the lowest CPU priority; each test here then checks
its own. ``make regimes-clean-10`` runs the clean per-host case ten times.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import LAB_MATRIX, ROOT
from forensics.analysis import analyze
from tests.lab import netns
from tests.lab.verdicts import names_fault

PY = sys.executable
LAB = ROOT / "tests" / "lab"
SMALL = ["--buckets", "131072,65536", "--compute-ms", "30"]
# the on-call capture: 10 s after the onset, 15 s long, hosts 0-5 s apart
LATE = ["--capture", "per-host", "--capture-start", "onset+10", "--capture-duration-s", "15",
        "--capture-stagger-s", "0-5", "--hold-s", "10"]
NEITHER = ["--no-flight-recorder", "--debug-subsys", "INIT,NET"]     # no FR dumps, no COLL lines
NO_BPF = ["--capture-args=--no-bpf"]
PER_HOST = ["--capture", "per-host", "--capture-start", "onset+2", "--capture-duration-s", "15",
            "--capture-stagger-s", "0-5", "--stress", "1", "--tcp", "defaults"]
POOL = int(os.environ.get("STALLSCOPE_REGIME_JOBS", "2"))   # 2 cores: more bpftrace starts at once take tens of seconds


@dataclass
class Case:
    args: list[str]
    kinds: tuple[str, ...] | None          # the top finding's kind; None: no warning or error at all
    link: bool = False                     # the top finding also names the faulted rank's link
    # runs with no other lab run beside it: a capture of a job that already died runs without
    # --pid and takes every NCCL process of the machine, as it would on a real host; the
    # other runs' ranks (same addresses, same rank numbers) are not this job's
    solo: bool = False


HANGS = {
    "mismatch-hang": (["--scenario", "mismatch-hang", "--rank", "1"], ("hang_mismatch",), False),
    "link-down-hang": (["--scenario", "link-down-hang", "--rank", "2"], ("hang_stuck",), True),
    "reset": (["--scenario", "reset", "--rank", "3"], ("connection_reset",), True),
    "gpu-hang": (["--scenario", "gpu-hang", "--rank", "2"], ("hang_stuck",), False),
}
WAYS = {"logs": [], "neither": NEITHER, "no-bpf": NO_BPF}
CASES: dict[str, Case] = {}
for _name, (_args, _kinds, _link) in HANGS.items():
    for _way, _extra in WAYS.items():
        CASES[f"late-{_name}-{_way}"] = Case(_args + ["--ranks", "4"] + LATE + _extra + SMALL, _kinds, _link,
                                             solo=_name == "reset")
CASES.update({
    "late-loss": Case(["--scenario", "loss", "--rank", "1", "--ranks", "4", "--loss-permille", "50",
                       "--start-s", "1"] + LATE[:-2] + ["--compute-ms", "60", "--buckets", "131072,65536"],
                      ("network_loss",), True),
    # every rank computes for 25 s before its first collective: nothing in flight while the capture runs
    "late-long-compute": Case(["--scenario", "clean", "--ranks", "4", "--steps", "1", "--compute-ms", "25000",
                               "--capture", "per-host", "--capture-start", "onset+3", "--capture-duration-s", "15",
                               "--capture-stagger-s", "0-5", "--buckets", "65536"], None),
})
for _name, _args, _kinds, _link in (
        ("clean", ["--scenario", "clean"], None, False),
        # 2.5% random loss on one host's interface (issue 36): a warning at least, never a green screen
        ("loss", ["--scenario", "loss", "--rank", "2", "--loss-permille", "25", "--start-s", "1"],
         ("network_loss",), True),
        ("slow-link", ["--scenario", "slow-link", "--rank", "3", "--rate", "30mbit", "--start-s", "1"],
         ("slow_link",), True),
        ("straggler", ["--scenario", "straggler", "--rank", "0", "--straggle-ms", "250", "--start-s", "1"],
         ("straggler",), False),
        ("mismatch-hang", ["--scenario", "mismatch-hang", "--rank", "1", "--hold-s", "10"], ("hang_mismatch",), False),
        ("link-down-hang", ["--scenario", "link-down-hang", "--rank", "0", "--hold-s", "10"], ("hang_stuck",), True)):
    CASES[f"per-host-{_name}"] = Case(_args + ["--ranks", "4"] + PER_HOST + ["--compute-ms", "60",
                                      "--buckets", "131072,65536"], _kinds, _link)
# hosts whose captures overlap only partly: planned to begin 5.5-6 s apart; they stop 3 s apart
# in the order they began capturing, the first 4 s after the last one began, so the overlap holds
# however long each tracer takes to attach (in CI two once began capturing 11.5 s apart, another
# time 1.7 s: stops timed from each capture's own start did not overlap, or barely differed)
CASES["partial-overlap"] = Case(["--scenario", "clean", "--ranks", "3", "--capture", "per-host",
                                 "--capture-start", "onset+1", "--capture-duration-s", "4",
                                 "--capture-stop-spread-s", "3", "--capture-stagger-s", "5.5-6",
                                 "--compute-ms", "60", "--buckets", "131072,65536"],
                                None)
# a job prolog: the captures run before the ranks open a single socket
# (no NCCL_SOCKET_IFNAME either: the interface is known only once a socket exists)
CASES["before-sockets"] = Case(["--scenario", "clean", "--ranks", "3", "--no-socket-ifname", "--capture", "per-host",
                                "--capture-start", "before", "--capture-duration-s", "8", "--capture-stagger-s", "0-2",
                                "--compute-ms", "60", "--buckets", "131072,65536"], None)


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (not installed)")


@dataclass
class Pooled:
    """One lab run of the pool: the launcher's arguments, its seed, whether it runs alone."""
    args: list[str]
    seed: int
    solo: bool = False


@dataclass
class Result:
    name: str
    out: Path
    truth: dict
    bundles: list[Path]
    launcher_rc: int
    stderr: str


class Runs:
    """The selected cases' lab runs, a few at a time in the background (a solo case waits
    until it runs alone)."""

    def __init__(self, build: Path, base: Path, names: list[str], pooled: dict[str, Pooled] | None = None):
        self.build, self.base = build, base
        # name -> how to run it: this module's cases, then other modules' (their POOL_CASES)
        self.specs = {n: Pooled(CASES[n].args, sum(map(ord, n)), CASES[n].solo) for n in names}
        self.specs.update(pooled or {})
        self.pool = cf.ThreadPoolExecutor(max_workers=POOL, thread_name_prefix="lab")
        self.lock = threading.Lock()
        self.turn = threading.Condition()
        self.active = 0                  # runs going on; -1 while a solo one runs
        self.futures: dict[str, cf.Future] = {}
        for n in sorted(self.specs, key=lambda n: self.specs[n].solo):      # the solo ones last
            self.submit(n)

    def _enter(self, solo: bool) -> None:
        with self.turn:
            self.turn.wait_for(lambda: self.active == 0 if solo else self.active >= 0)
            self.active = -1 if solo else self.active + 1

    def _leave(self, solo: bool) -> None:
        with self.turn:
            self.active = 0 if solo else self.active - 1
            self.turn.notify_all()

    def submit(self, name: str) -> cf.Future:
        with self.lock:
            if name not in self.futures:
                self.futures[name] = self.pool.submit(self.one, name)
            return self.futures[name]

    def one(self, name: str) -> Result:
        solo = self.specs[name].solo
        self._enter(solo)
        try:
            return self._run(name)
        finally:
            self._leave(solo)

    def _run(self, name: str) -> Result:
        out = self.base / name
        spec = self.specs[name]
        argv = [PY, "-m", "tests.lab.launcher", "--build", str(self.build), "--out", str(out), "--seed",
                str(spec.seed), *spec.args]
        p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _, se = p.communicate(timeout=420)
        finally:
            if p.poll() is None:        # the launcher tears its namespaces down on SIGTERM
                p.terminate()
                _, se = p.communicate(timeout=120)
        truth = json.loads((out / "scenario.json").read_text()) if (out / "scenario.json").exists() else {}
        bundles = sorted(out.glob("bundles/*/*.tar.gz"))
        return Result(name, out, truth, bundles, p.returncode, se[-4000:])

    def get(self, name: str) -> Result:
        return self.submit(name).result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


_STARTED: list[Runs] = []     # a pool started early (tests/conftest.py: while pure-CPU tests run)


def start(session, tmp_path_factory) -> Runs:
    """Build the lab and start the selected cases' runs in the background."""
    if _STARTED:
        return _STARTED[0]
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces, nsenter, tcpdump and bpftrace")
    need("gcc", "make", "ip", "unshare", "bridge", "ss", "nsenter", "tcpdump", "bpftrace", "nft", "tc")
    build = tmp_path_factory.mktemp("labbuild") / "build"
    p = subprocess.run(["make", "-C", str(LAB), "all", f"BUILD={build}"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    netns.sweep()
    me = sys.modules[__name__]
    names, pooled = [], {}
    for it in session.items:
        if _skipped(it):
            continue          # a case of the full matrix only (LAB_MATRIX): not run, not pooled
        params = getattr(getattr(it, "callspec", None), "params", {})
        mod = getattr(it, "module", None)
        if mod is me and "case" in params:
            names.append(params["case"])
        elif mod is not None and params.get("name") in getattr(mod, "POOL_CASES", {}):
            # another module's lab run, started here with these (pooled_result fetches it)
            args, seed, solo = mod.POOL_CASES[params["name"]]
            pooled[pool_key(mod, params["name"])] = Pooled(list(args), seed, solo)
    _STARTED.append(Runs(build, tmp_path_factory.mktemp("regimes"), names, pooled))
    return _STARTED[0]


def _skipped(item) -> bool:
    """Whether a skipif mark with a plain condition (LAB_MATRIX's) skips ``item``."""
    return any(m.args and m.args[0] is True for m in item.iter_markers("skipif"))


def pool_key(module, name: str) -> str:
    """The pool's name of another module's case: its module, then the case."""
    return f"{Path(module.__file__).stem}-{name}"


def pooled_result(module, name: str) -> Result | None:
    """Another module's case as run by the pool started early (tests/conftest.py), or None
    when no pool holds it (a run of that module alone, no root, STALLSCOPE_OVERLAP=0)."""
    if not _STARTED or pool_key(module, name) not in _STARTED[0].specs:
        return None
    return _STARTED[0].get(pool_key(module, name))


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    r = start(request.session, tmp_path_factory)
    yield r
    r.close()
    _STARTED.clear()
    assert netns.leftovers() == {"namespaces": [], "pids": [], "links": []}


def checked(runs: Runs, name: str) -> Result:
    res = runs.get(name)
    assert res.launcher_rc == 0, res.stderr
    caps = res.truth["captures"]
    assert all(c["ok"] for c in caps), [(c["rank"], c["error"], c["stderr_tail"]) for c in caps]
    assert len(res.bundles) == res.truth["world_size"], res.bundles
    return res


def findings_of(res: Result):
    a = analyze([str(b) for b in res.bundles])
    try:
        return a.top, list(a.findings), a.verdict()
    finally:
        a.close()


def describe(findings) -> list:
    return [(f.kind, f.severity, f.ranks, f.peer_ranks, f.summary[:300]) for f in findings]


def check_verdict(name: str, res: Result, top, findings) -> None:
    case = CASES[name]
    fault = res.truth["fault"]
    if case.kinds is None:
        bad = [f for f in findings if f.severity in ("warning", "error")]
        assert not bad, describe(findings)
        return
    assert top is not None, describe(findings)
    assert top.kind in case.kinds, describe(findings)
    if top.kind == "network_loss":     # a link that drops is a fault to fix, whatever it costs (issue 36)
        assert top.severity in ("warning", "error"), describe(findings)
    # a link's finding names one end and the other as its peer; the faulted rank is one of them
    assert names_fault(top, res.truth, case.link), (fault["ranks"], describe(findings))


# ------------------------------------------------------------------ issue 11: late captures
LATE_CASES = [n for n in CASES if n.startswith("late-")]
# make test runs every hang kind with its logs and each other way (neither, no-bpf) with one
# kind; the rest run under make lab-matrix (the reset cases run alone: each costs CI its full time)
LATE_MATRIX_ONLY = {"late-reset-neither", "late-reset-no-bpf", "late-mismatch-hang-neither",
                    "late-link-down-hang-no-bpf", "late-link-down-hang-neither", "late-gpu-hang-no-bpf"}


@pytest.mark.root
@pytest.mark.parametrize("case", [pytest.param(n, marks=LAB_MATRIX) if n in LATE_MATRIX_ONLY else n
                                  for n in LATE_CASES])
def test_late_capture_verdict(runs, case):
    res = checked(runs, case)
    onset = res.truth["onset_ns"]
    first = min(c["capturing_ns"] for c in res.truth["captures"])
    if CASES[case].kinds is not None:
        assert first >= onset + 10e9, "the capture must start at least 10 s after the onset"
    top, findings, verdict = findings_of(res)
    check_verdict(case, res, top, findings)
    if top is not None and top.kind.startswith("hang") or top is not None and top.kind == "connection_reset":
        if case.endswith("-no-bpf") or case.endswith("-neither") or case.endswith("-logs"):
            assert "before the capture" in top.summary or "before the capture" in verdict, top.summary
    if CASES[case].kinds is not None and top.kind.startswith("hang"):
        check_contract(res, top, verdict, dated=not case.endswith("-neither"))


def check_contract(res: Result, top, verdict: str, dated: bool) -> None:
    """Issue 36's first screen on a late capture: the verdict is the headline (at most 200
    characters) and names the rank with its own host; ``hosts`` holds that host; ``since_ns``
    is within 3 s of the lab's onset; ``op_count`` is the first collective not every rank
    completed (the lab counts completed ops per rank from 0). ``dated``: the capture holds
    Flight Recorder dumps or COLL lines (without either, the onset may stay unknown, but a
    date given must still be right)."""
    truth = res.truth
    r = truth["fault"]["ranks"][0]
    host = next(x["host"] for x in truth["ranks"] if x["rank"] == r)
    assert verdict == top.headline and len(verdict) <= 200, verdict
    # the rank by its own host (a dead link seen from one side names both of its ends)
    assert f"{r} ({host})" in verdict and host in top.hosts, (verdict, top.hosts)
    if dated or top.since_ns is not None:
        assert top.since_ns is not None and abs(top.since_ns - truth["onset_ns"]) <= 3e9, \
            (top.since_ns, truth["onset_ns"], top.since_source)
        assert top.since_source and top.since_precision_ns
    if dated:
        assert top.op_count == min(truth["ops_completed"]), (top.op_count, truth["ops_completed"], top.summary)
        assert top.seq == top.op_count + 1   # Flight Recorder's collective_seq_id counts from 1


# ------------------------------------------------------------------ issue 12: one capture per host
PER_HOST_CASES = [n for n in CASES if n.startswith("per-host-")]


@pytest.mark.root
@pytest.mark.parametrize("case", PER_HOST_CASES)
def test_per_host_capture_verdict(runs, case):
    res = checked(runs, case)
    job_end = res.truth["job_ended_ns"] or res.truth["ended_ns"]
    # every capture stopped while the job still ran (hangs: while the hang held)
    assert all(c["stopped_ns"] < job_end for c in res.truth["captures"]), res.truth["captures"]
    top, findings, _ = findings_of(res)
    check_verdict(case, res, top, findings)
    if top is not None and CASES[case].kinds is not None:
        hosts = {x["rank"]: x["host"] for x in res.truth["ranks"]}
        assert set(top.hosts) & {hosts[r] for r in res.truth["fault"]["ranks"]}, (top.hosts, top.headline)


@pytest.mark.root
@pytest.mark.parametrize("case", ["partial-overlap"])
def test_partly_overlapping_captures_make_no_hang(runs, case):
    res = checked(runs, case)
    caps = sorted(res.truth["captures"], key=lambda c: c["capturing_ns"])
    # each capture's window: from its "capturing" line to its Ctrl-C. The first one ended after
    # the last one began, and 6 s before the last one ended; it began before the last one did
    assert caps[0]["capturing_ns"] < caps[-1]["capturing_ns"], caps
    assert caps[0]["stop_sent_ns"] > caps[-1]["capturing_ns"] + 3e9, caps
    assert caps[-1]["stop_sent_ns"] - caps[0]["stop_sent_ns"] > 5e9, caps
    a = analyze([str(b) for b in res.bundles])
    try:
        findings = list(a.findings)
        resent = a.con.execute("SELECT count(*) FROM tcp_events WHERE event = 'tcp_retransmit_skb'").fetchone()[0]
    finally:
        a.close()
    serious = [f for f in findings if f.kind.startswith("hang") or f.severity in ("warning", "error")]
    if resent:
        # the kernel itself retransmitted (its tcp_retransmit_skb tracepoint: a starved veth on a
        # loaded 2-core machine drops now and then): a network_loss warning over that is a true
        # report, not a false alarm; a hang or an error never is
        serious = [f for f in serious if not (f.kind == "network_loss" and f.severity == "warning")]
    assert not serious, describe(findings)


@pytest.mark.root
@pytest.mark.parametrize("case", ["before-sockets"])
def test_capture_before_the_job_opened_sockets_has_packets(runs, case):
    res = checked(runs, case)
    for b in res.bundles:
        with tarfile.open(b) as t:
            m = json.load(t.extractfile(next(n for n in t.getnames() if n.endswith("/manifest.json"))))
            pcaps = [n for n in t.getmembers() if "/pcap/" in n.name and n.name.endswith(".pcap")]
        tcpdumps = {k: v for k, v in m["collectors"].items() if k.startswith("tcpdump@")}
        assert tcpdumps and any(v.get("packets", 0) > 0 for v in tcpdumps.values()), (b.name, tcpdumps)
        assert any(p.size > 24 for p in pcaps), (b.name, [(p.name, p.size) for p in pcaps])
    top, findings, _ = findings_of(res)
    check_verdict(case, res, top, findings)
