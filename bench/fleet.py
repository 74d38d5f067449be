"""``stallscope analyze`` at fleet scale: 8 to 64 host bundles, 8 ranks and 1M packets each.

    python bench/fleet.py [--hosts 8,16,32,64] [--ranks-per-host 8] [--packets 1000000]
                          [--jobs 1,2] [--repeat 3] [--keep DIR]

The bundles are synthesised as bench/analyze.py does (the shipped loss bundle's ranks
replicated, one ring capture of ``--packets`` packets per host; here every host's capture
comes from one generated packet stream, readdressed to its own ranks, so 64 hosts cost one
generation). For each host count, the whole command ``stallscope analyze --jobs J -o
report.html`` runs ``--repeat`` times per ``--jobs`` value, the values taking turns (1, 2,
1, 2, ...) on the same bundles, so that a machine whose speed drifts (a shared VM's does, by
up to 30% within minutes) slows both alike; the benchmark prints:

* wall time, the median of the runs (interpreter start-up, imports, model, findings and the
  report included, until the command exits) and the time per host (flat from 8 to 64 hosts
  means the merge does not grow faster than the hosts);
* the speed-up of each ``--jobs`` over ``--jobs 1`` on the same bundles: the ratio of the
  medians, and the range of the ratios of the runs taken side by side;
* CPU seconds (user and system, the command and the processes it waited for: its workers,
  its forked helper) and the cores kept busy (CPU over wall): the speed-up of ``--jobs 2`` is
  the ratio of the CPU work of the two modes times the ratio of their cores busy, printed
  for each host count with its ceiling (both cores busy from start to exit), so that a miss
  says whether the second process adds work or leaves a core idle;
* peak memory: the largest sum of the resident sets of the command and its workers,
  sampled every 100 ms (``ru_maxrss`` alone would miss the workers running together);
* the report's size;
* the machine's own ceiling, a round after each turn of the runs, on the same bundles: the
  per-host stage (two hosts, after a warm-up host) read by one process alone and by two at
  once: twice the work in the slower one's time is the most that two processes can give on
  this machine before anything ``--jobs 2`` itself costs (a VM's two cores need not each run
  at one's speed: shared caches, the host's load, its page faults); each speed-up is also
  printed as a share of it, so that a miss says whether the code or the machine stops it
  (``--no-ceiling``: not measured).

The analyzer's bytecode is compiled first (``compileall``), as an installed copy has it: with
PYTHONDONTWRITEBYTECODE set, each command would otherwise compile it anew.

Targets (issue 14), checked at the end: the per-host cost grows by at most 20% from the
smallest to the largest host count (it may fall: start-up is a fixed cost); ``--jobs 2`` at least 1.8x ``--jobs 1``; 64 hosts under 90 s with
``--jobs 2``; peak memory under 4 GiB. Exit code 1 when a target is missed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
import analyze as bench_analyze  # noqa: E402

FLAT_WITHIN = 0.20
SPEEDUP_2 = 1.8
WALL_64_S = 90.0
PEAK_BYTES = 4 * 2**30
PAGE = os.sysconf("SC_PAGE_SIZE")


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _private(pid: int) -> int:
    """The pages only ``pid`` holds (a fork's own pages; those it shares copy-on-write with its
    parent are counted there)."""
    total = 0
    for line in _read(f"/proc/{pid}/smaps_rollup").splitlines():
        if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (the command, its workers, the forked
    process that makes the report's tables beside the detectors; a fork server and its workers
    where the workers are not forked from the command), read from /proc/PID/task/*/children: a
    few files, not a scan of /proc, so the sampler itself stays near 1% of a core. A plain fork
    of the command (its child, same command line: its workers, its helper) shares the
    command's pages: only its private ones count (smaps_rollup, read for that one process
    only), or the imports and the model would be counted twice. A fork server's workers count
    whole."""
    total, todo = 0, [(pid, None)]
    cmdlines: dict[int, bytes] = {}
    while todo:
        p, parent = todo.pop()
        try:
            cmdlines[p] = _read(f"/proc/{p}/cmdline")
            if parent == pid and cmdlines[p] == cmdlines[pid]:
                total += _private(p)
            else:
                total += int(_read(f"/proc/{p}/statm").split()[1]) * PAGE
            for t in os.listdir(f"/proc/{p}/task"):
                todo += [(int(c), p) for c in _read(f"/proc/{p}/task/{t}/children").split()]
        except (OSError, ValueError):
            continue
    return total


