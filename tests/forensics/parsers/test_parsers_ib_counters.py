"""perfquery (plain, -x, old names) and sysfs counters; start/end deltas."""
from __future__ import annotations

import pandas as pd

from conftest import FIXTURES
from forensics.parsers.ib_counters import COUNTER_INFO, IbCountersParser, ib_deltas

D = FIXTURES / "parsers" / "ib_counters"


def values(r):
    t = r.tables["ib_counters"]
    return dict(zip(t["counter"], t["value"]))


def test_perfquery_extended_with_traffic_and_wrapped_header():
    r = IbCountersParser.parse(D / "perfquery_x_traffic_wrapped_header.txt")
    assert r.warnings == []
    t = r.tables["ib_counters"]
    assert len(t) == 19 and set(t["source"]) == {"perfquery_ext"} and set(t["width_bits"]) == {64}
    v = values(r)
    assert v["port_rcv_data"] == 2341975277576 and v["port_xmit_packets"] == 1352112415
    assert v["multicast_rcv_packets"] == 6779 and v["excessive_buffer_overrun_errors"] == 0
    assert (t["device"].unique().tolist(), t["port"].unique().tolist()) == (["lid21"], [1])
    assert r.facts["ports"]["lid21/1"] == {"lid": "21", "cap_mask": "0x1600"}


def test_perfquery_basic_widths_and_old_names():
    r = IbCountersParser.parse(D / "perfquery_basic_derived.txt")
    t = r.tables["ib_counters"].set_index("counter")
    assert len(t) == 18 and r.warnings == []
    assert t.loc["port_xmit_data", "value"] == 4294967295 and t.loc["port_xmit_data", "width_bits"] == 32
    assert t.loc["link_downed", "width_bits"] == 8 and t.loc["local_link_integrity_errors", "width_bits"] == 4
    assert "qp1_dropped" in t.index
    old = values(IbCountersParser.parse(D / "perfquery_old_names.txt"))
    assert old["port_xmit_data"] == 905972985 and old["port_rcv_data"] == 2411533950
    assert old["port_xmit_packets"] == 22945597 and old["port_xmit_discards"] == 0 and len(old) == 15
    nohdr = IbCountersParser.parse(D / "perfquery_basic_noheader.txt").tables["ib_counters"]
    assert len(nohdr) == 8 and nohdr["port"].isna().all()


def test_sysfs_listing_counters_hw_counters_and_port_attributes():
    r = IbCountersParser.parse(D / "sysfs_grep_start.txt")
    assert r.warnings == []
    t = r.tables["ib_counters"]
    assert len(t) == 17 + 21 + 24 and set(t["phase"]) == {"start"}      # lifespan is not a counter
    m5 = t[t["device"] == "mlx5_0"].set_index("counter")
    assert m5.loc["port_xmit_data", "value"] == 2880761508848 and m5.loc["port_xmit_data", "width_bits"] == 64
    assert m5.loc["local_ack_timeout_err", "source"] == "hw_counters" and m5.loc["local_ack_timeout_err", "value"] == 131
    m4 = t[t["device"] == "mlx4_0"].set_index("counter")
    assert m4.loc["port_xmit_wait", "value"] == 3599
    assert m4.loc["port_rcv_data", "width_bits"] == 64          # a sibling data counter is past 32 bits
    assert r.facts["ports"]["mlx4_0/1"] == {"link_layer": "InfiniBand", "phys_state": "5: LinkUp",
                                           "rate": "40 Gb/sec (4X QDR)", "state": "4: ACTIVE"}


def test_sysfs_tree_folder_and_deltas():
    r = IbCountersParser.parse(D / "tree_bundle" / "ib")
    assert r.warnings == [] and r.facts["phases"] == ["end", "start"]
    t = r.tables["ib_counters"]
    assert len(t) == 124 and t["line"].isna().all()
    d = ib_deltas(t)
    moved = d[d["problem"]].set_index("counter")
    assert sorted(moved.index) == ["link_downed", "local_ack_timeout_err", "out_of_sequence", "port_xmit_wait",
                                   "symbol_error"]
    assert moved.loc["out_of_sequence", "delta"] == 39 and moved.loc["out_of_sequence", "kind"] == "retransmission"
    assert moved.loc["link_downed", "kind"] == "error" and "link" in moved.loc["link_downed", "action"]
    assert bool(moved.loc["port_xmit_wait", "saturated"])     # sits at 2**32-1
    data = d[(d["device"] == "mlx5_0") & (d["counter"] == "port_xmit_data")].iloc[0]
    assert data["delta"] == 100000 and data["bytes"] == 400000
    # the text listings give the same deltas as the tree
    a = IbCountersParser.parse(D / "sysfs_grep_start.txt").tables["ib_counters"]
    b = IbCountersParser.parse(D / "sysfs_grep_end.txt").tables["ib_counters"]
    d2 = ib_deltas(a, b)
    pd.testing.assert_frame_equal(d.reset_index(drop=True), d2.reset_index(drop=True))


