"""Real TCP captures from two network namespaces joined by a veth pair.

    with NetnsPair(offloads=True) as pair:
        pair.add_loss("b", "input", per_mille=20)          # nftables random drop
        with pair.capture("a", out / "sender.pcap"), pair.capture("b", out / "receiver.pcap"):
            pair.transfer(4 << 20)

Everything happens inside namespaces this module creates (names `sstcp-<pid>-<n>-a/b`,
addresses 10.231.<n>.1/.2 that exist only there); nothing is sent to any other address.
Loss comes from nftables `numgen random mod 1000 < N drop` (no netem), an optional rate
limit from tc tbf.  `NetnsPair.close()` (also on exceptions, and via `atexit` as a last
resort) stops the processes it started, by pid, and deletes both namespaces; namespaces
left behind by a dead earlier run (its pid no longer exists) are removed on start.
"""
from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

PREFIX = "sstcp-"
REQUIRED_TOOLS = ["ip", "nft", "tcpdump", "ethtool", "tc"]
_counter = itertools.count(1)


def missing_requirements() -> str | None:
    """None when namespaces can be used here, else the reason (for pytest.skip)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "needs root (ip netns, nftables, tcpdump)"
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)} (apt-get install iproute2 nftables tcpdump ethtool)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(cmd: list[str], check=True, timeout=30) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc={r.returncode}): {r.stderr.strip()}")
    return r


def cleanup_stale() -> list[str]:
    """Delete sstcp- namespaces whose creating process no longer exists."""
    gone = []
    out = _run(["ip", "netns", "list"], check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"{PREFIX}(\d+)-", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            _run(["ip", "netns", "del", name], check=False)
            gone.append(name)
    return gone


SERVER = textwrap.dedent("""
    import socket, sys, time
    delay, rcvbuf, pause = float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if rcvbuf: s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
    print("ready", flush=True)
    s.settimeout(60)
    c, _ = s.accept(); c.settimeout(60)
    time.sleep(delay)                    # slow reader: the window closes
    n = 0
    while True:
        b = c.recv(1 << 16 if pause else 1 << 20)
        if not b: break
        n += len(b)
        if pause: time.sleep(pause)
    c.sendall(str(n).encode()); c.close(); s.close()
    print(n, flush=True)
""")

CLIENT = textwrap.dedent("""
    import socket, sys
    host, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    c = socket.create_connection((host, port), timeout=60)
    chunk = bytes(range(256)) * 256
    left = total
    while left > 0:
        n = c.send(chunk[:min(left, len(chunk))]); left -= n
    c.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = c.recv(64)
        if not b: break
        got += b
    c.close()
    assert int(got) == total, (got, total)
    print("sent", total, flush=True)
