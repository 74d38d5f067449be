"""forensics.execution.memory: what an analysis keeps is settled out of the garbage collector's reach
inside a ``memory.steady`` scope (the command line's), and handed back when the scope ends;
outside a scope nothing changes. The collector's state is per process: every test starts
with nothing frozen and leaves nothing frozen."""
from __future__ import annotations

import gc
import platform

import pytest

from conftest import run_python
from forensics.execution import memory
from forensics.analysis import analyze
from shipped import shipped


@pytest.fixture(autouse=True)
def _thawed():
    # frozen objects here would be another test's (or a ReaderPool's) left behind: a bug to see
    assert gc.get_freeze_count() == 0, "objects left frozen before this test"
    yield
    gc.unfreeze()


class _Cycle:
    def __init__(self):
        self.me = self


def _tracked(obj) -> bool:
    """Whether the collector walks ``obj`` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def test_outside_a_scope_settle_leaves_the_collector_alone():
    kept = _Cycle()
    assert memory.settle() is False
    assert gc.get_freeze_count() == 0 and _tracked(kept)


def test_settled_objects_are_out_of_reach_until_the_outermost_scope_ends():
    with memory.steady():
        kept = _Cycle()
        assert memory.settle() is True
        assert not _tracked(kept)
        with memory.steady():            # the reading's own scope, inside the command line's
            later = _Cycle()
            memory.settle()
        assert not _tracked(later)     # the inner end thaws nothing
        young = _Cycle()
        assert _tracked(young)         # made after the last settle: collected as usual
    assert gc.get_freeze_count() == 0
    assert _tracked(kept) and _tracked(later)


def test_a_scope_entered_with_the_callers_frozen_objects_freezes_and_thaws_nothing():
    theirs = _Cycle()
    gc.freeze()
    with memory.steady():
        ours = _Cycle()
        assert memory.settle() is False
        assert _tracked(ours)
    assert not _tracked(theirs)        # still frozen: the caller's to thaw


def test_a_scope_thaws_even_when_its_body_fails():
    with pytest.raises(RuntimeError):
        with memory.steady():
            memory.settle()
            raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def test_the_model_and_the_hosts_parts_are_settled_in_a_scope_only():
    bundle = shipped("loss")
    a = analyze([bundle])
    try:
        assert gc.get_freeze_count() == 0 and _tracked(a.model.tables["nccl_events"])
    finally:
        a.close()
        del a
    with memory.steady():
        a = analyze([bundle])
        events = a.model.tables["nccl_events"]
        assert not _tracked(events) and not _tracked(a.model)
        assert len(events)
        a.close()
    assert _tracked(events)


def test_the_analyze_command_settles_and_thaws(tmp_path):
    # in a fresh process: the command's scope settles the model while it runs and hands every
    # object back at its end (a library caller's process is left as it was)
    code = ("import gc, sys\n"
            "import forensics.model as m\n"
            "from forensics.cli import main\n"
            "seen = []\n"
            "connect = m.Model.connect\n"
            "def spy(model, *a, **k):\n"   # the model settled once merged, before it is connected
            "    seen.append(gc.get_freeze_count() > 0 and all(o is not model for o in gc.get_objects()))\n"
            "    return connect(model, *a, **k)\n"
            "m.Model.connect = spy\n"
            f"rc = main(['analyze', {str(shipped('loss'))!r}, '-o', {str(tmp_path / 'r.html')!r}, '-q'])\n"
            "print(rc, seen, gc.get_freeze_count())\n")
    p = run_python(code, timeout=300)
    assert p.stdout.split("\n")[-2].split(" ", 1)[1] == "[True] 0"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator's settings are glibc's (mallopt)")
@pytest.mark.parametrize("kept", [False, True])
def test_keep_freed_memory_spares_the_page_faults_of_the_next_allocation(kept):
    # 80 MB of arrays made, written, freed, and made again (a host's reading, in small): by
    # default glibc gives the first back to the kernel (mmap'd blocks, the heap's top) and the
    # second faults it in again, page by page; kept, the second takes what the first left
    code = ("import resource, sys, numpy as np\n"
            "from forensics.execution import memory\n"
            f"if {kept}: assert memory.keep_freed_memory()\n"
            "def touch(): [np.ones(2**20) for _ in range(10)]   # 10 x 8 MB, then freed\n"
            "touch()\n"
            "f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "touch()\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f)\n")
    p = run_python(code, timeout=60)
    faults = int(p.stdout)
    assert (faults < 200) if kept else (faults > 1000), faults     # 80 MB is 20,480 pages
