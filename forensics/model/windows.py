"""Capture windows: the interval each host's collectors really covered (table ``capture_windows``).

On a real cluster one capture runs per host: they start and stop seconds apart and the job
outlives them. A collective still open when one host's capture stopped looking is *unknown*,
never a hang by itself, so the hang detectors judge "in flight" and "not completed" only
inside the *common* window of the hosts involved (:func:`common_end`).

Sources, best first, per host and collector kind:

- the manifest's ``collectors[*].covered_ns`` (capture records the tracer's first and last
  flush, tcpdump's first and last packet, each snapshot's sample time);
- derived from the bundle when a bundle predates that: the tracer's own start/stop events,
  the pcaps' first and last packet (flows);
- the manifest's ``started_ns`` / ``ended_ns`` (kind ``capture``), the outer bound.

Columns: host, collector (the manifest's key, e.g. ``tcpdump@netns-x/eth0``), kind
(``tracer``, ``tcpdump``, ``ss``, ``capture``, ...), first_ns, last_ns, source
(``manifest`` | ``derived``).
"""
from __future__ import annotations

import pandas as pd

from .schema import conform, empty

# what "the host watched NCCL progress" means, best first: the tracer saw calls complete; else
# the capture as a whole (logs, sockets and stacks are read inside its bounds)
PROGRESS_KINDS = ("tracer", "capture")


def collector_kind(name: str) -> str:
    """``tcpdump@netns-1/eth0`` -> ``tcpdump``; ``ss@host:start`` -> ``ss``."""
    return str(name).split("@", 1)[0].split(":", 1)[0]


def bundle_windows(bundle, events, flows: pd.DataFrame) -> pd.DataFrame:
    m = bundle.manifest
    rows = []
    if m.started_ns is not None and m.ended_ns is not None and m.started_ns <= m.ended_ns:
        rows.append(("capture", "capture", m.started_ns, m.ended_ns, "manifest"))
    kinds_seen = set()
    for name, c in m.collectors.items():
        if c.covered_ns is not None:
            kind = collector_kind(name)
            kinds_seen.add(kind)
            rows.append((name, kind, c.covered_ns[0], c.covered_ns[1], "manifest"))
    if "tracer" not in kinds_seen and bundle.clock is not None:
        t = _tracer_span(events)
        if t is not None:
            a, b = bundle.clock.to_utc(pd.Series(t, dtype="int64").to_numpy())
            rows.append(("tracer", "tracer", int(a), int(b), "derived"))
    if "tcpdump" not in kinds_seen and flows is not None and len(flows):
        f = flows.dropna(subset=["first_ns", "last_ns"])
        for cap, g in f.groupby("capture"):
            rows.append((f"tcpdump:{cap}", "tcpdump", int(g["first_ns"].min()), int(g["last_ns"].max()), "derived"))
    if not rows:
        return empty("capture_windows")
    df = pd.DataFrame(rows, columns=["collector", "kind", "first_ns", "last_ns", "source"])
    df["host"] = bundle.host
    return conform(df, "capture_windows")


def _tracer_span(events) -> tuple[int, int] | None:
    """Monotonic (first, last) of what the tracer delivered: its start and the stop/end mark,
    else the first and last event time."""
    starts = [e.get("t") for e in events.kind("tracer_start") if isinstance(e.get("t"), int)]
    stops = [e.get("t") for k in ("tracer_stopped", "tracer_end") for e in events.kind(k)
             if isinstance(e.get("t"), int)]
    times = [e.get("t0", e.get("t")) for e in events if isinstance(e.get("t0", e.get("t")), int)]
    first = min(starts) if starts else (min(times) if times else None)
    last = min(stops) if stops else (max(times) if times else None)
    if first is None or last is None or last < first:
        return None
    return first, last


def host_windows(windows: pd.DataFrame, kinds=PROGRESS_KINDS) -> dict[str, tuple[int, int]]:
    """host -> (first_ns, last_ns) it watched, from the first of ``kinds`` it has (the
    collectors of one kind merged: the earliest first, the latest last)."""
    out: dict[str, tuple[int, int]] = {}
    if windows is None or windows.empty:
        return out
    for host, g in windows.groupby("host"):
        for kind in kinds:
            k = g[g["kind"] == kind]
            if len(k):
                out[str(host)] = (int(k["first_ns"].min()), int(k["last_ns"].max()))
                break
    return out


def common_end(windows: pd.DataFrame, hosts) -> int | None:
    """The end of the window every one of ``hosts`` watched: the earliest of their ends
    (None when none of them has a window)."""
    w = host_windows(windows)
    ends = [w[h][1] for h in {str(h) for h in hosts if h is not None and not pd.isna(h)} if h in w]
    return min(ends) if ends else None


def common_start(windows: pd.DataFrame, hosts) -> int | None:
    w = host_windows(windows)
    starts = [w[h][0] for h in {str(h) for h in hosts if h is not None and not pd.isna(h)} if h in w]
    return max(starts) if starts else None


def capture_start_ns(model) -> int | None:
    """When the first capture began (the manifests' started_ns): what "before the capture"
    counts from, in the summaries and on the report's first screen alike."""
    starts = [int(c["started_ns"]) for c in model.captures if c.get("started_ns")]
    return min(starts) if starts else None
