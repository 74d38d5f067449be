#!/usr/bin/env python3
"""How often stallscope is right: a randomized fault campaign in the lab (issue 44).

    sudo .venv/bin/python bench/accuracy.py [--cases N | --quick] [--seed S] [--classes a,b]
                                            [--regimes x,y] [--plan] [--out cases.json] [--keep]

From one seed it draws N cases (default 100; --quick 20) over fault class x world size (2-8) x
faulted rank x strength x timing x capture regime, runs each in the lab (tests/lab: ranks in
network namespaces, the truth in scenario.json), analyses what that regime leaves
(``stallscope analyze ... --json``) and scores the top serious finding (the first warning or
error: the verdict's finding) against the truth. The regimes:

- ``before``: one capture per host, attached before the job started (the ranks wait at a gate);
- ``onset``: one capture per host, all started S s after the fault's onset (during the hang);
- ``stagger``: one capture per host, the first S s after the onset, the others seconds apart;
- ``watch``: the black-box watcher (``capture --watch``, no --pid, no --nccl-lib, as deploy/ and
  bench/time_to_bundle.py run it), started before the job; its bundle(s) of the job;
- ``logs``: the job's own logs alone (the ranks' output, NCCL_DEBUG files), analysed loose.

Printed: a confusion matrix (true class x top serious finding kind), top-1 accuracy (kind and
rank) per class, per regime and per pair, link accuracy (the faulted link's ends), false alarms
on the runs with no fault to find, time to verdict (median, p90), the seed and the command line.
A case the lab could not run (launcher failure, a capture that never captured) is counted apart,
never right or wrong. --out writes every case as JSON, rewritten after each case. The class
table (ROWS) is the one place that says what each class is and what is expected of it.

    .venv/bin/python bench/accuracy.py --rescore cases.json --keep DIR

analyses again the evidence an earlier campaign kept (its --out and --keep) with the analyzer
as it is now, and prints the same figures: what changed on the same evidence (no lab run; a
fix prompted by those very cases scores them right, so this is no untuned figure).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.lab.scenarios import HOLDS, SCENARIOS  # noqa: E402
from tests.lab.verdicts import field as ffield, link_ends, names_fault, names_link, serious  # noqa: E402

PY = sys.executable
LAB = ROOT / "tests" / "lab"
REGIMES = ("before", "onset", "stagger", "watch", "logs")
CAPTURED = ("before", "onset", "stagger")
SMALL = ["--compute-ms", "30", "--buckets", "131072,65536"]
WATCH_ARGS = ["--hang-after", "10s", "--after", "5s"]      # bench/time_to_bundle.py's "fast" profile
WATCH_HOLD_S = 40.0                                        # hang-after + after + the bundle's writing
CASE_TIMEOUT_S = 600.0
ALL_REGIMES = REGIMES
HANG_REGIMES = REGIMES                                     # a hang is seen by every regime
RUNNING_REGIMES = CAPTURED                                 # a job that keeps running: no hang to trigger the
                                                           # watcher, nothing the NCCL logs say about packets


@dataclass(frozen=True)
class FaultClass:
    """One row of the campaign: a lab scenario and what stallscope must say about it.

    ``strength``/``timing``: (launcher option, low, high, format) drawn uniformly, or None;
    ``watch_timing`` replaces ``timing`` under the watcher (whose tracer attaches to the job's
    library only once it is loaded: the fault must come after). ``kinds``: the top serious
    finding's expected kind(s); empty = a run with nothing to find, where ``alarm`` severities
    are false alarms. ``link``: the fault sits on a link whose ends are scored.
    ``fixed_rank``: the faulted rank is always this one; ``lowest_rank``: else it is drawn
    from this rank up (a fault rank 0 cannot have)."""
    name: str
    scenario: str
    regimes: tuple[str, ...]
    kinds: tuple[str, ...]
    strength: tuple[str, float, float, str] | None = None
    timing: tuple[str, float, float, str] | None = ("--start-s", 0.5, 3.0, "{:.1f}")
    watch_timing: tuple[str, float, float, str] | None = ("--start-s", 10.0, 16.0, "{:.1f}")
    link: bool = False
    alarm: tuple[str, ...] = ("error", "warning")
    fixed_rank: int | None = None
    lowest_rank: int = 0
    extra: tuple[str, ...] = ()

    @property
    def faulted(self) -> bool:
        return bool(self.kinds)


# What each class is and what is expected. Rows whose scenario this lab does not have (yet) are
# left out by ``classes()``; they join once their scenario is in tests.lab.scenarios.SCENARIOS.
ROWS = (
    FaultClass("clean", "clean", ALL_REGIMES, (), timing=None, watch_timing=None, extra=("--steps", "300")),
    FaultClass("loss", "loss", RUNNING_REGIMES, ("network_loss",), strength=("--loss-permille", 20, 80, "{:.0f}"),
               link=True),
    FaultClass("slow-link", "slow-link", RUNNING_REGIMES, ("slow_link",), strength=("--rate", 20, 60, "{:.0f}mbit"),
               link=True),
    FaultClass("straggler", "straggler", RUNNING_REGIMES, ("straggler",),
               strength=("--straggle-ms", 150, 400, "{:.0f}")),
    # the rank that skipped collective #AT_OP (≈75 ops a second with SMALL on an idle machine)
    FaultClass("mismatch-hang", "mismatch-hang", HANG_REGIMES, ("hang_mismatch",), timing=("--at-op", 4, 300, "{:.0f}"),
               watch_timing=("--at-op", 750, 1200, "{:.0f}")),
    FaultClass("link-down-hang", "link-down-hang", HANG_REGIMES, ("hang_stuck",), link=True),
    FaultClass("gpu-hang", "gpu-hang", HANG_REGIMES, ("hang_stuck",)),
    # the faulted rank's host resets its ring predecessor's connection: both ends are the link
    FaultClass("reset", "reset", HANG_REGIMES, ("connection_reset",), link=True),
    # one rank never joins init (or its bootstrap port is dropped): init_failure, or a hang of
    # init, naming the rank that is missing; no collective ever ran, so no timing knob
    FaultClass("init-hang", "init-hang", ("before", "onset", "stagger", "logs"), ("init_failure", "init_hang"),
               timing=None, watch_timing=None),
    # (the rank cut from the bootstrap root, which lives in rank 0's process: never rank 0)
    FaultClass("init-hang-dropped", "init-hang-dropped", ("before", "onset", "stagger", "logs"),
               ("init_failure", "init_hang"), timing=None, watch_timing=None, lowest_rank=1),
    # SIGKILL mid-collective: the process that died, on the killed rank, before its peers' timeouts
    FaultClass("rank-killed", "rank-killed", ALL_REGIMES, ("process_exit",)),
    # a link down for seconds, then up: the link's stall, named at its ends
    FaultClass("link-flap", "link-flap", RUNNING_REGIMES, ("link_flap", "network_loss", "hang_stuck"), link=True,
               strength=("--down-s", 2, 10, "{:.1f}")),
    # a rank starved of CPU by its cgroup: a straggler whose cause is its host, naming the rank
    FaultClass("cpu-starved", "cpu-starved", RUNNING_REGIMES, ("straggler", "cpu_starved", "host_starved"),
               strength=("--cpu-quota", 4, 10, "{:.0f}%")),
    # a rank stuck in host code before it enqueues (a busy loop on a CPU; blocked in read(2) of a
    # pipe): the never-enqueued side, naming the rank and what it was doing (layer host). The logs
    # alone hold nothing of the rank's threads: there the rank that never entered is all there is
    FaultClass("host-stuck", "host-stuck", CAPTURED + ("watch",), ("hang_host",), extra=("--stuck-mode", "spin")),
    FaultClass("host-stuck-block", "host-stuck", CAPTURED + ("watch",), ("hang_host",),
               extra=("--stuck-mode", "block")),
    FaultClass("host-stuck-logs", "host-stuck", ("logs",), ("hang_mismatch", "hang_host")),
    # rank 0 busy outside NCCL while the others wait: nothing to find; an error is a false alarm
    # (a warning naming rank 0 as the one everybody waits for is allowed)
    FaultClass("slow-checkpoint", "slow-checkpoint", ALL_REGIMES, (), alarm=("error",), fixed_rank=0),
)


def classes() -> dict[str, FaultClass]:
    """The rows whose scenario exists in this lab, by name."""
    return {c.name: c for c in ROWS if c.scenario in SCENARIOS}


@dataclass(frozen=True)
class Case:
    """One drawn case: everything needed to run it again (``lab_args``)."""
    index: int
    cls: str
    regime: str
    ranks: int
    rank: int
    strength: str | None
    timing: str | None
    offset_s: float | None
    stagger: str | None
    seed: int
    lab_args: tuple[str, ...]


def _pick(rng: random.Random, spec: tuple[str, float, float, str] | None) -> str | None:
    if spec is None:
        return None
    _, lo, hi, fmt = spec
    return fmt.format(rng.uniform(lo, hi))


def lab_args(c: FaultClass, regime: str, ranks: int, rank: int, strength: str | None, timing: str | None,
             offset_s: float | None, stagger: str | None, seed: int) -> list[str]:
    """The launcher's arguments for one case (without --build and --out)."""
    a = ["--scenario", c.scenario, "--ranks", str(ranks), "--rank", str(rank), "--seed", str(seed), *SMALL, *c.extra]
    if strength is not None:
        a += [c.strength[0], strength]
    tspec = c.watch_timing if regime == "watch" else c.timing
    if timing is not None and tspec is not None:
        a += [tspec[0], timing]
    if regime in CAPTURED:
        start = "before" if regime == "before" else f"onset+{offset_s:g}"
        # before: the capture must cover init, the fault and some of its hang
        dur = 15.0 + (float(timing) if regime == "before" and timing and tspec[0] == "--start-s" else 5.0)
        a += ["--capture", "per-host", "--capture-start", start, "--capture-stagger-s", stagger or "0",
              "--capture-duration-s", f"{dur:g}"]
    elif regime == "watch" and c.scenario in HOLDS:
        a += ["--hold-s", f"{WATCH_HOLD_S:g}"]
    elif regime == "logs" and c.scenario in HOLDS:
        # what a hung job's logs hold once it died: its watchdog's timeout (PyTorch's, 10 min by
        # default; here 5 s) fired inside the hold, with its SeqNums and Flight Recorder dump
        a += ["--watchdog-timeout-s", "5", "--hold-s", "12"]
    return a


