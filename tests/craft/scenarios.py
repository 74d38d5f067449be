"""The crafted TCP scenarios: one capture per verdict / quirk, plus encapsulation variants.

Each scenario lists what it is meant to exercise as `expect`: (frame, column, value) triples
in the oracle's column names (see tests/oracle.py).  They were derived from the rules in
reference/TCP_ANALYSIS.md when the scenario was written; `test_crafted_capture_exercises_verdict`
checks that tshark really sees them, so a fixture cannot silently stop testing what it says.
Times are milliseconds after packets.BASE_NS unless stated.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from packets import (ACK, BASE_NS, ETH_IPV4, FIN, NOP, Conn, Pkt, ext_dstopts, ext_hbh, ext_hbh_jumbo, gre_wrap, vxlan_wrap,
                     ext_routing_srh, icmp_bytes, ip4, ipv4_bytes, non_tcp, opt_mss, opt_sack,
                     opt_sack_perm, opt_ts, opt_ws, tcp_bytes)


@dataclass
class Scenario:
    name: str          # file name without extension
    desc: str          # README line
    pkts: list
    expect: list       # [(frame, column, value)]
    write: dict = field(default_factory=dict)   # writer kwargs: link, nano, endian, snaplen, fmt
    group: str = ""    # scenarios of one group are the same flow in different encapsulations


def _E(frames, col, val=1):
    return [(f, col, val) for f in ([frames] if isinstance(frames, int) else frames)]


# ----------------------------------------------------------------------------------------
# verdict scenarios

def rto_retransmission():
    cap = []
    c = Conn(cap)
    c.handshake()                                   # 1-3, iRTT 10 ms
    c.seg(20, "c", 1000, "PA")                      # 4
    c.seg(21, "c", 1000, "PA")                      # 5
    ack4 = 1001 + 1000
    c.seg(30, "s", ack=ack4)                        # 6 acks 4 only
    c.seg(230, "c", 1000, "PA", seq=ack4, advance=False)   # 7 RTO retransmission of 5
    c.seg(240, "s")                                 # 8 acks everything (oldest entry: frame 5)
    c.close(300)                                    # 9-11
    exp = (_E(7, "retransmission") + _E(7, "fast_retransmission", 0) + _E(7, "out_of_order", 0)
           + _E(7, "spurious_retransmission", 0) + _E(7, "rto_frame", 5) + _E(6, "acks_frame", 4)
           + _E(8, "acks_frame", 5))
    return Scenario("rto_retransmission", "RTO retransmission 200 ms later: retransmission only, rto_frame = oldest unacked, acks_frame = oldest copy", cap, exp)


def fast_retransmission():
    cap = []
    c = Conn(cap)
    c.handshake()                                   # 1-3
    s1 = c.nxt["c"]
    c.seg(20, "c", 100, "PA")                       # 4 seg1
    c.nxt["c"] += 100                               # seg2 lost before the capture point
    c.seg(22, "c", 100, "PA")                       # 5 seg3 -> previous segment not captured
    c.seg(23, "c", 100, "PA")                       # 6 seg4
    c.seg(24, "c", 100, "PA")                       # 7 seg5
    a = s1 + 100
    c.seg(25, "s", ack=a)                           # 8 ack seg1
    c.seg(26, "s", ack=a, opts=NOP + NOP + opt_sack((a + 100, a + 200)))   # 9  dup #1
    c.seg(27, "s", ack=a, opts=NOP + NOP + opt_sack((a + 100, a + 300)))   # 10 dup #2
    c.seg(28, "s", ack=a, opts=NOP + NOP + opt_sack((a + 100, a + 400)))   # 11 dup #3
    c.seg(29, "s", ack=a, opts=NOP + NOP + opt_sack((a + 100, a + 400)))   # 12 dup #4
    c.seg(30, "c", 100, "PA", seq=a, advance=False)   # 13 fast retransmission
    c.seg(35, "s", ack=a + 400)                     # 14 acks all: seg5 (frame 7)
    c.close(100)
    exp = (_E(5, "lost_segment") + _E([9, 10, 11, 12], "duplicate_ack")
           + [(9, "duplicate_ack_num", 1), (10, "duplicate_ack_num", 2), (11, "duplicate_ack_num", 3),
              (12, "duplicate_ack_num", 4)] + _E([9, 10, 11, 12], "duplicate_ack_frame", 8)
           + _E(13, "fast_retransmission") + _E(13, "retransmission") + _E(14, "acks_frame", 7)
           + _E(8, "acks_frame", 4))
    return Scenario("fast_retransmission", "lost segment, 4 dup ACKs with growing SACK blocks (SACK ignored), fast retransmission (also sets retransmission)", cap, exp)


def spurious_retransmission():
    cap = []
    c = Conn(cap)
    c.handshake()
    c.seg(20, "c", 500, "PA")                       # 4
    c.seg(21, "c", 500, "PA")                       # 5
    c.seg(30, "s")                                  # 6 acks both
    c.seg(250, "c", 500, "PA", seq=1001, advance=False)   # 7 spurious (already acked)
    c.seg(251, "c", 500, "PA", seq=1501, advance=False)   # 8 spurious
    c.seg(260, "s")                                 # 9 dup ACK? same ack, same window -> dup #1
    c.close(300)
    exp = _E([7, 8], "spurious_retransmission") + _E([7, 8], "retransmission") + _E(9, "duplicate_ack")
    return Scenario("spurious_retransmission", "retransmission of already-ACKed data: spurious + retransmission, then a dup ACK", cap, exp)


def out_of_order():
    cap = []
    c = Conn(cap)
    c.handshake()                                   # iRTT 10 ms
    b = c.nxt["c"]
    c.seg(20, "c", 100, "PA", seq=b)                # 4 seg1
    c.seg(21, "c", 100, "PA", seq=b + 200)          # 5 seg3 lost_segment
    c.seg(22, "c", 100, "PA", seq=b + 100)          # 6 seg2 1 ms later < iRTT -> out-of-order
    c.seg(23, "c", 100, "PA", seq=b + 400)          # 7 seg5 lost_segment
    c.seg(40, "c", 100, "PA", seq=b + 300)          # 8 seg4 17 ms later >= iRTT -> retransmission
    c.seg(41, "s", ack=b + 500)                     # 9
    c.close(100)
    exp = (_E([5, 7], "lost_segment") + _E(6, "out_of_order") + _E(6, "retransmission", 0)
           + _E(8, "retransmission") + _E(8, "out_of_order", 0))
    return Scenario("out_of_order", "segment filling a hole within the iRTT is out-of-order, after the iRTT a retransmission", cap, exp)


def lost_and_acked_unseen():
    cap = []
    c = Conn(cap)
    c.handshake()
    b = c.nxt["c"]
    c.seg(20, "c", 100, "PA", seq=b)                # 4
    c.seg(21, "c", 100, "PA", seq=b + 200)          # 5 previous segment not captured
    c.seg(30, "s", ack=b + 300)                     # 6 ACKed unseen (max_seq_to_be_acked < nextseq branch)
    c.seg(31, "c", 100, "PA", seq=b + 300)          # 7
    c.seg(40, "s", ack=b + 500)                     # 8 ACKed unseen (acks beyond anything seen)
    c.seg(41, "c", 100, "PA", seq=b + 500)          # 9 (continues; no lost segment: nextseq was b+400 -> lost!)
    c.close(100)
    exp = (_E([5, 9], "lost_segment") + _E([6, 8], "ack_lost_segment"))
    return Scenario("lost_and_acked_unseen", "previous segment not captured and ACKed unseen segment (both branches)", cap, exp)


def dupack_counts():
    cap = []
    c = Conn(cap)
    c.handshake()
    c.seg(20, "s", 100, "PA")                       # 4 server data
    c.seg(30, "c")                                  # 5 ack (new ack -> lastnondupack = 5)
    c.seg(31, "c")                                  # 6 dup #1
    c.seg(32, "c")                                  # 7 dup #2
    c.seg(33, "c", 10, "PA")                        # 8 data, same ack: not a dup, no reset
    c.seg(34, "c")                                  # 9 dup #3
    c.seg(35, "c", win=60000)                       # 10 window update (no reset)
    c.seg(36, "c", win=60000)                       # 11 dup #4
    c.seg(37, "c", win=0)                           # 12 zero window (never a dup)
    c.seg(38, "c", win=60000)                       # 13 window update after zero window
    c.seg(39, "c", win=60000)                       # 14 dup #5
    c.seg(40, "c", flags="", ack=c.rcv["c"], win=60000)   # 15 dup #6 without the ACK flag
    c.seg(41, "c", flags="FA", win=60000)           # 16 FIN: not a dup, no reset
    c.seg(42, "c", win=60000)                       # 17 dup #7 continues after the FIN
    c.seg(50, "s", 100, "PA")                       # 18
    c.seg(60, "c", win=60000)                       # 19 new ack: counter reset
    c.seg(61, "c", win=60000)                       # 20 dup #1 of 19
    exp = ([(6, "duplicate_ack_num", 1), (7, "duplicate_ack_num", 2), (9, "duplicate_ack_num", 3),
            (11, "duplicate_ack_num", 4), (14, "duplicate_ack_num", 5), (15, "duplicate_ack_num", 6),
            (17, "duplicate_ack_num", 7), (20, "duplicate_ack_num", 1)]
           + _E([6, 7, 9, 11, 14, 15, 17], "duplicate_ack_frame", 5) + _E(20, "duplicate_ack_frame", 19)
           + _E([8, 10, 12, 13, 16], "duplicate_ack", 0) + _E([10, 13], "window_update")
           + _E(12, "zero_window"))
    return Scenario("dupack_counts", "dup ACK counting across data with the same ACK, window updates, zero window, no ACK flag, FIN; reset on new ACK", cap, exp)


def zero_window_probe():
    cap = []
    c = Conn(cap)
    c.handshake()
    c.seg(20, "c", 1000, "PA")                      # 4
    c.seg(30, "s", win=0)                           # 5 zero window
    p = c.nxt["c"]
    c.seg(230, "c", 1, "PA", seq=p, advance=False)  # 6 zero-window probe
    c.seg(240, "s", win=0, ack=p)                   # 7 ZWP ACK (+ zero window): the probe byte is not acked
    c.seg(640, "c", 1, "PA", seq=p, advance=False)  # 8 probe again (nextseq not advanced by a ZWP)
    c.seg(650, "s", win=0, ack=p)                   # 9 ZWP ACK
    c.seg(700, "s", win=65160, ack=p)               # 10 window update
    c.seg(701, "c", 1000, "PA", seq=p)              # 11 data resumes at the probed seq: no flag
    c.seg(710, "s")                                 # 12
    c.close(800)
    exp = (_E([5, 7, 9], "zero_window") + _E([6, 8], "zero_window_probe") + _E([7, 9], "zero_window_probe_ack")
           + _E(10, "window_update") + _E([6, 8, 11], "retransmission", 0))
    return Scenario("zero_window_probe", "zero window, 1-byte zero-window probes and their ACKs, window update, resumption", cap, exp)


def window_full():
    cap = []
    c = Conn(cap)
    c.handshake(ws_c=7, ws_s=7)                     # 1-3 both sides scale by 2^7
    c.seg(15, "s", win=10)                          # 4 receiver's first non-SYN ACK: 10<<7 = 1280 bytes
    c.seg(20, "c", 1000, "PA")                      # 5
    c.seg(21, "c", 280, "PA")                       # 6 fills the window exactly -> window full
    c.seg(30, "s", win=10)                          # 7
    c.seg(31, "c", 1280, "PA")                      # 8 window full again
    c.seg(40, "s", win=100)                         # 9
    c.close(50)                                     # 10-12
    # same thing without scaling (server omits WS): raw window is the byte count
    d = Conn(cap, cli=("10.0.0.1", 40001), isn_c=7000, isn_s=9000)
    d.handshake(t0_ms=100, ws_c=7, ws_s=None)       # 13-15
    d.seg(115, "s", win=1000)                       # 16
    d.seg(120, "c", 1000, "PA")                     # 17 window full (no scaling)
    d.seg(130, "s", win=1000)                       # 18
    d.seg(131, "c", 999, "PA")                      # 19 not full
    d.close(140)
    exp = _E([6, 8, 17], "window_full") + _E([5, 19], "window_full", 0) + _E(4, "window_update")
    return Scenario("window_full", "window full with window scaling from SYN/SYN-ACK (shift 7), and without (one side lacks WS)", cap, exp)


def window_update():
    cap = []
    c = Conn(cap)
    c.handshake()
    c.seg(20, "c", 1000, "PA")                      # 4
    c.seg(30, "s", win=2000)                        # 5 ack changes: not an update
    c.seg(31, "s", win=30000)                       # 6 window update
    c.seg(32, "s", win=30000)                       # 7 dup ACK
    c.seg(33, "s", win=40000)                       # 8 window update
    c.close(50)
    exp = _E([6, 8], "window_update") + _E(5, "window_update", 0) + _E(7, "duplicate_ack")
    return Scenario("window_update", "window updates (pure ACK, same ack, window changed) vs dup ACK", cap, exp)


def keep_alive():
    cap = []
    c = Conn(cap)
    c.handshake()
    c.seg(20, "c", 100, "PA")                       # 4
    c.seg(30, "s")                                  # 5
    k = c.nxt["c"] - 1
    c.seg(10030, "c", seq=k, advance=False)         # 6 keep-alive, 0 bytes at nextseq-1
    c.seg(10031, "s")                               # 7 keep-alive ACK
    c.seg(10032, "s")                               # 8 keep-alive ACK again (reverse last is still a KA)
    c.seg(20030, "c", 1, "A", seq=k, advance=False, payload=b"\0")   # 9 keep-alive with 1 byte (not a retransmission)
    c.seg(20031, "s")                               # 10 keep-alive ACK
    c.seg(20040, "c", 50, "PA")                     # 11
    c.seg(20050, "s")                               # 12
    c.close(20100)
    exp = (_E([6, 9], "keep_alive") + _E([7, 8, 10], "keep_alive_ack") + _E(9, "retransmission", 0)
           + _E([7, 8, 10], "duplicate_ack", 0))
    return Scenario("keep_alive", "keep-alives of 0 and 1 byte at nextseq-1 and their keep-alive ACKs", cap, exp)


def rst():
    cap = []
    c = Conn(cap)
    c.handshake()
    c.seg(20, "c", 100, "PA")                       # 4
    c.seg(30, "s")                                  # 5
    c.seg(40, "c", flags="R", seq=c.nxt["c"] + 5000, advance=False)   # 6 RST beyond nextseq: no lost segment
    c.seg(41, "s", flags="RA", win=0)               # 7 RST with window 0: no zero window
    d = Conn(cap, cli=("10.0.0.1", 40001), isn_c=3000)
    d.seg(100, "c", flags="S", opts=opt_mss())      # 8 SYN to a closed port
    d.seg(101, "s", flags="RA", seq=0, win=0)       # 9 RST/ACK
    exp = (_E([6, 7, 9], "rst") + _E([4, 5, 8], "rst", 0) + _E(6, "lost_segment", 0)
           + _E([7, 9], "zero_window", 0))
    return Scenario("rst", "RST and RST/ACK (rst column); RST beyond nextseq is no lost segment, RST with window 0 no zero window", cap, exp)


def syn_retx_port_reuse():
    cap = []
    c = Conn(cap, isn_c=0x10000000, isn_s=0x20000000)
    oc = opt_mss() + NOP + opt_ws(7) + opt_sack_perm()
    c.seg(0, "c", flags="S", opts=oc)               # 1 SYN
    c.seg(1000, "c", flags="S", opts=oc, seq=0x10000000, advance=False)   # 2 SYN retransmission (same ISN)
    c.seg(1005, "s", flags="SA", opts=oc)           # 3
    c.seg(1010, "c")                                # 4
    c.seg(1020, "c", 100, "PA")                     # 5
    c.seg(1030, "s")                                # 6
    c.close(1040)                                   # 7-9
    # the same ports again with a new ISN: new stream + port numbers reused
    d = Conn(cap, isn_c=0x30000000, isn_s=0x40000000)
    d.seg(5000, "c", flags="S", opts=oc)            # 10 reused ports
    d.seg(5005, "s", flags="SA", opts=oc)           # 11
    d.seg(5006, "s", flags="SA", opts=oc, seq=0x50000000)   # 12 SYN/ACK with another ISN: reused, same stream
    d.seg(5010, "c")                                # 13
    d.seg(5020, "c", 100, "PA")                     # 14
    d.seg(5030, "s")                                # 15
    exp = (_E(2, "retransmission") + _E(2, "reused_ports", 0) + _E([10, 12], "reused_ports")
           + _E([2, 3, 9], "stream", 0) + _E([10, 11, 12, 15], "stream", 1))
    return Scenario("syn_retx_port_reuse", "SYN retransmission with the same ISN (retransmission, same stream), port reuse with a new ISN (new stream), SYN/ACK with a changed ISN", cap, exp)


def seq_wrap():
    cap = []
    c = Conn(cap, isn_c=0xFFFFFE6F, isn_s=0xFFFFFFF0)
    c.handshake(ws_c=None, ws_s=None)               # 1-3
    c.seg(20, "c", 400, "PA")                       # 4 ends exactly at seq 0 (0 = "unset" nextseq)
    c.seg(30, "s", ack=0)                           # 5 acks 0: lastack 0 = "unset"
    c.seg(330, "c", 400, "PA", seq=0xFFFFFE70, advance=False)   # 6 resend: nextseq==0 -> no retx, lastack==0 -> no spurious
    c.seg(340, "c", 100, "PA", seq=0)               # 7 from seq 0
    c.seg(350, "s")                                 # 8 acks 100
    c.seg(650, "c", 100, "PA", seq=0, advance=False)   # 9 spurious
    c.seg(651, "c", 400, "PA", seq=0xFFFFFE70, advance=False)   # 10 spurious across the wrap
    c.seg(700, "s", 200, "PA")                      # 11 server data crosses the wrap (0xFFFFFFF1 .. 0xB9)
    c.seg(710, "c")                                 # 12
    c.seg(720, "s", 100, "PA", seq=(0xFFFFFFF1 + 300) & 0xFFFFFFFF)   # 13 lost segment after the wrap
    c.seg(721, "s", 100, "PA", seq=(0xFFFFFFF1 + 200) & 0xFFFFFFFF)   # 14 out-of-order (3 ms threshold? iRTT 10 ms)
    c.seg(730, "c")                                 # 15
    c.close(800)
    exp = (_E(6, "retransmission", 0) + _E(6, "spurious_retransmission", 0) + _E([9, 10], "spurious_retransmission")
           + _E(13, "lost_segment") + _E(14, "out_of_order"))
    return Scenario("seq_wrap", "ISN near 2^32: data across the wrap, a segment ending exactly at 0 (nextseq/lastack 0 = unset quirks), spurious, lost, out-of-order after the wrap", cap, exp)


def tso_supersegments():
    cap = []
    c = Conn(cap)
    c.handshake()
    b = c.nxt["c"]
    c.seg(20, "c", 64000, "PA")                     # 4 64000-byte super-segment (IP total length set)
    c.seg(20.1, "c", 30000, "PA", ip_total_len=0)   # 5 IPv4 total length 0: length from the frame
    c.seg(21, "c", 8000, "PA")                      # 6
    c.seg(30, "s", ack=b + 32000)                   # 7 partial ACK inside frame 4 (trim)
    c.seg(31, "s", ack=b + 64000)                   # 8 acks the end of frame 4
    c.seg(300, "c", 1448, "PA", seq=b + 64000, advance=False)   # 9 MSS-sized retransmission of frame 5's head
    c.seg(310, "s", ack=b + 94000)                  # 10 acks frame 5's end (oldest copy)
    c.seg(311, "s", ack=b + 102000)                 # 11
    c.close(400)
    exp = (_E(8, "acks_frame", 4) + _E(7, "acks_frame", 0) + _E(9, "retransmission") + _E(9, "rto_frame", 5)
           + _E(10, "acks_frame", 5) + _E(5, "len", 30000) + _E(4, "len", 64000) + _E(11, "acks_frame", 6)
           + _E(6, "lost_segment", 0))
    return Scenario("tso_supersegments", "TSO/GSO super-segments (64000 bytes; IPv4 total length 0 = frame length), snaplen 128, partial ACK, MSS retransmission", cap, exp,
                    write={"snaplen": 128})


def midstream_start():
    cap = []
    c = Conn(cap, isn_c=0x5000, isn_s=0x9000)
    # capture starts in the middle: no handshake, both flows unknown
    c.nxt["c"] = 0x6000
    c.nxt["s"] = 0xA000
    c.rcv["c"] = 0xA000
    c.seg(0, "c", 100, "PA")                        # 1
    c.seg(1, "s", ack=0x6000 + 300)                 # 2 ACKed unseen (dupacknum of c -> 0xFFFFFFFF)
    c.seg(2, "c", 100, "PA", seq=0x6000 + 100)      # 3 first appearance but already acked -> spurious
    c.seg(3, "c", 100, "PA", seq=0x6000 + 300)      # 4
    c.seg(5, "s", ack=0x6000 + 400)                 # 5
    c.seg(6, "s", 50, "PA")                         # 6
    c.seg(7, "c")                                   # 7
    exp = _E(2, "ack_lost_segment") + _E(3, "spurious_retransmission") + _E(3, "retransmission")
    return Scenario("midstream_start", "capture starting mid-connection: no SYN, ACKed unseen, spurious retransmission on first appearance", cap, exp)


def dupacknum_minus1_quirk():
    cap = []
    c = Conn(cap)
    c.handshake()
    c.seg(20, "c", 100, "PA")                       # 4 (acks server's nextseq X)
    c.seg(30, "s", ack=c.nxt["c"] + 100)            # 5 ACKed unseen; maxseqtobeacked >= nextseq branch: c.dupacknum = 0xFFFFFFFF
    f = c.nxt["s"]
    c.seg(31, "s", flags="FA", ack=c.nxt["c"] + 100)   # 6 FIN
    c.seg(36, "s", flags="FA", seq=f, ack=c.nxt["c"] + 100, advance=False)   # 7 FIN again 16 ms after c's last packet
    # with no dup ACK at all this is a fast retransmission (u32 -1 >= 2)
    exp = (_E(5, "ack_lost_segment") + _E(7, "fast_retransmission") + _E(7, "retransmission")
           + _E(list(range(1, 8)), "duplicate_ack", 0))
    return Scenario("dupacknum_minus1_quirk", "after ACKed unseen the reverse dup-ACK counter is (guint32)-1, so a FIN retransmission within 20 ms is a fast retransmission without dup ACKs", cap, exp)


def backwards_time():
    cap = []
    c = Conn(cap)
    c.handshake()                                   # iRTT 10 ms
    b = c.nxt["c"]
    c.seg(20, "c", 100, "PA", seq=b)                # 4
    c.seg(22, "c", 100, "PA", seq=b + 200)          # 5 lost segment
    c.seg(21.5, "c", 100, "PA", seq=b + 100)        # 6 time goes backwards: not OOO -> retransmission
    c.seg(28.5, "c", 100, "PA", seq=b + 300)        # 7
    a = b + 100
    c.seg(30, "s", ack=a + 100)                     # 8
    c.seg(31, "s", ack=a + 100)                     # 9 dup 1
    c.seg(32, "s", ack=a + 100)                     # 10 dup 2
    c.seg(20.5, "c", 100, "PA", seq=a + 100, advance=False)   # 11 backwards again: not fast, not OOO -> retransmission
    c.seg(40, "s", ack=b + 400)                     # 12
    c.close(50)
    exp = (_E([6, 11], "retransmission") + _E([6, 11], "out_of_order", 0) + _E(11, "fast_retransmission", 0)
           + _E([9, 10], "duplicate_ack"))
    return Scenario("backwards_time", "timestamps going backwards: u64 deltas make would-be OOO/fast retransmissions plain retransmissions", cap, exp,
                    write={"nano": True})


def thresholds_exact():
    """Fast retransmission at exactly 20 ms and OOO at exactly the iRTT (strict <)."""
    cap = []
    c = Conn(cap)
    c.handshake(rtt_ms=10.0)                        # iRTT exactly 10 ms
    b = c.nxt["c"]
    c.seg(20, "c", 100, "PA", seq=b)                # 4
    c.seg(22, "c", 100, "PA", seq=b + 200)          # 5 lost
    c.seg(32, "c", 100, "PA", seq=b + 100)          # 6 exactly iRTT after 5 -> retransmission, not OOO
    c.seg(33, "c", 100, "PA", seq=b + 400)          # 7 lost
    c.seg(42.999999, "c", 100, "PA", seq=b + 300)   # 8 1 ns under iRTT -> OOO
    c.seg(50, "s", ack=b + 500)                     # 9
    e = b + 500
    c.seg(60, "c", 100, "PA", seq=e)                # 10
    c.seg(61, "c", 100, "PA", seq=e + 100)          # 11
    c.seg(62, "s", ack=e)                           # 12 dup 1 of 9
    c.seg(63, "s", ack=e)                           # 13 dup 2
    c.seg(83, "c", 100, "PA", seq=e, advance=False)   # 14 exactly 20 ms after 13 -> not fast
    c.seg(84, "s", ack=e)                           # 15 dup 3
    c.seg(103.999999, "c", 100, "PA", seq=e, advance=False)   # 16 1 ns under 20 ms -> fast
    c.seg(110, "s", ack=e + 200)                    # 17
    c.close(120)
    exp = (_E(6, "retransmission") + _E(6, "out_of_order", 0) + _E(8, "out_of_order")
           + _E(14, "retransmission") + _E(14, "fast_retransmission", 0) + _E(16, "fast_retransmission"))
    return Scenario("thresholds_exact", "strict < thresholds at ns precision: OOO at exactly iRTT / 1 ns under, fast retransmission at exactly 20 ms / 1 ns under", cap, exp,
                    write={"nano": True})


def syn_at_epoch0():
    cap = []
    c = Conn(cap, base_ns=0)
    c.handshake(t0_ms=0.0)                          # SYN at t = 0: iRTT never set -> OOO threshold 3 ms
    b = c.nxt["c"]
    c.seg(20, "c", 100, "PA", seq=b)                # 4
    c.seg(21, "c", 100, "PA", seq=b + 200)          # 5 lost
    c.seg(25, "c", 100, "PA", seq=b + 100)          # 6 4 ms later: retransmission (would be OOO with iRTT 10 ms)
    c.seg(26, "c", 100, "PA", seq=b + 400)          # 7 lost
    c.seg(28, "c", 100, "PA", seq=b + 300)          # 8 2 ms: OOO
    c.seg(30, "s", ack=b + 500)
    exp = _E(6, "retransmission") + _E(6, "out_of_order", 0) + _E(8, "out_of_order")
    return Scenario("syn_at_epoch0", "SYN stamped at epoch 0 never sets the iRTT: OOO threshold falls back to 3 ms", cap, exp)


def non_tcp_mixed():
    cap = []
    non_tcp(cap, -5, "arp")                         # 1
    non_tcp(cap, -4, "udp")                         # 2
    c = Conn(cap)
    c.handshake()                                   # 3-5
    non_tcp(cap, 15, "icmp")                        # 6
    b = c.nxt["c"]
    c.seg(20, "c", 100, "PA", seq=b)                # 7
    non_tcp(cap, 20.5, "arp")                       # 8
    c.seg(21, "c", 100, "PA", seq=b + 200)          # 9 lost
    c.seg(25, "s", ack=b + 100)                     # 10
    c.seg(26, "s", ack=b + 100)                     # 11 dup 1 (frame 10)
    non_tcp(cap, 26.5, "udp")                       # 12
    c.seg(27, "s", ack=b + 100)                     # 13 dup 2
    c.seg(28, "c", 100, "PA", seq=b + 100, advance=False)   # 14 fast retransmission
    c.seg(30, "s", ack=b + 300)                     # 15 acks frame 9
    c.close(40)
    exp = (_E(9, "lost_segment") + [(11, "duplicate_ack_num", 1), (13, "duplicate_ack_num", 2)]
           + _E([11, 13], "duplicate_ack_frame", 10) + _E(14, "fast_retransmission") + _E(15, "acks_frame", 9))
    return Scenario("non_tcp_mixed", "ARP, UDP and ICMP frames interleaved: frame numbers differ from row numbers", cap, exp)


def icmp_quoted_tcp():
    cap = []
    c = Conn(cap)
    c.handshake()                                   # 1-3
    c.seg(20, "c", 100, "PA")                       # 4
    # router says "fragmentation needed", quoting the whole IP+TCP header of frame 4
    quoted = cap[3].l3[:60]
    icmp = icmp_bytes(3, 4, b"\0\0\x05\x00", quoted)
    cap.append(Pkt(BASE_NS + 21_000_000, ETH_IPV4, ipv4_bytes("10.0.0.254", "10.0.0.1", 1, icmp)))   # 5
    # an ICMP error quoting a SYN of a connection never seen (consumes a tcp.stream number)
    syn = tcp_bytes(ip4("10.0.0.1"), ip4("10.9.9.9"), 40100, 443, 777, 0, "S", 64240, b"", opt_mss())
    q2 = ipv4_bytes("10.0.0.1", "10.9.9.9", 6, syn)
    icmp2 = icmp_bytes(3, 1, b"\0\0\0\0", q2)
    cap.append(Pkt(BASE_NS + 22_000_000, ETH_IPV4, ipv4_bytes("10.0.0.254", "10.0.0.1", 1, icmp2)))   # 6
    c.seg(30, "s")                                  # 7
    c.seg(31, "c", 100, "PA")                       # 8
    c.seg(40, "s")                                  # 9
    exp = _E(7, "acks_frame", 4) + _E(9, "acks_frame", 8)
    return Scenario("icmp_quoted_tcp", "ICMP errors quoting TCP headers (shown by -Y tcp, no analysis, may consume tcp.stream numbers)", cap, exp)


def ipv4_fragments():
    cap = []
    c = Conn(cap)
    c.handshake()                                   # 1-3
    c.seg(20, "c", 100, "PA")                       # 4
    # a 1200-byte segment sent as two IPv4 fragments (frames 5, 6); TCP is analysed in frame 6
    seq = c.nxt["c"]
    t = tcp_bytes(ip4("10.0.0.1"), ip4("10.0.0.2"), 40000, 80, seq, c.rcv["c"], "PA", 64240,
                  bytes(range(256)) * 4 + bytes(176))
    c.nxt["c"] += 1200
    c.rcv["s"] = c.nxt["c"]
    cap.append(Pkt(BASE_NS + 21_000_000, ETH_IPV4, ipv4_bytes("10.0.0.1", "10.0.0.2", 6, t[:808], ident=0x4242,
                                                              total_len=20 + 808, more_frags=True, dont_frag=False)))
    cap.append(Pkt(BASE_NS + 21_001_000, ETH_IPV4, ipv4_bytes("10.0.0.1", "10.0.0.2", 6, t[808:], ident=0x4242,
                                                              frag_off=808, dont_frag=False)))
    c.seg(22, "c", 100, "PA")                       # 7
    c.seg(30, "s")                                  # 8 acks 7
    c.seg(300, "c", 100, "PA", seq=seq + 1200, advance=False)   # 9 spurious
    exp = _E(8, "acks_frame", 7) + _E(9, "spurious_retransmission") + _E(6, "len", 1200) + _E(7, "lost_segment", 0)
    return Scenario("ipv4_fragments", "TCP segment in two IPv4 fragments: analysed once, in the reassembling (last) fragment's frame", cap, exp)


def _ipv6_flow(ext=None):
    cap = []
    c = Conn(cap, cli=("2001:db8::1", 40000), srv=("2001:db8:0:1::2", 80), v6=True)
    kw = {"ext": ext} if ext else {}
    c.seg(0, "c", flags="S", opts=opt_mss() + NOP + opt_ws(7), **kw)
    c.seg(5, "s", flags="SA", opts=opt_mss() + NOP + opt_ws(7), **kw)
    c.seg(10, "c", **kw)
    b = c.nxt["c"]
    c.seg(20, "c", 100, "PA", seq=b, **kw)          # 4
    c.seg(21, "c", 100, "PA", seq=b + 200, **kw)    # 5 lost
    c.seg(22, "s", ack=b + 100, **kw)               # 6
    c.seg(23, "s", ack=b + 100, **kw)               # 7 dup 1
    c.seg(24, "s", ack=b + 100, **kw)               # 8 dup 2
    c.seg(25, "c", 100, "PA", seq=b + 100, advance=False, **kw)   # 9 fast
    c.seg(26, "s", ack=b + 300, **kw)               # 10
    c.seg(300, "c", 100, "PA", seq=b + 100, advance=False, **kw)   # 11 spurious
    exp = (_E(5, "lost_segment") + _E([7, 8], "duplicate_ack") + _E(9, "fast_retransmission")
           + _E(11, "spurious_retransmission") + _E(10, "acks_frame", 5))
    return cap, exp


def ipv6_ext_headers():
    ext = [(0, ext_hbh), (43, lambda nh: ext_routing_srh(nh, ["2001:db8:0:1::2", "2001:db8::99"])),
           (60, ext_dstopts)]
    cap, exp = _ipv6_flow(ext)
    return Scenario("ipv6_ext_headers", "IPv6 with hop-by-hop, routing (SRH, segments left 0) and destination options headers before TCP", cap, exp)


def _ts_flow():
    """A flow whose every segment carries the timestamps option (12 option bytes)."""
    cap = []
    c = Conn(cap)
    o = lambda i: NOP + NOP + opt_ts(100 + i, 50 + i)
    c.handshake(ts=True)
    b = c.nxt["c"]
    c.seg(20, "c", 200, "PA", seq=b, opts=o(1))      # 4
    c.seg(21, "c", 200, "PA", seq=b + 400, opts=o(2))   # 5 lost
    c.seg(22, "s", ack=b + 200, opts=o(3))           # 6
    c.seg(23, "s", ack=b + 200, opts=o(4))           # 7 dup 1
    c.seg(24, "s", ack=b + 200, opts=o(5))           # 8 dup 2
    c.seg(25, "c", 200, "PA", seq=b + 200, advance=False, opts=o(6))   # 9 fast
    c.seg(26, "s", ack=b + 600, opts=o(7))           # 10
    c.seg(300, "c", 200, "PA", seq=b + 200, advance=False, opts=o(8))  # 11 spurious
    return cap


def snaplen_none():
    cap = _ts_flow()
    exp = (_E(5, "lost_segment") + _E([7, 8], "duplicate_ack") + _E(9, "fast_retransmission")
           + _E(11, "spurious_retransmission"))
    return Scenario("snaplen_none", "the timestamps-option flow of the snaplen_* files, complete (reference for them)", cap, exp)


def snaplen_payload_cut():
    cap = _ts_flow()
    exp = (_E(5, "lost_segment") + _E([7, 8], "duplicate_ack") + _E(9, "fast_retransmission")
           + _E(11, "spurious_retransmission") + _E(5, "len", 200))
    return Scenario("snaplen_payload_cut", "snaplen 80: payload cut, options intact -> same verdicts, tcp.len from the IP length", cap, exp,
                    write={"snaplen": 80})


def snaplen_options_cut():
    cap = _ts_flow()
    exp = (_E([5], "lost_segment", 0) + _E([7, 8], "duplicate_ack", 0) + _E(9, "fast_retransmission", 0)
           + _E(9, "retransmission", 0) + _E(11, "spurious_retransmission", 0) + _E(5, "len", 200))
    return Scenario("snaplen_options_cut", "snaplen 60 cuts the TCP timestamps option: tshark prints no analysis fields (all verdicts 0) but keeps state", cap, exp,
                    write={"snaplen": 60})


def snaplen_mixed_cut():
    """Only some frames are cut (per-packet caplen): the cut frames lose their output, the
    state carries on, and later full frames show verdicts that depend on the cut ones."""
    cap = _ts_flow()
    cut = {6, 7, 8}   # the dup ACKs are cut at 60 bytes: still counted, so frame 9 is fast
    exp = (_E(5, "lost_segment") + _E([7, 8], "duplicate_ack", 0) + _E(9, "fast_retransmission")
           + _E(11, "spurious_retransmission"))
    return Scenario("snaplen_mixed_cut", "options cut on the dup ACK frames only (caplen 60): their verdicts vanish but they still count, so the retransmission is still fast", cap, exp,
                    write={"cut_frames": cut, "cut_len": 60})


def tcp_header_cut():
    cap = _ts_flow()
    return Scenario("tcp_header_cut", "snaplen 44 cuts into the TCP base header (ports and seq only)", cap,
                    _E(4, "sport", 40000), write={"snaplen": 44})


def _retx_flow(c, t0=20.0):
    """Data with a hole, 2 dup ACKs, fast retransmission, full ACK, spurious copy (frames +0..+7)."""
    b = c.nxt["c"]
    f = c.seg(t0, "c", 100, "PA", seq=b)                          # +0
    c.seg(t0 + 1, "c", 100, "PA", seq=b + 200)                    # +1 lost
    c.seg(t0 + 2, "s", ack=b + 100)                               # +2
    c.seg(t0 + 3, "s", ack=b + 100)                               # +3 dup 1
    c.seg(t0 + 4, "s", ack=b + 100)                               # +4 dup 2
    c.seg(t0 + 5, "c", 100, "PA", seq=b + 100, advance=False)     # +5 fast
    c.seg(t0 + 6, "s", ack=b + 300)                               # +6 acks +1
    c.seg(t0 + 300, "c", 100, "PA", seq=b + 100, advance=False)   # +7 spurious
    return (_E(f + 1, "lost_segment") + _E([f + 3, f + 4], "duplicate_ack") + _E(f + 5, "fast_retransmission")
            + _E(f + 6, "acks_frame", f + 1) + _E(f + 7, "spurious_retransmission"))


def eth_padding():
    cap = []
    c = Conn(cap)
    c.handshake()
    exp = _retx_flow(c)
    # pad every frame shorter than 60 bytes (Ethernet minimum) with zeros; give the data
    # frames a 4-byte non-zero trailer (like an FCS): tcp.len must come from the IP length
    for p in cap:
        if len(p.l3) + 14 < 60:
            p.l3 += b"\0" * (60 - 14 - len(p.l3))
        elif len(p.l3) > 100:
            p.l3 += b"\xde\xad\xbe\xef"
    exp += _E([3, 6, 7], "len", 0) + _E(4, "len", 100)
    return Scenario("eth_padding", "Ethernet frames padded to 60 bytes and data frames with a 4-byte trailer: lengths from IP, not the frame", cap, exp)


def ipv4_options():
    cap = []
    c = Conn(cap)
    c.ip_options = b"\x94\x04\x00\x00" + b"\x01\x01\x01\x00"   # router alert, NOP x3, EOL (IHL 7)
    c.handshake()
    exp = _retx_flow(c) + _E(4, "len", 100)
    return Scenario("ipv4_options", "IPv4 headers with options (IHL 7: router alert + NOPs)", cap, exp)


def ipv4_len_exceeds_frame():
    cap = []
    c = Conn(cap)
    c.handshake()
    b = c.nxt["c"]
    c.seg(20, "c", 1460, "PA", seq=b, ip_total_len=3000)     # 4 header claims 3000, frame carries 1500
    c.seg(21, "c", 100, "PA", seq=b + 1460)                  # 5 continues after the frame-based length
    c.seg(30, "s", ack=b + 1560)                             # 6
    exp = _E(4, "len", 1460) + _E(5, "lost_segment", 0) + _E(6, "acks_frame", 5)
    return Scenario("ipv4_len_exceeds_frame", "IPv4 total length (3000) larger than the frame: tcp.len from the frame's bytes", cap, exp)


def ipv6_big_tcp():
    cap = []
    c = Conn(cap, cli=("2001:db8::1", 40000), srv=("2001:db8::2", 80), v6=True)
    c.handshake()
    b = c.nxt["c"]
    c.seg(20, "c", 1000, "PA", seq=b)                                  # 4
    c.seg(21, "c", 70000, "PA", seq=b + 1000, ip6_payload_len=0,
          ext=[(0, lambda nh: ext_hbh_jumbo(nh, 8 + 20 + 70000))])     # 5 jumbogram (HBH jumbo): analysed
    c.seg(22, "c", 70000, "PA", seq=b + 71000, ip6_payload_len=0)      # 6 BIG TCP without jumbo: TCP malformed, no analysis
    c.seg(23, "c", 1000, "PA", seq=b + 141000)                         # 7
    c.seg(30, "s", ack=b + 142000)                                     # 8
    exp = _E(5, "len", 70000) + _E(7, "lost_segment") + _E(8, "acks_frame", 7)
    return Scenario("ipv6_big_tcp", "IPv6 super-segments: payload length 0 with a hop-by-hop Jumbo option (analysed) and without (BIG TCP, TCP malformed in 4.0)", cap, exp,
                    write={"snaplen": 128})


def _tunnel(kind):
    inner = []
    c = Conn(inner)
    c.handshake()
    exp = _retx_flow(c)
    cap = []
    for p in inner:
        if kind == "vxlan":
            from writers import LINKS
            outer = vxlan_wrap(LINKS["eth"].frame(p), "192.168.1.1", "192.168.1.2")
        else:
            outer = gre_wrap(p.l3, "192.168.1.1", "192.168.1.2")
        cap.append(Pkt(p.t_ns, ETH_IPV4, outer, meta=p.meta))
    return cap, exp


def vxlan_inner_tcp():
    cap, exp = _tunnel("vxlan")
    return Scenario("vxlan_inner_tcp", "TCP inside VXLAN (UDP 4789): tshark analyses the inner TCP; src/dst columns are the outer IPv4 (first occurrence)", cap, exp)


def gre_inner_tcp():
    cap, exp = _tunnel("gre")
    return Scenario("gre_inner_tcp", "TCP inside GRE (IPv4 in GRE in IPv4): inner TCP analysed; src/dst are the outer addresses", cap, exp)


def unacked_list_cap():
    """11,000 one-byte segments never acked: beyond 10,000 the unacked list stops growing, so
    the FIN's +1 is not added to nextseq (the +1 is inside the 'store segment' branch)."""
    cap = []
    c = Conn(cap)
    c.handshake()                                            # 1-3
    n = 10_050
    for i in range(n):
        c.seg(20 + i * 0.01, "c", 1, "PA", payload=b"x")     # 4 .. n+3
    fin = c.seg(200, "c", flags="FA")                        # n+4 FIN, list full: nextseq not +1
    c.seg(210, "s", ack=c.nxt["c"])                          # n+5 ACKs the FIN (+1)
    c.seg(400, "c", flags="FA", seq=c.nxt["c"] - 1, advance=False)   # n+6 FIN again
    exp = _E(n + 5, "ack_lost_segment") + _E(n + 5, "acks_frame", 0)
    return Scenario("unacked_list_cap", "more than 10,000 unacked segments in one flow (list cap), then FIN: +1 lost, the FIN's ACK is 'ACKed unseen'", cap, exp,
                    write={"snaplen": 54})


