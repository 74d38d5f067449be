"""COLL lines of NCCL_DEBUG logs (``<Op>: opCount <hex> sendbuff … stream …``): the
collectives each process issued, read by :mod:`.nccl_debug` into ``nccl_coll`` (a row per
line) or ``nccl_coll_last`` (the last line of each process and communicator).

A COLL log has millions of lines, so they are parsed into columns by ``logscan.c``
(:func:`scan_coll`); the columns are typed and named here. A line in another form (an
upper-case pointer, say) is matched by :data:`COLL_RE` when :mod:`.nccl_debug` reads the other
NCCL lines, and typed by :func:`coll_derived` the same way. The tables' columns are documented in :mod:`.nccl_debug`.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from . import lines as lines_mod
from ..native import coll_chunks
from .text import LogText

# a COLL line's head (a line :data:`COLL_RE` must then read whole)
COLL_HEAD_RE = re.compile(r"^\w+: opCount ")
COLL_RE = re.compile(
    r"^(?P<op_name>\w+): opCount (?P<op_count>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) count (?P<count>\d+) datatype (?P<datatype>\d+) "
    r"op (?P<red_op>\d+) root (?P<root>-?\d+) comm (?P<comm>\S+) "
    r"\[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)\s*$"
)

OPS = {
    "AllReduce": "ALL_REDUCE", "AllGather": "ALL_GATHER", "ReduceScatter": "REDUCE_SCATTER",
    "Broadcast": "BROADCAST", "Reduce": "REDUCE", "Send": "SEND", "Recv": "RECV",
    "AlltoAll": "ALL_TO_ALL", "AllToAll": "ALL_TO_ALL", "Gather": "GATHER", "Scatter": "SCATTER",
}
# ncclDataType_t: (name, bytes per element)
DATATYPES = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
    5: ("uint64", 8), 6: ("half", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bf16", 2),
    10: ("fp8e4m3", 1), 11: ("fp8e5m2", 1),
}
RED_OPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}


def op_enum(name: str) -> str:
    """The upper snake case of an op name as printed (``AllReduce`` -> ``ALL_REDUCE``)."""
    return OPS.get(name) or re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


# the launcher context of a line (lines.Context.as_row)
CTX = lines_mod.CONTEXT_COLUMNS

# the parser-table types of ``nccl_coll`` and ``nccl_coll_last`` (NcclDebugParser.SCHEMAS)
COLL_SCHEMA = {"line": "int", "ts": "str", "ts_local": "time", "host": "str", "pid": "int",
               "tid": "int", "dev": "int", "op": "str", "op_name": "str", "op_count": "int",
               "sendbuff": "str", "recvbuff": "str", "count": "int", "datatype": "int",
               "datatype_name": "str", "bytes": "int", "red_op": "int", "red_op_name": "str",
               "root": "int", "peer": "int", "comm": "str", "nranks": "int", "stream": "str"}
COLL_LAST_SCHEMA = {"line": "int", "ts": "str", "host": "str", "pid": "int", "tid": "int", "dev": "int",
                    "comm": "str", "op": "str", "op_name": "str", "op_count": "int", "count": "int",
                    "datatype": "int", "nranks": "int", "lines": "int", **CTX}

_COLL_ROW_COLS = ("start", "pre", "ts_len", "host_off", "host_len", "host_hash", "pid", "tid", "dev", "op_off",
                  "op_len", "op_hash", "op_count", "sendbuff", "recvbuff", "count", "datatype", "red_op", "root",
                  "comm", "nranks", "stream")
_COLL_LAST_COLS = ("start", "pre", "ts_len", "host_off", "host_len", "host_hash", "pid", "tid", "dev", "op_off",
                   "op_len", "op_hash", "op_count", "count", "datatype", "comm", "nranks")
_K1, _K2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


def scan_coll(text: LogText, mode: str):
    """(COLL rows as a DataFrame or None, the last line per process and communicator as a
    DataFrame or None, offsets of the other "NCCL INFO " lines) of ``text``."""
    others, parts = [], []
    cols = _COLL_ROW_COLS if mode == "rows" else _COLL_LAST_COLS
    for chunk, other in coll_chunks(text.data, text.size, cols):
        others.append(other.copy())
        if len(chunk["start"]):
            parts.append({k: v.copy() for k, v in chunk.items()} if mode == "rows" else _last_of(chunk))
    other = np.concatenate(others) if others else np.empty(0, np.int64)
    if not parts:
        return (_coll_frame(text, None) if mode == "rows" else None), None, other
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if mode == "rows":
        return _coll_frame(text, merged), None, other
    return None, _positions_frame(text, _last_of(merged) if len(parts) > 1 else merged), other


def _last_of(c: dict) -> dict:
    """The row of the largest opCount (the later line on a tie) of each (host, pid, comm), with
    ``lines``: how many rows each had (summed over chunks already aggregated)."""
    h = c["host_hash"] ^ (c["pid"].astype(np.uint64) * _K1) ^ (c["comm"] * _K2)
    order = np.lexsort((c["start"], c["op_count"], h))
    hs = h[order]
    first = np.r_[True, hs[1:] != hs[:-1]]
    last = np.r_[hs[1:] != hs[:-1], True]
    n = c["lines"] if "lines" in c else np.ones(len(h), np.int64)
    counts = np.add.reduceat(n[order], np.flatnonzero(first))
    pick = order[last]
    out = {k: v[pick] for k, v in c.items() if k != "lines"}
    out["lines"] = counts
    return out


def _strings(text: LogText, off: np.ndarray, ln: np.ndarray, key: np.ndarray) -> np.ndarray:
    """The text at (offset, length) of each row, decoded once per distinct ``key`` (a hash)."""
    if not len(key):
        return np.empty(0, object)
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    vals = np.array([text.text(int(off[i]), int(off[i] + ln[i])) for i in first], dtype=object)
    return vals[inv]


def _pointers(v: np.ndarray) -> np.ndarray:
    """glibc's %p of each pointer ("(nil)" for 0 becomes NA)."""
    uniq, inv = np.unique(v, return_inverse=True)
    txt = np.array([None if u == 0 else f"0x{int(u):x}" for u in uniq], dtype=object)
    return txt[inv]


