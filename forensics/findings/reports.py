"""Evidence from the tools' own failure reports: NCCL RAS (``ras_ranks``).

These registers nothing: :mod:`.hang` owns the kinds, and consults this module through
:mod:`.precedence` (a tool that compared every rank's counts names the rank behind more
sharply than the watchdog lines of the ranks that waited for it).

NCCL RAS (``ncclras``) lists the outliers of each communicator: the ranks it is missing
data from, the job processes it considers dead, and, where the ranks launched different
numbers of a collective, the smaller group of them -- which may be the ranks *ahead*. The
culprit of a hang is the rank *behind* (``ras_ranks.behind``: missing, no communicator, still
initialising, dead, or fewer operations than the most any rank launched): that is the rank
the finding names, with the host RAS names for it.
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
