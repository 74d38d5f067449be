"""``nccl_events`` from the tracer's ``coll`` records, with the best duration per rank.

NCCL calls are asynchronous: uprobe entry->return is the launch, not the collective.
Durations, best first:

- ``gpu``: Flight Recorder / NCCL Inspector / profiler-plugin execution times, applied
  after this module by :mod:`forensics.model.gpu_times` (mapping of collective_seq_id /
  coll_sn / SeqNum onto op_count and its limits documented there);
- ``host_sync``: the first host wait (cudaStreamSynchronize & co.) on the same stream of
  the same process that *started after the call returned* must have waited for the
  collective (streams run in order), so its return bounds the collective's end from
  above. Device-wide waits (cudaDeviceSynchronize, cuCtxSynchronize) count for every
  stream. A wait that started but never returned means the collective never completed:
  end and duration are NULL and ``completed`` is false;
- ``call``: entry->return of the call itself, when the process shows no host waits.

All of it is merge_asof over sorted columns, no per-event Python loop.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import op_align
from .events import events_frame, utc_of
from .schema import conform, empty

# ncclDataType_t -> (name, bytes per element)
DATATYPES = {0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
             6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("fp8e4m3", 1),
             11: ("fp8e5m2", 1)}
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
DEVICE_WIDE_WAITS = {"cudaDeviceSynchronize", "cuCtxSynchronize"}


def unify_comm_ids(nccl: pd.DataFrame, log_comms: dict[str, pd.DataFrame],
                   coll_log: pd.DataFrame | None = None, ended: dict[str, int] | None = None,
                   fr: pd.DataFrame | None = None) -> pd.DataFrame:
    """One communicator key across hosts. The tracer names a communicator by the hash it took
    at ``ncclCommInitRank``; a tracer that attached later (a late or staggered capture) saw
    no init and knows only the comm pointer, which differs per process. NCCL's Init lines
    (``log_comms``: each host's ``nccl_comms`` table) map a pointer to NCCL's own commId,
    the same on every rank. The key: the tracer's hash where any host's tracer saw the init
    (a host that has both tells which commId it is), else NCCL's commId; nranks and the
    communicator rank are filled from the Init lines where the tracer lacks them. Then every
    run of calls counted from an attach gets the job's numbering (:func:`.op_align.align`;
    ``coll_log``: ``coll_log_ops``, NCCL's COLL lines; ``ended``: host -> the end of its tracer's coverage, UTC ns; ``fr``: ``fr_entries``)."""
    if nccl.empty:
        return nccl
    nccl = _mark_relative(nccl)
    if not log_comms:
        return op_align.align(nccl, coll_log, ended, fr)
    parts = []
    for host, c in log_comms.items():
        if c is None or c.empty or "comm_id" not in c:
            continue
        c = c.dropna(subset=["comm", "comm_id"])
        parts.append(pd.DataFrame({"host": host, "comm_ptr": c["comm"].astype(str), "log_pid": c["pid"],
                                   "log_id": c["comm_id"].astype(str).str.lower(),
                                   "log_nranks": pd.to_numeric(c["nranks"], errors="coerce"),
                                   "log_rank": pd.to_numeric(c["rank"], errors="coerce")}))
    if not parts:
        return op_align.align(nccl, coll_log, ended, fr)
    m = pd.concat(parts, ignore_index=True).drop_duplicates(["host", "comm_ptr", "log_pid", "log_id"])
    key = nccl[["host", "comm_ptr", "pid"]].astype({"comm_ptr": "string"})
    j = key.reset_index().merge(m, on=["host", "comm_ptr"], how="left")
    # one pointer in two processes of a host: the Init line of the same pid decides
    j = j[j["log_pid"].isna() | (j.groupby("index")["log_id"].transform("nunique") <= 1)
          | (pd.to_numeric(j["log_pid"], errors="coerce") == pd.to_numeric(j["pid"], errors="coerce"))]
    j = j.drop_duplicates("index").set_index("index").reindex(nccl.index)
    log_id = j["log_id"].astype("string")
    tracer = nccl["comm_id_hash"].astype("string")
    both = pd.DataFrame({"log": log_id, "tracer": tracer}).dropna()
    to_tracer = both.drop_duplicates("log").set_index("log")["tracer"] if len(both) else pd.Series(dtype="string")
    out = nccl.copy()
    out["comm_id_hash"] = tracer.fillna(log_id.map(to_tracer).astype("string")).fillna(log_id)
    out["nranks"] = out["nranks"].fillna(j["log_nranks"].astype("Int64"))
    return op_align.align(out, coll_log, ended, fr)


def _mark_relative(nccl: pd.DataFrame) -> pd.DataFrame:
    """Rows with no ``op_count_source`` (a frame not made by :func:`nccl_events`): ``init``
    where the tracer named the communicator (it saw the init), else ``attach``."""
    src = nccl["op_count_source"] if "op_count_source" in nccl else pd.Series(None, index=nccl.index, dtype="object")
    miss = src.isna() & pd.to_numeric(nccl["op_count"], errors="coerce").notna()
    if not miss.any():
        return nccl
    out = nccl.copy()
    out["op_count_source"] = src.astype("object").where(~miss, np.where(out["comm_id_hash"].notna(), op_align.INIT,
                                                                         op_align.ATTACH))
    return out


def world_ranks(nccl: pd.DataFrame) -> pd.DataFrame:
    """(host, pid) -> global_rank: a process's rank on the largest communicator it belongs to
    (the world). ``nccl_events.rank`` is the rank *within* a communicator: on
    sub-communicators several processes share one; TCP events carry the global rank. A
    communicator's size is its nranks, else the ranks seen on it (nranks NULL: unknown or
    rejected). The findings and the report both name ranks through this one rule."""
    n = nccl.dropna(subset=["rank", "pid"])
    if n.empty:
        return pd.DataFrame(columns=["host", "pid", "global_rank"])
    k = n[["comm_id_hash", "rank", "nranks", "host", "pid"]].drop_duplicates()
    seen = k.groupby(k["comm_id_hash"].astype(str))["rank"].transform("nunique")
    k = k.assign(nranks=pd.to_numeric(k["nranks"], errors="coerce").fillna(seen.astype("float64")))
    w = k.sort_values("nranks", kind="stable", na_position="first").drop_duplicates(["host", "pid"], keep="last")
    return w.rename(columns={"rank": "global_rank"})[["host", "pid", "global_rank"]].reset_index(drop=True)


def process_ranks(bundle, events: list[dict], log_comms: pd.DataFrame | None = None) -> dict[int, int]:
    """pid -> global rank on one host: THE rule every table uses (tcp_events, offcpu, stacks,
    sockets, nccl_config, Flight Recorder entries, the state at capture).

    A process's global rank is NCCL's own rank on the largest communicator it belongs to
    (the world), as :func:`world_ranks` has it for ``nccl_events``: from the tracer's
    ``comm_init`` and the NCCL_DEBUG log's ``Init`` lines (``log_comms``: the parser's
    ``nccl_comms``), the row of the largest nranks; a NULL nranks (a split child whose size
    the tracer cannot read) counts below every known size; at equal sizes the tracer wins.
    Without either, the manifest's RANK (torchrun's global rank: the same number for a
    PyTorch job, and the only one a capture that started after init and has no log knows)."""
    ranks = {p.pid: p.rank for p in bundle.manifest.processes if p.rank is not None}
    parts = []
    inits = events_frame(events, "comm_init")
    if len(inits) and {"pid", "rank", "nranks"} <= set(inits.columns):
        parts.append(pd.DataFrame({"pid": inits["pid"], "rank": inits["rank"], "nranks": inits["nranks"], "src": 1}))
    if log_comms is not None and len(log_comms) and {"pid", "rank", "nranks"} <= set(log_comms.columns):
        parts.append(pd.DataFrame({"pid": log_comms["pid"], "rank": log_comms["rank"], "nranks": log_comms["nranks"],
                                   "src": 0}))
    if parts:
        c = pd.concat(parts, ignore_index=True)
        c = c.assign(pid=pd.to_numeric(c["pid"], errors="coerce"), rank=pd.to_numeric(c["rank"], errors="coerce"),
                     nranks=pd.to_numeric(c["nranks"], errors="coerce").fillna(-1)).dropna(subset=["pid", "rank"])
        c = c.sort_values(["pid", "nranks", "src"], kind="stable")
        for pid, rank in c.groupby("pid")["rank"].last().items():
            ranks[int(pid)] = int(rank)
    return ranks


def nccl_events(bundle, events: list[dict], ranks: dict[int, int] | None = None) -> pd.DataFrame:
    """``nccl_events`` of one bundle; ``ranks``: :func:`process_ranks` (computed here when not given)."""
    coll = events_frame(events, "coll")
    if coll.empty:
        return empty("nccl_events")
    for c in ("t1", "rank", "nranks", "comm_id_hash", "op_count", "count", "datatype", "red_op", "root", "stream",
              "rc", "comm", "tid", "fn"):
        if c not in coll.columns:
            coll[c] = None
    coll = coll.dropna(subset=["t0", "pid"]).copy()
    _validate_ids(bundle, coll)
    clock = bundle.clock
    coll["timestamp_ns"] = utc_of(clock, coll["t0"])
    coll["call_return_ns"] = utc_of(clock, coll["t1"])
    # rank of communicators created before the tracer attached: the process's rank
    pid_rank = process_ranks(bundle, events) if ranks is None else ranks
    rank = pd.to_numeric(coll["rank"], errors="coerce")
    coll["rank"] = rank.fillna(coll["pid"].map(pid_rank))
    dt = pd.to_numeric(coll["datatype"], errors="coerce")
    coll["datatype_name"] = dt.map(lambda d: DATATYPES.get(d, (None, None))[0] if pd.notna(d) else None)
    size = dt.map(lambda d: DATATYPES.get(d, (None, None))[1] if pd.notna(d) else None)
    coll["bytes"] = pd.to_numeric(coll["count"], errors="coerce") * pd.to_numeric(size, errors="coerce")
    red = pd.to_numeric(coll["red_op"], errors="coerce")
    coll["reduce_op"] = red.map(lambda r: REDOPS.get(int(r), f"op{int(r)}") if pd.notna(r) and r >= 0 else None)
    root = pd.to_numeric(coll["root"], errors="coerce")
    coll["root_or_peer"] = root.where(root >= 0)

    end, source, completed = _host_sync_end(coll, events_frame(events, "host_wait"))
    # a wait that returns because the communicator was aborted did not see the collective finish
    aborted = _aborted_before(coll, end, events_frame(events, "comm_destroy"))
    end = end.where(~aborted)
    completed = completed & ~aborted
    coll["t_end"] = end
    coll["duration_source"] = source
    coll["completed"] = completed
    coll["end_ns"] = utc_of(clock, coll["t_end"])
    coll["duration_ns"] = coll["end_ns"] - coll["timestamp_ns"]
    out = pd.DataFrame({
        "timestamp_ns": coll["timestamp_ns"], "duration_ns": coll["duration_ns"],
        "duration_source": coll["duration_source"], "end_ns": coll["end_ns"], "op": coll["op"], "rank": coll["rank"],
        "nranks": coll["nranks"], "comm_id_hash": coll["comm_id_hash"], "comm_ptr": coll["comm"],
        "op_count": coll["op_count"], "count": coll["count"], "bytes": coll["bytes"],
        "datatype": coll["datatype_name"], "reduce_op": coll["reduce_op"], "root_or_peer": coll["root_or_peer"],
        "stream": coll["stream"], "host": bundle.host, "pid": coll["pid"], "tid": coll["tid"],
        "call_return_ns": coll["call_return_ns"], "completed": coll["completed"], "rc": coll["rc"], "fn": coll["fn"],
    })
    run, source = op_align.tracer_runs(coll, events)
    out["tracer_run"], out["op_count_source"] = run, source
    out = conform(out, "nccl_events")
    return out.sort_values(["timestamp_ns", "rank"], kind="stable", na_position="last").reset_index(drop=True)


COMM_ID_RE = r"^0x[0-9a-f]{1,16}$"   # the tracer writes the 64-bit commHash as 0x + lowercase hex
MAX_NRANKS = 1 << 20                 # no NCCL job has more ranks; larger is a corrupt or hostile bundle


def _validate_ids(bundle, coll: pd.DataFrame) -> None:
    """In place: a comm_id_hash that is not ``0x`` + 1-16 lowercase hex digits, or an nranks
    outside 1..MAX_NRANKS, becomes NULL, with one problem line per column (they end up in
    SQL text and in ``range(nranks)``)."""
    ids = coll["comm_id_hash"]
    text = ids.astype("string")
    bad = ids.notna() & ~text.str.fullmatch(COMM_ID_RE).fillna(False).astype(bool)
    if bad.any():
        bundle.problems.append(f"tracer: {int(bad.sum())} NCCL call(s) with a malformed comm_id_hash "
                               f"(e.g. {str(ids[bad].iloc[0])[:40]!r}) read as unknown")
        coll["comm_id_hash"] = ids.where(~bad, None)
    nr = pd.to_numeric(coll["nranks"], errors="coerce")
    bad = coll["nranks"].notna() & ~((nr >= 1) & (nr <= MAX_NRANKS)).fillna(False)
    if bad.any():
        bundle.problems.append(f"tracer: {int(bad.sum())} NCCL call(s) with nranks outside 1..{MAX_NRANKS} "
                               "read as unknown")
        coll["nranks"] = nr.where(~bad)


def _host_sync_end(coll: pd.DataFrame, waits: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(end monotonic ns, duration source, completed) per call; see the module docstring."""
    idx = coll.index
    t1 = pd.to_numeric(coll["t1"], errors="coerce")
    call_end = t1
    end = pd.Series(np.nan, index=idx)
    found = pd.Series(False, index=idx)
    pending = pd.Series(False, index=idx)
    if len(waits) and "t0" in waits.columns:
        waits = waits.copy()
        for c in ("t1", "stream", "fn"):
            if c not in waits.columns:
                waits[c] = None
        waits["w0"] = pd.to_numeric(waits["t0"], errors="coerce")
        waits["w1"] = pd.to_numeric(waits["t1"], errors="coerce")
        waits = waits.dropna(subset=["w0", "pid"])
        if "rc" in waits.columns:   # a failed wait (cudaErrorLaunchFailure...) proves nothing finished
            bad = pd.to_numeric(waits["rc"], errors="coerce").fillna(0) != 0
            waits.loc[bad, "w1"] = np.nan
        left = pd.DataFrame({"row": np.arange(len(coll)), "pid": coll["pid"].astype("int64").to_numpy(),
                             "stream": coll["stream"].astype(str).to_numpy(),
                             # a call that never returned was never enqueued past that point; one
                             # whose return is not traced (returned null: the watcher, --no-call-
                             # returns) is bounded by the first wait that started after its entry
                             "key": t1.fillna(_untraced_entry(coll)).fillna(np.inf).to_numpy(dtype=np.float64)})
        cands = []
        per_stream = waits[~waits["fn"].isin(DEVICE_WIDE_WAITS) & waits["stream"].notna()]
        if len(per_stream):
            r = pd.DataFrame({"pid": per_stream["pid"].astype("int64").to_numpy(),
                              "stream": per_stream["stream"].astype(str).to_numpy(),
                              "key": per_stream["w0"].to_numpy(dtype=np.float64),
                              "w1": per_stream["w1"].to_numpy(dtype=np.float64)})
            cands.append(_asof_forward(left, r, ["pid", "stream"]))
        dev = waits[waits["fn"].isin(DEVICE_WIDE_WAITS)]
        if len(dev):
            r = pd.DataFrame({"pid": dev["pid"].astype("int64").to_numpy(),
                              "key": dev["w0"].to_numpy(dtype=np.float64),
                              "w1": dev["w1"].to_numpy(dtype=np.float64)})
            cands.append(_asof_forward(left.drop(columns="stream"), r, ["pid"]))
        for c in cands:   # per call: the earliest wait that started after it (by start time)
            has = c["matched"].to_numpy()
            w1 = c["w1"].to_numpy()
            better = has & (~found.to_numpy() | (np.nan_to_num(w1, nan=np.inf) < end.fillna(np.inf).to_numpy()))
            end = end.where(~better, pd.Series(w1, index=idx))
            pending = pending.where(~better, pd.Series(has & np.isnan(w1), index=idx))
            found = found | pd.Series(has, index=idx)
    source = pd.Series("call", index=idx, dtype="object")
    source[found] = "host_sync"
    end_final = end.where(found, call_end)
    # completion observed: a returned wait bounds it; a process that never waits is
    # trusted once the call returned; in one that does wait, a call no wait followed
    # (the capture or the process ended first) keeps its launch time but is not "completed"
    waiting_pids = set(waits["pid"].astype("int64")) if len(waits) and "pid" in waits.columns else set()
    never_waits = ~coll["pid"].astype("int64").isin(waiting_pids)
    completed = (found & ~pending) | (~found & t1.notna() & never_waits)
    end_final = end_final.where(~(found & pending))
    return end_final, source, completed


