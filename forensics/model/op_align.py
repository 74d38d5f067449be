"""One op numbering per communicator: the tracer's call counts aligned to the job's own.

The tracer counts a communicator's calls in the kernel, per communicator pointer, from 0: from
the communicator's init when its program saw the init, else from the first call it saw (a capture
or watcher that attached to a running job), and again from 0 after every restart of the tracer
(the watcher restarts it when a new NCCL library appears). A watcher's bundle can hold calls of
several programs, each counting from its own start, and a communicator whose init is long out of
the rings: the same number then names different collectives on different ranks, or in one
process before and after a restart.

:func:`tracer_runs` (per bundle) cuts each process's calls on a communicator into *runs*, the
calls one program counted, and says which count from the init (``op_count_source = 'init'``) and
which from an attach (``'attach'``). :func:`align` (all hosts) then shifts each attach run onto
the job's own numbering (NCCL's opCount: the count from the init, which Flight Recorder's
``collective_seq_id`` - 1 and NCCL's COLL lines also give), from the best evidence there is:

1. ``flight_recorder``: PyTorch's record of the same op created nearest each call's entry
   gives its ``collective_seq_id`` - 1 (:func:`_fr_shifts`); call by call, so it comes first.
   ``log``, where no record matched: NCCL's COLL lines name the opCount of the last call a
   process launched on the communicator (``coll_log_ops``); the last run of that process ends
   with the same call when the op agrees and the process had stopped calling (a hang). A job
   only slow (seconds-long collectives under loss) when its capture stopped looks the same,
   and its log went on past the tracer's last call: the log's number is then far too high.
2. ``peers``: a run whose counts are known (init or log) and that overlaps it in time: the same
   collective ends at about the same time on every rank (entries, when no call has an end: the
   watcher traces no returns), so the shift most matched calls agree on is the one (at least
   ``ALIGN_MIN_MATCHES`` calls, ``ALIGN_MIN_SUPPORT`` of them agreeing).
3. across a restart, no known run overlapping: the later program's runs are aligned to each
   other as in 2, then moved as one past the known numbers by the calls the lead process's rate
   puts in the untraced gap (``estimated``: the numbers of one collective agree across ranks,
   its place in the job is an estimate, never colliding with a known number).
4. nothing known on the communicator: its runs are aligned to each other the same way, on the
   run that saw the latest call (the one at the hang), and counted from the first call any of
   them saw (never below 0); ``op_count_source`` stays ``'attach'``: the numbers say which
   collectives are the same across ranks, not which one of the job it was.

A run aligned to nothing keeps no op_count: its calls are its own, never joined to another
rank's by a number that means nothing.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .events import events_frame

ALIGN_MIN_MATCHES = 3        # calls matched by time before a shift is believed
ALIGN_MIN_SUPPORT = 0.6      # share of the matched calls that agree on it

INIT, ATTACH, LOG, FR, PEERS, ESTIMATED = "init", "attach", "log", "flight_recorder", "peers", "estimated"


def tracer_runs(coll: pd.DataFrame, events: list[dict] | pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(tracer_run, op_count_source) of each of one bundle's ``coll`` rows (monotonic ``t0``,
    ``pid``, ``comm``, ``op_count``; index kept). A run of a (pid, comm) ends where its count
    does not go on: it falls or stays (a new program counting from 0), or a program started
    since the previous call and the count is not the next one. ``tracer_run``: the index of the
    program (its ``tracer_start`` mark) that counted the run's first call, distinct per run of
    one (pid, comm). ``'init'``: the first run of a (pid, comm) whose ``comm_init`` (same pid and
    pointer, success) came before the run's first call with no program start in between."""
    idx = coll.index
    run = pd.Series(pd.NA, index=idx, dtype="Int64")
    source = pd.Series(None, index=idx, dtype="object")
    starts_f = events_frame(events, "tracer_start") if isinstance(events, list) else pd.DataFrame()
    starts = np.sort(pd.to_numeric(starts_f.get("t", pd.Series(dtype="float64")), errors="coerce")
                     .dropna().to_numpy(np.float64))
    oc = pd.to_numeric(coll["op_count"], errors="coerce")
    t0 = pd.to_numeric(coll["t0"], errors="coerce")
    ok = oc.notna() & t0.notna() & coll["pid"].notna()
    if not ok.any():
        return run, source
    c = pd.DataFrame({"pid": pd.to_numeric(coll["pid"], errors="coerce")[ok].astype("int64"),
                      "comm": coll["comm"][ok].astype(str), "oc": oc[ok].astype("float64"),
                      "t0": t0[ok].astype("float64")})
    c["prog"] = np.maximum(np.searchsorted(starts, c["t0"].to_numpy(), side="right") - 1, 0) if len(starts) else 0
    c = c.sort_values(["pid", "comm", "t0", "oc"], kind="stable")
    same = (c["pid"].to_numpy()[1:] == c["pid"].to_numpy()[:-1]) & (c["comm"].to_numpy()[1:] == c["comm"].to_numpy()[:-1])
    ocv, prog = c["oc"].to_numpy(), c["prog"].to_numpy()
    brk = np.r_[True, ~same | (ocv[1:] <= ocv[:-1]) | ((prog[1:] != prog[:-1]) & (ocv[1:] != ocv[:-1] + 1))]
    c["unit"] = np.cumsum(brk)
    first = c[brk]
    # a run's number: its program's, moved past an earlier run of the same (pid, comm)
    run_of: dict[int, int] = {}
    last: dict[tuple, int] = {}
    for u, p, cm, pr in zip(first["unit"], first["pid"], first["comm"], first["prog"]):
        r = int(pr) if (p, cm) not in last else max(int(pr), last[(p, cm)] + 1)
        last[(p, cm)] = run_of[int(u)] = r
    c["run"] = c["unit"].map(run_of)
    first_of_comm = first.drop_duplicates(["pid", "comm"])
    inits = events_frame(events, "comm_init") if isinstance(events, list) else pd.DataFrame()
    init_units: set[int] = set()
    if len(inits) and {"pid", "comm", "t0"} <= set(inits.columns):
        rc = pd.to_numeric(inits.get("rc", pd.Series(0, index=inits.index)), errors="coerce")
        i = inits[rc.isna() | rc.isin([0, 7])].dropna(subset=["pid", "comm", "t0"])
        it = {(int(p), str(cm)): float(t) for p, cm, t in zip(i["pid"], i["comm"], pd.to_numeric(i["t0"]))}
        for u, p, cm, t in zip(first_of_comm["unit"], first_of_comm["pid"], first_of_comm["comm"], first_of_comm["t0"]):
            ti = it.get((int(p), cm))
            if ti is not None and ti <= t and not ((starts > ti) & (starts <= t)).any():
                init_units.add(int(u))
    run[c.index] = c["run"].astype("int64").to_numpy()
    source[c.index] = np.where(c["unit"].isin(init_units), INIT, ATTACH)
    return run, source


