"""``nccl_error``: NCCL failed, and the logs say so in a way no other detector reads.

Nothing serious goes unsaid: a log that holds a sign of NCCL failing never gets a clean bill
of health. The other detectors read the WARN classes of their kinds (:mod:`.warns`), the
watchdog's timeouts (:mod:`.timeouts`), the process exits (:mod:`.process_exit`); this one
reads what is left:

- WARN lines of no class in :data:`forensics.model.nccl_errors.CLASSES` (``other``): the host,
  the rank where known, the first such line quoted; an error unless classified causes are in the
  logs too (then a warning, ranked below them);
- WARN lines of the classes that feed no kind (``none``: an error return ``file:line -> N`` with
  no WARN line, ``unhandled system error``, a proxy that gave up, a plugin that did not load),
  when no line of an owned class is in the logs (those say more);
- PyTorch's lines about NCCL when the logs hold no timeout and no WARN line: ``NCCL error in:``
  (DistBackendError, ``ncclSystemError: ...``), a Flight Recorder dump signal (``from rank N``:
  rank N's watchdog fired first), a communicator aborted, the watchdog's teardown.
"""
from __future__ import annotations

import pandas as pd

from . import warns
from ..model.nccl_errors import CLASSES
from .base import Context, Finding, detector
from ..wording import ranks_text
from .timeouts import rank_hosts

UNKNOWN_SCORE = 1e4           # below every classified WARN (a consequence scores 1e5)
TIMEOUT_KINDS = ("timeout", "terminated", "exception")
TORCH_KINDS = ("nccl_error", "last_error", "dump_signal", "aborted", "teardown", "fr_dump_wait")
WD_COLS = ["host", "rank", "pid", "kind", "error", "peer_rank", "time_ns", "message", "artifact", "log_line"]
WD_SQL = ("SELECT host, rank, pid, kind, error, peer_rank, time_ns, message, artifact, log_line FROM watchdog_events "
          "WHERE kind IN ('nccl_error', 'last_error', 'dump_signal', 'aborted', 'teardown', 'fr_dump_wait') "
          "ORDER BY time_ns NULLS LAST, artifact, log_line")


@detector("nccl_error", kinds=("nccl_error",))
def nccl_error(ctx: Context) -> list[Finding]:
    return unclassified_warns(ctx) + unowned_warns(ctx) + torch_nccl_errors(ctx)


def _owned_classes() -> list[str]:
    return [c.name for c in CLASSES if c.kind != "none"]


def _none_classes() -> list[str]:
    return [c.name for c in CLASSES if c.kind == "none"]


def unclassified_warns(ctx: Context) -> list[Finding]:
    """One finding for the WARN lines no class matches: where, how many, the first quoted."""
    g = warns.rows_of(ctx, ["other"])
    if g.empty:
        return []
    classified = not warns.rows_of(ctx, _owned_classes()).empty
    hosts = sorted(set(g["host"].dropna().astype(str)))
    total = len(warns.job_hosts(ctx))
    ranks = sorted({int(r) for r in pd.to_numeric(g["rank"], errors="coerce").dropna()}) \
        or warns.ranks_of_hosts(ctx, hosts)
    first = g.iloc[0]
    rank = first.get("rank")
    who = f"{first['host']}" + (f" (rank {int(rank)})" if pd.notna(rank) else "")
    msg = str(first["message"])[:160]
    since_ns, src = warns.since(g)
    return [Finding(
        kind="nccl_error", severity="warning" if classified else "error", confidence=0.5 if classified else 0.6,
        headline=f"NCCL WARN on {who}: \"{msg[:90]}\"" + " ({since})",
        confidence_note="a WARN line this analyzer has no class for: its meaning is not judged",
        summary=(f"NCCL logged {len(g)} WARN line(s) of a kind this analyzer does not classify, on "
                 f"{warns.hosts_text(hosts, total)}; the first, on {who}"
                 + (f" at {warns.utc_clock(first['time_ns'])}" if pd.notna(first.get("time_ns")) else "")
                 + f": \"{msg}\"" + ("; the classified failures above come first." if classified else ".")),
        ranks=ranks, hosts=hosts, evidence=warns.evidence(g), sql=warns.sql(["other"]),
        action=(f"On {', '.join(hosts[:3]) or 'that host'}: read the WARN line and the lines before it in that "
                "process's output (NCCL_DEBUG=INFO says more); search NCCL's issues for its wording"),
        score=UNKNOWN_SCORE, since_ns=since_ns, since_source=src,
        details={"rule": "unclassified_warn", "lines": int(len(g))})]


