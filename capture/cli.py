"""The capture command line, defined once for ``stallscope capture`` and ``python3 -m capture``."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from .options import CaptureFailed, CaptureOptions, CaptureUsageError

# the capture machinery (runner, tracer, bundle) is imported when a capture runs, not when
# the parser is built: every stallscope command builds it

HELP = "capture one host's evidence bundle during a hang (tracer, pcaps, counters, logs)"
EPILOG = ("Ends after --duration or on Ctrl-C/SIGTERM and writes stallscope-<host>-<UTC>.tar.gz. "
          "Exit codes: 0 ok (collectors skipped by design, e.g. those that need root when run without it, "
          "are listed in manifest.json and on stderr), 2 bad usage, 3 some collector failed (see manifest.json). "
          "A capture that was killed leaves its data in a hidden staging folder next to the bundle; "
          "the next capture into that folder, or --recover, turns it into a bundle marked partial.")


def _size(text: str) -> int:
    from .bundle_files import parse_size
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _duration(text: str) -> float:
    from .bundle_files import parse_duration
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
    p.add_argument("--duration", type=_duration, default=None, metavar="DUR",
                   help="how long to capture, e.g. 2m, 90s (default 2m; with --watch: until stopped); "
                        "Ctrl-C ends earlier")
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
    p.add_argument("--no-call-returns", dest="call_returns", action="store_false", default=None,
                   help="do not trace the return of the collective calls (their t1 and rc; collectives are "
                        "asynchronous, the return is the launch time): the leanest tracer; the default of "
                        "--watch, which asks the kernel whether a quiet thread is still inside its last "
                        "collective instead")
    p.add_argument("--call-returns", dest="call_returns", action="store_true", default=None,
                   help="trace the return of the collective calls (the default, except with --watch)")
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
    w = p.add_argument_group("black box (--watch)", "run for days next to the jobs of the host, keep the last minutes "
                             "in bounded rings, write a bundle when a hang starts (see capture/README.md)")
    w.add_argument("--watch", action="store_true",
                   help="watch: a bundle per incident into the -o folder (a collective in flight with nothing "
                        "returned for --hang-after, an NCCL WARN or PyTorch watchdog timeout in the job's logs, "
                        "or on demand), then go on watching")
    w.add_argument("--ring-bytes", type=_size, default=1 << 30, metavar="SIZE",
                   help="--watch: disk the rings may use, e.g. 1G, 300M (default 1G)")
    w.add_argument("--hang-after", type=_duration, default=None, metavar="DUR",
                   help="--watch: a collective in flight this long with nothing returned is a hang (default: "
                        "the larger of 10s and 10x the slowest collective completed in the last 5 minutes)")
    w.add_argument("--before", type=_duration, default=120.0, metavar="DUR",
                   help="--watch: the bundle holds this much before the trigger (default 2m)")
    w.add_argument("--after", type=_duration, default=30.0, metavar="DUR",
                   help="--watch: and this much after it (default 30s)")
    w.add_argument("--cooldown", type=_duration, default=600.0, metavar="DUR",
                   help="--watch: triggers this soon after an incident's bundle belong to it (default 10m; "
                        "on-demand triggers always write a bundle)")
    w.add_argument("--pcap-ring", choices=("on-trouble", "always"), default="on-trouble",
                   help="--watch: when the packet ring runs. on-trouble (default): from TCP trouble the tracer "
                        "sees in the job's namespaces (3 retransmissions or resets within 10s), or a trigger, until "
                        "--pcap-linger passes without either (a healthy job's packets are not tapped: an "
                        "AF_PACKET tap costs the job's own threads a copy of every packet); always: all the time")
    w.add_argument("--pcap-linger", type=_duration, default=600.0, metavar="DUR",
                   help="--pcap-ring on-trouble: stop the packet ring this long after the last TCP trouble or "
                        "trigger (default 10m; at least --before + --after + 30s)")
    w.add_argument("--trigger-file", metavar="PATH",
                   help="--watch: a file whose appearance triggers a bundle (its text is the reason; removed "
                        "then; default <output>/stallscope.trigger)")
    w.add_argument("--status-every", type=_duration, default=300.0, metavar="DUR", help=argparse.SUPPRESS)
    w.add_argument("--trigger", nargs="?", const="stallscope capture --trigger", default=None, metavar="REASON",
                   help="do not capture: make every watcher running on this host write a bundle now")
    p.add_argument("--snaplen", type=int, default=128, help=argparse.SUPPRESS)
    p.add_argument("--progress", choices=("auto", "tty", "lines", "off"), default="auto",
                   help="progress line on stderr (default: in place on a terminal, every 5 s otherwise)")


def options_from_args(a: argparse.Namespace) -> CaptureOptions:
    duration = a.duration if a.duration is not None else (float("inf") if a.watch else 120.0)
    return CaptureOptions(output=a.output, duration_s=duration, pids=list(a.pid), ifaces=list(a.iface),
                          max_bytes=a.max_bytes, nccl_libs=list(a.nccl_lib), nccl_tests=a.nccl_tests,
                          attach=list(a.attach), bpf=a.bpf, pcap=a.pcap, snaplen=a.snaplen, progress=a.progress,
                          call_returns=a.call_returns if a.call_returns is not None else not a.watch,
                          ss_every_s=max(0.0, a.ss_every), stacks=a.stacks,
                          stacks_grace_s=a.stacks_grace, stacks_timeout_s=a.stacks_timeout,
                          fr_dump_wait_s=a.fr_dump_wait, watch=a.watch, ring_bytes=a.ring_bytes,
                          hang_after_s=a.hang_after, before_s=a.before, after_s=a.after, cooldown_s=a.cooldown,
                          trigger_file=a.trigger_file, status_every_s=a.status_every, pcap_ring=a.pcap_ring,
                          pcap_linger_s=a.pcap_linger)


def recover(a: argparse.Namespace, stderr) -> list:
    """--recover: the partial bundles made from the output folder's orphaned staging folders."""
    from .staging import recover_orphans
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
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)


def execute(args: argparse.Namespace, stderr) -> tuple[list, int]:
    """What ``stallscope capture`` and ``python3 -m capture`` do with their options: (paths to
    print, exit code). Raises CaptureUsageError (exit 2) and CaptureFailed (exit 3)."""
    if args.recover:
        return recover(args, stderr), 0
    if args.trigger is not None:
        from .watch.triggers import trigger_watchers
        n = trigger_watchers(args.trigger, stderr)
        if not n:
            raise CaptureUsageError("--trigger: no stallscope watcher (capture --watch) runs on this host")
        return [], 0
    ignore_late_signals()
    if args.watch:
        from .watch.watcher import run_watch
        result = run_watch(options_from_args(args), stderr=stderr)
        return list(result.manifest.get("bundles") or []), result.exit_code
    from .runner import run_capture
    result = run_capture(options_from_args(args), stderr=stderr)
    return [result.path], result.exit_code


def main(argv: list[str] | None = None) -> int:
    """``python3 -m capture``: the same options as ``stallscope capture``."""
    parser = argparse.ArgumentParser(prog="python3 -m capture", description=HELP, epilog=EPILOG)
    add_arguments(parser)
    args = parser.parse_args(argv)  # argparse exits 2 on bad usage
    try:
        paths, code = execute(args, sys.stderr)
    except CaptureUsageError as e:
        print(f"capture: error: {e}", file=sys.stderr)
        return 2
    except CaptureFailed as e:
        print(f"capture: error: {e}", file=sys.stderr)
        return 3
    for path in paths:
        if path is not None:
            print(path)
    return code
