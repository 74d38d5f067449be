"""Header fields decoded by the vectorised path agree with dpkt's per-packet parser.

dpkt is an independent, object-per-packet decoder: far too slow for the hot
path, but a good second opinion on the numpy decoding of Ethernet/VLAN/IPv4/
IPv6/TCP, including TSO lengths and truncated frames.
"""
from __future__ import annotations

import dpkt
import pytest

from conftest import FIXTURES
from forensics.tcp import analyze_file

CAPTURES = [
    FIXTURES / "pcaps" / "public" / "ppa1e_email-troubles.pcap",
    FIXTURES / "pcaps" / "public" / "http_ip4and6.pcapng",
    FIXTURES / "pcaps" / "crafted" / "fmt_vlan.pcap",
    FIXTURES / "pcaps" / "crafted" / "fmt_qinq.pcap",
    FIXTURES / "pcaps" / "crafted" / "ipv6_ext_headers.pcap",
    FIXTURES / "pcaps" / "crafted" / "tso_supersegments.pcap",
    FIXTURES / "pcaps" / "crafted" / "snaplen_payload_cut.pcap",
    FIXTURES / "lab" / "loss" / "pcap" / "rank2.pcap",
]


def dpkt_tcp_rows(path):
    """(frame, sport, dport, seq, ack, flags, window) of every Ethernet/IP/TCP frame, by dpkt."""
    with open(path, "rb") as fh:
        head = fh.read(4)
        fh.seek(0)
        reader = dpkt.pcapng.Reader(fh) if head == b"\x0a\x0d\x0d\x0a" else dpkt.pcap.Reader(fh)
        rows = {}
        for frame, (_, buf) in enumerate(reader, start=1):
            eth = dpkt.ethernet.Ethernet(buf)      # dpkt strips 802.1Q/QinQ tags itself
            ip = eth.data
            if not isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)):
                continue
            tcp = ip.data
            if not isinstance(tcp, dpkt.tcp.TCP):
                continue
            rows[frame] = (tcp.sport, tcp.dport, tcp.seq, tcp.ack, tcp.flags, tcp.win)
        return rows


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_header_fields_match_dpkt(path):
    ours = analyze_file(path).packets
    theirs = dpkt_tcp_rows(path)
    assert len(theirs) > 0
    mine = {int(r.frame): (int(r.sport), int(r.dport), int(r.seq_raw), int(r.ack_raw),
                           int(r.tcp_flags) & 0xFF, int(r.window)) for r in ours.itertuples()}
    common = sorted(set(mine) & set(theirs))
    # dpkt may refuse frames whose payload the snaplen cut; everything it parses we have too
    assert set(theirs) <= set(mine)
    assert len(common) == len(theirs)
    diffs = [(f, mine[f], theirs[f]) for f in common if mine[f] != theirs[f]]
    assert not diffs, diffs[:5]
