"""The self-contained HTML incident report (``stallscope analyze -o report.html``).

One file, no request leaves it: styles, plotly.js (from the installed plotly package)
and the figures' data are inline, and a Content-Security-Policy lets only the report's
own scripts (by nonce) run and forbids every fetch. The verdict, findings and tables are
plain HTML, readable with scripts disabled; the plots add the timeline and heatmap.
Templates (jinja2, autoescaped) live in ``templates/`` at the repository root, or under
``share/stallscope/templates`` of an installed package (see :func:`template_dir`).
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from markupsafe import Markup

from .. import __version__
from ..errors import InputError
from . import data, figures

TEMPLATE = "report.html.j2"
MAX_TABLE_ROWS = 500
MAX_EVIDENCE_ROWS = 25
CONFIG_COLUMNS = ["host", "rank", "pid", "nccl_version", "transport", "ib_devices", "link_layers", "socket_ifaces",
                  "gdr", "nchannels", "net_channels", "ring_channels", "tree_channels", "channel_transports",
                  "warnings", "env", "source"]


def template_dir() -> Path:
    """Where ``report.html.j2`` is: $STALLSCOPE_TEMPLATES, the repository's ``templates/``
    (source checkout, editable install), or the data files of an installed wheel."""
    candidates = []
    if os.environ.get("STALLSCOPE_TEMPLATES"):
        candidates.append(Path(os.environ["STALLSCOPE_TEMPLATES"]))
    candidates.append(Path(__file__).resolve().parents[2] / "templates")
    candidates += [Path(p) / "share" / "stallscope" / "templates" for p in (sys.prefix, sys.base_prefix)]
    for c in candidates:
        if (c / TEMPLATE).is_file():
            return c
    raise InputError(f"report template {TEMPLATE} not found (looked in {', '.join(map(str, candidates))})")


def plotly_js() -> str:
    """plotly.min.js as bundled with the installed plotly package."""
    from plotly.offline import get_plotlyjs
    return get_plotlyjs()


@dataclass
class Table:
    """A table ready for the template: formatted cells, optional highlighted rows."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    highlight: list[bool] = field(default_factory=list)
    intro: str = ""
    note: str = ""
    numeric: list[bool] = field(default_factory=list)   # right-aligned columns

    @property
    def pre_columns(self) -> set[int]:
        return {i for i in range(len(self.columns)) if any("\n" in r[i] or len(r[i]) > 160 for r in self.rows)}


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v)
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
        if isinstance(v, list):
            return ", ".join(fmt(x) for x in v)
    try:
        if pd.isna(v):
            return "-"
    except (TypeError, ValueError):
        pass
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        if v == int(v) and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.3f}" if abs(v) < 1e6 else f"{v:.4g}"
    if isinstance(v, dict):
        return json.dumps(v, default=str)
    return str(v)


def detail(key: str, v: Any) -> str:
    """A finding's key number: *_ns durations in ms, *_ns timestamps in UTC."""
    if key.endswith("_ns") and isinstance(v, (int, float)) and not isinstance(v, bool) and not pd.isna(v):
        return data.utc(v) if abs(v) > 1e15 else f"{v / 1e6:.3f} ms"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str, separators=(", ", ": "))
    return fmt(v)


def frame_table(key: str, title: str, df: pd.DataFrame, *, limit: int = MAX_TABLE_ROWS, highlight=None,
                intro: str = "", columns: list[str] | None = None) -> Table:
    cols = [c for c in (columns or list(df.columns)) if c in df.columns]
    shown = df[cols].head(limit)
    rows = [[fmt(v) for v in r] for r in shown.itertuples(index=False, name=None)]
    note = f"first {limit} of {len(df)} rows (stallscope query has them all)" if len(df) > limit else ""
    hl = list(highlight[:limit]) if highlight is not None else []
    numeric = [pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) for c in cols]
    return Table(key, title, [str(c) for c in cols], rows, hl, intro, note, numeric)