def pairs(table: dict[str, FaultClass], regimes: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(c.name, r) for c in table.values() for r in c.regimes if r in regimes]


def draw(seed: int, n: int, table: dict[str, FaultClass], regimes: tuple[str, ...]) -> list[Case]:
    """``n`` cases from ``seed`` (the same seed and arguments, the same cases). The (class,
    regime) pairs are dealt in rounds: each round takes one pair per class in turn (classes and
    each class's regimes in a shuffled order) until every pair was dealt once, so any n covers
    min(n, #classes) classes and n >= #pairs covers every pair; then the world size (2-8), the
    faulted rank, the strength, the timing and the capture offset/stagger are drawn."""
    rng = random.Random(seed)
    todo = pairs(table, regimes)
    if not todo:
        return []
    deal: list[tuple[str, str]] = []
    while len(deal) < n:
        by_class: dict[str, list[str]] = {}
        for cname, r in todo:
            by_class.setdefault(cname, []).append(r)
        names = sorted(by_class)
        rng.shuffle(names)
        for rs in by_class.values():
            rng.shuffle(rs)
        while any(by_class.values()):
            for cname in names:
                if by_class[cname]:
                    deal.append((cname, by_class[cname].pop()))
    out = []
    for i, (cname, regime) in enumerate(deal[:n]):
        c = table[cname]
        ranks = rng.randint(2, 8)
        rank = c.fixed_rank if c.fixed_rank is not None else rng.randrange(min(c.lowest_rank, ranks - 1), ranks)
        strength = _pick(rng, c.strength)
        timing = _pick(rng, c.watch_timing if regime == "watch" else c.timing)
        offset = round(rng.uniform(2, 10), 1) if regime in ("onset", "stagger") else None
        stagger = None
        if regime == "stagger":
            lo = round(rng.uniform(1, 3), 1)
            stagger = f"{lo:g}-{lo + round(rng.uniform(1, 4), 1):g}"
        case_seed = rng.randrange(1 << 30)
        out.append(Case(i, cname, regime, ranks, rank, strength, timing, offset, stagger, case_seed,
                        tuple(lab_args(c, regime, ranks, rank, strength, timing, offset, stagger, case_seed))))
    return out


