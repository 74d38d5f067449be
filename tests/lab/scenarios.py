"""The lab's scenario table and the rules every part of a run shares: the scenarios and their
defaults (each overridable on the command line, :mod:`.options`), the margins that time a
run's end around its captures, the ranks' event records, and the parsing of the capture
timing options. Standard library only; nothing here starts a process.
"""
from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent
REPO = LAB_DIR.parents[1]
DEFAULT_BUILD = LAB_DIR / "build"

SCENARIOS = ("clean", "loss", "slow-link", "straggler", "mismatch-hang", "link-down-hang", "gpu-hang", "reset",
             "selftest", "rank-killed", "link-flap", "cpu-starved", "slow-checkpoint")
HANGS = ("mismatch-hang", "link-down-hang", "gpu-hang")
INIT_HANGS = ("init-hang", "init-hang-dropped")     # the job never finishes ncclCommInitRank: no training
SCENARIOS += INIT_HANGS
HANGS += INIT_HANGS
SCENARIOS += ("host-stuck",)
HANGS += ("host-stuck",)          # one rank stuck in host code before its next collective: a hang
STUCK_MODES = ("spin", "block")   # host-stuck: on a CPU in a busy loop, or blocked in read(2) of a pipe
HOLDS = HANGS + ("reset", "rank-killed", "link-flap")   # end --hold-s after the fault, not when the job ends
DYING = ("reset", "rank-killed")    # scenarios whose ranks may exit (fail) once the fault is in
STOP_MARGIN_STEPS = 5               # --stop-file: steps between the last one logged and the one all ranks stop at,
STOP_MARGIN_S = 1.0                 # ... fewer (1 at least) when this much time is fewer steps (25 s steps: 1, not 5)
CAPTURE_END_MARGIN_S = 1.0          # the job (or the hang) lasts this long after the last capture ended
# A capture ends with the launcher's Ctrl-C after --capture-duration-s; its own --duration is
# that plus this, only a backstop: were both due at once, the Ctrl-C could land after capture
# has written its bundle and restored Python's SIGINT handler (rc -2, the bundle complete).
CAPTURE_BACKSTOP_S = 30.0

# Scenario defaults; every one can be overridden on the command line.
DEFAULTS = {
    "common": dict(steps=16, compute_ms=40.0, buckets="262144,262144,131072,65536", dtype="float32",
                   pattern="ddp", start_s=0.5, hold_s=3.0),
    "clean": dict(),
    "loss": dict(loss_permille=20, direction="both", steps=12),
    "slow-link": dict(rate="200mbit", direction="both", steps=12),
    "straggler": dict(straggle_ms=250.0, steps=12),
    "mismatch-hang": dict(steps=100000, skip_mode="stop"),
    "link-down-hang": dict(steps=100000, start_s=1.0, compute_ms=5.0, link_side="switch"),
    "gpu-hang": dict(steps=100000),
    "reset": dict(steps=100000, start_s=1.0, compute_ms=20.0),
    "selftest": dict(),
    # SIGKILL (or --kill-signal SEGV) of rank r mid-collective, --start-s after training began or
    # once it enqueued collective #--at-op; its peers see closed connections and fail or hang
    "rank-killed": dict(steps=100000, start_s=1.0, compute_ms=20.0, kill_signal="KILL", hold_s=8.0),
    # switch port p<r> down --down-s, then up, --flaps times (--up-s apart); the hold covers them
    "link-flap": dict(steps=100000, start_s=1.0, compute_ms=20.0, down_s=3.0, up_s=2.0, flaps=1, hold_s=12.0),
    # rank r's CPU quota cut (its own cgroup) from --start-s; compute is CPU work (--compute-busy)
    "cpu-starved": dict(steps=14, compute_ms=20.0, cpu_quota="10%", start_s=0.5),
    # one rank gets the unique id and never calls ncclCommInitRank; its peers wait in init
    "init-hang": dict(steps=100000),
    # the faulty rank's traffic to rank 0's host (the bootstrap root; the store's port excepted)
    # is dropped in the switch before it calls ncclCommInitRank (--init-delay-ms later than the others)
    "init-hang-dropped": dict(steps=100000, init_delay_ms=1500),
    # rank r stops before enqueuing collective #--at-op (default: step 3's first; or, when only
    # --start-s is given, the first of the first burst after it) and stays in host code: --stuck-mode spin (a busy loop
    # on a CPU, host_busy_loop) or block (read(2) of a pipe nobody writes, host_blocked_read), for
    # --stuck-s (0: until the hold ends the run); its peers enqueue it and wait inside it
    "host-stuck": dict(steps=100000, stuck_mode="spin", stuck_s=0.0),
    # rank 0 saves a checkpoint: --hold-s in host code after --start-s, its peers wait in the next
    # collective; a benign stall, no error (issue 44). Enough steps to train ~10 s after it.
    "slow-checkpoint": dict(rank=0, steps=400, start_s=5.0, hold_s=30.0, compute_ms=30.0),
}


class ScenarioError(RuntimeError):
    """The scenario could not run as designed (the launcher exits 1 and says why)."""


def now_ns() -> int:
    return time.time_ns()


def read_events(path: Path) -> list[dict]:
    """The JSON objects of a rank's output or truth file, one a line (other lines skipped;
    none when the file is not there yet)."""
    out = []
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def parse_stagger(text: str) -> tuple[float, float]:
    """--capture-stagger-s ``A-B`` (or ``A``) as (A, B) seconds; ValueError when malformed."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(?:-\s*(\d+(?:\.\d*)?))?\s*", text or "")
    if not m:
        raise ValueError(f"bad stagger {text!r} (A-B seconds, e.g. 0-5)")
    lo = float(m[1])
    hi = float(m[2]) if m[2] is not None else lo
    if hi < lo:
        raise ValueError(f"bad stagger {text!r}: B < A")
    return lo, hi


def stop_margin_steps(step_events: list[list[dict]], compute_ms: float) -> int:
    """Steps between the last one any rank logged and the one every rank stops at: enough
    for STOP_MARGIN_S of steps (a rank must not have begun the stop step before the stop file
    appears), at most STOP_MARGIN_STEPS, at least 1. The step time: the median interval
    between a rank's logged steps, else --compute-ms (a step takes at least that)."""
    gaps = sorted(b["t_ns"] - a["t_ns"] for ev in step_events for a, b in zip(ev, ev[1:]))
    step_s = gaps[len(gaps) // 2] / 1e9 if gaps else compute_ms / 1e3
    if step_s <= 0:
        return STOP_MARGIN_STEPS
    return max(1, min(STOP_MARGIN_STEPS, math.ceil(STOP_MARGIN_S / step_s)))


def parse_capture_start(text: str) -> tuple[str, float]:
    """--capture-start as (mode, offset s): ``before`` -> ("before", 0), ``onset+S`` -> ("onset", S);
    ValueError when malformed."""
    if text == "before":
        return "before", 0.0
    m = re.fullmatch(r"onset\+(\d+(?:\.\d*)?)", text or "")
    if not m:
        raise ValueError(f"bad --capture-start {text!r} (before, or onset+S, e.g. onset+10)")
    return "onset", float(m[1])


def quota_fraction(text: str) -> float:
    """--cpu-quota ``10%`` (or ``0.1``) as a share of one CPU in (0, 1]; ValueError when malformed."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(%?)\s*", text or "")
    v = float(m[1]) / (100.0 if m[2] else 1.0) if m else 0.0
    if not 0 < v <= 1:
        raise ValueError(f"bad --cpu-quota {text!r} (a share of one CPU, e.g. 10%)")
    return v
