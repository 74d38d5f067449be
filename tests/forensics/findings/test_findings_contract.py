"""The findings contract completed for every detector (forensics/findings/contract.py):
the ranks' own host names and the capture nodes, and the one-line headline."""
from __future__ import annotations

import pandas as pd

from forensics.findings import Context
from forensics.findings.base import HEADLINE_CHARS, Finding
from forensics.findings.contract import complete, headline_of, shorten, since_text
from forensics.model.rank_hosts import rank_hosts_of
from forensics.model import Model
from forensics.model.schema import conform, empty
from forensics.model.schema import TABLES

T = 1_795_856_490_481_527_866      # 2026-11-28 09:01:30.48 UTC


def model(captures, **tables) -> Model:
    t = {name: empty(name) for name in TABLES}
    for name, rows in tables.items():
        t[name] = conform(pd.DataFrame(rows), name)
    return Model(tables=t, hosts=sorted({c["host"] for c in captures}), captures=captures)


def test_a_process_s_own_host_name_comes_first_then_the_logs_then_the_capture():
    caps = [{"host": "vm", "processes": [{"pid": 10, "rank": 0, "hostname": "pod-a"}, {"pid": 11, "rank": 1},
                                         {"pid": 12, "rank": 2}]}]
    m = model(caps, coll_log_ops=[{"host": "vm", "pid": 10, "rank": 0, "log_host": "from-logs-0", "node": "vm"},
                                  {"host": "vm", "pid": 11, "rank": 1, "log_host": "node1", "node": "vm"}])
    assert rank_hosts_of(m) == {0: ("pod-a", "vm"), 1: ("node1", "vm"), 2: (None, "vm")}


def test_a_log_line_without_a_host_never_names_one():
    m = model([{"host": "vm", "kind": "loose", "processes": []}],
              nccl_warnings=[{"host": "unknown:job.log", "rank": 3, "message": "x"}])
    assert rank_hosts_of(m) == {}


def test_complete_names_hosts_and_nodes_and_fills_the_headline():
    caps = [{"host": "vm", "processes": [{"pid": 10 + r, "rank": r, "hostname": f"node{r}"} for r in range(4)]}]
    m = model(caps)
    ctx = Context(model=m, con=None)
    f = Finding(kind="hang_stuck", severity="error", confidence=0.7, summary="x", ranks=[2], hosts=["vm"],
                peer_ranks=[1, 3], since_ns=T, headline="Hang: {who}'s GPU stopped; {peers} wait on it ({since})")
    g = Finding(kind="transport", severity="info", confidence=0.9, summary="NCCL over sockets. More words.",
                ranks=[0, 1, 2, 3])
    complete(ctx, [f, g])
    assert f.hosts == ["node2"] and f.nodes == ["vm"]
    assert f.headline == "Hang: rank 2 (node2)'s GPU stopped; ranks 1, 3 wait on it (since 09:01:30 UTC)"
    assert g.hosts == ["node0", "node1", "node2", "node3"] and g.headline == "NCCL over sockets."
    two = Finding(kind="hang_stuck", severity="error", confidence=0.65, summary="y", ranks=[2, 3], since_ns=T,
                  headline="Hang: the link between {who} is down ({since})")
    complete(ctx, [two])
    assert two.headline == "Hang: the link between ranks 2 (node2) and 3 (node3) is down (since 09:01:30 UTC)"
    assert two.hosts == ["node2", "node3"]
    # a detector's own hosts that are not the capture's stay (an IB port on a named host)
    h = Finding(kind="ib_errors", severity="error", confidence=0.8, summary="y", ranks=[1], hosts=["switch-7"])
    complete(ctx, [h])
    assert h.hosts == ["switch-7"]


def test_an_undated_finding_of_the_logs_alone_says_so():
    m = model([{"host": "job.log", "kind": "loose", "processes": []}])
    f = Finding(kind="hang_stuck", severity="error", confidence=0.6, summary="z", headline="Hang ({since})")
    complete(Context(model=m, con=None), [f])
    assert f.headline == "Hang (time not in the logs)"
    assert since_text(None) == "since before the capture" and since_text(T) == "since 09:01:30 UTC"
    # the logs alone print the host's local time without its zone: the reading says it is a guess
    assert since_text(T, zone_assumed=True) == "since 09:01:30, zone assumed UTC"


def test_headline_of_a_long_summary_is_its_first_clauses_and_never_dangles():
    s = ("IB completion errors, status 12 (RETRY_EXC_ERR: transport retries exceeded: no acknowledgement from the "
         "peer's HCA; the link or the peer's port dropped), on 2 hosts (a, b): 40 line(s), first on a at 09:00; "
         + "x" * 300)
    h = headline_of(s)
    assert len(h) <= HEADLINE_CHARS and h.count("(") == h.count(")") and not h.endswith((";", ":", ","))
    assert h.startswith("IB completion errors, status 12")
    assert headline_of("Short. Then more.") == "Short."


def test_shorten_cuts_at_a_word_with_an_ellipsis():
    assert shorten("a " * 50) == ("a " * 50).strip()
    long = "word " * 60
    out = shorten(long)
    assert len(out) <= HEADLINE_CHARS and out.endswith("…") and not out[:-1].endswith(" ")


def test_a_sentence_end_inside_a_quoted_line_does_not_end_the_headline():
    """A quoted log line with its own "!" or "." ends no sentence of the summary: the headline
    stops before the quotation rather than leave it (or its parenthesis) open."""
    s = ("PyTorch's watchdog got stuck on ranks 0, 1: a CUDA or NCCL call blocked its own thread (\"[PG 3 Rank 0] "
         "Heartbeat monitor timed out! Process will be terminated after dumping debug info.\"): suspect the GPU.")
    assert headline_of(s) == "PyTorch's watchdog got stuck on ranks 0, 1: a CUDA or NCCL call blocked its own thread"
    assert headline_of('NCCL WARN on n1: "Bad file descriptor. Retrying" then more.') == 'NCCL WARN on n1'
