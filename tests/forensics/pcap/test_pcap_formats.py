"""The engine gives the same answer whatever the container format or link layer.

tests/fixtures/pcaps/crafted/fmt_*.pcap[ng] carry one and the same flow (scenarios.base_flow)
as pcap us/ns in both byte orders, pcapng with several interfaces / resolutions / sections /
odd blocks, and over Ethernet, 802.1Q, QinQ, SLL, SLL2, raw IP (101/228/229), DLT_NULL and
DLT_LOOP, in IPv4 and IPv6.  The engine's per-packet columns must be identical across all of
them (frames aligned by packet order, since pcapng custom blocks shift frame numbers), and
the truncated variants of one flow must keep the header fields of the complete capture.
These tests need only the engine, not tshark.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

import oracle
from conftest import FIXTURES

CRAFTED = FIXTURES / "pcaps" / "crafted"
MANIFEST = json.loads((CRAFTED / "MANIFEST.json").read_text())
V4 = sorted(n for n, e in MANIFEST.items() if e["group"] == "base_flow")
V6 = sorted(n for n, e in MANIFEST.items() if e["group"] == "base_flow_v6")
REF_V4 = "fmt_pcap_us_le_scapy.pcap"
REF_V6 = "fmt_ipv6_eth.pcap"

FRAME_VALUED = ["duplicate_ack_frame", "acks_frame"]
FLOW_COLUMNS = (["sport", "dport", "seq_raw", "ack_raw", "seq_rel", "ack_rel", "len", "rst"]
                + oracle.VERDICTS + ["duplicate_ack_num"] + FRAME_VALUED)
# files whose timestamps legitimately differ from the reference: 2^-20 s ticks are inexact,
# Simple Packet Blocks carry no timestamp at all (so time-dependent verdicts differ too)
INEXACT_TIME = {"fmt_pcapng_2if_pow2.pcapng", "fmt_pcapng_spb.pcapng"}
NO_TIME = {"fmt_pcapng_spb.pcapng"}


def _packets(name: str) -> pd.DataFrame:
    try:
        from forensics.tcp import analyze_file
    except ImportError as e:
        pytest.fail(f"cannot import forensics.tcp.analyze_file: {e!r}")
    return analyze_file(str(CRAFTED / name)).packets


def _by_position(df: pd.DataFrame) -> pd.DataFrame:
    """Renumber frames 1..n in file order (frame-valued columns too; 0 stays 0)."""
    df = df.sort_values("frame").reset_index(drop=True)
    pos = {int(f): i + 1 for i, f in enumerate(df["frame"])}
    out = df.copy()
    out["frame"] = range(1, len(df) + 1)
    for c in FRAME_VALUED:
        out[c] = [pos.get(int(v), -int(v)) if int(v) else 0 for v in df[c]]
    return out


def _diff(ref: pd.DataFrame, other: pd.DataFrame, cols: list[str]) -> list[str]:
    if len(ref) != len(other):
        return [f"{len(other)} TCP rows, reference has {len(ref)}"]
    out = []
    for c in cols:
        if c not in other.columns:
            out.append(f"column {c} missing")
            continue
        a, b = ref[c].tolist(), other[c].tolist()
        out += [f"packet {i + 1}: {c}: {y!r} (reference {x!r})" for i, (x, y) in enumerate(zip(a, b))
                if oracle._norm(x) != oracle._norm(y)]
    return out


@pytest.mark.parametrize("name", V4 + V6, ids=lambda n: n)
def test_same_flow_same_answer_in_every_format(name):
    ref = _by_position(_packets(REF_V6 if name in V6 else REF_V4))
    got = _by_position(_packets(name))
    cols = list(FLOW_COLUMNS)
    if name in NO_TIME:
        cols = ["sport", "dport", "seq_raw", "ack_raw", "seq_rel", "ack_rel", "len"]
    cols += ["src", "dst"]
    if name not in INEXACT_TIME:
        cols.append("time_epoch_ns")
    problems = _diff(ref, got, cols)
    # stream: one stream in this flow, in every encapsulation
    if got["stream"].nunique() != 1:
        problems.append(f"{got['stream'].nunique()} streams for one connection")
    assert not problems, f"{name} differs from {REF_V6 if name in V6 else REF_V4}:\n  " + "\n  ".join(problems[:40])


def test_ipv4_and_ipv6_flows_get_the_same_verdicts():
    v4 = _by_position(_packets(REF_V4))
    v6 = _by_position(_packets(REF_V6))
    cols = [c for c in FLOW_COLUMNS] + ["time_epoch_ns"]
    problems = _diff(v4, v6, cols)
    assert not problems, "IPv6 copy of the base flow differs:\n  " + "\n  ".join(problems[:40])
    assert v4["retransmission"].sum() > 0 and v4["duplicate_ack"].sum() > 0, "base flow lost its verdicts"


def test_inexact_timestamps_are_close():
    """2^-20 s ticks: within one tick (954 ns) below the exact time; SPB rows have time 0
    for the server side (no timestamp), exact for the client's EPBs."""
    ref = _by_position(_packets(REF_V4))
    pow2 = _by_position(_packets("fmt_pcapng_2if_pow2.pcapng"))
    d = (ref["time_epoch_ns"] - pow2["time_epoch_ns"]).to_numpy()
    assert ((d >= 0) & (d < 954)).all(), d
    spb = _by_position(_packets("fmt_pcapng_spb.pcapng"))
    client = spb["src"] == "10.0.0.1"
    assert (spb.loc[client, "time_epoch_ns"].to_numpy() == ref.loc[client, "time_epoch_ns"].to_numpy()).all()
    assert (spb.loc[~client, "time_epoch_ns"] == 0).all()


@pytest.mark.parametrize("name", ["snaplen_payload_cut.pcap", "snaplen_options_cut.pcap",
                                  "snaplen_mixed_cut.pcap"], ids=lambda n: n)
def test_truncated_packets_keep_header_fields(name):
    full = _packets("snaplen_none.pcap").sort_values("frame").reset_index(drop=True)
    cut = _packets(name).sort_values("frame").reset_index(drop=True)
    cols = ["frame", "src", "dst", "sport", "dport", "seq_raw", "ack_raw", "seq_rel", "ack_rel", "len",
            "time_epoch_ns", "rst", "stream"]
    problems = _diff(full, cut, cols)
    assert not problems, f"{name}: header fields differ from the complete capture:\n  " + "\n  ".join(problems[:40])
    assert cut["len"].max() == 200, "tcp.len must come from the IP length, not the captured bytes"
    if name == "snaplen_payload_cut.pcap":
        # options intact: exactly the verdicts of the complete capture
        problems = _diff(full, cut, oracle.VERDICTS + ["duplicate_ack_num"] + FRAME_VALUED)
        assert not problems, "\n  ".join(problems)


def test_tso_lengths_come_from_ip_not_captured_bytes():
    """The super-segments were written with 64000 / 30000 (IPv4 total length 0) / 8000
    payload bytes and cut to 128 captured bytes."""
    df = _packets("tso_supersegments.pcap").set_index("frame")
    assert [int(df.loc[f, "len"]) for f in (4, 5, 6)] == [64000, 30000, 8000]
