"""TCP sockets of a network namespace read through ``NETLINK_SOCK_DIAG``, written as
``ss -tinpe`` prints them (what ``ss`` itself asks the kernel, without starting it).

Capture samples the job's sockets every ``--ss-every`` seconds, the watcher for days. Running
``ss -tinpe`` for it costs a fork and exec of capture (a Python process with threads) and,
for ``-p``, a walk of every file descriptor of every process of the host to find the
sockets' owners: 5-6 ms of CPU on an idle 66-process VM, far more on a GPU node with
containers, every sample. Here the kernel's socket dump is read on a netlink socket opened
once per namespace, and owners are looked up only among the processes the capture follows
(their ``/proc/PID/fd``), again only when a socket the last lookup did not know appears.
The output is ``ss -tinpeH``'s text (socket line, then a tab-indented info line with the
same field names and units), so ``forensics.parsers.ss`` reads both alike; a socket of a
process the capture does not follow has no ``users:(...)``.

Standard library only (ctypes for ``setns``): this runs on the GPU node.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading

from . import children, procs

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO, INET_DIAG_CONG = 2, 4
CLONE_NEWNET = 0x40000000

# TCP_ESTABLISHED .. TCP_CLOSING as ss names them
STATE_NAMES = {1: "ESTAB", 2: "SYN-SENT", 3: "SYN-RECV", 4: "FIN-WAIT-1", 5: "FIN-WAIT-2", 6: "TIME-WAIT",
               7: "UNCONN", 8: "CLOSE-WAIT", 9: "LAST-ACK", 10: "LISTEN", 11: "CLOSING"}
# ss -t without -a or a state filter: connected sockets (not LISTEN, CLOSE, TIME-WAIT, SYN-RECV)
SS_CONN = sum(1 << s for s in (1, 2, 4, 5, 8, 9, 11))

NLMSGHDR = struct.Struct("=IHHII")
INET_DIAG_MSG = struct.Struct("=BBBBHH16s16sI8sIIIII")    # family, state, timer, retrans, sockid, ...
RTATTR = struct.Struct("=HH")

# struct tcp_info (linux/tcp.h) after its 8 single bytes, in order; a field is read only
# when the kernel's structure is long enough to hold it (older kernels send less)
TCP_INFO_FIELDS = (
    ("rto", "I"), ("ato", "I"), ("snd_mss", "I"), ("rcv_mss", "I"),
    ("unacked", "I"), ("sacked", "I"), ("lost", "I"), ("retrans", "I"), ("fackets", "I"),
    ("last_data_sent", "I"), ("last_ack_sent", "I"), ("last_data_recv", "I"), ("last_ack_recv", "I"),
    ("pmtu", "I"), ("rcv_ssthresh", "I"), ("rtt", "I"), ("rttvar", "I"), ("snd_ssthresh", "I"),
    ("snd_cwnd", "I"), ("advmss", "I"), ("reordering", "I"), ("rcv_rtt", "I"), ("rcv_space", "I"),
    ("total_retrans", "I"), ("pacing_rate", "Q"), ("max_pacing_rate", "Q"), ("bytes_acked", "Q"),
    ("bytes_received", "Q"), ("segs_out", "I"), ("segs_in", "I"), ("notsent_bytes", "I"), ("min_rtt", "I"),
    ("data_segs_in", "I"), ("data_segs_out", "I"), ("delivery_rate", "Q"), ("busy_time", "Q"),
    ("rwnd_limited", "Q"), ("sndbuf_limited", "Q"), ("delivered", "I"), ("delivered_ce", "I"),
    ("bytes_sent", "Q"), ("bytes_retrans", "Q"), ("dsack_dups", "I"), ("reord_seen", "I"),
    ("rcv_ooopack", "I"), ("snd_wnd", "I"),
)
TCPI_OPT_TIMESTAMPS, TCPI_OPT_SACK, TCPI_OPT_WSCALE, TCPI_OPT_ECN, TCPI_OPT_ECN_SEEN = 1, 2, 4, 8, 16
TCP_INFINITE_SSTHRESH = 0x7FFFFFFF
U64_MAX = (1 << 64) - 1


def _tcp_info_layout():
    out, off = [], 8
    for name, fmt in TCP_INFO_FIELDS:
        size = struct.calcsize(fmt)
        off = (off + size - 1) // size * size          # natural alignment, as the C structure has
        out.append((name, off, struct.Struct("=" + fmt)))
        off += size
    return out


TCP_INFO_LAYOUT = _tcp_info_layout()


def parse_tcp_info(data: bytes) -> dict:
    """The fields of a ``struct tcp_info`` as long as the kernel sent it."""
    if len(data) < 8:
        return {}
    state, ca_state, retransmits, probes, backoff, options, wscale, flags = data[:8]
    info = {"state": state, "ca_state": ca_state, "retransmits": retransmits, "probes": probes,
            "backoff": backoff, "options": options, "snd_wscale": wscale & 0xF, "rcv_wscale": wscale >> 4,
            "delivery_rate_app_limited": flags & 1}
    for name, off, st in TCP_INFO_LAYOUT:
        if off + st.size > len(data):
            break
        info[name] = st.unpack_from(data, off)[0]
    return info


def _bw(bps: float) -> str:
    """A rate in bits/s as Debian 12's ss prints it when not on a terminal: whole, no prefix."""
    return f"{bps:.0f}"


