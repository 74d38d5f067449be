"""What the report's sections share: reading a table a bundle may lack
(:func:`optional_table`), times as text (:func:`utc`) and the capture's span
(:func:`time_span`), ranks as the findings name them (:func:`with_global_rank`), the
analysis's memos (:func:`memo`), and what a renderer does to any table it shows (the
columns of evidence records, rows to highlight, strict JSON).
"""
from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ... import model as event_model
from ...model.nccl import world_ranks


TOP_ROWS = 50   # a per-rank, per-flow or per-host table longer than this: its most telling rows and "… and N more"


def optional_table(model, name: str) -> pd.DataFrame | None:
    """``model.tables[name]`` when it exists and has rows, else None."""
    df = model.tables.get(name) if hasattr(model.tables, "get") else None
    if df is None or not isinstance(df, pd.DataFrame) or df.empty:
        return None
    return df


def utc(ns: Any) -> str:
    """UTC ns -> '2026-11-22 19:22:07.123456Z' ('-' when unknown)."""
    if ns is None or (isinstance(ns, float) and np.isnan(ns)) or pd.isna(ns):
        return "-"
    t = dt.datetime.fromtimestamp(int(ns) / 1e9, tz=dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{(int(ns) // 1000) % 1_000_000:06d}Z"


@dataclass
class TimeSpan:
    start_ns: int | None
    end_ns: int | None

    @property
    def seconds(self) -> float | None:
        if self.start_ns is None or self.end_ns is None:
            return None
        return (self.end_ns - self.start_ns) / 1e9


def time_span(analysis) -> TimeSpan:
    """The capture window (manifests), widened to every event seen."""
    model = analysis.model
    starts = [c.get("started_ns") for c in model.captures if c.get("started_ns")]
    ends = [c.get("ended_ns") for c in model.captures if c.get("ended_ns")]
    n = model.tables["nccl_events"]
    for col in (n["timestamp_ns"], n["end_ns"], model.tables["tcp_events"]["timestamp_ns"]):
        col = pd.to_numeric(col, errors="coerce").dropna()
        if len(col):
            starts.append(int(col.min()))
            ends.append(int(col.max()))
    return TimeSpan(min(starts) if starts else None, max(ends) if ends else None)


def with_global_rank(model, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (nccl_events rows) with ``comm_rank`` (the original ``rank``) and ``rank``
    replaced by the process's global rank (the comm rank when the process is unknown), as
    the findings name ranks (:func:`forensics.model.nccl.world_ranks`)."""
    w = world_ranks(model.tables["nccl_events"])
    key = pd.MultiIndex.from_frame(w[["host", "pid"]].astype({"pid": "int64"}).astype(object)) if len(w) else None
    g = pd.Series(np.nan, index=df.index, dtype="float64")
    ok = df["pid"].notna().to_numpy()
    if key is not None and ok.any():
        look = pd.Series(pd.to_numeric(w["global_rank"]).to_numpy(dtype="float64"), index=key)
        q = pd.MultiIndex.from_arrays([df.loc[ok, "host"].astype(object).to_numpy(),
                                       df.loc[ok, "pid"].astype("int64").astype(object).to_numpy()])
        g[ok] = look.reindex(q).to_numpy()
    rank = pd.to_numeric(df["rank"], errors="coerce")
    # float64 both (rank may be Int64 with NA: a nullable fill value into float64 is deprecated)
    return df.assign(comm_rank=rank, rank=g.fillna(rank.astype("float64")).astype("Int64"))


def memo(analysis, key: str, compute):
    """``compute()`` computed once per analysis and kept in ``analysis.memos``
    (:func:`forensics.model.memo`; :func:`forensics.report.model_steps` may have put it there
    already, made in another process); each caller gets its own copy to change. An analysis
    without memos (a test's stand-in) computes it each time."""
    memos = getattr(analysis, "memos", None)
    return compute() if memos is None else event_model.memo(memos, key, compute)


def evidence_columns(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def finite(o):
    """NaN and infinities (not JSON) -> None, through dicts and lists."""
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o


def highlight_rows(df: pd.DataFrame, findings, kinds=("misconfiguration",)) -> list[bool]:
    """Rows to highlight in a table another module supplies: a truthy problem-like column,
    or a rank/host that a finding of ``kinds`` blames."""
    flag = np.zeros(len(df), dtype=bool)
    for col in ("problem", "problems", "misconfigured", "misconfiguration", "issue", "warning", "warnings",
                "severity"):
        if col in df.columns:
            v = df[col]
            if pd.api.types.is_bool_dtype(v):
                flag |= v.fillna(False).to_numpy(dtype=bool)
            else:
                flag |= v.notna().to_numpy() & ~v.astype(str).isin(["", "False", "false", "0", "ok", "none", "None",
                                                                    "info", "[]"]).to_numpy()
    blamed = [f for f in findings if f.kind in kinds]
    if blamed:
        if "rank" in df.columns:
            ranks = {r for f in blamed for r in f.ranks}
            flag |= pd.to_numeric(df["rank"], errors="coerce").isin(ranks).to_numpy()
        elif "host" in df.columns:
            hosts = {h for f in blamed for h in f.hosts}
            flag |= df["host"].astype(str).isin(hosts).to_numpy()
    return flag.tolist()