def run(cmd: list[str]) -> tuple[float, int, float]:
    """(wall seconds, peak resident bytes of the process tree, CPU seconds) of one command: the
    wall time from its start to its exit as the shell sees it (``wait``, not the memory
    sampler's 100 ms ticks), the memory sampled on a thread meanwhile, the CPU time (user and
    system) of the command and of every process it waited for (its forked workers, the
    process that makes the report's tables): ``wait4``'s resource usage."""
    err_file = tempfile.TemporaryFile()   # not a pipe: its end is when the command's helpers close it too
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True)
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            peak[0] = max(peak[0], tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        done.set()
        sampler.join()
    with err_file:
        err_file.seek(0)
        err = err_file.read().decode(errors="replace")
    if proc.returncode not in (0, 1):      # 1: the analysis found an error (the lossy bundle: expected)
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-1500:]}")
    return wall, peak[0], usage.ru_utime + usage.ru_stime


# one reader of the per-host stage: warmed up on its first bundle (imports done, heap grown, as
# a worker is after its first host), then, on a line from the bench, it times the rest
READER = """
import sys, time
from forensics.execution import memory
memory.keep_freed_memory()
from forensics.model.hosts import read_host
read_host(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
t = time.perf_counter()
for p in sys.argv[2:]:
    read_host(p)
print(f"{time.perf_counter() - t:.6f}", flush=True)
"""


