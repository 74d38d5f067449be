"""conftest's overlap of the lab pool with pure-CPU tests names modules by file name: a renamed
or removed module would silently leave the overlap (and CI's time) behind."""
from __future__ import annotations

import conftest
from conftest import ROOT


def test_every_overlap_module_and_the_lab_pool_module_exist():
    names = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    assert not conftest.OVERLAP_MODULES - names, sorted(conftest.OVERLAP_MODULES - names)
    assert conftest.LAB_POOL_MODULE in names
