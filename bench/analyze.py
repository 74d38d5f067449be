"""``analyze`` time and peak memory on a lab bundle scaled to 8 ranks and 1M packets per host.

    python bench/analyze.py [--bundle LAB.tar.gz] [--ranks 8] [--packets 1000000] [--hosts 1]
                            [--repeat 1] [--runs 1] [--keep DIR]

The scaled bundle is synthesised from a shipped lab bundle (default: the loss scenario):

* ranks: every tracer event of the lab's ranks (collectives, host waits, inits, TCP
  tracepoints, off-CPU samples) is replicated for the extra ranks with new pids, rank
  numbers and addresses; the communicator grows to ``--ranks`` members;
* packets: one capture per host of ``--packets`` packets from bench/synth_capture.py's
  generator (bulk flows with delayed ACKs and random loss: duplicate ACKs, fast and RTO
  retransmissions), readdressed as ring flows between the ranks' addresses (rank r sends
  to r+1) and moved to the bundle's time span; it replaces the lab's small pcaps;
* the manifest lists the new processes and files (sizes and hashes recomputed).

With ``--hosts N`` the ranks are split over N host bundles, each with its own
``--packets`` capture (the multi-host case: clock skew estimation runs too).
``--repeat K`` replays the lab's collectives and host waits K times back to back (op
counts continuing): a longer run with K times the NCCL events.

``analyze`` runs in a child process pinned to one core (``taskset -c 0``), timed from
the command's start (interpreter start-up and imports included) to its exit; the child
also reports the in-process time of each stage. Peak RSS is the child's own (see
bench/pcap_throughput.py for why the launcher forks from a small process).

Target (issue 5): under 10 s on one core.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
import synth_capture  # noqa: E402
from capture.bundle_files import file_entries  # noqa: E402
from pcap_throughput import LAUNCHER, pinned  # noqa: E402   (the report is the child's stderr)

TARGET_S = 10.0
PID_STEP = 100_000          # new pid = old pid + k * PID_STEP for the k-th copy of the lab's ranks

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import forensics.analysis as A
import forensics.execution.host_reading as H
from forensics.model import Model
t_import = time.perf_counter()
stages = {}
def timed(name, fn):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            stages[name] = stages.get(name, 0.0) + time.perf_counter() - t
    return run
# the stages of the read pipeline (forensics.execution.host_reading.read_model) and the analysis,
# each timed where it is looked up at call time
H.read_hosts = timed('read', H.read_hosts)
H.from_parts = timed('merge', H.from_parts)
Model.connect = timed('duckdb', Model.connect)
t = time.perf_counter()
a = A.analyze(sys.argv[1:])
total = time.perf_counter() - t
stages['detectors'] = total - sum(stages.values())
print(json.dumps({"import_s": t_import - t0, "analyze_s": total, "stages": stages,
                  "findings": [[f.kind, f.severity, f.ranks] for f in a.findings[:3]],
                  "rows": {k: len(v) for k, v in a.model.tables.items()}}), file=sys.stderr)
"""


def addr_of(rank: int) -> str:
    """The lab's addresses (10.203.0.10 is rank 0), continued into the next /24 past rank 245."""
    n = 10 + rank
    return f"10.203.{n // 256}.{n % 256}"


def ip_int(a: str) -> int:
    p = [int(x) for x in a.split(".")]
    return (p[0] << 24) | (p[1] << 16) | (p[2] << 8) | p[3]


