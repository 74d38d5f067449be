"""Byte-exact IPv4/IPv6/TCP/UDP/ICMP/ARP builders (struct only, checksums computed).

Scapy is convenient but hides the fields these captures need to get wrong on purpose
(IPv4 total length 0, IPv6 extension header chains, options cut by the snaplen), so the
network layer is written here by hand.  A packet is a `Pkt`: a timestamp in integer
nanoseconds, an ethertype and the network-layer bytes; the writers add the link layer.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field

# all crafted captures start here (2023-11-14T22:13:20Z) unless a scenario needs epoch 0
BASE_NS = 1_700_000_000 * 1_000_000_000

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
ETH_ARP = 0x0806

FIN, SYN, RST, PSH, ACK, URG, ECE, CWR = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80
_FLAG_LETTERS = {"F": FIN, "S": SYN, "R": RST, "P": PSH, "A": ACK, "U": URG, "E": ECE, "C": CWR}


def flags_of(s: str | int) -> int:
    if isinstance(s, int):
        return s
    v = 0
    for ch in s:
        v |= _FLAG_LETTERS[ch]
    return v


@dataclass
class Pkt:
    t_ns: int
    ethertype: int
    l3: bytes
    # interface (pcapng) and free-form note for the README/manifest
    iface: int = 0
    note: str = ""
    meta: dict = field(default_factory=dict)


def csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


# -- TCP options -------------------------------------------------------------------------

def opt_mss(v=1460):
    return struct.pack("!BBH", 2, 4, v)


def opt_ws(shift):
    return struct.pack("!BBB", 3, 3, shift)


def opt_sack_perm():
    return b"\x04\x02"


def opt_ts(val, ecr):
    return struct.pack("!BBII", 8, 10, val & 0xFFFFFFFF, ecr & 0xFFFFFFFF)


def opt_sack(*blocks):
    body = b"".join(struct.pack("!II", a & 0xFFFFFFFF, b & 0xFFFFFFFF) for a, b in blocks)
    return struct.pack("!BB", 5, 2 + len(body)) + body


NOP = b"\x01"


def pad_opts(opts: bytes) -> bytes:
    while len(opts) % 4:
        opts += NOP if len(opts) % 4 else b"\0"
    return opts


# -- L4 ---------------------------------------------------------------------------------

def tcp_bytes(src_ip: bytes, dst_ip: bytes, sport, dport, seq, ack, flags, win, payload=b"",
              opts=b"", urg=0) -> bytes:
    opts = pad_opts(opts)
    off = (20 + len(opts)) // 4
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF,
                      off << 4, flags_of(flags), win & 0xFFFF, 0, urg) + opts
    seg = hdr + payload
    if len(src_ip) == 4:
        pseudo = src_ip + dst_ip + struct.pack("!BBH", 0, 6, len(seg))
    else:
        pseudo = src_ip + dst_ip + struct.pack("!IxxxB", len(seg), 6)
    c = csum(pseudo + seg)
    return seg[:16] + struct.pack("!H", c) + seg[18:]


def udp_bytes(src_ip: bytes, dst_ip: bytes, sport, dport, payload=b"") -> bytes:
    ln = 8 + len(payload)
    seg = struct.pack("!HHHH", sport, dport, ln, 0) + payload
    if len(src_ip) == 4:
        pseudo = src_ip + dst_ip + struct.pack("!BBH", 0, 17, ln)
    else:
        pseudo = src_ip + dst_ip + struct.pack("!IxxxB", ln, 17)
    c = csum(pseudo + seg) or 0xFFFF
    return seg[:6] + struct.pack("!H", c) + seg[8:]


def icmp_bytes(typ, code, rest: bytes, body: bytes = b"") -> bytes:
    msg = struct.pack("!BBH", typ, code, 0) + rest + body
    c = csum(msg)
    return msg[:2] + struct.pack("!H", c) + msg[4:]


# -- L3 ---------------------------------------------------------------------------------

def ip4(a: str) -> bytes:
    return ipaddress.IPv4Address(a).packed


def ip6(a: str) -> bytes:
    return ipaddress.IPv6Address(a).packed


def ipv4_bytes(src: str, dst: str, proto: int, payload: bytes, ident=0, ttl=64,
               total_len: int | None = None, frag_off=0, more_frags=False, dont_frag=True,
               options: bytes = b"") -> bytes:
    """IPv4 header (+ options, padded to 4 bytes) + payload.  total_len overrides the header
    field (0 = TSO style)."""
    options += b"\0" * ((-len(options)) % 4)
    hl = 20 + len(options)
    tl = hl + len(payload) if total_len is None else total_len
    fl = (0x4000 if dont_frag else 0) | (0x2000 if more_frags else 0) | (frag_off // 8)
    hdr = struct.pack("!BBHHHBBH4s4s", 0x40 | hl // 4, 0, tl, ident & 0xFFFF, fl, ttl, proto, 0,
                      ip4(src), ip4(dst)) + options
    hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
    return hdr + payload


def ipv6_bytes(src: str, dst: str, nh: int, payload: bytes, hlim=64,
               payload_len: int | None = None) -> bytes:
    pl = len(payload) if payload_len is None else payload_len
    return struct.pack("!IHBB16s16s", 6 << 28, pl, nh, hlim, ip6(src), ip6(dst)) + payload


def ext_hbh(nh: int) -> bytes:
    """Hop-by-hop options header, 8 bytes: a PadN option filling it."""
    return struct.pack("!BB", nh, 0) + b"\x01\x04\0\0\0\0"


def ext_dstopts(nh: int) -> bytes:
    """Destination options header, 16 bytes (hdr ext len 1): PadN filling it."""
    return struct.pack("!BB", nh, 1) + b"\x01\x0c" + b"\0" * 12


def ext_routing_srh(nh: int, segments: list[str]) -> bytes:
    """Segment Routing Header (routing type 4) with segments left = 0 (already at the end)."""
    body = b"".join(ip6(s) for s in segments)
    hlen = len(body) // 8
    return struct.pack("!BBBBBBH", nh, hlen, 4, 0, len(segments) - 1, 0, 0) + body


def arp_request(src_mac: bytes, src_ip: str, dst_ip: str) -> bytes:
    return struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, src_mac, ip4(src_ip), b"\0" * 6,
                       ip4(dst_ip))


# -- a TCP connection -------------------------------------------------------------------

class Conn:
    """Builds the packets of one TCP connection; sides are 'c' (client) and 's' (server).

    Each side tracks `nxt` (next sequence number it sends) and `rcv` (the ACK it sends).
    `seg()` sends at `nxt` unless `seq` is given; `advance=False` leaves `nxt` alone (for
    retransmissions).  The capture list `cap` is shared so that several connections and
    non-TCP packets interleave in one file; `seg()` returns the 1-based frame number.
    """

    def __init__(self, cap: list, cli=("10.0.0.1", 40000), srv=("10.0.0.2", 80),
                 isn_c=1000, isn_s=5000, v6=False, base_ns=BASE_NS):
        self.cap = cap
        self.base_ns = base_ns
        self.addr = {"c": cli, "s": srv}
        self.v6 = v6
        self.nxt = {"c": isn_c, "s": isn_s}
        self.rcv = {"c": 0, "s": 0}
        self.win = {"c": 64240, "s": 65160}

    def other(self, side):
        return "s" if side == "c" else "c"

    ip_options = b""      # IPv4 options on every packet of this connection

    def build(self, side, seq, ack, flags, win, payload, opts=b"", ip_total_len=None,
              ip6_payload_len=None, ext=None, ident=0):
        (sa, sp), (da, dp) = self.addr[side], self.addr[self.other(side)]
        if self.v6:
            t = tcp_bytes(ip6(sa), ip6(da), sp, dp, seq, ack, flags, win, payload, opts)
            if ext:  # [(protocol number of this header, builder(next_header) -> bytes)]
                chain = b""
                nh = 6
                for code, mk in reversed(ext):
                    chain = mk(nh) + chain
                    nh = code
                return ETH_IPV6, ipv6_bytes(sa, da, nh, chain + t, payload_len=ip6_payload_len)
            return ETH_IPV6, ipv6_bytes(sa, da, 6, t, payload_len=ip6_payload_len)
        t = tcp_bytes(ip4(sa), ip4(da), sp, dp, seq, ack, flags, win, payload, opts)
        return ETH_IPV4, ipv4_bytes(sa, da, 6, t, total_len=ip_total_len, ident=ident, options=self.ip_options)

    def seg(self, t_ms: float, side: str, n: int = 0, flags="A", seq=None, ack=None, win=None,
            advance=True, opts=b"", note="", iface=0, ip_total_len=None, ext=None,
            ip6_payload_len=None, payload=None, trailer=b"") -> int:
        f = flags_of(flags)
        s = self.nxt[side] if seq is None else seq
        a = (self.rcv[side] if ack is None else ack) if (f & ACK or ack is not None) else 0
        w = self.win[side] if win is None else win
        pl = payload if payload is not None else bytes((i * 7 + 13) & 0xFF for i in range(n))
        et, l3 = self.build(side, s, a, f, w, pl, opts, ip_total_len=ip_total_len,
                            ip6_payload_len=ip6_payload_len, ext=ext)
        l3 += trailer   # bytes after the IP datagram (Ethernet padding, garbage)
        end = (s + len(pl) + (1 if f & (SYN | FIN) else 0)) & 0xFFFFFFFF
        if advance and ((end - self.nxt[side]) & 0xFFFFFFFF) < 0x80000000:
            self.nxt[side] = end
        # the peer will ACK what it has been sent (scenarios override when simulating loss)
        o = self.other(side)
        if ((end - self.rcv[o]) & 0xFFFFFFFF) < 0x80000000 or self.rcv[o] == 0:
            self.rcv[o] = end
        self.cap.append(Pkt(self.base_ns + int(round(t_ms * 1_000_000)), et, l3, iface=iface, note=note,
                            meta={"side": side}))
        return len(self.cap)

    def handshake(self, t0_ms=0.0, rtt_ms=10.0, ws_c=7, ws_s=7, sack=True, ts=False):
        oc = opt_mss() + (NOP + opt_ws(ws_c) if ws_c is not None else b"") + (opt_sack_perm() if sack else b"")
        os_ = opt_mss() + (NOP + opt_ws(ws_s) if ws_s is not None else b"") + (opt_sack_perm() if sack else b"")
        if ts:
            oc += opt_ts(1, 0)
            os_ += opt_ts(1, 1)
        f1 = self.seg(t0_ms, "c", flags="S", opts=oc, note="SYN")
        f2 = self.seg(t0_ms + rtt_ms / 2, "s", flags="SA", opts=os_, note="SYN/ACK")
        f3 = self.seg(t0_ms + rtt_ms, "c", flags="A", note="ACK")
        return f1, f2, f3

    def close(self, t_ms, side="c", gap_ms=1.0):
        o = self.other(side)
        a = self.seg(t_ms, side, flags="FA", note="FIN")
        b = self.seg(t_ms + gap_ms, o, flags="FA", note="FIN")
        c = self.seg(t_ms + 2 * gap_ms, side, flags="A", note="last ACK")
        return a, b, c


def non_tcp(cap: list, t_ms: float, kind: str, note="", base_ns=None):
    """Append an ARP / UDP / ICMP echo packet (for frame numbers != row numbers)."""
    t = (BASE_NS if base_ns is None else base_ns) + int(round(t_ms * 1_000_000))
    if kind == "arp":
        cap.append(Pkt(t, ETH_ARP, arp_request(b"\x02\0\0\0\0\x01", "10.0.0.1", "10.0.0.2"), note=note or "ARP"))
    elif kind == "udp":
        u = udp_bytes(ip4("10.0.0.1"), ip4("10.0.0.53"), 5353, 53, b"\x12\x34\x01\x00\0\x01\0\0\0\0\0\0\x03www\x07example\x03com\0\0\x01\0\x01")
        cap.append(Pkt(t, ETH_IPV4, ipv4_bytes("10.0.0.1", "10.0.0.53", 17, u), note=note or "UDP DNS query"))
    elif kind == "icmp":
        i = icmp_bytes(8, 0, struct.pack("!HH", 0x1234, 1), b"ping" * 8)
        cap.append(Pkt(t, ETH_IPV4, ipv4_bytes("10.0.0.1", "10.0.0.2", 1, i), note=note or "ICMP echo"))
    else:
        raise ValueError(kind)
    return len(cap)


def ext_hbh_jumbo(nh: int, jumbo_len: int) -> bytes:
    """Hop-by-hop header with a Jumbo Payload option (RFC 2675), 8 bytes."""
    return struct.pack("!BBBBI", nh, 0, 0xC2, 4, jumbo_len)


def vxlan_wrap(inner_eth_frame: bytes, src: str, dst: str, vni: int = 42, sport: int = 49152) -> bytes:
    """IPv4/UDP 4789/VXLAN around an inner Ethernet frame; returns IPv4 bytes."""
    vx = struct.pack("!BxxxI", 0x08, vni << 8) + inner_eth_frame
    u = udp_bytes(ip4(src), ip4(dst), sport, 4789, vx)
    return ipv4_bytes(src, dst, 17, u)


def gre_wrap(inner_ip: bytes, src: str, dst: str, ethertype: int = 0x0800) -> bytes:
    """IPv4/GRE (no options) around an inner IP packet; returns IPv4 bytes."""
    return ipv4_bytes(src, dst, 47, struct.pack("!HH", 0, ethertype) + inner_ip)
