"""Since when: the onset of a hang judged from the state at capture (``since_ns``).

The first thing an on-call engineer checks a hang against is time: switch logs, dmesg, a
deploy. A capture started minutes into the hang never sees it begin, but what it holds
still dates it: each kind of evidence below says "this communicator was still moving at
t", so the hang began at or after the latest such t, and soon after it (the next
collective would have completed within its usual duration). :func:`comm_onset` takes
the latest of them:

- **progress** (:class:`~forensics.findings.comm_state.RankState.last_progress_ns`): a
  collective the tracer saw complete, a Flight Recorder completion (realtime clock),
  bytes acknowledged between two socket samples;
- **NCCL_DEBUG COLL line times** (NCCL >= 2.26 prints them, launchers add theirs): the
  last collective each rank launched;
- **socket lastack ages**: on a connection between two ranks still holding data nobody
  acknowledges, the sample time less ``lastack`` is when its peer last answered;
- **PyTorch watchdog lines**: a timeout line's time less the time its work ran for is
  when that collective started.

Each source has a granularity (``PRECISION_NS``: how well its clock places the event);
the estimate's precision is that, or the communicator's usual collective duration when
it is longer (the hang began within one collective of the last sign of life).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

ONSET_UNKNOWN = " The onset is not in this capture."   # said by a verdict nothing dates

# how finely each source places its event in time
PRECISION_NS = {
    "tracer": 1_000_000,
    "Flight Recorder": 100_000_000,              # completions are discovered by the watchdog's ~100 ms poll
    "socket samples": 1_000_000_000,             # bytes moved between two samples a second or so apart
    "NCCL_DEBUG COLL line times": 1_000_000,
    "socket lastack ages": 200_000_000,          # the last ACK, up to a minimum RTO before the link died
    "PyTorch watchdog": 1_000_000,
}


@dataclass(frozen=True)
class Onset:
    """When a hang began (epoch ns), from which evidence, and within how much."""

    ns: int
    source: str
    precision_ns: int


def _source_key(source: str) -> str:
    return "tracer" if source.startswith("tracer") else source


def onset(candidates: list[tuple[int, str]], usual_ns: float = 0.0) -> Onset | None:
    """The latest of ``candidates`` ((epoch ns, source) each saying "still moving then"),
    with its precision: the source's granularity or ``usual_ns`` (a collective's usual
    duration), whichever is longer. None without candidates."""
    good = [(int(t), s) for t, s in candidates if t is not None and not pd.isna(t) and int(t) > 10**18]
    if not good:
        return None
    t, source = max(good)
    precision = max(PRECISION_NS.get(_source_key(source), 1_000_000_000), int(usual_ns or 0))
    return Onset(t, source, precision)


def comm_onset(ctx, ranks: dict, members: set[int], comm_key: str, usual_ns: float = 0.0,
               samples: pd.DataFrame | None = None) -> Onset | None:
    """The onset of a hung communicator from its ranks' fused state (``ranks``: global rank
    -> RankState), its sockets between ranks with their sample times (``samples``: columns
    rank, peer_rank, unacked, lastack_ms, t) and the tables of ``ctx``: see the module's
    docstring."""
    cands: list[tuple[int, str]] = []
    for st in ranks.values():
        if st.last_progress_ns is not None:
            cands.append((st.last_progress_ns, st.progress_source or "progress"))
    t = ctx.model.tables
    coll = t.get("coll_log_ops")
    if coll is not None and len(coll) and "time_ns" in coll:
        c = coll[(coll["comm_id"].astype("string") == comm_key).fillna(False).to_numpy()]
        v = pd.to_numeric(c["time_ns"], errors="coerce").max()
        if pd.notna(v):
            cands.append((int(v), "NCCL_DEBUG COLL line times"))
    if samples is not None and len(samples):
        s = samples[samples["rank"].isin(members) & samples["peer_rank"].isin(members)]
        if len(s):
            unacked = pd.to_numeric(s["unacked"], errors="coerce").fillna(0) > 0
            age = pd.to_numeric(s["lastack_ms"], errors="coerce")
            acked = (s["t"] - age * 1e6)[unacked.to_numpy() & age.notna().to_numpy()]
            if len(acked):
                cands.append((int(acked.max()), "socket lastack ages"))
    wd = t.get("watchdog_events")
    if wd is not None and len(wd):
        w = wd[wd["kind"].isin(("timeout", "terminated")) & wd["rank"].isin(members)]
        start = pd.to_numeric(w["time_ns"], errors="coerce") - pd.to_numeric(w["ran_for_ms"], errors="coerce") * 1e6
        if start.notna().any():
            cands.append((int(start.min()), "PyTorch watchdog"))
    return onset(cands, usual_ns)


__all__ = ["ONSET_UNKNOWN", "Onset", "PRECISION_NS", "comm_onset", "onset"]