def align(nccl: pd.DataFrame, coll_log: pd.DataFrame | None = None,
          ended: dict[str, int] | None = None, fr: pd.DataFrame | None = None) -> pd.DataFrame:
    """``nccl`` (every host, one communicator key in ``comm_id_hash``) with each attach run's
    ``op_count`` shifted onto the job's numbering and ``op_count_source`` saying how (the
    module docstring). Rows without ``op_count_source`` (a frame made by hand) count as
    ``init`` where the tracer named their communicator and ``attach`` elsewhere (the caller
    marks them). ``ended``: host -> UTC ns its tracer's coverage ended (a COLL line is believed
    only for a process that made no call for a while before that: :func:`_log_shifts`). ``fr``:
    ``fr_entries`` (Flight Recorder: :func:`_fr_shifts`)."""
    src = nccl["op_count_source"].astype("object") if "op_count_source" in nccl else pd.Series(None, index=nccl.index)
    oc = pd.to_numeric(nccl["op_count"], errors="coerce").astype("float64")
    rel = (src == ATTACH).to_numpy() & oc.notna().to_numpy()
    if not rel.any():
        return nccl
    out = nccl.copy()
    run = pd.to_numeric(out["tracer_run"], errors="coerce").fillna(0) if "tracer_run" in out else 0
    unit = (out["host"].astype(str) + ":" + out["pid"].astype("string").fillna("") + ":"
            + out["comm_ptr"].astype("string").fillna("") + ":" + pd.Series(run, index=out.index).astype(str))
    keys = out["comm_id_hash"].astype("string").fillna(out["host"].astype(str) + ":" + out["pid"].astype("string")
                                                       .fillna("") + ":" + out["comm_ptr"].astype("string").fillna(""))
    new_oc, new_src = oc.copy(), src.copy()
    # Flight Recorder first: each call matched to its own record by time; the COLL log's last
    # line is believed only when the process stopped calling, which a slow job can look like
    shifted = {u: (d, FR) for u, d in _fr_shifts(out, unit, oc, rel, fr).items()}
    for u, d in _log_shifts(out, unit, oc, rel, coll_log, ended or {}).items():
        shifted.setdefault(u, (d, LOG))
    for u, (shift, how) in shifted.items():
        rows = (unit == u).to_numpy()
        new_oc[rows] = oc[rows] + shift
        new_src[rows] = how
    known = ~(new_src == ATTACH).to_numpy()
    for comm in keys[rel].dropna().unique():
        in_comm = (keys == comm).fillna(False).to_numpy(bool)
        pending = [u for u in unit[in_comm & rel & ~np.isin(unit, list(shifted))].unique()]
        refs = list(unit[in_comm & known].unique())
        relative_only = not refs
        if relative_only:   # nothing known: the run at the hang (the latest call) is the reference
            last = out[in_comm].groupby(unit[in_comm])["timestamp_ns"].agg(["max", "size"])
            refs = [last.sort_values(["max", "size"], ascending=False).index[0]]
            pending = [u for u in pending if u != refs[0]]
        for _ in range(2):      # twice: a run aligned in the first pass can carry one that overlaps only it
            for u in list(pending):
                rows = (unit == u).to_numpy() & in_comm
                for r in sorted(refs, key=lambda r: -_overlap(out, unit == r, rows)):
                    ref_rows = (unit == r).to_numpy() & in_comm
                    shift = _shift(out, new_oc, ref_rows, oc, rows)
                    if shift is not None:
                        new_oc[rows] = oc[rows] + shift
                        new_src[rows] = ATTACH if relative_only else PEERS
                        refs.append(u)
                        pending.remove(u)
                        break
        if pending and not relative_only:   # runs of a later program no known run overlaps: across the restart
            pending = _across_restart(out, unit, in_comm, oc, new_oc, new_src, pending)
        for u in pending:       # aligned to nothing: no number
            new_oc[(unit == u).to_numpy() & in_comm] = np.nan
        if relative_only:       # counted from the first call any tracer saw, never below 0
            base = new_oc[in_comm].min()
            if pd.notna(base) and base < 0:
                new_oc[in_comm] -= base
    out["op_count"] = pd.array(new_oc.round(), dtype="Int64")
    out["op_count_source"] = new_src.where(out["op_count"].notna(), None)
    return out


