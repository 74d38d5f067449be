"""The state of the job at capture, from the artefacts a late capture still has.

The tracer sees no call entered before it attached: a capture started during a hang sees
no collective at all. What it still has, and what this module turns into tables:

``coll_log_ops`` -- the last collective each process *launched* per communicator, from the
    NCCL_DEBUG COLL lines (``<Op>: opCount <hex> ... comm <ptr> [nranks=N]``), with the
    communicator's NCCL commId, the rank and nranks from its ``Init`` lines. Columns: host,
    pid (the process as the manifest knows it), rank (its global rank), log_pid, comm_ptr,
    comm_id, comm_rank, nranks, last_op_count, last_op, last_count, lines, artifact.
``threads`` -- per thread of every traced process at the start and end of the capture
    (/proc/PID/task/TID: state, wchan, the syscall it sits in and the socket it waits on).

COLL lines are read with one regular expression over the raw log (the NCCL_DEBUG parser
skips them: one line per call), keeping only the last line of each (pid, communicator).
"""
from __future__ import annotations

import re

import pandas as pd

from .nccl import conform, empty

# "<host>:<pid>:<tid> [<dev>] NCCL INFO <Op>: opCount <hex> ... count <n> ... comm <ptr> [nranks=<n>]"
COLL_POS_RE = re.compile(
    rb"(?m)^[^\n]*?:(\d+):\d+ \[\d+\] NCCL INFO (\w+): opCount ([0-9a-fA-F]+) [^\n]*?\bcount (\d+)"
    rb"[^\n]*?\bcomm (0x[0-9a-fA-F]+|\(nil\))(?: \[nranks=(\d+)\])?")


def coll_positions(data: bytes) -> pd.DataFrame:
    """The last COLL line of each (log pid, comm pointer) in an NCCL_DEBUG log, and how many
    there were. Columns: log_pid, comm_ptr, last_op_count, last_op, last_count, nranks, lines."""
    from ..parsers.nccl_debug import op_enum
    rows = COLL_POS_RE.findall(data)
    if not rows:
        return pd.DataFrame(columns=["log_pid", "comm_ptr", "last_op_count", "last_op", "last_count", "nranks",
                                     "lines"])
    df = pd.DataFrame(rows, columns=["log_pid", "op", "op_count", "count", "comm_ptr", "nranks"])
    for c in df.columns:
        df[c] = df[c].str.decode("ascii", errors="replace")
    df["log_pid"] = pd.to_numeric(df["log_pid"], errors="coerce")
    df["op_count"] = df["op_count"].map(lambda x: int(x, 16) if len(x) <= 16 else None)
    df["count"] = pd.to_numeric(df["count"], errors="coerce")
    df["nranks"] = pd.to_numeric(df["nranks"].replace("", None), errors="coerce")
    key = ["log_pid", "comm_ptr"]
    # NCCL counts per communicator: the largest opCount is the last launched (lines of several
    # threads may interleave, so the order of the file is not enough)
    df = df.dropna(subset=["log_pid", "op_count"])
    lines = df.groupby(key).size().rename("lines")
    last = df.sort_values("op_count", kind="stable").drop_duplicates(key, keep="last").set_index(key)
    out = last.join(lines).reset_index()
    out["op"] = out["op"].map(op_enum)
    return out.rename(columns={"op_count": "last_op_count", "op": "last_op", "count": "last_count"})[
        ["log_pid", "comm_ptr", "last_op_count", "last_op", "last_count", "nranks", "lines"]]


def coll_log_table(bundle, arts, cfg: pd.DataFrame) -> pd.DataFrame:
    """``coll_log_ops`` of one bundle: the COLL positions of its logs, joined with their
    communicators' Init lines (commId, rank, nranks) and mapped to the manifest's processes
    through ``nccl_config`` (log pid -> pid, global rank)."""
    parts = [df.assign(artifact=rel) for rel, df in arts.coll_positions if len(df)]
    if not parts:
        return empty("coll_log_ops")
    pos = pd.concat(parts, ignore_index=True)
    comms = arts.table("nccl_debug", "nccl_comms")
    if len(comms):
        c = comms.dropna(subset=["pid", "comm"]).sort_values("status", kind="stable")   # COMPLETE after START
        c = c.drop_duplicates(["pid", "comm"], keep="last")
        c = pd.DataFrame({"log_pid": pd.to_numeric(c["pid"], errors="coerce"), "comm_ptr": c["comm"].astype(str),
                          "comm_id": c.get("comm_id"), "comm_rank": c["rank"], "init_nranks": c["nranks"]})
        pos = pos.merge(c, on=["log_pid", "comm_ptr"], how="left")
        pos["nranks"] = pos["nranks"].fillna(pos["init_nranks"])
    pos["host"] = bundle.host
    pos["pid"], pos["rank"] = pos["log_pid"], pd.NA
    if cfg is not None and len(cfg):
        m = cfg.dropna(subset=["log_pid"]).drop_duplicates("log_pid")
        pid = dict(zip(pd.to_numeric(m["log_pid"]), m["pid"]))
        rank = dict(zip(pd.to_numeric(m["log_pid"]), m["rank"]))
        pos["pid"] = pos["log_pid"].map(pid).fillna(pos["log_pid"])
        pos["rank"] = pos["log_pid"].map(rank)
    return conform(pos, "coll_log_ops")


def threads_table(bundle, arts, ranks: dict[int, int]) -> pd.DataFrame:
    """``threads``: capture's per-thread /proc samples (``proc/<pid>-threads-<phase>.json``)."""
    df = arts.table("proc_threads", "threads")
    if df.empty:
        return empty("threads")
    df = df.copy()
    df["host"] = bundle.host
    df["rank"] = pd.to_numeric(df["pid"], errors="coerce").map(ranks).astype("Int64")
    return conform(df, "threads")
