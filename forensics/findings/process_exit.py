"""``process_exit``: a rank's process died: killed by a signal, OOM-killed, or it exited failing.

The launchers say which process died and how (``process_exits``: torchrun's summary and agent
lines, Slurm's ``srun: error: ... Killed``, slurmstepd's OOM kill, Open MPI's ``exited on
signal``, torch.distributed.launch), the kernel says whom its OOM killer took (``kernel_events``
of kind ``oom_kill``). A rank killed from outside (SIGKILL: the OOM killer or the scheduler; a
crash: SIGSEGV, SIGBUS) is the culprit over the ranks that then time out waiting for it: its
finding ranks above the hang and the resets it causes. A rank that aborted (SIGABRT) or exited
with an error code while PyTorch's watchdog timed out is the watchdog's own teardown, a
consequence (a warning); without a timeout in the logs it is an error of its own. A Ray actor
that died (``ActorDiedError``: no exit code, no signal) is a failed process on the node its ip
names. The processes torchrun stopped after the first failure (``closing signal SIGTERM``) and
those DeepSpeed's launcher killed (``Killing subprocess``) are not blamed: where they are all
the logs say of a death, :func:`stopped` says that a worker failed unseen (DeepSpeed) or that the
job was stopped from outside (torchrun's agent got a death signal), blaming none of them.
"""
from __future__ import annotations

import re

import pandas as pd

from . import warns
from ..coerce import cell_int
from .base import Context, Finding, detector
from .ranks import label, rank_directory
from ..wording import ranks_text

KILLED_SCORE = 3.5e6          # above the first NCCL failure (3e6) and the hang (1e6 + s) a killed rank causes
KILL_SIGNALS = ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
COLS = ["host", "rank", "local_rank", "pid", "kind", "exitcode", "signal", "traceback", "time_ns", "artifact",
        "log_line"]
NOT_DEATHS = ("sigterm", "agent_signal", "deepspeed_kill")   # the launcher stopping processes, not one dying
STOPS = ("agent_signal", "deepspeed_kill")
SQL = ("SELECT host, rank, local_rank, pid, kind, exitcode, signal, traceback, time_ns, artifact, log_line "
       "FROM process_exits WHERE kind NOT IN ('sigterm', 'agent_signal', 'deepspeed_kill') AND (signal IS NOT NULL "
       "OR exitcode <> 0 OR kind = 'ray_actor_died') ORDER BY time_ns NULLS LAST, artifact, log_line")
STOP_SQL = ("SELECT host, rank, local_rank, pid, kind, exitcode, signal, traceback, time_ns, artifact, log_line "
            "FROM process_exits WHERE kind IN ('agent_signal', 'deepspeed_kill', 'sigterm') "
            "ORDER BY time_ns NULLS LAST, artifact, log_line")
OOM_SQL = ("SELECT host, time_ns, kind, pid, message, artifact, log_line FROM kernel_events WHERE kind = 'oom_kill' "
           "ORDER BY time_ns NULLS LAST, artifact, log_line")


@detector("process_exit", kinds=("process_exit",))
def process_exit(ctx: Context) -> list[Finding]:
    found = killed(ctx) + failed(ctx) + stopped(ctx)
    return found or vanished(ctx)


def exits(ctx: Context) -> pd.DataFrame:
    """The failed processes' rows (no SIGTERM torchrun sent, no process its launcher stopped, no
    clean exit; a Ray actor's death, which has no code), in time and line order."""
    ex = ctx.model.tables.get("process_exits")
    if ex is None or ex.empty:
        return pd.DataFrame(columns=COLS)
    code = pd.to_numeric(ex["exitcode"], errors="coerce")
    bad = ex[~ex["kind"].isin(NOT_DEATHS) & (ex["signal"].notna() | (code.fillna(0) != 0)
                                             | (ex["kind"] == "ray_actor_died"))]
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
        layer="peer", chain=[f"{first['kind']} line(s) of the launcher: {who} ended by {how}"
                             + (f" (\"{said}\")" if said else ""),
                             "a signal from outside, not an error of its own: the first failure",
                             "the ranks that waited for it in a collective then lose their connections or time out"],
        details={"rule": "killed", "signals": sigs, "oom": bool(is_oom), "processes": int(len(hard))})]


