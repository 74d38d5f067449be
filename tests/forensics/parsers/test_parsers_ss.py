"""ss -tinp snapshots: real loopback output of this machine's ss, and crafted IPv6/retransmit lines."""
from __future__ import annotations

import pandas as pd

from conftest import FIXTURES
from forensics.parsers.ss import SsParser, parse_info, split_addr

D = FIXTURES / "parsers" / "ss"


def test_real_loopback_snapshot():
    r = SsParser.parse(D / "ss_tinp_loopback.txt")
    assert r.warnings == []
    s = r.tables["sockets"]
    assert len(s) == 4 and r.facts["pids"] == [13313]
    a = s.iloc[0]
    assert (a["state"], a["recv_q"], a["local_addr"], a["local_port"], a["peer_addr"], a["peer_port"]) == \
        ("ESTAB", 50000, "127.0.0.1", 33245, "127.0.0.1", 38762)
    assert (a["process"], a["pid"], a["fd"], a["cong"]) == ("python", 13313, 5, "bbr")
    assert (a["rto_ms"], a["rtt_ms"], a["rttvar_ms"], a["mss"], a["cwnd"], a["bytes_received"]) == \
        (200.0, 0.027, 0.013, 32768, 10, 100000)
    assert bool(a["app_limited"]) and a["send_bps"] > 1e9
    v6 = s[s["local_addr"] == "::1"]
    assert len(v6) == 2 and set(v6["peer_addr"]) == {"::1"}
    sender = s[s["bytes_sent"] == 100000].iloc[0]
    assert sender["bytes_acked"] == 100001 and pd.isna(sender["retrans_total"])


def test_headerless_and_all_states_variants():
    h = SsParser.parse(D / "ss_tinpH_loopback.txt")
    assert h.warnings == [] and len(h.tables["sockets"]) == 4
    a = SsParser.parse(D / "ss_tainp_listen.txt").tables["sockets"]
    listen = a[a["state"] == "LISTEN"].iloc[0]
    assert listen["peer_addr"] == "0.0.0.0" and pd.isna(listen["peer_port"]) and listen["cwnd"] == 10


def test_crafted_retransmits_ipv6_scopes_and_shared_sockets():
    r = SsParser.parse(D / "ss_tainp_crafted_ipv6_retrans.txt")
    assert r.warnings == []
    s = r.tables["sockets"]
    lossy = s.iloc[0]
    assert lossy["netid"] == "tcp" and lossy["send_q"] == 4194304
    assert (lossy["retrans_cur"], lossy["retrans_total"], lossy["lost"], lossy["unacked"]) == (1, 13792, 14, 14)
    assert (lossy["bytes_retrans"], lossy["backoff"], lossy["sacked"], lossy["dsack_dups"]) == (123456789, 3, 3, 2)
    assert lossy["users"] == "python3/4242/57,pt_main_thread/4243/57" and lossy["pid"] == 4242
    assert lossy["send_bps"] == 175700.0 and lossy["delivery_rate_bps"] == 1.2e9
    assert (lossy["busy_ms"], lossy["rwnd_limited_ms"], lossy["sndbuf_limited_ms"]) == (600120, 12, 1500)
    ll = s.iloc[1]
    assert (ll["local_addr"], ll["local_port"], ll["peer_addr"]) == ("fe80::5054:ff:fe12:3456", 29500,
                                                                     "fe80::5054:ff:fe65:4321")
    assert s.iloc[2]["state"] == "SYN-SENT" and s.iloc[2]["retrans_total"] == 3
    old = s.iloc[3]
    assert (old["local_addr"], old["local_port"], old["peer_port"]) == ("::ffff:10.0.0.3", 22, 50000)
    assert pd.isna(old["pid"])


def test_address_and_info_helpers():
    assert split_addr("[::ffff:10.1.2.3]:443") == ("::ffff:10.1.2.3", 443)
    assert split_addr("10.0.0.1%eth0:22") == ("10.0.0.1", 22)
    assert split_addr("*:*") == ("*", None)
    assert split_addr("nonsense") is None
    info = parse_info("reno rto:1000 rtt:250/125 retrans:0/7 send 10Mbps pacing_rate 1.5Gbps lost:2")
    assert info == {"cong": "reno", "rto_ms": 1000.0, "rtt_ms": 250.0, "rttvar_ms": 125.0, "retrans_cur": 0,
                    "retrans_total": 7, "send_bps": 1e7, "pacing_rate_bps": 1.5e9, "lost": 2}


def test_malformed_lines_warn():
    good = (D / "ss_tinp_loopback.txt").read_text().splitlines()
    bad = ["ESTAB 0 0 127.0.0.1", "ESTAB x y 1.2.3.4:5 6.7.8.9:10", "\t cubic cwnd:10",
           "ESTAB 0 0 1.2.3.4:5 6.7.8.9:10", "\t cubic rtt:abc/1 cwnd:10"]
    r = SsParser.parse("\n".join(good[:3] + bad + good[3:]).encode())
    s = r.tables["sockets"]
    assert len(s) == 5 and s.iloc[1]["cwnd"] == 10 and pd.isna(s.iloc[1]["rtt_ms"])
    assert len(r.warnings) == 4        # two bad socket lines, the orphan info line, rtt:abc
    assert "unreadable ss field 'rtt:abc/1'" in r.warnings[3]
    assert SsParser.parse(b"\t rtt:1/1\n").warnings[0] == "<bytes>: no sockets found"