def _across_restart(out, unit, in_comm, oc, new_oc, new_src, pending: list) -> list:
    """Runs no known run overlaps (a program that started after the restart of the tracer,
    every rank's count from 0 again, no COLL line): aligned to each other by time on the one
    with the latest call (the lead), then moved as one past the known numbers: the lead's
    process's last known count, plus the calls its rate before the restart puts in the
    untraced gap (``op_count_source = 'estimated'``). Returns the runs still unaligned."""
    last = out[in_comm].groupby(unit[in_comm])["timestamp_ns"].max()
    lead = max(pending, key=lambda u: (last.get(u, -1), u))
    rows = lambda u: (unit == u).to_numpy() & in_comm           # noqa: E731
    group = {lead: 0.0}
    for u in pending:
        if u != lead:
            d = _shift(out, oc, rows(lead), oc, rows(u))
            if d is not None:
                group[u] = d
    ts = pd.to_numeric(out["timestamp_ns"], errors="coerce").astype("float64")
    proc = lambda u: u.rsplit(":", 1)[0]                         # noqa: E731
    shift = None
    for u in sorted(group, key=lambda u: u != lead):
        first_t = ts[rows(u)].min()
        known = in_comm & (unit.map(proc) == proc(u)).to_numpy() & (new_src != ATTACH).to_numpy() \
            & new_oc.notna().to_numpy() & (ts < first_t).to_numpy()
        if not known.any():
            continue
        first_raw = oc[rows(u)].min() + group[u]
        shift = new_oc[known].max() + 1 + calls_between(ts[known].to_numpy(), first_t) - first_raw
        break
    if shift is None:       # no process with a known run before: after every known number of the comm
        known = in_comm & (new_src != ATTACH).to_numpy() & new_oc.notna().to_numpy()
        shift = new_oc[known].max() + 1 - min(oc[rows(u)].min() + d for u, d in group.items())
    for u, d in group.items():
        new_oc[rows(u)] = oc[rows(u)] + d + shift
        new_src[rows(u)] = ESTIMATED
    return [u for u in pending if u not in group]


LOG_QUIET_NS = 2_000_000_000     # a process this quiet before its capture ended launched nothing after
LOG_QUIET_STEPS = 10             # ... and at least this many of its usual gaps between calls