def records_table(key: str, title: str, records: list[dict], limit: int, note: str = "") -> Table:
    """A table of JSON rows (evidence, links): columns in first-seen order."""
    cols = data.evidence_columns(records)
    shown = records[:limit]
    numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool)
                   for r in shown if r.get(c) is not None) for c in cols]
    return Table(key, title, cols, [[fmt(r.get(c)) for c in cols] for r in shown], note=note, numeric=numeric)


def _json_script(obj: Any) -> str:
    """JSON safe inside <script type=application/json>: no '<', '>' or '&' left raw."""
    s = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028") \
        .replace("\u2029", "\\u2029")


def _tables(model, ranks: pd.DataFrame, findings, blamed: set[int]) -> dict[str, Table]:
    """Every table section, keyed by name; a table another module adds appears only when it
    has rows."""
    rank_cols = [c for c in ("rank", "host", "pid", "calls", "not_completed", "p50_ms", "p99_ms", "max_ms",
                             "lateness_p50_ms", "lateness_p99_ms", "duration_source", "retx_kernel", "retx_pcap",
                             "dup_acks", "resets", "offcpu_ms") if c in ranks.columns]
    tables: dict[str, Table] = {}
    if len(ranks):
        tables["ranks"] = frame_table("ranks", "Per rank", ranks, columns=rank_cols,
                                      highlight=ranks["rank"].isin(blamed).tolist(),
                                      intro="Durations in ms (p50/p99 over every call); lateness: how long after "
                                            "the first rank each rank entered the same collective. Highlighted: "
                                            "ranks a warning or error blames.")
    flows, nflows = data.flow_table(model)
    if len(flows):
        tables["flows"] = frame_table(
            "flows", "TCP flows", flows, highlight=(flows["retransmissions"].fillna(0) + flows["rsts"].fillna(0)
                                                    + flows["duplicate_acks"].fillna(0) > 0).tolist(),
            intro="One row per TCP connection in the pcaps, troubled ones first. History (Zeek style, upper case: "
                  "originator): S SYN, H SYN-ACK, A ACK, D data, F FIN, R RST, T retransmission, W zero window, "
                  "G gap.")
        if nflows > len(flows):
            tables["flows"].note = f"first {len(flows)} of {nflows} flows"
    ib = data.ib_table(model)
    if ib is not None:
        tables["ib"] = frame_table("ib", "InfiniBand / RoCE port counters (end - start)", ib,
                                   highlight=ib["problem"].fillna(False).astype(bool).tolist())
    cfg = data.optional_table(model, "nccl_config")
    if cfg is not None:
        tables["nccl_config"] = frame_table(
            "nccl_config", "NCCL configuration per rank", cfg, highlight=data.highlight_rows(cfg, findings),
            columns=CONFIG_COLUMNS, intro="From each rank's NCCL_DEBUG log and the manifest. Highlighted: ranks a "
                                          "misconfiguration finding names, or whose log has WARN lines.")
    warn = data.optional_table(model, "nccl_warnings")
    if warn is not None:
        tables["nccl_warnings"] = frame_table("nccl_warnings", "NCCL WARN lines", warn, limit=100,
                                              columns=["host", "rank", "pid", "ts", "func", "message", "artifact",
                                                       "log_line"])
    runs = data.optional_table(model, "nccl_tests_runs")
    if runs is not None:
        tables["nccl_tests_runs"] = frame_table("nccl_tests_runs", "nccl-tests runs", runs)
    nt = data.optional_table(model, "nccl_tests")
    if nt is not None:
        tables["nccl_tests"] = frame_table("nccl_tests", "nccl-tests results", nt)
    off = data.offcpu_threads(model)
    if off is not None:
        tables["offcpu"] = frame_table("offcpu", "Off-CPU time per thread over the capture", off,
                                       highlight=off["nccl_thread"].tolist(),
                                       intro="From the capture's scheduler samples (ms, last minus first sample). "
                                             "Highlighted: the threads that called NCCL (the per-rank column sums "
                                             "those).")
    stacks = data.stacks_text(model)
    if stacks is not None:
        tables["stacks"] = frame_table("stacks", "Stacks (py-spy)", stacks, limit=100)
    fr = data.fr_tail(model)
    if fr is not None:
        tables["fr_entries"] = frame_table("fr_entries", "Flight Recorder: last entries per rank", fr, limit=200)
    facts = data.optional_table(model, "host_facts")
    if facts is not None:
        tables["host_facts"] = frame_table("host_facts", "Hosts", facts)

    return tables


