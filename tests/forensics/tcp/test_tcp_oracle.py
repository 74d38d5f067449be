"""The TCP analysis engine against tshark 4.0.x, packet by packet, on every fixture capture.

- test_engine_matches_tshark: forensics.tcp.analyze_file(path).packets vs the oracle, 100%
  agreement on every compared column (tests/oracle.py: COMPARED_COLUMNS, stream via a
  bijection), except the entries of EXCEPTIONS (agreed, documented cases where tshark is
  provably wrong; empty so far).
- test_crafted_capture_exercises_verdict: each crafted capture still makes tshark show what
  the capture was written for (tests/fixtures/pcaps/crafted/MANIFEST.json), so the fixtures
  stay meaningful; does not need the engine.
- self-tests of the harness: compare() must find planted mismatches.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

import oracle
from conftest import FIXTURES, TESTS

sys.path.insert(0, str(TESTS / "craft"))   # capture builders (fuzzing)

PCAPS = FIXTURES / "pcaps"
CRAFTED = PCAPS / "crafted"


def _captures(sub: str) -> list[Path]:
    d = PCAPS / sub
    return sorted(p for p in d.glob("*") if p.suffix in (".pcap", ".pcapng"))


ALL_CAPTURES = _captures("crafted") + _captures("synthetic") + _captures("public")
MANIFEST = json.loads((CRAFTED / "MANIFEST.json").read_text())

# (file name, frame, column) -> reason.  Only for cases where tshark is provably wrong AND
# the engine owner agreed to diverge; every entry must say why.  None so far.
EXCEPTIONS: dict[tuple[str, int, str], str] = {}


def _require_tshark() -> oracle.TsharkInfo:
    try:
        return oracle.tshark_info()
    except oracle.OracleUnavailable as e:
        pytest.skip(f"TCP oracle unavailable: {e}")


_ORACLE_CACHE: dict[Path, object] = {}


def oracle_df(path: Path, all_rows: bool = False):
    """tshark's rows for `path`: the engine's scope, or every ``-Y tcp`` row."""
    if path not in _ORACLE_CACHE:
        _ORACLE_CACHE[path] = oracle.oracle_packets(path, all_rows=True)
    df = _ORACLE_CACHE[path]
    return df.drop(columns="quoted_in_icmp") if all_rows else oracle.engine_scope(df)


def engine_packets(path: Path):
    """forensics.tcp.analyze_file(path).packets, imported lazily (the engine may be absent)."""
    try:
        from forensics.tcp import analyze_file
    except ImportError as e:  # the engine is a hard requirement of this test: fail, don't skip
        pytest.fail(f"cannot import forensics.tcp.analyze_file: {e!r}")
    return analyze_file(str(path)).packets


def _id(p: Path) -> str:
    return f"{p.parent.name}/{p.name}"


@pytest.mark.parametrize("path", ALL_CAPTURES, ids=_id)
def test_engine_matches_tshark(path: Path, record_property):
    info = _require_tshark()
    record_property("tshark_version", info.version_line)
    expected = oracle_df(path)
    ours = engine_packets(path)
    allowed = {(f, c) for (n, f, c) in EXCEPTIONS if n == path.name}
    mm = [m for m in oracle.compare(ours, expected) if (m.frame, m.column) not in allowed]
    assert not mm, oracle.format_mismatches(mm, label=_id(path))


@pytest.mark.parametrize("name", sorted(MANIFEST), ids=lambda n: f"crafted/{n}")
def test_crafted_capture_exercises_verdict(name: str):
    _require_tshark()
    df = oracle_df(CRAFTED / name, all_rows=True).set_index("frame")
    wrong = []
    for frame, column, value in MANIFEST[name]["expect"]:
        if frame not in df.index:
            wrong.append(f"frame {frame}: not a TCP frame for tshark (wanted {column}={value})")
        elif int(df.loc[frame, column]) != value:
            wrong.append(f"frame {frame}: {column}={int(df.loc[frame, column])}, scenario wants {value}")
    assert not wrong, f"{name} ({MANIFEST[name]['desc']}) no longer exercises what it should:\n  " + "\n  ".join(wrong)


def test_manifest_matches_files_and_covers_every_verdict():
    files = {p.name for p in _captures("crafted")}
    assert files == set(MANIFEST), f"MANIFEST.json out of date: only files {sorted(files - set(MANIFEST))}, only manifest {sorted(set(MANIFEST) - files)}"
    positive = {c for e in MANIFEST.values() for (_, c, v) in e["expect"] if v}
    missing = [v for v in oracle.VERDICTS + ["rst", "duplicate_ack_num", "duplicate_ack_frame", "acks_frame", "rto_frame"]
               if v not in positive]
    assert not missing, f"no crafted capture exercises {missing}"
    for name, e in MANIFEST.items():
        assert e["expect"], f"{name} exercises nothing"


def test_every_crafted_verdict_is_seen_by_tshark():
    """Across all crafted captures tshark raises every verdict at least once."""
    _require_tshark()
    import pandas as pd
    allv = pd.concat([oracle_df(CRAFTED / n) for n in MANIFEST])
    absent = [v for v in oracle.VERDICTS + ["rst"] if allv[v].sum() == 0]
    assert not absent, f"tshark never flags {absent} in the crafted captures"
    assert (allv["duplicate_ack_num"] > 3).any() and (allv["acks_frame"] > 0).any()


# -- the harness must be able to fail ------------------------------------------------------

def test_compare_detects_planted_mismatches():
    _require_tshark()
    base = oracle_df(CRAFTED / "fast_retransmission.pcap")
    assert oracle.compare(base.copy(), base) == []

    # stream renumbering is fine as long as it is a bijection
    ren = base.copy()
    ren["stream"] = ren["stream"] + 7
    assert oracle.compare(ren, base) == []

    bad = base.copy()
    i = bad.index[bad["frame"] == 13][0]
    bad.loc[i, "fast_retransmission"] = 0
    bad.loc[i, "duplicate_ack_num"] = 9
    mm = oracle.compare(bad, base)
    assert {(m.frame, m.column) for m in mm} == {(13, "fast_retransmission"), (13, "duplicate_ack_num")}
    assert "fast_retransmission" in oracle.format_mismatches(mm, label="x")
    with pytest.raises(AssertionError, match="frame 13: fast_retransmission: ours=0 tshark=1"):
        oracle.assert_agrees(bad, base, label="planted")

    missing = base[base["frame"] != 5]
    assert [(m.frame, m.column) for m in oracle.compare(missing, base)] == [(5, "<frame present>")]
    extra = base.copy()
    extra.loc[len(extra)] = extra.iloc[0]
    extra.loc[len(extra) - 1, "frame"] = 999
    assert [(m.frame, m.column) for m in oracle.compare(extra, base)] == [(999, "<frame present>")]

    nocol = base.drop(columns=["window_full"])
    assert ("window_full", "<column missing>") in {(m.column, m.ours) for m in oracle.compare(nocol, base)}

    two = oracle_df(CRAFTED / "syn_retx_port_reuse.pcap")
    merged = two.copy()
    merged["stream"] = 0          # one stream where tshark has two: not a bijection
    assert any(m.column == "stream" for m in oracle.compare(merged, two))
    split = two.copy()
    split.loc[split["frame"] == 3, "stream"] = 5   # one tshark stream split in two
    assert any(m.column == "stream" for m in oracle.compare(split, two))

    t = base.copy()
    t.loc[t.index[0], "time_epoch_ns"] += 1
    assert [(m.frame, m.column) for m in oracle.compare(t, base)] == [(1, "time_epoch_ns")]


def test_oracle_parses_times_and_addresses_exactly():
    _require_tshark()
    assert oracle.seconds_to_ns("1700000000.000000001") == 1_700_000_000_000_000_001
    assert oracle.seconds_to_ns("0.5") == 500_000_000
    assert oracle.seconds_to_ns("-1.25") == -1_250_000_000
    v6 = oracle_df(CRAFTED / "fmt_ipv6_eth.pcap")
    assert set(v6["src"]) == {"2001:db8::1", "2001:db8::2"}
    v4 = oracle_df(CRAFTED / "fmt_pcap_ns_be.pcap")
    assert set(v4["src"]) == {"10.0.0.1", "10.0.0.2"}
    assert v4["time_epoch_ns"].iloc[0] == 1_700_000_000 * 10**9
    # tunnels and ICMP errors: the addresses of the IP header carrying the TCP header
    vx = oracle_df(CRAFTED / "vxlan_inner_tcp.pcap")
    assert set(vx["src"]) == {"10.0.0.1", "10.0.0.2"}, "inner (TCP) addresses expected"
    assert oracle._carrying_ip("eth:ethertype:ip:udp:vxlan:eth:ethertype:ip:tcp", "192.168.1.1,10.0.0.1", "") == "10.0.0.1"
    assert oracle._carrying_ip("eth:ethertype:ip:udp:vxlan:eth:ethertype:ip:tcp", "192.168.1.1,10.0.0.1", "", "first") == "192.168.1.1"
    assert oracle._carrying_ip("eth:ethertype:ip:ipv6:tcp", "192.168.1.1", "2001:db8::1") == "2001:db8::1"
    assert oracle._carrying_ip("eth:ethertype:ipv6:ipv6.hopopts:ip:tcp", "10.0.0.1", "2001:db8::1") == "10.0.0.1"
    icmp = oracle_df(CRAFTED / "icmp_quoted_tcp.pcap", all_rows=True).set_index("frame")
    assert (icmp.loc[6, "src"], icmp.loc[6, "dst"], icmp.loc[6, "dport"]) == ("10.0.0.1", "10.9.9.9", 443)
    # non-TCP frames are not rows, but frame numbers keep counting them
    mixed = oracle_df(CRAFTED / "non_tcp_mixed.pcap")
    assert 1 not in set(mixed["frame"]) and mixed["frame"].iloc[0] == 3


def test_oracle_version_is_pinned():
    info = _require_tshark()
    assert info.version.startswith("4.0."), info.version_line


# -- differential fuzzing: random dialogues, engine vs tshark -------------------------------

FUZZ_EXAMPLES = int(os.environ.get("STALLSCOPE_FUZZ_EXAMPLES", "60"))
FUZZ_DIR = Path(tempfile.gettempdir()) / "stallscope-fuzz"


def _fuzz_one(d: dict) -> None:
    import random_flows
    from writers import write_pcap
    from forensics.tcp import analyze_file
    pkts = random_flows.build(d)
    FUZZ_DIR.mkdir(exist_ok=True)
    import hashlib
    path = FUZZ_DIR / f"dialogue-{hashlib.sha1(repr(d).encode()).hexdigest()[:16]}.pcap"
    write_pcap(path, pkts, nano=True, snaplen=d["snaplen"])
    expected = oracle.oracle_packets(path, use_cache=False)
    ours = analyze_file(str(path)).packets
    mm = oracle.compare(ours, expected)
    if not mm:
        path.unlink()
    assert not mm, oracle.format_mismatches(mm, label=f"random dialogue kept in {path}")


def test_random_dialogues_match_tshark():
    """Random (hypothesis) TCP dialogues aimed at the rule corners; the engine must agree
    with tshark on every frame.  Deterministic by default (derandomize); set
    STALLSCOPE_FUZZ_RANDOM=1 for fresh examples and STALLSCOPE_FUZZ_EXAMPLES=N for more.
    A failing capture is kept under $TMPDIR/stallscope-fuzz/."""
    _require_tshark()
    try:
        import forensics.tcp  # noqa: F401
    except ImportError as e:
        pytest.fail(f"cannot import forensics.tcp.analyze_file: {e!r}")
    from hypothesis import HealthCheck, given, settings
    import random_flows

    run = settings(max_examples=FUZZ_EXAMPLES, deadline=None, print_blob=True,
                   derandomize=os.environ.get("STALLSCOPE_FUZZ_RANDOM") != "1",
                   suppress_health_check=list(HealthCheck))(given(d=random_flows.dialogues())(_fuzz_one))
    run()


def _fuzz_interleaved(d: dict) -> None:
    import hashlib
    import random_flows
    from writers import write_pcap
    from forensics.tcp import analyze_file
    pkts = random_flows.build_interleaved(d)
    FUZZ_DIR.mkdir(exist_ok=True)
    path = FUZZ_DIR / f"interleaved-{hashlib.sha1(repr(d).encode()).hexdigest()[:16]}.pcap"
    write_pcap(path, pkts, link=d["link"], nano=d["nano"])
    expected = oracle.oracle_packets(path, use_cache=False)
    mm = oracle.compare(analyze_file(str(path)).packets, expected)
    if not mm:
        path.unlink()
    assert not mm, oracle.format_mismatches(mm, label=f"interleaved dialogues kept in {path}")


def test_random_interleaved_connections_match_tshark():
    """Two random dialogues interleaved in one capture, random link type, us/ns pcap."""
    _require_tshark()
    try:
        import forensics.tcp  # noqa: F401
    except ImportError as e:
        pytest.fail(f"cannot import forensics.tcp.analyze_file: {e!r}")
    from hypothesis import HealthCheck, given, settings
    import random_flows

    run = settings(max_examples=max(FUZZ_EXAMPLES // 2, 1), deadline=None, print_blob=True,
                   derandomize=os.environ.get("STALLSCOPE_FUZZ_RANDOM") != "1",
                   suppress_health_check=list(HealthCheck))(given(d=random_flows.interleavings())(_fuzz_interleaved))
    run()


def test_rows_outside_the_engine_scope_are_counted_not_lost():
    """What engine_scope() leaves out of the comparison is counted by the engine."""
    _require_tshark()
    from forensics.tcp import analyze_file
    cut = oracle_df(CRAFTED / "tcp_header_cut.pcap", all_rows=True)
    res = analyze_file(CRAFTED / "tcp_header_cut.pcap")
    assert len(cut) > 0 and (cut["stream"] == -1).all()
    assert len(res.packets) == 0
    assert res.stats.skipped.truncated == len(cut)
    icmp = oracle_df(CRAFTED / "icmp_quoted_tcp.pcap", all_rows=True)
    res = analyze_file(CRAFTED / "icmp_quoted_tcp.pcap")
    in_scope = set(oracle_df(CRAFTED / "icmp_quoted_tcp.pcap")["frame"])
    assert set(res.packets["frame"]) == in_scope
    assert set(icmp["frame"]) - in_scope == {5, 6}
    assert res.stats.skipped.ip_not_tcp >= 2          # the ICMP errors themselves
