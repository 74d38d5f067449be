"""A hang trigger's stall: who is stuck since when, and whether it resolved in the after-window.

The manifest's ``watch.stall`` of a watcher's bundle comes from here. At the trigger,
:func:`stall_at` records each stuck process's progress mark (the tracer's last returned call,
or for the tracer-free trigger the ss series' last move) and, for a traced job, the processes
outside every collective that the stuck ones wait for (rank 0 saving a checkpoint). During the
after-window :func:`follow` marks the stall ``resolved`` once every stuck process still alive
moved past its mark (with when, and after how long), ``ended`` when none is left; the cut makes
a stall still ``pending`` at the window's end ``stuck``. The keys starting with ``_`` are the
follower's own and never reach the manifest.
"""
from __future__ import annotations

import os
from typing import Callable

from .triggers import Trigger


def stall_at(trig: Trigger, stuck: list[dict] | None, monitor, rank_of: Callable[[int], int | None]) -> dict | None:
    """The stall of a hang trigger (state ``pending``), None for another trigger or no stuck
    process. ``stuck``: the monitor's stuck processes (``pid``, ``quiet_ns``, and
    ``last_move_ns`` for the tracer-free trigger); ``monitor``: the hang monitor (None without
    a tracer); ``rank_of``: pid -> its rank, None when unknown."""
    if trig.pids:             # a trigger split per job: this job's stuck processes only
        stuck = [st for st in stuck or [] if st["pid"] in trig.pids]
    if trig.kind != "hang" or not stuck:
        return None
    tracer = trig.source == "tracer"
    if tracer and monitor is None:
        return None
    since = min(trig.monotonic_ns - st["quiet_ns"] for st in stuck)
    marks = {st["pid"]: (monitor.last_return.get(st["pid"], 0) if tracer else st["last_move_ns"]) for st in stuck}
    out = {"state": "pending", "stalled_since_ns": since + trig.realtime_ns - trig.monotonic_ns,
           "pids": sorted(marks), "ranks": [r for p in sorted(marks) if (r := rank_of(p)) is not None]}
    if tracer:     # the traced processes outside every collective: what the stuck ones wait for
        waited = [{"pid": p, "rank": rank_of(p)} for p in sorted(set(monitor.last_coll) - set(marks))
                  if os.path.isdir(f"/proc/{p}") and not monitor.in_flight(p)]
        if waited:
            out["waited_for"] = waited
    out.update(source=trig.source, _marks=marks, _since=since, _offset=trig.realtime_ns - trig.monotonic_ns,
               _resumed={})
    return out


def follow(st: dict | None, monitor, quiet) -> None:
    """One look at a pending stall during the after-window: resolved once every stuck process
    still there made progress again (the tracer saw a call of it return, or its connections
    moved: ``quiet``, the tracer-free trigger's ``QuietJobs``); ended when none is left."""
    if not st or st["state"] != "pending":
        return
    alive = [p for p in st["pids"] if os.path.isdir(f"/proc/{p}")]
    if not alive:
        st["state"] = "ended"
        return
    for p in alive:
        if p in st["_resumed"]:
            continue
        if st["source"] == "tracer":
            mark = monitor.last_return.get(p, 0) if monitor is not None else 0
        else:
            mark = (quiet.procs.get(p) or {}).get("last_move", 0)
        if mark > st["_marks"][p]:
            st["_resumed"][p] = mark
    if all(p in st["_resumed"] for p in alive):
        t = max(st["_resumed"][p] for p in alive)
        st.update(state="resolved", resumed_ns=t + st["_offset"], resolved_after_s=round((t - st["_since"]) / 1e9, 1))
