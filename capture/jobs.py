"""The job a capture follows: its NCCL processes (``capture.procs``), the network namespaces
they live in, and the interfaces NCCL uses in each (the ones tcpdump and the per-interface
snapshots follow). Discovery runs at the start and again every rescan: a capture started
before its job (a prolog, the watcher) finds processes, namespaces and interfaces as they
appear.

Standard library only."""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import manifest as schema
from . import procs
from .options import CaptureOptions


@dataclass
class NetNs:
    """One network namespace holding processes of the job (or capture's own)."""
    inode: int
    label: str
    pid: int | str                  # a process inside it ("self" for capture's own)
    own: bool
    name: str | None = None
    ifaces: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)


def netns_names() -> dict[int, str]:
    """inode -> name of the namespaces ``ip netns`` names (/run/netns)."""
    out = {}
    for p in glob.glob("/run/netns/*"):
        try:
            out[os.stat(p).st_ino] = os.path.basename(p)
        except OSError:
            pass
    return out


def lineage(pid: int) -> tuple[int | None, str | None]:
    """(parent pid, cgroup path) of a live process; None for what cannot be read. The cgroup
    is the unified hierarchy's (``0::/path``), else the first controller line's path."""
    ppid = cgroup = None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/cgroup", "r", errors="replace") as fh:
            lines = [ln.rstrip("\n").split(":", 2) for ln in fh if ln.count(":") >= 2]
        unified = [ln[2] for ln in lines if ln[0] == "0"]
        cgroup = (unified or [ln[2] for ln in lines] or [None])[0]
    except OSError:
        pass
    return ppid, cgroup


def job_key(ppid: int | None, cgroup: str | None) -> str:
    """A job's id: its processes' launcher (parent pid) and cgroup."""
    return f"ppid:{ppid if ppid is not None else '?'}" + (f"@{cgroup}" if cgroup and cgroup != "/" else "")


def _started_ns(start_ticks: int | None) -> int | None:
    """UTC ns of a start time in clock ticks after boot (/proc/stat's btime)."""
    if start_ticks is None:
        return None
    try:
        with open("/proc/stat", "rb") as fh:
            btime = next(int(ln.split()[1]) for ln in fh if ln.startswith(b"btime "))
        return btime * 1_000_000_000 + start_ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None


