"""``process_exit``: a rank's process died: killed by a signal, OOM-killed, or it exited failing.

The launchers say which process died and how (``process_exits``: torchrun's summary and agent
lines, Slurm's ``srun: error: ... Killed``, slurmstepd's OOM kill, Open MPI's ``exited on
signal``, torch.distributed.launch), the kernel says whom its OOM killer took (``kernel_events``
of kind ``oom_kill``). A rank killed from outside (SIGKILL: the OOM killer or the scheduler; a
crash: SIGSEGV, SIGBUS) is the culprit over the ranks that then time out waiting for it: its
finding ranks above the hang and the resets it causes. A rank that aborted (SIGABRT) or exited
with an error code while PyTorch's watchdog timed out is the watchdog's own teardown, a
consequence (a warning); without a timeout in the logs it is an error of its own. The processes
torchrun stopped after the first failure (``closing signal SIGTERM``) are not blamed.
"""
from __future__ import annotations

import pandas as pd

from . import warns
from .base import Context, Finding, detector
from .evidence import ranks_text

KILLED_SCORE = 3.5e6          # above the first NCCL failure (3e6) and the hang (1e6 + s) a killed rank causes
KILL_SIGNALS = ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
COLS = ["host", "rank", "local_rank", "pid", "kind", "exitcode", "signal", "traceback", "time_ns", "artifact",
        "log_line"]
SQL = ("SELECT host, rank, local_rank, pid, kind, exitcode, signal, traceback, time_ns, artifact, log_line "
       "FROM process_exits WHERE kind <> 'sigterm' AND (signal IS NOT NULL OR exitcode <> 0) "
       "ORDER BY time_ns NULLS LAST, artifact, log_line")
OOM_SQL = ("SELECT host, time_ns, kind, pid, message, artifact, log_line FROM kernel_events WHERE kind = 'oom_kill' "
           "ORDER BY time_ns NULLS LAST, artifact, log_line")


@detector("process_exit", kinds=("process_exit",))
def process_exit(ctx: Context) -> list[Finding]:
    return killed(ctx) + failed(ctx)


def exits(ctx: Context) -> pd.DataFrame:
    """The failed processes' rows (no SIGTERM torchrun sent, no clean exit), in time and line order."""
    ex = ctx.model.tables.get("process_exits")
    if ex is None or ex.empty:
        return pd.DataFrame(columns=COLS)
    code = pd.to_numeric(ex["exitcode"], errors="coerce")
    bad = ex[(ex["kind"] != "sigterm") & (ex["signal"].notna() | (code.fillna(0) != 0))]
    return bad.assign(_t=pd.to_numeric(bad["time_ns"], errors="coerce")).sort_values(
        ["_t", "artifact", "log_line"], kind="stable", na_position="last").drop(columns="_t")


def _s(v) -> str:
    return v if isinstance(v, str) else ""


def _oom(r) -> bool:
    return r["kind"] == "slurm_oom" or "memory" in _s(r.get("traceback")).lower()


def _who(g: pd.DataFrame) -> tuple[list[int], list[str], str]:
    ranks = sorted({int(r) for r in pd.to_numeric(g["rank"], errors="coerce").dropna()})
    hosts = sorted({h for h in g["host"].dropna().astype(str) if not h.startswith("unknown:")})
    pids = sorted({int(p) for p in pd.to_numeric(g["pid"], errors="coerce").dropna()})
    if ranks:
        who = ranks_text(ranks)
    elif pd.to_numeric(g.get("local_rank"), errors="coerce").notna().any():
        lr = sorted({int(r) for r in pd.to_numeric(g["local_rank"], errors="coerce").dropna()})
        who = "local rank " + ", ".join(map(str, lr[:4]))
    elif pids:
        who = "pid " + ", ".join(map(str, pids[:4]))
    else:
        who = "a process"
    return ranks, hosts, who + (f" on {', '.join(hosts[:3])}" if hosts else "")