def malformed_tcp():
    """Broken TCP headers in the middle of a flow: data offset 4 (< 20 bytes), data offset
    15 beyond the segment, IPv4 total length cutting the TCP header short."""
    cap = []
    c = Conn(cap)
    c.handshake()                                            # 1-3
    c.seg(20, "c", 100, "PA")                                # 4
    f = c.seg(21, "c", 100, "PA", advance=False)             # 5 data offset 4 (bogus)
    p = cap[f - 1]
    p.l3 = p.l3[:32] + bytes([0x40]) + p.l3[33:]
    f = c.seg(22, "c", 8, "PA", advance=False)               # 6 data offset 15: 60-byte header, 28 bytes there
    p = cap[f - 1]
    p.l3 = p.l3[:32] + bytes([0xF0]) + p.l3[33:]
    f = c.seg(23, "c", 100, "PA", ip_total_len=20 + 12, advance=False)   # 7 IP length ends inside the TCP header
    c.seg(24, "c", 100, "PA")                                # 8 continues
    c.seg(30, "s")                                           # 9
    # tshark 4.0.17: frame 5 (header length 16) is still analysed, with seglen = 120 - 16 =
    # 104, so nextseq moves past frame 8, which becomes out-of-order; frame 7 gets no stream
    exp = (_E(4, "len", 100) + _E(9, "acks_frame", 8) + _E(8, "lost_segment", 0) + _E(5, "len", 104)
           + _E(8, "out_of_order") + _E(7, "stream", -1) + _E(6, "seq_rel", 1101))
    return Scenario("malformed_tcp", "bogus TCP data offsets (4; 15 beyond the segment) and an IPv4 length ending inside the TCP header, between valid segments", cap, exp)


