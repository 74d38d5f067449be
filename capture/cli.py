"""The capture command line, defined once for ``stallscope capture`` and ``python3 -m capture``."""
from __future__ import annotations

import argparse

from .bundle import parse_duration, parse_size
from .runner import CaptureOptions

HELP = "capture one host's evidence bundle during a hang (tracer, pcaps, counters, logs)"
EPILOG = ("Ends after --duration or on Ctrl-C/SIGTERM and writes stallscope-<host>-<UTC>.tar.gz. "
          "Exit codes: 0 ok (collectors skipped by design, e.g. those that need root when run without it, "
          "are listed in manifest.json and on stderr), 2 bad usage, 3 some collector failed (see manifest.json). "
          "A capture that was killed leaves its data in a hidden staging folder next to the bundle; "
          "the next capture into that folder, or --recover, turns it into a bundle marked partial.")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _duration(text: str) -> float:
    try:
        v = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if v <= 0:
        raise argparse.ArgumentTypeError("duration must be positive")
    return v


def _pid(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad pid {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"bad pid {text!r}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", metavar="PATH",
                   help="bundle file, or a folder for the standard name (default: current folder)")
    p.add_argument("--duration", type=_duration, default=120.0, metavar="DUR",
                   help="how long to capture, e.g. 2m, 90s (default 2m); Ctrl-C ends earlier")
    p.add_argument("--pid", type=_pid, nargs="+", action="extend", default=[], metavar="PID",
                   help="trace only these processes (default: every process that maps a libnccl)")
    p.add_argument("--iface", nargs="+", action="extend", default=[], metavar="IF",
                   help="capture packets on these interfaces (default: NCCL_SOCKET_IFNAME of the processes, "
                        "or the interfaces of their sockets)")
    p.add_argument("--max-bytes", type=_size, default=2 << 30, metavar="SIZE",
                   help="hard limit of the bundle size, e.g. 2G, 500M (default 2G)")
    p.add_argument("--nccl-lib", action="append", default=[], metavar="PATH",
                   help="libnccl (or a library exporting NCCL's API) to trace, instead of discovering it")
    p.add_argument("--nccl-tests", metavar="CMD", help="run this nccl-tests command and keep its output")
    p.add_argument("--attach", nargs="+", action="extend", default=[], metavar="FILE_OR_GLOB",
                   help="add files: NCCL_DEBUG_FILE logs, nccl-tests logs, Flight Recorder dumps")
    p.add_argument("--no-bpf", dest="bpf", action="store_false", help="do not run the bpftrace tracer")
    p.add_argument("--no-pcap", dest="pcap", action="store_false", help="do not run tcpdump")
    p.add_argument("--ss-every", type=float, default=2.0, metavar="SECONDS",
                   help="sample ss -tinpe of every namespace of the job this often (default 2; 0: only at the "
                        "start and end): bytes moving per connection over time, data stuck behind an RTO backoff")
    p.add_argument("--no-call-returns", dest="call_returns", action="store_false",
                   help="do not trace the return of the collective calls (their t1 and rc; collectives are "
                        "asynchronous, the return is the launch time): the leanest tracer")
    p.add_argument("--stacks", choices=("auto", "always", "never"), default="auto",
                   help="native stacks of every traced process with eu-stack/gdb (py-spy --native for Python), "
                        "which stop each process briefly (ptrace): auto (default) only when no collective "
                        "completes during the first --stacks-grace of the capture, always (at the start), never")
    p.add_argument("--stacks-grace", type=_duration, default=5.0, metavar="DUR",
                   help="--stacks auto: how long to watch the job for progress first (default 5s)")
    p.add_argument("--stacks-timeout", type=_duration, default=10.0, metavar="DUR",
                   help="a stack tool still running after this is killed (default 10s)")
    p.add_argument("--fr-dump-wait", type=_duration, default=10.0, metavar="DUR",
                   help="after writing to a process's TORCH_NCCL_DEBUG_INFO_PIPE_FILE pipe, wait this long at most "
                        "for its Flight Recorder dump (default 10s)")
    p.add_argument("--recover", action="store_true",
                   help="do not capture: turn the staging folders that killed captures left in the output folder "
                        "(-o, default: current folder) into bundles marked partial, print their paths")
    p.add_argument("--snaplen", type=int, default=128, help=argparse.SUPPRESS)
    p.add_argument("--progress", choices=("auto", "tty", "lines", "off"), default="auto",
                   help="progress line on stderr (default: in place on a terminal, every 5 s otherwise)")


def options_from_args(a: argparse.Namespace) -> CaptureOptions:
    return CaptureOptions(output=a.output, duration_s=a.duration, pids=list(a.pid), ifaces=list(a.iface),
                          max_bytes=a.max_bytes, nccl_libs=list(a.nccl_lib), nccl_tests=a.nccl_tests,
                          attach=list(a.attach), bpf=a.bpf, pcap=a.pcap, snaplen=a.snaplen, progress=a.progress,
                          call_returns=a.call_returns, ss_every_s=max(0.0, a.ss_every), stacks=a.stacks,
                          stacks_grace_s=a.stacks_grace, stacks_timeout_s=a.stacks_timeout,
                          fr_dump_wait_s=a.fr_dump_wait)


def recover(a: argparse.Namespace, stderr) -> list:
    """--recover: the partial bundles made from the output folder's orphaned staging folders."""
    import os
    from pathlib import Path

    from .runner import CaptureUsageError, recover_orphans
    folder = Path(a.output or ".")
    if not folder.is_dir():
        if a.output and (a.output.endswith(".tar.gz") or a.output.endswith(".tgz")):
            folder = Path(os.path.dirname(a.output) or ".")
        if not folder.is_dir():
            raise CaptureUsageError(f"--recover: {folder} is not a folder")
    paths = recover_orphans(folder, log=lambda m: print(f"stallscope capture: {m}", file=stderr, flush=True))
    if not paths:
        print(f"stallscope capture: nothing to recover in {folder}", file=stderr)
    return paths


def ignore_late_signals() -> None:
    """For the command lines: the handlers capture restores once its bundle is written. A
    Ctrl-C or SIGTERM arriving then (a pdsh loop or a launcher stopping every host's capture
    once more) is ignored instead of ending a finished capture with a traceback. Capture
    installs its own handlers while it runs; this only decides what comes after."""
    import signal
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m capture``: the same options as ``stallscope capture``."""
    import sys

    from .runner import CaptureFailed, CaptureUsageError, run_capture
    parser = argparse.ArgumentParser(prog="python3 -m capture", description=HELP, epilog=EPILOG)
    add_arguments(parser)
    args = parser.parse_args(argv)  # argparse exits 2 on bad usage
    try:
        if args.recover:
            for path in recover(args, sys.stderr):
                print(path)
            return 0
        ignore_late_signals()
        result = run_capture(options_from_args(args))
    except CaptureUsageError as e:
        print(f"capture: error: {e}", file=sys.stderr)
        return 2
    except CaptureFailed as e:
        print(f"capture: error: {e}", file=sys.stderr)
        return 3
    print(result.path)
    return result.exit_code
