"""The CI fuzz runs in a background process while the lab and capture tests wait on their jobs.

``make test`` spends most of its first half waiting (lab jobs held hung, tracers attaching and
detaching), and the fuzz runs (:mod:`fuzz.plan`, ~6 minutes of CPU) need no root, no lab and
no timing. tests/conftest.py starts this module at the start of a run that selects them, as
SCHED_IDLE at nice 19: it takes only CPU nobody else wants, so the lab's timing is what it
would be without it. Each run's outcome is a JSON line of ``OUT`` (kind, target, inputs,
project_errors, failures: what :func:`fuzz.runner.run_parallel` returns); the fuzz tests read
their line (:func:`result`) and assert on it as if they had run the inputs themselves, and
run them themselves when the line never comes (the process died, or was not started).

    python tests/fuzz/background.py OUT.jsonl CRASH_DIR [kind:target ...]
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):             # run as a script: tests/ and the repository on the path
    sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]

from fuzz import plan, runner  # noqa: E402

STARTED: dict = {}       # this session's background run: {"out": Path, "proc": Popen}


def main(argv: list[str]) -> int:
    out, crashes = Path(argv[0]), Path(argv[1])
    wanted = set(argv[2:])
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass
    os.nice(19 - os.nice(0))
    from fuzz.targets import TARGETS
    for kind, name, n in plan.runs(TARGETS):
        if wanted and f"{kind}:{name}" not in wanted:
            continue
        t0 = time.monotonic()
        if plan.JOBS > 1 and name in plan.PARALLEL:
            r = runner.run_parallel(name, n, 0, plan.JOBS, plan.TIME_LIMIT_S, crashes / name)
        else:
            r = runner.run_one(name, n, 0, plan.TIME_LIMIT_S, crashes / name, None)
        r.update(kind=kind, wall_s=round(time.monotonic() - t0, 1))
        with out.open("a") as f:
            f.write(json.dumps(r) + "\n")
    return 0


def start(out: Path, crashes: Path, selected: list[str], cwd: Path) -> None:
    """Start the background run of ``selected`` (``kind:target``) for this session."""
    import subprocess
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(out), str(crashes), *selected],
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=(out.parent / "background.err").open("w"))
    STARTED.update(out=out, proc=proc, selected=set(selected))


def result(kind: str, name: str, timeout_s: float = 1800.0) -> dict | None:
    """The background run's outcome of ``kind:name``, waited for; None when it was not
    started for this target, or its process ended (or ran past ``timeout_s``) without it:
    the caller then runs the inputs itself."""
    if not STARTED or f"{kind}:{name}" not in STARTED["selected"]:
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        done = STARTED["proc"].poll() is not None
        for line in STARTED["out"].read_text().splitlines() if STARTED["out"].exists() else []:
            r = json.loads(line)
            if r.get("kind") == kind and r.get("target") == name:
                runner.COUNTS[name] = runner.COUNTS.get(name, 0) + r["inputs"]     # counted there, shown here
                return r
        if done or time.monotonic() > deadline:
            return None
        time.sleep(0.5)


def stop() -> None:
    """End the background run (the session is over)."""
    proc = STARTED.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    STARTED.clear()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
