"""Reading job logs: MB/s per core beside ``grep -c NCCL`` on the same file, in one run.

    python bench/logs.py [--shape coll|init] [--mb 512] [--ranks 64] [--runs 3] [--dir /tmp/stallscope-bench-logs]

Builds (once, under --dir) what a big job leaves: every rank's output merged into one file by
the launcher (``srun --label`` tags, NCCL_DEBUG=INFO with a COLL line per collective among
training progress lines), a hang at the end (rank 37 stops launching while the others time
out in PyTorch's watchdog), and the same lines as one file per rank. Then, each tool pinned to
one core and timed end to end as a command, start-up included (the analyzer's bytecode compiled
first, as an installed copy has it), taking turns:

* ``grep -c NCCL`` on the merged file (a lower bound: reading the bytes once);
* the log reading alone: the per-host stage of ``stallscope analyze`` on the merged file
  (``forensics.model.hosts.read_host`` of the loose file, one process): MB/s per core;
* ``stallscope analyze --jobs 1`` on the merged file, end to end: seconds, and whether its
  verdict names the rank that is behind;
* ``stallscope analyze --jobs 2`` on the per-rank files (the files spread over two readers).

Targets (issue 35): >= 100 MB/s per core; the merged 512 MB log analyzed in under 10 s, the
lagging rank named.
"""
from __future__ import annotations

import argparse
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEHIND = 37
TARGET_MBPS, TARGET_S = 100.0, 10.0


def pinned(cmd: list[str]) -> list[str]:
    return (["taskset", "-c", "0"] + cmd) if shutil.which("taskset") else cmd


