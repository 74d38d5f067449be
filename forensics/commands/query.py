"""``stallscope query BUNDLE_OR_DB ... "SQL"``: SQL over the event tables.

Bundles (tar.gz or unpacked folders; several hosts at once) and loose evidence (job logs,
nccl-tests output, ibstat; files, folders, archives) are modelled first
(:func:`forensics.execution.host_reading.read_model`, as ``analyze`` reads them); a saved ``.duckdb`` file is opened read-only.
``--db FILE`` keeps the built model for later queries. Output: an aligned table, or
``--csv`` / ``--json`` (one JSON array of objects).
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from ..errors import ExitCode, InputError

POSITIONAL_REST = "inputs"   # positionals after an option join this list (see cli.main)
EXIT_AT_ONCE = True         # nothing to tear down after run (see cli.console)
HELP = "run SQL over the event tables of bundles and logs (or a saved events.duckdb)"
DB_SUFFIXES = (".duckdb", ".db", ".ddb")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", metavar="BUNDLE_OR_DB",
                   help="bundles (tar.gz or folder) and/or loose evidence (logs, folders, archives), or one "
                        "saved .duckdb, followed by the SQL")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    fmt.add_argument("--json", action="store_true", help="print a JSON array of row objects")
    p.add_argument("--db", metavar="FILE", help="also save the model as a DuckDB file (not overwritten)")


def run(args: argparse.Namespace, env) -> int:
    if len(args.inputs) < 2:
        raise InputError("query needs a bundle (or .duckdb) and an SQL statement")
    *sources, sql = args.inputs
    if args.db and Path(args.db).exists():
        raise InputError(f"{args.db} exists; stallscope never overwrites a database")
    import duckdb
    from ..output import staged_path
    # a saved model is built next to its name and appears there only complete
    with staged_path(args.db, suffix=".duckdb") as db:
        con = _connect(sources, db, env)
        try:
            cur = con.execute(sql)
            cols = [d[0] for d in cur.description] if cur.description else []
            rows = cur.fetchall() if cols else []
        except duckdb.Error as e:
            msg = " ".join(str(e).split())
            print(f"stallscope: error: SQL: {msg}", file=env.stderr)
            return ExitCode.BAD_INPUT
        finally:
            con.close()
    if args.csv:
        w = csv.writer(env.stdout, lineterminator="\n")
        w.writerow(cols)
        w.writerows([["" if v is None else v for v in r] for r in rows])
    elif args.json:
        json.dump([dict(zip(cols, r)) for r in rows], env.stdout, default=str)
        env.stdout.write("\n")
    else:
        env.stdout.write(render_table(cols, rows) + "\n")
    return ExitCode.OK


def _connect(sources: list[str], db: str | None, env):
    import duckdb
    if len(sources) == 1 and _is_duckdb(Path(sources[0])):
        if db:
            raise InputError("--db saves a model built from bundles; the input is already a database")
        try:
            return duckdb.connect(sources[0], read_only=True)
        except duckdb.Error as e:
            raise InputError(f"{sources[0]}: cannot open the database ({' '.join(str(e).split())})") from None
    from ..execution.host_reading import read_model
    model = read_model(sources)
    for p in model.problems:
        env.warn(p)
    if len(model.captures) > 1:
        env.warn(model.skew_report())
    con = model.connect(db)
    con.load()        # now: what fails here is the model, not the statement
    return con


def _is_duckdb(p: Path) -> bool:
    if p.suffix.lower() in DB_SUFFIXES and p.is_file():
        return True
    try:
        with open(p, "rb") as fh:
            head = fh.read(16)
        return head[8:12] == b"DUCK"
    except OSError:
        return False


def render_table(cols: list[str], rows: list[tuple]) -> str:
    def cell(v) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)
    body = [[cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(cols)]
    numeric = [all(_numeric(r[i]) for r in body) and body != [] for i in range(len(cols))]

    def line(vals):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, widths, numeric)).rstrip()
    out = [line(cols), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in body]
    out.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return "\n".join(out)


def _numeric(s: str) -> bool:
    if s == "NULL":
        return True
    try:
        float(s)
        return True
    except ValueError:
        return False