def _coll_frame(text: LogText, c: dict | None) -> pd.DataFrame:
    """``nccl_coll`` rows of the C scanner's columns (``None``: an empty frame)."""
    if c is None or not len(c["start"]):
        return pd.DataFrame(columns=list(COLL_SCHEMA))
    start, end, line = text.line_numbers_and_ends(c["start"])
    op_name = _strings(text, c["op_off"], c["op_len"], c["op_hash"])
    df = pd.DataFrame({
        "line": line, "ts": _ts_texts(text, c), "host": _strings(text, c["host_off"], c["host_len"], c["host_hash"]),
        "pid": c["pid"], "tid": c["tid"], "dev": c["dev"], "op_name": op_name,
        "op_count": c["op_count"].astype(object), "sendbuff": _pointers(c["sendbuff"]),
        "recvbuff": _pointers(c["recvbuff"]), "count": c["count"], "datatype": c["datatype"], "red_op": c["red_op"],
        "root": c["root"], "comm": _pointers(c["comm"]), "nranks": c["nranks"], "stream": _pointers(c["stream"])})
    df["comm"] = df["comm"].fillna("(nil)")
    df["stream"] = df["stream"].fillna("(nil)")
    df["message"] = [text.text(int(a), int(b)).rstrip() for a, b in zip(c["op_off"], end)]
    df = pd.concat([df, pd.DataFrame(_c_contexts(text, c), index=df.index)], axis=1)
    return coll_derived(df)


def _ts_texts(text: LogText, c: dict) -> np.ndarray:
    out = np.full(len(c["start"]), None, dtype=object)
    for i in np.flatnonzero(c["ts_len"] > 0):
        out[i] = text.text(int(c["pre"][i]) + 1, int(c["pre"][i] + c["ts_len"][i]) - 1)
    return out


