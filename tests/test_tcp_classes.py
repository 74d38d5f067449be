"""One list of TCP event classes (forensics/tcp/classes.py) for the findings and the report:
lost data counts (retransmissions, lost segments), spurious retransmissions (tail-loss
probes, early RTOs on a busy host) do not, duplicate ACKs alone are not loss."""
from __future__ import annotations

from types import SimpleNamespace

from forensics.findings.evidence import trouble_events
from forensics.report import data
from forensics.tcp.classes import DATA_LOSS_CLASSES, EVENT_CLASS, events_of
from test_findings_state import T0, context


def tcp(event: str, t: int, rank: int = 0, peer: int = 1, source: str = "pcap") -> dict:
    return {"timestamp_ns": t, "event": event, "source": source, "rank": rank, "peer_rank": peer,
            "saddr": "10.9.0.10", "sport": 40000, "daddr": "10.9.0.11", "dport": 50000, "host": "node0"}


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