def readers_at_once(groups: list[list[Path]]) -> list[float]:
    """Seconds each of ``len(groups)`` warmed-up readers took for its bundles after the first,
    all started together (:data:`READER`)."""
    procs = [subprocess.Popen([sys.executable, "-c", READER, *map(str, g)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for g in groups]

    def said(i: int) -> str:
        line = procs[i].stdout.readline().strip()
        if not line:      # it ended: its error is on stderr
            raise SystemExit(f"a reader failed on {', '.join(map(str, groups[i]))}")
        return line

    try:
        for i in range(len(procs)):
            if said(i) != "ready":
                raise SystemExit(f"a reader said {said(i)!r}, not ready")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        times = [float(said(i)) for i in range(len(procs))]
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:
            p.wait()
    return times


def ceiling_round(bundles: list[Path]) -> tuple[float, float]:
    """One round of the machine's ceiling: (one reader's seconds alone, the slower of two
    readers' seconds at once) for the same work, two hosts a reader after a warm-up host. Twice
    the work in the pair's time, over the lone reader's, is the most that two processes can give
    the per-host stage on this machine, apart from anything ``--jobs 2`` itself costs (a
    worker's imports and warm-up, the parts passed back, the serial merge and report): two
    processes on a VM's two cores need not each run at one's speed (shared caches, the host's
    own load and clocks, its page faults)."""
    if len(bundles) < 6:
        raise SystemExit("the machine's ceiling needs at least 6 host bundles")
    alone = readers_at_once([bundles[0:3]])[0]
    return alone, max(readers_at_once([bundles[0:3], bundles[3:6]]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="8,16,32,64", help="host counts, comma-separated")
    ap.add_argument("--ranks-per-host", type=int, default=8)
    ap.add_argument("--packets", type=int, default=1_000_000, help="packets per host")
    ap.add_argument("--jobs", default="1,2", help="--jobs values, comma-separated (the first is the baseline)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per --jobs value, taking turns (default 3)")
    ap.add_argument("--keep", type=Path, help="keep the bundles and reports here")
    ap.add_argument("--no-ceiling", action="store_true",
                    help="do not measure the machine's two-reader ceiling beside the runs")
    a = ap.parse_args()
    host_counts = [int(x) for x in a.hosts.split(",")]
    jobs = [int(x) for x in a.jobs.split(",")]
    src = next((ROOT / "tests" / "fixtures" / "bundles" / "loss").glob("*.tar.gz"))
    base = a.keep or Path(tempfile.mkdtemp(prefix="stallscope-bench-fleet-"))
    base.mkdir(parents=True, exist_ok=True)
    # the analyzer's bytecode cached, as in an installed copy (pip compiles it; an editable
    # install writes it on its first run): where PYTHONDONTWRITEBYTECODE is set, as on this
    # lab's machines, every command would compile it again (~0.3 s of start-up, in both modes)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "forensics", "capture"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    results: dict[tuple[int, int], tuple[float, int, int, float]] = {}   # (hosts, jobs): median wall, peak, size, CPU
    ceilings: dict[int, float] = {}      # hosts: the machine's two-reader ceiling, beside its runs
    print(f"fleet: {a.ranks_per_host} ranks and {a.packets:,} packets per host; --jobs {jobs}; "
          f"{os.cpu_count()} cores")
    print(f"{'hosts':>5} {'ranks':>5} {'jobs':>4} {'wall s':>8} {'s/host':>7} {'speed-up':>8} "
          f"{'side by side':>11} {'CPU s':>7} {'busy':>5} {'peak MiB':>9} {'report MB':>9}")
    try:
        for h in host_counts:
            d = base / f"hosts{h}"
            if d.exists():
                shutil.rmtree(d)
            d.mkdir()
            bundles = bench_analyze.build(src, d, h * a.ranks_per_host, a.packets, h, same_packets=True)
            walls: dict[int, list[float]] = {j: [] for j in jobs}
            cpus: dict[int, list[float]] = {j: [] for j in jobs}
            peaks: dict[int, int] = {j: 0 for j in jobs}
            rounds: list[tuple[float, float]] = []
            for _ in range(max(1, a.repeat)):
                for j in jobs:
                    cmd = [sys.executable, "-m", "forensics", "analyze", *map(str, bundles), "-o",
                           str(d / f"report-j{j}.html"), "--force", "-q", "--jobs", str(j)]
                    wall, peak, cpu = run(cmd)
                    walls[j].append(wall)
                    cpus[j].append(cpu)
                    peaks[j] = max(peaks[j], peak)
                if not a.no_ceiling:
                    rounds.append(ceiling_round(bundles))
            for j in jobs:
                wall, cpu = statistics.median(walls[j]), statistics.median(cpus[j])
                size = (d / f"report-j{j}.html").stat().st_size
                results[(h, j)] = (wall, peaks[j], size, cpu)
                ratios = [b / w for b, w in zip(walls[jobs[0]], walls[j])]   # the runs side by side
                speed = results[(h, jobs[0])][0] / wall
                spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if j != jobs[0] else ""
                print(f"{h:>5} {h * a.ranks_per_host:>5} {j:>4} {wall:>8.1f} {wall / h:>7.2f} {speed:>7.2f}x "
                      f"{spread:>11} {cpu:>7.1f} {cpu / wall:>5.2f} {peaks[j] / 2**20:>9.0f} {size / 1e6:>9.2f}",
                      flush=True)
            if rounds:
                alone, pair = (statistics.median(r[k] for r in rounds) for k in (0, 1))
                ceilings[h] = 2 * alone / pair
                print(f"{'':>5} the machine's ceiling beside these runs: {ceilings[h]:.2f}x (two hosts read by one "
                      f"warmed-up reader in {alone:.2f} s, by the slower of two at once in {pair:.2f} s; "
                      f"medians of {len(rounds)})", flush=True)
            if not a.keep:
                shutil.rmtree(d)
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    # the targets
    ok = True
    lo, hi = min(host_counts), max(host_counts)
    for j in jobs:
        per = [results[(h, j)][0] / h for h in host_counts]
        # the per-host cost must not grow with the hosts (a merge or a report that grows faster
        # than them); it falls where a fixed cost (start-up, imports) is spread over more hosts
        growth = max(b / a for i, a in enumerate(per) for b in per[i + 1:]) - 1 if len(per) > 1 else 0.0
        good = growth <= FLAT_WITHIN
        ok &= good
        print(f"--jobs {j}: per-host cost {' -> '.join(f'{p:.2f}' for p in per)} s from {lo} to {hi} hosts "
              f"(grows by at most {max(growth, 0):.0%}, falls by {1 - min(per) / per[0]:.0%}; target: grows by "
              f"at most {FLAT_WITHIN:.0%}: {'OK' if good else 'MISSED'})")
    if 2 in jobs and jobs[0] == 1:
        sp = min(results[(h, 1)][0] / results[(h, 2)][0] for h in host_counts)
        ok &= sp >= SPEEDUP_2
        print(f"--jobs 2 vs --jobs 1 (medians): at least {sp:.2f}x at every host count "
              f"(target {SPEEDUP_2}x: {'OK' if sp >= SPEEDUP_2 else 'MISSED'})")
        for h in host_counts:
            (w1, *_, c1), (w2, *_, c2) = results[(h, 1)], results[(h, 2)]
            print(f"  {h} hosts: {w1 / w2:.2f}x = {c1 / c2:.3f} (CPU work of --jobs 1 over --jobs 2's) "
                  f"x {(c2 / w2) / (c1 / w1):.2f} (cores busy, {c2 / w2:.2f} over {c1 / w1:.2f}); with both "
                  f"cores busy from start to exit, at most {2 * c1 / c2:.2f}x"
                  + (f"; {w1 / w2 / ceilings[h]:.0%} of the machine's two-reader ceiling ({ceilings[h]:.2f}x)"
                     if h in ceilings else ""))
    if (64, 2) in results:
        w = results[(64, 2)][0]
        ok &= w < WALL_64_S
        print(f"64 hosts with --jobs 2: {w:.1f} s (target {WALL_64_S:.0f} s: {'OK' if w < WALL_64_S else 'MISSED'})")
    peak = max(r[1] for r in results.values())
    ok &= peak < PEAK_BYTES
    print(f"peak memory: {peak / 2**30:.2f} GiB (target 4 GiB: {'OK' if peak < PEAK_BYTES else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
