"""Drive a fuzz target: N seeded inputs, each checked against the target's contract.

Per input: the project's own one-line error counts as handled; a contract violation, any
other exception, or a call that uses more than ``time_limit`` of CPU time (SIGPROF: a parser
in a loop, however busy the machine is; the sizes are bounded, so a slow input is a hang) is
a failure, kept with its input. Failures are de-duplicated by exception type and the
innermost frame, so one bug is reported once with the smallest input that shows it;
``crash_dir`` receives those inputs as files.
"""
from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .targets import ALL_TARGETS, PWNED, ContractViolation, Target, Workdir, project_error

COUNTS: dict[str, int] = {}          # target -> inputs run in this process (for the summary)
BENCH = Path(__file__).resolve().parents[2] / "bench" / "fuzz.py"     # the worker processes' script


class Hang(Exception):
    pass


@dataclass
class Failure:
    target: str
    kind: str                 # exception type or "hang"
    where: str                # innermost frame of our code
    message: str
    data: bytes
    trace: str

    def describe(self) -> str:
        return (f"{self.target}: {self.kind} at {self.where}: {self.message[:300]}\n"
                f"  input ({len(self.data)} bytes): {self.data[:200]!r}\n{self.trace}")


@dataclass
class Outcome:
    target: str
    inputs: int = 0
    project_errors: int = 0
    seconds: float = 0.0
    failures: dict[tuple[str, str], Failure] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.target}: {self.inputs} inputs, {self.project_errors} one-line errors, "
                f"{len(self.failures)} distinct failure(s), {self.seconds:.1f}s")


def _where(tb) -> str:
    frames = traceback.extract_tb(tb)
    ours = [f for f in frames if "/forensics/" in f.filename or "/capture/" in f.filename] or frames
    f = ours[-1]
    return f"{Path(f.filename).name}:{f.lineno} ({f.name})"


def _alarm(signum, frame):
    raise Hang()


def run_target(target: Target | str, n: int, seed: int = 0, *, crash_dir: Path | None = None,
               time_limit: float = 10.0, work: Workdir | None = None, max_seconds: float | None = None) -> Outcome:
    t = ALL_TARGETS[target] if isinstance(target, str) else target
    rng = random.Random(f"{t.name}:{seed}")
    own_work = work is None
    work = work or Workdir()
    out = Outcome(t.name)
    t0 = time.monotonic()
    old = signal.signal(signal.SIGPROF, _alarm)
    try:
        for _ in range(n):
            if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                break
            data = t.generate(rng, t)
            out.inputs += 1
            signal.setitimer(signal.ITIMER_PROF, time_limit)
            try:
                t.check(data, work)
            except Hang:
                _keep(out, Failure(t.name, "hang", f"over {time_limit:g}s", "", data, ""))
            except Exception as e:  # noqa: BLE001 - every exception is classified here
                signal.setitimer(signal.ITIMER_PROF, 0)
                try:
                    handled = not isinstance(e, ContractViolation) and project_error(e)
                except ContractViolation as v:
                    e, handled = v, False
                if handled:
                    out.project_errors += 1
                else:
                    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
                    _keep(out, Failure(t.name, type(e).__name__, _where(e.__traceback__), str(e), data, tb))
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            if PWNED.exists():
                PWNED.unlink()
                _keep(out, Failure(t.name, "PICKLE-RAN-CODE", "unpickler", f"{PWNED} was created", data, ""))
    finally:
        signal.signal(signal.SIGPROF, old)
        if own_work:
            work.close()
    out.seconds = time.monotonic() - t0
    COUNTS[t.name] = COUNTS.get(t.name, 0) + out.inputs
    if crash_dir is not None and out.failures:
        crash_dir.mkdir(parents=True, exist_ok=True)
        for f in out.failures.values():
            if f.kind not in ("hang", "PICKLE-RAN-CODE"):
                f.data = shrink(t, f.data, budget=200)
            h = hashlib.sha1(f.data).hexdigest()[:12]
            (crash_dir / f"{f.target}-{f.kind}-{h}.bin").write_bytes(f.data)
    return out