def info_line(ti: dict, cong: str | None) -> str:
    """The ``ss -i`` info line of one socket: ss's field names, units and order, a field
    printed when ss prints it (mostly: when it is not zero)."""
    g = ti.get
    o = []

    def counts(*fields):
        """``name:value`` of each field (key, or (key, name)) that is not zero."""
        for f in fields:
            key, name = f if isinstance(f, tuple) else (f, f)
            if g(key):
                o.append(f"{name}:{g(key)}")

    def ms(key, name):
        """A field in µs as ss prints it: ms, shortest form."""
        if g(key):
            o.append(f"{name}:{g(key) / 1000:g}")

    opts = g("options", 0)
    o += [word for bit, word in ((TCPI_OPT_TIMESTAMPS, "ts"), (TCPI_OPT_SACK, "sack"), (TCPI_OPT_ECN, "ecn"),
                                 (TCPI_OPT_ECN_SEEN, "ecnseen")) if opts & bit]
    if cong:
        o.append(cong)
    if opts & TCPI_OPT_WSCALE:
        o.append(f"wscale:{g('snd_wscale', 0)},{g('rcv_wscale', 0)}")
    ms("rto", "rto")
    counts("backoff")
    if g("rtt"):
        o.append(f"rtt:{g('rtt') / 1000:g}/{g('rttvar', 0) / 1000:g}")
    ms("ato", "ato")
    counts(("snd_mss", "mss"), "pmtu", ("rcv_mss", "rcvmss"), "advmss", ("snd_cwnd", "cwnd"))
    if g("snd_ssthresh") and g("snd_ssthresh") < 0xFFFF and g("snd_ssthresh") != TCP_INFINITE_SSTHRESH:
        o.append(f"ssthresh:{g('snd_ssthresh')}")
    counts("bytes_sent", "bytes_retrans", "bytes_acked", "bytes_received", "segs_out", "segs_in",
           "data_segs_out", "data_segs_in")
    if g("rtt") and g("snd_mss") and g("snd_cwnd"):
        o.append(f"send {_bw(g('snd_cwnd') * g('snd_mss') * 8e6 / g('rtt'))}bps")
    counts(("last_data_sent", "lastsnd"), ("last_data_recv", "lastrcv"), ("last_ack_recv", "lastack"))
    if g("pacing_rate") and g("pacing_rate") != U64_MAX:
        rate = f"pacing_rate {_bw(g('pacing_rate') * 8.0)}bps"
        if g("max_pacing_rate") and g("max_pacing_rate") != U64_MAX:
            rate += f"/{_bw(g('max_pacing_rate') * 8.0)}bps"
        o.append(rate)
    if g("delivery_rate"):
        o.append(f"delivery_rate {_bw(g('delivery_rate') * 8.0)}bps")
    counts("delivered", "delivered_ce")
    if g("delivery_rate_app_limited"):
        o.append("app_limited")
    busy = g("busy_time", 0)
    if busy:
        o.append(f"busy:{busy // 1000}ms")
        o += [f"{key}:{g(key) // 1000}ms({g(key) * 100.0 / busy:.1f}%)"
              for key in ("rwnd_limited", "sndbuf_limited") if g(key)]
    counts("unacked")
    if g("retrans") or g("total_retrans"):
        o.append(f"retrans:{g('retrans', 0)}/{g('total_retrans', 0)}")
    counts("lost", "sacked", "dsack_dups", "fackets")
    if g("reordering") is not None and g("reordering") != 3:
        o.append(f"reordering:{g('reordering')}")
    counts("reord_seen")
    ms("rcv_rtt", "rcv_rtt")
    counts("rcv_space", "rcv_ssthresh", ("notsent_bytes", "notsent"))
    ms("min_rtt", "minrtt")
    counts("rcv_ooopack", "snd_wnd")
    return " ".join(o)