def unowned_warns(ctx: Context) -> list[Finding]:
    """The WARN classes that feed no kind, when no line of an owned class says more: one finding
    per class (a plugin that did not load is a warning; an NCCL call that failed an error)."""
    if not warns.rows_of(ctx, _owned_classes()).empty:
        return []
    rows = warns.rows_of(ctx, _none_classes())
    if not warns.rows_of(ctx, ["other"]).empty:
        # an error return says "no WARN line says why": not where an unclassified WARN line does
        # (its own finding quotes it; XLA's error quotes NCCL's last WARN, PyTorch's "Last error:")
        rows = rows[rows["class"] != "error_return"]
    out = []
    for cls, g in rows.groupby("class", sort=False):
        ranks = sorted({int(r) for r in pd.to_numeric(g["rank"], errors="coerce").dropna()})
        f = warns.class_finding(ctx, "nccl_error", cls, g, confidence=0.6,
                                detail=f", {ranks_text(ranks)}" if ranks else "",
                                severity="warning" if cls == "plugin_load" else "error")
        f.score = max(f.score, UNKNOWN_SCORE)
        out.append(f)
    return out


def torch_nccl_errors(ctx: Context) -> list[Finding]:
    """PyTorch's NCCL errors, dump signals and aborts in logs that hold no watchdog timeout and no
    WARN line (those are judged by the hang and WARN detectors, which name more)."""
    wd = ctx.model.tables.get("watchdog_events")
    if wd is None or wd.empty or wd["kind"].isin(TIMEOUT_KINDS).any():
        return []
    w = ctx.model.tables.get("nccl_warnings")
    if w is not None and len(w):
        return []
    g = wd[wd["kind"].isin(TORCH_KINDS)]
    if g.empty:
        return []
    g = g.assign(_t=pd.to_numeric(g["time_ns"], errors="coerce")).sort_values(
        ["_t", "artifact", "log_line"], kind="stable", na_position="last").drop(columns="_t")
    out = []
    # "from this local rank": the rank's own watchdog fired; it names itself
    own = (g["kind"] == "dump_signal") & g["peer_rank"].isna() & g["rank"].notna() & g["message"].astype(
        str).str.contains(r"from\s+this\s+local\s+rank", regex=True)
    g = g.assign(peer_rank=g["peer_rank"].where(~own, g["rank"]))
    dumps = g[(g["kind"] == "dump_signal") & g["peer_rank"].notna()]
    if len(dumps):
        out.append(_dump_finding(ctx, dumps))
    errs = g[g["kind"].isin(("nccl_error", "last_error"))]
    rest = g[~g["kind"].isin(("nccl_error", "last_error")) & ~g.index.isin(dumps.index)]
    if len(errs) or (not out and len(rest)):
        out.append(_error_finding(ctx, errs if len(errs) else rest))
    return out


def _ranks(g: pd.DataFrame) -> list[int]:
    return sorted({int(r) for r in pd.to_numeric(g["rank"], errors="coerce").dropna()})


def _hosts(g: pd.DataFrame) -> list[str]:
    return sorted({h for h in g["host"].dropna().astype(str) if not h.startswith("unknown:")})


def _since(g: pd.DataFrame) -> tuple[int | None, str | None]:
    t = pd.to_numeric(g["time_ns"], errors="coerce")
    return (int(t.min()), "PyTorch watchdog line times") if t.notna().any() else (None, None)


def _dump_finding(ctx: Context, dumps: pd.DataFrame) -> Finding:
    """The rank a peer's dump signal names ("from rank N"); where only ranks naming themselves
    ("from this local rank") are there and they are several, every one of them."""
    peer = pd.to_numeric(dumps["peer_rank"], errors="coerce")
    by_peer = peer[peer != pd.to_numeric(dumps["rank"], errors="coerce")].dropna()
    fired = sorted({int(r) for r in peer.dropna()})
    if by_peer.empty and len(fired) > 1:
        return _self_dumps_finding(ctx, dumps, fired)
    first = int((by_peer if len(by_peer) else peer).mode().iloc[0])
    host = rank_hosts(ctx).get(first)
    told = _ranks(dumps)
    since_ns, src = _since(dumps)
    return Finding(
        kind="nccl_error", severity="error", confidence=0.7,
        headline=f"Collective timeout: rank {first}'s watchdog fired first (Flight Recorder dump signals)" + " ({since})",
        confidence_note="the dump signals name the rank; its own timeout line is not in the logs",
        summary=((f"PyTorch's Flight Recorder dump signal reached {ranks_text(told) if told else 'the ranks'} "
                  f"from rank {first}" + (f" (on {host})" if host else "") + ": rank " + str(first) + "'s watchdog "
                  "caught a collective timeout first; its peers dumped their state." if len(by_peer) else
                  f"Rank {first}'s own watchdog" + (f" (on {host})" if host else "") + " caught a collective timeout "
                  "and signalled the Flight Recorder to dump.")
                 + f" The logs hold no timeout line of their own: \"{str(dumps.iloc[0]['message'])[:140]}\"."),
        ranks=[first], hosts=[host] if host else [], peer_ranks=[r for r in told if r != first],
        evidence=warns.evidence(dumps, WD_COLS), sql=WD_SQL,
        action=(f"Rank {first}'s own output (its timeout line names the collective and SeqNum) and the Flight "
                "Recorder dumps (python -m torch.distributed.flight_recorder.fr_trace): the rank that never "
                "entered that collective is the one to look at"),
        score=warns.LOG_FINDING_SCORE, since_ns=since_ns, since_source=src,
        details={"rule": "dump_signal", "first_rank": first, "lines": int(len(dumps))})