VERDICT_SCENARIOS = [rto_retransmission, fast_retransmission, spurious_retransmission, out_of_order,
                     lost_and_acked_unseen, dupack_counts, zero_window_probe, window_full, window_update,
                     keep_alive, rst, syn_retx_port_reuse, seq_wrap, tso_supersegments, midstream_start,
                     dupacknum_minus1_quirk, backwards_time, thresholds_exact, syn_at_epoch0,
                     non_tcp_mixed, icmp_quoted_tcp, ipv4_fragments, ipv6_ext_headers,
                     snaplen_none, snaplen_payload_cut, snaplen_options_cut, snaplen_mixed_cut, tcp_header_cut,
                     eth_padding, ipv4_options, ipv4_len_exceeds_frame, ipv6_big_tcp, vxlan_inner_tcp,
                     gre_inner_tcp, unacked_list_cap, malformed_tcp]


# ----------------------------------------------------------------------------------------
# one flow, many encapsulations

def base_flow(v6=False):
    """The flow every format variant carries: 15 frames exercising the common verdicts.
    Timestamps are whole microseconds so that us/ns files hold identical times."""
    cap = []
    if v6:
        c = Conn(cap, cli=("2001:db8::1", 40000), srv=("2001:db8::2", 80), v6=True)
    else:
        c = Conn(cap)
    c.handshake()                                   # 1-3
    b = c.nxt["c"]
    c.seg(20, "c", 100, "PA", seq=b)                # 4
    c.seg(21, "c", 100, "PA", seq=b + 200)          # 5 lost segment
    c.seg(21.5, "c", 100, "PA", seq=b + 300)        # 6
    c.seg(25, "s", ack=b + 100)                     # 7
    c.seg(26, "s", ack=b + 100)                     # 8 dup 1
    c.seg(27, "s", ack=b + 100)                     # 9 dup 2
    c.seg(28, "c", 100, "PA", seq=b + 100, advance=False)   # 10 fast retransmission
    c.seg(29.25, "c", 100, "PA", seq=b + 500)       # 11 lost segment
    c.seg(30.125, "c", 100, "PA", seq=b + 400)      # 12 out-of-order
    c.seg(40, "s", ack=b + 600, win=30000)          # 13
    c.seg(41, "s", ack=b + 600, win=40000)          # 14 window update
    c.seg(400, "c", 100, "PA", seq=b + 100, advance=False)  # 15 spurious
    c.seg(10400, "c", seq=b + 599, advance=False)   # 16 keep-alive
    c.seg(10401, "s", ack=b + 600, win=40000)       # 17 keep-alive ACK
    exp = (_E([5, 11], "lost_segment") + _E([8, 9], "duplicate_ack") + _E(10, "fast_retransmission")
           + _E(12, "out_of_order") + _E(14, "window_update") + _E(15, "spurious_retransmission")
           + _E(16, "keep_alive") + _E(17, "keep_alive_ack") + _E(13, "acks_frame", 11))
    return cap, exp