def calls_between(known: np.ndarray, first_t: float) -> int:
    """How many calls a process made between its last known call (entries ``known``) and its
    call at ``first_t`` (the first after an untraced gap), from its rhythm before the gap. A
    training step's collectives come in bursts (a step's buckets back to back, then compute):
    the bursts are the calls after a gap well above the usual one (3x the median and 30% of
    the 90th percentile), their period and size the medians; the gap holds the bursts its
    length makes, less what the last known burst already had. Calls at an even pace: the
    mean rate."""
    t = np.sort(np.asarray(known, dtype=np.float64))
    if len(t) < 2 or first_t <= t[-1]:
        return 0
    d = np.diff(t)
    thr = max(3 * float(np.median(d)), 0.3 * float(np.percentile(d, 90)))
    starts = np.r_[0, np.flatnonzero(d > thr) + 1]
    if len(starts) >= 3:
        sizes = np.diff(np.r_[starts, len(t)])
        period = float(np.median(np.diff(t[starts])))
        size = float(np.median(sizes[:-1]))
        if period > 0:
            return max(0, int(round((first_t - t[starts[-1]]) / period) * size - sizes[-1]))
    rate = (len(t) - 1) / (t[-1] - t[0]) if t[-1] > t[0] else 0.0
    return max(0, int(round((first_t - t[-1]) * rate)) - 1)


def _log_shifts(out: pd.DataFrame, unit: pd.Series, oc: pd.Series, rel: np.ndarray,
                coll_log: pd.DataFrame | None, ended: dict[str, int]) -> dict[str, float]:
    """unit -> shift from NCCL's COLL lines: the last attach run of a (host, pid, comm pointer)
    ends with the call the log's last line names, when their ops agree and the process had
    stopped calling (a hang): its last call ``LOG_QUIET_NS`` (and ``LOG_QUIET_STEPS`` of its
    gaps) before its tracer stopped covering the host. A job still running when the log was read
    has calls the tracer never saw after its last."""
    if coll_log is None or not len(coll_log) or not rel.any():
        return {}
    log = coll_log.dropna(subset=["pid", "comm_ptr", "last_op_count"])
    if log.empty:
        return {}
    last = {(str(h), int(p), str(c)): (int(n), op) for h, p, c, n, op in
            zip(log["host"], pd.to_numeric(log["pid"]), log["comm_ptr"], log["last_op_count"], log["last_op"])}
    r = out[rel].assign(_u=unit[rel], _oc=oc[rel])
    r = r.sort_values("timestamp_ns", kind="stable")
    shifts = {}
    for (h, p, c), g in r.groupby([r["host"].astype(str), r["pid"], r["comm_ptr"].astype(str)], sort=False):
        ent = last.get((h, int(p), c))
        if ent is None:
            continue
        u = g["_u"].iloc[-1]                     # the process's last run
        run = g[g["_u"] == u].sort_values("_oc")
        lastcall = run.iloc[-1]
        t = pd.to_numeric(run["timestamp_ns"], errors="coerce").dropna()
        step = float(np.median(np.diff(np.unique(t.to_numpy())))) if t.nunique() > 1 else 0.0
        end = ended.get(h)
        if end is None or not len(t) or end - t.max() < max(LOG_QUIET_NS, LOG_QUIET_STEPS * step):
            continue
        n, op = ent
        if op is not None and not pd.isna(op) and _op_name(op) != _op_name(lastcall["op"]):
            continue
        if n - lastcall["_oc"] >= 0:
            shifts[u] = float(n - lastcall["_oc"])
    return shifts


