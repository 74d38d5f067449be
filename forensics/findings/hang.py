"""Hangs, per communicator: ``hang_mismatch``, ``hang_host`` and ``hang_stuck``.

Every finding of these kinds comes from this module, whichever evidence saw the hang: the
tracer's calls (``hang_mismatch``, ``collective_mismatch``, ``hang_stuck``, below), else
(``hang_state``) the state at capture (:mod:`.state`), else NCCL RAS's report of the ranks
behind and the Flight Recorder analyzer's of the ranks missing or culprit (:mod:`.reports`), else
PyTorch's watchdog lines in the job's logs (:mod:`.timeouts`),
as the declared precedence of :mod:`.precedence` says.

From the tracer: a communicator is hung when some rank sits inside a collective it never
completed and nothing completed on the communicator for a while before the capture ended
(``HANG_MIN_NS``, or several times its normal collective duration); the hang point is the
model's (:func:`forensics.model.progress.hang_frontiers`: how each rank is classed, stuck
inside an op or idle), which the report marks too:

- ``hang_mismatch``: some ranks never entered #n and are idle (they completed all they
  entered: another code path, or they died) while others wait inside #n. The blame goes
  to the ranks behind; the last op each rank reached is listed, with its Python stack
  when the bundle has py-spy dumps.
- ``hang_host``: a ``hang_mismatch`` whose one rank behind is seen stuck in its own host code
  (:mod:`.host_stall`: its main thread on a CPU, or blocked in a syscall of its own, outside
  NCCL): the collective was never enqueued because that rank never got there (a busy loop, a
  deadlock, blocking I/O). Whichever evidence found the mismatch (the tracer, the state at
  capture, the reports), the same rule turns it into this kind (:func:`host_side`); where the
  capture shows nothing of the rank (the logs alone, no thread sampled after the hang began),
  or shows it parked or inside another NCCL call, it stays ``hang_mismatch``. Until the job's
  collective timeout passes it is a warning: a slow phase (a checkpoint) looks the same.
- ``hang_stuck``: every rank waits inside a collective (the same #n, or a rank stuck in
  #n that its peers completed before moving on to #n+1). NCCL RAS counts launches, so it
  reports the first case as healthy; the explanation is on the ring's links. The first
  TCP trouble between the communicator's ranks after the last progress decides: a reset
  names the connection and the side that sent it; retransmissions into silence name the
  endpoint the retransmitting connections share (a downed port or cable).

Host-side completion is bounded by host waits (DESIGN: asynchronous calls): a wait that
never returned leaves every collective before it open, so "stuck inside #n" means "#n or
a later op of the same burst".

Communicators created before the tracer attached have no id (their calls are keyed per
process, and op counts start at the attach): they cannot be compared across ranks and
are left out; the capture should start before the job (or at least before its
communicators are created) for hang verdicts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from . import timeouts, warns
from ..coerce import cell_int
from .base import Context, Finding, detector
from ..model import progress
from ..model.progress import capture_end_ns, is_per_process
from ..tcp.classes import LOSS_CLASSES
from ..wording import ms, ranks_text
from .ranks import WORLD_RANK_SQL, label, rank_directory, who_text, world_rank_map
from .trouble import dedup_counts, kernel_logged_reset, shared_endpoint, trouble_events, trouble_rows, trouble_rows_sql
from .host_stall import HostActivity, host_activity, stacks_after
from .silent_rank import silent_rank
from .precedence import FR_DUMPS, FR_REPORT, RAS_REPORT, STATE_HANGS, TRACER, WATCHDOG, consult, sees
from .sql import sql_int, sql_list, sql_str

KINDS = ("hang_mismatch", "hang_stuck", "hang_host")
# the sources hang_state consults, in this order (each under its precedence)
LATE_SOURCES = (STATE_HANGS, RAS_REPORT, FR_REPORT, FR_DUMPS, WATCHDOG)
SILENCE_GAP_NS = 50_000_000    # the blamed links' last packet this much before the others' is worth saying
MAX_EVIDENCE = 20


def hang_frontiers(ctx) -> pd.DataFrame:
    """The model's hang points (:func:`forensics.model.progress.hang_frontiers`: one row per hung
    communicator, its kind, op and the ranks inside and behind), once per analysis."""
    return ctx.memo("hang_frontiers", lambda: progress.hang_frontiers(ctx.model))


@sees(TRACER)
def tracer_saw(ctx: Context) -> bool:
    """The witness ``tracer`` of :mod:`.precedence`: a communicator the tracer saw hang."""
    return len(hang_frontiers(ctx)) > 0


def _size_note(h) -> str:
    claimed = getattr(h, "nranks_claimed", None)
    if claimed is None or pd.isna(claimed):
        return ""
    return (f" (the bundle claims {int(claimed)} ranks on this communicator, not believable for the "
            f"{len(h.members)} traced: only those are counted)")


def _numbering(ctx, comm: str) -> tuple[str, dict]:
    """(summary note, details entries) on what the communicator's op numbers count from
    (``nccl_events.op_count_source``, model/op_align.py): nothing to say when every rank's are
    the job's own (the tracer saw the init, or NCCL's COLL lines gave them); else the ranks
    aligned by time to others or across a restart (estimates), or numbers that count from the
    first call any tracer saw, and ``op_numbering``: the ranks of each source."""
    n = ctx.table("nccl_events")
    if "op_count_source" not in n:
        return "", {}
    n = n[(n["comm_id_hash"] == comm) & n["op_count"].notna() & n["rank"].notna()]
    by = n.groupby(n["op_count_source"].astype("string").fillna("init"))["rank"].agg(
        lambda r: sorted({int(x) for x in r}))
    src = {str(k): v for k, v in by.items()}
    details = {"op_numbering": src}
    if "attach" in src:
        return ("; op numbers count from the first call the tracer saw (no init, NCCL COLL line or Flight "
                "Recorder entry gave the job's own)"), details
    if "estimated" in src:
        return (f"; the op numbers of {ranks_text(src['estimated'])} are estimated across a restart of the "
                "tracer (counted again from 0; the calls in the gap from their rate before it)"), details
    if "peers" in src:
        return (f"; the op numbers of {ranks_text(src['peers'])} are the job's as estimated from the "
                "times of their calls against ranks whose counts are known"), details
    return "", {}


def _last_ops(ctx, comm: str) -> pd.DataFrame:
    """Per rank of the communicator: the last op it entered (op_count, op, time, completed)
    and the last op it completed."""
    n = ctx.table("nccl_events")
    n = n[(n["comm_id_hash"] == comm) & n["op_count"].notna() & n["rank"].notna()]
    if n.empty:
        return pd.DataFrame(columns=["rank", "last_op_count", "last_op", "last_entry_ns", "last_completed_op_count"])
    n = n.sort_values(["rank", "op_count"], kind="stable")
    last = n.drop_duplicates("rank", keep="last")
    comp = n[n["completed"].fillna(False).astype(bool)].groupby("rank")["op_count"].max()
    out = pd.DataFrame({"rank": last["rank"].astype("int64").to_numpy(),
                        "last_op_count": last["op_count"].astype("int64").to_numpy(),
                        "last_op": last["op"].to_numpy(), "last_entry_ns": last["timestamp_ns"].to_numpy(),
                        "host": last["host"].to_numpy(), "pid": last["pid"].to_numpy()})
    out["last_completed_op_count"] = out["rank"].map(comp).astype("Int64")
    return out


def _last_ops_sql(comm: str, waiting=None) -> str:
    """The rows of :func:`_last_ops` (the evidence of both hang findings), with each rank's
    global rank (its rank on the largest communicator its process belongs to) and, for a
    mismatch, whether it waits inside the collective (``waiting``: comm ranks)."""
    inside = (f",\n       rank IN ({sql_list(int(r) for r in waiting)}) AS in_collective_n" if waiting
              else ",\n       false AS in_collective_n" if waiting is not None else "")
    return f"""WITH {WORLD_RANK_SQL}, l AS (
  SELECT rank, max(op_count) AS last_op_count, arg_max(op, op_count) AS last_op,
         arg_max(timestamp_ns, op_count) AS last_entry_ns,
         max(op_count) FILTER (WHERE completed) AS last_completed_op_count,
         arg_max(host, op_count) AS host, arg_max(pid, op_count) AS pid
  FROM nccl_events WHERE comm_id_hash = {sql_str(comm)} AND op_count IS NOT NULL AND rank IS NOT NULL
  GROUP BY rank
)
SELECT l.rank, coalesce(w.global_rank, l.rank) AS global_rank, last_op_count, last_op, last_entry_ns,
       last_completed_op_count, l.host, l.pid{inside}