# ------------------------------------------------------------------ running a case

@dataclass
class CaseResult:
    """A case as run: ``status`` ok or lab_error (``error`` says why); the truth's parts the
    scoring reads; the findings (kind, severity, ranks, peer_ranks, links), in the analysis's
    order; the seconds from the fault's onset to the verdict (None: no verdict, or no fault)."""
    case: dict
    status: str = "ok"
    error: str = ""
    truth: dict = field(default_factory=dict)
    findings: list[dict] = field(default_factory=list)
    analyze_rc: int | None = None
    inputs: int = 0
    to_verdict_s: float | None = None
    wall_s: float = 0.0
    note: str = ""                 # the watcher: how many bundles it wrote, how many of this job


def _truth_part(t: dict) -> dict:
    f = t.get("fault") or {}
    return {"fault": {k: f.get(k) for k in ("kind", "ranks", "link", "peer_rank", "start_time_ns")},
            "ranks": [{k: r.get(k) for k in ("rank", "addr", "host")} for r in t.get("ranks") or []],
            "world_size": t.get("world_size"), "onset_ns": t.get("onset_ns")}


def _launch(argv: list[str], timeout_s: float) -> tuple[int, str]:
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.terminate()                  # the launcher tears its namespaces down on SIGTERM
        _, err = p.communicate(timeout=180)
        return 124, err
    return p.returncode, err


