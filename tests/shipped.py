"""The shipped lab bundles (tests/fixtures/bundles/<scenario>/, made by
tests/lab/make_bundles.sh), for every test that reads them."""
from __future__ import annotations

from pathlib import Path

import pytest

BUNDLES = Path(__file__).resolve().parent / "fixtures" / "bundles"
# the scenarios that have a bundle
SCENARIOS = sorted(p.name for p in BUNDLES.iterdir() if p.is_dir() and any(p.glob("*.tar.gz"))) \
    if BUNDLES.is_dir() else []


def shipped_bundle(scenario: str) -> Path | None:
    """The scenario's bundle, None when there is none."""
    return next(iter(sorted((BUNDLES / scenario).glob("*.tar.gz"))), None)


def shipped(scenario: str) -> Path:
    """The scenario's bundle; the test is skipped, saying why, when there is none."""
    found = shipped_bundle(scenario)
    if found is None:
        pytest.skip(f"no shipped {scenario} bundle (tests/lab/make_bundles.sh)")
    return found
