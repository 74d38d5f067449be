"""Shared test helpers: where fixtures live, and skips that say exactly why."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, nftables, bpftrace); CI runs as root")


def require_tool(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH (make test installs the Debian packages as root)")


from fuzz.report import pytest_terminal_summary  # noqa: E402,F401  (fuzz counts at the end of a run)


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium through Playwright (never a downloaded browser), for the report's
    browser tests; skips with the reason when either is missing."""
    require_tool("chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install '.[test]')")
    with sync_api.sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []     # root needs --no-sandbox
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=args)
        yield b
        b.close()