FROM l LEFT JOIN w USING (host, pid) ORDER BY l.rank LIMIT {MAX_EVIDENCE}"""


def _last_ops_rows(last: pd.DataFrame, names: "_Names", waiting=None) -> list[dict]:
    """:func:`_last_ops` as evidence rows (the columns of :func:`_last_ops_sql`)."""
    rows = []
    for x in last.sort_values("rank", kind="stable").head(MAX_EVIDENCE).itertuples(index=False):
        r = {"rank": int(x.rank), "global_rank": names.glob(x.rank),
             "last_op_count": int(x.last_op_count), "last_op": x.last_op,
             "last_entry_ns": int(x.last_entry_ns) if pd.notna(x.last_entry_ns) else None,
             "last_completed_op_count": int(x.last_completed_op_count)
             if pd.notna(x.last_completed_op_count) else None,
             "host": x.host, "pid": int(x.pid) if pd.notna(x.pid) else None}
        if waiting is not None:
            r["in_collective_n"] = int(x.rank) in waiting
        rows.append(r)
    return rows


class _Names:
    """How a hang sentence names a comm rank: its global rank ("rank 5 (host, addr)") when the
    process is known, else the comm rank itself on the world communicator, else explicitly
    "comm rank 3" (a rank of a sub-communicator that was never traced has no known global rank)."""

    def __init__(self, ctx, gmap: pd.DataFrame, comm: str, directory):
        # comm_id_hash is NA for a call whose communicator the tracer never saw created: not this one
        g = gmap[gmap["comm_id_hash"].eq(comm).fillna(False).to_numpy(bool)].dropna(subset=["rank", "global_rank"])
        self.map = dict(zip(g["rank"].astype("int64"), g["global_rank"].astype("int64")))
        n = ctx.table("nccl_events")
        sizes = pd.to_numeric(n["nranks"], errors="coerce")
        mine = sizes[n["comm_id_hash"].eq(comm).fillna(False).to_numpy(bool)]
        self.world = bool(len(mine.dropna())) and float(mine.max()) >= float(sizes.max())
        self.directory = directory

    def known(self, r: int) -> bool:
        return int(r) in self.map or self.world

    def glob(self, r: int) -> int:
        return int(self.map.get(int(r), int(r)))

    def short(self, r: int) -> str:
        return f"rank {self.glob(r)}" if self.known(r) else f"comm rank {int(r)}"

    def long(self, r: int) -> str:
        return label(self.directory, self.glob(r)) if self.known(r) else f"comm rank {int(r)}"

    def many(self, ranks) -> str:
        rs = sorted(int(r) for r in ranks)
        known = [self.glob(r) for r in rs if self.known(r)]
        other = [r for r in rs if not self.known(r)]
        parts = ([ranks_text(known)] if known else []) + \
            ([("comm rank " if len(other) == 1 else "comm ranks ") + ", ".join(map(str, other))] if other else [])
        return " and ".join(parts) if parts else "no rank"


# --------------------------------------------------------------------------- mismatch

@detector("hang_mismatch", kinds=KINDS)
def hang_mismatch(ctx: Context) -> list[Finding]:
    fr = hang_frontiers(ctx)
    fr = fr[fr["kind"] == "mismatch"]
    if fr.empty:
        return []
    gmap, directory = world_rank_map(ctx), rank_directory(ctx)
    out = []
    for h in fr.itertuples(index=False):
        comm, n = h.comm_id_hash, int(h.op_count)
        last = _last_ops(ctx, comm)
        names = _Names(ctx, gmap, comm, directory)
        missing = sorted(int(x) for x in h.missing_ranks)
        waiting = sorted(int(x) for x in h.ranks)
        traced = set(last["rank"])
        untraced = [r for r in missing if r not in traced]
        # global ranks where known (a never-traced rank of a sub-communicator has none)
        g_missing = sorted(names.glob(r) for r in missing if names.known(r))
        g_waiting = sorted(names.glob(r) for r in waiting if names.known(r))
        lr = last.set_index("rank")

        def reached(r: int) -> str:
            if r not in lr.index:
                return f"{names.short(r)}: no call traced"
            x = lr.loc[r]
            return f"{names.short(r)}: #{int(x.last_op_count)} {x.last_op}"
        missing_txt = "; ".join(reached(r) for r in missing)
        who = ", ".join(names.long(r) for r in missing)
        others = int(last.loc[last["rank"].isin(waiting), "last_op_count"].max()) if len(last) else n
        summary = (f"Hang (rank mismatch) on communicator {comm}: {who} never entered collective #{n} "
                   f"({h.op}); {names.many(waiting)} entered it and were still inside when the capture ended, "
                   f"{ms(h.waited_ns)} later{_started(h)} (last op reached: {missing_txt}; the others launched up to "
                   f"#{others}){_size_note(h)}{_numbering(ctx, comm)[0]}.")
        if untraced:
            summary = summary[:-1] + f"; {names.many(untraced)} had no traced call at all (were they captured?)."
        since = h.last_progress_ns if pd.notna(h.last_progress_ns) else h.first_entry_ns
        stacks = {r: rank_stack(ctx, r, int(since)) for r in g_missing}
        for r, frames in stacks.items():
            if frames:
                summary = summary[:-1] + f"; rank {r}'s stack: {' <- '.join(frames[:3])}."
        evidence = _last_ops_rows(last, names, waiting)
        out.append(host_side(ctx, Finding(
            kind="hang_mismatch", severity="error", confidence=0.6 if untraced else 0.9, summary=summary,
            confidence_note=("lower: some ranks had no traced call (were they captured?)" if untraced else
                             "the tracer saw every rank's calls: who entered the collective and who did not"),
            headline="Hang: {who} never entered " + f"{h.op} #{n}" + "; {peers} wait in it ({since})",
            op_count=n, since_ns=int(since), since_source=TRACER_SOURCE,
            since_precision_ns=_precision(h),
            ranks=g_missing, hosts=sorted({directory[r].host for r in g_missing if r in directory and
                                          directory[r].host}),
            peer_ranks=g_waiting, evidence=evidence, sql=_last_ops_sql(comm, waiting), score=1e6 + h.waited_ns / 1e9,
            action=(f"Find why {names.many(missing)} skipped collective #{n}: a data-dependent branch, an "
                    "exception swallowed on that rank, uneven batches or early stopping on one rank; dump its "
                    "Python stack (py-spy dump --pid) and compare the code paths. The waiting ranks are healthy."),
            details={"comm_id_hash": comm, "op_count": n, "op": h.op, "missing_ranks": g_missing,
                     "waiting_ranks": g_waiting, "missing_comm_ranks": missing, "waiting_comm_ranks": waiting,
                     "waited_ns": int(h.waited_ns), "first_entry_ns": int(h.first_entry_ns),
                     "untraced_ranks": untraced,
                     "nranks_claimed": None if pd.isna(h.nranks_claimed) else int(h.nranks_claimed),
                     "stacks": {str(r): f for r, f in stacks.items() if f},
                     **_numbering(ctx, comm)[1]})))
    return out


def host_side(ctx, f: Finding) -> Finding:
    """``f`` as a ``hang_host`` finding when it is a ``hang_mismatch`` of one rank behind (not a
    different call at one position) and the capture shows that rank stuck in its own host code
    (:func:`.host_stall.host_activity`); else ``f`` itself. The chain: it never enqueued #n while
    its peers wait inside it, what its main thread was doing, what that means (layer ``host``).
    A checkpoint or an evaluation looks the same until the job's collective timeout
    (:func:`.timeouts.collective_timeout`) passes: younger than that, with no watchdog fired, it
    is a warning ("Stall (host side)") naming the rank everybody waits for and how far into the
    timeout it is; an error once the timeout passed, a watchdog fired, or its age is unknown."""
    if f.kind != "hang_mismatch" or len(f.ranks) != 1 or "calls" in f.details or "fr_seq_id" in f.details:
        return f
    r = int(f.ranks[0])
    act = host_activity(ctx, r, f.since_ns)
    if act is None:
        return f
    n = f.details.get("op_count") if f.details.get("op_count") is not None else f.op_count
    op = f.details.get("op")
    at = (f"{op} #{n}" if op else f"collective #{n}") if n is not None else "the collective its peers wait in"
    peers = ranks_text(f.peer_ranks) if len(f.peer_ranks) else "the other ranks"
    what = "a busy loop or livelock" if act.mode == "spin" else "blocking I/O or a lock that never returns"
    age = _stall_age(ctx, f)
    timeout_ms, timeout_src = timeouts.collective_timeout(ctx)
    young = age is not None and age < timeout_ms * 1_000_000 and not timeouts.timed_out_ranks(ctx)
    limit = timeouts.timeout_text(timeout_ms)
    chain = [f"rank {r} never enqueued {at}; {peers} enqueued it and wait inside it", act.text()]
    if young:
        # a checkpoint, an evaluation or a data-loader refill looks the same until the timeout
        # passes: the rank everybody waits for is named, as a warning, not yet called a hang
        within = (f"{ms(age)} into the job's {limit} collective timeout ({timeout_src}); "
                  "no watchdog has fired")
        chain.append(f"the collective is not yet enqueued: rank {r} is in its own host code before NCCL, {within}: "
                     f"a slow phase (a checkpoint, an evaluation) or a hang ({what}), not yet told apart; its GPU, "
                     "its links and its peers are not the cause")
        summary = (f.summary.replace("Hang (rank mismatch)", "Stall (host side)", 1)
                   + f" Rank {r} is in host code, not on another code path: " + act.text()
                   + f"; {within}: a slow phase or a hang, not yet told apart.")
        headline = ("Stall: {who} in host code before " + at + f" ({act.doing()}), {ms(age)} of a "
                    f"{limit} timeout; " + "{peers} wait for it ({since})")
        hang_action = _host_action(r, act)
        action = (f"If rank {r} is checkpointing or evaluating, this ends by itself; if it is still stalled near the "
                  f"{limit} timeout, it is a hang: " + hang_action[0].lower()
                  + hang_action[1:])
    else:
        chain.append(f"the collective was never enqueued: rank {r} is stuck in its own host code before NCCL "
                     f"({what}); its GPU, its links and its peers are not the cause")
        summary = (f.summary.replace("Hang (rank mismatch)", "Hang (host-side stall)", 1)
                   + f" Rank {r} is stuck in host code, not on another code path: " + act.text() + ".")
        headline = "Hang: {who} stuck in host code before " + at + f" ({act.doing()}); " + "{peers} wait in it ({since})"
        action = _host_action(r, act)
    return replace(
        f, kind="hang_host", layer="host", chain=chain, summary=summary, op_count=n if n is not None else f.op_count,
        severity="warning" if young else f.severity, headline=headline,
        confidence=min(f.confidence, 0.9 if act.frames else 0.8),
        confidence_note=(f.confidence_note + "; " if f.confidence_note else "") + (
            "its main thread's stack names the function" if act.frames else
            "lower: no stack of its main thread after the hang began, only its state"),
        action=action,
        details={**f.details, "host_activity": {"mode": act.mode, "tid": act.tid, "thread": act.thread,
                                                "syscall": act.syscall, "fd": act.fd, "fd_kind": act.fd_kind,
                                                "frames": act.frames, "cpu_share": act.cpu_share,
                                                "sources": act.sources},
                 "stalled_ns": age, "timeout_ms": timeout_ms, "timeout_source": timeout_src})


def _stall_age(ctx, f: Finding) -> int | None:
    """How long the peers had waited when the evidence ends (ns): the tracer's ``waited_ns``,
    else from the finding's ``since_ns`` to the capture's end; None when neither is known."""
    if f.details.get("waited_ns") is not None:
        return int(f.details["waited_ns"])
    end = capture_end_ns(ctx.model)
    if f.since_ns is None or end is None:
        return None
    return max(0, int(end) - int(f.since_ns))


def _host_action(r: int, act: HostActivity) -> str:
    where = f" in {act.frame}" if act.frame else ""
    if act.mode == "spin":
        head = f"Look at what rank {r} loops on{where}: a busy wait or livelock before its next collective"
    else:
        head = (f"Find what rank {r} waits for in {act.syscall}(2){where}: a pipe, file or lock that never returns "
                "(a dead data-loader worker, a deadlock)")
    return (head + "; py-spy dump --native --pid <its pid> on its host shows the Python frame. The waiting ranks, "
            "their GPUs and links are healthy: restarting without fixing that code path will hang again.")


P2P_OPS = ("SEND", "RECV")   # point-to-point calls differ between ranks by design
SIGNATURE = ["op", "count", "datatype", "reduce_op", "root_or_peer"]


def signature_mismatches(ctx) -> pd.DataFrame:
    """Per communicator, the first collective whose call differs between ranks (op, count,
    datatype, reduction, root): ranks that skipped or reordered a collective and went on.
    NCCL then fails with "message truncated" or hangs. Columns: comm_id_hash, op_count,
    odd (ranks whose call differs from the majority's), majority (a row of SIGNATURE),
    calls ({rank: "ALL_REDUCE 16384 float32 sum"}), shift (1 when the odd ranks' #n is
    the majority's #n+1: they skipped one), first_entry_ns."""
    cols = ["comm_id_hash", "op_count", "odd", "calls", "majority", "shift", "first_entry_ns"]
    n = ctx.table("nccl_events")
    if n.empty:
        return pd.DataFrame(columns=cols)
    n = n[n["op_count"].notna() & n["rank"].notna() & n["comm_id_hash"].notna()]
    n = n[~is_per_process(n["comm_id_hash"]) & ~n["op"].isin(P2P_OPS)]
    if n.empty:
        return pd.DataFrame(columns=cols)
    parts = [n[c].astype("string").fillna("-") for c in SIGNATURE]
    sig = parts[0].str.cat(parts[1:], sep=" ")
    n = n.assign(sig=sig.to_numpy(), op_count=n["op_count"].astype("int64"), rank=n["rank"].astype("int64"))
    kinds = n.groupby(["comm_id_hash", "op_count"])["sig"].nunique()
    bad = kinds[kinds > 1]
    rows = []
    for comm in bad.index.get_level_values(0).unique():
        k = int(bad.loc[comm].index.min())
        at = n[(n["comm_id_hash"] == comm) & (n["op_count"] == k)]
        counts = at["sig"].value_counts()
        if len(counts) > 1 and counts.iat[0] == counts.iat[1]:
            odd_sigs = set(counts.index)       # a tie: every side is suspect
        else:
            odd_sigs = set(counts.index[1:])
        odd = sorted(int(r) for r in at.loc[at["sig"].isin(odd_sigs), "rank"])
        majority = counts.index[0]
        nxt = n[(n["comm_id_hash"] == comm) & (n["op_count"] == k + 1)]
        nxt_major = nxt.loc[~nxt["rank"].isin(odd), "sig"].mode()
        odd_calls = at.loc[at["rank"].isin(odd), "sig"]
        shift = int(len(nxt_major) > 0 and len(odd_calls) > 0 and (odd_calls == nxt_major.iat[0]).all())
        rows.append({"comm_id_hash": comm, "op_count": k, "odd": odd,
                     "calls": {int(r): _call_text(x) for r, x in zip(at["rank"], at["sig"])},
                     "majority": _call_text(majority), "shift": shift,
                     "first_entry_ns": int(at["timestamp_ns"].min())})
    return pd.DataFrame(rows, columns=cols)


def _calls_sql(comm: str, k: int) -> str:
    """Every rank's call at #k of the communicator, as collective_mismatch's evidence has
    them: the rank's global rank, the op count and the call in words (:func:`_call_text`)."""
    reducing, rooted = sql_list(("ALL_REDUCE", "REDUCE", "REDUCE_SCATTER")), sql_list(("BROADCAST", "REDUCE"))
    return f"""WITH {WORLD_RANK_SQL}
SELECT coalesce(w.global_rank, n.rank) AS rank, n.op_count,
       coalesce(n.op, '-') || ' of ' || coalesce(CAST(n.count AS VARCHAR), '-')
       || CASE WHEN n.datatype IS NOT NULL THEN ' ' || n.datatype ELSE '' END
       || CASE WHEN n.reduce_op IS NOT NULL AND n.op IN ({reducing}) THEN ' (' || n.reduce_op || ')' ELSE '' END
       || CASE WHEN n.root_or_peer IS NOT NULL AND n.op IN ({rooted}) THEN ' root ' || CAST(n.root_or_peer AS VARCHAR)
               ELSE '' END AS call,
       n.completed
FROM nccl_events n LEFT JOIN w USING (host, pid)
WHERE n.comm_id_hash = {sql_str(comm)} AND n.op_count = {sql_int(k)}
ORDER BY n.rank LIMIT {sql_int(MAX_EVIDENCE)}"""


def _call_text(sig: str) -> str:
    op, count, dtype, red, root = sig.split(" ")
    out = f"{op} of {count} {dtype}" if dtype != "-" else f"{op} of {count}"
    if red != "-" and op in ("ALL_REDUCE", "REDUCE", "REDUCE_SCATTER"):
        out += f" ({red})"
    if root != "-" and op in ("BROADCAST", "REDUCE"):
        out += f" root {root}"
    return out


@detector("collective_mismatch", kinds=KINDS)
def collective_mismatch(ctx: Context) -> list[Finding]:
    """Ranks that called a different collective than their peers at the same position
    (kind ``hang_mismatch``: the same class of bug as a skipped collective, caught earlier);
    without the tracer's calls, NCCL's own WARN lines of it (:func:`logged_mismatch`)."""
    mm = signature_mismatches(ctx)
    if mm.empty:
        return logged_mismatch(ctx)
    gmap, directory = world_rank_map(ctx), rank_directory(ctx)
    w = ctx.table("nccl_events")
    out = []
    for h in mm.itertuples(index=False):
        comm, k = h.comm_id_hash, int(h.op_count)
        names = _Names(ctx, gmap, comm, directory)   # each comm rank by its own global rank
        odd = sorted(names.glob(r) for r in h.odd)
        others = sorted({names.glob(r) for r in h.calls} - set(odd))
        mine = "; ".join(f"{names.short(r)} called {h.calls[r]}" for r in sorted(h.odd))
        after = w[(w["comm_id_hash"] == comm) & (w["op_count"] >= k)]
        never = bool(len(after)) and not after["completed"].fillna(False).astype(bool).all()
        summary = (f"Collective mismatch on communicator {comm} at #{k}: {mine} while {ranks_text(others)} called "
                   f"{h.majority}"
                   + (f" (its #{k} is their #{k + 1}: it skipped a collective)" if h.shift and len(odd) == 1 else "")
                   + ("; the collectives from there on never completed (NCCL fails with 'message truncated' or "
                      "hangs)" if never else "") + ".")
        evidence = [{"rank": names.glob(r), "op_count": k, "call": h.calls[r]} for r in sorted(h.calls)][:MAX_EVIDENCE]
        sql = _calls_sql(comm, k)
        out.append(Finding(
            kind="hang_mismatch", severity="error", confidence=0.9 if len(odd) < len(others) else 0.6,
            summary=summary, ranks=odd, hosts=sorted({directory[r].host for r in odd if r in directory
                                                      and directory[r].host}),
            peer_ranks=others, evidence=evidence, sql=sql, score=3e6 if never else 5.0,
            action=(f"Find why {ranks_text(odd)} issued a different collective at this point: a skipped or "
                    "reordered collective (data-dependent branch, uneven number of buckets or batches); every "
                    "rank must issue the same collectives in the same order on a communicator."),
            details={"comm_id_hash": comm, "op_count": k, "calls": {str(r): c for r, c in h.calls.items()},
                     "majority": h.majority, "skipped_one": bool(h.shift), "never_completed": never}))
    return out


def logged_mismatch(ctx: Context) -> list[Finding]:
    """NCCL's WARN lines of a collective mismatch (class ``size_mismatch``: "collective mismatch
    error", "message truncated", "Mismatched collective detected"), one finding per class: the
    hosts (and ranks) that logged them. The ranks that logged it disagree with a peer; which side
    issued the odd call the line does not say, so the finding names the reporters."""
    rows = warns.rows_of(ctx, warns.classes_of("hang_mismatch"))
    out = []
    for cls, g in rows.groupby("class", sort=False):
        ranks = sorted({int(r) for r in pd.to_numeric(g["rank"], errors="coerce").dropna()})
        out.append(warns.class_finding(ctx, "hang_mismatch", cls, g, confidence=0.7,
                                       detail=f", {ranks_text(ranks)}" if ranks else "", severity="error"))
    return out


def rank_stack(ctx, rank: int, since_ns: int | None = None) -> list[str]:
    """Innermost-first frames of a rank's busiest thread from the py-spy dumps (``stacks``
    table, when the bundle has them): the latest dump taken after the hang began at
    ``since_ns`` (:func:`.host_stall.stacks_after`), the thread holding the GIL or active, else
    the main thread."""
    st = ctx.model.tables.get("stacks")
    if st is None or st.empty:
        return []
    st = stacks_after(ctx, st[st["rank"] == rank], since_ns)
    if st.empty:
        return []
    phases = st["phase"].dropna().unique().tolist()
    if "end" in phases:
        st = st[st["phase"] == "end"]
    score = (st["owns_gil"].fillna(False).astype(int) * 4 + st["active"].fillna(False).astype(int) * 2
             + (st["thread_name"].astype("string") == "MainThread").fillna(False).astype(int))
    best = st.assign(_s=score.to_numpy()).sort_values(["_s"], ascending=False, kind="stable")["thread_id"].iloc[0]
    frames = st[st["thread_id"] == best].sort_values("depth", kind="stable").head(6)
    out = []
    for f in frames.itertuples(index=False):
        where = f"{f.code_file}:{f.lineno}" if pd.notna(f.code_file) and pd.notna(f.lineno) else None
        out.append(f"{f.function} ({where})" if where else str(f.function))
    return out


# --------------------------------------------------------------------------- stuck

@detector("hang_stuck", kinds=KINDS)
def hang_stuck(ctx: Context) -> list[Finding]:
    fr = hang_frontiers(ctx)
    fr = fr[fr["kind"] == "stuck"]
    if fr.empty:
        return []
    gmap, directory = world_rank_map(ctx), rank_directory(ctx)
    ev = trouble_events(ctx)
    end = capture_end_ns(ctx.model)
    out = []
    for h in fr.itertuples(index=False):
        comm, n = h.comm_id_hash, int(h.op_count)
        names = _Names(ctx, gmap, comm, directory)
        members = sorted(names.glob(r) for r in h.members)
        since = int(h.last_progress_ns) if pd.notna(h.last_progress_ns) else int(h.first_entry_ns)
        since = min(since, int(h.first_entry_ns))
        e = ev[(ev["timestamp_ns"] >= since) & ev["a"].isin(members) & ev["b"].isin(members)]
        out.append(_stuck_finding(ctx, h, comm, n, members, since, e, names, end))
    return out


@dataclass
class _StuckCause:
    """What the network says of a hang every rank is inside (:func:`_stuck_cause`)."""

    cause: str                   # the summary's clause ("; ...")
    action: str
    ranks: list[int]
    peers: list[int]
    links: list[dict]
    confidence: float
    note: str


def _stuck_cause(ctx, e: pd.DataFrame, members, since: int, directory) -> _StuckCause:
    """The cause of a hang every rank is inside, from the TCP trouble after the last progress
    (``e``): a reset on the ring's links, unanswered retransmissions that share an endpoint, a
    rank silent on the network (:func:`silent_rank`), or nothing."""
    resets = e[e["cls"] == "reset"]
    loss = e[e["cls"].isin(LOSS_CLASSES)]
    first_reset = int(resets["timestamp_ns"].min()) if len(resets) else None
    first_loss = int(loss["timestamp_ns"].min()) if len(loss) else None
    links, peers, ranks, confidence = [], [], [], 0.55
    note = "lower: the hang is certain, TCP shows no cause"
    if first_reset is not None and (first_loss is None or first_reset <= first_loss):
        r0 = resets.iloc[0]
        snd, rcv = int(r0["sender"]), int(r0["receiver"])
        ranks, peers = [snd], [rcv]
        counts = dedup_counts(resets)
        cause = (f"; the first trouble on its links is a TCP reset {ms(first_reset - since)} after the last "
                 f"progress: {label(directory, snd)} -> {label(directory, rcv)} "
                 f"({r0['saddr']}:{r0['sport']} -> {r0['daddr']}:{r0['dport']}, {r0['event']}); "
                 f"{int(counts['n'].sum())} resets in all, on {counts[['a', 'b']].drop_duplicates().shape[0]} link(s)")
        if not kernel_logged_reset(ctx, r0):
            cause += ("; the sender's kernel did not log sending it (no tcp_send_reset): a firewall or "
                      "middlebox forged it")
        links = [{"rank": snd, "peer_rank": rcv, "saddr": r0["saddr"], "daddr": r0["daddr"],
                  "sport": cell_int(r0["sport"]), "dport": cell_int(r0["dport"]), "event": "reset",
                  "first_ns": first_reset}]
        action = ("Find who reset the connection: firewall/conntrack rules (nft/iptables REJECT, conntrack "
                  "table full), a NIC or host reboot, a process on that host closing its socket; NCCL cannot "
                  "recover a reset socket: restart the job from the last checkpoint.")
        confidence, note = 0.85, "the first trouble after the last progress is a reset on the ring's own links"
    elif first_loss is not None:
        counts = dedup_counts(loss)
        blame = shared_endpoint(counts)
        ranks = blame.ranks
        peers = sorted({x for lk in blame.links for x in lk} - set(ranks))
        nret = int(counts.loc[counts["cls"] == "retransmission", "n"].sum())
        who = who_text(directory, ranks)
        silent = _last_packets(ctx, members, ranks)
        cause = (f"; from {ms(first_loss - since)} after the last progress, {nret} TCP retransmissions went "
                 f"unanswered on {len(blame.links)} link(s), all touching {who}"
                 + (f" (to {ranks_text(peers)})" if peers else "")
                 + (f"; its links fell silent {silent}" if silent else "")
                 + ": its link is down or its NIC stopped")
        links = [{"rank": a, "peer_rank": b,
                  "saddr": directory[a].addr if a in directory else None,
                  "daddr": directory[b].addr if b in directory else None,
                  "retransmissions": int(counts.loc[(counts["a"] == a) & (counts["b"] == b) &
                                                    (counts["cls"] == "retransmission"), "n"].sum())}
                 for a, b in blame.links[:MAX_EVIDENCE]]
        action = (f"Check {who}'s link: ip link / ethtool (link detected?), dmesg for NIC resets or link down, "
                  "the switch port; then restart the job without that host.")
        confidence = 0.8 if blame.separated else 0.65
        note = ("the unanswered links share one endpoint" if blame.separated else
                "lower: the unanswered links do not single out one endpoint")
    elif (quiet := silent_rank(ctx, members, since)) is not None:
        ranks, peers = [quiet.rank], quiet.waiting_on_it
        who = label(directory, quiet.rank)
        cause = ("; no TCP retransmission or reset between its ranks after the last progress" + quiet.text())
        action = (f"Look at {who} first: nvidia-smi and dmesg (Xid) on its host, its stacks (py-spy dump --native, "
                  "gdb: the thread that launched the collective); then restart the job without that GPU or host.")
        confidence, note = 0.75, "its peers wait on their sockets to it; it waits on nothing on the network"
    else:
        cause = ("; no TCP retransmission or reset between its ranks after the last progress: the network "
                 "looks idle, not broken; suspect a GPU or kernel hang (nvidia-smi, dmesg Xid), or RDMA "
                 "traffic invisible to TCP (see the IB counters)")
        action = ("Dump the stacks of every rank (py-spy dump, gdb), check nvidia-smi and dmesg for Xid errors; "
                  "if NCCL uses IB/RoCE, read the port counters.")
        ranks = []
    return _StuckCause(cause, action, ranks, peers, links, confidence, note)


def _stuck_finding(ctx, h, comm, n, members, since, e, names: _Names, end) -> Finding:
    directory = names.directory
    last = _last_ops(ctx, comm)
    upto = int(last["last_op_count"].max()) if len(last) else n
    groups: dict[int, list[int]] = {}
    for r, op in h.stuck_at.items():
        groups.setdefault(int(op), []).append(names.glob(r))
    idle = sorted(set(members) - {r for rs in groups.values() for r in rs})
    if len(groups) == 1 and not idle:
        span = f"collective #{n}" if upto <= n else f"collectives #{n}-#{upto}"
        head = (f"Hang inside {span} ({h.op}, communicator {comm}): all {len(members)} ranks entered "
                f"{'it' if upto <= n else 'them'} and none completed anything in the {ms(h.waited_ns)} until the "
                f"capture ended (NCCL RAS counts launches and reports it healthy){_started(h)}")
    else:
        where = "; ".join(f"{ranks_text(sorted(rs))} inside #{op}" for op, rs in sorted(groups.items()))
        head = (f"Hang on communicator {comm}, every rank waiting: {where}"
                + (f"; {ranks_text(idle)} completed #{n} and wait for the others" if idle else "")
                + f"; nothing completed in the {ms(h.waited_ns)} until the capture ended{_started(h)}")
    found = _stuck_cause(ctx, e, members, since, directory)
    cause, action, ranks, peers, links = found.cause, found.action, found.ranks, found.peers, found.links
    confidence, note = found.confidence, found.note
    summary = head + _size_note(h) + _numbering(ctx, comm)[0] + cause + "."
    if e.empty:   # nothing on the network: the evidence is how far each rank got
        sql, evidence = _last_ops_sql(comm), _last_ops_rows(last, names)
    else:
        m = sql_list(int(r) for r in members)
        sql = trouble_rows_sql(f"timestamp_ns >= {sql_int(since)} AND least(sender_rank, receiver_rank) IN ({m}) "
                               f"AND greatest(sender_rank, receiver_rank) IN ({m})", limit=MAX_EVIDENCE)
        evidence = trouble_rows(e, limit=MAX_EVIDENCE)
    last_rows = last.to_dict("records")
    for r in last_rows:
        for k, v in list(r.items()):
            r[k] = None if v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v
    at = f"{h.op} #{n}"
    if links and links[0].get("event") == "reset":
        line = "Hang: a TCP reset broke {who}'s connection to {peers}; every rank stuck in " + at + " ({since})"
    elif len(ranks) > 1:        # one dead link seen: either end's NIC or cable
        line = ("Hang: the link between {who} is down (retransmissions unanswered; which end, the evidence cannot "
                "tell); stuck in " + at + " ({since})")
    elif ranks and not links:
        line = ("Hang: {who} never ran its part of " + at + ": {peers} wait on their sockets to it; TCP shows no "
                "cause (its GPU or process?) ({since})")
    elif ranks:
        line = "Hang: {who}'s link is down (retransmissions to {peers} unanswered); stuck in " + at + " ({since})"
    else:
        line = "Hang: every rank stuck inside " + at + "; TCP shows no cause (GPU, kernel or RDMA?) ({since})"
    return Finding(
        kind="hang_stuck", severity="error", confidence=confidence, summary=summary, ranks=ranks, headline=line,
        confidence_note=note,
        op_count=n, since_ns=int(since), since_source=TRACER_SOURCE, since_precision_ns=_precision(h),
        hosts=sorted({directory[r].host for r in ranks if r in directory and directory[r].host}),
        peer_ranks=peers, links=links, evidence=evidence, sql=sql, action=action,
        score=1e6 + h.waited_ns / 1e9,
        details={"comm_id_hash": comm, "op_count": n, "op": h.op, "ranks": members, "waited_ns": int(h.waited_ns),
                 "first_entry_ns": int(h.first_entry_ns), "last_progress_ns": since, "capture_end_ns": end,
                 "tcp_events_after_progress": int(len(e)), "last_ops": last_rows,
                 **_numbering(ctx, comm)[1]})


TRACER_SOURCE = "tracer"


def _precision(h) -> int:
    """How well the tracer dates a hang: from its communicator's last completion to the first
    entry into the collective that never completed (at least a millisecond)."""
    if pd.isna(h.last_progress_ns):
        return 1_000_000
    return max(1_000_000, abs(int(h.first_entry_ns) - int(h.last_progress_ns)))


def _started(h) -> str:
    """When the hang started, where the capture saw it (the communicator's last completed
    collective; a capture that started during the hang has none)."""
    t = getattr(h, "last_progress_ns", None)
    if t is None or pd.isna(t):
        return ""
    when = datetime.fromtimestamp(int(t) / 1e9, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    return f"; hung since {when} UTC (its last completed collective)"


def _last_packets(ctx, members, blamed) -> str:
    """When the blamed endpoint's connections last carried a packet vs the other links (flows)."""
    f = ctx.table("flows").dropna(subset=["rank", "peer_rank", "last_ns"])
    if f.empty or not blamed:
        return ""
    f = f[f["rank"].isin(members) & f["peer_rank"].isin(members)]
    touch = f["rank"].isin(blamed) | f["peer_rank"].isin(blamed)
    if not touch.any() or touch.all():
        return ""
    mine, other = int(f.loc[touch, "last_ns"].min()), int(f.loc[~touch, "last_ns"].max())
    if other - mine < SILENCE_GAP_NS:   # links of a stuck ring all fall silent together
        return ""
    return f"{ms(other - mine)} before the other links' last packets"


# --------------------------------------------------------------------------- without the tracer

@detector("hang_state", kinds=KINDS, queries=True)
def hang_state(ctx: Context) -> list[Finding]:
    """Hangs the tracer did not see happen (it attached after the ranks entered the collectives
    they hang in, or it did not run): from the state at capture, else NCCL RAS's report and the
    Flight Recorder analyzer's, else the Flight Recorder dumps compared, else from PyTorch's watchdog lines (:data:`LATE_SOURCES`, each consulted under
    :data:`forensics.findings.precedence.PRECEDENCE`)."""
    return [host_side(ctx, f) for source in LATE_SOURCES for f in consult(ctx, source)]