def _fr_shifts(out: pd.DataFrame, unit: pd.Series, oc: pd.Series, rel: np.ndarray,
               fr: pd.DataFrame | None) -> dict[str, float]:
    """unit -> shift from Flight Recorder: PyTorch records each collective it enqueues
    (``collective_seq_id`` from 1: op_count + 1 on the communicator behind its process group)
    just before it calls NCCL, so a call of an attach run and the record of the same op created
    nearest to its entry (within half the time between two of the process's calls) are the same
    collective; the shift most matched calls agree on (at least ``ALIGN_MIN_MATCHES``, with
    ``ALIGN_MIN_SUPPORT``)."""
    if fr is None or not len(fr) or not rel.any() or not {"pid", "collective_seq_id", "time_created_ns"} <= set(fr):
        return {}
    f = fr[(fr["is_p2p"] != True) & fr["collective_seq_id"].notna() & fr["time_created_ns"].notna()  # noqa: E712
           & fr["pid"].notna()]
    if f.empty:
        return {}
    f = pd.DataFrame({"host": f["host"].astype(str), "pid": pd.to_numeric(f["pid"]).astype("int64"),
                      "t": pd.to_numeric(f["time_created_ns"]).astype("float64"), "op": f["op"].map(_op_name).astype(object),
                      "ref_oc": pd.to_numeric(f["collective_seq_id"]).astype("float64") - 1})
    shifts = {}
    for u in unit[rel].unique():
        rows = out[(unit == u).to_numpy() & rel]
        host, pid = str(rows["host"].iloc[0]), rows["pid"].iloc[0]
        if pd.isna(pid):
            continue
        r = f[(f["host"] == host) & (f["pid"] == int(pid))].sort_values("t")
        q = pd.DataFrame({"t": pd.to_numeric(rows["timestamp_ns"], errors="coerce").astype("float64"),
                          "op": rows["op"].map(_op_name).astype(object), "oc": oc[rows.index]}).dropna().sort_values("t")
        if len(r) < ALIGN_MIN_MATCHES or len(q) < ALIGN_MIN_MATCHES:
            continue
        gaps = np.diff(np.unique(q["t"].to_numpy()))
        tol = max(float(np.median(gaps)) / 2 if len(gaps) else 1e6, 1e5)
        m = pd.merge_asof(q, r[["t", "op", "ref_oc"]], on="t", by="op", direction="nearest",
                          tolerance=tol).dropna(subset=["ref_oc"])
        if len(m) < ALIGN_MIN_MATCHES:
            continue
        d = (m["ref_oc"] - m["oc"]).value_counts()
        if d.iloc[0] >= ALIGN_MIN_SUPPORT * len(m) and d.index[0] >= 0:
            shifts[u] = float(d.index[0])
    return shifts


def _op_name(op) -> str:
    """ALL_REDUCE / AllReduce / allreduce -> allreduce."""
    return str(op).replace("_", "").lower()


def _overlap(out: pd.DataFrame, a, b) -> float:
    ta, tb = out.loc[np.asarray(a), "timestamp_ns"], out.loc[np.asarray(b), "timestamp_ns"]
    if not len(ta) or not len(tb):
        return 0.0
    return float(max(0, min(ta.max(), tb.max()) - max(ta.min(), tb.min())))


def _shift(out: pd.DataFrame, ref_oc: pd.Series, ref_rows: np.ndarray, oc: pd.Series, rows: np.ndarray) -> float | None:
    """The shift that puts ``rows``' counts (``oc``) onto ``ref_rows``' (``ref_oc``), matching
    calls of the same op and count that ended (else were entered) nearest; None without
    agreement."""
    q_rows, r_rows = out[rows], out[ref_rows]
    at = "end_ns" if (pd.to_numeric(q_rows["end_ns"], errors="coerce").notna().sum() >= ALIGN_MIN_MATCHES
                      and pd.to_numeric(r_rows["end_ns"], errors="coerce").notna().sum() >= ALIGN_MIN_MATCHES) \
        else "timestamp_ns"
    r = _frame(r_rows, at, ref_oc, "ref_oc")
    q = _frame(q_rows, at, oc, "oc")
    if not len(q) or not len(r):
        return None
    if at == "end_ns":
        ends = np.unique(r["t"].to_numpy())     # calls synced by one wait share their end
        gap = float(np.median(np.diff(ends))) if len(ends) > 1 else 1e9
    else:   # entries: half the time between two calls of one kind (a step), straggle within it
        steps = r.groupby(["op", "count"])["t"].diff().dropna()
        gap = float(steps.median()) if len(steps) else 1e9
    m = pd.merge_asof(q, r, on="t", by=["op", "count"], direction="nearest",
                      tolerance=max(gap / 2, 1e6)).dropna(subset=["ref_oc"])
    if len(m) < ALIGN_MIN_MATCHES:
        return None
    d = (m["ref_oc"] - m["oc"]).value_counts()
    return float(d.index[0]) if d.iloc[0] >= ALIGN_MIN_SUPPORT * len(m) else None


def _frame(rows: pd.DataFrame, at: str, oc: pd.Series, name: str) -> pd.DataFrame:
    """One run's calls for :func:`_shift`: time ``t`` (column ``at``), op, count, op_count."""
    return pd.DataFrame({"t": pd.to_numeric(rows[at], errors="coerce").astype("float64"),
                         "op": rows["op"].astype(str),
                         "count": pd.to_numeric(rows["count"], errors="coerce").astype("float64"),
                         name: oc[rows.index]}).dropna().sort_values("t")
