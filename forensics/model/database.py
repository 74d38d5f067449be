"""The model's tables in DuckDB (:meth:`forensics.model.Model.connect`): what the findings'
SQL, ``stallscope query`` and ``--db`` read.

:class:`EventDatabase` wraps the connection. In memory, the event tables are loaded into
DuckDB at the first statement that could read them, not when the connection is made: most
analyses run no SQL over them at all (the detectors read the DataFrames; only a hang's state
evidence is a query), and loading them is pandas-to-DuckDB conversion on one core, growing
with the flagged packets (0.1 s at 8 hosts of 1M packets, 0.4 s at 64: 466,000 TCP events). ``nccl_events`` is loaded
at once: ``collectives`` is made from it in SQL. A database file (``--db``) is the output
itself and is loaded whole when made.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from . import nccl as nccl_mod
from .schema import SCHEMAS, TABLES

# loaded when the connection is made: collectives is made from them
FIRST = ("nccl_events", "capture_windows")


class EventDatabase:
    """A DuckDB connection over a model's tables, the event tables loaded when first needed.

    :meth:`execute` (and any other attribute of the DuckDB connection) loads what is still
    pending first; :meth:`store` runs a statement on a table of the database's own (the
    findings) without loading them; :meth:`close` drops what was never loaded."""

    def __init__(self, con, pending: dict[str, pd.DataFrame]):
        self._con = con
        self._pending = dict(pending)

    @property
    def loaded(self) -> bool:
        """Whether every table holds its rows."""
        return not self._pending

    def load(self) -> None:
        """Every pending table's rows inserted (once)."""
        for name in list(self._pending):
            _insert(self._con, name, self._pending[name])
            del self._pending[name]

    def execute(self, query: str, parameters: Any = None):
        self.load()
        return self._con.execute(query, parameters)

    def store(self, query: str, parameters: Any = None):
        """``query`` run without loading the event tables: for a statement that reads none of
        them (creating and filling the findings table)."""
        return self._con.execute(query, parameters)

    def close(self) -> None:
        self._pending.clear()
        self._con.close()

    def __getattr__(self, name: str):
        if name.startswith("_"):        # not set yet (copy, pickle): never the connection's
            raise AttributeError(name)
        self.load()
        return getattr(self._con, name)

    def __enter__(self) -> EventDatabase:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_database(path: str | None = None):
    """A DuckDB connection (``path``: a file; None: in memory) with every table of the model
    created, empty: what :func:`connect` fills. Needs no table, so it can be made before the
    model (on a thread: DuckDB leaves the GIL)."""
    import duckdb
    con = duckdb.connect(path or ":memory:")
    try:
        for name in TABLES:
            cols = ", ".join(f'"{c}" {t}' for c, t in SCHEMAS[name].items())
            con.execute(f'CREATE OR REPLACE TABLE "{name}" ({cols})')
    except BaseException:
        con.close()
        raise
    return con


def connect(tables: dict[str, pd.DataFrame], path: str | None = None,
            opened=None) -> tuple[EventDatabase, pd.DataFrame]:
    """(the database over ``tables``, the ``collectives`` table it made). ``path``: a DuckDB
    file, loaded whole now; None: in memory, the event tables loaded when first queried.
    ``opened``: :func:`open_database` of that ``path`` made already (it is used, then owned)."""
    con = opened if opened is not None else open_database(path)
    try:
        pending = {}
        for name in TABLES:
            df = tables.get(name)
            if name == "collectives" or df is None or not len(df):
                continue
            if path or name in FIRST:
                _insert(con, name, df)
            else:
                pending[name] = df
        con.execute(f"INSERT INTO collectives {nccl_mod.COLLECTIVES_SQL}")
        collectives = con.execute("SELECT * FROM collectives ORDER BY comm_id_hash, op_count").df()
    except BaseException:
        con.close()
        raise
    return EventDatabase(con, pending), collectives


def _insert(con, name: str, df: pd.DataFrame) -> None:
    con.register("_df", df)
    try:
        names = ", ".join(f'"{c}"' for c in SCHEMAS[name])
        con.execute(f'INSERT INTO "{name}" SELECT {names} FROM _df')
    finally:
        con.unregister("_df")
