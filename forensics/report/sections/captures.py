"""The captures themselves: each bundle's window and collectors, the clock skew
between hosts, the span every host watched together, and what the calls' positions rest on.
"""
from __future__ import annotations

import pandas as pd

from ...model.windows import host_windows
from .common import TimeSpan, time_span, utc


def capture_view(analysis) -> list[dict]:
    """Per bundle: time covered, collectors grouped by status, processes, problems."""
    out = []
    for c in analysis.model.captures:
        collectors = sorted(c.get("collectors", []), key=lambda k: ({"failed": 0, "skipped": 1}.get(k["status"], 2),
                                                                    k["name"]))
        # what each collector really covered (per-host captures start and stop apart)
        collectors = [{**k, "covered": " → ".join(utc(t) for t in k["covered_ns"]) if k.get("covered_ns") else None}
                      for k in collectors]
        counts = pd.Series([k["status"] for k in collectors], dtype="object").value_counts().to_dict()
        span = TimeSpan(c.get("started_ns"), c.get("ended_ns"))
        out.append({**c, "collectors": collectors, "status_counts": counts, "start_utc": utc(span.start_ns),
                    "end_utc": utc(span.end_ns), "seconds": span.seconds})
    return out


def skew_rows(analysis) -> list[dict]:
    return [{"host_a": s.host_a, "host_b": s.host_b,
             "skew_ms": None if s.skew_ns is None else s.skew_ns / 1e6,
             "one_way_delay_ms": None if s.one_way_delay_ns is None else s.one_way_delay_ns / 1e6,
             "matched_segments": s.matched_segments, "status": s.status} for s in analysis.model.skew]


def common_window_s(analysis) -> float | None:
    """Seconds every host's capture watched together (the latest start to the earliest end
    of the hosts' windows): what the state-at-capture verdicts judge silence over; 0 when
    they never overlapped, None with one host or no windows."""
    w = host_windows(analysis.model.tables.get("capture_windows"))
    if len(w) < 2:
        return None
    return max(0.0, (min(b for _, b in w.values()) - max(a for a, _ in w.values())) / 1e9)


def span_text(analysis) -> str:
    """"09:01:43 → 09:02:42 UTC (59.0 s; every host at once: 10.5 s)": the captures' span, and
    the window they shared where it is shorter (per-host captures start and stop apart)."""
    span = time_span(analysis)
    if span.start_ns is None:
        return "-"
    out = f"{utc(span.start_ns)[:19]} → {utc(span.end_ns)[11:19]} UTC"
    parts = [f"{span.seconds:.1f} s"] if span.seconds is not None else []
    both = common_window_s(analysis)
    if both is not None and span.seconds is not None and span.seconds - both > 1.0:
        parts.append(f"every host at once: {both:.1f} s" if both > 0 else "the hosts' captures never overlapped")
    return out + (f" ({'; '.join(parts)})" if parts else "")


def calls_text(analysis) -> str:
    """"363 NCCL calls traced", or where the tracer saw none, what the verdicts rest on
    instead ("no NCCL call traced; positions from NCCL_DEBUG COLL lines, Flight Recorder")."""
    n = len(analysis.model.tables["nccl_events"])
    if n:
        return f"{n} NCCL calls traced"
    have = [label for name, label in (("coll_log_ops", "NCCL_DEBUG COLL lines"), ("fr_pg_status", "Flight Recorder"),
                                      ("watchdog_events", "PyTorch watchdog lines"), ("stacks", "stacks"))
            if len(analysis.model.tables.get(name, ())) > 0]
    return "no NCCL call traced" + (f"; positions from {', '.join(have)}" if have else "")
