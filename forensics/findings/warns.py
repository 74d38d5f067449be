"""NCCL's WARN lines as evidence: what the detectors that read them share (no detector here).

The model classifies every WARN line (:mod:`forensics.model.nccl_errors`: its class, the
finding kind it feeds, whether it is a consequence of an earlier failure, the job's first
failure) and joins it to its host, rank and peer across files (:mod:`forensics.model.logs`).
The detector that owns each kind reads its classes through :func:`rows_of` and phrases them
with the helpers below: how many hosts report it, the peer they point at, the first failure in
time against the cascade that follows it, the lines as evidence rows and the SQL that returns
them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from ..model.logs import UNKNOWN, host_text, job_hosts as log_hosts
from ..model.nccl_errors import CLASSES, CLASS_BY_NAME
from .base import Finding
from .sql import sql_list
from ..wording import ranks_text

FIRST_FAILURE_SCORE = 3e6     # the job's first failure: above the hang (1e6 + s) and the reset (2e6) it causes
LOG_FINDING_SCORE = 1.5e6     # an error logged by the job, not its first failure
MAX_ROWS = 20
EVIDENCE_COLS = ["host", "rank", "pid", "time_ns", "class", "ib_status", "ib_status_name", "peer", "peer_host",
                 "message", "artifact", "log_line"]


def classes_of(kind: str) -> list[str]:
    return [c.name for c in CLASSES if c.kind == kind]


def rows_of(ctx, classes: list[str]) -> pd.DataFrame:
    """The ``nccl_warnings`` rows of ``classes``, first failure first, then in time and line order."""
    w = ctx.table("nccl_warnings") if "nccl_warnings" in ctx.model.tables else pd.DataFrame()
    if w.empty or "class" not in w:
        return pd.DataFrame(columns=EVIDENCE_COLS)
    w = w[w["class"].isin(classes)]
    if w.empty:
        return w
    return w.assign(_f=~w["first"].fillna(False).astype(bool), _t=pd.to_numeric(w["time_ns"], errors="coerce")) \
        .sort_values(["_f", "_t", "artifact", "log_line"], kind="stable", na_position="last") \
        .drop(columns=["_f", "_t"])


def job_hosts(ctx) -> list[str]:
    """Every host the evidence names: the captures' and those of the processes, WARN lines and
    watchdog lines in the logs."""
    named = log_hosts(ctx.model.tables, ("nccl_config", "nccl_warnings", "watchdog_events"))
    return sorted(set(getattr(ctx.model, "hosts", []) or []) | set(named))


def host_ranks(ctx) -> dict[str, list[int]]:
    """host -> the global ranks the evidence places there."""
    out: dict[str, set] = {}
    for name in ("nccl_config", "watchdog_events", "nccl_warnings"):
        t = ctx.model.tables.get(name)
        if t is None or t.empty:
            continue
        for h, r in zip(t["host"], pd.to_numeric(t["rank"], errors="coerce")):
            if isinstance(h, str) and pd.notna(r):
                out.setdefault(h, set()).add(int(r))
    return {h: sorted(r) for h, r in out.items()}


def hosts_text(hosts: list[str], of: int | None = None, limit: int = 4) -> str:
    """"2 of 5 hosts (node1, node2)"; one host of a log that names none is that placeholder
    alone (it reads "host unknown (<file>)": no "1 host (host unknown (<file>))")."""
    if len(hosts) == 1 and hosts[0].startswith("unknown:") and not (of and of > 1):
        return hosts[0]
    shown = ", ".join(hosts[:limit]) + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")
    n = f"{len(hosts)} of {of} hosts" if of and of > len(hosts) else f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}"
    return f"{n} ({shown})" if hosts else "no host"


@dataclass
class HostBlame:
    """Where a set of failing (reporter, peer) pairs of WARN lines points: the host they all
    share (the ranks a set of troubled TCP links share: :class:`forensics.findings.trouble.LinkBlame`)."""

    hosts: list[str]
    peer_hosts: list[str]
    shared: str | None          # the one host every pair touches, when there is one
    side: str                   # "peer": every reporter names it; "reporter": it reports to every peer; "" else


def blame(rows: pd.DataFrame) -> HostBlame:
    """The shared endpoint of the rows' (host, peer_host) pairs: many hosts reporting one peer
    point at that peer (or its link); one host reporting many peers points at itself."""
    hosts = sorted({h for h in rows["host"].dropna().astype(str)})
    peers = sorted({p for p in rows["peer_host"].dropna().astype(str)}) if "peer_host" in rows else []
    pairs = [(h, p) for h, p in zip(rows["host"], rows.get("peer_host", pd.Series(index=rows.index, dtype=object)))
             if isinstance(h, str) and isinstance(p, str)]
    if pairs:
        common = set(pairs[0])
        for pr in pairs[1:]:
            common &= set(pr)
        if len(common) == 1:
            shared = next(iter(common))
            side = "peer" if all(p == shared for _, p in pairs) and len({h for h, _ in pairs}) > 1 else \
                "reporter" if all(h == shared for h, _ in pairs) else "peer" if all(p == shared for _, p in pairs) \
                else ""
            return HostBlame(hosts, peers, shared, side)
    if len(hosts) == 1:
        return HostBlame(hosts, peers, hosts[0], "reporter")
    return HostBlame(hosts, peers, None, "")


def first_text(rows: pd.DataFrame) -> str:
    """The first line of ``rows`` as "host at HH:MM:SS UTC" (just "host" when it has no time)."""
    r = rows.iloc[0]
    when = utc_clock(r.get("time_ns"))
    return f"{r['host']}" + (f" at {when}" if when else "")


def utc_clock(ns) -> str | None:
    if ns is None or pd.isna(ns):
        return None
    return pd.Timestamp(int(ns), unit="ns", tz="UTC").strftime("%Y-%m-%d %H:%M:%S UTC")


def since(rows: pd.DataFrame) -> tuple[int | None, str | None]:
    """The earliest time of the rows and what it comes from."""
    t = pd.to_numeric(rows.get("time_ns"), errors="coerce") if len(rows) else pd.Series(dtype=float)
    if t is None or t.isna().all():
        return None, None
    i = t.idxmin()
    src = rows.loc[i].get("time_source") if "time_source" in rows else None
    return int(t.loc[i]), f"log line times ({src if isinstance(src, str) and src else 'log'})"   # NA: unknown


def cascade_text(ctx, rows: pd.DataFrame) -> str:
    """How many other WARN lines, on how many hosts, followed the first failure."""
    w = ctx.table("nccl_warnings") if "nccl_warnings" in ctx.model.tables else pd.DataFrame()
    if w.empty or rows.empty:
        return ""
    later = w[~w.index.isin(rows.index) & w["class"].ne("other")]
    if later.empty:
        return ""
    hosts = later["host"].dropna().nunique()
    return f"; {len(later)} other WARN line(s) on {hosts} host(s) follow (proxy errors, closed connections, flushes)"


def links(rows: pd.DataFrame) -> list[dict]:
    """The distinct (host, peer_host) pairs of WARN rows, as a finding's ``links``."""
    pairs = rows[["host", "peer_host"]].drop_duplicates().head(MAX_ROWS)
    return [{"host": h, "peer_host": p} for h, p in pairs.itertuples(index=False)]