def coll_derived(df: pd.DataFrame) -> pd.DataFrame:
    """op, datatype_name, bytes, red_op_name, peer and ts_local of COLL rows."""
    ops = {n: op_enum(n) for n in df["op_name"].unique()}
    df["op"] = df["op_name"].map(ops)
    dt = pd.to_numeric(df["datatype"], errors="coerce")
    df["datatype_name"] = dt.map({k: v[0] for k, v in DATATYPES.items()})
    # Python ints: a count of 20 digits times the element size must not pass through float
    df["bytes"] = [int(n) * DATATYPES[int(d)][1] if pd.notna(d) and int(d) in DATATYPES and pd.notna(n) else None
                   for n, d in zip(df["count"].tolist(), dt.tolist())]
    red = pd.to_numeric(df["red_op"], errors="coerce")
    df["red_op_name"] = red.map(RED_OPS).where(red.isna() | red.isin(list(RED_OPS)), "premulsum")
    df["peer"] = df["root"].where(df["op"].isin(["SEND", "RECV"]))
    if "ts" in df and df["ts"].notna().any():
        df["ts_local"] = pd.to_datetime(df["ts"].astype("string").str.replace("_", " "), errors="coerce",
                                        format="mixed")
    return df


def _positions_frame(text: LogText, c: dict) -> pd.DataFrame:
    """``nccl_coll_last`` of the aggregated C columns, with the line numbers, times and
    launcher contexts of those last lines."""
    order = np.argsort(c["start"], kind="stable")
    c = {k: v[order] for k, v in c.items()}
    _, _, line = text.line_numbers_and_ends(c["start"])
    df = pd.DataFrame({
        "line": line, "ts": _ts_texts(text, c), "host": _strings(text, c["host_off"], c["host_len"], c["host_hash"]),
        "pid": c["pid"], "tid": c["tid"], "dev": c["dev"],
        "op_name": _strings(text, c["op_off"], c["op_len"], c["op_hash"]), "op_count": c["op_count"].astype(object),
        "count": c["count"], "datatype": c["datatype"], "comm": _pointers(c["comm"]), "nranks": c["nranks"],
        "lines": c["lines"]})
    df["comm"] = df["comm"].fillna("(nil)")
    df["op"] = df["op_name"].map(op_enum)
    return pd.concat([df, pd.DataFrame(_c_contexts(text, c), index=df.index)], axis=1)


def concat_rows(parts: list) -> pd.DataFrame:
    """``nccl_coll`` of the C scanner's rows and any COLL rows the regular expression read, by line."""
    parts = [p for p in parts if p is not None and len(p)]
    if not parts:
        return pd.DataFrame(columns=list(COLL_SCHEMA))
    df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return df.sort_values("line", kind="stable").reset_index(drop=True)


def last_positions(parts: list) -> pd.DataFrame:
    """``nccl_coll_last`` of the C scanner's aggregate and any COLL rows the regular expression read."""
    parts = [p for p in parts if p is not None and len(p)]
    if not parts:
        return pd.DataFrame(columns=list(COLL_LAST_SCHEMA))
    df = pd.concat([p.assign(lines=p["lines"] if "lines" in p else 1) for p in parts], ignore_index=True)
    key = ["host", "pid", "comm"]
    lines = df.groupby(key, dropna=False)["lines"].transform("sum")
    df = df.assign(lines=lines, _oc=pd.to_numeric(df["op_count"], errors="coerce"))
    df = df.sort_values(["_oc", "line"], kind="stable").drop_duplicates(key, keep="last")
    return df.drop(columns="_oc").sort_values("line", kind="stable").reset_index(drop=True)


def _c_contexts(text: LogText, c: dict) -> dict[str, list]:
    """The launcher context columns of lines the C scanner read: the text from each line's
    start to its NCCL prefix (``pre``), as :mod:`.nccl_debug` reads it for the other lines."""
    return lines_mod.context_columns("" if a == b else text.text(int(a), int(b))
                                     for a, b in zip(c["start"], c["pre"]))
