"""GPU-side collective times (Flight Recorder, NCCL Inspector) mapped onto ``nccl_events``.

``nccl_events`` rows come from the tracer (call entry/return, host waits). Where a
process also left a Flight Recorder dump or Inspector records, those give the
collective's real execution time, and the row's ``duration_source`` becomes ``'gpu'``
(``gpu_source`` says which). Preference, per row: Inspector with kernel timing
(``kernel_gpu``/``kernel_cpu``), the example profiler plugin's kernel GPU clocks,
Flight Recorder ``duration_ms`` (CUDA events,
``TORCH_NCCL_ENABLE_TIMING``), Flight Recorder ``time_discovered_completed_ns -
time_discovered_started_ns`` (watchdog discovery: coarse, both needed). Inspector
``collective_cpu`` timing and a Flight Recorder entry with only a completion time are
not GPU times and change nothing.

For a ``'gpu'`` row ``duration_ns`` is the execution time itself, not ``end_ns -
timestamp_ns`` (the call may wait on its stream first); ``end_ns`` becomes the later of
the completion bound already known (Flight Recorder discovery, else the host wait /
call return) and ``timestamp_ns + duration_ns``; ``completed`` becomes true.

The mapping, and its limits:

- Flight Recorder: a process group's ``collective_seq_id`` counts its collectives from 1,
  one per kernel launch; ``op_count`` counts the communicator's collectives from 0. So
  entry ``seq`` is ``op_count = seq - 1`` on the communicator behind the group. Which
  communicator that is, is not in the dump: for each (host, rank, pg_id) the
  communicator of that rank whose ops agree with the most entries (same op at
  ``op_count = seq - 1``) is taken, and entries whose op disagrees are left unmapped.
  Rows are joined on (host, rank): the dump's rank is the global rank. Limits: p2p
  entries (their own ``p2p_seq_id``), coalesced groups and a group whose NCCL
  communicator also carries ops issued outside PyTorch shift the count; they are left
  unmapped or caught by the op check, not mis-timed silently.
- Inspector: ``coll_sn`` is NCCL's per-communicator *per-collective-type* counter
  (``comm->seqNumber[func]``, from 0), so a record maps to the ``coll_sn``-th call of
  that op on the communicator, counted over ``nccl_events`` in op_count order. The
  Inspector's comm id (``commHash``) is not the tracer's ``comm_id_hash``, so the
  communicator is chosen per (host, pid, Inspector comm) by the most agreeing records,
  as above. Limit: the count is exact only if the tracer saw the communicator's init
  (its calls carry a comm_id_hash); calls on communicators created before the tracer
  attached get no GPU time at all, and a problem line says so (FR likewise).
- Example profiler plugin (Chrome trace): its COLL ``e`` means *enqueued*, so the COLL
  span is not used; the collective's GPU time is ``max(StopGpuClk) - min(StartGpuClk)``
  over its ``KernelCh`` events (GPU globaltimer ns, one per channel). The plugin writes
  an event's children right after it, so a KernelCh belongs to the last COLL ``b``
  before it in the file (same pid/tid). ``SeqNum`` is the same per-type counter as
  ``coll_sn`` and maps the same way; kernels with a zero stop clock (never finished)
  are ignored.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ..parsers.nccl_coll import op_enum
from .schema import conform, empty

GPU_TIMING = ("kernel_gpu", "kernel_cpu")


def fr_entries(bundle, arts, ranks: dict[int, int], table: str = "fr_entries") -> pd.DataFrame:
    """The dumps' ``fr_entries`` (or ``fr_pg_status``) with host and the pid of the dump's rank."""
    df = arts.table("flight_recorder", table)
    if df.empty:
        return empty(table)
    rank_pid = {}
    for pid, r in ranks.items():
        rank_pid.setdefault(r, pid)
    df["host"] = bundle.host
    df["pid"] = pd.to_numeric(df["rank"], errors="coerce").map(rank_pid)
    return conform(df, table)


def inspector_records(bundle, arts) -> pd.DataFrame:
    df = arts.table("nccl_inspector", "inspector_coll")
    if df.empty:
        return df
    return df.assign(host=bundle.host, gpu_source="inspector")


def profiler_records(bundle, arts) -> pd.DataFrame:
    """Per COLL of the example profiler plugin's traces: Inspector-shaped rows (host, pid,
    kind, op, seq, comm_id, exec_time_us, timing_source) from its KernelCh GPU clocks."""
    parts = []
    for rel, res in arts.of("nccl_profiler_trace"):
        ev = res.tables.get("profiler_events")
        if ev is None or ev.empty:
            continue
        ev = ev.reset_index(drop=True)
        # cat and ph are nullable strings: an event without one compares NA, taken as no match
        began = ev["ph"].eq("b").fillna(False).to_numpy(bool)
        is_coll = ev["cat"].eq("COLL").fillna(False).to_numpy(bool) & began
        owner = pd.Series(np.where(is_coll, ev.index, np.nan), index=ev.index)
        ev["coll_row"] = owner.groupby([ev["pid"], ev["tid"]], dropna=False).ffill()
        k = ev[ev["cat"].eq("GPU").fillna(False).to_numpy(bool) & began & ev["coll_row"].notna().to_numpy()]
        if k.empty:
            continue
        clk = [_clocks(a) for a in k["args"]]
        # GPU clocks are ~1.8e18 ns: integers, float64 would round them to 256 ns
        k = k.assign(start=pd.array([c[0] for c in clk], dtype="Int64"),
                     stop=pd.array([c[1] for c in clk], dtype="Int64")).dropna(subset=["start", "stop"])
        k = k[(k["stop"] > 0) & (k["stop"] >= k["start"])]
        if k.empty:
            continue
        span = k.groupby("coll_row").agg(start=("start", "min"), stop=("stop", "max"))
        coll = ev.loc[span.index.astype(int)]
        parts.append(pd.DataFrame({
            "host": bundle.host, "pid": coll["pid"].to_numpy(), "kind": "coll", "op": coll["name"].map(_op).to_numpy(),
            "seq": coll["seq"].to_numpy(), "comm_id": coll["comm_hash"].to_numpy(), "nranks": pd.NA,
            "exec_time_us": ((span["stop"] - span["start"]).astype("int64") / 1e3).to_numpy(),
            "timing_source": "kernel_gpu",
            "gpu_source": "profiler"}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _clocks(args) -> tuple[int | None, int | None]:
    try:
        a = json.loads(args) if isinstance(args, str) else {}
    except ValueError:
        return None, None
    start, stop = a.get("StartGpuClk"), a.get("StopGpuClk")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63 for v in (start, stop))
    return (start, stop) if ok else (None, None)


def _op(name):
    return op_enum(name) if isinstance(name, str) else None


def _comm_key(nccl: pd.DataFrame) -> pd.Series:
    return nccl["comm_id_hash"].astype("string").fillna(nccl["comm_ptr"].astype("string"))


def _best_pairing(matches: pd.DataFrame, src_key: list[str]) -> pd.DataFrame:
    """Per source group (``src_key``), the nccl communicator with the most agreeing rows."""
    if matches.empty:
        return matches
    n = matches.groupby(src_key + ["comm"], dropna=False).size().rename("agree").reset_index()
    n = n.sort_values(src_key + ["agree"], ascending=[True] * len(src_key) + [False], kind="stable")
    return n.drop_duplicates(src_key)


def _fr_durations(nccl: pd.DataFrame, fr: pd.DataFrame) -> pd.DataFrame:
    """Columns row, fr_dur_ns, fr_disc_dur_ns, fr_end_ns for the nccl rows FR entries map to."""
    cols = ["row", "fr_dur_ns", "fr_disc_dur_ns", "fr_end_ns"]
    if fr.empty or nccl.empty:
        return pd.DataFrame(columns=cols)
    f = fr[(fr["is_p2p"] != True) & fr["collective_seq_id"].notna() & fr["rank"].notna()].copy()  # noqa: E712
    if f.empty:
        return pd.DataFrame(columns=cols)
    f["op_count"] = f["collective_seq_id"].astype("int64") - 1
    f["rank"] = f["rank"].astype("int64")
    f["pg"] = f["pg_id"].astype("Int64").astype("string").fillna(f["pg_name"].astype("string"))
    n = nccl[["row", "host", "rank", "op_count", "op", "comm"]].dropna(subset=["rank", "op_count"]).copy()
    n["rank"] = n["rank"].astype("int64")
    n["op_count"] = n["op_count"].astype("int64")
    m = f.merge(n, on=["host", "rank", "op_count"], how="inner", suffixes=("_fr", ""))
    agree = m[m["op_fr"].astype("string") == m["op"].astype("string")]
    best = _best_pairing(agree, ["host", "rank", "pg"])
    if best.empty:
        return pd.DataFrame(columns=cols)
    m = agree.merge(best[["host", "rank", "pg", "comm"]], on=["host", "rank", "pg", "comm"], how="inner")
    m = m.drop_duplicates("row", keep="last")
    dur = pd.to_numeric(m["duration_ms"], errors="coerce") * 1e6
    disc = pd.array(m["time_discovered_completed_ns"], dtype="Int64") - \
        pd.array(m["time_discovered_started_ns"], dtype="Int64")
    disc = pd.Series(disc, index=m.index)
    # wall-clock ns stay Int64: float64 would round 1.8e18 to 256 ns
    return pd.DataFrame({"row": m["row"].to_numpy(), "fr_dur_ns": dur.round().to_numpy(),
                         "fr_disc_dur_ns": disc.where(disc >= 0).astype("float64").to_numpy(),
                         "fr_end_ns": pd.array(m["time_discovered_completed_ns"], dtype="Int64")})


def _inspector_durations(nccl: pd.DataFrame, insp: pd.DataFrame, problems: list) -> pd.DataFrame:
    cols = ["row", "insp_dur_ns", "insp_gpu", "insp_source"]
    if insp.empty or nccl.empty:
        return pd.DataFrame(columns=cols)
    i = insp[(insp["kind"] == "coll") & insp["seq"].notna() & insp["pid"].notna() & insp["exec_time_us"].notna()]
    if i.empty:
        return pd.DataFrame(columns=cols)
    i = i.assign(pid=i["pid"].astype("int64"), type_seq=i["seq"].astype("int64"),
                 icomm=i["comm_id"].astype("string").fillna("?"),
                 insp_source=i["gpu_source"] if "gpu_source" in i else "inspector")
    i["insp_source"] = i["insp_source"].fillna("inspector")
    n = nccl[["row", "host", "pid", "op_count", "op", "comm", "nranks"]].dropna(subset=["pid", "op_count"]).copy()
    n["pid"] = n["pid"].astype("int64")
    n = n.sort_values(["host", "pid", "comm", "op_count"], kind="stable")
    n["type_seq"] = n.groupby(["host", "pid", "comm", "op"], dropna=False).cumcount()
    m = i.merge(n, on=["host", "pid", "op", "type_seq"], how="inner", suffixes=("_i", ""))
    ni, nn = (pd.to_numeric(m[c], errors="coerce").astype("float64") for c in ("nranks_i", "nranks"))
    m = m[(ni.isna() | nn.isna() | (ni == nn)).to_numpy(dtype=bool)]
    best = _best_pairing(m, ["host", "pid", "insp_source", "icomm"])
    for (host, pid, source), _ in i.groupby(["host", "pid", "insp_source"]):
        if ((n["host"] == host) & (n["pid"] == pid)).any() and not (
                len(best) and ((best["host"] == host) & (best["pid"] == pid) & (best["insp_source"] == source)).any()):
            what = "Inspector records" if source == "inspector" else "profiler trace collectives"
            problems.append((host, f"{what} of pid {pid} match no traced collective (tracer attached after the "
                                   "communicator's first calls?); no GPU times from them"))
    if best.empty:
        return pd.DataFrame(columns=cols)
    m = m.merge(best[["host", "pid", "insp_source", "icomm", "comm"]],
                on=["host", "pid", "insp_source", "icomm", "comm"], how="inner")
    src = m["timing_source"].astype("string")
    m = m.assign(gpu=(src.isna() | src.isin(GPU_TIMING)).to_numpy(dtype=bool))
    # per row: kernel-timed records first, the Inspector's before the profiler trace's
    m = m.assign(_o=(~m["gpu"]).astype(int) * 2 + (m["insp_source"] != "inspector").astype(int))
    m = m.sort_values("_o", kind="stable").drop_duplicates("row", keep="first")
    return pd.DataFrame({"row": m["row"].to_numpy(), "insp_source": m["insp_source"].to_numpy(),
                         "insp_dur_ns": (pd.to_numeric(m["exec_time_us"], errors="coerce") * 1e3).round().to_numpy(),
                         "insp_gpu": m["gpu"].to_numpy(dtype=bool)})


def apply_gpu_durations(nccl: pd.DataFrame, fr: pd.DataFrame, insp: pd.DataFrame, problems: list) -> pd.DataFrame:
    """``nccl_events`` with ``duration_source = 'gpu'`` where an artefact times the row."""
    if nccl.empty or (fr.empty and insp.empty):
        return nccl
    work = nccl.assign(row=np.arange(len(nccl)), comm=_comm_key(nccl))
    # op counts are absolute only on communicators whose init the tracer saw (they have a
    # comm_id_hash) and only in the program that saw it (op_count_source 'init': a restarted
    # tracer counts from 0 again); on the others the tracer counted from its own start, and any
    # pairing with Flight Recorder / Inspector sequence numbers would time the wrong calls
    seen = work["comm_id_hash"].notna()
    if "op_count_source" in work:
        seen &= work["op_count_source"].isna() | (work["op_count_source"] == "init")
    if not seen.all():
        late = work.loc[~seen].drop_duplicates(["host", "pid"])
        for host, pid in zip(late["host"], late["pid"]):
            problems.append((host, f"pid {pid}: communicator(s) created before the tracer attached: their op "
                                   "counts are relative, so no GPU times are mapped onto their calls"))
        work = work[seen]
    frd = _fr_durations(work, fr)
    ind = _inspector_durations(work, insp, problems)
    cand = pd.DataFrame({"row": np.arange(len(nccl))})
    if len(frd):
        cand = cand.merge(frd, on="row", how="left")
    if len(ind):
        cand = cand.merge(ind, on="row", how="left")
    for c in ("fr_dur_ns", "fr_disc_dur_ns", "insp_dur_ns"):
        if c not in cand:
            cand[c] = np.nan
    if "fr_end_ns" not in cand:
        cand["fr_end_ns"] = pd.array([pd.NA] * len(cand), dtype="Int64")
    if "insp_gpu" not in cand:
        cand["insp_gpu"] = False
    insp_gpu = cand["insp_dur_ns"].where(cand["insp_gpu"].fillna(False).astype(bool))
    dur = insp_gpu.fillna(cand["fr_dur_ns"]).fillna(cand["fr_disc_dur_ns"])
    src = pd.Series(np.where(insp_gpu.notna(), cand["insp_source"] if "insp_source" in cand else "inspector",
                             np.where(cand["fr_dur_ns"].notna() | cand["fr_disc_dur_ns"].notna(), "flight_recorder",
                                      None)), dtype="object")
    hit = dur.notna().to_numpy()
    if not hit.any():
        return nccl
    out = nccl.copy()
    idx = out.index[hit]
    d = dur[hit].astype("int64").to_numpy()
    ts = out.loc[idx, "timestamp_ns"].astype("Int64")
    bound = pd.Series(pd.array(cand.loc[hit, "fr_end_ns"], dtype="Int64"), index=idx)
    bound = bound.fillna(out.loc[idx, "end_ns"].astype("Int64"))
    floor = ts + pd.Series(d, index=idx, dtype="Int64")
    out.loc[idx, "end_ns"] = bound.where(bound.notna() & (bound >= floor), floor)
    out.loc[idx, "duration_ns"] = d
    out.loc[idx, "duration_source"] = "gpu"
    out.loc[idx, "completed"] = True
    out.loc[idx, "gpu_source"] = src[hit].to_numpy()
    return conform(out, "nccl_events")