def analyze(inputs: list[Path], where: Path) -> tuple[int, list[dict], float]:
    """``stallscope analyze INPUTS --json``: its exit code, the findings, the wall seconds."""
    js = where / "findings.json"
    t0 = time.monotonic()
    p = subprocess.run([PY, "-m", "forensics", "analyze", *map(str, inputs), "--json", str(js), "-o",
                        str(where / "report.html"), "--force", "-q"], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode not in (0, 1) or not js.exists():
        return p.returncode, [], wall
    keep = ("kind", "severity", "ranks", "peer_ranks", "links", "headline")
    return p.returncode, [{k: f.get(k) for k in keep} for f in json.loads(js.read_text()).get("findings") or []], wall


def own_bundles(bundles: list[Path], truth: dict) -> tuple[list[Path], str]:
    """The watcher's bundles of this job (a trigger, first or later, names one of its ranks'
    pids, or names no pid), and why they cannot be scored ("" when they can): the watcher sees
    every NCCL job of the machine, and a bundle that also holds another job's ranks (another
    lab run on a shared machine) is judged on both (README "Limits")."""
    pids = {r.get("pid") for r in truth.get("ranks") or []} - {None}
    keep, foreign = [], set()
    for b in bundles:
        try:
            with tarfile.open(b) as t:
                name = next(n for n in t.getnames() if n.endswith("/manifest.json"))
                m = json.load(t.extractfile(name))
        except (OSError, StopIteration, tarfile.TarError, ValueError):
            keep.append(b)            # unreadable here: analyze says what is wrong with it
            continue
        trig = m.get("trigger") or {}
        named = set(trig.get("pids") or []) | {p for x in trig.get("also") or [] for p in x.get("pids") or []}
        if named and not pids & named:
            continue
        keep.append(b)
        foreign |= {p["pid"] for p in m.get("processes") or [] if p.get("rank") is not None
                    and "nccl-env" in (p.get("job_reasons") or []) and p.get("pid") not in pids}
    why = f"the bundle also holds another job's ranks (pids {sorted(foreign)[:6]}): a shared machine" if foreign else ""
    return keep, why


def evidence_of(regime: str, folder: Path, truth: dict) -> list[Path]:
    """What a case of ``regime`` analyses, in its kept ``folder`` (``--keep``'s case-NNN)."""
    if regime in CAPTURED:
        return sorted((folder / "lab").glob("bundles/*/*.tar.gz"))
    if regime == "watch":
        return own_bundles(sorted((folder / "bundles").glob("stallscope-*.tar.gz")), truth)[0]
    return [folder / "lab" / "logs"]


def rescore(cases_json: Path, keep: Path) -> tuple[dict, list[dict]]:
    """(the earlier campaign's document, its cases analysed again): each case the lab ran, its
    kept evidence (:func:`evidence_of`) analysed by the analyzer as it is now, its findings and
    exit code replaced (its timing kept: the lab's, not this run's). The new reports go to
    ``case-NNN/rescore/``; nothing the campaign kept is overwritten."""
    doc = json.loads(cases_json.read_text())
    out = []
    for r in doc["cases"]:
        r = dict(r)
        folder = keep / f"case-{r['case']['index']:03d}"
        if r.get("status") == "ok" and folder.is_dir():
            where = folder / "rescore"
            where.mkdir(exist_ok=True)
            sj = folder / "lab" / "scenario.json"
            truth = json.loads(sj.read_text()) if sj.exists() else {}
            inputs = evidence_of(r["case"]["regime"], folder, truth)
            if inputs:
                r["analyze_rc"], r["findings"], _ = analyze(inputs, where)
        out.append(r)
    return doc, out


def run_case(case: Case, build: Path, work: Path) -> CaseResult:
    """Run one case in the lab and analyse what its regime leaves."""
    from tests.lab.watcher import WatcherError, start_watcher, stop_watcher
    res = CaseResult(case=asdict(case))
    t0 = time.monotonic()
    out = work / f"case-{case.index:03d}"
    out.mkdir(parents=True, exist_ok=True)
    watcher = None
    if case.regime == "watch":
        (out / "bundles").mkdir(exist_ok=True)
        try:
            watcher = start_watcher(out / "bundles", WATCH_ARGS, out / "watch.err")
        except WatcherError as e:
            res.status, res.error = "lab_error", "the watcher did not start: " + str(e).strip().splitlines()[-1]
            return res
    try:
        rc, err = _launch([PY, "-m", "tests.lab.launcher", "--build", str(build), "--out", str(out / "lab"),
                           *case.lab_args], CASE_TIMEOUT_S)
        if watcher is not None:
            time.sleep(3)              # a bundle cut --after the trigger is renamed into place by now
    finally:
        if watcher is not None:
            stop_watcher(watcher)
    sj = out / "lab" / "scenario.json"
    if rc != 0 or not sj.exists():
        res.status, res.error = "lab_error", f"launcher rc {rc}: {err.strip().splitlines()[-1:] or ''}"
        res.wall_s = round(time.monotonic() - t0, 1)
        return res
    truth = json.loads(sj.read_text())
    res.truth = _truth_part(truth)
    onset = truth.get("onset_ns") or 0
    if case.regime in CAPTURED:
        caps = truth.get("captures") or []
        inputs = sorted((out / "lab").glob("bundles/*/*.tar.gz"))
        failed = [c["rank"] for c in caps if not c.get("ok")]
        if failed or len(inputs) != truth.get("world_size"):
            res.status = "lab_error"
            first = next((c for c in caps if not c.get("ok")), {})
            why = (first.get("error") or (first.get("stderr_tail") or "").strip().splitlines()[-1:] or "")
            res.error = (f"capture failed on ranks {failed} ({len(inputs)} bundles of {truth.get('world_size')}): "
                         f"{str(why)[:200]}")
            res.wall_s = round(time.monotonic() - t0, 1)
            return res
        ready_ns = max(c["stopped_ns"] for c in caps)
    elif case.regime == "watch":
        written = sorted((out / "bundles").glob("stallscope-*.tar.gz"))
        inputs, why = own_bundles(written, truth)
        res.note = f"the watcher wrote {len(written)} bundle(s), {len(inputs)} of this job"
        if why:
            res.status, res.error = "lab_error", why
            res.wall_s = round(time.monotonic() - t0, 1)
            return res
        ready_ns = min((p.stat().st_mtime_ns for p in inputs), default=None)
    else:
        inputs = [out / "lab" / "logs"]
        ready_ns = truth.get("job_ended_ns") or truth.get("ended_ns")
    res.inputs = len(inputs)
    if inputs:
        res.analyze_rc, res.findings, wall = analyze(inputs, out)
        if res.analyze_rc in (0, 1) and ready_ns and onset:
            res.to_verdict_s = round((ready_ns - onset) / 1e9 + wall, 2)
    res.wall_s = round(time.monotonic() - t0, 1)
    return res


# ------------------------------------------------------------------ scoring

@dataclass(frozen=True)
class Judged:
    """One case scored. ``right``: None for a lab error (counted apart); for a faulted class,
    the top serious finding has an expected kind and names the faulted rank(s); for a run with
    nothing to find, no finding of an ``alarm`` severity. ``predicted``: the top serious
    finding's kind, ``none`` (no warning or error), ``analyze-error`` (stallscope failed) or
    ``lab-error``. ``link_ok``: the faulted link's ends named (None: no link to name).
    ``false_alarm``: None unless the class has nothing to find."""
    cls: str
    regime: str
    predicted: str
    right: bool | None
    kind_ok: bool | None = None
    link_ok: bool | None = None
    false_alarm: bool | None = None


def judge(r: dict, table: dict[str, FaultClass] | None = None) -> Judged:
    """Score one case (a :class:`CaseResult` as a dict, as --out writes it) against its truth."""
    table = table or {c.name: c for c in ROWS}
    case = r["case"]
    c = table[case["cls"]]
    if r["status"] != "ok":
        return Judged(c.name, case["regime"], "lab-error", None)
    if r.get("analyze_rc") not in (None, 0, 1):
        fa = True if not c.faulted else None      # a failed analysis is never a clean bill of health
        return Judged(c.name, case["regime"], "analyze-error", False, False, False if c.link else None, fa)
    top = next(iter(serious(r["findings"])), None)
    predicted = ffield(top, "kind") if top is not None else "none"
    if not c.faulted:
        alarm = any(ffield(f, "severity") in c.alarm for f in r["findings"])
        return Judged(c.name, case["regime"], predicted, not alarm, false_alarm=alarm)
    truth = r["truth"]
    kind_ok = top is not None and predicted in c.kinds
    right = kind_ok and names_fault(top, truth, c.link)
    link_ok = None
    if c.link and link_ends(truth):
        link_ok = top is not None and names_link(top, truth)
    return Judged(c.name, case["regime"], predicted, right, kind_ok, link_ok)


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(0.9 * len(xs) + 0.5)) - 1))]


