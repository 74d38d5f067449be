"""Issue 44's detector changes on synthetic tables (tests/traced_job.py's 4-rank job): the
link flap (RTO backoff on one rank's link, then recovery), the direction of one-way loss,
the process that vanished mid-collective, and the optional ``layer`` of a finding. Every
negative case has a positive twin."""
from __future__ import annotations

import pandas as pd
import pytest

from forensics.findings.base import Finding
from forensics.findings.link_flap import backoff_chains, link_flap
from forensics.findings.loss_direction import loss_direction
from forensics.findings.network import network_loss
from forensics.findings.process_exit import process_exit
from forensics.findings.straggler import straggler
from forensics.model.schema import conform
from test_findings_synthetic import loss_in_slow_windows
from traced_job import MS, RANKS, T0, context, job, tcp, window

DOWN_AT = 20          # the link goes down during op 20 (T0 + 2 s)


def backoff(sender: int, receiver: int, t0: int, gaps_ms=(200, 400, 800, 1600), sport_off: int = 0) -> list[dict]:
    """One connection's resends in RTO backoff from t0: a resend, then one after each gap."""
    rows, t = [], t0
    for g in (0,) + tuple(gaps_ms):
        t += g * MS
        row = tcp(t, sender, receiver)
        row["sport"] += sport_off
        rows.append(row)
    return rows


def flap_job(recovered: bool):
    """Ops every 100 ms; op 20 takes 3.1 s (the link was down); later ops complete when it came back."""
    stall = 3100.0
    ops = 45 if recovered else 21
    return job(n_ops=ops, dur_ms=lambda k: stall if k == DOWN_AT else 5.0,
               completed=lambda k, r: recovered or k < DOWN_AT)


def flap_tcp(rank: int = 2) -> list[dict]:
    t0 = T0 + DOWN_AT * 100 * MS + 10 * MS
    rows = []
    for peer in ((rank - 1) % RANKS, (rank + 1) % RANKS):     # its ring neighbours, both ways
        rows += backoff(rank, peer, t0) + backoff(peer, rank, t0 + 3 * MS)
    return rows


def _shift_after(rows, after_op: int, by_ms: float):
    """Ops after ``after_op`` start later (the job resumed once the link came back)."""
    out = []
    for r in rows:
        r = dict(r)
        if r["op_count"] > after_op:
            r["timestamp_ns"] += int(by_ms * MS)
            if r["end_ns"] is not None:
                r["end_ns"] += int(by_ms * MS)
        out.append(r)
    return out


def test_backoff_chain_needs_doubling_gaps():
    rows = pd.DataFrame(backoff(1, 2, T0))
    ch = backoff_chains(rows)
    assert len(ch) == 1 and ch.iloc[0]["n"] == 5 and ch.iloc[0]["gaps_ns"] == [200 * MS, 400 * MS, 800 * MS, 1600 * MS]
    # the same number of resends, but gaps that do not double: random loss, not a dead link
    assert backoff_chains(pd.DataFrame(backoff(1, 2, T0, gaps_ms=(400, 3000, 300, 1200)))).empty
    # three resends are not enough (two losses in a row happen on a lossy link) ...
    assert backoff_chains(pd.DataFrame(backoff(1, 2, T0, gaps_ms=(200, 400)))).empty
    # ... unless seen from deep in the backoff (a capture started 2 s into the outage)
    assert len(backoff_chains(pd.DataFrame(backoff(1, 2, T0, gaps_ms=(1600, 3200))))) == 1


def test_link_that_came_back_is_a_flap_on_the_rank_all_chains_share():
    ctx = context(_shift_after(flap_job(True), DOWN_AT, 3100), flap_tcp(rank=2))
    f = link_flap(ctx)
    assert len(f) == 1, f
    f = f[0]
    assert f.kind == "link_flap" and f.ranks == [2] and f.peer_ranks == [1, 3] and f.severity == "error"
    assert f.layer == "transport" and len(f.chain) == 3 and "came back" in f.chain[-1]
    assert 2.9e9 <= f.details["down_ns"] <= 3.2e9 and f.details["back_ns"] > f.since_ns
    assert {(lk["rank"], lk["peer_rank"]) for lk in f.links} == {(2, 1), (2, 3)}
    assert len(ctx.con.execute(f.sql).fetchall()) == len(flap_tcp(rank=2))


