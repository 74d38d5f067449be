"""Capture file writers: link layers, classic pcap (us/ns, either byte order) and pcapng.

Everything is written with `struct` so that the layouts are exactly what the test wants
(per-interface if_tsresol, Simple Packet Blocks, unknown blocks, several sections, ...).
`write_pcap_scapy` writes the plain Ethernet pcap through scapy's PcapWriter instead, so
one writer that is not ours is exercised as well.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from packets import ETH_ARP, ETH_IPV4, ETH_IPV6, Pkt

LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276

MAC_A = b"\x02\x00\x00\x00\x00\x01"
MAC_B = b"\x02\x00\x00\x00\x00\x02"

BSD_AF_INET = 2
BSD_AF_INET6 = 24  # BSD_AF_INET6_BSD; Wireshark also knows 28 (FreeBSD) and 30 (Darwin)


@dataclass(frozen=True)
class Link:
    """How to put a network-layer packet on the wire: linktype + header builder."""
    name: str
    linktype: int

    def frame(self, p: Pkt, endian: str = "<") -> bytes:
        et, l3 = p.ethertype, p.l3
        n = self.name
        if n == "eth":
            return MAC_B + MAC_A + struct.pack("!H", et) + l3
        if n == "vlan":
            return MAC_B + MAC_A + struct.pack("!HHH", 0x8100, 0x0064, et) + l3
        if n == "qinq":
            return MAC_B + MAC_A + struct.pack("!HHHHH", 0x88A8, 0x00C8, 0x8100, 0x0064, et) + l3
        if n == "sll":
            # packet type 0 (to us) / 4 (outgoing), ARPHRD_ETHER, 6-byte address, protocol
            return struct.pack("!HHH8sH", 4, 1, 6, MAC_A + b"\0\0", et) + l3
        if n == "sll2":
            return struct.pack("!HHIHBB8s", et, 0, 3, 1, 4, 6, MAC_A + b"\0\0") + l3
        if n in ("raw", "ipv4", "ipv6"):
            if et not in (ETH_IPV4, ETH_IPV6):
                raise ValueError("raw IP link types carry IP only")
            if n == "ipv4" and et != ETH_IPV4 or n == "ipv6" and et != ETH_IPV6:
                raise ValueError(f"{n} carries only its own IP version")
            return l3
        if n in ("null", "loop"):
            af = {ETH_IPV4: BSD_AF_INET, ETH_IPV6: BSD_AF_INET6}[et]
            # DLT_NULL: AF in the byte order of the host that wrote the file (= file order);
            # DLT_LOOP: always network byte order.
            return struct.pack((endian if n == "null" else ">") + "I", af) + l3
        raise ValueError(n)


LINKS = {
    "eth": Link("eth", LINKTYPE_ETHERNET),
    "vlan": Link("vlan", LINKTYPE_ETHERNET),
    "qinq": Link("qinq", LINKTYPE_ETHERNET),
    "sll": Link("sll", LINKTYPE_LINUX_SLL),
    "sll2": Link("sll2", LINKTYPE_LINUX_SLL2),
    "raw": Link("raw", LINKTYPE_RAW),
    "ipv4": Link("ipv4", LINKTYPE_IPV4),
    "ipv6": Link("ipv6", LINKTYPE_IPV6),
    "null": Link("null", LINKTYPE_NULL),
    "loop": Link("loop", LINKTYPE_LOOP),
}


# -- classic pcap -------------------------------------------------------------------------

def write_pcap(path, pkts: list[Pkt], link: str = "eth", nano: bool = False, endian: str = "<",
               snaplen: int = 262144, orig_len_override=None) -> None:
    """Classic pcap.  Frames longer than `snaplen` are cut (orig_len keeps the wire length)."""
    lk = LINKS[link]
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = [struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, snaplen, lk.linktype)]
    div = 1 if nano else 1000
    for p in pkts:
        data = lk.frame(p, endian)
        orig = len(data) if orig_len_override is None else orig_len_override(p, len(data))
        cap = data[:snaplen]
        sec, sub = divmod(p.t_ns, 1_000_000_000)
        out.append(struct.pack(endian + "IIII", sec, sub // div, len(cap), orig) + cap)
    with open(path, "wb") as fh:
        fh.write(b"".join(out))


def write_pcap_scapy(path, pkts: list[Pkt], nano: bool = False, snaplen: int = 262144) -> None:
    """Ethernet pcap written by scapy's PcapWriter (little-endian host order)."""
    from scapy.utils import PcapWriter
    from scapy.packet import Raw
    from decimal import Decimal
    w = PcapWriter(str(path), linktype=LINKTYPE_ETHERNET, nano=nano, snaplen=snaplen, sync=True)
    try:
        for p in pkts:
            data = LINKS["eth"].frame(p)
            r = Raw(data[:snaplen])
            r.time = Decimal(p.t_ns) / Decimal(1_000_000_000)
            r.wirelen = len(data)
            w.write(r)
    finally:
        w.close()


