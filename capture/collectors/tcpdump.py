"""Packets: tcpdump on each interface NCCL uses, in each network namespace of the job (headers
only, ``--snaplen``), started together so none misses the others' start-up, each within its
slot of the pcap share (``-C/-W`` ring files, or ``-c`` when the share is small). Interfaces
that come into use later are tapped when found.

Standard library only."""
from __future__ import annotations

import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

from .. import bundle_files as bd
from .. import children
from ..jobs import NetNs
from ..session import LOG_CAP, tail
from ..staging import rename_ring, tcpdump_files
from .collector import Collector

TPACKET_BLOCK_S = 1.05   # libpcap retires a partly filled block of its kernel ring after tcpdump's 1 s timeout


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:          # a ring file rotated away meanwhile
        return 0


class Tcpdump(Collector):
    """One tcpdump per (namespace, interface): ``tcpdumps`` maps (netns inode, interface) to
    its run (``proc`` None when it was skipped, with the reason recorded)."""

    name = "tcpdump"
    share = "pcap"

    def __init__(self, session):
        super().__init__(session)
        self.tcpdumps: dict[tuple[int, str], dict] = {}
        self.n_slots = 0
        self.pcap_slot_bytes = 0

    def start(self) -> None:
        s = self.s
        n_if = sum(len(ns.ifaces) for ns in s.netns.values())
        self.n_slots = max(s.o.pcap_slots, n_if)
        self.pcap_slot_bytes = s.budget.pcap // self.n_slots if self.n_slots else 0
        self.start_tcpdumps([(ns, iface) for ns in list(s.netns.values()) for iface in ns.ifaces])
        if not any(ns.ifaces for ns in s.netns.values()):
            s.record("tcpdump", status="skipped",
                     reason="--no-pcap" if not s.o.pcap else "no interface yet: no --iface, and no NCCL process "
                     "with NCCL_SOCKET_IFNAME or a connection off loopback (interfaces are captured as they "
                     "come into use)")

    def ready(self) -> str | None:
        return f"tcpdump on {sum(1 for t in self.tcpdumps.values() if t.get('proc'))} interface(s)"

    def adopt(self, fresh, new_ns, new_ifaces) -> None:
        self.start_tcpdumps(new_ifaces)

    def stop(self) -> None:
        self.stop_tcpdumps()
        self.no_pcap_warning()

    def status(self) -> dict:
        return {"packets": self.packets()}

    def has_tap(self, inode: int) -> bool:
        """Whether an interface of that namespace is (or was asked to be) tapped."""
        return any(k[0] == inode for k in self.tcpdumps)

    def ring_plan(self) -> list[str]:
        """tcpdump options keeping one interface's files within its slot of the pcap share."""
        s = self.s
        share = self.pcap_slot_bytes
        rec = 16 + s.o.snaplen
        if share >= 2_000_000 + 4 * rec:
            c_mb = max(1, share // 4_000_000)
            w = share // (c_mb * 1_000_000 + rec + 24 + 2 * bd.TAR_BLOCK)
            if w >= 2:
                return ["-C", str(c_mb), "-W", str(min(w, 1000))]
        count = max(1, (share - 24 - 2 * bd.TAR_BLOCK) // rec)
        return ["-c", str(count)]

    def start_tcpdumps(self, pairs: list[tuple[NetNs, str]]) -> None:
        """Start tcpdump on each (namespace, interface) at once, then wait (5 s at most in
        all) until every one is listening: one after the other, each interface would miss
        the packets of the others' start-up time."""
        started = [t for t in (self.spawn(ns, iface) for ns, iface in pairs) if t is not None]
        deadline = time.monotonic() + 5
        for t in started:
            while time.monotonic() < deadline and t["proc"].poll() is None:
                if b"listening on" in t["err"].read_bytes():
                    break
                time.sleep(0.05)

    def tcpdump_tag(self) -> str:
        """Set apart the names (collector key, files) of a tcpdump started again on an interface
        (the watcher's packet ring, restarted on new TCP trouble); a capture starts one."""
        return ""

    def slots_used(self) -> int:
        """The share's slots taken: the tcpdumps started (running, or their files still kept);
        an interface skipped takes none."""
        return sum(1 for t in self.tcpdumps.values() if t.get("proc") is not None)

    def spawn(self, ns: NetNs, iface: str) -> dict | None:
        s = self.s
        c = self.spec
        tag = self.tcpdump_tag()
        key = f"tcpdump@{ns.label}/{iface}{tag}"
        if (ns.inode, iface) in self.tcpdumps:
            return None
        t0 = time.time_ns()
        reason = "--no-pcap" if not s.o.pcap else s.skip_reason(c)
        full = reason is None and self.slots_used() >= self.n_slots
        if full:
            reason = f"pcap share already split over {self.n_slots} interfaces (raise --max-bytes)"
        if reason:
            s.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=t0)
            self.tcpdumps[(ns.inode, iface)] = {"proc": None, "key": key, "full": full}
            return None
        ctx = {"ns": ns, "iface": iface, "phase": "continuous", "pid": ns.pid}
        out = s.staging / s.fill(c.out, ctx)
        if tag:
            out = out.with_name(f"{out.stem}{tag}{out.suffix}")
        out.parent.mkdir(parents=True, exist_ok=True)
        errf = s.staging / "logs" / f"tcpdump-{ns.label}-{iface}{tag}.stderr.txt"
        errf.parent.mkdir(parents=True, exist_ok=True)
        args = s.policy.tcpdump_args(c.argv)
        argv = s.ns_prefix(ns) + [s.fill(a, ctx) for a in args] + self.ring_plan() + ["-w", str(out)]
        fh = open(errf, "wb")
        proc = children.spawn(argv, stdout=subprocess.DEVNULL, stderr=fh)
        self.tcpdumps[(ns.inode, iface)] = {"proc": proc, "key": key, "out": out, "err": errf, "fh": fh,
                                            "packets": 0, "ns": ns, "iface": iface}
        shown = [a if a != str(out) else s.rel(out) for a in argv]
        s.record(key, status="running", command=shlex.join(shown), started_ns=t0)
        with s.lock:   # the start's "no interface yet" placeholder: an interface has come
            if ((s.records.get("tcpdump") or {}).get("reason") or "").startswith("no interface yet"):
                del s.records["tcpdump"]
        return self.tcpdumps[(ns.inode, iface)]

    def packets(self) -> int:
        """Packets written so far, counted from the pcap record headers (ring files included)."""
        total = 0
        for t in self.tcpdumps.values():
            if not t.get("proc"):
                continue
            n = 0
            for f in tcpdump_files(t["out"]):
                n += bd.pcap_records(f)
            t["packets"] = max(t.get("packets", 0), n)
            total += t["packets"]
        return total

    def flush(self) -> None:
        """Everything a buffered tcpdump (ring mode: no --immediate-mode, no -U) has captured
        until now onto its files: libpcap hands a block of its kernel ring over when the block
        is full or 1 s old, and SIGUSR2 makes tcpdump write out what it holds. Waits up to
        ~1.5 s; packets of the last moment may still be in flight."""
        live = [t for t in self.tcpdumps.values() if t.get("proc") is not None and t["proc"].poll() is None]
        if not self.s.policy.buffered_pcap or not live:
            return
        time.sleep(TPACKET_BLOCK_S)
        for t in live:
            try:
                t["proc"].send_signal(signal.SIGUSR2)
            except ProcessLookupError:
                pass
        sizes, deadline = None, time.monotonic() + 0.5
        while time.monotonic() < deadline:      # written out when the files stop growing
            time.sleep(0.05)
            now = [sum(size_of(f) for f in tcpdump_files(t["out"])) for t in live]
            if now == sizes:
                break
            sizes = now

    def stop_tcpdumps(self) -> None:
        s = self.s
        live = [t for t in self.tcpdumps.values() if t.get("proc") is not None]
        for t in live:
            if t["proc"].poll() is None:
                children.kill_group(t["proc"], signal.SIGINT)
        for t in live:
            p = t["proc"]
            was_alive_rc = p.poll()
            rc = children.stop(p, signal.SIGINT, grace_s=5)
            t["fh"].close()
            err = t["err"].read_bytes()
            bd.truncate_file(t["err"], LOG_CAP)
            files = self.finish_ring(t["out"])
            m = re.findall(rb"(\d+) packets? captured", err)
            drop = re.findall(rb"(\d+) packets? dropped by kernel", err)
            packets = sum(bd.pcap_records(s.staging / f) for f in files)
            if m:
                packets = int(m[-1])
            t["packets"] = packets
            started = b"listening on" in err
            ok = started and (rc == 0 or rc is None or rc < 0)
            reason = None
            if not ok:
                reason = f"tcpdump failed: {tail(err, 400)}"
            elif rc is not None and rc < 0 and rc != -signal.SIGINT:
                reason = f"tcpdump ended by signal {-rc}"
                if s.live_pid(t["ns"]) is None:
                    reason += " when its network namespace was torn down; the file holds what it had written"
            elif was_alive_rc is not None and rc == 0 and "-c" in self.ring_plan():
                reason = "packet count limit of the byte budget reached (first packets kept)"
            # what it covered: its first and last packet (the record headers, UTC ns)
            spans = [sp for f in files if (sp := bd.pcap_span(s.staging / f))]
            covered = [min(a for a, _ in spans), max(b for _, b in spans)] if spans else None
            s.record(t["key"], status="ok" if ok else "failed", rc=rc, reason=reason,
                     files=files + [s.rel(t["err"])], stderr_tail=tail(err), ended_ns=time.time_ns(),
                     packets=packets, dropped_by_kernel=int(drop[-1]) if drop else None,
                     netns=t["ns"].label, iface=t["iface"], covered_ns=covered)

    def no_pcap_warning(self) -> None:
        """No tcpdump ran (and --no-pcap was not given): one warning line on stderr saying why,
        the same in the manifest's notes and as the tcpdump collector's reason."""
        s = self.s
        if not s.o.pcap or any(s.records.get(t["key"], {}).get("status") == "ok"
                               for t in self.tcpdumps.values()):
            return
        why = s.skip_reason(self.spec)
        status = "skipped"
        tried = [t for t in self.tcpdumps.values() if t.get("proc") is not None]
        if why is not None:
            pass
        elif tried:
            status = "failed"
            why = "tcpdump failed on " + ", ".join(f"{t['ns'].label}/{t['iface']}" for t in tried) + \
                  " (see their collectors' reasons)"
        elif self.tcpdumps:
            why = "; ".join(sorted({s.records.get(t["key"], {}).get("reason") or "skipped"
                                    for t in self.tcpdumps.values()}))
        elif s.o.ifaces:
            why = (f"--iface {', '.join(s.o.ifaces)}: in none of the namespaces followed "
                   f"({', '.join(ns.label for ns in s.netns.values() if ns.pids or ns.own)})")
        elif not s.procs:
            why = "no NCCL process found and no --iface given"
        else:
            why = ("no interface in use by the job's processes: no NCCL_SOCKET_IFNAME matching an interface of "
                   "their namespaces and no TCP connection off loopback while capturing (or pass --iface)")
        s.notes.append(f"no packet capture: {why}")
        s.record("tcpdump", status=status, reason=why)
        print(f"stallscope capture: warning: no packet capture: {why}", file=s.err, flush=True)

    def finish_ring(self, out: Path) -> list[str]:
        """The bundle paths of one tcpdump's output: its ring files renamed, or the one file."""
        s = self.s
        ring = rename_ring(out)
        if not ring:
            return [s.rel(out)] if out.exists() else []
        return [s.rel(p) for p in ring]