def killed(ctx: Context) -> list[Finding]:
    """The ranks killed from outside (a kill signal, an OOM kill): one finding, the culprit."""
    ex = exits(ctx)
    hard = ex[ex["signal"].isin(KILL_SIGNALS) | (ex["kind"] == "slurm_oom")] if len(ex) else ex
    oom = _kernel_ooms(ctx)
    if hard.empty and oom.empty:
        return []
    if hard.empty:
        return [_oom_finding(ctx, oom)]
    ranks, hosts, who = _who(hard)
    sigs = sorted(set(hard["signal"].dropna().astype(str)))
    is_oom = any(_oom(r) for _, r in hard.iterrows()) or len(oom)
    how = "the OOM killer" if is_oom else "/".join(sigs)
    since_ns = pd.to_numeric(hard["time_ns"], errors="coerce").min()
    first = hard.iloc[0]
    said = _s(first.get("traceback"))[:120]
    crash = any(s in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE") for s in sigs)
    action = ("a crash: the process's core dump or native stack, dmesg for an NVIDIA Xid at that time" if crash else
              "dmesg on that host for the OOM killer (\"Out of memory: Killed process <pid>\"), the job's memory "
              "limit (Slurm's cgroup, Kubernetes OOMKilled), the host's free memory; or who sent the kill (the "
              "scheduler's time limit, a preemption)")
    return [Finding(
        kind="process_exit", severity="error", confidence=0.85,
        headline=f"Process killed: {who} by {how}" + " ({since})",
        confidence_note="the launcher's own report of how the process ended",
        summary=(f"{who[0].upper() + who[1:]} was killed by {how} ({len(hard)} report(s): {', '.join(sigs) or 'OOM'}"
                 + (f", \"{said}\"" if said else "") + f", from {first['kind']} line(s)); the ranks that then "
                 "waited for it time out or lose their connections: this is the first failure, not them."
                 + (f" The kernel's OOM killer took {len(oom)} process(es) too." if len(oom) else "")),
        ranks=ranks, hosts=hosts, evidence=warns.evidence(hard, COLS), sql=SQL,
        action=f"On {', '.join(hosts[:3]) or 'its host'}: {action}",
        score=KILLED_SCORE, since_ns=int(since_ns) if pd.notna(since_ns) else None,
        since_source="the launcher's failure time" if pd.notna(since_ns) else None,
        details={"rule": "killed", "signals": sigs, "oom": bool(is_oom), "processes": int(len(hard))})]


def _kernel_ooms(ctx: Context) -> pd.DataFrame:
    k = ctx.model.tables.get("kernel_events")
    if k is None or k.empty:
        return pd.DataFrame()
    return k[k["kind"] == "oom_kill"]


def _oom_finding(ctx: Context, oom: pd.DataFrame) -> Finding:
    hosts = sorted({h for h in oom["host"].dropna().astype(str) if not h.startswith("unknown:")})
    pids = sorted({int(p) for p in pd.to_numeric(oom["pid"], errors="coerce").dropna()})
    ranks = _ranks_of_pids(ctx, oom)
    who = (ranks_text(ranks) + " (" if ranks else "") + ("pid " + ", ".join(map(str, pids[:4])) if pids else
                                                        "a process") + (")" if ranks else "")
    where = f" on {', '.join(hosts[:3])}" if hosts else ""
    t = pd.to_numeric(oom["time_ns"], errors="coerce")
    return Finding(
        kind="process_exit", severity="error", confidence=0.8,
        headline=f"Process killed: the kernel's OOM killer took {who}{where}" + " ({since})",
        confidence_note="the kernel's own line; the rank is known only where a log ties its pid",
        summary=(f"The kernel's OOM killer killed {who}{where}: \"{str(oom.iloc[0]['message'])[:160]}\" "
                 f"({len(oom)} kill(s)); a rank killed this way leaves its peers waiting."),
        ranks=ranks, hosts=hosts, evidence=warns.evidence(oom, ["host", "time_ns", "kind", "pid", "message",
                                                                "artifact", "log_line"]), sql=OOM_SQL,
        action=(f"On {', '.join(hosts[:3]) or 'that host'}: the memory the job's processes use (host RAM: data "
                "loaders, pinned buffers), the container's limit; fewer workers or more memory"),
        score=KILLED_SCORE, since_ns=int(t.min()) if t.notna().any() else None,
        since_source="kernel log time" if t.notna().any() else None, details={"rule": "oom_kill", "pids": pids})


def _ranks_of_pids(ctx: Context, rows: pd.DataFrame) -> list[int]:
    """The ranks whose processes the other tables name: the same pid on the same host (or where
    either side knows no host)."""
    def real(h) -> bool:
        return isinstance(h, str) and not h.startswith("unknown:")
    want = [(h, int(p)) for h, p in zip(rows["host"], pd.to_numeric(rows["pid"], errors="coerce")) if pd.notna(p)]
    out = set()
    for name in ("process_exits", "nccl_warnings", "watchdog_events", "nccl_config"):
        t = ctx.model.tables.get(name)
        if t is None or t.empty or "pid" not in t or "rank" not in t:
            continue
        pids = pd.to_numeric(t["pid"], errors="coerce")
        for h, p, r in zip(t["host"], pids, pd.to_numeric(t["rank"], errors="coerce")):
            if pd.notna(p) and pd.notna(r) and any(int(p) == q and (h == wh or not real(h) or not real(wh))
                                                   for wh, q in want):
                out.add(int(r))
    return sorted(out)


def failed(ctx: Context) -> list[Finding]:
    """The ranks that aborted or exited with an error code (none killed from outside): the
    watchdog's teardown when the logs hold its timeout (a warning), else the job's failure."""
    ex = exits(ctx)
    if ex.empty or (ex["signal"].isin(KILL_SIGNALS) | (ex["kind"] == "slurm_oom")).any() or not _kernel_ooms(ctx).empty:
        return []
    wd = ctx.model.tables.get("watchdog_events")
    timed_out = wd is not None and len(wd) and wd["kind"].isin(("timeout", "terminated", "exception", "teardown")).any()
    own = ex[ex["signal"].ne("SIGTERM")]
    g = own if len(own) else ex
    ranks, hosts, who = _who(g)
    sigs = sorted(set(g["signal"].dropna().astype(str)))
    codes = sorted({int(c) for c in pd.to_numeric(g["exitcode"], errors="coerce").dropna()})
    how = "/".join(sigs) if sigs else "exit code " + ", ".join(map(str, codes[:3]))
    t = pd.to_numeric(g["time_ns"], errors="coerce")
    said = (_s(g.iloc[0].get("traceback")) or _s(g.iloc[0].get("error_file")))[:120]
    if timed_out:
        why = "PyTorch's watchdog takes the process down this way after a collective timeout: a consequence"
    elif not len(own):
        why = "stopped by its launcher after another failure"
    else:
        why = "its own output (a Python traceback, an assertion) says why"
    return [Finding(
        kind="process_exit", severity="warning" if timed_out or not len(own) else "error",
        confidence=0.5 if timed_out else 0.7,
        headline=f"Process failed: {who} ended with {how}" + " ({since})",
        summary=(f"{who[0].upper() + who[1:]} ended with {how} ({len(g)} report(s)" + (f", \"{said}\"" if said else "")
                 + f"): {why}."),
        ranks=ranks, hosts=hosts, evidence=warns.evidence(g, COLS), sql=SQL,
        action=(f"The last lines of {who}'s own output (its traceback or error file); "
                "torchrun's error_file where it names one"),
        score=1e5 if timed_out else warns.LOG_FINDING_SCORE, since_ns=int(t.min()) if t.notna().any() else None,
        since_source="the launcher's failure time" if t.notna().any() else None,
        details={"rule": "failed", "signals": sigs, "exitcodes": codes, "after_timeout": bool(timed_out)})]