# -- pcapng -------------------------------------------------------------------------------

def _opt(e, code, value: bytes) -> bytes:
    pad = (-len(value)) % 4
    return struct.pack(e + "HH", code, len(value)) + value + b"\0" * pad


def _block(e, btype, body: bytes) -> bytes:
    ln = 12 + len(body)
    assert ln % 4 == 0
    return struct.pack(e + "II", btype, ln) + body + struct.pack(e + "I", ln)


def shb(e="<", opts=b"") -> bytes:
    body = struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1)
    if opts:
        body += opts + _opt(e, 0, b"")
    return _block(e, 0x0A0D0D0A, body)


def idb(linktype: int, snaplen: int = 262144, tsresol: int | None = None, name: str | None = None,
        e="<", tsoffset: int | None = None) -> bytes:
    """Interface Description Block; tsresol is the raw if_tsresol byte (6 = us, 9 = ns,
    0x80|n = 2^-n).  None leaves the option out (default: microseconds)."""
    opts = b""
    if name is not None:
        opts += _opt(e, 2, name.encode())
    if tsresol is not None:
        opts += _opt(e, 9, bytes([tsresol]))
    if tsoffset is not None:
        opts += _opt(e, 14, struct.pack(e + "q", tsoffset))
    if opts:
        opts += _opt(e, 0, b"")
    return _block(e, 1, struct.pack(e + "HHI", linktype, 0, snaplen) + opts)


def ticks_of(t_ns: int, tsresol: int | None) -> int:
    """Timestamp in units of the interface's resolution (truncating)."""
    if tsresol is None:
        tsresol = 6
    if tsresol & 0x80:
        return (t_ns << (tsresol & 0x7F)) // 1_000_000_000
    exp = tsresol
    if exp >= 9:
        return t_ns * 10 ** (exp - 9)
    return t_ns // 10 ** (9 - exp)


def epb(iface: int, ticks: int, data: bytes, orig_len: int, e="<", comment: str | None = None) -> bytes:
    pad = (-len(data)) % 4
    body = struct.pack(e + "IIIII", iface, ticks >> 32, ticks & 0xFFFFFFFF, len(data), orig_len)
    body += data + b"\0" * pad
    if comment:
        body += _opt(e, 1, comment.encode()) + _opt(e, 0, b"")
    return _block(e, 6, body)


def spb(data: bytes, orig_len: int, e="<") -> bytes:
    """Simple Packet Block: interface 0, no timestamp, captured length = min(orig, snaplen)."""
    pad = (-len(data)) % 4
    return _block(e, 3, struct.pack(e + "I", orig_len) + data + b"\0" * pad)


def unknown_block(btype: int, payload: bytes, e="<") -> bytes:
    pad = (-len(payload)) % 4
    return _block(e, btype, payload + b"\0" * pad)


def custom_block(pen: int, payload: bytes, copyable=True, e="<") -> bytes:
    """Custom Block (0x00000BAD copyable / 0x40000BAD not copyable) with a Private Enterprise Number."""
    pad = (-len(payload)) % 4
    return _block(e, 0x00000BAD if copyable else 0x40000BAD,
                  struct.pack(e + "I", pen) + payload + b"\0" * pad)