@dataclass
class Score:
    """The campaign's figures. Tallies are [right, scored] (lab errors not scored)."""
    confusion: dict[str, dict[str, int]]
    per_class: dict[str, list[int]]
    per_regime: dict[str, list[int]]
    per_pair: dict[str, list[int]]
    top1: list[int]
    link: list[int]
    false_alarms: dict[str, list[int]]          # class -> [alarms, scored]
    lab_errors: list[str]
    to_verdict_median_s: float | None
    to_verdict_p90_s: float | None


def score(results: list[dict], table: dict[str, FaultClass] | None = None) -> Score:
    """The figures of a campaign's case results (dicts, as --out writes them)."""
    s = Score({}, {}, {}, {}, [0, 0], [0, 0], {}, [], None, None)
    ttv = []
    for r in results:
        j = judge(r, table)
        if j.right is None:
            s.lab_errors.append(f"case {r['case']['index']} {j.cls}/{j.regime}: {r.get('error', '')}")
            continue
        s.confusion.setdefault(j.cls, {}).setdefault(j.predicted, 0)
        s.confusion[j.cls][j.predicted] += 1
        for tally in (s.per_class.setdefault(j.cls, [0, 0]), s.per_regime.setdefault(j.regime, [0, 0]),
                      s.per_pair.setdefault(f"{j.cls}/{j.regime}", [0, 0]), s.top1):
            tally[0] += bool(j.right)
            tally[1] += 1
        if j.link_ok is not None:
            s.link[0] += j.link_ok
            s.link[1] += 1
        if j.false_alarm is not None:
            fa = s.false_alarms.setdefault(j.cls, [0, 0])
            fa[0] += j.false_alarm
            fa[1] += 1
        if j.right and j.false_alarm is None and r.get("to_verdict_s") is not None:
            ttv.append(r["to_verdict_s"])
    if ttv:
        s.to_verdict_median_s, s.to_verdict_p90_s = round(statistics.median(ttv), 1), round(p90(ttv), 1)
    return s