# name -> (v6, writer kwargs).  "fmt" is pcap (default) or one of the pcapng layouts.
FORMAT_VARIANTS = {
    "fmt_pcap_us_le_scapy": (False, {"writer": "scapy"}),
    "fmt_pcap_ns_le_scapy": (False, {"writer": "scapy", "nano": True}),
    "fmt_pcap_us_be": (False, {"endian": ">"}),
    "fmt_pcap_ns_be": (False, {"endian": ">", "nano": True}),
    "fmt_vlan": (False, {"link": "vlan"}),
    "fmt_qinq": (False, {"link": "qinq"}),
    "fmt_sll": (False, {"link": "sll"}),
    "fmt_sll2": (False, {"link": "sll2"}),
    "fmt_raw101": (False, {"link": "raw"}),
    "fmt_raw101_ipv6": (True, {"link": "raw"}),
    "fmt_raw228_ipv4": (False, {"link": "ipv4"}),
    "fmt_raw229_ipv6": (True, {"link": "ipv6"}),
    "fmt_null_le": (False, {"link": "null"}),
    "fmt_null_be": (False, {"link": "null", "endian": ">"}),
    "fmt_null_ipv6": (True, {"link": "null"}),
    "fmt_loop108": (False, {"link": "loop"}),
    "fmt_ipv6_eth": (True, {}),
    "fmt_ipv6_vlan": (True, {"link": "vlan"}),
    "fmt_sll2_ipv6": (True, {"link": "sll2"}),
    "fmt_pcapng_2if_us_ns": (False, {"fmt": "pcapng_2if"}),
    "fmt_pcapng_2if_pow2": (False, {"fmt": "pcapng_pow2"}),
    "fmt_pcapng_spb": (False, {"fmt": "pcapng_spb"}),
    "fmt_pcapng_tsoffset": (False, {"fmt": "pcapng_tsoffset"}),
    "fmt_pcapng_unknown_blocks": (False, {"fmt": "pcapng_unknown"}),
    "fmt_pcapng_2sections": (False, {"fmt": "pcapng_2sections"}),
    "fmt_pcapng_be": (False, {"fmt": "pcapng_be"}),
    "fmt_pcapng_mixed_linktypes": (False, {"fmt": "pcapng_mixed_links"}),
}

