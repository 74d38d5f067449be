"""Resends the peer already had (forensics.model.tcp_ranks.dsacked_connections, mark_dsacked).

A host starved of CPU ACKs late (the kernel ACKs a segment that arrives while the process
holds its socket only once the process lets go), so its peers' retransmission timers fire
for data that had arrived; the receiver answers each duplicate with a D-SACK, which the
sender's socket counts (``ss``: ``dsack_dups``). Real drops are resent without one. The real
snapshots here are the lab's: a CPU-starved rank's peer, and a rank behind a lossy port."""
from __future__ import annotations

import pandas as pd

from conftest import FIXTURES
from forensics.model.schema import conform
from forensics.model.tcp_ranks import DSACK_SHARE, dsacked_connections, mark_dsacked
from forensics.parsers.ss import SsParser
from forensics.tcp.classes import classify

SS = FIXTURES / "parsers" / "ss"


def sockets(name: str, phase: str = "end") -> pd.DataFrame:
    s = SsParser.parse(SS / name).tables["sockets"]
    return s.assign(phase=phase)


def test_a_starved_peers_connections_are_spurious_a_lossy_links_are_not():
    starved = dsacked_connections(sockets("ss_tinp_cpu_starved_late_acks.txt"))
    resent = starved[starved["resent"] > 0]
    assert sorted(resent["resent"].tolist()) == [4, 5] and resent["spurious"].all()
    assert set(resent["daddr"]) == {"10.203.0.12"}                  # both to the starved rank
    assert not starved.loc[starved["resent"] == 0, "spurious"].any()  # nothing resent: nothing to call
    lossy = dsacked_connections(sockets("ss_tinp_lossy_link_drops.txt"))
    resent = lossy[lossy["resent"] > 0]
    assert len(resent) >= 3 and not resent["spurious"].any()
    assert (resent["dsacks"] < 0.1 * resent["resent"]).all()        # tail-loss probes that found the data


def frame(rows: list[dict]) -> pd.DataFrame:
    base = {"host": "node0", "netns": "host", "state": "ESTAB", "local_addr": "10.0.0.1", "peer_addr": "10.0.0.2",
            "peer_port": 5000}
    return conform(pd.DataFrame([base | r for r in rows]), "sockets")


def test_only_what_grew_while_the_capture_watched_counts():
    s = frame([
        # resent 40 before the capture (an outage then), 4 more during it, all D-SACKed: spurious now
        {"phase": "start", "local_port": 1, "retrans_total": 40, "dsack_dups": 0},
        {"phase": "series", "local_port": 1, "retrans_total": 42, "dsack_dups": 2},
        {"phase": "end", "local_port": 1, "retrans_total": 44, "dsack_dups": 4},
        # opened during the capture: from zero; half D-SACKed is the threshold
        {"phase": "end", "local_port": 2, "retrans_total": 10, "dsack_dups": int(10 * DSACK_SHARE)},
        {"phase": "end", "local_port": 3, "retrans_total": 10, "dsack_dups": int(10 * DSACK_SHARE) - 1},
        # D-SACKs before the capture do not excuse drops during it
        {"phase": "start", "local_port": 4, "retrans_total": 5, "dsack_dups": 5},
        {"phase": "end", "local_port": 4, "retrans_total": 25, "dsack_dups": 6},
    ])
    c = dsacked_connections(s).set_index("sport")
    assert c.loc[1, ["resent", "dsacks"]].tolist() == [4, 4] and c.loc[1, "spurious"]
    assert c.loc[2, "spurious"] and not c.loc[3, "spurious"] and not c.loc[4, "spurious"]


def test_resends_are_marked_by_their_senders_socket_whatever_their_source():
    s = frame([{"phase": "end", "local_port": 1, "retrans_total": 6, "dsack_dups": 6},
               {"phase": "end", "local_port": 2, "retrans_total": 60, "dsack_dups": 1}])
    ev = lambda event, sport, source="bpf": {"timestamp_ns": 1, "event": event, "source": source,  # noqa: E731
                                            "saddr": "10.0.0.1", "sport": sport, "daddr": "10.0.0.2",
                                            "dport": 5000}
    tcp = conform(pd.DataFrame([ev("tcp_retransmit_skb", 1), ev("retransmission", 1, "pcap"),
                                ev("fast_retransmission", 2, "pcap"), ev("tcp_retransmit_skb", 9),
                                ev("duplicate_ack", 1, "pcap"), ev("tcp_send_reset", 1)]), "tcp_events")
    out = mark_dsacked(tcp, s)
    assert out["dsacked"].tolist() == [True, True, False, pd.NA, pd.NA, pd.NA]   # 9: ss never saw it
    assert classify(out).tolist() == ["spurious", "spurious", "retransmission", "retransmission",
                                      "duplicate_ack", "reset"]
    assert mark_dsacked(tcp, None)["dsacked"].isna().all()                      # no ss: nothing said
    # the reverse direction's socket says nothing of these resends (the receiver resent nothing)
    rev = frame([{"phase": "end", "local_addr": "10.0.0.2", "local_port": 5000, "peer_addr": "10.0.0.1",
                  "peer_port": 1, "retrans_total": 0, "dsack_dups": 0}])
    assert mark_dsacked(tcp, rev)["dsacked"].isna().all()