def _untraced_entry(coll: pd.DataFrame) -> pd.Series:
    """The entry (t0) of each call whose return the tracer does not trace (``returned`` null),
    NaN for the others: a wait its thread starts after it comes after its return."""
    t0 = pd.to_numeric(coll["t0"], errors="coerce").astype("float64")
    if "returned" not in coll:
        return pd.Series(np.nan, index=coll.index)
    return t0.where(coll["returned"].isna())


def _aborted_before(coll: pd.DataFrame, end: pd.Series, destroys: pd.DataFrame) -> pd.Series:
    """True where the process aborted the call's communicator (ncclCommAbort) after the
    call was entered and before its bounding wait returned (or with no end at all)."""
    out = pd.Series(False, index=coll.index)
    if destroys.empty or not {"fn", "t0", "pid", "comm"} <= set(destroys.columns):
        return out
    ab = destroys[destroys["fn"] == "ncclCommAbort"].dropna(subset=["t0", "pid", "comm"])
    if ab.empty:
        return out
    left = pd.DataFrame({"row": np.arange(len(coll)), "pid": coll["pid"].astype("int64").to_numpy(),
                         "comm": coll["comm"].astype(str).to_numpy(),
                         "key": pd.to_numeric(coll["t0"], errors="coerce").to_numpy(dtype=np.float64)})
    right = pd.DataFrame({"pid": ab["pid"].astype("int64").to_numpy(), "comm": ab["comm"].astype(str).to_numpy(),
                          "key": pd.to_numeric(ab["t0"]).to_numpy(dtype=np.float64)})
    right["abort_t0"] = right["key"]
    m = _asof_forward(left, right, ["pid", "comm"])
    abort_t0 = m["abort_t0"].to_numpy(dtype=np.float64)
    e = end.to_numpy(dtype=np.float64)
    hit = m["matched"].to_numpy() & (np.isnan(e) | (e >= abort_t0))
    return pd.Series(hit, index=coll.index)


