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

COLL lines are read by the NCCL_DEBUG parser's C scanner, which keeps only the last line of each
(host, pid, communicator) and how many there were (``nccl_coll_last``).
"""
from __future__ import annotations

import pandas as pd

from .schema import conform, empty

def coll_log_table(bundle, arts, cfg: pd.DataFrame) -> pd.DataFrame:
    """``coll_log_ops`` of one bundle: the COLL positions of its logs (the NCCL_DEBUG parser's
    ``nccl_coll_last``), joined with their communicators' Init lines (commId, rank, nranks) and
    mapped to the processes of ``nccl_config`` (log host and pid -> host, pid, global rank)."""
    parts = [df.assign(artifact=rel) for rel, df in arts.coll_positions if len(df)]
    if not parts:
        return empty("coll_log_ops")
    pos = pd.concat(parts, ignore_index=True)
    pos["log_host"] = pos["log_host"].astype("string").fillna("")
    pos["log_pid"] = pd.to_numeric(pos["log_pid"], errors="coerce")
    comms = arts.table("nccl_debug", "nccl_comms")
    if len(comms):
        c = comms.dropna(subset=["pid", "comm"]).sort_values("status", kind="stable")   # COMPLETE after START
        c = pd.DataFrame({"log_host": c["host"].astype("string").fillna(""),
                          "log_pid": pd.to_numeric(c["pid"], errors="coerce"), "comm_ptr": c["comm"].astype(str),
                          "comm_id": c.get("comm_id"), "comm_rank": c["rank"], "init_nranks": c["nranks"]})
        c = c.drop_duplicates(["log_host", "log_pid", "comm_ptr"], keep="last")
        pos = pos.merge(c, on=["log_host", "log_pid", "comm_ptr"], how="left")
        pos["nranks"] = pd.to_numeric(pos["nranks"], errors="coerce").fillna(
            pd.to_numeric(pos["init_nranks"], errors="coerce"))
    node = bundle.node
    pos["node"] = node
    pos["host"], pos["pid"], pos["rank"] = pos["log_host"].replace("", pd.NA), pos["log_pid"], pd.NA
    if cfg is not None and len(cfg):
        m = cfg.dropna(subset=["log_pid"])
        m = m.assign(_h=m["log_host"].astype("string").fillna(""), _p=pd.to_numeric(m["log_pid"]))
        m = m.drop_duplicates(["_h", "_p"])
        key = list(zip(pos["log_host"], pos["log_pid"]))
        host = dict(zip(zip(m["_h"], m["_p"]), m["host"]))
        pid = dict(zip(zip(m["_h"], m["_p"]), m["pid"]))
        rank = dict(zip(zip(m["_h"], m["_p"]), m["rank"]))
        pos["host"] = pd.Series([host.get(k) for k in key], index=pos.index, dtype="string").fillna(pos["host"])
        pos["pid"] = pd.Series([pid.get(k) for k in key], index=pos.index, dtype="Float64").fillna(pos["log_pid"])
        pos["rank"] = pd.Series([rank.get(k) for k in key], index=pos.index, dtype="Float64")
    pos["log_host"] = pos["log_host"].replace("", pd.NA)
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
