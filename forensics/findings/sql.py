"""Runnable SQL and the tables a detector reads.

Runnable SQL (``Finding.sql``): it computes the finding's evidence rows (same rows, order
and column names as the DataFrame code: :func:`forensics.findings.trouble.trouble_sql`,
:func:`forensics.findings.trouble.dedup_sql` and :data:`forensics.findings.ranks.WORLD_RANK_SQL`
mirror it), and every value taken from a bundle (comm ids, hosts, devices, test names) enters
it only through :func:`sql_str` / :func:`sql_int` / :func:`sql_list`. :func:`sql_evidence`
returns a finding's rows from its SQL; :func:`model_table` is a table the model may lack.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..model.schema import empty


def sql_str(v) -> str:
    """A value as a SQL literal for the runnable SQL a finding carries: numbers (ints,
    numpy integers) via ``int()``, anything else as a single-quoted string with every
    ``'`` doubled (bundle text such as ``0x58cf' OR '1'='1`` stays one literal). A NUL
    byte, which DuckDB cannot take inside a literal, is spliced in with ``chr(0)``."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return str(int(v))
    text = "'" + str(v).replace("'", "''") + "'"
    return text.replace("\x00", "' || chr(0) || '")


def sql_int(v) -> str:
    """An integer for SQL (raises on anything that is not one)."""
    return str(int(v))


def sql_list(values) -> str:
    """Values as a comma-separated list of SQL literals (see :func:`sql_str`)."""
    return ", ".join(sql_str(v) for v in values)


def model_table(ctx, name: str) -> pd.DataFrame:
    """A model table, empty when this model has none (an older database, a synthetic model)."""
    t = ctx.model.tables.get(name)
    return empty(name) if t is None else t


def sql_evidence(ctx, sql: str, limit: int) -> list[dict]:
    """A finding's evidence rows as its SQL returns them (one source for both): the first
    ``limit``, missing values as None; none when a table is missing (an old database)."""
    try:
        df = ctx.sql(sql)
    except Exception:   # noqa: BLE001  a table missing in an old database: no rows rather than no finding
        return []
    rows = df.head(limit).to_dict("records")
    for r in rows:
        for k, v in r.items():
            if v is pd.NA or (isinstance(v, float) and np.isnan(v)):
                r[k] = None
            elif isinstance(v, np.integer):
                r[k] = int(v)
    return rows


__all__ = ["model_table", "sql_evidence", "sql_int", "sql_list", "sql_str"]
