"""``stallscope query``: the article's SQL verbatim on the shipped loss bundle, formats, errors."""
from __future__ import annotations

import csv
import io
import json

import pytest

from conftest import FIXTURES
from forensics.cli import Env, main

BUNDLES = FIXTURES / "bundles"
pytestmark = pytest.mark.skipif(not (BUNDLES / "loss").is_dir(), reason="no shipped bundles")

# the NCCL-vs-TCP article's query, verbatim
ARTICLE = ("SELECT n.timestamp_ns, n.op, n.rank, n.duration_ns, count(t.event) AS retransmits "
           "FROM nccl_events n LEFT JOIN tcp_events t ON t.timestamp_ns BETWEEN n.timestamp_ns AND "
           "n.timestamp_ns + n.duration_ns AND t.event = 'tcp_retransmit_skb' "
           "WHERE n.op = 'ALL_REDUCE' AND n.duration_ns > 50000000 GROUP BY 1,2,3,4 ORDER BY retransmits DESC")
# the same, joined on the TCP event's owning or peer rank, per rank
BY_RANK = ("SELECT n.rank, count(t.event) AS retransmits "
           "FROM nccl_events n LEFT JOIN tcp_events t ON t.timestamp_ns BETWEEN n.timestamp_ns AND "
           "n.timestamp_ns + n.duration_ns AND t.event = 'tcp_retransmit_skb' "
           "AND (t.rank = n.rank OR t.peer_rank = n.rank) "
           "WHERE n.op = 'ALL_REDUCE' AND n.duration_ns > 50000000 GROUP BY 1 ORDER BY retransmits DESC")


def bundle(scenario="loss") -> str:
    return str(next((BUNDLES / scenario).glob("*.tar.gz")))


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(["query", *argv], Env(stdout=out, stderr=err))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def loss_db(tmp_path_factory):
    """The loss bundle's model saved once with --db; later queries open the file."""
    db = tmp_path_factory.mktemp("db") / "events.duckdb"
    rc, out, err = run(bundle(), "SELECT count(*) AS n FROM nccl_events", "--db", str(db))
    assert rc == 0, err
    return db


def test_article_query_verbatim_on_the_loss_bundle(loss_db):
    rc, out, err = run(bundle(), ARTICLE, "--json")     # from the bundle itself
    assert rc == 0, err
    rows = json.loads(out)
    truth = json.loads((BUNDLES / "loss" / "scenario.json").read_text())
    assert rows and all(r["op"] == "ALL_REDUCE" and r["duration_ns"] > 50_000_000 for r in rows)
    # slow AllReduces with retransmissions inside their windows, most first
    assert rows[0]["retransmits"] > 0
    assert [r["retransmits"] for r in rows] == sorted((r["retransmits"] for r in rows), reverse=True)
    # those windows are after the fault started (the loss made them slow)
    hit = [r for r in rows if r["retransmits"]]
    assert min(r["timestamp_ns"] + r["duration_ns"] for r in hit) >= truth["fault"]["start_time_ns"]
    # the saved database answers the same
    rc2, out2, _ = run(str(loss_db), ARTICLE, "--json")
    key = lambda r: (r["timestamp_ns"], r["rank"])  # noqa: E731  (ties in ORDER BY come in any order)
    assert rc2 == 0 and sorted(json.loads(out2), key=key) == sorted(rows, key=key)


def test_joined_on_owner_or_peer_rank_puts_the_lossy_rank_first(loss_db):
    truth = json.loads((BUNDLES / "loss" / "scenario.json").read_text())
    bad = truth["fault"]["ranks"]
    rc, out, err = run(str(loss_db), BY_RANK, "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert rows[0]["rank"] in bad and rows[0]["retransmits"] > 0
    # strictly ahead of every rank that is not on the lossy link... the lossy rank is on all of them
    assert rows[0]["retransmits"] > max(r["retransmits"] for r in rows if r["rank"] not in bad)


def test_article_query_on_clean_finds_no_retransmissions():
    rc, out, err = run(bundle("clean"), ARTICLE, "--json")
    assert rc == 0, err
    assert all(r["retransmits"] == 0 for r in json.loads(out))


def test_table_and_csv_output(loss_db):
    rc, out, err = run(str(loss_db), "SELECT rank, count(*) AS calls FROM nccl_events GROUP BY 1 ORDER BY 1")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["rank", "calls"] and set(lines[1]) <= {"-", " "} and lines[-1] == "(4 rows)"
    assert [ln.split()[0] for ln in lines[2:-1]] == ["0", "1", "2", "3"]
    rc, out, _ = run(str(loss_db), "SELECT rank, op, NULL AS nothing FROM nccl_events ORDER BY timestamp_ns LIMIT 2",
                     "--csv")
    rows = list(csv.reader(io.StringIO(out)))
    assert rc == 0 and rows[0] == ["rank", "op", "nothing"] and len(rows) == 3
    assert rows[1][1] == "BROADCAST" and rows[1][2] == ""


def test_bad_sql_is_one_line_and_exit_2(loss_db):
    rc, out, err = run(str(loss_db), "SELEC * FROM nccl_events")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith("stallscope: error: SQL:")
    rc, _, err = run(str(loss_db), "SELECT no_such_column FROM nccl_events")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    rc, _, err = run(str(loss_db))                         # no SQL
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_saved_db_is_read_only_and_never_overwritten(loss_db):
    rc, _, err = run(str(loss_db), "DROP TABLE nccl_events")
    assert rc == 2 and "read-only" in err.lower()
    rc, _, err = run(bundle(), "SELECT 1", "--db", str(loss_db))
    assert rc == 2 and "exists" in err


def test_unreadable_bundle_exit_2(tmp_path):
    bad = tmp_path / "stallscope-x-20260101T000000Z.tar.gz"
    bad.write_bytes(b"\x1f\x8b" + b"\0" * 64)
    rc, _, err = run(str(bad), "SELECT 1")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and bad.name in err
