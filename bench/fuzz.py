"""Fuzz stallscope's readers of untrusted input: the long run (``make fuzz``).

    python bench/fuzz.py [--examples 100000] [--target NAME ...] [--seed 1] [--jobs 2]
                         [--time-limit 10] [--crash-dir fuzz-crashes] [--json OUT|-]
    python bench/fuzz.py --atheris --target nccl_debug [--atheris-runs 100000]

The targets, their seed samples and the contract they must keep live in tests/fuzz/
(``targets.py``); the CI-sized run is tests/forensics/test_fuzz_parsers.py. Each target gets
``--examples`` inputs, split over ``--jobs`` worker processes (different seeds; a worker
that dies, e.g. of a crash in native code, is reported with the input it was on). Inputs
that break a contract are shrunk and written to ``--crash-dir``; copy one into
tests/fixtures/fuzz/<target>/ with the fix to keep it as a regression test.

``--atheris``: coverage-guided fuzzing of one target with atheris (``pip install atheris``;
optional, skipped with a message when it is not installed). Its inputs are the byte
strings atheris makes; the target's mutator is not used.

Exit code: 0 when nothing broke, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fuzz import runner  # noqa: E402
from fuzz.targets import ALL_TARGETS, TARGETS, Workdir  # noqa: E402


def atheris_run(name: str, runs: int) -> int:
    try:
        import atheris
    except ImportError:
        print("atheris is not installed (pip install atheris): skipped", file=sys.stderr)
        return 0
    t = ALL_TARGETS[name]
    work = Workdir()

    def one(data: bytes) -> None:
        try:
            t.check(data, work)
        except Exception as e:  # noqa: BLE001
            if not runner.project_error(e):
                raise
    import numpy  # noqa: F401  (imported before instrumenting: only stallscope's code is)
    import pandas  # noqa: F401
    with atheris.instrument_imports(include=["forensics"]):
        import forensics.inputs.bundle  # noqa: F401
        import forensics.parsers  # noqa: F401
        import forensics.tcp  # noqa: F401
    # libFuzzer starts from the target's real samples (a corpus folder of them)
    corpus = Path(tempfile.mkdtemp(prefix="stallscope-atheris-"))
    for i, s in enumerate(t.samples):
        (corpus / f"seed{i}").write_bytes(s)
    atheris.Setup([sys.argv[0], f"-runs={runs}", "-max_len=65536", str(corpus)], one)
    atheris.Fuzz()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=100_000, help="inputs per target (default 100000)")
    ap.add_argument("--target", action="append", choices=sorted(ALL_TARGETS), help="only these (repeatable)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds of CPU time one input may take (a hang beyond)")
    ap.add_argument("--crash-dir", type=Path, default=None)
    ap.add_argument("--json", help="write the outcomes as JSON ('-' for stdout)")
    ap.add_argument("--atheris", action="store_true", help="coverage-guided run of one --target with atheris")
    ap.add_argument("--atheris-runs", type=int, default=100_000)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    names = a.target or sorted(TARGETS) + sorted(set(ALL_TARGETS) - set(TARGETS))
    if a.atheris:
        if len(names) != 1:
            ap.error("--atheris fuzzes one --target")
        return atheris_run(names[0], a.atheris_runs)
    if a.worker:
        result = runner.run_one(names[0], a.examples, a.seed, a.time_limit, a.crash_dir, a.workdir)
        Path(a.json).write_text(json.dumps(result))
        return 0
    results, t0 = [], time.monotonic()
    for name in names:
        r = runner.run_parallel(name, a.examples, a.seed, a.jobs, a.time_limit, a.crash_dir)
        results.append(r)
        print(f"{name:<22} {r['inputs']:>9} inputs  {r['project_errors']:>7} one-line errors  "
              f"{len(r['failures'])} failure(s)  {r['seconds']:7.1f}s", file=sys.stderr, flush=True)
        for f in r["failures"]:
            print(f"    {f['kind']} at {f['where']}: {f['message'][:200]} ({f['size']} bytes)", file=sys.stderr)
    total = sum(r["inputs"] for r in results)
    print(f"{'total':<22} {total:>9} inputs in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    if a.json:
        text = json.dumps(results, indent=1)
        if a.json == "-":
            print(text)
        else:
            Path(a.json).write_text(text)
    return 1 if any(r["failures"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
