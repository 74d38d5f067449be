"""The launcher's command line (``python -m tests.lab.launcher --help``): the options, the
scenario's defaults (:data:`.scenarios.DEFAULTS`) for those not given, the checks between
them, and the ranks' watchdog timeout, set past the hold and the captures.
"""
from __future__ import annotations

import argparse
import os
import random
import shlex
import sys

from .scenarios import (DEFAULT_BUILD, DEFAULTS, HOLDS, SCENARIOS, STUCK_MODES, parse_capture_start, parse_stagger,
                        quota_fraction)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of ``argv`` (default: sys.argv) with every scenario default filled in;
    exits with a usage error (argparse's) when they contradict each other."""
    ap = _parser()
    a = ap.parse_args(argv)
    explicit = {k for k, v in vars(a).items() if v is not None}
    merged = dict(DEFAULTS["common"], **DEFAULTS[a.scenario])
    merged.setdefault("rank", 1)
    for k, v in merged.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    for k in ("loss_permille", "rate", "direction", "straggle_ms", "skip_mode", "link_side"):
        if getattr(a, k, None) is None:
            setattr(a, k, {"loss_permille": 20, "rate": "200mbit", "direction": "both", "straggle_ms": 250.0,
                           "skip_mode": "stop", "link_side": "switch"}[k])
    if a.out is None:
        a.out = f"out/lab-{a.scenario}"
    if not 1 <= a.ranks <= 8:
        ap.error("--ranks must be 1..8")
    if a.scenario not in ("clean", "selftest") and not 0 <= a.rank < a.ranks:
        ap.error("--rank must be a rank of the job")
    if not a.no_netns and os.geteuid() != 0:
        ap.error("network namespaces need root (or use --no-netns for loopback runs)")
    # gpu-hang, host-stuck: at an op count (default), or at the first collective after --start-s when only
    # that is given
    a.hang_at = ("time" if a.scenario in ("gpu-hang", "host-stuck") and "start_s" in explicit
                 and "at_op" not in explicit else "op")
    if a.scenario in ("gpu-hang", "mismatch-hang", "rank-killed", "host-stuck") and a.at_op is not None and a.at_op < 1:
        ap.error("--at-op must be >= 1 (op 0 is the initial broadcast, before training starts)")
    if a.scenario == "host-stuck" and a.stuck_s < 0:
        ap.error("--stuck-s must be >= 0 (0: stuck until the hold ends the run)")
    if a.operator_trigger is not None:
        path, at, after = a.operator_trigger.rpartition("@")
        try:
            ok = bool(path and at) and float(after) >= 0
        except ValueError:
            ok = False
        if not ok:
            ap.error("--operator-trigger takes FILE@S (S seconds >= 0 after the onset)")
    if a.scenario == "init-hang-dropped" and a.rank == 0:
        ap.error("init-hang-dropped cuts a rank off the bootstrap root, which is rank 0's process: "
                 "--rank must not be 0")
    if a.scenario == "link-flap" and not (a.down_s > 0 and a.up_s >= 0 and a.flaps >= 1):
        ap.error("link-flap needs --down-s > 0, --up-s >= 0 and --flaps >= 1")
    if a.scenario == "cpu-starved":
        try:
            quota_fraction(a.cpu_quota)
        except ValueError as e:
            ap.error(str(e))
    try:
        parse_capture_start(a.capture_start)
        parse_stagger(a.capture_stagger_s)
        shlex.split(a.capture_args or "")
    except ValueError as e:
        ap.error(str(e))
    if a.capture_duration_s <= 0:
        ap.error("--capture-duration-s must be > 0")
    if a.capture_stop_spread_s is not None and a.capture_stop_spread_s < 0:
        ap.error("--capture-stop-spread-s must be >= 0")
    if a.stress < 0:
        ap.error("--stress must be >= 0")
    if a.tcp is None:
        a.tcp = "defaults" if (a.capture == "per-host" or not a.quickack) else "lab"
    elif a.tcp == "lab" and not a.quickack:
        ap.error("--no-quickack contradicts --tcp lab")
    a.quickack = a.tcp == "lab"
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(2 ** 31)
    _set_watchdog_timeout(a)
    return a


def _parser() -> argparse.ArgumentParser:
    """The launcher's options (the scenario's defaults are filled in after parsing)."""
    ap = argparse.ArgumentParser(prog="python -m tests.lab.launcher",
                                 description="Run a stallscope lab scenario (root, except with --no-netns).")
    ap.add_argument("--scenario", choices=SCENARIOS, default="clean")
    ap.add_argument("--rank", type=int, help="the faulty rank (default 1; slow-checkpoint: 0)")
    ap.add_argument("--ranks", type=int, default=4, help="world size (1..8)")
    ap.add_argument("--out", default=None, help="output folder (default out/lab-<scenario>)")
    ap.add_argument("--build", default=str(DEFAULT_BUILD), help="folder with sslab_rank and the libraries")
    ap.add_argument("--no-netns", action="store_true", help="run the ranks on loopback (no root; no network faults)")
    ap.add_argument("--no-pcap", action="store_true")
    ap.add_argument("--snaplen", type=int, default=128)
    ap.add_argument("--tcp", choices=("defaults", "lab"),
                    help="lab: quickack routes and no tail-loss probes in the rank namespaces (no retransmission "
                         "without a fault); defaults: Linux's own settings, as on a real host "
                         "(default: lab, or defaults with --capture per-host)")
    ap.add_argument("--no-quickack", dest="quickack", action="store_false",
                    help="same as --tcp defaults (kept for old command lines)")
    ap.add_argument("--stress", type=int, default=0,
                    help="N busy-loop processes at normal priority during the run (CPU contention)")
    ap.add_argument("--seed", type=int, help="seed of the random choices (capture stagger); recorded")
    ap.add_argument("--debug-subsys", default="INIT,COLL,NET")
    # training job
    ap.add_argument("--steps", type=int)
    ap.add_argument("--compute-ms", type=float)
    ap.add_argument("--buckets", help="comma-separated element counts of the gradient buckets")
    ap.add_argument("--dtype", help="float32, float16, bfloat16, int32, ...")
    ap.add_argument("--pattern", choices=("ddp", "fsdp", "mixed"))
    ap.add_argument("--buffsize", type=int, help="NCCL_BUFFSIZE (bytes per ring chunk)")
    ap.add_argument("--no-socket-ifname", dest="socket_ifname", action="store_false",
                    help="leave NCCL_SOCKET_IFNAME unset (a capture then finds the interface from the sockets)")
    ap.add_argument("--nchannels", type=int, help="NCCL_MIN_NCHANNELS (TCP connections per ring neighbour)")
    ap.add_argument("--watchdog-timeout-s", type=float,
                    help="the driver's collective timeout (torch's ProcessGroupNCCL timeout; default 600, raised "
                         "past the hold and the captures so that it cannot end a hang early)")
    # PyTorch Flight Recorder
    ap.add_argument("--no-flight-recorder", dest="flight_recorder", action="store_false",
                    help="do not set TORCH_NCCL_TRACE_BUFFER_SIZE & co. on the ranks")
    ap.add_argument("--fr-buffer-size", type=int, default=2000, help="TORCH_NCCL_TRACE_BUFFER_SIZE")
    ap.add_argument("--no-fr-timing", dest="fr_timing", action="store_false",
                    help="no TORCH_NCCL_ENABLE_TIMING: no entry is ever 'started', last_started_collective -1")
    ap.add_argument("--fr-dump-after-s", type=float,
                    help="write to every rank's FR pipe this long after the fault's onset (a dump each)")
    ap.add_argument("--operator-trigger", metavar="FILE@S",
                    help="an operator asking a watcher for a bundle: write FILE (a watcher's --trigger-file) S "
                         "seconds after the fault's onset (its time: scenario.json operator_trigger_ns)")
    # faults
    ap.add_argument("--start-s", type=float, help="fault start, seconds after all ranks began training")
    ap.add_argument("--hold-s", type=float, help="hang/reset scenarios: seconds to keep the hang before ending")
    ap.add_argument("--loss-permille", type=int)
    ap.add_argument("--loss-min-bytes", type=int, default=0,
                    help="loss: drop only packets longer than this (0: any frame, like a bad cable)")
    ap.add_argument("--direction", choices=("both", "egress", "ingress"),
                    help="loss/slow-link: which direction of the rank's link (egress = what it sends)")
    ap.add_argument("--rate", help="slow-link: tc rate, e.g. 200mbit")
    ap.add_argument("--straggle-ms", type=float)
    ap.add_argument("--at-op", type=int,
                    help="mismatch-hang: index of the collective the rank skips; gpu-hang: the collective (opCount) "
                         "its stream hangs in; host-stuck: the collective the rank never enqueues")
    ap.add_argument("--skip-mode", choices=("stop", "continue"))
    ap.add_argument("--link-side", choices=("switch", "host"))
    ap.add_argument("--kill-signal", choices=("KILL", "SEGV"), help="rank-killed: the signal (default KILL)")
    ap.add_argument("--down-s", type=float, help="link-flap: seconds each flap keeps the link down (2-10)")
    ap.add_argument("--up-s", type=float, help="link-flap: seconds up between two flaps")
    ap.add_argument("--flaps", type=int, help="link-flap: how many times the link goes down")
    ap.add_argument("--stuck-mode", choices=STUCK_MODES,
                    help="host-stuck: spin (a busy loop on a CPU) or block (read(2) of a pipe nobody writes)")
    ap.add_argument("--stuck-s", type=float,
                    help="host-stuck: seconds the rank stays stuck, then goes on (default 0: until the hold ends)")
    ap.add_argument("--cpu-quota", help="cpu-starved: rank r's CPU quota, a share of one CPU (e.g. 10%%)")
    ap.add_argument("--reset-method", choices=("nft",), default="nft")
    ap.add_argument("--reset-scope", choices=("connection", "peer"), default="connection",
                    help="reset: the busiest connection from the peer, or all of its connections")
    # per-host captures
    ap.add_argument("--capture", choices=("none", "per-host"), default="none",
                    help="per-host: one `stallscope capture` per rank inside its namespaces (host node<r>)")
    ap.add_argument("--capture-start", default="before",
                    help="before: attached before the job starts; onset+S: S seconds after the fault's onset")
    ap.add_argument("--capture-stagger-s", default="0-5",
                    help="successive hosts' captures start a random [A,B] s apart (seeded by --seed)")
    ap.add_argument("--capture-duration-s", type=float, default=15.0,
                    help="each capture gets a Ctrl-C this long after it said 'capturing:'")
    ap.add_argument("--capture-stop-spread-s", type=float,
                    help="the captures stop this far apart, in the order they began capturing, the first "
                         "--capture-duration-s after the last one began: a partial overlap that holds however "
                         "long each tracer takes to attach")
    ap.add_argument("--capture-args", default="",
                    help='extra capture arguments, shell-quoted (write --capture-args="--no-bpf")')
    ap.add_argument("--require-captures", action="store_true", help="exit 1 when a capture failed")
    ap.add_argument("--capture-start-timeout-s", type=float, default=120.0)
    ap.add_argument("--capture-stop-timeout-s", type=float, default=90.0)
    # selftest
    ap.add_argument("--selftest-dtypes",
                    default="int8,uint8,int32,uint32,int64,uint64,float16,float32,float64,bfloat16")
    ap.add_argument("--selftest-count", type=int, default=1003)
    ap.add_argument("--selftest-large", type=int, default=70001)
    # limits and test hooks
    ap.add_argument("--init-timeout-s", type=float, default=60.0)
    ap.add_argument("--run-timeout-s", type=float, default=120.0,
                    help="non-hang scenarios: kill ranks still running this long after the job should have ended")
    ap.add_argument("--no-stacks", dest="stacks", action="store_false")
    ap.add_argument("--fail-at", choices=("setup", "running"), help="test hook: fail deliberately")
    return ap


def _set_watchdog_timeout(a: argparse.Namespace) -> None:
    """--watchdog-timeout-s when not given: past the hold and every capture's schedule."""
    # The driver's watchdog must not end a hang before --hold-s (nor while captures run):
    # by default it is set well past both. An explicit value is kept (the watchdog firing
    # during a hang is a scenario of its own), with a warning if it comes first.
    window = a.hold_s if a.scenario in HOLDS else 0.0
    if a.capture == "per-host":
        _, off = parse_capture_start(a.capture_start)
        window += off + parse_stagger(a.capture_stagger_s)[1] + a.capture_duration_s \
            + (a.ranks - 1) * (a.capture_stop_spread_s or 0.0) \
            + a.capture_start_timeout_s + a.capture_stop_timeout_s
    if a.watchdog_timeout_s is None:
        a.watchdog_timeout_s = max(600.0, float(int(window + 120)))
    elif a.scenario in HOLDS and a.watchdog_timeout_s <= a.hold_s:
        print(f"launcher: warning: --watchdog-timeout-s {a.watchdog_timeout_s:g} <= --hold-s {a.hold_s:g}: "
              "the ranks' watchdog ends the hang first", file=sys.stderr)
