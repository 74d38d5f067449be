"""The outputs of every shipped bundle set, kept as golden files (issue 37: a restructuring
must change no output). ``python -m tests.golden`` writes them; tests/forensics/test_golden.py compares.

Each case is one shipped set (tests/fixtures/bundles/<scenario>/, one capture; and
tests/fixtures/bundles-per-host/<case>/, one bundle per host), analysed with its bundles
given by their paths relative to the repository (the JSON names them). Golden files live in
tests/fixtures/golden/<kind>-<case>/: findings.json, summary.md and trace.json, byte for byte
as ``stallscope analyze`` writes them. The HTML report carries its generation time and a
random CSP nonce, and is left to the report tests.
"""
from __future__ import annotations

import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = FIXTURES / "golden"
OUTPUTS = {"--json": "findings.json", "--markdown": "summary.md", "--perfetto": "trace.json"}
SETS = {"one": FIXTURES / "bundles", "per-host": FIXTURES / "bundles-per-host"}


def cases() -> dict[str, list[str]]:
    """case name -> its bundles, relative to the repository root."""
    out = {}
    for kind, base in SETS.items():
        if not base.is_dir():
            continue
        for d in sorted(p for p in base.iterdir() if p.is_dir()):
            bundles = sorted(str(b.relative_to(ROOT)) for b in d.glob("*.tar.gz"))
            if bundles:
                out[f"{kind}-{d.name}"] = bundles
    return out


def render(bundles: list[str], out: Path) -> dict[str, bytes]:
    """Every golden output of ``bundles`` (analysed from the repository root, one job: the
    outputs must not depend on the parallelism either), by file name."""
    sys.path.insert(0, str(ROOT))
    from forensics.cli import Env, main
    out.mkdir(parents=True, exist_ok=True)
    argv = ["analyze", *bundles, "-o", str(out / "report.html"), "--jobs", "1", "--force"]
    for flag, name in OUTPUTS.items():
        argv += [flag, str(out / name)]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rc = main(argv, Env(stdout=io.StringIO(), stderr=io.StringIO()))
    finally:
        os.chdir(cwd)
    if rc not in (0, 1):
        raise RuntimeError(f"analyze {' '.join(bundles)}: exit code {rc}")
    return {name: (out / name).read_bytes() for name in OUTPUTS.values()}


def write(tmp: Path) -> list[Path]:
    written = []
    for case, bundles in cases().items():
        for name, data in render(bundles, tmp / case).items():
            dest = GOLDEN / case / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            written.append(dest)
    return written


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as t:
        for p in write(Path(t)):
            print(p.relative_to(ROOT))