def _asof_forward(left: pd.DataFrame, right: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """For each left row, the first right row (same ``by``) with right.key >= left.key."""
    lft = left.sort_values("key", kind="stable")
    rgt = right.sort_values("key", kind="stable").rename(columns={"key": "rkey"})
    rgt["matched"] = True
    m = pd.merge_asof(lft, rgt, left_on="key", right_on="rkey", by=by, direction="forward", allow_exact_matches=True)
    m = m.sort_values("row", kind="stable").reset_index(drop=True)
    m["matched"] = m["matched"].fillna(False).astype(bool)
    return m


# the collectives table, from nccl_events and capture_windows (both loaded first: database.FIRST)
COLLECTIVES_SQL = """
WITH e AS (
  SELECT coalesce(comm_id_hash, host || ':' || CAST(pid AS VARCHAR) || ':' || comm_ptr) AS comm_id_hash,
         op_count, op, nranks, rank, timestamp_ns, end_ns, completed, bytes, host
  -- a call of no known rank (its communicator made before the tracer attached, no RANK in its
  -- environment) has no place in the per-rank lists
  FROM nccl_events WHERE op_count IS NOT NULL AND rank IS NOT NULL
), hw AS (
  -- what each host watched: its tracer's window, else its capture's (model/windows.host_windows)
  SELECT host, min(first_ns) AS first_ns, max(last_ns) AS last_ns FROM capture_windows
  WHERE kind IN ('tracer', 'capture') GROUP BY host, kind
  QUALIFY row_number() OVER (PARTITION BY host ORDER BY kind = 'tracer' DESC) = 1
), members AS (
  SELECT comm_id_hash, host, count(DISTINCT rank) AS n FROM e WHERE host IS NOT NULL GROUP BY ALL
), entered AS (
  SELECT comm_id_hash, op_count, host, count(DISTINCT rank) AS n FROM e WHERE host IS NOT NULL GROUP BY ALL
), g AS (
  SELECT comm_id_hash, op_count,
         mode(op) AS op, count(DISTINCT op) > 1 AS ops_differ,
         max(nranks) AS nranks,
         count(DISTINCT rank) AS ranks_entered,
         count(DISTINCT rank) FILTER (WHERE completed) AS ranks_completed,
         list(rank ORDER BY rank) AS ranks,
         list(timestamp_ns ORDER BY rank) AS entry_ns,
         list(end_ns ORDER BY rank) AS end_ns,
         list(timestamp_ns - min_entry ORDER BY rank) AS lateness_ns,
         min(timestamp_ns) AS first_entry_ns, max(timestamp_ns) AS last_entry_ns,
         max(timestamp_ns) - min(timestamp_ns) AS max_lateness_ns,
         arg_max(rank, timestamp_ns) AS latest_rank,
         max(end_ns) AS last_end_ns, max(bytes) AS bytes
  FROM (SELECT *, min(timestamp_ns) OVER (PARTITION BY comm_id_hash, op_count) AS min_entry FROM e)
  GROUP BY comm_id_hash, op_count
), u AS (
  -- ranks absent because no capture watched them: the communicator's ranks on each host whose
  -- window does not hold the collective's span (first entry to last end, else last entry)
  SELECT g.comm_id_hash, g.op_count, CAST(sum(m.n - coalesce(en.n, 0)) AS INTEGER) AS ranks_unwatched
  FROM g JOIN members m USING (comm_id_hash) JOIN hw ON hw.host = m.host
  LEFT JOIN entered en ON en.comm_id_hash = g.comm_id_hash AND en.op_count = g.op_count AND en.host = m.host
  WHERE NOT (hw.first_ns <= g.first_entry_ns AND coalesce(g.last_end_ns, g.last_entry_ns) <= hw.last_ns)
  GROUP BY ALL
)
SELECT comm_id_hash, op_count, op, nranks, ranks_entered, ranks_completed, coalesce(ranks_unwatched, 0) AS ranks_unwatched,
       ranks, entry_ns, end_ns, lateness_ns,
       -- a communicator size far beyond the ranks seen is not trusted to list the missing
       -- ones (the same rule as model.progress.communicator_members)
       CASE WHEN nranks IS NULL OR nranks > greatest(65536, 4 * ranks_entered) THEN NULL
            ELSE list_filter(range(nranks), lambda x: NOT list_contains(ranks, x)) END AS missing_ranks,
       first_entry_ns, last_entry_ns, max_lateness_ns, latest_rank, last_end_ns, bytes, ops_differ
FROM g LEFT JOIN u USING (comm_id_hash, op_count)
"""