def evidence(rows: pd.DataFrame, cols: list[str] | None = None, limit: int = MAX_ROWS) -> list[dict]:
    cols = [c for c in (cols or EVIDENCE_COLS) if c in rows.columns]
    out = []
    for rec in rows[cols].head(limit).to_dict("records"):
        out.append({k: (None if v is None or (not isinstance(v, str) and pd.isna(v)) else v) for k, v in rec.items()})
    return out


def sql(classes: list[str], extra: str = "") -> str:
    return (f"SELECT host, rank, pid, time_ns, class, ib_status, ib_status_name, peer, peer_host, message, artifact, "
            f"log_line FROM nccl_warnings WHERE class IN ({sql_list(classes)}){extra} "
            f"ORDER BY NOT coalesce(\"first\", false), time_ns NULLS LAST, artifact, log_line LIMIT {MAX_ROWS}")


def where_text(ctx, hosts: list[str], line_ranks: list[int]) -> str:
    """Where WARN lines were logged, for a headline: the hosts (:func:`hosts_text`); for lines
    that name no host (a log without prefixes: the ``unknown:<file>`` placeholders) but do name
    their ranks (``[rank3]:``), those ranks and the files, "rank 3 (output.log)"."""
    if line_ranks and hosts and all(h.startswith(UNKNOWN) for h in hosts):
        files = [host_text(h).removeprefix("host unknown (").removesuffix(")") for h in hosts]
        return f"{ranks_text(line_ranks)} ({', '.join(files[:2])}{', ...' if len(files) > 2 else ''})"
    return hosts_text(hosts, len(job_hosts(ctx)))


