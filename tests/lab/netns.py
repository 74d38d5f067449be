"""Network namespaces for the lab: N "hosts" on one "switch", with guaranteed teardown.

Topology (nothing at all is configured in the root namespace)::

    sslab-<pid>-r0  eth0 10.203.0.10/24 ──veth── p0 ┐
    sslab-<pid>-r1  eth0 10.203.0.11/24 ──veth── p1 ├─ br0 in sslab-<pid>-sw (the switch)
    ...                                            ┘

Each veth pair is created directly inside its two namespaces, so no interface
ever exists in the root namespace and the lab's packets cannot leave it.

Faults act where a real network misbehaves:

* ``loss``: nftables (bridge family) in the switch drops a random p‰ of the
  frames on rank r's port, like a bad cable or NIC; both directions by default.
  The sender's own capture then shows genuine retransmissions.
* ``rate``: tc tbf on rank r's eth0 (its transmit side) and on switch port p<r>
  (transmit towards the rank): a link running at a fraction of its speed.
* ``link_down``: switch port p<r> (or the host's eth0) goes down.
* ``reset``: nftables on the rank's host rejects its ring peer's segments with
  a TCP reset, so the peer's connection is reset mid-stream.

Every object carries the prefix ``sslab-<owner pid>-``; :func:`sweep` removes
objects whose owner process is gone (or all of them), killing any process still
running inside those namespaces first.

CLI: ``python -m tests.lab.netns --sweep [--all]`` / ``--list``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

PREFIX = "sslab-"
SUBNET = "10.203.0"
HOST_BASE = 10
MASTER_PORT = 29500


def run(cmd: list[str], check: bool = True, input: str | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    """Run a command, capturing output; raise with its stderr on failure."""
    p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc={p.returncode}): {p.stderr.strip()}")
    return p


def list_namespaces() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def ns_pids(ns: str) -> list[int]:
    p = run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_ns_processes(ns: str, sig: int = signal.SIGKILL, wait_s: float = 5.0) -> None:
    """Kill every process whose network namespace is ``ns`` and wait for them to go."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = [p for p in ns_pids(ns) if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def delete_namespace(ns: str) -> None:
    kill_ns_processes(ns)
    run(["ip", "netns", "del", ns], check=False)


def owner_of(name: str) -> int | None:
    m = re.match(rf"{re.escape(PREFIX)}(\d+)-", name)
    return int(m.group(1)) if m else None


