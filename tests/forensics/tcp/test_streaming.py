"""Bounded-memory streaming gives exactly the result of reading the file at once.

The reader hands the engine small windows of the file and batches of a few
records; conversations, unacked segments and duplicate-ACK counters must carry
across every boundary, and records larger than the window must still be read.
"""
from __future__ import annotations

import pandas as pd
import pytest

from conftest import FIXTURES
from forensics.tcp import analyze_file

CRAFTED = FIXTURES / "pcaps" / "crafted"
CAPTURES = sorted((FIXTURES / "pcaps" / "public").glob("*.pcap*"))[:8] + sorted(
    CRAFTED.glob("fmt_pcapng_*.pcapng")) + [
    # state that must survive batch boundaries: fragments pending reassembly, tunnels
    CRAFTED / "ipv4_fragments.pcap", CRAFTED / "gre_inner_tcp.pcap", CRAFTED / "vxlan_inner_tcp.pcap"]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
@pytest.mark.parametrize("batch", [1, 3])
def test_tiny_windows_and_batches_change_nothing(path, batch):
    whole = analyze_file(path)
    tiny = analyze_file(path, window=512, batch=batch)
    assert len(whole.packets) > 0
    pd.testing.assert_frame_equal(whole.packets, tiny.packets)
    pd.testing.assert_frame_equal(whole.flows, tiny.flows)
    assert whole.stats.verdict_counts == tiny.stats.verdict_counts
    assert whole.stats.frames == tiny.stats.frames


def test_fragments_are_reassembled_into_one_segment():
    res = analyze_file(CRAFTED / "ipv4_fragments.pcap")
    assert res.stats.skipped.reassembled == 1
    assert res.stats.skipped.ip_fragment == 2
    big = res.packets[res.packets.len > 1000]
    assert len(big) == 1          # the segment appears once, at its last fragment's frame


def test_tunnelled_tcp_uses_the_inner_addresses():
    res = analyze_file(CRAFTED / "vxlan_inner_tcp.pcap")
    assert len(res.packets) > 0
    # outer 192.168.1.1 <-> 192.168.1.2 carries inner 10.0.0.1 <-> 10.0.0.2
    seen = set(res.packets.src.astype(str)) | set(res.packets.dst.astype(str))
    assert seen == {"10.0.0.1", "10.0.0.2"}
    assert res.stats.skipped.ip_not_tcp == 0


def test_keep_modes_agree():
    path = FIXTURES / "pcaps" / "public" / "ppa1e_email-troubles.pcap"
    every = analyze_file(path, keep="all").packets
    flagged = analyze_file(path, keep="flagged").packets
    none = analyze_file(path, keep="none")
    verdicts = ["retransmission", "duplicate_ack", "lost_segment", "ack_lost_segment",
                "out_of_order", "window_update", "rst"]
    expect = every[every[verdicts].any(axis=1)].reset_index(drop=True)
    pd.testing.assert_frame_equal(flagged[verdicts + ["frame"]], expect[verdicts + ["frame"]])
    assert none.packets is None
    assert none.stats.verdict_counts["retransmission"] == int(every.retransmission.sum()) == 18