def test_link_still_down_at_the_end_is_no_flap():
    # the same backoff, but nothing completes after it: a hang (the hang detectors' finding)
    assert link_flap(context(flap_job(False), flap_tcp(rank=2))) == []


def test_backoff_like_resends_while_collectives_complete_are_no_flap():
    # the same resend times, but every op completes on time meanwhile: data crossed the link,
    # the doubling gaps were chance (random loss on a lightly used connection; CI's per-host loss run)
    steady = job(n_ops=80, dur_ms=lambda k: 5.0)
    assert link_flap(context(steady, flap_tcp(rank=2))) == []
    # the positive twin: the ops wait out the resends
    assert link_flap(context(_shift_after(flap_job(True), DOWN_AT, 3100), flap_tcp(rank=2)))


def test_two_captures_resends_are_never_one_chain():
    # one connection's resends as seen by two hosts' pcaps: each capture's own gaps do not
    # double (600 ms, then 2.4 s); interleaved they would (200, 400, 800, 1600 ms)
    rows = backoff(1, 2, T0)
    for i, r in enumerate(rows):
        r.update(event="retransmission", source="pcap", host=f"node{1 + i % 2}")
    assert backoff_chains(pd.DataFrame(rows)).empty
    assert len(backoff_chains(pd.DataFrame([dict(r, host="node1") for r in rows]))) == 1


def test_resends_of_different_segments_are_never_one_chain():
    # a dead link's timer resends the segment at the head of the queue, every time; resends of
    # other segments at doubling gaps are random loss (the packets' seq_raw tells them apart)
    rows = [dict(r, event="retransmission", source="pcap", host="node1", seq_raw=1000 + 1448 * i)
            for i, r in enumerate(backoff(1, 2, T0))]
    assert backoff_chains(pd.DataFrame(rows)).empty
    assert len(backoff_chains(pd.DataFrame([dict(r, seq_raw=1000) for r in rows]))) == 1


def two_ends_flap(on_wire: dict[int, bool]):
    """Rank 1 and rank 2 each other's only peer on the stalled connections (two of them, both
    ways: a two-rank job's link), both sides' tracer saw its kernel resend; ``on_wire``: the
    ranks whose own tcpdump (watching throughout) saw its resends leave."""
    t0 = T0 + DOWN_AT * 100 * MS + 10 * MS
    rows = []
    for off in (0, 7):
        rows += backoff(1, 2, t0, sport_off=off) + backoff(2, 1, t0 + 3 * MS, sport_off=off)
    pcap = [dict(r, event="retransmission", source="pcap", frame=i) for i, r in enumerate(rows)
            if on_wire.get(r["rank"])]
    windows = [window(r, 0, 60, kind="tcpdump") for r in (1, 2)]
    return context(_shift_after(flap_job(True), DOWN_AT, 3100), rows + pcap, windows=windows)


def test_a_flap_between_two_ranks_blames_the_end_whose_resends_never_left():
    # seed-46 accuracy case 13 (two ranks, rank 1's switch port down 9.3 s): the stalled
    # connections all join the two ranks, so both are on every chain; rank 0 was named for
    # being the lower. Rank 1's kernel resent 22 times and its own tcpdump saw none leave (a
    # host drops what it sends while its link has no carrier, before the capture point);
    # rank 0's saw all of its own leave: rank 1's link went down
    f = link_flap(two_ends_flap({1: True, 2: False}))[0]
    assert f.ranks == [2] and f.peer_ranks == [1] and f.links == [{"rank": 2, "peer_rank": 1}]
    assert f.details["own_resends"] == {"1": {"kernel": 10, "on_wire": 10}, "2": {"kernel": 10, "on_wire": 0}}
    assert "rank 2 (node2" in f.headline and "no carrier" in f.chain[-1]
    f = link_flap(two_ends_flap({1: False, 2: True}))[0]
    assert f.ranks == [1] and f.peer_ranks == [2]
    # nothing tells the ends apart (both sides' resends left, or no capture saw either): the
    # link between them, both ends named, never the lower one for being lower
    for seen in ({1: True, 2: True}, {}):
        f = link_flap(two_ends_flap(seen))[0]
        assert f.ranks == [1, 2] and f.peer_ranks == [] and f.links == [{"rank": 1, "peer_rank": 2}]
        assert "the link between rank 1 (node1" in f.headline and "nothing tells" in f.chain[-1]


