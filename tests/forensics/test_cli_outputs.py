"""What `analyze` and `query` write: databases appear only complete, existing files and
directories are refused with one line, options may sit between positionals."""
from __future__ import annotations

import io

import duckdb

from forensics.cli import Env, main
from shipped import shipped_bundle

LOSS = shipped_bundle("loss")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), Env(stdout=out, stderr=err))
    return code, out.getvalue(), err.getvalue()


def _findings(db) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM findings").fetchone()[0]


def test_a_failed_analysis_with_force_keeps_the_old_database(tmp_path):
    db, html = tmp_path / "e.duckdb", tmp_path / "r.html"
    code, _, err = run("analyze", str(LOSS), "-q", "-o", str(html), "--db", str(db))
    assert code == 1, err                        # the loss bundle has an error finding
    before = db.read_bytes()
    assert _findings(db) > 0
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a bundle")
    code, _, err = run("analyze", str(bad), "-q", "-o", str(html), "--db", str(db), "--force")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert db.read_bytes() == before              # untouched: the new one was never complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz", "e.duckdb", "r.html"]


def test_force_replaces_a_database_only_with_a_complete_one(tmp_path):
    db = tmp_path / "e.duckdb"
    db.write_bytes(b"old")
    code, _, err = run("analyze", str(LOSS), "-q", "-o", str(tmp_path / "r.html"), "--db", str(db), "--force")
    assert code == 1, err
    assert _findings(db) > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".stallscope-")]


def test_an_output_that_is_a_directory_is_one_line_exit_2(tmp_path):
    (tmp_path / "adir").mkdir()
    code, _, err = run("analyze", str(LOSS), "-q", "-o", str(tmp_path / "adir"), "--force")
    assert code == 2 and "is not a regular file" in err and len(err.strip().splitlines()) == 1


def test_query_options_between_bundle_and_sql(tmp_path):
    db = tmp_path / "q.duckdb"
    code, out, err = run("query", str(LOSS), "--db", str(db), "--csv", "SELECT count(*) AS n FROM nccl_events")
    assert code == 0, err
    assert out.splitlines()[0] == "n" and int(out.splitlines()[1]) > 0
    assert db.exists()
    code, _, err = run("query", str(LOSS), "--db", str(db), "SELECT 1")   # never overwritten
    assert code == 2 and "exists" in err
    code, _, err = run("query", str(LOSS), "--bogus", "SELECT 1")          # unknown options still refused
    assert code == 2 and "unrecognized arguments: --bogus" in err