def hosts_of_ranks(ctx, ranks) -> list[str]:
    """The hosts the evidence places ``ranks`` on."""
    want = {int(r) for r in ranks}
    return sorted(h for h, rs in host_ranks(ctx).items() if want & set(rs))


def class_finding(ctx, kind: str, cls: str, g: pd.DataFrame, *, confidence: float, detail: str = "",
                  severity: str | None = None) -> Finding:
    """The finding of one WARN class's lines ``g`` (:data:`forensics.model.nccl_errors.CLASSES`):
    its meaning, the hosts and the count, the first line (and whether it is the job's first
    failure), the class's check on those hosts; ``detail``: what the detector adds after the
    hosts (a rank, a device). A consequence of an earlier failure is a warning unless it is the
    first failure itself."""
    c = CLASS_BY_NAME[cls]
    hosts = sorted(set(g["host"].dropna().astype(str)))
    line_ranks = sorted({int(r) for r in pd.to_numeric(g["rank"], errors="coerce").dropna()})
    ranks = line_ranks or ranks_of_hosts(ctx, hosts)
    first = bool(g["first"].fillna(False).any())
    since_ns, src = since(g)
    summary = (f"{capital(c.meaning)}, on {hosts_text(hosts, len(job_hosts(ctx)))}{detail}: "
               f"\"{str(g.iloc[0]['message'])[:160]}\" ({len(g)} line(s), first on {first_text(g)}"
               + (", the first failure in the logs" if first else "") + ")" + cascade_text(ctx, g) + ".")
    return Finding(
        headline=f"{short_meaning(c.meaning)} on {where_text(ctx, hosts, line_ranks)}" + " ({since})",
        kind=kind, severity=severity or ("warning" if c.cascade and not first else "error"),
        confidence=confidence if not c.cascade else min(confidence, 0.5), summary=summary, ranks=ranks, hosts=hosts,
        evidence=evidence(g), sql=sql([cls]), action=f"On {', '.join(hosts[:3]) or 'the hosts'}: {c.action}",
        score=FIRST_FAILURE_SCORE if first else (LOG_FINDING_SCORE if not c.cascade else 1e5), since_ns=since_ns,
        since_source=src, details={"rule": f"logged_{cls}", "class": cls, "lines": int(len(g)),
                                   "first_failure": first})


_CODE = re.compile(r"\b([A-Z][A-Z0-9]*_[A-Z0-9_]+)\b")
_PAREN = re.compile(r"\s*\([^()]*\)")


def capital(text: str) -> str:
    """``text`` with a capital first letter, unless its first word is a name written in lower
    case (``aws-ofi-nccl``, ``nccl-tests``, ``libfabric``, ``ncclras``): those stay as spelled."""
    first = text.split(" ", 1)[0]
    if not text or "-" in first or "_" in first or first.startswith(("nccl", "lib", "ib", "mlx")):
        return text
    return text[:1].upper() + text[1:]


def short_meaning(meaning: str) -> str:
    """A failure class's meaning cut to its name for a headline: its first clause without
    the parenthesised asides, and an error code it names ("RETRY_EXC_ERR")."""
    head = re.split(r"\s*[:;]", _PAREN.sub("", meaning), maxsplit=1)[0].strip().rstrip(",")
    code = _CODE.search(meaning)
    text = capital(head)
    return text + (f" ({code.group(1)})" if code and code.group(1) not in text else "")


def ranks_of_hosts(ctx, hosts: list[str]) -> list[int]:
    hr = host_ranks(ctx)
    return sorted({r for h in hosts for r in hr.get(h, [])})


__all__ = ["HostBlame", "capital", "class_finding", "FIRST_FAILURE_SCORE", "LOG_FINDING_SCORE", "blame", "cascade_text", "classes_of",
           "evidence", "first_text", "host_ranks", "hosts_of_ranks", "hosts_text", "job_hosts", "links",
           "ranks_of_hosts", "rows_of", "short_meaning", "since", "sql", "utc_clock", "where_text"]