def test_one_connection_in_backoff_is_no_flap():
    t0 = T0 + DOWN_AT * 100 * MS
    assert link_flap(context(_shift_after(flap_job(True), DOWN_AT, 3100), backoff(2, 3, t0))) == []


# ---- a flap over before the capture began: the sockets' resend counters, the Flight Recorder

CAP0 = T0 + 4000 * MS      # the captures began 4 s in; the job's ops run 100 ms apart until 4.5 s


def _socket(r: int, peer: int, k: int, resends: int | None, phase: str = "start", dsacks: int | None = None) -> dict:
    """One end's ss row of rank r's k-th connection to ``peer`` (r < peer dials): ``resends``
    None is ss saying nothing of retransmissions (none); ``dsacks`` the D-SACKs it got back."""
    lo, hi = min(r, peer), max(r, peer)
    port = {lo: 41000 + 10 * hi + k, hi: 51000 + 10 * lo}
    return {"host": f"node{r}", "phase": phase, "pid": 100 + r, "rank": r, "peer_rank": peer, "state": "ESTAB",
            "local_addr": f"10.0.0.{r + 1}", "local_port": port[r], "peer_addr": f"10.0.0.{peer + 1}",
            "peer_port": port[peer], "rtt_ms": 0.2, "retrans_total": resends, "dsack_dups": dsacks}


def _sockets(hot: dict[tuple[int, int], int], phase: str = "start", dsacked: bool = False) -> list[dict]:
    """Every pair of the 4 ranks with two connections; each connection's resends on its lower
    rank's row (``hot``: pair -> resends, else none; ``dsacked``: each of them D-SACKed by the
    peer), its other end's row saying none."""
    rows = []
    for a in range(RANKS):
        for b in range(a + 1, RANKS):
            for k in range(2):
                n = hot.get((a, b))
                rows += [_socket(a, b, k, n, dsacks=n if dsacked else None), _socket(b, a, k, None)]
    return [dict(r, phase=phase) for r in rows]


def _fr(stalled_ms: float | None, late: int | None = None) -> list[dict]:
    """Flight Recorder entries of each rank for ops 0-39; op 20 took ``stalled_ms`` on every rank
    (``late``: but that rank enqueued it when the others' had taken that long)."""
    return [{"host": f"node{r}", "rank": r, "pid": 100 + r, "pg_id": "0", "collective_seq_id": k,
             "profiling_name": "nccl:all_reduce", "state": "completed",
             "time_created_ns": T0 + k * 100 * MS + r * MS + (int(stalled_ms * MS) if r == late and k == DOWN_AT else 0),
             "duration_ms": stalled_ms if stalled_ms and k == DOWN_AT and r != late else 5.0}
            for k in range(40) for r in range(RANKS)]


def before_context(start: dict, end: dict | None = None, fr_stall_ms: float | None = None, recovered: bool = True,
                   fr_late: int | None = None, dsacked: bool = False):
    from forensics.findings import Context
    from forensics.model import Model
    from forensics.model.schema import TABLES, empty
    nccl = job(n_ops=45 if recovered else 38, completed=lambda k, r: recovered or k < 30)
    tables = {name: empty(name) for name in TABLES}
    socks = _sockets(start, dsacked=dsacked) + (_sockets(end, "end", dsacked) if end is not None else [])
    for name, rows in (("nccl_events", nccl), ("sockets", socks), ("fr_entries", _fr(fr_stall_ms, fr_late))):
        tables[name] = conform(pd.DataFrame(rows), name)
    m = Model(tables=tables, hosts=[f"node{r}" for r in range(RANKS)],
              captures=[{"host": f"node{r}", "started_ns": CAP0, "ended_ns": T0 + 5000 * MS} for r in range(RANKS)])
    return Context(model=m, con=m.connect())