THREADS_END_RE = re.compile(r"^threads@pid(\d+):end$")
VANISHED_SQL = ("SELECT host, pid, rank, op, op_count, comm_id_hash, timestamp_ns, completed FROM nccl_events "
                "WHERE pid = {pid} ORDER BY timestamp_ns DESC LIMIT 20")


def gone_processes(model) -> list[tuple[str, int, int | None]]:
    """(capture host, pid, rank) of the traced processes that ended while their capture ran:
    the capture's end-of-capture thread listing of the pid was skipped because the process
    had exited (``threads@pid<P>:end``, reason ``process exited``)."""
    out = []
    for c in model.captures:
        ranks = {p.get("pid"): p.get("rank") for p in c.get("processes", []) or []}
        for col in c.get("collectors", []) or []:
            m = THREADS_END_RE.match(str(col.get("name") or ""))
            if m and col.get("reason") == "process exited":
                pid = int(m[1])
                out.append((str(c.get("host")), pid, ranks.get(pid)))
    return out


# the states of a socket its own process closed (or whose process died: the kernel closes its
# sockets): a reset the kernel sends from one of them answers a peer still sending to it
CLOSED_BY_OWNER = ("FIN_WAIT1", "FIN_WAIT2", "TIME_WAIT", "CLOSING", "LAST_ACK", "CLOSE")
CLOSED_CLASSES = ("socket_closed", "socket_broken_pipe")


def vanished(ctx: Context) -> list[Finding]:
    """A rank whose process ended during the capture without an error of its own (no NCCL
    warning, no watchdog line from it), before every other rank that ended, while its peers
    failed: it was killed from outside (SIGKILL, a crash) where no launcher line says so.
    Evidence: the capture saw the pid go (its end-of-capture listing found no process), and
    either the tracer's last record of it is a collective it entered and never completed (it
    died in flight), or it died between collectives (:func:`between_collectives`): its last
    collective completed, its peers then entered the next one and waited in it, and its
    connections were closed from its side (its peers' NCCL warnings, its kernel's resets from
    sockets its process had closed). The ranks that then fail are its consequence; the
    finding ranks above them (KILLED_SCORE)."""
    ne = ctx.model.tables.get("nccl_events")
    if ne is None or ne.empty:
        return []
    own_err = set()
    for name in ("nccl_warnings", "watchdog_events"):
        t = ctx.model.tables.get(name)
        if t is not None and len(t) and "rank" in t:
            own_err |= {int(r) for r in pd.to_numeric(t["rank"], errors="coerce").dropna()}
    pids = pd.to_numeric(ne["pid"], errors="coerce")
    cands = []
    for host, pid, rank in gone_processes(ctx.model):
        mine = ne[(pids == pid) & (ne["host"] == host)]
        if rank is None and mine["rank"].notna().any():
            rank = int(pd.to_numeric(mine["rank"], errors="coerce").dropna().iloc[0])
        if mine.empty or rank is None or int(rank) in own_err:
            continue
        last = cell_int(pd.to_numeric(mine["timestamp_ns"], errors="coerce").max())
        if last is None:
            continue                            # calls with no time: nothing to order them by
        open_ = mine[mine["completed"].eq(False)]
        if len(open_):
            cands.append((last, host, pid, int(rank), open_.sort_values("timestamp_ns").iloc[0], None))
            continue
        # it ended between collectives: a normal end, unseen, or killed before its next call
        between = between_collectives(ctx, ne, mine, int(rank), last)
        if between is not None:
            cands.append((last, host, pid, int(rank), between[0], between[1]))
    if not cands:
        return []
    cands.sort(key=lambda c: c[0])
    last, host, pid, rank, op, closed = cands[0]
    peers_err = sorted(own_err - {rank})
    if not peers_err:
        # no peer reacted to its death (no NCCL error, no watchdog line): the job ended or was
        # torn down around it (a hang's teardown kills the ranks one by one), not a rank killed
        return []
    info = rank_directory(ctx).get(rank)
    who = label(rank_directory(ctx), rank) + ("" if info is not None and info.host else f" on {host}")
    return [_vanished_finding(ne[pids == pid], (host, who), pid, rank, op, closed, last, peers_err)]


