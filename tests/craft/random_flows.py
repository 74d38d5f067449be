"""Random TCP dialogues for differential testing against tshark (hypothesis strategy).

A dialogue is a list of events (who sends what, when); `build()` turns it into packets
with plausible but frequently wrong sequence/ACK numbers, windows and timings, aimed at
the corners of the 4.0.17 rules: retransmissions of old segments, gaps, keep-alives,
1-byte probes, zero and changing windows, FIN/RST/SYN in the middle, ISNs near 2^32 and 0,
ACKs behind / ahead / inside segments, time deltas at the 3 ms / iRTT / 20 ms thresholds
and going backwards.  The file is written with the ordinary pcap writer.
"""
from __future__ import annotations

from hypothesis import strategies as st

from packets import NOP, Conn, opt_mss, opt_sack_perm, opt_ts, opt_ws

KINDS = ["data"] * 5 + ["ack"] * 5 + ["retx"] * 3 + ["gap", "ka", "zwp", "zwp", "fin", "rst", "syn", "dupburst", "dupburst"] + ["dupack"] * 3
DT_MS = [0, 0.000001, 0.5, 1, 2.999999, 3, 5, 9.999999, 10, 10.000001, 19.999999, 20, 25, 200, -0.5, -30]
LENS = [1, 10, 100, 1448, 30000]
WINS = ["same"] * 4 + ["zero", "other", "small"]
ACKS = ["cur"] * 4 + ["old", "ahead", "partial", "zero"]


@st.composite
def dialogues(draw, max_events: int = 40):
    isn_c = draw(st.sampled_from([1000, 0xFFFFFF00, 0xFFFFFFFF, 0x7FFFFFF0, 0]))
    isn_s = draw(st.sampled_from([5000, 0xFFFFFFF0, 1]))
    handshake = draw(st.sampled_from([True, True, True, False]))
    ws = draw(st.sampled_from([(7, 7), (None, 7), (0, 14), (None, None)]))
    ts_opt = draw(st.booleans())
    rtt = draw(st.sampled_from([10.0, 2.0, 0.0]))
    n = draw(st.integers(3, max_events))
    events = [(draw(st.sampled_from("ccs")), draw(st.sampled_from(KINDS)), draw(st.sampled_from(DT_MS)),
               draw(st.sampled_from(LENS)), draw(st.sampled_from(WINS)), draw(st.sampled_from(ACKS)),
               draw(st.integers(0, 1 << 16)))
              for _ in range(n)]
    snaplen = draw(st.sampled_from([262144] * 4 + [60, 80]))   # 60 cuts the options of TS/SACK/SYN segments
    return {"isn_c": isn_c, "isn_s": isn_s, "handshake": handshake, "ws": ws, "ts": ts_opt,
            "rtt": rtt, "events": events, "snaplen": snaplen}