def _pct(t: list[int]) -> str:
    return f"{t[0]}/{t[1]} ({100 * t[0] / t[1]:.0f}%)" if t[1] else "-"


def report(s: Score, seed: int, command: str, n_cases: int) -> str:
    """The campaign's figures as text."""
    lines = [f"accuracy campaign: {n_cases} cases, seed {seed}", f"command: {command}", ""]
    cols = sorted({k for row in s.confusion.values() for k in row})
    w = max([len(c) for c in s.confusion] + [10])
    lines.append("confusion (true class x top serious finding kind):")
    lines.append(" " * (w + 2) + "  ".join(f"{c:>{max(4, len(c))}}" for c in cols))
    for cls in sorted(s.confusion):
        lines.append(f"  {cls:<{w}}" + "  ".join(f"{s.confusion[cls].get(c, 0):>{max(4, len(c))}}" for c in cols))
    lines += ["", f"top-1 (kind and rank of the top serious finding; no alarm where nothing is to find): "
                  f"{_pct(s.top1)}"]
    lines.append("  per class:  " + ", ".join(f"{k} {_pct(v)}" for k, v in sorted(s.per_class.items())))
    lines.append("  per regime: " + ", ".join(f"{k} {_pct(v)}" for k, v in sorted(s.per_regime.items())))
    lines.append("  per pair:   " + ", ".join(f"{k} {_pct(v)}" for k, v in sorted(s.per_pair.items())))
    lines.append(f"link ends right: {_pct(s.link)}")
    lines.append("false alarms: " + (", ".join(f"{k} {v[0]} of {v[1]}" for k, v in sorted(s.false_alarms.items()))
                                     or "no case with nothing to find"))
    ttv = (f"median {s.to_verdict_median_s} s, p90 {s.to_verdict_p90_s} s" if s.to_verdict_median_s is not None
           else "-")
    lines.append(f"time to verdict (onset -> evidence complete + analysis, right verdicts): {ttv}")
    lines.append(f"lab errors (not scored): {len(s.lab_errors)}")
    lines += [f"  {e}" for e in s.lab_errors]
    return "\n".join(lines)