def test_resends_before_the_capture_on_every_connection_of_one_rank_name_its_link():
    # seed-53 accuracy, link-flap captured after the link came back: no resend in the capture;
    # at its start ss counted 2-6 resends on each of rank 2's connections and none elsewhere
    f = link_flap(before_context({(1, 2): 5, (2, 3): 6, (0, 2): 2}))
    assert len(f) == 1, f
    f = f[0]
    assert (f.kind, f.severity, f.ranks, f.peer_ranks, f.layer) == ("link_flap", "warning", [2], [0, 1, 3], "transport")
    assert all(type(r) is int for r in f.ranks + f.peer_ranks)       # plain ints, as every finding's
    assert {(lk["rank"], lk["peer_rank"]) for lk in f.links} == {(2, 0), (2, 1), (2, 3)}
    assert f.details["rule"] == "retransmitted_before_capture" and f.details["resends_before"] == 26
    assert f.since_ns is None and "when is unknown" in f.confidence_note
    assert "had already resent data" in f.chain[0] and "the link had come back" in f.chain[-1]
    # its SQL: the first snapshot's 24 rows (6 pairs, 2 connections each, both ends), busiest first
    rows = before_context({(1, 2): 5, (2, 3): 6, (0, 2): 2}).con.execute(f.sql).fetchall()
    assert len(rows) == 24 and rows[0][-1] == 6
    # the Flight Recorder reaches back: op 20 took 3.1 s on every rank, enqueued together
    f = link_flap(before_context({(1, 2): 5, (2, 3): 6}, fr_stall_ms=3100))[0]
    assert f.since_ns == T0 + DOWN_AT * 100 * MS and f.details["stalled_collective"]["stalled_ns"] == 3100 * MS
    assert "took 3.10 s" in f.chain[1] and "within 3.0 ms" in f.chain[1] and f.confidence > 0.6
    # its twin: rank 0 enqueued op 20 3.1 s late (its host held the others): not the link's stall
    f = link_flap(before_context({(1, 2): 5, (2, 3): 6}, fr_stall_ms=3100, fr_late=0))[0]
    assert f.details["stalled_collective"] is None and f.since_ns is None


def test_resends_before_the_capture_that_point_nowhere_or_go_on_are_no_flap():
    # stray resends of a busy machine: one per pair here and there, or two pairs with no rank in common
    assert link_flap(before_context({(0, 1): 1, (2, 3): 1, (1, 2): 1})) == []
    assert link_flap(before_context({(0, 1): 3, (2, 3): 3})) == []
    # rank 2's pairs, but another pair resent as much: no one link
    assert link_flap(before_context({(1, 2): 5, (2, 3): 6, (0, 1): 3})) == []
    # one pair alone in a four-rank job: not every connection of a link
    assert link_flap(before_context({(1, 2): 5})) == []
    # the resends go on while the capture runs, more than before it: loss now (network_loss's case)
    assert link_flap(before_context({(1, 2): 5, (2, 3): 6}, end={(1, 2): 30, (2, 3): 40})) == []
    # fewer during than before: the tail of the episode, still the flap
    assert link_flap(before_context({(1, 2): 5, (2, 3): 6}, end={(1, 2): 6, (2, 3): 8}))
    # nothing completed while the capture ran: the link is still down (the hang detectors' case)
    assert link_flap(before_context({(1, 2): 5, (2, 3): 6}, recovered=False)) == []
    # CI, a clean job's partly overlapping captures: the resends its peers D-SACKed had arrived
    # (a busy host's late ACKs), no link lost that data
    assert link_flap(before_context({(1, 2): 5, (2, 3): 6}, dsacked=True)) == []


def slow_job():
    return job(dur_ms=lambda k: 400.0 if k >= 20 else 5.0)


def test_loss_of_what_a_rank_sends_is_egress_and_of_what_it_receives_ingress():
    # rank 2's transmit side drops: it resends to both neighbours, nobody resends to it
    f = network_loss(context(slow_job(), loss_in_slow_windows([(2, 1), (2, 3)])))[0]
    assert f.ranks == [2] and f.details["direction"] == "egress" and "one way" in f.summary
    assert f.layer == "transport" and "transmit" in f.chain[1]
    assert all(lk["direction"] == "egress" and lk["lossy_end"] == 2 for lk in f.links)
    # its receive side drops: the neighbours resend to it
    f = network_loss(context(slow_job(), loss_in_slow_windows([(1, 2), (3, 2)])))[0]
    assert f.ranks == [2] and f.details["direction"] == "ingress" and "receive side" in f.summary
    # both ways: no direction, no layer (the finding is what it was before issue 44)
    f = network_loss(context(slow_job(), loss_in_slow_windows([(1, 2), (3, 2), (2, 1), (2, 3)])))[0]
    assert f.ranks == [2] and "direction" not in f.details and f.layer is None and "one way" not in f.summary
    assert "layer" not in f.to_json() and "chain" not in f.to_json()