def root_links_with_prefix() -> list[str]:
    out = run(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                names.append(name)
    return names


def leftovers(owner: int | None = None) -> dict[str, list]:
    """Lab objects still present (all, or those of one owner pid)."""
    pre = PREFIX if owner is None else f"{PREFIX}{owner}-"
    nss = [n for n in list_namespaces() if n.startswith(pre)]
    pids = sorted({p for n in nss for p in ns_pids(n)})
    links = [l for l in root_links_with_prefix() if l.startswith(pre)]
    return {"namespaces": nss, "pids": pids, "links": links}


def sweep(include_live_owners: bool = False) -> list[str]:
    """Remove lab namespaces (and their processes) whose owner is dead."""
    removed = []
    for ns in list_namespaces():
        if not ns.startswith(PREFIX):
            continue
        owner = owner_of(ns)
        if not include_live_owners and owner is not None and owner != os.getpid() and pid_alive(owner):
            continue
        delete_namespace(ns)
        removed.append(ns)
    for link in root_links_with_prefix():
        owner = owner_of(link)
        if include_live_owners or owner is None or not pid_alive(owner):
            run(["ip", "link", "del", link], check=False)
            removed.append(link)
    return removed


@dataclass
class Host:
    rank: int
    ns: str
    addr: str
    iface: str = "eth0"
    port: str = ""            # switch port name in the switch namespace
    hostname: str = ""


@dataclass
class Lab:
    """N hosts on a bridge, each in its own namespace. Use as a context manager."""

    nhosts: int
    tag: str = ""
    subnet: str = SUBNET
    mtu: int = 1500
    quickack: bool = True
    prefix: str = field(init=False)
    switch: str = field(init=False)
    hosts: list[Host] = field(init=False, default_factory=list)
    _procs: list[subprocess.Popen] = field(init=False, default_factory=list)
    _up: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if not 1 <= self.nhosts <= 64:
            raise ValueError("nhosts must be 1..64")
        self.prefix = f"{PREFIX}{os.getpid()}-{self.tag + '-' if self.tag else ''}"
        self.switch = f"{self.prefix}sw"
        self.hosts = [
            Host(rank=i, ns=f"{self.prefix}r{i}", addr=f"{self.subnet}.{HOST_BASE + i}", port=f"p{i}",
                 hostname=f"node{i}")
            for i in range(self.nhosts)
        ]

    # ---- lifecycle ----
    def __enter__(self) -> "Lab":
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _sysctl(self, ns: str, *settings: str) -> None:
        for s in settings:
            run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", s], check=False)

    def setup(self) -> None:
        existing = set(list_namespaces())
        names = [self.switch] + [h.ns for h in self.hosts]
        if existing & set(names):
            raise RuntimeError(f"lab namespaces already exist: {sorted(existing & set(names))}")
        self._up = True
        run(["ip", "netns", "add", self.switch])
        # No IPv6 inside the lab: keeps captures to the job's own traffic (no ND/MLD chatter).
        self._sysctl(self.switch, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
        run(["ip", "-n", self.switch, "link", "set", "lo", "up"])
        run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for h in self.hosts:
            run(["ip", "netns", "add", h.ns])
            self._sysctl(h.ns, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
            run(["ip", "link", "add", h.iface, "netns", h.ns, "mtu", str(self.mtu), "type", "veth",
                 "peer", "name", h.port, "netns", self.switch, "mtu", str(self.mtu)])
            run(["ip", "-n", self.switch, "link", "set", h.port, "master", "br0"])
            run(["ip", "-n", self.switch, "link", "set", h.port, "up"])
            run(["ip", "-n", h.ns, "link", "set", "lo", "up"])
            run(["ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", h.iface])
            run(["ip", "-n", h.ns, "link", "set", h.iface, "up"])
            if self.quickack:
                # No delayed ACKs on the lab subnet: on this oversubscribed machine a
                # receiver descheduled for a few ms would otherwise let the sender's
                # tail-loss probe fire, i.e. retransmissions without any fault.
                run(["ip", "-n", h.ns, "route", "replace", f"{self.subnet}.0/24", "dev", h.iface, "proto", "kernel",
                     "scope", "link", "src", h.addr, "quickack", "1"])
                # No tail-loss probes either: a sender descheduled past its ~10 ms probe
                # timeout would retransmit with nothing lost. Real loss is still repaired
                # by fast retransmit/RACK and the RTO, so faults show as they should.
                self._sysctl(h.ns, "net.ipv4.tcp_early_retrans=0")
        self.wait_reachable()

    def wait_reachable(self, timeout: float = 10.0) -> None:
        """Every switch port is forwarding and every host interface is up."""
        deadline = time.monotonic() + timeout
        while True:
            out = run(["bridge", "-n", self.switch, "-j", "link", "show"], check=False).stdout
            try:
                states = {e.get("ifname"): e.get("state") for e in json.loads(out or "[]")}
            except json.JSONDecodeError:
                states = {}
            oper = {}
            for h in self.hosts:
                o = run(["ip", "-n", h.ns, "-j", "link", "show", h.iface], check=False).stdout
                try:
                    oper[h.rank] = json.loads(o)[0].get("operstate")
                except (json.JSONDecodeError, IndexError):
                    oper[h.rank] = None
            if all(states.get(h.port) == "forwarding" for h in self.hosts) and all(v == "UP" for v in oper.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"lab links not ready: bridge ports {states}, host interfaces {oper}")
            time.sleep(0.05)

    def teardown(self) -> None:
        """Kill everything started in the lab, delete its namespaces. Idempotent."""
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        for ns in [h.ns for h in self.hosts] + [self.switch]:
            if ns in list_namespaces():
                delete_namespace(ns)
        self._up = False

    # ---- processes ----
    def cmd(self, rank: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.hosts[rank].ns] + argv

    def exec(self, rank: int, argv: list[str], check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
        return run(self.cmd(rank, argv), check=check, timeout=timeout)

    def popen(self, rank: int, argv: list[str], hostname: bool = True, **kw) -> subprocess.Popen:
        """Start a process in rank's namespace (own UTS namespace and hostname if
        ``hostname``). ``ip netns exec``, ``unshare`` and ``sh`` all exec, so the
        Popen pid is the program's pid."""
        h = self.hosts[rank]
        if hostname:
            argv = ["unshare", "--uts", "sh", "-c", f'hostname {h.hostname} && exec "$@"', "sh"] + argv
        p = subprocess.Popen(self.cmd(rank, argv), **kw)
        self._procs.append(p)
        return p

    def track(self, p: subprocess.Popen) -> None:
        self._procs.append(p)

    # ---- faults ----
    def _nft(self, ns: str, script: str) -> None:
        run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=script)

    def loss(self, rank: int, permille: int, direction: str = "both", min_bytes: int = 0) -> dict:
        """Drop a random ``permille``/1000 of rank's frames in the switch.

        ``min_bytes`` > 0 drops only IPv4 packets longer than that (data, not bare
        ACKs): every drop then forces a retransmission, which tests can count on."""
        if not 0 < permille < 1000:
            raise ValueError("permille must be in 1..999")
        port = self.hosts[rank].port
        size = f"ip length > {min_bytes} " if min_bytes > 0 else ""
        rules = []
        if direction in ("both", "egress"):    # frames the rank transmits
            rules.append(f'iifname "{port}" meta l4proto tcp {size}numgen random mod 1000 < {permille} counter drop')
        if direction in ("both", "ingress"):   # frames towards the rank
            rules.append(f'oifname "{port}" meta l4proto tcp {size}numgen random mod 1000 < {permille} counter drop')
        if not rules:
            raise ValueError(f"bad direction {direction!r}")
        body = "\n".join(f"    {r}" for r in rules)
        self._nft(self.switch, f"table bridge sslab_fault {{\n  chain lossy_link {{\n    type filter hook forward priority 0; policy accept;\n{body}\n  }}\n}}\n")
        return {"switch_namespace": self.switch, "switch_port": port, "direction": direction,
                "min_bytes": min_bytes, "nft": rules}

    def nft_counters(self) -> str:
        return run(["ip", "netns", "exec", self.switch, "nft", "list", "table", "bridge", "sslab_fault"],
                   check=False).stdout

    def rate(self, rank: int, rate: str, direction: str = "both", burst: str | None = None,
             latency: str = "200ms") -> dict:
        """Rate-limit rank's link with tc tbf."""
        burst = burst or "64kb"
        applied = []
        if direction in ("both", "egress"):
            self.exec(rank, ["tc", "qdisc", "add", "dev", self.hosts[rank].iface, "root", "tbf", "rate", rate,
                             "burst", burst, "latency", latency])
            applied.append(f"{self.hosts[rank].ns}:{self.hosts[rank].iface}")
        if direction in ("both", "ingress"):
            run(["ip", "netns", "exec", self.switch, "tc", "qdisc", "add", "dev", self.hosts[rank].port, "root",
                 "tbf", "rate", rate, "burst", burst, "latency", latency])
            applied.append(f"{self.switch}:{self.hosts[rank].port}")
        if not applied:
            raise ValueError(f"bad direction {direction!r}")
        return {"rate": rate, "burst": burst, "latency": latency, "direction": direction, "qdiscs": applied}

    def link_down(self, rank: int, side: str = "switch") -> dict:
        h = self.hosts[rank]
        if side == "switch":
            run(["ip", "-n", self.switch, "link", "set", h.port, "down"])
            return {"side": "switch", "switch_port": h.port}
        run(["ip", "-n", h.ns, "link", "set", h.iface, "down"])
        return {"side": "host", "iface": h.iface}

    def link_up(self, rank: int, side: str = "switch") -> None:
        """Undo :meth:`link_down`: the port (or the host's eth0) comes back up."""
        h = self.hosts[rank]
        if side == "switch":
            run(["ip", "-n", self.switch, "link", "set", h.port, "up"])
        else:
            run(["ip", "-n", h.ns, "link", "set", h.iface, "up"])

    def busiest_connection_from(self, rank: int, peer_rank: int) -> tuple[int, int] | None:
        """(peer port, local port) of the established connection that has
        received the most bytes from peer_rank on rank's host (a ring data
        connection), from ``ss -tin``."""
        peer = self.hosts[peer_rank].addr
        out = self.exec(rank, ["ss", "-Htin", "state", "established", "dst", peer], check=False).stdout
        best, best_bytes = None, -1
        lines = out.splitlines()
        addr_port = re.compile(r"^\d+\.\d+\.\d+\.\d+:\d+$")
        for i, line in enumerate(lines):
            f = line.split()
            if not line[:1].isspace() and len(f) >= 4 and addr_port.match(f[2]) and addr_port.match(f[3]):
                local_port = int(f[2].rsplit(":", 1)[1])
                peer_port = int(f[3].rsplit(":", 1)[1])
                info = lines[i + 1] if i + 1 < len(lines) else ""
                m = re.search(r"bytes_received:(\d+)", info)
                nbytes = int(m.group(1)) if m else 0
                if nbytes > best_bytes:
                    best, best_bytes = (peer_port, local_port), nbytes
        return best

    def reset_from(self, rank: int, peer_rank: int, scope: str = "connection") -> dict:
        """On rank's host, answer the peer's TCP segments (not SYN/RST) with a
        RST: the peer's connection is reset mid-stream. scope "connection": the
        one busiest connection from the peer; "peer": every connection from it."""
        peer = self.hosts[peer_rank].addr
        match = f"ip saddr {peer} tcp dport != {MASTER_PORT}"
        conn = None
        if scope == "connection":
            conn = self.busiest_connection_from(rank, peer_rank)
            if conn is None:
                raise RuntimeError(f"no established connection from rank {peer_rank} to rank {rank}")
            match = f"ip saddr {peer} tcp sport {conn[0]} tcp dport {conn[1]}"
        rule = f"{match} tcp flags & (syn|rst) == 0 counter reject with tcp reset"
        self._nft(self.hosts[rank].ns, f"table inet sslab_fault {{\n  chain in {{\n    type filter hook input priority 0; policy accept;\n    {rule}\n  }}\n}}\n")
        out = {"host_namespace": self.hosts[rank].ns, "peer_addr": peer, "nft": rule, "scope": scope}
        if conn:
            out["tuple"] = {"saddr": peer, "sport": conn[0], "daddr": self.hosts[rank].addr, "dport": conn[1]}
        return out

    def clear_reset(self, rank: int) -> None:
        run(["ip", "netns", "exec", self.hosts[rank].ns, "nft", "delete", "table", "inet", "sslab_fault"], check=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab.netns", description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", action="store_true", help="remove lab objects whose owner process is gone")
    ap.add_argument("--all", action="store_true", help="with --sweep: also those of live owners")
    ap.add_argument("--list", action="store_true", help="list lab objects")
    a = ap.parse_args(argv)
    if a.sweep:
        for name in sweep(include_live_owners=a.all):
            print(f"removed {name}")
    if a.list or not a.sweep:
        print(leftovers())
    return 0


if __name__ == "__main__":
    sys.exit(main())
