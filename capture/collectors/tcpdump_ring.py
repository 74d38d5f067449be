"""The watcher's packet ring (``--pcap-ring``): tcpdump on the job's interfaces as a ring of
files within the pcap share. With ``on-trouble`` (the default) it taps only from TCP trouble the
tracer reports in the job's namespaces (or a trigger) on, until ``--pcap-linger`` passes
without either: a tap costs the job's own threads a copy of every packet, and the onset itself
is in the tracer's TCP events. ``always`` taps all the time, as a capture does.

Standard library only."""
from __future__ import annotations

import collections
import signal
import time

from .. import children
from .. import manifest as schema
from ..staging import tcpdump_files
from .tcpdump import Tcpdump

# the tracer's events that start the packet ring: this many TCP retransmissions or resets
# within PCAP_ARM_WINDOW_S. A busy host retransmits now and then with nothing wrong (a tail
# loss probe, a spurious timeout under CPU contention); a dead link or a loss burst retransmits
# again within a second or two (RTO backoff 0.2, 0.4, 0.8 s ...)
PCAP_ARM_EVENTS = 3
PCAP_ARM_WINDOW_S = 10.0
MAX_TROUBLE = 1000                   # kept between two polls


class TcpdumpRing(Tcpdump):
    """Tcpdump with runs: ``wanted`` holds the job's interfaces (tapped only while ``armed``),
    ``done`` the tcpdumps of earlier runs whose files are still in the ring, ``runs`` when each
    run started and stopped and why (the bundle's ``watch.pcap_ring``)."""

    def __init__(self, session):
        super().__init__(session)
        o = session.o
        self.on_trouble = o.pcap and o.bpf and o.pcap_ring == "on-trouble"
        self.linger_s = max(o.pcap_linger_s, session.policy.age_s)
        self.armed = False
        self.gen = 1                            # the ring's runs: the second one's files are -r2...
        self.last_trouble = -1e18               # monotonic s
        self.wanted: dict = {}                  # (netns inode, iface) -> (NetNs, iface): the job's
        self.done: list[dict] = []
        self.runs: list[dict] = []
        self.trouble: collections.deque = collections.deque()   # (monotonic s, event) lately

    def start(self) -> None:
        if self.on_trouble and self.s.spool is None:
            self.on_trouble = False
            self.s.notes.append("--pcap-ring on-trouble: no tracer to see TCP trouble, the packet ring runs all "
                                "the time")
        super().start()

    def mode(self) -> str:
        return "on-trouble" if self.on_trouble else "always" if self.s.o.pcap else "off"

    def start_tcpdumps(self, pairs) -> None:
        """The job's interfaces are remembered; tcpdump starts on them now only when the packet
        ring runs (--pcap-ring always, or TCP trouble since --pcap-linger)."""
        for ns, iface in pairs:
            self.wanted.setdefault((ns.inode, iface), (ns, iface))
        if not self.on_trouble or self.armed:
            super().start_tcpdumps(pairs)
        elif pairs and not (self.s.records.get("tcpdump") or {}).get("waiting"):
            self.waiting("no TCP trouble seen yet")

    def waiting(self, why: str) -> None:
        self.s.record("tcpdump", status="skipped", waiting=True,
                      reason=f"--pcap-ring on-trouble: {why}; the packet ring starts when the tracer sees "
                             f"{PCAP_ARM_EVENTS} TCP retransmissions or resets within {PCAP_ARM_WINDOW_S:g}s in "
                             "the job's namespaces, or at a trigger")

    def tcpdump_tag(self) -> str:
        return f"-r{self.gen}" if self.gen > 1 else ""

    def ring_plan(self) -> list[str]:
        """on-trouble: each run of the ring gets half the interface's share. A run lasts at
        least --pcap-linger (no shorter than the rings' age), so when one starts only the run
        before it can still have files in the ring: the two stay within the share."""
        if not self.on_trouble:
            return super().ring_plan()
        full = self.pcap_slot_bytes
        self.pcap_slot_bytes = full // 2
        try:
            return super().ring_plan()
        finally:
            self.pcap_slot_bytes = full

    def arm(self, why: str) -> None:
        """TCP trouble or a trigger: the packet ring runs (again) for --pcap-linger from now."""
        s = self.s
        self.last_trouble = time.monotonic()
        if not self.on_trouble or self.armed:
            return
        self.armed = True
        with s.lock:
            if (s.records.get("tcpdump") or {}).get("waiting"):
                del s.records["tcpdump"]
        self.runs = self.runs[-19:] + [schema.PCAP_RUN.make(started_ns=time.time_ns(), why=why)]
        self.start_tcpdumps(list(self.wanted.values()))     # returns once they listen
        s.log(f"packet ring on ({why})")

    def disarm(self) -> None:
        """--pcap-linger without TCP trouble or a trigger: tcpdump stops; the files of its run
        stay in the ring until they are older than the rings keep."""
        self.armed = False
        for k, t in list(self.tcpdumps.items()):
            if t.get("proc") is None:
                continue                  # skipped (its reason stands): not a run of the ring
            children.stop(t["proc"], signal.SIGINT, grace_s=3)
            t["fh"].close()
            del self.tcpdumps[k]
            self.done.append(t)
        self.gen += 1
        if self.runs:
            self.runs[-1].update(schema.PCAP_RUN.make(stopped_ns=time.time_ns()))
        self.waiting(f"stopped after {self.linger_s:g}s without TCP trouble")
        self.s.log(f"packet ring off: no TCP trouble for {self.linger_s:g}s")

    def see_trouble(self, events: list[dict], incident_open: bool) -> None:
        """The tracer's TCP trouble events since the last call: arm the ring when enough of them
        are in the job's namespaces; disarm it after --pcap-linger without any (not during an
        incident)."""
        if not self.on_trouble:
            return
        ours = {ns.inode for ns in self.s.netns.values()}
        now = time.monotonic()
        recent = self.trouble
        for e in events:
            if not e.get("netns") or e.get("netns") in ours:
                recent.append((now, e))
        while recent and (recent[0][0] < now - PCAP_ARM_WINDOW_S or len(recent) > MAX_TROUBLE):
            recent.popleft()
        if len(recent) >= PCAP_ARM_EVENTS:
            e = recent[0][1]
            self.arm(f"{len(recent)} TCP trouble events within {PCAP_ARM_WINDOW_S:g}s, the first "
                     f"{e.get('ev')} {e.get('saddr') or e.get('saddr6')}:{e.get('sport')} > "
                     f"{e.get('daddr') or e.get('daddr6')}:{e.get('dport')}")
        elif self.armed and not incident_open and time.monotonic() - self.last_trouble > self.linger_s:
            self.disarm()

    def prune(self, keep_s: float) -> None:
        """Jobs come and go: the interfaces of namespaces whose processes are gone are
        forgotten, files of earlier runs older than ``keep_s`` removed, and the files of
        tcpdumps whose interface went with its job removed (their slot serves the next job).
        An interface skipped for want of a slot is tried again, once the ring runs and a slot
        is free: a watcher runs for days, and a skip was for good before (every later job's
        interfaces skipped once four had been)."""
        s = self.s
        for k, t in list(self.tcpdumps.items()):
            job_alive = k in self.wanted and bool(self.wanted[k][0].pids)
            if t.get("proc") is None and (t.get("full") or not job_alive):
                del self.tcpdumps[k]         # skipped: tried again below, or its job is gone
                if not job_alive:
                    with s.lock:
                        s.records.pop(t["key"], None)
        for k, (ns, _iface) in list(self.wanted.items()):
            if not ns.own and not ns.pids and k not in self.tcpdumps:
                del self.wanted[k]           # a job's namespace, its processes gone
        for t in list(self.done):         # earlier runs of the packet ring: their files age out
            left = []
            for f in tcpdump_files(t["out"]):
                try:
                    if time.time() - f.stat().st_mtime > keep_s:
                        f.unlink()
                    else:
                        left.append(f)
                except OSError:
                    pass
            if not left:
                self.done.remove(t)
                with s.lock:
                    s.records.pop(t["key"], None)
        for k, t in list(self.tcpdumps.items()):
            p = t.get("proc")
            if p is None or p.poll() is None:
                continue
            files = tcpdump_files(t["out"])
            try:
                idle = all(time.time() - f.stat().st_mtime > keep_s for f in files)
            except OSError:
                idle = False
            if idle:
                for f in files:
                    f.unlink(missing_ok=True)
                t["fh"].close()
                del self.tcpdumps[k]
                self.wanted.pop(k, None)
                ns = t["ns"]
                if t["iface"] in ns.ifaces:
                    ns.ifaces.remove(t["iface"])
        retry = [pair for k, pair in self.wanted.items() if k not in self.tcpdumps]
        if retry and (self.armed or not self.on_trouble) and self.slots_used() < self.n_slots:
            self.start_tcpdumps(retry)

    def stop_quietly(self) -> None:
        """Every tcpdump stopped, nothing recorded (the watcher's end: its rings are dropped)."""
        for t in self.tcpdumps.values():
            if t.get("proc") is not None:
                children.stop(t["proc"], signal.SIGINT, grace_s=3)
                t["fh"].close()
                t["proc"] = None