def scale_events(lines: list[dict], lab_ranks: dict[int, int], ranks: int, netns_map: dict) -> list[dict]:
    """Replicate the lab ranks' events for ranks len(lab)..ranks-1 (pid, rank, addresses shifted)."""
    n_lab = len(lab_ranks)
    pid_rank = {pid: r for r, pid in lab_ranks.items()}
    out = []
    for e in lines:
        if "nranks" in e and e.get("nranks") == n_lab:
            e = {**e, "nranks": ranks}
        out.append(e)
    for k in range(1, (ranks + n_lab - 1) // n_lab):
        for e in lines:
            pid = e.get("pid")
            if pid not in pid_rank and e.get("ev") not in ("tcp_retransmit_skb", "tcp_send_reset",
                                                         "tcp_receive_reset", "sock_state"):
                continue
            r_new = None
            c = dict(e)
            if pid in pid_rank:
                r_new = pid_rank[pid] + k * n_lab
                if r_new >= ranks:
                    continue
                c["pid"] = pid + k * PID_STEP
                if "tid" in c and c["tid"] is not None:
                    c["tid"] = c["tid"] + k * PID_STEP
            if c.get("rank") is not None and isinstance(c.get("rank"), int) and c["rank"] >= 0:
                c["rank"] = c["rank"] + k * n_lab
            if c.get("nranks") is not None:
                c["nranks"] = ranks
            for f in ("saddr", "daddr"):
                a = c.get(f)
                if isinstance(a, str) and a.startswith("10.203.0."):
                    r = int(a.rsplit(".", 1)[1]) - 10
                    if r + k * n_lab >= ranks:
                        break
                    c[f] = addr_of(r + k * n_lab)
            else:
                if "netns" in c and c["netns"] in netns_map:
                    c["netns"] = netns_map[c["netns"]] + k
                out.append(c)
    out.sort(key=lambda e: e.get("t0", e.get("t", 0)) or 0)
    return out


TIMELINE_EVENTS = ("coll", "host_wait", "group")


def repeat_timeline(lines: list[dict], times: int) -> list[dict]:
    """The job's collectives and host waits ``times`` times over, back to back in time, op
    counts continuing (a longer training run: more NCCL events, same packets)."""
    if times <= 1:
        return lines
    calls = [e for e in lines if e.get("ev") in TIMELINE_EVENTS and isinstance(e.get("t0"), int)]
    if not calls:
        return lines
    t_lo = min(e["t0"] for e in calls)
    t_hi = max(max(e["t0"], e.get("t1") or 0) for e in calls)
    span = t_hi - t_lo + 10**6
    ops = 1 + max((e.get("op_count") or 0) for e in calls if e.get("ev") == "coll")
    out = list(lines)
    for k in range(1, times):
        for e in calls:
            c = dict(e)
            c["t0"] = e["t0"] + k * span
            if isinstance(e.get("t1"), int):
                c["t1"] = e["t1"] + k * span
            if isinstance(e.get("op_count"), int):
                c["op_count"] = e["op_count"] + k * ops
            out.append(c)
    out.sort(key=lambda e: e.get("t0", e.get("t", 0)) or 0)
    return out


@functools.lru_cache(maxsize=2)
def _synth_rows(packets: int, flows: int, seed: int) -> np.ndarray:
    """synth_capture's per-packet rows (its generator runs Python per packet: hosts that
    share a seed share one generation)."""
    rows = np.array(synth_capture.generate(packets, flows, 0.002, seed), dtype=np.int64)
    rows.setflags(write=False)
    return rows


def ring_pcap(path: Path, packets: int, ranks: list[int], start_ns: int, seed: int) -> int:
    """synth_capture's flows, readdressed to ring links between ``ranks`` and moved to ``start_ns``."""
    flows = 8 * len(ranks)
    rows = _synth_rows(packets, flows, seed).copy()
    t, src, sport, dport = rows[:, 0], rows[:, 1], rows[:, 3], rows[:, 4]
    f = np.where((sport >= 40000) & (sport < 43000), sport - 40000, dport - 40000)
    a_orig = 0x0A000001 + f % 8
    ra = np.array(ranks)[f % len(ranks)]
    all_ranks = max(ranks) + 1
    rb = (ra + 1) % max(all_ranks, 2)
    a_new = np.array([ip_int(addr_of(r)) for r in range(all_ranks + 1)], dtype=np.int64)
    from_a = src == a_orig
    rows[:, 1] = np.where(from_a, a_new[ra], a_new[rb])
    rows[:, 2] = np.where(from_a, a_new[rb], a_new[ra])
    rows[:, 0] = t - t.min() + start_ns
    return synth_capture.write_rows(path, rows)


def build(src_bundle: Path, out_dir: Path, ranks: int, packets: int, hosts: int, repeat: int = 1,
          same_packets: bool = False) -> list[Path]:
    """The scaled bundles (one per host); ``same_packets``: every host's capture from one
    generated packet stream (readdressed to its own ranks), so many hosts cost one generation."""
    from forensics.inputs.bundle import unpack_archive
    work = Path(tempfile.mkdtemp(prefix="bench-src-", dir=out_dir))
    unpack_archive(src_bundle, work)
    root = next(p.parent for p in work.rglob("manifest.json"))
    manifest = json.loads((root / "manifest.json").read_text())
    lines = [json.loads(x) for x in (root / "bpf" / "events.jsonl").read_text().splitlines() if x.strip()]
    lab = {p["rank"]: p["pid"] for p in manifest["processes"] if p.get("rank") is not None}
    if not lab:   # ranks from comm_init
        lab = {e["rank"]: e["pid"] for e in lines if e.get("ev") == "comm_init"}
    netns_map = {n["inode"]: n["inode"] + 1000 for n in manifest.get("netns", []) if not n.get("own")}
    scaled = scale_events(repeat_timeline(lines, repeat), lab, ranks, netns_map)
    procs = list(manifest["processes"])
    n_lab = len(lab)
    for k in range(1, (ranks + n_lab - 1) // n_lab):
        for p in manifest["processes"]:
            if p.get("rank") is None or p["rank"] + k * n_lab >= ranks:
                continue
            q = copy.deepcopy(p)
            q["pid"] += k * PID_STEP
            q["rank"] += k * n_lab
            q["world_size"] = ranks
            q["env"] = {**q.get("env", {}), "RANK": str(q["rank"]), "WORLD_SIZE": str(ranks)}
            q["sockets"] = []
            if q.get("netns_inode") in netns_map:
                q["netns_inode"] = netns_map[q["netns_inode"]] + k
            procs.append(q)
    netns = list(manifest.get("netns", []))
    for k in range(1, (ranks + n_lab - 1) // n_lab):
        for n in manifest.get("netns", []):
            if n["inode"] in netns_map:
                netns.append({**n, "inode": netns_map[n["inode"]] + k, "label": f"{n['label']}-copy{k}",
                              "name": f"{n.get('name')}-copy{k}",
                              "pids": [x + k * PID_STEP for x in n.get("pids", [])]})
    per_host = np.array_split(np.arange(ranks), hosts)
    out = []
    for h, host_ranks in enumerate(per_host):
        hr = set(int(r) for r in host_ranks)
        d = out_dir / f"stallscope-bench{h}-20260101T000000Z"
        shutil.copytree(root, d)
        m = copy.deepcopy(manifest)
        m["host"] = m["hostname"] = f"bench{h}"
        m["processes"] = [p for p in procs if p.get("rank") is None or p["rank"] in hr]
        m["netns"] = netns
        pids = {p["pid"] for p in m["processes"]}
        # a host's tracer sees its own processes and its own kernel's sockets (the kernel TCP
        # events of its ranks' addresses), not the whole job's
        own = {addr_of(r) for r in hr}
        ev = [e for e in scaled if e.get("pid") in pids or ("pid" not in e)
              or ((e.get("ev", "").startswith("tcp_") or e.get("ev") == "sock_state")
                  and (e.get("saddr") in own or e.get("daddr") in own))] if hosts > 1 else scaled
        (d / "bpf" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev))
        for p in (d / "pcap").glob("*"):
            p.unlink()
        ring_pcap(d / "pcap" / f"bench{h}-eth0.pcap", packets, sorted(hr), int(m["started_ns"]),
                  seed=7 if same_packets else 7 + h)
        m["files"] = file_entries(d)
        (d / "manifest.json").write_text(json.dumps(m))
        tgz = out_dir / f"{d.name}.tar.gz"
        with tarfile.open(tgz, "w:gz", compresslevel=1) as tar:
            tar.add(d, arcname=d.name)
        shutil.rmtree(d)
        out.append(tgz)
    shutil.rmtree(work)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, help="lab bundle to scale (default: the shipped loss bundle)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--packets", type=int, default=1_000_000, help="packets per host")
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1,
                    help="repeat the lab's collectives this many times in time (a longer run: more NCCL events)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="write the scaled bundles here and keep them")
    a = ap.parse_args()
    src = a.bundle or next((ROOT / "tests" / "fixtures" / "bundles" / "loss").glob("*.tar.gz"))
    if a.keep and any(a.keep.glob("stallscope-bench*")):
        print(f"bench/analyze.py: {a.keep} already holds scaled bundles; not overwriting them", file=sys.stderr)
        return 2
    out_dir = a.keep or Path(tempfile.mkdtemp(prefix="stallscope-bench-analyze-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        bundles = build(src, out_dir, a.ranks, a.packets, a.hosts, a.repeat)
        size = sum(b.stat().st_size for b in bundles)
        print(f"scaled bundle(s): {len(bundles)} host(s), {a.ranks} ranks, {a.packets:,} packets per host, "
              f"{size / 2**20:.1f} MiB compressed (from {src.name})")
        cmd = [sys.executable, "-c", CHILD, *map(str, bundles)]
        best = None
        for _ in range(a.runs):
            proc = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, *pinned(cmd)],
                                  capture_output=True, text=True, cwd=ROOT)
            try:
                rc, maxrss_kb, wall = proc.stdout.split()
                info = json.loads(proc.stderr.strip().splitlines()[-1])
            except (ValueError, IndexError):
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            if int(rc):
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            run = (float(wall), int(maxrss_kb) * 1024, info)
            best = run if best is None or run[0] < best[0] else best
        wall, rss, info = best
        st = info["stages"]
        print(f"analyze (taskset -c 0, whole command): {wall:.2f} s  (target {TARGET_S:.0f} s: "
              f"{'OK' if wall < TARGET_S else 'OVER'}), peak RSS {rss / 2**20:.0f} MiB")
        print(f"  in-process: imports {info['import_s']:.2f} s, analyze() {info['analyze_s']:.2f} s = read "
              f"{st.get('read', 0):.2f} s + merge {st.get('merge', 0):.2f} s + duckdb {st.get('duckdb', 0):.2f} s "
              f"+ detectors {st['detectors']:.2f} s")
        print(f"  rows: {info['rows']}")
        print(f"  top findings: {info['findings']}")
        return 0 if wall < TARGET_S else 1
    finally:
        if not a.keep:
            shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