def run_one(name: str, n: int, seed: int, time_limit: float, crash_dir: Path | None, work: Path | None) -> dict:
    """One worker's share: the outcome as JSON-able data."""
    out = run_target(name, n, seed=seed, time_limit=time_limit, crash_dir=crash_dir,
                            work=Workdir(work) if work else None)
    return {"target": name, "inputs": out.inputs, "project_errors": out.project_errors, "seconds": out.seconds,
            "failures": [{"kind": f.kind, "where": f.where, "message": f.message[:500], "size": len(f.data),
                          "input_hex": f.data[:4096].hex(), "trace": f.trace} for f in out.failures.values()]}


def run_parallel(name: str, n: int, seed: int, jobs: int, time_limit: float, crash_dir: Path | None) -> dict:
    """n inputs of one target over ``jobs`` worker processes (seeds seed*1000+i)."""
    if jobs <= 1:
        return run_one(name, n, seed, time_limit, crash_dir, None)
    procs = []
    with tempfile.TemporaryDirectory(prefix="stallscope-fuzz-jobs-") as tmp:
        for i in range(jobs):
            share = n // jobs + (1 if i < n % jobs else 0)
            work = Path(tmp) / f"work{i}"
            argv = [sys.executable, str(BENCH), "--worker", "--target", name, "--examples", str(share),
                    "--seed", str(seed * 1000 + i), "--time-limit", str(time_limit), "--workdir", str(work),
                    "--json", str(Path(tmp) / f"out{i}.json")]
            if crash_dir:
                argv += ["--crash-dir", str(crash_dir)]
            procs.append((subprocess.Popen(argv, cwd=BENCH.parent.parent), work, Path(tmp) / f"out{i}.json"))
        merged = {"target": name, "inputs": 0, "project_errors": 0, "seconds": 0.0, "failures": []}
        for p, work, out in procs:
            rc = p.wait()
            if rc != 0 or not out.exists():
                last = sorted(work.glob("*"), key=lambda x: x.stat().st_mtime)[-1:] if work.exists() else []
                data = last[0].read_bytes() if last and last[0].is_file() else b""
                merged["failures"].append({"kind": f"worker died (exit {rc})", "where": "native code?",
                                           "message": f"last input file: {last[0].name if last else '?'}",
                                           "size": len(data), "input_hex": data[:4096].hex(), "trace": ""})
                continue
            r = json.loads(out.read_text())
            for k in ("inputs", "project_errors"):
                merged[k] += r[k]
            merged["seconds"] = max(merged["seconds"], r["seconds"])
            merged["failures"] += r["failures"]
    COUNTS[name] = COUNTS.get(name, 0) + merged["inputs"]
    return merged


def _keep(out: Outcome, f: Failure) -> None:
    key = (f.kind, f.where)
    old = out.failures.get(key)
    if old is None or len(f.data) < len(old.data):
        out.failures[key] = f


def count(name: str, n: int) -> None:
    """Inputs generated elsewhere (hypothesis) for the summary."""
    COUNTS[name] = COUNTS.get(name, 0) + n


def reproduce(target: Target | str, data: bytes, work: Workdir | None = None) -> str | None:
    """The failure an input causes now ("kind at where"), or None."""
    t = ALL_TARGETS[target] if isinstance(target, str) else target
    own = work is None
    work = work or Workdir()
    try:
        t.check(data, work)
        return None
    except ContractViolation as e:
        return f"ContractViolation: {e}"
    except Exception as e:  # noqa: BLE001
        try:
            if project_error(e):
                return None
        except ContractViolation as v:
            return f"ContractViolation: {v}"
        return f"{type(e).__name__} at {_where(e.__traceback__)}"
    finally:
        if own:
            work.close()


def shrink(target: Target | str, data: bytes, budget: int = 400) -> bytes:
    """A smaller input that fails the same way: drop lines, then byte chunks (greedy)."""
    work = Workdir()
    try:
        want = reproduce(target, data, work)
        if want is None:
            return data
        tries = 0

        def same(candidate: bytes) -> bool:
            nonlocal tries
            tries += 1
            return reproduce(target, candidate, work) == want
        for sep in (b"\n", None):
            parts = data.split(b"\n") if sep else [data[i:i + 16] for i in range(0, len(data), 16)]
            joiner = sep or b""
            i = 0
            while i < len(parts) and tries < budget:
                cand = joiner.join(parts[:i] + parts[i + 1:])
                if same(cand):
                    parts = parts[:i] + parts[i + 1:]
                else:
                    i += 1
            data = joiner.join(parts)
        return data
    finally:
        work.close()