class Jobs:
    """The processes (pid -> ``procs.ProcInfo``) and namespaces (inode -> :class:`NetNs`)
    followed so far, and how to find more. Processes are told apart into jobs by their
    launcher (parent pid) and cgroup (``lineage``, read when a process is found): the ranks a
    launcher (torchrun, srun's step daemon, mpirun's daemon, a container's entry point) started
    in one cgroup are one job; back-to-back or side-by-side jobs of a host are not."""

    def __init__(self, opts: CaptureOptions):
        self.o = opts
        self.procs: dict[int, procs.ProcInfo] = {}
        self.not_nccl: dict[int, tuple[int, int]] = {}   # processes seen mapping no NCCL (procs.discover)
        self.netns: dict[int, NetNs] = {}
        self.own_ns = procs.netns_inode("self")
        self.ns_names = netns_names()
        self.seen_sockets: dict[int, set[int]] = {}   # netns inode -> connections already looked at
        self.lineage: dict[int, tuple[int | None, str | None]] = {}   # pid -> (ppid, cgroup), when found
        # the capture's own programs that map NCCL (its tracer: bpftrace maps the libraries it
        # probes), never a job: a watcher rescanning while its tracer runs would follow it
        self.tools: set[int] = set()

    def ensure_netns(self, inode: int | None, pid: int | str) -> NetNs:
        if inode is None or inode == self.own_ns:
            inode = self.own_ns or 0
        ns = self.netns.get(inode)
        if ns is None:
            if inode not in self.ns_names:
                self.ns_names = netns_names()
            own = inode == self.own_ns
            name = None if own else self.ns_names.get(inode)
            label = "host" if own else f"netns-{name}" if name and re.fullmatch(r"[\w.-]+", name) else f"netns-{inode}"
            ns = NetNs(inode=inode, label=label, pid="self" if own else pid, own=own, name=name)
            self.netns[inode] = ns
        return ns

    def own(self) -> NetNs:
        return self.ensure_netns(self.own_ns, "self")

    def live_pid(self, ns: NetNs) -> int | str | None:
        """A process still inside ns (namespaces of finished jobs go away with them)."""
        if ns.own:
            return "self"
        for pid in [ns.pid] + ns.pids:
            if procs.netns_inode(pid) == ns.inode:
                return pid
        return None

    def discover(self, symbols, by_env: bool = False) -> list[procs.ProcInfo]:
        """Processes of the job not followed yet (``symbols``: the NCCL API a library must
        export to count; ``by_env``: a process carrying NCCL_* variables counts too, see
        ``procs.discover``); each is added with its namespace."""
        found = procs.discover(symbols, pids=self.o.pids or None, nccl_lib_override=self.o.nccl_libs,
                               skip=set(self.procs) | self.tools, not_nccl=self.not_nccl, by_env=by_env)
        for info in found:
            self.procs[info.pid] = info
            self.lineage[info.pid] = lineage(info.pid)
            self.ensure_netns(info.netns_inode, info.pid).pids.append(info.pid)
        return found

    def refresh_libraries(self, symbols) -> list[procs.ProcInfo]:
        """The followed processes whose NCCL, CUDA runtime or driver libraries changed since
        they were read (a job found before it loaded them, a library loaded later)."""
        return [info for pid, info in sorted(self.procs.items())
                if os.path.isdir(f"/proc/{pid}") and procs.refresh(info, symbols, self.o.nccl_libs)]

    def job_id(self, pid: int) -> str | None:
        """The id of pid's job (:func:`job_key`), None for a process not followed."""
        if pid not in self.procs:
            return None
        if pid not in self.lineage:
            self.lineage[pid] = lineage(pid)
        return job_key(*self.lineage[pid])

    def job_of(self, pids) -> dict | None:
        """The manifest's ``job`` (``capture.manifest.JOB``) for the processes ``pids`` (a
        trigger's): every followed process of their jobs, and the other jobs followed; None
        when none of ``pids`` is followed (a trigger that names no process)."""
        ids = {self.job_id(p) for p in pids} - {None}
        if not ids:
            return None
        by_job: dict[str, list[int]] = {}
        for pid in sorted(self.procs):
            by_job.setdefault(self.job_id(pid), []).append(pid)
        members = sorted(p for i in ids for p in by_job.get(i, []))
        launchers = sorted({self.lineage[p][0] for p in members if self.lineage[p][0] is not None})
        cgroups = sorted({self.lineage[p][1] for p in members if self.lineage[p][1]})
        launcher = None
        if launchers:
            try:
                with open(f"/proc/{launchers[0]}/cmdline", "rb") as fh:
                    launcher = " ".join(a.decode(errors="replace") for a in fh.read().split(b"\0") if a)[:300] or None
            except OSError:
                pass

        def started(ps):
            ticks = [self.procs[p].start_ticks for p in ps if self.procs[p].start_ticks is not None]
            return _started_ns(min(ticks)) if ticks else None
        ranks = sorted({r for p in members if (r := self.procs[p].rank_facts().get("rank")) is not None})
        others = [schema.OTHER_JOB.make(id=i, pids=ps, started_ns=started(ps))
                  for i, ps in sorted(by_job.items(), key=lambda kv: kv[1][0]) if i not in ids]
        return schema.JOB.make(
            id="; ".join(sorted(ids)), pids=members, ranks=ranks, launcher=launcher,
            cgroup=cgroups[0] if len(cgroups) == 1 else None, started_ns=started(members),
            why=f"the trigger's process(es) {', '.join(map(str, sorted(pids)))}; the others of the same launcher "
                "(parent process) and cgroup",
            others=others)

    def forget(self, pid: int) -> None:
        """Stop following a process (the watcher, once it is long gone)."""
        self.lineage.pop(pid, None)
        info = self.procs.pop(pid)
        ns = self.netns.get(info.netns_inode or self.own_ns)
        if ns is not None and pid in ns.pids:
            ns.pids.remove(pid)

    # ------------------------------------------------------------------ interfaces
    def choose_initial_ifaces(self) -> None:
        """Each namespace's interfaces at the start: --iface, NCCL_SOCKET_IFNAME, or the
        interfaces of the job's connections off loopback."""
        for ns in list(self.netns.values()):
            if ns.own and not ns.pids and self.o.ifaces:
                ns.ifaces = [i for i in self.o.ifaces if i in procs.netns_interfaces("self")]
            elif ns.pids:
                ns.ifaces = self.ifaces_for(ns)

    def ifaces_for(self, ns: NetNs) -> list[str]:
        avail = procs.netns_interfaces(ns.pid)
        if self.o.ifaces:
            return [i for i in self.o.ifaces if i in avail]
        chosen: list[str] = []
        for pid in ns.pids:
            spec = self.procs[pid].env.get("NCCL_SOCKET_IFNAME")
            for i in procs.select_ifaces(spec, avail):
                if i not in chosen:
                    chosen.append(i)
        if not chosen:
            addrs = set()
            for pid in ns.pids:
                for s in procs.tcp_sockets(pid):
                    if s["state"] == "ESTABLISHED" and not s["saddr"].startswith("127.") and s["saddr"] != "::1":
                        addrs.add(s["saddr"])
            chosen = procs.ifaces_of_addresses(ns.pid, addrs)
        return chosen

    def adopt(self, fresh: list[procs.ProcInfo], has_tcpdump) -> tuple[list[NetNs], list[tuple[NetNs, str]]]:
        """The namespaces new to the capture and the (namespace, interface) pairs new processes
        use; ``has_tcpdump(inode)`` tells a namespace whose interfaces are already tapped."""
        new_ns, new_ifaces = [], []
        for info in fresh:
            ns = self.ensure_netns(info.netns_inode, info.pid)
            added = [i for i in self.ifaces_for(ns) if i not in ns.ifaces]
            if ns not in new_ns and not has_tcpdump(ns.inode) and not ns.own:
                new_ns.append(ns)
            ns.ifaces += added
            new_ifaces += [(ns, iface) for iface in added]
        return new_ns, new_ifaces

    def refresh_ifaces(self) -> list[tuple[NetNs, str]]:
        """Interfaces newly in use in the namespaces already known, each rescan: a capture
        started before the job's sockets exist (a prolog, a process found before it connected
        or before its exec) captures them as they appear. Per namespace with live processes:
        --iface names that appeared; NCCL_SOCKET_IFNAME (the environment read again while it is
        unset: an exec replaces it) against the interfaces there now; else the interfaces of
        the job's new connections. Cheap: /proc/PID/net/dev and net/tcp{,6} of one process per
        namespace; the processes' fds and ``ip addr`` only for connections not seen before."""
        added: list[tuple[NetNs, str]] = []
        for ns in list(self.netns.values()):
            if not ns.pids and not (ns.own and self.o.ifaces):
                continue
            live = self.live_pid(ns)
            if live is None:
                continue
            avail = procs.netns_interfaces(live)
            chosen: list[str] = []
            if self.o.ifaces:
                chosen = [i for i in self.o.ifaces if i in avail]
            else:
                for pid in list(ns.pids):
                    info = self.procs.get(pid)
                    if info is None:
                        continue
                    if "NCCL_SOCKET_IFNAME" not in info.env and os.path.isdir(f"/proc/{pid}"):
                        env = procs.read_env(pid)
                        if env.get("NCCL_SOCKET_IFNAME"):
                            info.env = env
                    chosen += procs.select_ifaces(info.env.get("NCCL_SOCKET_IFNAME"), avail)
                if not chosen:
                    chosen = self.ifaces_of_new_connections(ns, live)
            new = [i for i in dict.fromkeys(chosen) if i not in ns.ifaces]
            ns.ifaces += new
            added += [(ns, i) for i in new]
        return added

    def ifaces_of_new_connections(self, ns: NetNs, live) -> list[str]:
        """Interfaces of the established connections of ns that this capture has not seen
        before and the job's processes own (loopback left out)."""
        seen = self.seen_sockets.setdefault(ns.inode, set())
        est = procs.netns_established(live)
        new = {ino: a for ino, a in est.items() if ino not in seen}
        if not new:
            return []
        seen.update(new)
        owned: set[int] = set()
        for pid in ns.pids:
            owned.update(procs.socket_inodes(pid))
        addrs = {a for ino, a in new.items() if ino in owned and not a.startswith("127.") and a != "::1"}
        return procs.ifaces_of_addresses(live, addrs) if addrs else []

    # ------------------------------------------------------------------ the manifest's processes
    def process_facts(self, staging: Path) -> list[dict]:
        """The manifest's ``processes``: each followed process's facts, its namespace, whether
        it was alive at the end, and its TCP sockets with the end ss snapshot's counters."""
        ss_by_ns: dict[int, list[dict]] = {}
        for ns in self.netns.values():
            f = staging / "sys" / ns.label / "ss-tinp-end.txt"
            if f.exists():
                ss_by_ns[ns.inode] = procs.parse_ss_tinp(f.read_text(errors="replace"))
        out = []
        for pid, info in sorted(self.procs.items()):
            d = info.to_manifest()
            ns = self.ensure_netns(info.netns_inode, pid)
            d.update(schema.PROCESS.make(netns=ns.label, alive_at_end=os.path.isdir(f"/proc/{pid}")))
            ppid, cgroup = self.lineage.get(pid) or (None, None)
            d.update(schema.PROCESS.make(ppid=ppid, cgroup=cgroup, job=self.job_id(pid)))
            socks = procs.tcp_sockets(pid) if d["alive_at_end"] else []
            ss = ss_by_ns.get(ns.inode, [])
            for s in socks:
                loc = f"{s['saddr']}:{s['sport']}"
                peer = f"{s['daddr']}:{s['dport']}"
                for row in ss:
                    if row["local"].replace("[", "").replace("]", "").endswith(loc) and \
                            row["peer"].replace("[", "").replace("]", "").endswith(peer):
                        for k in schema.SS_COUNTERS:
                            if k in row:
                                s[k] = row[k]
                        break
            d.update(schema.PROCESS.make(sockets=socks))
            out.append(d)
        return out

    def manifest_netns(self) -> list[dict]:
        """The manifest's ``netns`` (``capture.manifest.NETNS``)."""
        return [schema.NETNS.make(inode=ns.inode, label=ns.label, name=ns.name, own=ns.own, pids=list(ns.pids),
                                  ifaces=list(ns.ifaces)) for ns in list(self.netns.values())]