def between_collectives(ctx: Context, ne: pd.DataFrame, mine: pd.DataFrame, rank: int,
                        last: int) -> tuple[pd.Series, str] | None:
    """(the first collective its peers entered after its last one on that communicator and
    never completed, how its connections were seen closed from its side) for a rank whose
    traced calls all completed, or None. Both are needed: peers waiting in a collective it
    never entered make it the one behind; its connections closed from its side (a peer's NCCL
    warning that it closed the connection, or its own kernel answering with resets from
    sockets its process had closed, after its last call) say it ended rather than hung before
    its next call (a rank stuck in host code keeps its connections). A peer's watchdog timeout
    before the close (or with the close's time unknown) says they waited it out: the close is
    then the teardown of a hang, and None."""
    waited = []
    ops = pd.to_numeric(ne["op_count"], errors="coerce")
    for comm, g in mine.groupby("comm_id_hash", sort=False):
        top = pd.to_numeric(g["op_count"], errors="coerce").max()
        if pd.isna(top):
            continue
        later = ne[(ne["comm_id_hash"] == comm) & (ops > top) & ne["completed"].eq(False)
                   & ~ne.index.isin(mine.index)]
        if len(later):
            waited.append(later.sort_values(["op_count", "timestamp_ns"]).iloc[0])
    if not waited:
        return None
    closed = _closed_from(ctx, rank, last)
    if closed is None or _timed_out_before(ctx, rank, closed[1]):
        return None
    return min(waited, key=lambda r: r["timestamp_ns"]), closed[0]


def _closed_from(ctx: Context, rank: int, after_ns: int) -> tuple[str, int | None] | None:
    """(in words, when first or None) how ``rank``'s connections were seen closed from its
    side: its peers' NCCL warnings that the remote peer (it) closed the connection, or its
    kernel sending resets after ``after_ns`` from sockets of its in a closed state
    (CLOSED_BY_OWNER); None if neither."""
    w = ctx.model.tables.get("nccl_warnings")
    if w is not None and len(w) and {"class", "peer_rank", "rank"} <= set(w.columns):
        pr = pd.to_numeric(w["peer_rank"], errors="coerce")
        said = w[w["class"].isin(CLOSED_CLASSES) & (pr == rank)]
        if len(said):
            who = sorted({int(r) for r in pd.to_numeric(said["rank"], errors="coerce").dropna()})
            t = pd.to_numeric(said["time_ns"], errors="coerce").min() if "time_ns" in said else None
            return ((ranks_text(who) if who else "its peers") + " logged that it closed their connections (NCCL: \""
                    + str(said.iloc[0]["message"])[:80] + "\")", cell_int(t))
    t = ctx.model.tables.get("tcp_events")
    if t is not None and len(t) and {"event", "rank", "state"} <= set(t.columns):
        ts = pd.to_numeric(t["timestamp_ns"], errors="coerce")
        rs = t[(t["event"] == "tcp_send_reset") & (pd.to_numeric(t["rank"], errors="coerce") == rank)
               & t["state"].isin(CLOSED_BY_OWNER) & (ts > after_ns)]
        if len(rs):
            states = "/".join(sorted(set(rs["state"].astype(str))))
            return (f"its kernel then sent {len(rs)} reset(s) from its closed sockets ({states}) to peers still "
                    "sending to it", cell_int(ts[rs.index].min()))
    return None


def _timed_out_before(ctx: Context, rank: int, closed_ns: int | None) -> bool:
    """Whether another rank's watchdog timed out before ``closed_ns`` (any timeout when the
    close's time is not known, or the timeout's)."""
    wd = ctx.model.tables.get("watchdog_events")
    if wd is None or wd.empty or "kind" not in wd:
        return False
    to = wd[(wd["kind"] == "timeout") & (pd.to_numeric(wd["rank"], errors="coerce") != rank)]
    if to.empty:
        return False
    t = pd.to_numeric(to["time_ns"], errors="coerce")
    return closed_ns is None or bool(t.isna().any()) or bool((t < closed_ns).any())


