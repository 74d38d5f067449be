"""A ticket-ready Markdown summary (``stallscope analyze --markdown summary.md``).

The verdict and the report's first-screen fields, the findings one line each, the top
finding's whole verdict and evidence, the most telling ranks, and one line per kind of gap
in the capture (:func:`render`). Text from bundles (host
names, process names, paths) is escaped so a ticket system renders it as text: no HTML
passes through, and table cells cannot break their row.
"""
from __future__ import annotations

import re

from . import data
from .html import detail, fmt

MAX_EVIDENCE_ROWS = 8
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


MD_RANK_ROWS = 8          # the most telling ranks in a ticket; every rank in the report and `stallscope query`
MD_FINDINGS = 8           # findings listed in the ticket's table


def render(analysis) -> str:
    """The ticket: the headline, the first screen's fields, the findings one line each, the
    top finding's whole verdict and evidence, the serious others with what to do, the most
    telling ranks, and one line per kind of gap in the capture. Nothing said twice; under
    60 lines however large the job (the report and ``--json`` hold the rest)."""
    model = analysis.model
    findings = analysis.findings
    serious = [f for f in findings if f.severity in ("error", "warning")]
    lines = ["# stallscope: " + text(analysis.verdict()), ""]
    if serious:
        lines += [f"- **{fl.label}:** {text(fl.text)}" for fl in data.first_screen(analysis, serious[0])]
    hosts = [str(h) for h in model.hosts]
    hosts_txt = f"{len(hosts)} host{'' if len(hosts) == 1 else 's'} ({text(', '.join(hosts[:6]))}" \
        + (" …)" if len(hosts) > 6 else ")") if hosts else "no host named in the logs"
    if model.logs_only:
        read = sum(len(c.get("files_read") or []) for c in model.captures)
        lines.append(f"- **Read:** {hosts_txt}; the logs alone: {read} file(s), {len(model.tables['nccl_warnings'])} "
                     f"NCCL WARN lines, {len(model.tables.get('watchdog_events', ()))} PyTorch watchdog lines")
    else:
        lines.append(f"- **Captured:** {hosts_txt}, {text(data.span_text(analysis))}; "
                     f"{data.calls_text(analysis)}, {len(model.tables['tcp_events'])} TCP events")
    lines.append("")
    if findings:
        lines += ["## Findings", ""]
        lines += table(["#", "severity", "kind", "confidence", "ranks", "hosts", "verdict"],
                       [[i + 1, f.severity, f.kind, f"{100 * f.confidence:.0f}%", f.ranks or "-",
                         ", ".join(f.hosts[:4]) or "-", f.headline or f.summary]
                        for i, f in enumerate(findings[:MD_FINDINGS])])
        if len(findings) > MD_FINDINGS:
            lines.append(f"\n... and {len(findings) - MD_FINDINGS} more findings (in the report and --json)")
        lines.append("")
        for i, f in enumerate(serious[:3], 1):
            lines += [f"### {i}. {text(f.severity)}: {text(f.kind)} (confidence {100 * f.confidence:.0f}%)", "",
                      para(f.summary), ""]
            if i > 1 and f.action:            # the first one's is under Next above
                lines += [f"**What to do:** {text(f.action)}", ""]
            ev = f.to_json()["evidence"]
            if i == 1 and ev:
                cols = data.evidence_columns(ev)
                lines += [f"Evidence ({len(ev)} row{'' if len(ev) == 1 else 's'}"
                          + (f", first {MAX_EVIDENCE_ROWS}" if len(ev) > MAX_EVIDENCE_ROWS else "")
                          + "; its SQL in the report and --json):", ""]
                lines += table(cols, [[r.get(c) for c in cols] for r in ev[:MAX_EVIDENCE_ROWS]])
                lines.append("")
    else:
        lines += ["No findings.", ""]

    ranks = data.rank_table(analysis)
    if len(ranks):
        cols = [c for c in ("rank", "host", "calls", "not_completed", "p50_ms", "p99_ms", "lateness_p99_ms",
                            "retx_kernel", "retx_pcap", "dup_acks", "resets") if c in ranks.columns]
        blamed = {r for f in serious for r in f.ranks}
        shown = ranks.iloc[data.trouble_order(ranks.reset_index(drop=True), blamed)[:MD_RANK_ROWS]] \
            if len(ranks) > MD_RANK_ROWS else ranks
        lines += ["## Per rank", ""] + table(cols, shown[cols].values.tolist()) + [""]
        if len(shown) < len(ranks):
            lines += [f"... and {len(ranks) - len(shown)} more ranks (the ranks blamed, then the latest, shown "
                      "first; all of them in the report and `stallscope query`)", ""]

    lines += ["## Capture", ""]
    for c in data.capture_view(analysis):
        if c.get("kind") == "loose":
            lines.append(f"- loose evidence: {len(c['files_read'])} file(s) read"
                         + (f", {len(c['not_read'])} not read" if c["not_read"] else "")
                         + "; absent: " + ", ".join(text(a["evidence"]) for a in c["absent"]))
    gaps = data.gap_lines(analysis) + [str(n) for n in getattr(model, "notes", [])]
    lines += [f"- {text(g)}" for g in gaps[:MD_GAPS]]
    if len(gaps) > MD_GAPS:
        lines.append(f"- ... and {len(gaps) - MD_GAPS} more (the report's capture section)")
    if not gaps:
        lines.append("- every collector ran on every host")
    lines.append("")
    return "\n".join(lines)


MD_GAPS = 8


def write(analysis, fh) -> None:
    fh.write(render(analysis))