""")


class NetnsPair:
    """Two namespaces `a` (the sender) and `b` (the receiver) joined by one veth pair
    (10.231.N.1 <-> 10.231.N.2), or with `router=True` through a third namespace `r`
    that forwards between two veth pairs (a 10.231.N.1 -- r -- 10.232.N.1 b), so that
    loss injected in r's forward hook is seen by the sender's capture and not by the
    receiver's (real "previous segment not captured")."""

    def __init__(self, offloads: bool = True, mtu: int = 1500, router: bool = False):
        self.n = next(_counter)
        tag = f"{os.getpid()}-{self.n}"
        self.router = router
        sides = "abr" if router else "ab"
        self.ns = {s: f"{PREFIX}{tag}-{s}" for s in sides}
        short = f"{os.getpid() % 100000}{self.n}"
        self.dev = {"a": f"sst{short}a"[:15], "b": f"sst{short}b"[:15]}
        octet = 1 + (os.getpid() * 7 + self.n) % 250
        if router:
            # r's ends of the two pairs
            self.rdev = {"a": f"sst{short}ra"[:15], "b": f"sst{short}rb"[:15]}
            self.ip = {"a": f"10.231.{octet}.1", "b": f"10.232.{octet}.1",
                       "ra": f"10.231.{octet}.254", "rb": f"10.232.{octet}.254"}
        else:
            self.ip = {"a": f"10.231.{octet}.1", "b": f"10.231.{octet}.2"}
        self.offloads = offloads
        self.mtu = mtu
        self.procs: list[subprocess.Popen] = []
        self.capture_drops: dict[str, int] = {}   # path -> packets the capture lost (-1 unknown)
        self.created: list[str] = []
        self._closed = False
        atexit.register(self.close)

    # -- setup / teardown ---------------------------------------------------------------
    def __enter__(self):
        try:
            self.setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def x(self, side: str, *cmd: str, check=True, timeout=30) -> subprocess.CompletedProcess:
        return _run(["ip", "netns", "exec", self.ns[side], *cmd], check=check, timeout=timeout)

    def setup(self) -> None:
        cleanup_stale()
        for side in self.ns:
            _run(["ip", "netns", "add", self.ns[side]])
            self.created.append(self.ns[side])
        onoff = "on" if self.offloads else "off"
        links = []   # (namespace key, device, address)
        if self.router:
            for s in "ab":
                _run(["ip", "link", "add", self.dev[s], "netns", self.ns[s], "type", "veth",
                      "peer", "name", self.rdev[s], "netns", self.ns["r"]])
                links += [(s, self.dev[s], self.ip[s]), ("r", self.rdev[s], self.ip["r" + s])]
        else:
            _run(["ip", "link", "add", self.dev["a"], "netns", self.ns["a"], "type", "veth",
                  "peer", "name", self.dev["b"], "netns", self.ns["b"]])
            links += [("a", self.dev["a"], self.ip["a"]), ("b", self.dev["b"], self.ip["b"])]
        for side in self.ns:
            self.x(side, "ip", "link", "set", "lo", "up")
        for side, d, addr in links:
            self.x(side, "ip", "addr", "add", f"{addr}/24", "dev", d)
            self.x(side, "ip", "link", "set", d, "mtu", str(self.mtu), "up")
            # veth: tso/gso/gro toggles; some kernels refuse single features -> check=False,
            # the effective state is read back by offload_state()
            self.x(side, "ethtool", "-K", d, "tso", onoff, "gso", onoff, "gro", onoff, check=False)
        if self.router:
            self.x("r", "sysctl", "-qw", "net.ipv4.ip_forward=1")
            net_b = self.ip["b"].rsplit(".", 1)[0] + ".0/24"
            net_a = self.ip["a"].rsplit(".", 1)[0] + ".0/24"
            # routes exist only inside the namespaces: a reaches b's subnet via r and back
            self.x("a", "ip", "route", "add", net_b, "via", self.ip["ra"])
            self.x("b", "ip", "route", "add", net_a, "via", self.ip["rb"])

    def offload_state(self, side: str) -> dict:
        out = self.x(side, "ethtool", "-k", self.dev[side], check=False).stdout
        st = {}
        for key in ("tcp-segmentation-offload", "generic-segmentation-offload", "generic-receive-offload"):
            m = re.search(rf"^{key}: (on|off)", out, re.M)
            st[key] = m.group(1) if m else "?"
        return st

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGINT)
                    p.wait(timeout=5)
                except Exception:
                    p.kill()
                    p.wait(timeout=5)
        for name in self.created:
            _run(["ip", "netns", "del", name], check=False)
        self.created = []
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    # -- impairments --------------------------------------------------------------------
    def add_loss(self, side: str, hook: str, per_mille: int = 0, port: int = 5001, direction: str = "dport",
                 every_nth: int = 0) -> None:
        """Drop TCP packets to (`direction="dport"`) or from ("sport") `port` at `hook`
        (input/output) in `side`: at random `per_mille`/1000 of them (`numgen random`), or
        deterministically every `every_nth` one (`numgen inc`)."""
        t = "sstcp"
        self.x(side, "nft", "add", "table", "inet", t, check=False)
        chain = f"{hook}_{direction}_loss"
        self.x(side, "nft", "add", "chain", "inet", t, chain,
               f"{{ type filter hook {hook} priority 0 ; policy accept ; }}")
        if every_nth:
            sel = ["numgen", "inc", "mod", str(every_nth), "==", str(every_nth - 1)]
        else:
            sel = ["numgen", "random", "mod", "1000", "<", str(per_mille)]
        self.x(side, "nft", "add", "rule", "inet", t, chain, "tcp", direction, str(port), *sel, "counter", "drop")

    def loss_counters(self, side: str) -> int:
        out = self.x(side, "nft", "list", "table", "inet", "sstcp", check=False).stdout
        return sum(int(m) for m in re.findall(r"counter packets (\d+)", out))

    def tcp_retrans_segs(self, side: str) -> int:
        """The namespace's TCP RetransSegs counter (/proc/net/snmp is per network namespace)."""
        lines = [l.split() for l in self.x(side, "cat", "/proc/net/snmp").stdout.splitlines() if l.startswith("Tcp:")]
        hdr, val = lines[0], lines[1]
        return int(val[hdr.index("RetransSegs")])

    def rate_limit(self, side: str, rate: str = "200mbit", burst: str = "64kb", latency: str = "20ms") -> None:
        """tc tbf on `side`'s veth (drops what would wait longer than `latency`)."""
        self.x(side, "tc", "qdisc", "replace", "dev", self.dev[side], "root", "tbf", "rate", rate,
               "burst", burst, "latency", latency)

    # -- capture and traffic ------------------------------------------------------------
    @contextmanager
    def capture(self, side: str, path: Path, snaplen: int = 128, tool: str = "tcpdump"):
        """Capture on `side`'s veth while the block runs (tcpdump pcap, or dumpcap pcapng)."""
        path = Path(path)
        if tool == "tcpdump":
            cmd = ["tcpdump", "-i", self.dev[side], "-s", str(snaplen), "--time-stamp-precision=nano",
                   "--immediate-mode", "-B", "32768", "-U", "-Z", "root", "-w", str(path), "tcp"]
        elif tool == "dumpcap":
            cmd = ["dumpcap", "-i", self.dev[side], "-s", str(snaplen), "-B", "32", "-f", "tcp", "-w", str(path)]
        else:
            raise ValueError(tool)
        env = dict(os.environ)
        env["WIRESHARK_CONFIG_DIR"] = tempfile.mkdtemp(prefix="sstcp-wsconf-")
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[side], *cmd], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=env)
        self.procs.append(p)
        # wait until the capture is armed ("listening on" / "Capturing on")
        deadline = time.monotonic() + 15
        seen = ""
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            seen += line
            if "listening on" in line or "Capturing on" in line:
                break
            if p.poll() is not None:
                raise RuntimeError(f"{tool} exited: {seen}{p.stderr.read()}")
        else:
            raise RuntimeError(f"{tool} did not start: {seen}")
        try:
            yield path
        finally:
            time.sleep(0.3)
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
            rest = p.stderr.read()
            if not path.exists():
                raise RuntimeError(f"{tool} wrote no file: {seen}{rest}")
            # "N packets dropped by kernel" (tcpdump) / "Packets: N Dropped: M" (dumpcap):
            # packets the capture itself lost, which look like network loss in the file
            m = re.search(r"(\d+) packets? dropped by kernel", rest) or re.search(r"Dropped: (\d+)", rest)
            self.capture_drops[str(path)] = int(m.group(1)) if m else -1

    def transfer(self, nbytes: int, port: int = 5001, timeout: float = 60, reader_delay: float = 0.0,
                 rcvbuf: int = 0, read_pause: float = 0.0) -> float:
        """Bulk transfer a -> b of nbytes over one TCP connection; returns the seconds taken.
        A slow reader (`reader_delay` before the first read, `read_pause` after each 64 KiB
        read, small `rcvbuf`) makes the receiver advertise zero windows."""
        py = sys.executable or "python3"
        srv = subprocess.Popen(["ip", "netns", "exec", self.ns["b"], py, "-c", SERVER, self.ip["b"], str(port),
                                str(reader_delay), str(rcvbuf), str(read_pause)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(srv)
        if srv.stdout.readline().strip() != "ready":
            raise RuntimeError(f"server did not start: {srv.stderr.read()}")
        t0 = time.monotonic()
        cli = self.x("a", py, "-c", CLIENT, self.ip["b"], str(port), str(nbytes), timeout=timeout)
        dt = time.monotonic() - t0
        out, err = srv.communicate(timeout=timeout)
        if srv.returncode != 0 or int(out.split()[-1]) != nbytes:
            raise RuntimeError(f"server: rc={srv.returncode} out={out!r} err={err!r}")
        assert "sent" in cli.stdout
        return dt