def _vanished_finding(rows: pd.DataFrame, where: tuple[str, str], pid: int, rank: int, op: pd.Series,
                      closed: str | None, last: int, peers_err: list[int]) -> Finding:
    """The finding of a rank that vanished: ``op`` the collective in flight on it when it died
    (``closed`` None), or the one its peers waited for it in (``closed``: how its connections
    were seen closed); ``where``: (its capture's host, the rank as headlines name it)."""
    host, who = where
    n = int(op["op_count"]) if pd.notna(op["op_count"]) else None
    name = str(op["op"] or "a collective")
    what = name + (f" #{n}" if n is not None else "")
    gone = (f"the capture on {host} saw pid {pid} (rank {rank}) end: its end-of-capture thread listing found no "
            "process")
    if closed is None:
        chain = [gone, f"the tracer's last records of it: {what} entered, never completed (in flight when it died)",
                 "it logged no NCCL warning and no watchdog line of its own: it did not fail, it was ended"]
        when, headline = f"while {what} was in flight on it", "ended mid-collective"
        in_flight = n
    else:
        chain = [gone + "; " + closed,
                 f"the tracer's last records of it: every call completed; its peers then entered {what} and waited "
                 "in it: it never entered it",
                 "it logged no NCCL warning and no watchdog line of its own: it did not fail, it was ended"]
        when, headline = f"between collectives (its peers then waited for it in {what})", "ended between collectives"
        in_flight = None
    chain.append("its peers then failed: " + ranks_text(peers_err) + " logged NCCL errors or watchdog lines")
    return Finding(
        kind="process_exit", severity="error", confidence=0.7,
        headline=f"Process vanished: {who} {headline}, killed from outside" + " ({since})",
        confidence_note="the capture saw the process go with a collective in flight and no error of its own; "
                        "no launcher line names the signal" if closed is None else
                        "the capture saw the process go, its peers wait for it and its connections close from its "
                        "side, with no error of its own; no launcher line names the signal",
        summary=(f"Rank {rank}'s process (pid {pid} on {host}) ended {when}, without an NCCL error or a watchdog "
                 "line of its own: it was killed from outside (SIGKILL: the OOM killer or the scheduler; or a crash). "
                 "The ranks that then lost their connections or timed out are its consequence, not the cause."),
        ranks=[rank], hosts=[host], peer_ranks=peers_err,
        evidence=warns.evidence(rows.sort_values("timestamp_ns").tail(10),
                                ["host", "pid", "rank", "op", "op_count", "comm_id_hash", "timestamp_ns", "completed"]),
        sql=VANISHED_SQL.format(pid=pid),
        action=(f"On {host}: dmesg for the OOM killer or a segfault at that time (\"Killed process {pid}\", "
                "\"segfault at\"), the container's or scheduler's record of the process (OOMKilled, a preemption), "
                "a core dump"),
        score=KILLED_SCORE, op_count=n, since_ns=last, since_source="tracer: the process's last record",
        layer="peer", chain=chain,
        details={"rule": "vanished", "pid": pid, "in_flight_op": in_flight}
        | ({} if closed is None else {"waited_op": n}))


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
    own = ex[ex["signal"].astype("string").fillna("") != "SIGTERM"]
    g = own if len(own) else ex
    ranks, hosts, who = _who(g)
    sigs = sorted(set(g["signal"].dropna().astype(str)))
    codes = sorted({int(c) for c in pd.to_numeric(g["exitcode"], errors="coerce").dropna()})
    # a Ray actor's death says neither: its reason stands in the traceback
    how = "/".join(sigs) if sigs else "exit code " + ", ".join(map(str, codes[:3])) if codes else None
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
        headline=(f"Process failed: {who} ended with {how}" if how else f"Process died: {who}") + " ({since})",
        summary=(f"{who[0].upper() + who[1:]} " + (f"ended with {how}" if how else "died") + f" ({len(g)} report(s)"
                 + (f", \"{said}\"" if said else "") + f"): {why}."),
        ranks=ranks, hosts=hosts, evidence=warns.evidence(g, COLS), sql=SQL,
        action=(f"The last lines of {who}'s own output (its traceback or error file); "
                "torchrun's error_file where it names one"),
        score=1e5 if timed_out else warns.LOG_FINDING_SCORE, since_ns=int(t.min()) if t.notna().any() else None,
        since_source="the launcher's failure time" if t.notna().any() else None,
        details={"rule": "failed", "signals": sigs, "exitcodes": codes, "after_timeout": bool(timed_out)})]


