"""TCP engine throughput and memory, measured side by side with tshark in one run.

    python bench/pcap_throughput.py [--pcap FILE] [--packets 1000000] [--runs 3]

Without --pcap it builds a synthetic NCCL-like capture (bench/synth_capture.py)
of the requested size. Both tools run pinned to one CPU core (taskset) and are
timed end to end as commands, start-up included:

* ``stallscope tcp FILE`` (all verdicts, per-flow state, summary)
* ``tshark -q -z io,stat,0,tcp.analysis.retransmission,...`` on the same file

Peak memory per packet is the growth of peak RSS between the capture and its
first half, divided by the packets in the second half (what a larger file costs
beyond the fixed base of interpreter, libraries and buffers).

Targets (issue 2): >= 1,000,000 packets/s, >= 15x tshark, <= 64 bytes/packet.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth_capture  # noqa: E402

TSHARK_STAT = ("io,stat,0,tcp.analysis.retransmission,tcp.analysis.duplicate_ack,"
               "tcp.analysis.fast_retransmission,tcp.analysis.out_of_order,"
               "tcp.analysis.spurious_retransmission")
TARGET_PPS, TARGET_RATIO, TARGET_BYTES = 1_000_000, 15.0, 64


def pinned(cmd: list[str]) -> list[str]:
    return (["taskset", "-c", "0"] + cmd) if shutil.which("taskset") else cmd


# A minimal launcher (python -S, no imports beyond os) forks and execs the command and
# reports the child's rusage on stdout (the child's stdout is dropped, its stderr kept): a
# child forked straight from this process would count the benchmark's own memory in its
# peak RSS (Linux keeps the high-water mark across exec).
LAUNCHER = """
import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), ru.ru_maxrss, time.perf_counter() - t0)
"""


def measure(cmd: list[str], env=None) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one run of ``cmd``."""
    proc = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, *pinned(cmd)],
                          capture_output=True, text=True, env=env)
    try:
        rc, maxrss_kb, wall = proc.stdout.split()
        rc, maxrss_kb, wall = int(rc), int(maxrss_kb), float(wall)
    except ValueError:
        raise SystemExit(f"launcher failed: {proc.stderr.strip()[-500:]}") from None
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed ({rc}): {proc.stderr.strip()[-500:]}")
    return wall, maxrss_kb * 1024


def best(cmd: list[str], runs: int, env=None) -> tuple[float, int]:
    results = [measure(cmd, env) for _ in range(runs)]
    return min(r[0] for r in results), max(r[1] for r in results)


def count_packets(path: str) -> int:
    sys.path.insert(0, str(HERE.parent))
    from forensics.pcap.reader import CaptureReader
    with CaptureReader(path) as reader:
        return sum(len(b) for b in reader.batches())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pcap", help="capture to measure (default: a synthetic one)")
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3, help="runs per tool; the fastest counts")
    ap.add_argument("--no-tshark", action="store_true")
    args = ap.parse_args()

    stallscope = shutil.which("stallscope") or str(Path(sys.executable).with_name("stallscope"))
    work = Path(tempfile.mkdtemp(prefix="stallscope-bench-"))
    try:
        if args.pcap:
            full, half = args.pcap, None
            packets = count_packets(full)
        else:
            full, half = str(work / "full.pcap"), str(work / "half.pcap")
            print(f"building a synthetic capture of {args.packets:,} packets ...", flush=True)
            packets = synth_capture.write_pcap(full, args.packets)
            synth_capture.write_pcap(half, args.packets // 2)
        size = os.path.getsize(full)
        print(f"capture: {full} ({packets:,} packets, {size / 1e6:.1f} MB)")
        print(f"cpu: pinned to core 0 ({'taskset' if shutil.which('taskset') else 'no taskset: unpinned'})")

        ours_s, ours_rss = best([stallscope, "tcp", full], args.runs)
        ours_pps = packets / ours_s
        print(f"stallscope tcp     : {ours_s:7.3f} s  {ours_pps:12,.0f} packets/s  peak RSS {ours_rss / 2**20:7.1f} MiB")

        csv_out = work / "out.csv"
        csv_s, _ = measure([stallscope, "tcp", full, "--csv", str(csv_out), "--force"])
        print(f"stallscope tcp --csv: {csv_s:6.3f} s  {packets / csv_s:12,.0f} packets/s  (every row written)")

        per_packet = None
        if half:
            _, half_rss = best([stallscope, "tcp", half], args.runs)
            per_packet = max(ours_rss - half_rss, 0) / (packets - packets // 2)
            print(f"peak memory growth : {per_packet:7.1f} bytes/packet beyond the base "
                  f"({half_rss / 2**20:.1f} MiB at {packets // 2:,} packets, {ours_rss / 2**20:.1f} MiB at {packets:,})")

        ratio = None
        if not args.no_tshark and shutil.which("tshark"):
            env = dict(os.environ, WIRESHARK_CONFIG_DIR=str(work / "wsconfig"))
            os.makedirs(env["WIRESHARK_CONFIG_DIR"], exist_ok=True)
            ts_s, ts_rss = best(["tshark", "-n", "-r", full, "-q", "-z", TSHARK_STAT], max(1, args.runs - 1), env)
            ratio = ts_s / ours_s
            print(f"tshark io,stat     : {ts_s:7.3f} s  {packets / ts_s:12,.0f} packets/s  peak RSS {ts_rss / 2**20:7.1f} MiB")
            print(f"speed-up vs tshark : {ratio:7.1f}x")
        else:
            print("tshark: not measured (missing or --no-tshark)")

        print("targets:")
        print(f"  >= {TARGET_PPS:,} packets/s : {'PASS' if ours_pps >= TARGET_PPS else 'FAIL'} ({ours_pps:,.0f})")
        if ratio is not None:
            print(f"  >= {TARGET_RATIO:.0f}x tshark       : {'PASS' if ratio >= TARGET_RATIO else 'FAIL'} ({ratio:.1f}x)")
        if per_packet is not None:
            print(f"  <= {TARGET_BYTES} bytes/packet    : {'PASS' if per_packet <= TARGET_BYTES else 'FAIL'} ({per_packet:.1f})")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