def _addr(family: int, raw: bytes, port: int) -> str:
    if family == socket.AF_INET:
        return f"{socket.inet_ntop(socket.AF_INET, raw[:4])}:{port}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{port}"


class Owners:
    """Socket inode -> the processes holding it, ss's ``users:`` column, among a given set of
    processes. Their descriptors are read again only when a socket appears that the last
    reading did not find (a new connection); a socket found in none of them is remembered as
    not theirs, so a namespace shared with other programs costs no reading per sample."""

    def __init__(self):
        self.owners: dict[int, list[tuple[str, int, int]]] = {}
        self.foreign: set[int] = set()
        self.pids: tuple[int, ...] = ()

    def lookup(self, inodes: set[int], pids) -> dict[int, list[tuple[str, int, int]]]:
        pids = tuple(sorted(pids))
        if pids != self.pids or (inodes - self.owners.keys() - self.foreign):
            self._read(pids)
            self.foreign = inodes - self.owners.keys()
        self.foreign &= inodes
        return self.owners

    def _read(self, pids: tuple[int, ...]) -> None:
        self.pids = pids
        owners: dict[int, list[tuple[str, int, int]]] = {}
        for pid in pids:
            try:
                with open(f"/proc/{pid}/comm", "rb") as fh:
                    name = fh.read().decode("utf-8", "replace").strip()
            except OSError:
                continue
            for inode, fd in procs.socket_fds(pid):
                owners.setdefault(inode, []).append((name, pid, fd))
        self.owners = owners