def context(analysis) -> dict[str, Any]:
    """Everything the template shows."""
    model = analysis.model
    slow_ms = analysis.options.slow_ms
    span = data.time_span(analysis)
    findings = analysis.findings
    serious = [f for f in findings if f.severity in ("error", "warning")]
    banner = serious[:3]
    notes = [f for f in findings if f.severity == "info"][:3] if not serious else []
    figs = [f for f in (figures.timeline(analysis, slow_ms), figures.heatmap(analysis),
                        figures.nccl_tests_chart(model, findings)) if f is not None]
    plots = {f.key: _json_script(data.finite(f.spec)) for f in figs}

    ranks = data.rank_table(analysis)
    tables = _tables(model, ranks, findings, blamed={r for f in serious for r in f.ranks})

    progress = data.progress(model)
    stuck = [p for p in progress if p.stuck_op_count is not None]
    hang_kinds = {"hang_mismatch", "hang_stuck"}
    show_hang = bool(stuck) or any(f.kind in hang_kinds for f in findings)
    hang_tables = [frame_table(f"progress-{i}", f"communicator {p.comm_id_hash}", p.per_rank,
                               highlight=(p.per_rank["rank"].isin(p.missing_ranks + p.waiting_ranks)).tolist())
                   for i, p in enumerate(progress)] if show_hang else []

    evidence, links = [], []
    for i, f in enumerate(findings):
        j = f.to_json()
        rows = j["evidence"]
        evidence.append(records_table(f"evidence-{i}", "evidence", rows, MAX_EVIDENCE_ROWS,
                                      note=(f"first {MAX_EVIDENCE_ROWS} of {len(rows)} rows (all in --json)"
                                            if len(rows) > MAX_EVIDENCE_ROWS else "")))
        links.append(records_table(f"links-{i}", "links", j["links"], MAX_TABLE_ROWS))
    bundles = [c.get("bundle", "") for c in model.captures]
    return {
        "version": __version__,
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
        "verdict": analysis.verdict(),
        "worst": (serious[0].severity if serious else "ok"),
        "banner": banner, "info_notes": notes, "findings": findings, "evidence": evidence, "links": links,
        "hosts": model.hosts, "span": span, "start_utc": data.utc(span.start_ns), "end_utc": data.utc(span.end_ns),
        "nranks": len(ranks), "ncalls": len(model.tables["nccl_events"]),
        "ntcp": len(model.tables["tcp_events"]), "slow_ms": slow_ms,
        "figures": figs, "plots": plots, "tables": tables,
        "show_hang": show_hang, "stuck": stuck, "hang_tables": hang_tables,
        "captures": data.capture_view(analysis), "skew": data.skew_rows(analysis), "problems": analysis.problems,
        "duration_sources": data.DURATION_SOURCES, "bundles": bundles,
        "query_target": " ".join(_shell_quote(b) for b in bundles) or "BUNDLE",
    }


def _shell_quote(s: str) -> str:
    import shlex
    return shlex.quote(s)


def render(analysis, *, with_plotly: bool = True) -> str:
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir())), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    env.filters["detail"] = lambda kv: detail(*kv)
    env.filters["utc"] = data.utc
    env.filters["pct"] = lambda v: f"{100 * float(v):.0f}%"
    ctx = context(analysis)
    ctx["nonce"] = secrets.token_urlsafe(18)
    ctx["plotly_js"] = Markup(plotly_js()) if (with_plotly and ctx["plots"]) else ""
    ctx["plots"] = {k: Markup(v) for k, v in ctx["plots"].items()}
    return env.get_template(TEMPLATE).render(**ctx)


def write(analysis, fh) -> None:
    fh.write(render(analysis))
