"""Adding a collector is one class and one table row (capture/collectors/__init__.py): a toy
collector rides a real capture through every step of the lifecycle and lands in the bundle and
its manifest, without a line of the orchestrator changed. Also the tables' own rules."""
from __future__ import annotations

import json
import tarfile
import time

from capture.collectors import BUNDLE, RING, Collector
from capture.collectors.tcpdump import Tcpdump
from capture.collectors.tcpdump_ring import TcpdumpRing
from capture.options import CaptureOptions
from capture.runner import Capture


class Toy(Collector):
    """Writes a line per step into toy/steps.txt and its record; restartable."""

    name = "toy"

    def __init__(self, session):
        super().__init__(session)
        self.steps: list[str] = []
        self.samples = 0
        self.runs = 0

    def note(self, step: str) -> None:
        self.steps.append(step)
        out = self.s.staging / "toy" / "steps.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a") as fh:
            fh.write(step + "\n")

    def start(self) -> None:
        self.runs += 1
        self.note(f"start {self.runs}")
        self.s.record("toy", status="running", started_ns=time.time_ns(), files=["toy/steps.txt"])

    def ready(self) -> str | None:
        self.note("ready")
        return "toy ready"

    def sample(self, now: float) -> None:
        if self.samples == 0:
            self.note("sample")
        self.samples += 1

    def stop(self) -> None:
        self.note("stop")

    def finish(self) -> None:
        self.note("finish")
        self.s.record("toy", status="ok", ended_ns=time.time_ns(), samples=self.samples, runs=self.runs)


class Restart:
    """Capture hooks that stop and start the toy again once, mid-capture."""

    def __init__(self):
        self.cap = None
        self.done = False

    def started(self) -> None:
        pass

    def tick(self, now: float) -> None:
        toy = self.cap.collector("toy")
        if not self.done and toy.samples >= 2:
            self.done = True
            toy.stop()
            toy.start()


def options(tmp_path) -> CaptureOptions:
    return CaptureOptions(output=str(tmp_path), duration_s=1.5, bpf=False, pcap=False, stacks="never",
                          ss_every_s=0, recover=False, progress="off", batch_sched=False)


def manifest_and_names(path):
    with tarfile.open(path) as t:
        names = t.getnames()
        m = json.load(t.extractfile(next(n for n in names if n.endswith("/manifest.json"))))
    return m, names


def test_a_toy_collector_is_one_class_and_one_row(tmp_path):
    hooks = Restart()
    cap = Capture(options(tmp_path), table=BUNDLE + (Toy,), hooks=hooks)
    hooks.cap = cap
    res = cap.run()
    toy = cap.collector("toy")
    # every step, in the orchestrator's order, the restart in the middle
    assert toy.steps[:3] == ["start 1", "ready", "sample"]
    assert toy.steps[3:5] == ["stop", "start 2"]
    assert toy.steps[-2:] == ["stop", "finish"]
    assert toy.samples >= 3
    m, names = manifest_and_names(res.path)
    rec = m["collectors"]["toy"]
    assert rec["status"] == "ok" and rec["runs"] == 2 and rec["samples"] == toy.samples
    assert any(n.endswith("/toy/steps.txt") for n in names)
    # the real collectors ran beside it, as they do without it
    assert m["collectors"]["ss@host:start"]["status"] == "ok"
    assert m["collectors"]["tracer"]["reason"] == "--no-bpf"


def test_stop_goes_in_reverse_table_order(tmp_path):
    order: list[str] = []

    def named(n):
        class C(Collector):
            name = n

            def stop(self):
                order.append(f"stop {n}")

            def finish(self):
                order.append(f"finish {n}")
        return C
    cap = Capture(options(tmp_path), table=(named("a"), named("b"), named("c")))
    cap.run()
    assert order == ["stop c", "stop b", "stop a", "finish a", "finish b", "finish c"]


def test_the_tables():
    names = [c.name for c in BUNDLE]
    assert len(names) == len(set(names))
    assert all(issubclass(c, Collector) for c in BUNDLE + RING)
    # the watcher runs the same collectors; only tcpdump differs (the packet ring)
    assert [c for c in BUNDLE if c is not Tcpdump] == [c for c in RING if c is not TcpdumpRing]
    assert Tcpdump in BUNDLE and TcpdumpRing in RING and Tcpdump not in RING


def test_each_collector_is_named_after_what_it_drives():
    """A collector's module and class carry its record's name (the tool or file it drives:
    ``tcpdump`` -> collectors/tcpdump.py, ``Tcpdump``); the watcher's variant adds ``ring``."""
    for c in set(BUNDLE + RING):
        ring = c in RING and c not in BUNDLE
        stem = c.name.replace("-", "_") + ("_ring" if ring else "")
        assert c.__module__ == f"capture.collectors.{stem}", (c, c.__module__)
        assert c.__name__ == "".join(w.capitalize() for w in stem.split("_")), (c, c.__name__)


def test_a_collector_that_raises_is_recorded_and_the_capture_goes_on(tmp_path):
    class Broken(Collector):
        name = "broken"

        def sample(self, now):
            raise RuntimeError("boom")

    cap = Capture(options(tmp_path), table=BUNDLE + (Broken,))
    res = cap.run()
    m, names = manifest_and_names(res.path)
    assert m["collectors"]["broken"]["status"] == "failed" and "sample: RuntimeError: boom" in \
        m["collectors"]["broken"]["reason"]
    assert res.exit_code == 3 and m["collectors"]["ss@host:end"]["status"] == "ok"


class _Running:
    def poll(self):
        return None


def test_the_packet_rings_skipped_interfaces_are_tried_again_when_a_slot_is_free():
    """A watcher runs for days: an interface skipped because the pcap share's slots were taken
    (by earlier jobs' tcpdumps) is started once one is free, and a skipped one takes no slot.
    Before, every job's interfaces were skipped for good once four had been (make watch-faults:
    a slow link's bundle with no packets)."""
    import threading
    from types import SimpleNamespace
    ring = TcpdumpRing.__new__(TcpdumpRing)
    records = {"tcpdump@old/eth0": {"status": "skipped"}, "tcpdump@job/eth0": {"status": "skipped"}}
    ring.s = SimpleNamespace(records=records, lock=threading.Lock())
    ring.on_trouble, ring.armed, ring.n_slots, ring.done = True, True, 2, []
    job = SimpleNamespace(own=False, pids={42}, ifaces=["eth0"])
    old = SimpleNamespace(own=False, pids=set(), ifaces=["eth0"])
    ring.wanted = {(1, "eth0"): (job, "eth0"), (2, "eth0"): (old, "eth0")}
    ring.tcpdumps = {(1, "eth0"): {"proc": None, "key": "tcpdump@job/eth0", "full": True},
                     (2, "eth0"): {"proc": None, "key": "tcpdump@old/eth0", "full": False},
                     (3, "eth0"): {"proc": _Running(), "key": "tcpdump@live/eth0"}}
    assert ring.slots_used() == 1                          # the skipped ones take none
    started = []
    ring.start_tcpdumps = started.extend
    ring.prune(keep_s=60)
    assert started == [(job, "eth0")]                      # the live job's interface, tried again
    assert (2, "eth0") not in ring.tcpdumps and (2, "eth0") not in ring.wanted   # the gone job's, forgotten
    assert "tcpdump@old/eth0" not in records and "tcpdump@job/eth0" in records
    started.clear()
    ring.tcpdumps[(4, "eth0")] = {"proc": _Running(), "key": "tcpdump@other/eth0"}
    ring.prune(keep_s=60)
    assert started == []                                   # both slots taken: not yet