def _setns_socket(ns_path: str) -> socket.socket:
    """A NETLINK_SOCK_DIAG socket of the namespace at ns_path: made by a thread that enters the
    namespace (setns moves only the calling thread) and ends there; the socket stays in the
    namespace it was made in."""
    setns = children.libc().setns
    out: dict = {}

    def enter():
        try:
            fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns_path}): {os.strerror(err)}")
            finally:
                os.close(fd)
            out["sock"] = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                                        NETLINK_SOCK_DIAG)
        except OSError as e:
            out["error"] = e
    t = threading.Thread(target=enter, name="stallscope-setns", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["sock"]


class SockDiag:
    """The TCP sockets of one network namespace (``ns_path``: ``/proc/PID/ns/net``; None: this
    process's own), dumped on demand as ``ss -tinpeH`` text."""

    def __init__(self, ns_path: str | None = None):
        if ns_path is None:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
        else:
            self.sock = _setns_socket(ns_path)
        self.sock.settimeout(5.0)
        self.seq = 0
        self.owners = Owners()

    def close(self) -> None:
        self.sock.close()

    def dump(self) -> list[tuple[dict, dict, str | None]]:
        """Every connected TCP socket (IPv4, IPv6): (its diag message, tcp_info, congestion
        control)."""
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            self.seq += 1
            req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP,
                              (1 << (INET_DIAG_INFO - 1)) | (1 << (INET_DIAG_CONG - 1)), 0, SS_CONN) + bytes(48)
            self.sock.sendto(NLMSGHDR.pack(NLMSGHDR.size + len(req), SOCK_DIAG_BY_FAMILY,
                                           NLM_F_REQUEST | NLM_F_DUMP, self.seq, 0) + req, (0, 0))
            out += self._receive(self.seq)
        return out

    def _receive(self, seq: int) -> list:
        out = []
        while True:
            data = self.sock.recv(1 << 17)
            off = 0
            while off + NLMSGHDR.size <= len(data):
                length, typ, _flags, mseq, _pid = NLMSGHDR.unpack_from(data, off)
                if length < NLMSGHDR.size:
                    raise OSError("sock_diag: malformed netlink message")
                body = data[off + NLMSGHDR.size:off + length]
                off += (length + 3) & ~3
                if mseq != seq:
                    continue
                if typ == NLMSG_DONE:
                    return out
                if typ == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", body)[0]
                    if err:
                        raise OSError(err, f"sock_diag: {os.strerror(err)}")
                    continue
                if typ == SOCK_DIAG_BY_FAMILY and len(body) >= INET_DIAG_MSG.size:
                    out.append(self._socket(body))

    @staticmethod
    def _socket(body: bytes) -> tuple[dict, dict, str | None]:
        (family, state, _timer, _retrans, sport, dport, src, dst, _ifindex, _cookie, _expires, rqueue, wqueue,
         uid, inode) = INET_DIAG_MSG.unpack_from(body)
        msg = {"family": family, "state": state, "sport": socket.ntohs(sport), "dport": socket.ntohs(dport),
               "src": src, "dst": dst, "rqueue": rqueue, "wqueue": wqueue, "uid": uid, "inode": inode}
        info, cong = {}, None
        off = INET_DIAG_MSG.size
        while off + RTATTR.size <= len(body):
            alen, atype = RTATTR.unpack_from(body, off)
            if alen < RTATTR.size:
                break
            payload = body[off + RTATTR.size:off + alen]
            if atype == INET_DIAG_INFO:
                info = parse_tcp_info(payload)
            elif atype == INET_DIAG_CONG:
                cong = payload.split(b"\0", 1)[0].decode("ascii", "replace") or None
            off += (alen + 3) & ~3
        return msg, info, cong

    def text(self, pids=()) -> bytes:
        """``ss -tinpeH`` of the namespace; owners among ``pids``."""
        socks = self.dump()
        owners = self.owners.lookup({m["inode"] for m, _, _ in socks if m["inode"]}, pids)
        lines = []
        for m, ti, cong in socks:
            users = owners.get(m["inode"]) if m["inode"] else None
            cols = [STATE_NAMES.get(m["state"], "UNKNOWN"), str(m["rqueue"]), str(m["wqueue"]),
                    _addr(m["family"], m["src"], m["sport"]), _addr(m["family"], m["dst"], m["dport"])]
            if users:
                quoted = ",".join('("{}",pid={},fd={})'.format(n.replace('"', '\\"'), p, f) for n, p, f in users)
                cols.append(f"users:({quoted})")
            if m["uid"]:
                cols.append(f"uid:{m['uid']}")
            cols.append(f"ino:{m['inode']}")
            lines.append(" ".join(cols))
            lines.append("\t " + info_line(ti, cong))
        return ("\n".join(lines) + "\n").encode() if lines else b""