FORMAT_DESC = {
    "fmt_pcap_us_le_scapy": "pcap, microseconds, little-endian, written by scapy PcapWriter",
    "fmt_pcap_ns_le_scapy": "pcap, nanoseconds (magic a1b23c4d), little-endian, scapy PcapWriter(nano=True)",
    "fmt_pcap_us_be": "pcap, microseconds, big-endian header and records",
    "fmt_pcap_ns_be": "pcap, nanoseconds, big-endian",
    "fmt_vlan": "Ethernet with one 802.1Q tag (0x8100)",
    "fmt_qinq": "Ethernet QinQ: 802.1ad 0x88a8 outer tag + 0x8100 inner tag",
    "fmt_sll": "Linux cooked v1 (linktype 113, protocol at offset 14)",
    "fmt_sll2": "Linux cooked v2 (linktype 276, protocol at offset 0)",
    "fmt_raw101": "raw IP (linktype 101), IPv4",
    "fmt_raw101_ipv6": "raw IP (linktype 101), IPv6",
    "fmt_raw228_ipv4": "raw IPv4 (linktype 228)",
    "fmt_raw229_ipv6": "raw IPv6 (linktype 229)",
    "fmt_null_le": "BSD loopback DLT_NULL (0), little-endian file, AF_INET in host (little-endian) order",
    "fmt_null_be": "BSD loopback DLT_NULL (0), big-endian file, AF_INET in host (big-endian) order",
    "fmt_null_ipv6": "BSD loopback DLT_NULL (0), IPv6 (AF 24)",
    "fmt_loop108": "OpenBSD loopback DLT_LOOP (108): AF in network order inside a little-endian file",
    "fmt_ipv6_eth": "IPv6 over Ethernet",
    "fmt_ipv6_vlan": "IPv6 over 802.1Q",
    "fmt_sll2_ipv6": "IPv6 over Linux cooked v2",
    "fmt_pcapng_2if_us_ns": "pcapng, client->server on interface 0 (if_tsresol 10^-6), server->client on interface 1 (10^-9)",
    "fmt_pcapng_2if_pow2": "pcapng, interface 0 if_tsresol 2^-20 (inexact ticks), interface 1 10^-9",
    "fmt_pcapng_tsoffset": "pcapng, interface 0 with if_tsoffset = 1700000000 s and small microsecond ticks, interface 1 absolute nanoseconds",
    "fmt_pcapng_spb": "pcapng with Simple Packet Blocks (no timestamp) for the server's packets, EPB for the client's",
    "fmt_pcapng_unknown_blocks": "pcapng with a custom block (0xBAD), an unknown local block type, a Name Resolution Block and comments in the middle",
    "fmt_pcapng_2sections": "pcapng with two sections (second SHB big-endian), interfaces redeclared per section",
    "fmt_pcapng_be": "pcapng, one big-endian section, if_tsresol 10^-9",
    "fmt_pcapng_mixed_linktypes": "pcapng, interface 0 Ethernet (client->server), interface 1 Linux SLL2 (server->client)",
}