def test_loss_direction_needs_one_blamed_rank():
    counts = pd.DataFrame({"sender": [1, 1], "receiver": [2, 3], "n": [10, 10]})
    assert loss_direction(counts, [1]).direction == "egress"
    assert loss_direction(counts, [1, 2]).direction is None
    assert loss_direction(counts.assign(sender=[2, 2], receiver=[1, 1]), [1]).direction == "ingress"
    assert loss_direction(pd.DataFrame({"sender": [1, 2], "receiver": [2, 1], "n": [5, 5]}), [1]).direction == "both"


def gone_context(killed: int, peers_warned: bool, in_flight: bool = True):
    """Ranks' ops every 100 ms; rank ``killed`` stops at op 30 (entered, never completed when
    ``in_flight``); every process had ended when the capture ended."""
    rows = job(n_ops=31, completed=lambda k, r: k < 30 or (not in_flight and r == killed),
               entered=lambda k, r: k < 30 or r == killed or in_flight)
    ctx = context(rows)
    caps = []
    for r in range(RANKS):
        caps.append({"host": f"node{r}", "processes": [{"pid": 100 + r, "rank": r}],
                     "collectors": [{"name": f"threads@pid{100 + r}:start", "status": "ok", "reason": None},
                                    {"name": f"threads@pid{100 + r}:end", "status": "skipped",
                                     "reason": "process exited"}]})
    ctx.model.captures = caps
    if peers_warned:
        w = pd.DataFrame([{"host": f"node{r}", "pid": 100 + r, "rank": r, "message":
                           f"socketProgress: Connection closed by remote peer 10.9.0.{10 + killed}<1234>"}
                          for r in range(RANKS) if r != killed])
        ctx.model.tables["nccl_warnings"] = conform(w, "nccl_warnings")
    return ctx


def test_a_process_gone_mid_collective_without_an_error_of_its_own_was_killed():
    f = process_exit(gone_context(killed=1, peers_warned=True))
    assert len(f) == 1 and f[0].ranks == [1] and f[0].details["rule"] == "vanished"
    assert f[0].peer_ranks == [0, 2, 3] and f[0].op_count == 30 and f[0].layer == "peer"
    assert "killed from outside" in f[0].headline and len(f[0].chain) == 4


def test_processes_that_all_logged_errors_or_ended_between_collectives_are_not_vanished():
    # every rank warned: none ended without an error of its own
    ctx = gone_context(killed=1, peers_warned=True)
    w = ctx.model.tables["nccl_warnings"]
    ctx.model.tables["nccl_warnings"] = pd.concat([w, w.head(1).assign(rank=1, host="node1", pid=101)])
    assert process_exit(ctx) == []
    # the job ended between collectives (all completed): a normal end
    assert process_exit(gone_context(killed=1, peers_warned=False, in_flight=False)) == []


def between_context(killed: int = 1, closed_by: str = "warning"):
    """Rank ``killed`` completed op 29 and never entered op 30, which its peers entered and
    never completed (it was SIGKILLed between collectives); every process had ended when the
    capture ended. Its peers failed: ``closed_by`` "warning": their NCCL warnings say it closed
    their connections; "kernel": they logged timeouts, and its kernel answered them with resets
    from its sockets in TIME_WAIT after its last call; "established": the same resets from
    open sockets (the reset of a live rank); "none": only the timeouts."""
    ctx = gone_context(killed, peers_warned=False, in_flight=False)
    rows = job(n_ops=31, completed=lambda k, r: k < 30, entered=lambda k, r: k < 30 or r != killed)
    ctx.model.tables["nccl_events"] = conform(pd.DataFrame(rows), "nccl_events")
    peers = [r for r in range(RANKS) if r != killed]
    if closed_by == "warning":
        msg = f"socketProgress: Connection closed by remote peer 10.9.0.{10 + killed}<1234>"
        w = [{"host": f"node{r}", "pid": 100 + r, "rank": r, "message": msg, "class": "socket_closed",
              "peer_addr": f"10.9.0.{10 + killed}", "peer_rank": killed} for r in peers]
    else:
        w = [{"host": f"node{r}", "pid": 100 + r, "rank": r, "class": "socket_timeout",
              "message": "socketProgress: Connection timed out"} for r in peers]
    ctx.model.tables["nccl_warnings"] = conform(pd.DataFrame(w), "nccl_warnings")
    if closed_by in ("kernel", "established"):
        state = "TIME_WAIT" if closed_by == "kernel" else "ESTABLISHED"
        t = T0 + 30 * 100 * MS + 20 * MS
        ctx.model.tables["tcp_events"] = conform(pd.DataFrame(
            [dict(tcp(t, killed, p, event="tcp_send_reset"), state=state) for p in peers]), "tcp_events")
    return ctx


