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

CAPTURES = sorted((FIXTURES / "pcaps" / "public").glob("*.pcap*"))[:8] + sorted(
    (FIXTURES / "pcaps" / "crafted").glob("fmt_pcapng_*.pcapng"))


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_tiny_windows_and_batches_change_nothing(path):
    whole = analyze_file(path)
    tiny = analyze_file(path, window=512, batch=3)
    assert len(whole.packets) > 0
    pd.testing.assert_frame_equal(whole.packets, tiny.packets)
    pd.testing.assert_frame_equal(whole.flows, tiny.flows)
    assert whole.stats.verdict_counts == tiny.stats.verdict_counts
    assert whole.stats.frames == tiny.stats.frames


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
