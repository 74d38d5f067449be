"""``comm_inits``: one row per communicator init a rank began, from the tracer's ``comm_init``
events (entry, and return when it came) and the NCCL_DEBUG ``Init START``/``Init COMPLETE``
lines (``nccl_comms``; no times: NCCL's lines carry none). An init not ``completed`` is a rank still inside ``ncclCommInitRank*`` when
the evidence ends: the init-hang detector (``forensics/findings/init_hang.py``) compares those
with the communicator's size to name the ranks that never arrived.

For a rank stuck in init the tracer's ``sock_state`` transitions of its process add the
connections it tried and never opened (``SYN_SENT`` never followed by ``ESTABLISHED``): the
address it cannot reach (``unreached``, ``addr:port``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .events import events_frame, utc_of
from .schema import conform, empty

INIT_FNS = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable", "ncclCommSplit",
            "ncclCommInitAll")


def comm_inits(bundle, events: list[dict], log_comms: pd.DataFrame | None) -> pd.DataFrame:
    """``comm_inits`` of one bundle (or loose logs: ``log_comms`` alone)."""
    traced = _traced(bundle, events)
    logged = _logged(bundle, log_comms)
    if traced is not None and logged is not None and len(traced):
        # one communicator, two keys (the tracer's hash of the unique id, NCCL's commId): a
        # process the tracer saw is taken from the tracer alone
        logged = logged[~pd.to_numeric(logged["pid"], errors="coerce").isin(set(traced["pid"]))]
    parts = [p for p in (traced, logged) if p is not None and len(p)]
    if not parts:
        return empty("comm_inits")
    return conform(pd.concat(parts, ignore_index=True), "comm_inits")


def _traced(bundle, events: list[dict]) -> pd.DataFrame | None:
    ini = events_frame(events, "comm_init")
    if ini.empty:
        return None
    for c in ("t0", "t1", "pid", "tid", "rank", "nranks", "comm_id_hash", "fn"):
        if c not in ini.columns:
            ini[c] = None
    out = pd.DataFrame({
        "host": bundle.host, "pid": ini["pid"], "tid": ini["tid"], "fn": ini["fn"], "rank": ini["rank"],
        "nranks": ini["nranks"], "comm_id": ini["comm_id_hash"],
        "start_ns": utc_of(bundle.clock, ini["t0"]), "end_ns": utc_of(bundle.clock, ini["t1"]),
        "completed": ini["t1"].notna(), "source": "tracer"})
    out["unreached"] = _unreached(bundle, events, out)
    return out


def _unreached(bundle, events: list[dict], inits: pd.DataFrame) -> pd.Series:
    """Per init row not completed: ``addr:port`` of a connection its process tried after the init
    began and that failed unopened (``sock_state`` SYN_SENT -> CLOSE: refused, timed out), else
    of one still unopened when the tracer's record ends (it entered SYN_SENT and its socket
    changed state no more: its SYNs unanswered, as when packets are dropped; the kernel keeps
    retrying for minutes, longer than a watcher's bundle waits), or NA. A capture's end also
    lists such a socket in ``sockets`` (SYN-SENT), which the detector reads."""
    res = pd.Series(pd.NA, index=inits.index, dtype="object")
    ss = events_frame(events, "sock_state")
    if ss.empty or not {"pid", "daddr", "dport", "oldstate", "newstate", "t"} <= set(ss.columns):
        return res
    ss = ss.assign(ts=utc_of(bundle.clock, ss["t"]))
    failed = ss[(ss["oldstate"] == "SYN_SENT") & (ss["newstate"] == "CLOSE")]
    pending = ss.iloc[0:0]
    if "sk" in ss.columns:
        last = ss.sort_values("t", kind="stable").drop_duplicates("sk", keep="last")
        pending = last[(last["newstate"] == "SYN_SENT") & last["sk"].notna()]
    for i, row in inits[~inits["completed"].astype(bool)].iterrows():
        for cand in (failed, pending):
            tried = cand[(cand["pid"] == row["pid"]) & (cand["ts"] >= row["start_ns"])]
            if len(tried):
                r = tried.iloc[-1]
                res.loc[i] = f"{r['daddr']}:{r['dport']}"
                break
    return res


def _logged(bundle, log_comms: pd.DataFrame | None) -> pd.DataFrame | None:
    """The log's Init START lines, each with its Init COMPLETE (same pid and comm pointer), and
    the COMPLETE lines whose START the log lacks (an excerpt that begins after it): completed."""
    if log_comms is None or log_comms.empty or "status" not in log_comms.columns:
        return None
    lc = log_comms.copy()
    for c in ("pid", "tid", "comm", "rank", "nranks", "comm_id", "func", "ts", "host"):
        if c not in lc.columns:
            lc[c] = None
    start = lc[lc["status"] == "START"]
    done = lc[lc["status"] == "COMPLETE"]
    if start.empty and done.empty:
        return None
    # (pid, comm) of each START among those of the COMPLETEs: one key space (NA a value of its own)
    pc = pd.concat([start[["pid", "comm"]], done[["pid", "comm"]]], ignore_index=True)
    key = pc.groupby(["pid", "comm"], sort=False, dropna=False).ngroup().to_numpy()
    completed = np.isin(key[:len(start)], key[len(start):])
    alone = done[~np.isin(key[len(start):], key[:len(start)])].drop_duplicates(["pid", "comm"])
    start = pd.concat([start, alone], ignore_index=True) if len(alone) else start
    completed = np.concatenate([completed, np.ones(len(alone), bool)])
    host = start["host"].where(start["host"].notna(), bundle.host)
    return pd.DataFrame({
        "host": host, "pid": start["pid"], "tid": start["tid"], "fn": start["func"], "rank": start["rank"],
        "nranks": start["nranks"], "comm_id": start["comm_id"], "start_ns": None, "end_ns": None,
        "completed": completed, "source": "log", "unreached": pd.NA})