def test_capture_series_blocks_carry_their_sample_time_and_inode():
    """A capture series (real ss -tinpeH samples, each after its stallscope-sample line): one
    row per socket per sample, sample_ns from the block's header, inode from ss -e's ino:."""
    r = SsParser.parse(D / "ss_series_loopback.txt")
    assert r.warnings == []
    assert r.facts["phase"] == "series" and r.facts["samples"] == 3 and r.facts["pids"] == [25799]
    s = r.tables["sockets"]
    assert len(s) == 6 and str(s["sample_ns"].dtype) == "Int64" and str(s["inode"].dtype) == "Int64"
    assert list(s["sample_ns"].drop_duplicates()) == [1795512918957028999, 1795512919362785841,
                                                      1795512919768023268]
    assert set(s["inode"]) == {439289, 439290}
    sender = s[s["inode"] == 439289]
    receiver = s[s["inode"] == 439290]
    assert list(sender["fd"]) == [4, 4, 4] and list(receiver["fd"]) == [5, 5, 5]
    assert list(sender["bytes_acked"]) == [20001, 60001, 120001]       # the connection moved between samples
    assert list(receiver["recv_q"]) == [5000, 30000, 75000] and list(receiver["bytes_received"]) == [20000, 60000,
                                                                                                     120000]
    assert sender.iloc[-1]["busy_ms"] == 44 and sender.iloc[-1]["cong"] == "bbr"


def test_plain_snapshots_have_no_sample_time_and_e_tokens_are_read_or_ignored():
    """Start/end snapshots keep sample_ns NA (the file name says the phase); ino: is read in
    any file, uid:, sk: and cgroup: are ignored without a warning; a series of an idle
    namespace (headers only) is no error."""
    r = SsParser.parse(D / "ss_tinp_loopback.txt")
    assert r.tables["sockets"]["sample_ns"].isna().all() and r.tables["sockets"]["inode"].isna().all()
    blocks = (D / "ss_series_loopback.txt").read_text().split("# stallscope-sample")
    one = blocks[1].split("\n", 1)[1].replace("ino:439289 sk:3b5", "uid:1000 ino:439289 sk:3b5 v6only:0")
    snap = SsParser.parse_bytes(one.encode(), "sys/netns-7/ss-tinp-end.txt")
    assert snap.warnings == [] and snap.facts["phase"] == "end"
    s = snap.tables["sockets"]
    assert list(s["inode"]) == [439289, 439290] and s["sample_ns"].isna().all()
    assert (s.iloc[0]["pid"], s.iloc[0]["users"]) == (25799, "python3/25799/4")
    idle = SsParser.parse_bytes(b"# stallscope-sample realtime_ns=5 monotonic_ns=1\n"
                                b"# stallscope-sample realtime_ns=6 monotonic_ns=2\n", "sys/host/ss-series.txt")
    assert idle.warnings == [] and idle.facts["phase"] == "series" and idle.tables["sockets"].empty


def test_series_rows_reach_the_model_sockets_table_with_phase_series(tmp_path):
    """An unpacked bundle with a start snapshot and a series: the model's sockets table keeps
    both, phase start for the snapshot (sample_ns NULL), series (sample_ns set) for the blocks."""
    import json

    from forensics.inputs.bundle import open_bundle
    from forensics.execution.host_reading import read_model
    root = tmp_path / "stallscope-h-20260101T000000Z"
    (root / "sys" / "host").mkdir(parents=True)
    (root / "sys" / "host" / "ss-series.txt").write_bytes((D / "ss_series_loopback.txt").read_bytes())
    (root / "sys" / "host" / "ss-tinp-start.txt").write_bytes((D / "ss_tinpH_loopback.txt").read_bytes())
    (root / "manifest.json").write_text(json.dumps({
        "schema_version": 1, "host": "h", "started_ns": 1795512918000000000, "ended_ns": 1795512920000000000,
        "clock_samples": [{"monotonic_ns": 19110398903399, "realtime_ns": 1795512918000000000}],
        "collectors": {"ss-series@host": {"status": "ok", "files": ["sys/host/ss-series.txt"],
                                          "covered_ns": [1795512918957028999, 1795512919768023268]}},
        "processes": [], "files": []}))
    df = read_model([root]).tables["sockets"]
    b = open_bundle(root)
    series = df[df["phase"] == "series"]
    assert len(series) == 6 and series["sample_ns"].notna().all() and set(series["inode"]) == {439289, 439290}
    start = df[df["phase"] == "start"]
    assert len(start) == 4 and start["sample_ns"].isna().all()
    assert set(df["netns"]) == {"host"}
    assert b.manifest.collectors["ss-series@host"].covered_ns == (1795512918957028999, 1795512919768023268)
