"""One list of TCP event classes (forensics/tcp/classes.py) for the findings and the report:
lost data counts (retransmissions, lost segments), spurious retransmissions (tail-loss
probes, early RTOs on a busy host) do not, duplicate ACKs alone are not loss."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from forensics.findings.trouble import trouble_events
from forensics.report import data
from forensics.tcp.classes import DATA_LOSS_CLASSES, EVENT_CLASS, classify, events_of, subsumed_sql
from captured_job import T0, context


def tcp(event: str, t: int, rank: int = 0, peer: int = 1, source: str = "pcap", frame: int | None = None) -> dict:
    return {"timestamp_ns": t, "event": event, "source": source, "rank": rank, "peer_rank": peer,
            "saddr": "10.9.0.10", "sport": 40000, "daddr": "10.9.0.11", "dport": 50000, "host": "node0",
            "capture": "pcap/eth0.pcap", "frame": frame}


def test_the_report_and_the_findings_count_the_same_events():
    ctx = context(tcp_events=[tcp("spurious_retransmission", T0), tcp("spurious_retransmission", T0 + 5),
                              tcp("lost_segment", T0 + 1), tcp("retransmission", T0 + 2),
                              tcp("duplicate_ack", T0 + 3)])
    ev = trouble_events(ctx)
    lost = ev[ev["cls"].isin(DATA_LOSS_CLASSES)]
    assert sorted(lost["event"]) == ["lost_segment", "retransmission"]            # no spurious one
    table = data.rank_table(SimpleNamespace(model=ctx.model))
    assert int(table.loc[0, "retx_pcap"]) == len(lost) == 2                        # the report: the same two
    assert int(table.loc[0, "dup_acks"]) == 1
    # every event the report marks is in the shared table, under the class's label
    assert set(data.MARKER_CLASSES) == set(EVENT_CLASS)
    assert data.MARKER_CLASSES["spurious_retransmission"] != data.MARKER_CLASSES["retransmission"]
    assert set(data.RETRANSMIT_EVENTS) == set(events_of(*DATA_LOSS_CLASSES))


def test_one_packet_has_one_class():
    # tshark (and the engine) flag a spurious or fast retransmission as a retransmission too:
    # the packet counts once, in its most specific class, in pandas and in SQL alike
    ctx = context(tcp_events=[tcp("retransmission", T0, frame=7), tcp("spurious_retransmission", T0, frame=7),
                              tcp("retransmission", T0 + 1, frame=9), tcp("fast_retransmission", T0 + 1, frame=9),
                              tcp("retransmission", T0 + 2, frame=11),
                              tcp("retransmission", T0 + 3, frame=7, source="bpf") | {"capture": None},
                              tcp("duplicate_ack", T0 + 4, frame=12)])
    t = ctx.table("tcp_events")
    assert classify(t).tolist() == [None, "spurious", None, "retransmission", "retransmission", "retransmission",
                                    "duplicate_ack"]
    kept = ctx.con.execute(f"SELECT count(*) FROM tcp_events t WHERE NOT {subsumed_sql('t')}").fetchone()[0]
    assert kept == 5
    ev = trouble_events(ctx)
    assert sorted(ev.loc[ev["cls"].isin(DATA_LOSS_CLASSES), "event"]) == [
        "fast_retransmission", "retransmission", "retransmission"]
    table = data.rank_table(SimpleNamespace(model=ctx.model))
    assert int(table.loc[0, "retx_pcap"]) == 2 and int(table.loc[0, "retx_kernel"]) == 1
    assert data.marker_labels(t).tolist()[:2] == [None, "spurious retransmission"]


def test_the_kernel_tracers_events_count_as_their_own_source():
    # the tracer's retransmissions have no capture file: their source is "bpf:<host>:<NA>" in
    # pandas as in the findings' SQL, so a link that only the kernel saw still gets its count
    from forensics.findings.trouble import dedup_counts, dedup_sql, trouble_sql
    ctx = context(tcp_events=[tcp("tcp_retransmit_skb", T0 + i, source="bpf") | {"capture": None}
                              for i in range(3)] + [tcp("retransmission", T0 + 10, frame=4)])
    ev = trouble_events(ctx)
    assert sorted(set(ev["src"])) == ["bpf:node0:<NA>", "pcap:node0:pcap/eth0.pcap"]
    counts = dedup_counts(ev[ev["cls"].isin(DATA_LOSS_CLASSES)])
    assert counts["n"].tolist() == [3]                     # the best-placed source: the kernel's 3
    sql = ctx.con.execute(f"SELECT n FROM {dedup_sql(trouble_sql())} WHERE cls = 'retransmission'").fetchall()
    assert [r[0] for r in sql] == [3]


def test_a_rank_seen_only_in_tcp_events_gets_a_row_of_its_own():
    # rank 1 made no NCCL call the tracer saw (not traced, or its host not captured), but its
    # packets are there: its row has the TCP columns and no call statistics
    nccl = [{"timestamp_ns": T0 + i, "host": "node0", "pid": 100, "tid": 100, "rank": 0, "nranks": 2,
             "op": "ALL_REDUCE", "comm_id_hash": "c1", "op_count": i, "duration_ns": 1_000_000 * (i + 1),
             "completed": i < 2, "duration_source": "call"} for i in range(3)]
    ctx = context(nccl_events=nccl, tcp_events=[tcp("retransmission", T0, rank=1, peer=0)])
    table = data.rank_table(SimpleNamespace(model=ctx.model)).set_index("rank")
    assert table.loc[0, "calls"] == 3 and table.loc[0, "not_completed"] == 1
    assert table.loc[0, "p50_ms"] == 2.0 and table.loc[0, "pid"] == "100" and table.loc[0, "host"] == "node0"
    assert pd.isna(table.loc[1, "calls"]) and pd.isna(table.loc[1, "not_completed"])
    assert int(table.loc[1, "retx_pcap"]) == 1


def test_trouble_events_say_what_their_sql_says_flips_and_unknowns_included():
    """The evidence's text columns are made once per distinct connection, not per event: the
    same text as the SQL, a received reset's endpoints flipped to its sender's view, unknown
    ports and captures "<NA>", and a packet with neither host nor capture still one packet."""
    from forensics.findings.trouble import trouble_sql
    rows = [tcp("retransmission", T0, frame=3), tcp("tcp_receive_reset", T0 + 1, rank=1, peer=0, source="bpf")
            | {"capture": None, "saddr": "10.9.0.11", "sport": 50000, "daddr": "10.9.0.10", "dport": 40000},
            tcp("tcp_send_reset", T0 + 2, source="bpf") | {"capture": None, "sport": None},
            tcp("retransmission", T0 + 3, frame=8) | {"host": None, "capture": None},
            tcp("fast_retransmission", T0 + 3, frame=8) | {"host": None, "capture": None}]
    ctx = context(tcp_events=rows)
    ev = trouble_events(ctx)
    sql = ctx.con.execute(f"SELECT * FROM {trouble_sql()} ORDER BY timestamp_ns").df()
    assert len(ev) == len(sql) == 4                            # the retransmission of frame 8 counts once
    assert ev["key"].tolist() == (sql["from"] + ">" + sql["to"]).tolist()
    assert ev["key"].tolist()[:3] == ["10.9.0.10:40000>10.9.0.11:50000"] * 2 + ["10.9.0.10:<NA>>10.9.0.11:50000"]
    assert ev["src"].tolist() == sql["src"].tolist() == ["pcap:node0:pcap/eth0.pcap", "bpf:node0:<NA>",
                                                         "bpf:node0:<NA>", "pcap:<NA>:<NA>"]
    assert ev[["sender", "receiver"]].values.tolist() == sql[["sender_rank", "receiver_rank"]].values.tolist()
    assert ev["sport"].tolist() == sql["sport"].tolist()


def test_a_resend_its_peer_dsacked_is_spurious_in_pandas_and_sql():
    """A resend on a connection whose resends the peer D-SACKed (``dsacked``, from the
    sender's socket counters) had arrived: spurious, not lost data, whatever its source called
    it; the same resend without that mark (False, or NULL: ss did not see the socket) stays a
    retransmission. Other events keep their class."""
    from forensics.findings.trouble import trouble_sql
    rows = [tcp("tcp_retransmit_skb", T0, source="bpf") | {"capture": None, "dsacked": True},
            tcp("retransmission", T0 + 1, frame=3) | {"dsacked": True},
            tcp("tcp_retransmit_skb", T0 + 2, source="bpf") | {"capture": None, "dsacked": False},
            tcp("retransmission", T0 + 3, frame=4),
            tcp("duplicate_ack", T0 + 4, frame=5) | {"dsacked": True}]
    ctx = context(tcp_events=rows)
    assert classify(ctx.table("tcp_events")).tolist() == ["spurious", "spurious", "retransmission",
                                                          "retransmission", "duplicate_ack"]
    ev = trouble_events(ctx)
    sql = ctx.con.execute(f"SELECT event, cls FROM {trouble_sql()} ORDER BY timestamp_ns").fetchall()
    assert [tuple(x) for x in ev[["event", "cls"]].values.tolist()] == sql == [
        ("tcp_retransmit_skb", "retransmission"), ("retransmission", "retransmission"),
        ("duplicate_ack", "duplicate_ack")]
    spurious = ctx.con.execute(f"SELECT count(*) FROM {trouble_sql(('spurious',))}").fetchone()[0]
    assert spurious == len(trouble_events(ctx, ("spurious",))) == 2