def build(d: dict) -> list:
    cap: list = []
    c = Conn(cap, isn_c=d["isn_c"], isn_s=d["isn_s"])
    t = 1000.0
    if d["handshake"]:
        c.handshake(t0_ms=t, rtt_ms=d["rtt"], ws_c=d["ws"][0], ws_s=d["ws"][1], ts=d["ts"])
        t += d["rtt"] + 1
    else:
        c.rcv["c"], c.rcv["s"] = c.nxt["s"], c.nxt["c"]
    sent = {"c": [], "s": []}   # (seq, len) of data segments per side
    last = {"c": None, "s": None}   # (ack, window) of each side's last packet
    win = {"c": 64240, "s": 65160}
    tsv = [100]

    def opts():
        if not d["ts"]:
            return b""
        tsv[0] += 1
        return NOP + NOP + opt_ts(tsv[0], tsv[0] - 1)

    for side, kind, dt, ln, wmode, amode, r in d["events"]:
        t = max(t + dt, 0.0)
        o = "s" if side == "c" else "c"
        if wmode == "zero":
            win[side] = 0
        elif wmode == "other":
            win[side] = 1000 + r % 60000
        elif wmode == "small":
            win[side] = 10
        elif win[side] == 0 and r % 2 == 0:
            win[side] = 30000
        peer_nxt = c.nxt[o]
        if amode == "cur":
            ack = peer_nxt
        elif amode == "old":
            ack = (peer_nxt - (r % 3000)) & 0xFFFFFFFF
        elif amode == "ahead":
            ack = (peer_nxt + 1 + r % 5000) & 0xFFFFFFFF
        elif amode == "partial" and sent[o]:
            s0, l0 = sent[o][r % len(sent[o])]
            ack = (s0 + max(1, l0 // 2)) & 0xFFFFFFFF
        elif amode == "zero":
            ack = 0
        else:
            ack = peer_nxt
        w = win[side]
        nx = c.nxt[side]
        if kind == "dupack" and last[side] is not None:
            ack, w = last[side]      # repeat exactly: dup ACK / keep-alive ACK / ZWP ACK
        last[side] = (ack, w)
        if kind == "data":
            sent[side].append((nx, ln))
            c.seg(t, side, ln, "PA", ack=ack, win=w, opts=opts())
        elif kind == "gap":
            seq = (nx + ln) & 0xFFFFFFFF
            sent[side].append((seq, ln))
            c.nxt[side] = seq
            c.seg(t, side, ln, "PA", ack=ack, win=w, opts=opts())
        elif kind == "retx" and sent[side]:
            s0, l0 = sent[side][r % len(sent[side])]
            c.seg(t, side, l0, "PA", seq=s0, ack=ack, win=w, advance=False, opts=opts())
        elif kind == "ka":
            c.seg(t, side, r % 2, "A", seq=(nx - 1) & 0xFFFFFFFF, ack=ack, win=w, advance=False, opts=opts())
            if r % 3 and last[o] is not None:
                t += 0.2
                c.seg(t, o, 0, "A", ack=last[o][0], win=last[o][1], advance=False, opts=opts())
        elif kind == "zwp":
            c.seg(t, side, 1, "PA", seq=nx, ack=ack, win=w, advance=False, opts=opts())
            if r % 2 and last[o] is not None:   # the peer answers with its previous ACK/window
                t += 0.2
                c.seg(t, o, 0, "A", ack=last[o][0], win=last[o][1], advance=False, opts=opts())
        elif kind == "fin":
            c.seg(t, side, 0, "FA", ack=ack, win=w, opts=opts())
        elif kind == "rst":
            c.seg(t, side, 0, "RA" if r % 2 else "R", seq=nx, ack=ack if r % 2 else None, win=w, advance=False)
        elif kind == "syn":
            new = r % 2 == 0
            isn = (r * 7919) & 0xFFFFFFFF if new else (d["isn_c"] if side == "c" else d["isn_s"])
            fl = "S" if side == "c" else "SA"
            o_ = opt_mss() + (NOP + opt_ws(7) if r % 3 else b"") + opt_sack_perm()
            c.seg(t, side, 0, fl, seq=isn, ack=ack if side == "s" else None, win=w, advance=new, opts=o_)
            if new:
                sent[side] = []
        elif kind == "dupburst" and last[o] is not None:
            # the peer repeats its last ACK 2..5 times, then this side resends the segment
            # at that ACK (or the newest one): the fast-retransmission pattern
            pa, pw = last[o]
            for _ in range(2 + r % 4):
                t += 0.1
                c.seg(t, o, 0, "A", ack=pa, win=pw, advance=False, opts=opts())
            t += 0.5 + (r % 7) * 4
            segs = [x for x in sent[side] if x[0] == pa] or sent[side][-1:]
            if segs:
                c.seg(t, side, segs[0][1], "PA", seq=segs[0][0], ack=ack, win=w, advance=False, opts=opts())
        elif kind == "dupack":
            c.seg(t, side, 0, "A", ack=ack, win=w, advance=False, opts=opts())
        else:   # "ack" (and "retx" with nothing sent yet)
            c.seg(t, side, 0, "A", ack=ack, win=w, opts=opts())
    return cap


LINK_NAMES = ["eth", "vlan", "qinq", "sll", "sll2", "raw", "null", "loop"]


@st.composite
def interleavings(draw):
    """Two random dialogues interleaved at random in one file (same or different client
    port: with the same 4-tuple they fight over one conversation), over a random link type."""
    return {"a": draw(dialogues(20)), "b": draw(dialogues(20)), "seed": draw(st.integers(0, 10 ** 6)),
            "same_ports": draw(st.booleans()), "link": draw(st.sampled_from(LINK_NAMES)),
            "nano": draw(st.booleans())}


def build_interleaved(d: dict) -> list:
    import random
    import struct
    a, b = build(d["a"]), build(d["b"])
    if not d["same_ports"]:
        for p in b:   # client port 40000 -> 40001 (checksums are not validated by tshark)
            l3 = bytearray(p.l3)
            sp, dp = struct.unpack_from("!HH", l3, 20)
            if sp == 40000:
                struct.pack_into("!H", l3, 20, 40001)
            if dp == 40000:
                struct.pack_into("!H", l3, 22, 40001)
            p.l3 = bytes(l3)
    rnd = random.Random(d["seed"])
    out, ia, ib = [], 0, 0
    while ia < len(a) or ib < len(b):
        if ib >= len(b) or (ia < len(a) and rnd.random() < 0.5):
            out.append(a[ia])
            ia += 1
        else:
            out.append(b[ib])
            ib += 1
    return out