@pytest.mark.parametrize("closed_by", ["warning", "kernel"])
def test_a_process_gone_between_collectives_its_peers_wait_in_and_closed_from_its_side_was_killed(closed_by):
    f = process_exit(between_context(killed=1, closed_by=closed_by))
    assert len(f) == 1 and f[0].ranks == [1] and f[0].details["rule"] == "vanished", f
    assert f[0].op_count == 30 and f[0].details["in_flight_op"] is None and f[0].details["waited_op"] == 30
    assert f[0].peer_ranks == [0, 2, 3] and f[0].layer == "peer" and len(f[0].chain) == 4
    assert "ended between collectives, killed from outside" in f[0].headline
    said = "logged that it closed their connections" if closed_by == "warning" else "reset(s) from its closed sockets"
    assert said in f[0].chain[0] and "never entered it" in f[0].chain[1]


@pytest.mark.parametrize("closed_by", ["none", "established"])
def test_a_rank_behind_whose_connections_were_not_closed_from_its_side_is_not_vanished(closed_by):
    # a rank stuck in host code before its next collective, then torn down with its peers:
    # its peers wait for it and time out, but it kept its connections open
    assert process_exit(between_context(killed=1, closed_by=closed_by)) == []


def with_timeouts(ctx, at_ns):
    """The peers' watchdog timeout lines on op 30, logged at ``at_ns`` (None: no time)."""
    rows = [{"host": f"node{r}", "pid": 100 + r, "rank": r, "kind": "timeout", "seq_num": 30, "time_ns": at_ns}
            for r in (0, 2, 3)]
    ctx.model.tables["watchdog_events"] = conform(pd.DataFrame(rows), "watchdog_events")
    return ctx


def test_a_close_after_the_peers_timed_out_is_the_teardown_of_a_hang_not_a_kill():
    reset_at = T0 + 30 * 100 * MS + 20 * MS
    # the peers waited the collective out, then the ranks were torn down: no kill
    assert process_exit(with_timeouts(between_context(closed_by="kernel"), reset_at - 1)) == []
    # a close whose time the warnings do not give: the timeouts may have come first
    assert process_exit(with_timeouts(between_context(closed_by="warning"), reset_at + 600 * 1000 * MS)) == []
    # it closed first, the peers timed out later: killed
    f = process_exit(with_timeouts(between_context(closed_by="kernel"), reset_at + 600 * 1000 * MS))
    assert len(f) == 1 and f[0].ranks == [1] and f[0].details["waited_op"] == 30


def test_layer_is_checked_and_left_out_of_json_when_unset():
    with pytest.raises(ValueError):
        Finding(kind="x", severity="error", confidence=1, summary="s", layer="gpu")
    plain = Finding(kind="x", severity="error", confidence=1, summary="s").to_json()
    assert "layer" not in plain and "chain" not in plain
    j = Finding(kind="x", severity="error", confidence=1, summary="s", layer="host", chain=["a", "b"]).to_json()
    assert j["layer"] == "host" and j["chain"] == ["a", "b"]


def test_straggler_answers_the_host_question():
    late = lambda k, r: 150.0 if (k >= 30 and r == 0) else 0.1 * r   # noqa: E731
    f = straggler(context(job(late=late)))[0]
    assert f.layer == "host" and "enqueued late" in f.chain[0] and "not the transport" in f.chain[1]
