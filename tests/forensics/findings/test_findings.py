"""Findings on the shipped lab bundles: the top finding names the faulted rank(s) and the cause.

Ground truth is each scenario's scenario.json (tests/lab/make_bundles.sh); nothing here
knows a bundle's timestamps or counts. Every finding's SQL must run on the model and
return exactly its evidence rows (same rows, order and columns), and once through
``stallscope query`` as a user would paste it.
"""
from __future__ import annotations

import io
import json
from functools import lru_cache

import pandas as pd
import pytest

from forensics.analysis import analyze
from forensics.cli import Env, main
from shipped import BUNDLES, SCENARIOS, shipped

needs_bundles = pytest.mark.skipif(not SCENARIOS, reason="no shipped bundles (tests/lab/make_bundles.sh)")

# scenario -> the kind of finding an SRE expects on top. link-down-hang: the job is hung with
# every rank inside the collective (the symptom NCCL RAS misses); the finding blames the rank
# whose links carry the unanswered retransmissions, i.e. the downed link.
EXPECTED_KIND = {"loss": "network_loss", "slow-link": "slow_link", "straggler": "straggler",
                 "mismatch-hang": "hang_mismatch", "link-down-hang": "hang_stuck", "reset": "connection_reset"}
SERIOUS = ("error", "warning")
MY_KINDS = {"network_loss", "slow_link", "connection_reset", "straggler", "hang_mismatch", "hang_stuck", "ib_errors"}


@lru_cache(maxsize=None)
def analysed(scenario: str):
    return analyze([shipped(scenario)])


def truth(scenario: str) -> dict:
    return json.loads((BUNDLES / scenario / "scenario.json").read_text())


@needs_bundles
@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s in EXPECTED_KIND])
def test_top_finding_names_the_faulted_rank_and_cause(scenario):
    a, t = analysed(scenario), truth(scenario)
    top = a.top
    assert top is not None, f"{scenario}: no finding at all"
    assert top.kind == EXPECTED_KIND[scenario], [(f.kind, f.severity, f.summary) for f in a.findings]
    assert top.severity in SERIOUS
    assert top.ranks == sorted(t["fault"]["ranks"]), top.summary
    # the summary is one readable sentence that names the rank
    assert f"rank {t['fault']['ranks'][0]}" in top.summary and "\n" not in top.summary
    # the verdict is the top finding's headline: one line naming the rank and its own host
    # (the name its process uses, not the capture's), at most 200 characters
    assert a.verdict() == top.headline and len(top.headline) <= 200, top.headline
    r = t["fault"]["ranks"][0]
    host = next(x["host"] for x in t["ranks"] if x["rank"] == r)
    assert f"rank {r} ({host})" in top.headline and host in top.hosts, (top.headline, top.hosts)


@needs_bundles
@pytest.mark.skipif(not {"loss", "slow-link"} <= set(SCENARIOS), reason="no loss and slow-link bundles")
def test_queueing_delay_not_drops_tells_a_slow_link_from_loss():
    """Loss on a fast path leaves the bulk of the ACK round trips flat (p90 in µs) and lifts
    only the tail by a timeout; a bottleneck's queue delays most segments (p90 in ms)."""
    from forensics.findings import Context
    from forensics.findings.link_delays import queue_links
    t = truth("slow-link")["fault"]
    slow = queue_links(Context(analysed("slow-link").model, analysed("slow-link").con))
    assert slow and all(t["ranks"][0] in lk for lk in slow), slow
    assert queue_links(Context(analysed("loss").model, analysed("loss").con)) == set()


@needs_bundles
@pytest.mark.skipif("reset" not in SCENARIOS, reason="no reset bundle")
def test_reset_finding_names_the_reset_connection():
    top, t = analysed("reset").top, truth("reset")
    tup = t["fault"]["tuple"]
    assert top.peer_ranks == [t["fault"]["reset_sent_to_rank"]]
    link = top.links[0]
    # the reset answers the packets of tuple (peer -> faulted rank): the RST goes the other way
    assert {(link["saddr"], link["sport"]), (link["daddr"], link["dport"])} == \
        {(tup["saddr"], tup["sport"]), (tup["daddr"], tup["dport"])}
    assert link["forged"] is (t["fault"].get("method", "").startswith("nft"))