def stopped(ctx: Context) -> list[Finding]:
    """Where the only deaths the logs tell are processes a launcher stopped: DeepSpeed's launcher
    killing its workers (it does after one of them failed, or when it is interrupted: the
    failed one's own lines are not in the logs), or torchrun's agent receiving a death signal
    (the job stopped from outside: the scheduler, a preemption, a user) and sending its workers
    SIGTERM. One finding that blames none of the stopped processes."""
    ex = ctx.model.tables.get("process_exits")
    if ex is None or ex.empty or not exits(ctx).empty or not _kernel_ooms(ctx).empty:
        return []
    g = ex[ex["kind"].isin(STOPS)]
    if g.empty:
        return []
    t = pd.to_numeric(g["time_ns"], errors="coerce")
    hosts = sorted({h for h in g["host"].dropna().astype(str) if not h.startswith("unknown:")})
    where = f" on {', '.join(hosts[:3])}" if hosts else ""
    stopped_pids = sorted({int(p) for p in pd.to_numeric(ex.loc[ex["kind"].isin(("sigterm", "deepspeed_kill")), "pid"],
                                                          errors="coerce").dropna()})
    n = len(stopped_pids)
    if (g["kind"] == "deepspeed_kill").any():
        severity, kind = "error", "deepspeed_kill"
        headline = f"Process failed: a worker failed and the DeepSpeed launcher killed its {n} subprocesses{where}"
        summary = (f"DeepSpeed's launcher killed its {n} worker subprocess(es){where} (pid "
                   f"{', '.join(map(str, stopped_pids[:8]))}{' ...' if n > 8 else ''}): it does so after one worker "
                   "exited failing (or when it is interrupted). The failed worker's own error is not in these lines; "
                   "the killed processes are its consequence, not the cause.")
        action = ("The output of every worker before the 'Killing subprocess' lines (the first traceback, an exit "
                  "code), and the launcher's own 'exits with return code' line")
    else:
        sig = str(g.loc[g["kind"] == "agent_signal", "signal"].dropna().iloc[0]) \
            if g["signal"].notna().any() else "a death signal"
        severity, kind = "error", "agent_signal"
        headline = f"Job stopped from outside: torchrun's agent{where} received {sig} and stopped its workers"
        summary = (f"torchrun's agent{where} received {sig} and sent its {n} worker(s) SIGTERM (pid "
                   f"{', '.join(map(str, stopped_pids[:8]))}{' ...' if n > 8 else ''}): the job was stopped from "
                   "outside (the scheduler's time limit or a cancel, a preemption, a user, or the job's own "
                   "controller after a failure elsewhere); no worker is blamed.")
        action = ("Who sent the signal: the scheduler's record of the job (time limit, cancel, preemption), the "
                  "controller's log; if the job hung before, its watchdog lines and stacks")
    return [Finding(
        kind="process_exit", severity=severity, confidence=0.5,
        headline=headline + " ({since})", summary=summary,
        confidence_note="the launcher's lines tell the processes it stopped, not the first failure",
        ranks=[], hosts=hosts, evidence=warns.evidence(ex[ex["kind"].isin(STOPS + ("sigterm",))], COLS),
        sql=STOP_SQL, action=action, score=warns.LOG_FINDING_SCORE,
        since_ns=int(t.min()) if t.notna().any() else None,
        since_source="the launcher's line time" if t.notna().any() else None,
        details={"rule": f"stopped_{kind}", "stopped_pids": stopped_pids})]
