"""A ticket-ready Markdown summary (``stallscope analyze --markdown summary.md``).

The verdict, each finding with its key numbers, what to do, a few evidence rows and its
SQL, then the per-rank numbers and what the capture lacked. Text from bundles (host
names, process names, paths) is escaped so a ticket system renders it as text: no HTML
passes through, and table cells cannot break their row.
"""
from __future__ import annotations

import re

from . import data
from .html import detail, fmt

MAX_EVIDENCE_ROWS = 10
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")   # with < > & as entities: no emphasis, link, code or cell break


def text(v) -> str:
    """Inline Markdown text: HTML neutralised, Markdown punctuation escaped, one line."""
    s = fmt(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return " ".join(_MD_SPECIAL.sub(r"\\\1", s).split())


def para(v) -> str:
    """``text`` for a line of its own: a leading block marker (heading, list item, setext
    underline) is escaped too, so the line stays a paragraph."""
    s = re.sub(r"^(\d+)([.)])", r"\1\\\2", text(v))
    return "\\" + s if s[:1] in ("#", "+", "-", "=") else s


def code(v) -> str:
    """Inline code span that survives any backticks in the value (HTML is inert inside)."""
    s = " ".join(fmt(v).split())
    run = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (run + 1)
    return f"{fence} {s} {fence}" if s else "` `"


def table(columns: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(text(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(text(v) for v in r) + " |" for r in rows]
    return out


def fenced(body: str, lang: str = "") -> list[str]:
    run = max((len(m) for m in re.findall(r"`{3,}", body)), default=2)
    fence = "`" * (run + 1)
    return [fence + lang, body, fence]


def render(analysis) -> str:
    model = analysis.model
    span = data.time_span(analysis)
    findings = analysis.findings
    lines = ["# stallscope: " + text(analysis.verdict()), ""]
    lines.append(f"- hosts: {', '.join(text(h) for h in model.hosts)}")
    loose = [c for c in model.captures if c.get("kind") == "loose"]
    nf = f"{len(findings)} finding{'' if len(findings) == 1 else 's'}"
    if loose and len(loose) == len(model.captures):     # the logs alone
        read = sum(len(c.get("files_read") or []) for c in loose)
        lines.append(f"- from the logs alone: {read} file(s) read, {len(model.tables['nccl_warnings'])} NCCL WARN "
                     f"lines, {len(model.tables.get('watchdog_events', ()))} PyTorch watchdog lines, {nf}")
    else:
        secs = f" ({span.seconds:.1f} s)" if span.seconds is not None else ""
        lines.append(f"- captured: {data.utc(span.start_ns)} to {data.utc(span.end_ns)}{secs}")
        lines.append(f"- {len(model.tables['nccl_events'])} NCCL calls, {len(model.tables['tcp_events'])} TCP "
                     f"events, {nf}")
    lines.append("")
    if findings:
        lines += ["## Findings", ""]
        lines += table(["#", "severity", "kind", "confidence", "ranks", "summary"],
                       [[i + 1, f.severity, f.kind, f"{100 * f.confidence:.0f}%", f.ranks or "-", f.summary]
                        for i, f in enumerate(findings)])
        lines.append("")
        for i, f in enumerate(findings, 1):
            lines += [f"### {i}. {text(f.severity)}: {text(f.kind)} (confidence {100 * f.confidence:.0f}%)", "",
                      para(f.summary), ""]
            if f.action:
                lines += [f"**What to do:** {text(f.action)}", ""]
            who = []
            if f.ranks:
                who.append("ranks " + text(f.ranks))
            if f.peer_ranks:
                who.append("peer ranks " + text(f.peer_ranks))
            if f.hosts:
                who.append("hosts " + text(f.hosts))
            if who:
                lines += ["- " + "; ".join(who)]
            for k, v in (f.details or {}).items():
                if isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v)):
                    continue    # nested breakdowns: in the report and --json, too long for a ticket
                lines.append(f"- {text(k)}: {text(detail(k, v))}")
            if who or f.details:
                lines.append("")
            ev = f.to_json()["evidence"]
            if ev:
                cols = data.evidence_columns(ev)
                lines += [f"Evidence ({len(ev)} row{'' if len(ev) == 1 else 's'}"
                          + (f", first {MAX_EVIDENCE_ROWS}" if len(ev) > MAX_EVIDENCE_ROWS else "") + "):", ""]
                lines += table(cols, [[r.get(c) for c in cols] for r in ev[:MAX_EVIDENCE_ROWS]])
                lines.append("")
            if f.sql:
                lines += ["SQL (`stallscope query BUNDLE \"...\"`):", ""] + fenced(f.sql, "sql") + [""]
    else:
        lines += ["No findings.", ""]

    ranks = data.rank_table(analysis)
    if len(ranks):
        cols = [c for c in ("rank", "host", "calls", "not_completed", "p50_ms", "p99_ms", "lateness_p99_ms",
                            "retx_kernel", "retx_pcap", "dup_acks", "resets", "offcpu_ms") if c in ranks.columns]
        shown = ranks
        if len(ranks) > data.TOP_ROWS:   # the most telling ranks (blamed, latest, most trouble), as the report
            blamed = {r for f in analysis.findings if f.severity in ("error", "warning") for r in f.ranks}
            shown = ranks.iloc[data.trouble_order(ranks.reset_index(drop=True), blamed)[:data.TOP_ROWS]]
        lines += ["## Per rank", ""] + table(cols, shown[cols].values.tolist()) + [""]
        if len(shown) < len(ranks):
            lines += [f"... and {len(ranks) - len(shown)} more ranks (the ranks blamed, then the latest, shown "
                      "first; all of them in `stallscope query`)", ""]

    stuck = [p for p in data.progress_of(analysis) if p.stuck_op_count is not None]
    if stuck:
        lines += ["## Hang point", ""]
        for p in stuck:
            s = (f"- communicator {code(p.comm_id_hash)}: {text(p.stuck_op)} #{p.stuck_op_count} "
                 "not completed by every rank")
            if p.missing_ranks:
                s += f"; never entered: ranks {text(p.missing_ranks)}"
            if p.waiting_ranks:
                s += f"; waiting: ranks {text(p.waiting_ranks)}"
            lines.append(s)
        lines.append("")

    lines += ["## Capture", ""]
    for c in data.capture_view(analysis):
        if c.get("kind") == "loose":
            lines.append(f"- loose evidence: {len(c['files_read'])} file(s) read"
                         + (f", {len(c['not_read'])} not read" if c["not_read"] else "")
                         + "; absent: " + ", ".join(text(a["evidence"]) for a in c["absent"]))
            for nr in c["not_read"][:10]:
                lines.append(f"  - not read: {code(nr['path'])}: {text(nr['reason'])}")
            continue
        counts = ", ".join(f"{n} {s}" for s, n in c["status_counts"].items())
        secs = f" ({c['seconds']:.1f} s)" if c["seconds"] is not None else ""
        partial = " **partial capture**" if c.get("partial") else ""
        lines.append(f"- {text(c['host'])}: {c['start_utc']} to {c['end_utc']}{secs}, collectors {counts}{partial}")
        for k in c["collectors"]:
            if k["status"] != "ok":
                lines.append(f"  - {text(k['name'])} {text(k['status'])}: {text(k.get('reason') or '')}")
    for s in data.skew_rows(analysis):
        lines.append(f"- clock skew {text(s['host_b'])} - {text(s['host_a'])}: {text(s['skew_ms'])} ms "
                     f"({text(s['status'])})")
    for n in getattr(model, "notes", []):
        lines.append(f"- {text(n)}")
    if analysis.problems:
        lines += ["", f"Problems met ({len(analysis.problems)}):", ""]
        lines += [f"- {text(p)}" for p in analysis.problems[:20]]
        if len(analysis.problems) > 20:
            lines.append(f"- ... and {len(analysis.problems) - 20} more (see --json)")
    lines.append("")
    return "\n".join(lines)


def write(analysis, fh) -> None:
    fh.write(render(analysis))