@needs_bundles
@pytest.mark.skipif("link-down-hang" not in SCENARIOS, reason="no link-down-hang bundle")
def test_link_down_hang_is_stuck_with_the_downed_links_retransmissions():
    top, t = analysed("link-down-hang").top, truth("link-down-hang")
    down = t["fault"]["ranks"][0]
    assert top.links and all(down in (lk["rank"], lk["peer_rank"]) for lk in top.links)
    assert all(e["sender_rank"] == down or e["receiver_rank"] == down for e in top.evidence
               if e["event"] in ("tcp_retransmit_skb", "retransmission"))
    # stuck in the collective each rank launched but never completed
    assert top.details["op_count"] <= min(t["ops_completed"]) + 1 and "NCCL RAS" in top.summary


@needs_bundles
@pytest.mark.skipif("mismatch-hang" not in SCENARIOS, reason="no mismatch-hang bundle")
def test_mismatch_hang_names_the_collective_and_the_last_ops():
    top, t = analysed("mismatch-hang").top, truth("mismatch-hang")
    assert top.details["op_count"] == t["fault"]["op_index"]
    assert top.details["waiting_ranks"] == sorted(set(range(t["world_size"])) - set(t["fault"]["ranks"]))
    last = {e["rank"]: e["last_op_count"] for e in top.evidence}
    assert last == {r["rank"]: r["last_op_count_issued"] for r in t["ranks"]}


@needs_bundles
@pytest.mark.skipif("clean" not in SCENARIOS, reason="no clean bundle")
def test_clean_has_no_serious_finding():
    a = analysed("clean")
    assert [f.summary for f in a.findings if f.severity in SERIOUS] == []
    assert not [p for p in a.problems if p.startswith("detector")]


def same_value(a, b) -> bool:
    if a is None or b is None or (isinstance(a, float) and pd.isna(a)) or (isinstance(b, float) and pd.isna(b)):
        return (a is None or pd.isna(a)) and (b is None or pd.isna(b))
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b)) <= 0.051 + 1e-9 * abs(float(b))   # rounded to 0.1 both sides
    return a == b


def assert_sql_returns_the_evidence(con, f) -> None:
    """The finding's SQL computes its evidence: as many rows, every evidence column, equal values."""
    got = con.execute(f.sql).df()
    assert len(got) == len(f.evidence) > 0, (f.kind, len(got), len(f.evidence), f.sql)
    cols = list(dict.fromkeys(k for row in f.evidence for k in row))
    assert set(cols) <= set(got.columns), (f.kind, set(cols) - set(got.columns))
    rows = got[cols].astype(object).where(got[cols].notna(), None).to_dict("records")
    for want, have in zip(f.evidence, rows):
        diff = {c: (want.get(c), have[c]) for c in cols if not same_value(want.get(c), have[c])}
        assert not diff, (f.kind, diff)


@needs_bundles
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_findings_are_json_with_bounded_evidence_and_sql_that_returns_it(scenario):
    a = analysed(scenario)
    assert not [p for p in a.problems if p.startswith("detector")], a.problems
    doc = json.loads(json.dumps(a.to_json()))
    assert doc["schema_version"] == 1 and len(doc["findings"]) == len(a.findings)
    for f in (f for f in a.findings if f.kind in MY_KINDS):
        assert 0 <= f.confidence <= 1 and f.summary and f.action and len(f.evidence) <= 20
        assert f.sql, f.kind
        assert_sql_returns_the_evidence(a.con, f)
    # the findings table holds them in order
    kinds = [r[0] for r in a.con.execute("SELECT kind FROM findings ORDER BY position").fetchall()]
    assert kinds == [f.kind for f in a.findings]


@needs_bundles
@pytest.mark.skipif("loss" not in SCENARIOS, reason="no loss bundle")
def test_top_findings_sql_runs_through_stallscope_query():
    a = analysed("loss")
    out, err = io.StringIO(), io.StringIO()
    bundle = str(shipped("loss"))
    rc = main(["query", "--json", bundle, a.top.sql], Env(stdout=out, stderr=err))
    assert rc == 0, err.getvalue()
    rows = json.loads(out.getvalue())
    faulted = truth("loss")["fault"]["ranks"][0]
    assert rows and all(faulted in (r["sender_rank"], r["receiver_rank"]) for r in rows)
    # the evidence the finding carries is what the SQL counts: per connection, deduplicated across sources
    key = lambda r: (r["from"], r["to"])  # noqa: E731
    assert sorted(((key(r), r["retransmissions"]) for r in rows)) == \
        sorted(((key(e), e["retransmissions"]) for e in a.top.evidence))
