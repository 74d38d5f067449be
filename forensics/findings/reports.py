"""Evidence from the tools' own failure reports: NCCL RAS (``ras_ranks``) and the PyTorch
Flight Recorder analyzer (``fr_report``).

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
"""
from __future__ import annotations

import pandas as pd

from . import warns
from .base import Context, Finding
from .evidence import ranks_text

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


def ras_hangs(ctx: Context) -> list[Finding]:
    """One ``hang_mismatch`` finding per RAS report that names ranks or processes behind."""
    t = ctx.model.tables.get("ras_ranks")
    if t is None or t.empty:
        return []
    behind = t[t["behind"].fillna(False).astype(bool)]
    out = []
    for art, g in behind.groupby("artifact", sort=True, dropna=False):
        ranks = sorted({int(r) for r in g["rank"].dropna()})
        hosts = sorted({h for h in g["host"].dropna().astype(str)})
        parts = []
        for r in g.drop_duplicates(["rank", "pid", "host", "kind"]).head(6).itertuples(index=False):
            who = (f"rank {int(r.rank)}" if pd.notna(r.rank) else f"process {int(r.pid)}" if pd.notna(r.pid)
                   else "a process")
            where = f" on {r.host}" if isinstance(r.host, str) else ""
            comm = f" (communicator {r.comm_id})" if isinstance(r.comm_id, str) else ""
            parts.append(f"{who}{where}{comm}: {_what(r)}")
        subject = ranks_text(ranks) if ranks else \
            f"{'host' if len(hosts) == 1 else 'hosts'} {', '.join(hosts)}"
        ahead = t[(t["artifact"] == art) & ~t["behind"].fillna(False).astype(bool)]
        note = (f"; the {len(ahead)} rank(s) RAS lists ahead of them are waiting, not the cause"
                if len(ahead) else "")
        summary = f"NCCL RAS names {subject} behind the rest of the job: {'; '.join(parts)}{note}."
        out.append(Finding(
            kind="hang_mismatch", severity="error", confidence=0.85, summary=summary,
            ranks=ranks, hosts=hosts,
            evidence=warns.evidence(g, ["host", "rank", "pid", "gpu", "comm_id", "comm_hash", "kind", "status",
                                        "op_count", "peers_op_count", "collective", "artifact", "log_line"],
                                    MAX_EVIDENCE),
            sql=("SELECT host, rank, pid, gpu, comm_id, kind, status, op_count, peers_op_count, collective, artifact, "
                 "log_line FROM ras_ranks WHERE behind ORDER BY rank"),
            action=(f"Look at {subject}: its process (py-spy dump, its last log lines) -- it did not launch what its "
                    "peers did: a crash, a hang before the collective, or another code path"),
            score=warns.LOG_FINDING_SCORE,
            op_count=int(g["op_count"].dropna().min()) if g["op_count"].notna().any() else None,
            details={"source": "ncclras", "artifact": art, "ranks_behind": ranks, "hosts": hosts}))
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