def _self_dumps_finding(ctx: Context, dumps: pd.DataFrame, fired: list[int]) -> Finding:
    hosts = sorted({h for r in fired if (h := rank_hosts(ctx).get(r))})
    since_ns, src = _since(dumps)
    return Finding(
        kind="nccl_error", severity="error", confidence=0.6,
        headline=f"Collective timeout: the watchdogs of {ranks_text(fired)} fired (Flight Recorder dump signals)"
        + " ({since})",
        confidence_note="each rank's dump signal names itself; their own timeout lines are not in the logs",
        summary=(f"PyTorch's Flight Recorder dump signal came from the ranks' own watchdogs on {ranks_text(fired)}"
                 + (f" ({', '.join(hosts[:3])})" if hosts else "") + ": each caught a collective timeout of its "
                 f"own. The logs hold no timeout line: \"{str(dumps.iloc[0]['message'])[:140]}\"."),
        ranks=fired, hosts=hosts, evidence=warns.evidence(dumps, WD_COLS), sql=WD_SQL,
        action=("The ranks missing from this list (they never timed out: the ones the others waited for), their "
                "output, and the Flight Recorder dumps (python -m torch.distributed.flight_recorder.fr_trace)"),
        score=warns.LOG_FINDING_SCORE, since_ns=since_ns, since_source=src,
        details={"rule": "dump_signal", "first_rank": None, "lines": int(len(dumps))})


def _error_finding(ctx: Context, g: pd.DataFrame) -> Finding:
    r0 = g.iloc[0]
    ranks, hosts = _ranks(g), _hosts(g)
    err = next((str(e) for e in g["error"] if isinstance(e, str) and e.strip()), None)
    text = err or str(r0["message"])
    who = (ranks_text(ranks) if ranks else "a rank") + (f" ({', '.join(hosts[:3])})" if hosts else "")
    since_ns, src = _since(g)
    what = {"nccl_error": "an NCCL call failed", "last_error": "an NCCL call failed",
            "aborted": "NCCL's communicator was aborted", "teardown": "PyTorch took the process down after an NCCL "
            "failure", "dump_signal": "PyTorch's Flight Recorder was signalled to dump (a collective timeout "
            "or an NCCL error)", "fr_dump_wait": "PyTorch waited for Flight Recorder dumps (a collective "
            "timeout or an NCCL error)"}.get(str(r0["kind"]), "NCCL failed")
    return Finding(
        kind="nccl_error", severity="error", confidence=0.6,
        headline=(f"{what[0].upper() + what[1:]} on {who}" + (f": \"{err[:100]}\"" if err else "")).replace(
            "{", "(").replace("}", ")") + " ({since})",
        confidence_note="PyTorch's report of the error; NCCL's own WARN line (why) is not in the logs",
        summary=(f"On {who} {what}: \"{text[:200]}\" ({len(g)} line(s)). The logs hold no NCCL WARN line saying "
                 "why (the job ran without NCCL_DEBUG=WARN or INFO, or that output was not given)."),
        ranks=ranks, hosts=hosts, evidence=warns.evidence(g, WD_COLS), sql=WD_SQL,
        action=("Rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) to see NCCL's WARN line; meanwhile the "
                "peers' logs, dmesg on those hosts (Xid, OOM kills, NIC resets) and torchrun's exit summary"),
        score=warns.LOG_FINDING_SCORE, since_ns=since_ns, since_source=src,
        details={"rule": f"torch_{r0['kind']}", "lines": int(len(g))})
