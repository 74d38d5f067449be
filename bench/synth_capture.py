"""A large, realistic-looking TCP capture for benchmarks (no root, no network).

Many bulk flows between a few hosts, as tcpdump on a NCCL socket-transport host
would record them with ``-s 128``: Ethernet + IPv4 + TCP with the timestamp
option, payloads cut by the snaplen, delayed ACKs every second segment, and
random loss that produces duplicate ACKs, fast retransmissions and RTO
retransmissions. The per-packet logic runs in Python once (it is a fixture
generator, not a hot path); the bytes are assembled with numpy.
"""
from __future__ import annotations

import argparse
import random
import struct

import numpy as np

MSS = 1448
SNAPLEN = 128
HDR = 14 + 20 + 32                      # Ethernet + IPv4 + TCP with NOP,NOP,TS
REC = np.dtype([
    ("ts_sec", "<u4"), ("ts_nsec", "<u4"), ("incl", "<u4"), ("orig", "<u4"),
    ("eth_dst", "S6"), ("eth_src", "S6"), ("ethertype", ">u2"),
    ("ver_ihl", "u1"), ("tos", "u1"), ("ip_len", ">u2"), ("ip_id", ">u2"), ("frag", ">u2"),
    ("ttl", "u1"), ("proto", "u1"), ("ip_sum", ">u2"), ("src", ">u4"), ("dst", ">u4"),
    ("sport", ">u2"), ("dport", ">u2"), ("seq", ">u4"), ("ack", ">u4"), ("off", "u1"),
    ("flags", "u1"), ("win", ">u2"), ("tcp_sum", ">u2"), ("urg", ">u2"),
    ("opt_nop", ">u2"), ("opt_ts", ">u2"), ("tsval", ">u4"), ("tsecr", ">u4"),
])
assert REC.itemsize == 16 + HDR


def generate(packets: int, flows: int, loss: float, seed: int):
    """Yield per-packet tuples (t_ns, src, dst, sport, dport, seq, ack, flags, win, paylen)."""
    rng = random.Random(seed)
    state = []
    for f in range(flows):
        a, b = 0x0A000001 + f % 8, 0x0A000101 + (f * 7) % 8
        state.append({"a": a, "b": b, "sp": 40000 + f, "dp": 43000 + f % 4,
                      "isn": rng.getrandbits(32), "risn": rng.getrandbits(32),
                      "next": 0, "acked": 0, "lost": None, "dups": 0, "unacked_segs": 0})
    out = []
    t = 1_700_000_000 * 10**9
    syn_done = set()
    while len(out) < packets:
        f = rng.randrange(flows)
        s = state[f]
        t += rng.randint(2000, 9000)
        a, b, sp, dp = s["a"], s["b"], s["sp"], s["dp"]
        if f not in syn_done:
            syn_done.add(f)
            out.append((t, a, b, sp, dp, s["isn"], 0, 0x02, 64240, 0))
            out.append((t + 30_000, b, a, dp, sp, s["risn"], s["isn"] + 1, 0x12, 65160, 0))
            out.append((t + 60_000, a, b, sp, dp, s["isn"] + 1, s["risn"] + 1, 0x10, 502, 0))
            s["next"] = s["acked"] = 1
            continue
        seq = s["next"]
        s["next"] += MSS
        if s["lost"] is None and rng.random() < loss:
            s["lost"] = seq                      # the receiver never sees it
            continue
        out.append((t, a, b, sp, dp, s["isn"] + seq, s["risn"] + 1, 0x18, 502, MSS))
        if s["lost"] is not None:
            s["dups"] += 1
            out.append((t + 20_000, b, a, dp, sp, s["risn"] + 1, s["isn"] + s["lost"], 0x10, 1000, 0))
            if s["dups"] == 3:
                rt = t + 25_000 if rng.random() < 0.8 else t + 210_000_000   # fast or RTO
                out.append((rt, a, b, sp, dp, s["isn"] + s["lost"], s["risn"] + 1, 0x18, 502, MSS))
                out.append((rt + 20_000, b, a, dp, sp, s["risn"] + 1, s["isn"] + s["next"], 0x10, 1000, 0))
                s["lost"], s["dups"], s["unacked_segs"] = None, 0, 0
                t = max(t, rt) + 30_000
        else:
            s["unacked_segs"] += 1
            if s["unacked_segs"] == 2:
                out.append((t + 20_000, b, a, dp, sp, s["risn"] + 1, s["isn"] + s["next"], 0x10, 1000, 0))
                s["unacked_segs"] = 0
    out.sort(key=lambda r: r[0])
    return out[:packets]


def write_pcap(path: str, packets: int = 1_000_000, flows: int = 64, loss: float = 0.002,
               seed: int = 7) -> int:
    return write_rows(path, np.array(generate(packets, flows, loss, seed), dtype=np.int64))


def write_rows(path, arr: np.ndarray) -> int:
    """Write packet rows (time_ns, src, dst, sport, dport, seq, ack, flags, win, paylen) as a
    nanosecond pcap of Ethernet/IPv4/TCP headers (timestamps option), one array write."""
    n = len(arr)
    rec = np.zeros(n, REC)
    t = arr[:, 0]
    rec["ts_sec"], rec["ts_nsec"] = t // 10**9, t % 10**9
    paylen = arr[:, 9]
    rec["incl"] = HDR
    rec["orig"] = HDR + paylen
    rec["eth_dst"], rec["eth_src"], rec["ethertype"] = b"\x02\0\0\0\0\x02", b"\x02\0\0\0\0\x01", 0x0800
    rec["ver_ihl"], rec["ip_len"], rec["frag"], rec["ttl"], rec["proto"] = 0x45, 20 + 32 + paylen, 0x4000, 64, 6
    rec["ip_id"] = np.arange(n) & 0xFFFF
    rec["src"], rec["dst"], rec["sport"], rec["dport"] = arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4]
    rec["seq"], rec["ack"] = arr[:, 5] & 0xFFFFFFFF, arr[:, 6] & 0xFFFFFFFF
    rec["off"], rec["flags"], rec["win"] = 8 << 4, arr[:, 7], arr[:, 8]
    rec["opt_nop"], rec["opt_ts"] = 0x0101, 0x080A
    rec["tsval"], rec["tsecr"] = (t // 10**6) & 0xFFFFFFFF, (t // 10**6 - 1) & 0xFFFFFFFF
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, SNAPLEN, 1))
        rec.tofile(fh)
    return n


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--flows", type=int, default=64)
    ap.add_argument("--loss", type=float, default=0.002)
    a = ap.parse_args()
    print(write_pcap(a.out, a.packets, a.flows, a.loss), "packets written to", a.out)
