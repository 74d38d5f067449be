"""``stall_resolved``: a stall the black box (``stallscope capture --watch``) saw resolve by itself.

The watcher writes an incident's bundle at the trigger and completes it ``--after`` later with
whether the stall resolved (``watch.stall`` in the manifest, capture/manifest.py ``STALL``):
``resolved`` when every stuck process made progress again in the window (a call of theirs
returned, or their connections moved), ``stuck`` when they were still stuck at its end. A
resolved stall (a rank saving a checkpoint while the others wait in the next collective) is no
hang: the bundle's state at the trigger looks like one (the ranks inside a collective, one rank
outside every NCCL call), so :func:`settle` drops the hang findings the detectors drew from it on
those ranks and this warning takes their place, naming the rank everyone waited for (the
traced processes outside every collective at the trigger) and how long. A stall still stuck at
the end of the window, or one whose bundle is only the first archive, leaves the hang findings
as they are, their summary saying so.
"""
from __future__ import annotations

from .base import Context, Finding, detector
from .contract import since_text
from ..wording import ranks_text
from .precedence import HANG_KINDS

RESOLVED_SCORE = 5e5          # below the hangs (1e6 + s), above the slowness findings


def stalls(model) -> list[dict]:
    """Each watcher bundle's stall: {host, stage, and the manifest's ``watch.stall`` keys}."""
    out = []
    for c in getattr(model, "captures", None) or []:
        w = c.get("watch") or {}
        st = w.get("stall")
        if isinstance(st, dict) and isinstance(st.get("state"), str):
            out.append(dict(st, host=c.get("host"), stage=w.get("stage")))
    return out


def _ranks(values) -> list[int]:
    return sorted({int(v) for v in values or [] if isinstance(v, int) and not isinstance(v, bool)})


@detector("stall_resolved", kinds=("stall_resolved",))
def stall_resolved(ctx: Context) -> list[Finding]:
    out = []
    for st in stalls(ctx.model):
        after = st.get("resolved_after_s")
        if st["state"] != "resolved" or not isinstance(after, (int, float)):
            continue
        stuck = _ranks(st.get("ranks"))
        waited = _ranks(w.get("rank") for w in st.get("waited_for") or [] if isinstance(w, dict))
        who = (f"{ranks_text(waited)}, outside every NCCL call (host code: a checkpoint, a data loader, an "
               "evaluation?)" if waited else "a rank outside this host's view")
        waiting = ranks_text(stuck) if stuck else "the stuck processes"
        since = st.get("stalled_since_ns") if isinstance(st.get("stalled_since_ns"), int) else None
        out.append(Finding(
            kind="stall_resolved", severity="warning", confidence=0.9,
            summary=(f"Stall resolved after {after:.0f} s, no hang: {waiting} waited inside a collective "
                     f"({since_text(since) if since else 'since before the trigger'}) for {who}; the watcher saw "
                     "progress resume within its window."),
            headline=f"Stall resolved after {after:.0f} s: everyone waited for "
                     f"{ranks_text(waited) if waited else 'a rank off this host'}",
            ranks=waited, peer_ranks=stuck, hosts=[st["host"]] if st.get("host") else [],
            since_ns=since,
            evidence=[{k: st.get(k) for k in ("host", "state", "stalled_since_ns", "resumed_ns", "resolved_after_s",
                                               "pids", "ranks", "waited_for", "source")}],
            action=("If the pause is expected (a checkpoint), nothing to do; if it grows, look at what "
                    f"{ranks_text(waited) if waited else 'the waited-for rank'} does then (its native "
                    "stacks in the bundle: stacks/)."),
            score=RESOLVED_SCORE + float(after),
            details={"resolved_after_s": after, "waited_for_ranks": waited, "stuck_ranks": stuck},
        ))
    return out


def settle(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """The hang findings on the ranks of a stall the watcher saw resolve are dropped (the
    ``stall_resolved`` warning says what happened); those of a stall still stuck at the end of
    the window, or not yet followed to it (the first archive), say so."""
    sts = stalls(ctx.model)
    if not sts:
        return findings
    resolved = [f for f in findings if f.kind == "stall_resolved"]
    gone = {r for f in resolved for r in list(f.ranks) + list(f.peer_ranks)}
    out = []
    for f in findings:
        if f.kind in HANG_KINDS and resolved and (not f.ranks or set(map(int, f.ranks)) <= gone or not gone):
            continue
        if f.kind in HANG_KINDS:
            states = {s["state"] for s in sts}
            if "stuck" in states:
                f.summary += " The watcher saw it still stuck at the end of the window."
                f.details["watch_stall"] = "still stuck at the end of the window"
            elif "pending" in states:
                f.summary += (" This is the watcher's first archive, written at the trigger: whether the stall "
                              "resolved is in the same bundle once completed (--after later).")
                f.details["watch_stall"] = "pending"
        out.append(f)
    return out