def generate(folder: Path, mb: int, ranks: int, seed: int = 1) -> tuple[Path, list[Path]]:
    """The merged log (about ``mb`` MiB) and the per-rank files holding the same lines."""
    merged = folder / f"slurm-merged-{mb}mb-{ranks}r.out"
    per_rank = folder / f"per-rank-{mb}mb-{ranks}r"
    if merged.exists() and per_rank.is_dir():
        return merged, sorted(per_rank.iterdir())
    rng = random.Random(seed)
    per_rank.mkdir(parents=True, exist_ok=True)
    hosts = [f"gpu-node{h:03d}" for h in range((ranks + 7) // 8)]
    pids = {r: 31000 + 17 * r for r in range(ranks)}
    comm = {r: f"0x55d4{r:04x}a0c0" for r in range(ranks)}
    files = {r: open(per_rank / f"rank{r:03d}.log", "wb") for r in range(ranks)}
    out = open(merged, "wb")

    def emit(r: int, text: str) -> int:
        data = f"{r}: {text}\n".encode()
        out.write(data)
        files[r].write(data[len(f"{r}: "):])
        return len(data)

    size = 0
    for r in range(ranks):
        h, p = hosts[r // 8], pids[r]
        size += emit(r, f"{h}:{p}:{p} [{r % 8}] NCCL INFO NCCL version 2.21.5+cuda12.4")
        size += emit(r, f"{h}:{p}:{p} [{r % 8}] NCCL INFO ncclCommInitRank comm {comm[r]} rank {r} nranks {ranks} "
                        f"cudaDev {r % 8} nvmlDev {r % 8} busId {r % 8 + 1}8000 commId 0x7d1e2f3a4b5c6d7e - Init COMPLETE")
    target = mb << 20
    op = [0] * ranks
    stop = target - (ranks * 600)
    while size < stop:
        r = rng.randrange(ranks)
        h, p = hosts[r // 8], pids[r]
        if rng.random() < 0.45:
            op[r] += 1
            size += emit(r, f"{h}:{p}:{p + 3} [{r % 8}] NCCL INFO AllReduce: opCount {op[r]:x} sendbuff 0x7f3a4c000000 "
                            f"recvbuff 0x7f3a4c000000 count 1048576 datatype 7 op 0 root 0 comm {comm[r]} "
                            f"[nranks={ranks}] stream 0x55d4a1b2c3d0")
        else:
            size += emit(r, f"Epoch 3:  {rng.randrange(100)}%|#####     | {rng.randrange(10000)}/10000 "
                            f"[12:34<15:20, 5.97it/s, loss={rng.random() * 3:.3f}, grad_norm={rng.random():.4f}]")
    # the hang: every rank but BEHIND launches one more collective and times out in it
    top = max(op)
    seq = 4000 + top
    for r in range(ranks):
        if r == BEHIND % ranks:
            continue
        h, p = hosts[r // 8], pids[r]
        emit(r, f"{h}:{p}:{p + 3} [{r % 8}] NCCL INFO AllReduce: opCount {top + 1:x} sendbuff 0x7f3a4c000000 "
                f"recvbuff 0x7f3a4c000000 count 1048576 datatype 7 op 0 root 0 comm {comm[r]} [nranks={ranks}] "
                f"stream 0x55d4a1b2c3d0")
        emit(r, f"[rank{r}]:[E1128 03:14:{r % 60:02d}.123456789 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
                f"collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1048576, "
                f"NumelOut=1048576, Timeout(ms)=600000) ran for 600{r % 100:03d} milliseconds before timing out.")
    out.close()
    for f in files.values():
        f.close()
    return merged, sorted(per_rank.iterdir())


def init_lines(h: str, p: int, r: int, ranks: int, comm: str, cid: str) -> list[str]:
    """One rank's NCCL_DEBUG=INFO lines for one communicator's creation (NCCL 2.21's shape):
    Init START, topology, rings and trees, every channel's connections, Init COMPLETE."""
    d, pre = r % 8, f"{h}:{p}:{p + 5} [{r % 8}] NCCL INFO "
    nxt, prv = (r + 1) % ranks, (r - 1) % ranks
    out = [f"{pre}Using network IB",
           f"{pre}ncclCommInitRank comm {comm} rank {r} nranks {ranks} cudaDev {d} nvmlDev {d} busId {d + 1}8000 "
           f"commId {cid} - Init START",
           f"{pre}Setting affinity for GPU {d} to ffff,ffffffff",
           f"{pre}comm {comm} rank {r} nRanks {ranks} nNodes {(ranks + 7) // 8} localRanks 8 localRank {d} MNNVL 0"]
    for c in range(16):
        out.append(f"{pre}Channel {c:02d}/16 :    " + " ".join(f"{x:3d}" for x in range(0, min(ranks, 16))))
    out.append(f"{pre}Trees [0] {nxt}/-1/-1->{r}->{prv} [1] {nxt}/-1/-1->{r}->{prv} [2] -1/-1/-1->{r}->{prv}")
    out.append(f"{pre}P2P Chunksize set to 524288")
    for c in range(16):
        via = "NET/IB/0/GDRDMA" if d == 7 else "P2P/IPC/read"
        out.append(f"{pre}Channel {c:02d}/0 : {r}[{d}] -> {nxt}[{nxt % 8}] via {via}")
    out += [f"{pre}Connected all rings", f"{pre}Connected all trees",
            f"{pre}threadThresholds 8/8/64 | 512/8/64 | 512 | 512",
            f"{pre}16 coll channels, 16 collnet channels, 0 nvls channels, 16 p2p channels, 16 p2p channels per peer",
            f"{pre}ncclCommInitRank comm {comm} rank {r} nranks {ranks} cudaDev {d} nvmlDev {d} busId {d + 1}8000 "
            f"commId {cid} - Init COMPLETE",
            f"{pre}Init timings: rank {r} nranks {ranks} total 0.52 (kernels 0.15, alloc 0.01, bootstrap 0.02, "
            f"allgathers 0.00, topo 0.08, graphs 0.00, connections 0.24, rest 0.01)"]
    return out


def generate_init(folder: Path, mb: int, ranks: int, comms: int = 200, seed: int = 1) -> tuple[Path, list[Path]]:
    """A log heavy with INFO init lines: a job that creates ``comms`` communicators (every
    rank's Init, Channel, Ring, Tree and Connected lines), the ranks' lines interleaved as a
    launcher merges them, repeated (a restarted job) up to about ``mb`` MiB; then the same hang
    as :func:`generate` (rank BEHIND never launches the last collective)."""
    merged = folder / f"slurm-init-{mb}mb-{ranks}r.out"
    per_rank = folder / f"per-rank-init-{mb}mb-{ranks}r"
    if merged.exists() and per_rank.is_dir():
        return merged, sorted(per_rank.iterdir())
    rng = random.Random(seed)
    per_rank.mkdir(parents=True, exist_ok=True)
    hosts = [f"gpu-node{h:03d}" for h in range((ranks + 7) // 8)]
    files = {r: open(per_rank / f"rank{r:03d}.log", "wb") for r in range(ranks)}
    size, target = 0, mb << 20
    with open(merged, "wb") as out:
        attempt = 0
        while size < target - ranks * 600:
            for c in range(comms):
                if size >= target - ranks * 600:
                    break
                cid = f"0x{rng.getrandbits(64):016x}"
                blocks = []
                for r in range(ranks):
                    p = 31000 + 17 * r + attempt
                    blocks.append([f"{r}: {ln}\n".encode() for ln in
                                   init_lines(hosts[r // 8], p, r, ranks, f"0x55d4{c:04x}{r:04x}", cid)])
                for i in range(max(len(b) for b in blocks)):       # the ranks' lines interleaved
                    for r, b in enumerate(blocks):
                        if i < len(b):
                            out.write(b[i])
                            files[r].write(b[i][len(f"{r}: "):])
                            size += len(b[i])
            attempt += 1
        seq = 4000
        for r in range(ranks):
            if r == BEHIND % ranks:
                continue
            line = (f"{r}: [rank{r}]:[E1128 03:14:{r % 60:02d}.123456789 ProcessGroupNCCL.cpp:616] [Rank {r}] "
                    f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
                    f"NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600{r % 100:03d} "
                    f"milliseconds before timing out.\n").encode()
            out.write(line)
            files[r].write(line[len(f"{r}: "):])
    for f in files.values():
        f.close()
    return merged, sorted(per_rank.iterdir())


CPU: dict[str, list[float]] = {}      # a command's CPU seconds (its own and its children's), by name


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], name: str = "") -> tuple[float, str]:
    """(wall seconds, output) of ``cmd``; its CPU seconds go to ``CPU[name]``."""
    t0, c0 = time.perf_counter(), _children_cpu()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    dt = time.perf_counter() - t0
    CPU.setdefault(name, []).append(_children_cpu() - c0)
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd[:4])} ...: exit {p.returncode}\n{p.stderr[-2000:]}")
    return dt, p.stdout + p.stderr


READ_ONLY = """
import sys, time
t0, c0 = time.perf_counter(), time.process_time()
from forensics.execution import memory
from forensics.inputs.intake import gather
from forensics.model.hosts import read_host
memory.keep_freed_memory()      # as stallscope analyze sets it for itself
with gather([sys.argv[1]]) as intake:
    part = read_host(intake.sources(1)[0])
print(time.perf_counter() - t0, time.process_time() - c0)
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/stallscope-bench-logs"))
    ap.add_argument("--shape", choices=("coll", "init"), default="coll",
                    help="coll: a COLL line per collective among progress lines; init: a job creating 200 "
                         "communicators (every rank's Init, Channel, Ring, Tree, Connected lines)")
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    merged, per_rank = (generate if a.shape == "coll" else generate_init)(a.dir, a.mb, a.ranks)
    mib = merged.stat().st_size / 2 ** 20
    print(f"inputs: {merged} ({mib:.0f} MiB, {a.ranks} ranks), {len(per_rank)} per-rank files "
          f"(made in {time.perf_counter() - t0:.1f} s)")
    py = sys.executable
    cli = [py, "-m", "forensics"]
    # the analyzer's bytecode cached, as an installed copy has it (bench/fleet.py does the
    # same): where PYTHONDONTWRITEBYTECODE is set, every command would compile the modules
    # changed since their cache was written, on the clock
    subprocess.run([py, "-m", "compileall", "-q", "forensics"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    grep, read, read_cpu, e2e, jobs2 = [], [], [], [], []
    verdict = ""
    subprocess.run(["cat", str(merged)], stdout=subprocess.DEVNULL)      # into the page cache
    for i in range(a.runs):
        grep.append(timed(pinned(["grep", "-c", "NCCL", str(merged)]))[0])
        wall, cpu = timed(pinned([py, "-c", READ_ONLY, str(merged)]))[1].strip().splitlines()[-1].split()
        read.append(float(wall))
        read_cpu.append(float(cpu))      # beside the wall clock: a loaded machine stretches only the latter
        dt, out = timed(pinned(cli + ["analyze", str(merged), "--jobs", "1", "-q", "-o", str(a.dir / "r1.html"),
                                      "--force"]), "e2e")
        e2e.append(dt)
        verdict = next((ln for ln in out.splitlines() if ln.startswith("verdict:")), "")
        jobs2.append(timed(cli + ["analyze", *map(str, per_rank), "--jobs", "2", "-q", "-o", str(a.dir / "r2.html"),
                                  "--force"], "jobs2")[0])
    med = statistics.median
    print(f"\n{'':42s} {'median':>8s} {'MiB/s':>8s}   runs")
    print(f"{'grep -c NCCL (one core)':42s} {med(grep):7.2f}s {mib / med(grep):8.0f}   "
          + " ".join(f"{x:.2f}" for x in grep))
    print(f"{'reading the merged log (one core)':42s} {med(read):7.2f}s {mib / med(read):8.0f}   "
          + " ".join(f"{x:.2f}" for x in read))
    print(f"{'  the same, CPU time':42s} {med(read_cpu):7.2f}s {mib / med(read_cpu):8.0f}   "
          + " ".join(f"{x:.2f}" for x in read_cpu))
    print(f"{'analyze --jobs 1, merged log, end to end':42s} {med(e2e):7.2f}s {mib / med(e2e):8.0f}   "
          + " ".join(f"{x:.2f}" for x in e2e))
    print(f"{'  the same, CPU time':42s} {med(CPU['e2e']):7.2f}s {mib / med(CPU['e2e']):8.0f}   "
          + " ".join(f"{x:.2f}" for x in CPU["e2e"]))
    print(f"{'analyze --jobs 2, per-rank files':42s} {med(jobs2):7.2f}s {mib / med(jobs2):8.0f}   "
          + " ".join(f"{x:.2f}" for x in jobs2))
    print(f"\nreading: {mib / med(read):.0f} MiB/s per core (target >= {TARGET_MBPS:.0f}), "
          f"{med(read) / med(grep):.1f}x grep's time; end to end {med(e2e):.1f} s (target < {TARGET_S:.0f} s)")
    behind = BEHIND % a.ranks
    named = f"rank {behind} " in verdict
    print(f"{verdict}\nthe lagging rank {behind} named: {'yes' if named else 'NO'}")
    ok = mib / med(read) >= TARGET_MBPS and med(e2e) < TARGET_S and named
    return 0 if ok or (a.mb < 64 and named) else 1      # a small run checks the pipeline, not the speed


if __name__ == "__main__":
    sys.exit(main())