# ------------------------------------------------------------------ command line

def _names(text: str | None, known: tuple[str, ...] | list[str], what: str, also: tuple[str, ...] = ()) -> list[str]:
    if not text:
        return list(known)
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad:
        hint = f" ({', '.join(b for b in bad if b in also)} not in this lab yet)" if any(b in also for b in bad) else ""
        raise SystemExit(f"bench/accuracy.py: unknown {what} {', '.join(bad)}{hint}; known: {', '.join(known)}")
    return names


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/accuracy.py", description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=None, help="cases to run (default 100)")
    ap.add_argument("--quick", action="store_true", help="20 cases")
    ap.add_argument("--seed", type=int, default=None, help="seed of the draw (default: random, printed)")
    ap.add_argument("--classes", help="comma-separated fault classes (default: every class this lab has)")
    ap.add_argument("--regimes", help=f"comma-separated regimes (default: {','.join(REGIMES)})")
    ap.add_argument("--plan", action="store_true", help="print the drawn cases, run nothing")
    ap.add_argument("--out", help="write every case (and the figures) as JSON, after each case")
    ap.add_argument("--keep", help="keep each case's lab output and bundles in this folder")
    ap.add_argument("--rescore", metavar="CASES_JSON",
                    help="analyse again the evidence an earlier campaign kept (its --out, with its --keep folder)")
    a = ap.parse_args(argv)
    if a.cases is not None and a.cases < 1:
        ap.error("--cases must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    table = classes()
    if a.rescore:
        if not a.keep:
            raise SystemExit("bench/accuracy.py: --rescore needs the campaign's --keep folder")
        doc, results = rescore(Path(a.rescore), Path(a.keep))
        for r in results:
            j = judge(r, table)
            c = r["case"]
            print(f"case {c['index']:3d} {c['cls']:15s} {c['regime']:8s}: "
                  f"{ {None: 'LAB-ERROR', True: 'right', False: 'WRONG'}[j.right]:9s} top={j.predicted}"
                  f" link={j.link_ok}", flush=True)
        if a.out:
            _write(a.out, doc["seed"], f"{doc['command']} (re-scored)", results, table)
        print()
        print(report(score(results, table), doc["seed"], f"{doc['command']}, evidence re-analysed: "
                     f"bench/accuracy.py --rescore {a.rescore} --keep {a.keep}", len(results)))
        return 0
    chosen = _names(a.classes, list(table), "class", tuple(c.name for c in ROWS))
    regimes = tuple(_names(a.regimes, REGIMES, "regime"))
    table = {k: v for k, v in table.items() if k in chosen}
    n = a.cases or (20 if a.quick else 100)
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    command = " ".join(shlex.quote(x) for x in ["bench/accuracy.py", *(sys.argv[1:] if argv is None else argv)])
    if a.seed is None:
        command += f" (seed drawn: --seed {seed})"
    cases = draw(seed, n, table, regimes)
    if not cases:
        raise SystemExit("bench/accuracy.py: no (class, regime) pair left to draw from")
    if a.plan:
        print(f"seed {seed}: {len(cases)} cases over {len(pairs(table, regimes))} (class, regime) pairs")
        for c in cases:
            print(f"{c.index:3d} {c.cls:15s} {c.regime:8s} " + " ".join(shlex.quote(x) for x in c.lab_args))
        return 0
    if os.geteuid() != 0 or not shutil.which("bpftrace"):
        raise SystemExit("bench/accuracy.py: needs root and bpftrace (the lab's namespaces, the captures' tracer)")
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="stallscope-accuracy-"))
    work.mkdir(parents=True, exist_ok=True)
    build = work / "build"
    p = subprocess.run(["make", "-C", str(LAB), "all", f"BUILD={build}"], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("bench/accuracy.py: the lab did not build:\n" + (p.stdout + p.stderr)[-2000:])
    from tests.lab import netns
    netns.sweep()
    results: list[dict] = []
    try:
        for c in cases:
            r = asdict(run_case(c, build, work))
            results.append(r)
            j = judge(r, table)
            mark = {None: "LAB-ERROR", True: "right", False: "WRONG"}[j.right]
            print(f"case {c.index:3d} {c.cls:15s} {c.regime:8s} n={c.ranks} r={c.rank}: {mark:9s} top={j.predicted}"
                  f" link={j.link_ok} ttv={r['to_verdict_s']} ({r['wall_s']} s){' ' + r['error'] if r['error'] else ''}"
                  f"{' (' + r['note'] + ')' if r['note'] else ''}",
                  flush=True)
            if a.out:
                _write(a.out, seed, command, results, table)
            if not a.keep:
                shutil.rmtree(work / f"case-{c.index:03d}", ignore_errors=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(report(score(results, table), seed, command, len(results)))
    return 0


def _write(path: str, seed: int, command: str, results: list[dict], table: dict[str, FaultClass]) -> None:
    s = score(results, table)
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps({"seed": seed, "command": command, "score": asdict(s), "cases": results}, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