def test_deltas_wrap_reset_and_missing_side():
    start = b"# mlx5_0 port 1\nout_of_sequence: 4294967000\nsymbol_error: 50\nrnr_nak_retry_err: 3\n"
    end = b"# mlx5_0 port 1\nout_of_sequence: 500\nsymbol_error: 2\nnp_cnp_sent: 7\n"
    a = IbCountersParser.parse_bytes(start, "ib/start/counters.txt").tables["ib_counters"]
    b = IbCountersParser.parse_bytes(end, "ib/end/counters.txt").tables["ib_counters"]
    assert a["source"].tolist() == ["hw_counters", "sysfs", "hw_counters"]
    d = ib_deltas(a, b).set_index("counter")
    assert d.loc["out_of_sequence", "delta"] == 796 and bool(d.loc["out_of_sequence", "wrapped"])
    assert d.loc["symbol_error", "delta"] == 2 and bool(d.loc["symbol_error", "reset"])
    assert pd.isna(d.loc["rnr_nak_retry_err", "delta"]) and pd.isna(d.loc["np_cnp_sent", "start"])
    assert d.loc["np_cnp_sent", "kind"] == "congestion"


def test_counter_meanings_cover_the_counters_that_matter():
    for c in ("symbol_error", "port_rcv_errors", "port_xmit_discards", "link_downed",
              "excessive_buffer_overrun_errors", "local_link_integrity_errors", "port_xmit_wait", "out_of_sequence",
              "local_ack_timeout_err", "rnr_nak_retry_err", "np_cnp_sent", "rp_cnp_handled"):
        kind, meaning, action = COUNTER_INFO[c]
        assert kind in ("error", "congestion", "retransmission") and meaning and action


def test_malformed_counter_lines_warn(tmp_path):
    bad = (D / "perfquery_x_allzero.txt").read_text() + "PortRcvErrors:...........lots\nrandom words here\n"
    r = IbCountersParser.parse(bad.encode())
    assert len(r.tables["ib_counters"]) == 22 and len(r.warnings) == 2
    d = tmp_path / "ib" / "start" / "mlx5_0" / "1" / "counters"
    d.mkdir(parents=True)
    (d / "symbol_error").write_text("7\n")
    (d / "link_downed").write_text("N/A (no PMA)\n")
    (d / "port_rcv_errors").write_text("garbage\n")
    r = IbCountersParser.parse(tmp_path / "ib")
    t = r.tables["ib_counters"].set_index("counter")
    assert t.loc["symbol_error", "value"] == 7 and pd.isna(t.loc["link_downed", "value"])
    assert len(r.warnings) == 1 and "port_rcv_errors" in r.warnings[0]
    assert IbCountersParser.parse(b"").warnings == ["<bytes>: empty file"]


def test_pasted_perfquery_command_names_the_hca_and_one_snapshot_counts_since_clear():
    from forensics.parsers.ib_counters import snapshot_values
    r = IbCountersParser.parse(FIXTURES / "parsers" / "ib_counters" / "perfquery_pasted_prompt_errors.txt")
    assert r.warnings == []
    t = r.tables["ib_counters"]
    assert set(t["device"]) == {"mlx5_1"} and set(t["port"]) == {1} and t["phase"].isna().all()
    d = snapshot_values(t).set_index("counter")
    assert d.loc["symbol_error", "delta"] == 1472 and pd.isna(d.loc["symbol_error", "start"])
    assert bool(d.loc["symbol_error", "problem"]) and bool(d.loc["link_downed", "problem"])
    assert not bool(d.loc["port_rcv_remote_physical_errors", "problem"])     # 0: nothing to say
    assert not bool(d.loc["port_xmit_data", "problem"]) and d.loc["port_xmit_data", "bytes"] == 2310784512 * 4
