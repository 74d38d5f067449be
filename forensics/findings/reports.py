"""Evidence from the tools' own failure reports: NCCL RAS (``ras_ranks``), the PyTorch
Flight Recorder analyzer (``fr_report``) and the Flight Recorder dumps themselves
(``fr_pg_status``, ``fr_entries``) where no capture places them.

These registers nothing: :mod:`.hang` owns the kinds, and consults this module through
:mod:`.precedence` (a tool that compared every rank's counts names the rank behind more
sharply than the watchdog lines of the ranks that waited for it).

NCCL RAS (``ncclras``) lists the outliers of each communicator: the ranks it is missing
data from, the job processes it considers dead, and, where the ranks launched different
numbers of a collective, the smaller group of them -- which may be the ranks *ahead*. The
culprit of a hang is the rank *behind* (``ras_ranks.behind``: missing, no communicator, still
initialising, dead, or fewer operations than the most any rank launched): that is the rank
the finding names, with the host RAS names for it.

The Flight Recorder analyzer (``fr_trace`` / ``torchfrtrace``) matched every rank's dump
collective by collective: the ranks it reports *missing* from a collective never joined it (the
others wait in it), a *culprit* rank's entry disagrees with the others' (state, size, type).
Those ranks are the finding's; the ranks that joined and wait are never named. Ranks whose
dumps it lacked (``missed FR dumps from ranks``, ``Missing dump files from ranks``) are named
only where it names no collective verdict, as a warning: a rank that wrote no dump may be
the one that hung, or its dump was only not collected.

The dumps alone (given loose: no process to place them on; a capture's own dumps are the state
at capture's, :mod:`.late_state`) are compared the way the analyzer starts: per process group, each rank's last enqueued
``collective_seq_id``. Ranks whose last is below the highest never enqueued that collective;
when the ranks that did still hold it scheduled or started, they wait in it and the ranks
behind are the finding's (the analyzer's "not all ranks joining"). Dumps that agree, or whose
highest collective completed everywhere it was enqueued, name no one here.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..parsers.ncclras import LAGGING_STATUS
from . import warns
from .base import Context, Finding
from ..wording import ranks_text
from .sql import sql_str
from .precedence import FR_DUMPS, FR_REPORT, RAS_REPORT, finds

MAX_EVIDENCE = 20


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


def _what(r) -> str:
    kind, status = _str(r.kind), _str(r.status)
    if kind == "DEAD" or status == "DEAD":
        return "its process is considered dead"
    missing = r.missing is True or (not pd.isna(r.missing) and bool(r.missing))
    if missing and pd.isna(r.rank):
        return "its process sent no communicator data"
    if missing or status in ("UNKNOWN", "NOCOMM"):
        return "missing from the communicator"
    if pd.notna(r.op_count) and pd.notna(r.peers_op_count):
        coll = _str(r.collective) if _str(r.collective) not in (None, "collective") else "operation"
        return f"launched {coll} up to {int(r.op_count)} while others reached {int(r.peers_op_count)}"
    return f"status {status}" if status else "behind"


def _who(r) -> str:
    if pd.notna(r.rank):
        return f"rank {int(r.rank)}"
    if pd.notna(r.group_ranks):
        return f"{int(r.group_ranks)} ranks RAS counted but did not list"
    return f"process {int(r.pid)}" if pd.notna(r.pid) else "a process"


def _counts_only(g: pd.DataFrame) -> bool:
    """Whether RAS names these ranks behind only by their operation counts (a MISMATCH): no
    rank missing, dead, without a communicator or still initialising."""
    lagging = g["missing"].fillna(False).astype(bool) | g["status"].isin(LAGGING_STATUS) | (g["kind"] == "DEAD")
    return bool(g["op_count"].notna().all() and not lagging.any())


@finds(RAS_REPORT)
def ras_hangs(ctx: Context) -> list[Finding]:
    """One ``hang_mismatch`` finding per RAS report that names ranks or processes behind.

    An error where RAS names a rank missing, dead, without a communicator or still
    initialising, or a lone rank whose operation count lags all the others'. Several ranks a
    few operations behind (or a group RAS only counted) is a warning: NCCL files a MISMATCH
    under Warnings, and its guide shows one in a job that was only mid-collective when queried
    -- a hang when a later query shows the same counts."""
    t = ctx.model.tables.get("ras_ranks")
    if t is None or t.empty:
        return []
    if "group_ranks" not in t.columns:
        t = t.assign(group_ranks=pd.NA)
    behind = t[t["behind"].fillna(False).astype(bool)]
    out = []
    for art, g in behind.groupby("artifact", sort=True, dropna=False):
        ranks = sorted({int(r) for r in g["rank"].dropna()})
        hosts = sorted({h for h in g["host"].dropna().astype(str)})
        counted = int(g["group_ranks"].dropna().sum())
        parts = []
        for r in g.drop_duplicates(["rank", "pid", "host", "kind", "group_ranks"]).head(6).itertuples(index=False):
            where = f" on {r.host}" if isinstance(r.host, str) else ""
            comm = f" (communicator {r.comm_id})" if isinstance(r.comm_id, str) else ""
            parts.append(f"{_who(r)}{where}{comm}: {_what(r)}")
        subject = (ranks_text(ranks) if ranks else
                   f"{'host' if len(hosts) == 1 else 'hosts'} {', '.join(hosts)}" if hosts else
                   f"{counted} ranks")
        ahead = t[(t["artifact"] == art) & ~t["behind"].fillna(False).astype(bool)]
        note = (f"; the {len(ahead)} rank(s) RAS lists ahead of them are waiting, not the cause"
                if len(ahead) else "")
        transient = _counts_only(g) and (counted > 0 or len(ranks) > 1)
        if transient:
            note += ("; a query that catches a job mid-collective shows such counts too: a hang if a later "
                     "query shows the same counts")
        summary = f"NCCL RAS names {subject} behind the rest of the job: {'; '.join(parts)}{note}."
        out.append(Finding(
            kind="hang_mismatch", severity="warning" if transient else "error",
            confidence=0.5 if transient else 0.85, summary=summary,
            ranks=ranks, hosts=hosts,
            evidence=warns.evidence(g, ["host", "rank", "group_ranks", "pid", "gpu", "comm_id", "comm_hash", "kind",
                                        "status", "op_count", "peers_op_count", "collective", "artifact", "log_line"],
                                    MAX_EVIDENCE),
            sql=("SELECT host, rank, group_ranks, pid, gpu, comm_id, kind, status, op_count, peers_op_count, "
                 "collective, artifact, log_line FROM ras_ranks WHERE behind ORDER BY rank"),
            action=(f"Look at {subject}: its process (py-spy dump, its last log lines) -- it did not launch what its "
                    "peers did: a crash, a hang before the collective, or another code path"
                    + ("; query RAS again: counts that moved on were a snapshot mid-collective" if transient else "")),
            score=warns.LOG_FINDING_SCORE,
            op_count=int(g["op_count"].dropna().min()) if g["op_count"].notna().any() else None,
            details={"source": "ncclras", "artifact": art, "ranks_behind": ranks, "hosts": hosts,
                     "ranks_counted_behind": counted}))
    return out


FR_VERDICT_KINDS = ("not_joined", "errors", "io_mismatch")
FR_DUMP_KINDS = ("undecided", "missing_dumps")


def _ranks_col(v) -> list[int]:
    return [int(x) for x in v.split(",") if x.strip().isdigit()] if isinstance(v, str) else []


def _fr_what(r) -> str:
    op = _str(r.op) or "a collective"
    seq = f" #{int(r.seq)}" if pd.notna(r.seq) else ""
    pg = f" of group {r.pg}" if _str(r.pg) else ""
    missing, culprits = _ranks_col(r.missing_ranks), _ranks_col(r.culprit_ranks)
    if missing:
        state = f", {r.state} on the others" if _str(r.state) else ""
        return f"{ranks_text(missing)} did not join {op}{seq}{pg}{state}"
    if culprits:
        why = f" ({_str(r.error_type)})" if _str(r.error_type) else ""
        return f"the entry of {ranks_text(culprits)} for {op}{seq}{pg} disagrees with the others'{why}"
    return f"{op}{seq}{pg}: no dump from {ranks_text(missing or culprits)}"


@finds(FR_REPORT)
def fr_report_hangs(ctx: Context) -> list[Finding]:
    """One ``hang_mismatch`` finding per Flight Recorder analyzer report that names ranks: an
    error for the ranks missing from a collective or culprit of a mismatch, else a warning for
    the ranks whose dumps it lacked."""
    t = ctx.model.tables.get("fr_report")
    if t is None or t.empty:
        return []
    out = []
    for art, g in t.groupby("artifact", sort=True, dropna=False):
        g = g.sort_values("log_line", kind="stable")
        named = g[g["missing_ranks"].notna() | g["culprit_ranks"].notna()]
        verdict = named[named["kind"].isin(FR_VERDICT_KINDS)]
        rows = verdict if len(verdict) else named[named["kind"].isin(FR_DUMP_KINDS)]
        if rows.empty:
            continue
        ranks = list(dict.fromkeys(r for v in rows["missing_ranks"].tolist() + rows["culprit_ranks"].tolist()
                                   for r in _ranks_col(v)))
        first = rows.iloc[0]
        if len(verdict):
            parts = [_fr_what(r) for r in rows.drop_duplicates(["missing_ranks", "culprit_ranks", "pg"])
                     .head(4).itertuples(index=False)]
            more = f" ({len(rows)} collectives reported)" if len(rows) > len(parts) else ""
            note = ("the ranks that joined are waiting, not the cause" if rows["missing_ranks"].notna().any()
                    else "the other ranks' entries agree")
            summary = f"The Flight Recorder analyzer names {ranks_text(ranks)}: {'; '.join(parts)}{more}; {note}."
            severity, confidence = "error", 0.85
        else:
            summary = (f"The Flight Recorder analyzer has no dump from {ranks_text(ranks)} and could not decide "
                       "the collective the others wait in: that rank may be the one that hung, or its dump "
                       "was not collected.")
            severity, confidence = "warning", 0.5
        seq = first["seq"]
        out.append(Finding(
            kind="hang_mismatch", severity=severity, confidence=confidence, summary=summary, ranks=sorted(ranks),
            evidence=warns.evidence(rows, ["kind", "pg", "seq", "record_id", "op", "state", "missing_ranks",
                                           "culprit_ranks", "error_type", "message", "artifact", "log_line"],
                                    MAX_EVIDENCE),
            sql=("SELECT kind, pg, seq, record_id, op, state, missing_ranks, culprit_ranks, error_type, message, "
                 "artifact, log_line FROM fr_report WHERE missing_ranks IS NOT NULL OR culprit_ranks IS NOT NULL "
                 "ORDER BY artifact, log_line"),
            action=(f"Look at {ranks_text(ranks)}: its process (py-spy dump, its last log lines, its Flight Recorder "
                    "entries) -- it did not issue what its peers did: a crash, a hang before the collective, or "
                    "another code path"),
            score=warns.LOG_FINDING_SCORE, seq=int(seq) if pd.notna(seq) else None,
            details={"source": "fr_analyzer", "artifact": art, "ranks": sorted(ranks),
                     "collectives": int(len(rows))}))
    return out


FR_WAITING_STATES = ("scheduled", "started")


def _fr_positions(ctx: Context) -> pd.DataFrame:
    """Per (process group ``_pg``, rank): the last ``collective_seq_id`` enqueued (``_enq``) and the
    dump's host, pid, artifact. ``pg_status`` says it where the dump has one (format 2.3 on); the
    entries say it too (each is recorded when its collective is enqueued, and the ring keeps the
    newest), which is all formats 1.x and 2.0 have: the larger of the two counts."""
    cols = ["_pg", "rank", "_enq", "host", "pid", "artifact", "pg_id", "last_enqueued_collective",
            "last_started_collective", "last_completed_collective"]
    parts = []
    st = ctx.model.tables.get("fr_pg_status")
    if st is not None and len(st):
        parts.append(st.assign(_enq=pd.to_numeric(st["last_enqueued_collective"], errors="coerce"),
                               _pg=st["pg_id"].astype("string")))
    fe = ctx.model.tables.get("fr_entries")
    if fe is not None and len(fe):
        coll = fe[~fe["is_p2p"].fillna(False).astype(bool).to_numpy()] if "is_p2p" in fe else fe
        coll = coll.assign(_enq=pd.to_numeric(coll["collective_seq_id"], errors="coerce"),
                           _pg=coll["pg_id"].astype("string"))
        parts.append(coll.assign(pg_id=coll["_pg"], last_enqueued_collective=coll["_enq"]))
    if not parts:
        return pd.DataFrame(columns=cols)
    t = pd.concat([p.reindex(columns=cols) for p in parts], ignore_index=True)
    # dumps a capture took belong to a process (a pid): the state at capture places them, and
    # per-host captures dump at different times of a running job; the dumps compared here are
    # the ones given alone
    t = t[t["rank"].notna() & t["_enq"].notna() & t["_pg"].notna() & t["pid"].isna()]
    return t.sort_values("_enq", kind="stable").drop_duplicates(["_pg", "rank"], keep="last")


def _fr_completed(ctx: Context, pg, ranks: set) -> float:
    """The highest ``collective_seq_id`` of process group ``pg`` that one of ``ranks`` completed,
    by its Flight Recorder dumps (``pg_status``'s last completed, or a completed entry); -inf when none."""
    best = -np.inf
    st = ctx.model.tables.get("fr_pg_status")
    if st is not None and len(st):
        m = (st["pg_id"].astype("string") == pg).fillna(False).to_numpy() & st["rank"].isin(ranks).to_numpy()
        done = pd.to_numeric(st.loc[m, "last_completed_collective"], errors="coerce").dropna()
        best = max(best, float(done.max()) if len(done) else best)
    fe = ctx.model.tables.get("fr_entries")
    if fe is not None and len(fe):
        m = ((fe["pg_id"].astype("string") == pg).fillna(False).to_numpy() & fe["rank"].isin(ranks).to_numpy()
             & (fe["state"].astype("string") == "completed").fillna(False).to_numpy())
        done = pd.to_numeric(fe.loc[m, "collective_seq_id"], errors="coerce").dropna()
        best = max(best, float(done.max()) if len(done) else best)
    return best


def fr_positions_sql(pg: str) -> str:
    """:func:`_fr_positions` in SQL, for the finding's runnable query: each loose dump's last
    enqueued collective of process group ``pg``, from pg_status and from the entries alike."""
    q = sql_str(pg)
    return ("SELECT host, rank, max(seq) AS last_enqueued_collective, list(DISTINCT src) AS sources FROM ("
            f"SELECT host, rank, last_enqueued_collective AS seq, 'pg_status' AS src FROM fr_pg_status "
            f"WHERE pg_id = {q} AND pid IS NULL UNION ALL "
            f"SELECT host, rank, collective_seq_id, 'entries' FROM fr_entries WHERE CAST(pg_id AS VARCHAR) = {q} "
            "AND pid IS NULL AND NOT coalesce(is_p2p, false)) GROUP BY host, rank ORDER BY rank")


@finds(FR_DUMPS)
def fr_dump_hangs(ctx: Context) -> list[Finding]:
    """One ``hang_mismatch`` error per process group whose Flight Recorder dumps show ranks that
    never enqueued the collective the others enqueued and still wait in (module docstring).
    Each rank's last enqueued ``collective_seq_id`` comes from :func:`_fr_positions` (the latest
    dump of a rank counts); ``fr_entries`` names the collective and whether the ranks ahead wait in it."""
    st = _fr_positions(ctx)
    if st.empty:
        return []
    fe = ctx.model.tables.get("fr_entries")
    out = []
    for pg, g in st.groupby("_pg", sort=True):
        if g["rank"].nunique() < 2:
            continue
        top = int(g["_enq"].max())
        behind, ahead = g[g["_enq"] < top], g[g["_enq"] == top]
        # a collective completes only once every rank enqueued it: a rank "behind" a collective
        # the ranks ahead completed had enqueued it after its dump (dumps taken apart on a
        # running job), it is not behind
        behind = behind[behind["_enq"] >= _fr_completed(ctx, pg, set(ahead["rank"]))]
        if behind.empty:
            continue
        held = pd.DataFrame()
        if fe is not None and len(fe):
            seq = pd.to_numeric(fe["collective_seq_id"], errors="coerce")
            held = fe[(fe["pg_id"].astype("string") == pg).fillna(False).to_numpy() & (seq == top).fillna(False).to_numpy()
                      & fe["rank"].isin(ahead["rank"]).to_numpy()]
        if held.empty or not held["state"].isin(FR_WAITING_STATES).any():
            continue          # no entry of #top, or it completed: nothing waits on the ranks behind
        ops = held["op"].dropna().astype(str)
        op = f" ({ops.iloc[0]})" if len(ops) else ""
        names = held["pg_desc"].dropna().astype(str) if "pg_desc" in held else pd.Series(dtype=str)
        label = f"process group {pg}" + (f" ({names.iloc[0]})" if len(names) and names.iloc[0] != pg else "")
        ranks = sorted(int(r) for r in behind["rank"])
        waiting = sorted(int(r) for r in ahead["rank"])
        lasts = "; ".join(f"rank {int(r)}: #{int(e)}" if e > 0 else f"rank {int(r)}: none"
                          for r, e in zip(behind["rank"], behind["_enq"]))
        summary = (f"Flight Recorder dumps of {label}: {ranks_text(ranks)} never enqueued collective #{top}{op}, "
                   f"which {ranks_text(waiting)} enqueued and {'waits' if len(waiting) == 1 else 'wait'} in (last "
                   f"enqueued {lasts}); the waiting {'rank is' if len(waiting) == 1 else 'ranks are'} not the cause.")
        out.append(Finding(
            kind="hang_mismatch", severity="error", confidence=0.8, summary=summary, ranks=ranks,
            hosts=sorted({h for h in behind["host"].dropna().astype(str)}),
            evidence=warns.evidence(g.sort_values("rank"), ["host", "rank", "pid", "pg_id", "last_enqueued_collective",
                                                            "last_started_collective", "last_completed_collective",
                                                            "artifact"], MAX_EVIDENCE),
            sql=fr_positions_sql(pg),
            action=(f"Look at {ranks_text(ranks)}: its process (py-spy dump, its last log lines, its Flight Recorder "
                    f"entries after #{top - 1}) -- it did not issue what its peers did: a crash, a hang before the "
                    "collective, or another code path"),
            score=warns.LOG_FINDING_SCORE, seq=top, op_count=top - 1,
            details={"source": "flight_recorder", "pg": pg, "fr_seq_id": top, "ranks_waiting": waiting,
                     "last_enqueued": {str(int(r)): int(e) for r, e in zip(g["rank"], g["_enq"])}}))
    return out
