"""The self-contained HTML incident report (``stallscope analyze -o report.html``).

One file, no request leaves it: styles, plotly.js (a partial build with the two trace
types the report draws, vendored in ``forensics/report/vendor/``) and the figures' data
are inline, and a Content-Security-Policy lets only the report's own scripts (by nonce)
run and forbids every fetch. The verdict, findings and tables are
plain HTML, readable with scripts disabled; the plots add the timeline and heatmap.
Templates (jinja2, autoescaped) live in ``templates/`` at the repository root, or under
``share/stallscope/templates`` of an installed package (see :func:`template_dir`).
"""
from __future__ import annotations

import datetime as dt
import functools
import json
import math
import os
import secrets
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from markupsafe import Markup

from .. import __version__
from ..errors import InputError
from ..model.rank_hosts import rank_hosts_of
from ..wording import ms
from ..model.logs import hosts_in_text
from . import data, figures

TEMPLATE = "report.html.j2"
MAX_TABLE_ROWS = 500
MAX_EVIDENCE_ROWS = 25
TOP_ROWS = data.TOP_ROWS    # per-rank, per-flow, per-host tables: the most telling rows, then "… and N more"
MAX_HOST_DETAILS = 8        # more hosts than this: one summary row each, details for the most telling ones
MAX_DETAIL_ITEMS = 20       # entries of a finding's key number (a dict or list) shown; all in --json
QUERY = "stallscope query"
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


VENDOR = Path(__file__).resolve().parent / "vendor"
PLOTLY_BUNDLE = VENDOR / "plotly-stallscope.min.js"
PLOTLY_TRACES = ("scatter", "heatmap")   # what the vendored bundle can draw (figures.py uses no other)


def plotly_js() -> str:
    """The vendored partial plotly.js 4.1.1 (scatter and heatmap: ~1.1 MB instead of the
    full bundle's 4.8 MB; see vendor/README.md, its hash is checked by the tests)."""
    try:
        return PLOTLY_BUNDLE.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"the report's plotly.js is missing from this installation ({e})") from None


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
    totals: list[str] = field(default_factory=list)     # a last row over every row, shown or not

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


def detail(key: str, v: Any, first=()) -> str:
    """A finding's key number: *_ns durations in ms, *_ns timestamps in UTC; a dict or list of
    more than ``MAX_DETAIL_ITEMS`` entries shortened (keys in ``first``, e.g. the finding's
    ranks, kept first), the rest said in a count."""
    if key.endswith("_ns") and isinstance(v, (int, float)) and not isinstance(v, bool) and not pd.isna(v):
        return data.utc(v) if abs(v) > 1e15 else ms(v)
    if isinstance(v, (dict, list)):
        more = len(v) - MAX_DETAIL_ITEMS
        if more > 0 and isinstance(v, dict):
            front = [str(k) for k in first]
            keys = sorted(v, key=lambda k: str(k) not in front)[:MAX_DETAIL_ITEMS]   # stable: the rest in order
            v = {k: v[k] for k in keys}
        elif more > 0:
            v = v[:MAX_DETAIL_ITEMS]
        text = json.dumps(v, default=str, separators=(", ", ": "))
        return text + (f" … and {more} more (all in --json)" if more > 0 else "")
    return fmt(v)


def frame_table(key: str, title: str, df: pd.DataFrame, *, limit: int = MAX_TABLE_ROWS, highlight=None,
                intro: str = "", columns: list[str] | None = None, order=None, more: str = "",
                totals: dict | None = None) -> Table:
    """``df`` as a Table of at most ``limit`` rows. Longer: ``order`` (a function of the frame
    giving row positions, most telling first) picks the rows shown, ``more`` names what the
    rest are ("… and 462 more {more}"), ``totals`` (column -> value, over every row) becomes
    the last row."""
    cols = [c for c in (columns or list(df.columns)) if c in df.columns]
    hl = np.asarray(list(highlight), dtype=bool) if highlight is not None else None
    cut = len(df) > limit
    if cut and order is not None:
        pos = np.asarray(order(df.reset_index(drop=True)), dtype=np.int64)
        df = df.iloc[pos]
        hl = hl[pos] if hl is not None else None
    shown = df[cols].head(limit)
    named = [("host" in str(c)) for c in cols]     # a host with no name, as the first screen writes it
    rows = [[hosts_in_text(fmt(v)) if h else fmt(v) for v, h in zip(r, named)]
            for r in shown.itertuples(index=False, name=None)]
    note = ""
    if cut:
        note = (f"… and {len(df) - limit} more {more}" if more
                else f"first {limit} of {len(df)} rows ({QUERY} has them all)")
    numeric = [pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c]) for c in cols]
    foot = [fmt(totals.get(c)) for c in cols] if (cut and totals) else []
    return Table(key, title, [str(c) for c in cols], rows, hl[:limit].tolist() if hl is not None else [], intro,
                 note, numeric, foot)


def records_table(key: str, title: str, records: list[dict], limit: int, note: str = "") -> Table:
    """A table of JSON rows (evidence, links): columns in first-seen order. A host with no
    name (``unknown:<file>``) reads as the first screen writes it (:func:`hosts_in_text`)."""
    cols = data.evidence_columns(records)
    shown = records[:limit]
    numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool)
                   for r in shown if r.get(c) is not None) for c in cols]
    return Table(key, title, cols, [[detail(c, r.get(c)) if c.endswith("_ns") else hosts_in_text(fmt(r.get(c)))
                                     for c in cols] for r in shown], note=note, numeric=numeric)


def key_label(key: str) -> str:
    """A key number's name for people: "slow_p50_ns" -> "slow p50" (its value carries the unit)."""
    k = str(key)
    for suffix in ("_ns", "_ms"):
        if k.endswith(suffix):
            k = k[:-len(suffix)]
    return k.replace("_", " ")


def _json_script(obj: Any) -> str:
    """JSON safe inside <script type=application/json>: no '<', '>' or '&' left raw."""
    s = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028") \
        .replace("\u2029", "\\u2029")


def _plot_json(spec: Any) -> str:
    """:func:`_json_script` of a figure, NaN and infinities as null: the whole spec is walked
    (:func:`data.finite`: 0.04 s of the 0.055 s at 512 ranks) only when the plain dump finds one."""
    try:
        return _json_script(spec)
    except ValueError:               # "Out of range float values are not JSON compliant"
        return _json_script(data.finite(spec))


def _first(flags) -> Any:
    """An ``order`` for :func:`frame_table`: the flagged rows first, the rest as they come."""
    flags = np.asarray(list(flags), dtype=bool)
    return lambda df: np.concatenate([np.flatnonzero(flags), np.flatnonzero(~flags)])


def _tables(analysis, ranks: pd.DataFrame, findings, blamed: set[int]) -> dict[str, Table]:
    """Every table section, keyed by name; a table another module adds appears only when it
    has rows. Per-rank, per-flow and per-host tables longer than ``TOP_ROWS`` show their most
    telling rows, a totals row where sums mean something, and how many more there are."""
    tables: dict[str, Table] = {}
    _rank_table(analysis, ranks, findings, blamed, tables)
    _flow_table(analysis.model, tables)
    _artifact_tables(analysis.model, findings, tables)
    return tables


def _rank_table(analysis, ranks: pd.DataFrame, findings, blamed: set[int], tables: dict[str, Table]) -> None:
    """``tables["ranks"]``: the per-rank table (its most telling ``TOP_ROWS`` and a totals row
    beyond), else the state at capture of a hang judged from it; nothing without either."""
    rank_cols = [c for c in ("rank", "host", "pid", "calls", "not_completed", "p50_ms", "p99_ms", "max_ms",
                             "lateness_p50_ms", "lateness_p99_ms", "duration_source", "retx_kernel", "retx_pcap",
                             "dup_acks", "resets", "offcpu_ms") if c in ranks.columns]
    if len(ranks):
        many = len(ranks) > TOP_ROWS
        tables["ranks"] = frame_table(
            "ranks", "Per rank", ranks, columns=rank_cols, highlight=ranks["rank"].isin(blamed).tolist(),
            limit=TOP_ROWS, order=lambda df: data.trouble_order(df, blamed),
            more=f"ranks (all of them in {QUERY}: tables nccl_events, collectives, tcp_events)",
            totals=data.rank_totals(analysis, ranks) if many else None,
            intro="Durations in ms (p50/p99 over every call); lateness: how long after "
                  "the first rank each rank entered the same collective. Highlighted: "
                  "ranks a warning or error blames."
                  + (f" The {TOP_ROWS} shown: the ranks blamed, then the latest (lateness p99), then those with "
                     "the most trouble (calls not completed, lost data, resets); the last row: every rank together."
                     if many else ""))
    else:
        # a late capture: no call traced, but the state at capture knows every rank (its
        # position, Flight Recorder counters, main thread, sockets): the hang finding's evidence
        state = next((f for f in findings if f.details.get("state_at_capture") and f.evidence), None)
        if state is not None:
            rows = state.to_json()["evidence"]
            tables["ranks"] = records_table("ranks", "Per rank: the state at capture", rows, TOP_ROWS,
                                            note="No call was traced while the capture ran (it began after the "
                                                 "hang): each rank's last launched and completed collective, "
                                                 "its main thread and its sockets, as the capture found them.")


def _flow_table(model, tables: dict[str, Table]) -> None:
    """``tables["flows"]``: the TCP flows, troubled ones first (``TOP_ROWS`` and a totals row beyond)."""
    flows, nflows, totals = data.flow_table(model, limit=TOP_ROWS)
    if len(flows):
        many = nflows > len(flows)
        tables["flows"] = frame_table(
            "flows", "TCP flows", flows, highlight=(flows["retransmissions"].fillna(0) + flows["rsts"].fillna(0)
                                                    + flows["duplicate_acks"].fillna(0) > 0).tolist(),
            intro="One row per TCP connection in the pcaps, troubled ones first"
                  + (" (the most retransmissions first; the matrix above shows every link)" if many else "")
                  + ". History (Zeek style, upper case: originator): S SYN, H SYN-ACK, A ACK, D data, F FIN, "
                    "R RST, T retransmission, W zero window, G gap.")
        if many:
            t = tables["flows"]
            t.note = (f"showing {len(flows)} of {nflows} flows (all of them in {QUERY}: table flows); "
                      "the last row: every flow together.")
            t.totals = [fmt(totals.get(c)) for c in t.columns]


def _artifact_tables(model, findings, tables: dict[str, Table]) -> None:
    """The tables of the other artefacts (IB counters and ports, NCCL configuration and WARN lines,
    watchdog lines, process exits, nccl-tests, off-CPU time, stacks, Flight Recorder, host facts),
    each added to ``tables`` only when the model has rows for it."""
    ib = data.ib_table(model)
    if ib is not None:
        tables["ib"] = frame_table("ib", "InfiniBand / RoCE port counters (end - start)", ib,
                                   highlight=ib["problem"].fillna(False).astype(bool).tolist())
    cfg = data.optional_table(model, "nccl_config")
    if cfg is not None:
        hl = data.highlight_rows(cfg, findings)
        tables["nccl_config"] = frame_table(
            "nccl_config", "NCCL configuration per rank", cfg, highlight=hl, limit=TOP_ROWS, order=_first(hl),
            more=f"processes (all of them in {QUERY}: table nccl_config)",
            columns=CONFIG_COLUMNS, intro="From each rank's NCCL_DEBUG log and the manifest. Highlighted: ranks a "
                                          "misconfiguration finding names, or whose log has WARN lines.")
    warn = data.optional_table(model, "nccl_warnings")
    if warn is not None:
        hl = warn["first"].fillna(False).astype(bool).tolist() if "first" in warn else None
        tables["nccl_warnings"] = frame_table(
            "nccl_warnings", "NCCL WARN lines", warn, limit=100, highlight=hl,
            columns=["host", "rank", "pid", "ts", "class", "ib_status_name", "peer_host", "message", "artifact",
                     "log_line"],
            intro="Each line's host is the one its own prefix names (else its rank's). Highlighted: the job's "
                  "first failure; the class says what the message means (forensics/model/nccl_errors.py).")
    wd = data.optional_table(model, "watchdog_events")
    if wd is not None:
        tables["watchdog_events"] = frame_table(
            "watchdog_events", "PyTorch watchdog lines", wd, limit=100,
            columns=["host", "rank", "pg_id", "kind", "seq_num", "op", "numel_in", "last_enqueued", "last_completed",
                     "ran_for_ms", "error", "artifact", "log_line"],
            intro="SeqNum is PyTorch's number of the collective in its process group (Flight Recorder's "
                  "collective_seq_id), not NCCL's opCount.")
    ex = data.optional_table(model, "process_exits")
    if ex is not None:
        tables["process_exits"] = frame_table(
            "process_exits", "Processes torchrun reported failed or stopped", ex,
            columns=["host", "rank", "local_rank", "pid", "kind", "exitcode", "signal", "time", "traceback",
                     "artifact"])
    ports = data.optional_table(model, "ib_ports")
    if ports is not None:
        st = ports["state"].astype("string").str.upper().fillna("")
        tables["ib_ports"] = frame_table(
            "ib_ports", "InfiniBand / RoCE ports (ibstat, ibv_devinfo)", ports,
            highlight=(st != "ACTIVE").tolist(),
            columns=["host", "device", "port", "state", "phys_state", "rate_gbps", "width", "speed", "link_layer",
                     "tool", "artifact"])
    runs = data.optional_table(model, "nccl_tests_runs")
    if runs is not None:
        tables["nccl_tests_runs"] = frame_table("nccl_tests_runs", "nccl-tests runs", runs)
    nt = data.optional_table(model, "nccl_tests")
    if nt is not None:
        tables["nccl_tests"] = frame_table("nccl_tests", "nccl-tests results", nt)
    off = data.offcpu_threads(model)
    if off is not None:
        def by_offcpu(df):   # NCCL's threads first, the most off-CPU first
            key = df.assign(_ms=pd.to_numeric(df["offcpu_ms"], errors="coerce").fillna(-1))
            return key.sort_values(["nccl_thread", "_ms"], ascending=False, kind="stable").index.to_numpy()
        tables["offcpu"] = frame_table("offcpu", "Off-CPU time per thread over the capture", off,
                                       highlight=off["nccl_thread"].tolist(), limit=TOP_ROWS, order=by_offcpu,
                                       more=f"threads (all of them in {QUERY}: table offcpu)",
                                       intro="From the capture's scheduler samples (ms, last minus first sample). "
                                             "Highlighted: the threads that called NCCL (the per-rank column sums "
                                             "those)." + (" Shown: NCCL's threads first, the most off-CPU first."
                                                          if len(off) > TOP_ROWS else ""))
    stacks = data.stacks_text(model)
    if stacks is not None:
        tables["stacks"] = frame_table("stacks", "Stacks (py-spy)", stacks, limit=100)
    fr = data.fr_tail(model)
    if fr is not None:
        tables["fr_entries"] = frame_table("fr_entries", "Flight Recorder: last entries per rank", fr, limit=200)
    facts = data.optional_table(model, "host_facts")
    if facts is not None:
        tables["host_facts"] = frame_table("host_facts", "Hosts", facts, limit=TOP_ROWS,
                                           more=f"hosts (all of them in {QUERY}: table host_facts)")


def _progress_table(i: int, p) -> Table:
    """A communicator's progress per rank; more than ``TOP_ROWS`` ranks: those missing from or
    waiting in the hang point first (the least progressed first)."""
    per = p.per_rank
    hl = per["rank"].isin(p.missing_ranks + p.waiting_ranks).to_numpy()

    def telling(df):
        key = df.assign(_missing=df["rank"].isin(p.missing_ranks), _hl=hl,
                        _last=pd.to_numeric(df["last_entered"], errors="coerce"))
        return key.sort_values(["_missing", "_hl", "_last", "rank"], ascending=[False, False, True, True],
                               kind="stable").index.to_numpy()
    return frame_table(f"progress-{i}", f"communicator {p.comm_id_hash}", per, highlight=hl.tolist(),
                       limit=TOP_ROWS, order=telling,
                       more=f"ranks (the ranks that never entered the hang point first, then those waiting in it, "
                            f"the least progressed first; all of them in {QUERY}: table nccl_events)")


def _capture_hosts(captures: list[dict], blamed_hosts: set[str]) -> tuple[list[dict], Table | None, int]:
    """The hosts whose capture details the report shows: every one when there are at most
    ``MAX_HOST_DETAILS``, else the most telling ones (a failed collector, a partial capture,
    problems, a host a finding blames) and a summary table of every host; (shown, the
    summary or None, hosts left out of the details)."""
    if len(captures) <= MAX_HOST_DETAILS:
        return captures, None, 0
    rows = pd.DataFrame([{
        "host": c.get("host"), "start (UTC)": c["start_utc"], "seconds": c["seconds"],
        "files": c.get("files"), "bytes": c.get("bytes"),
        "ok": c["status_counts"].get("ok", 0), "skipped": c["status_counts"].get("skipped", 0),
        "failed": c["status_counts"].get("failed", 0),
        "ranks": data.rank_ranges([p["rank"] for p in c.get("processes") or [] if p.get("rank") is not None], 4),
        "partial": bool(c.get("partial")), "problems": len(c.get("problems") or []),
        "blamed": str(c.get("host")) in blamed_hosts} for c in captures])
    score = (rows["failed"] > 0) * 8 + rows["partial"] * 4 + (rows["problems"] > 0) * 2 + rows["blamed"] * 1
    order = np.argsort(-score.to_numpy(), kind="stable")
    shown_idx = sorted(order[:MAX_HOST_DETAILS].tolist())
    flags = np.zeros(len(rows), dtype=bool)
    flags[shown_idx] = True
    table = frame_table("capture_hosts", "Hosts captured", rows.drop(columns="blamed"), highlight=(score > 0).tolist(),
                        limit=TOP_ROWS, order=lambda df: order, more="hosts (all of them in --json: capture.hosts)",
                        intro="One row per host bundle: collectors by status, the ranks it held. Highlighted: a "
                              "failed collector, a partial capture, problems reading it, or a host a finding blames.")
    return [captures[i] for i in shown_idx], table, len(captures) - len(shown_idx)


def _skew(rows: list[dict]) -> tuple[list[dict], int]:
    """Clock skew rows: all of them up to ``TOP_ROWS``, else the largest estimates first."""
    if len(rows) <= TOP_ROWS:
        return rows, 0
    key = [(r["skew_ms"] is None, -abs(r["skew_ms"] or 0)) for r in rows]
    order = sorted(range(len(rows)), key=key.__getitem__)
    return [rows[i] for i in order[:TOP_ROWS]], len(rows) - TOP_ROWS


def heatmap(analysis, ranks: pd.DataFrame):
    """:func:`figures.heatmap`, a memo of the analysis (it needs the model alone: see
    :func:`forensics.report.model_steps`)."""
    return data.memo(analysis, "heatmap", lambda: figures.heatmap(analysis, ranks=ranks))


def context(analysis) -> dict[str, Any]:
    """Everything the template shows."""
    model = analysis.model
    slow_ms = analysis.options.slow_ms
    span = data.time_span(analysis)
    findings = analysis.findings
    serious = [f for f in findings if f.severity in ("error", "warning")]
    banner = serious[:3]
    notes = [f for f in findings if f.severity == "info"][:3] if not serious else []
    ranks = data.rank_table(analysis)
    figs = [f for f in (figures.timeline(analysis, slow_ms, ranks=ranks), heatmap(analysis, ranks),
                        figures.link_matrix(analysis), figures.nccl_tests_chart(model, findings)) if f is not None]
    plots = {f.key: _plot_json(f.spec) for f in figs}

    tables = _tables(analysis, ranks, findings, blamed={r for f in serious for r in f.ranks})

    progress = data.progress_of(analysis)
    stuck = [p for p in progress if p.stuck_op_count is not None]
    hang_kinds = {"hang_mismatch", "hang_host", "hang_stuck"}
    show_hang = any(f.kind in hang_kinds for f in findings)
    hang_tables = [_progress_table(i, p) for i, p in enumerate(progress)] if show_hang else []

    evidence, links = [], []
    for i, f in enumerate(findings):
        j = f.to_json()
        rows = j["evidence"]
        evidence.append(records_table(f"evidence-{i}", "evidence", rows, MAX_EVIDENCE_ROWS,
                                      note=(f"first {MAX_EVIDENCE_ROWS} of {len(rows)} rows (all in --json)"
                                            if len(rows) > MAX_EVIDENCE_ROWS else "")))
        links.append(records_table(f"links-{i}", "links", j["links"], TOP_ROWS,
                                   note=(f"first {TOP_ROWS} of {len(j['links'])} links (all in --json)"
                                         if len(j["links"]) > TOP_ROWS else "")))
    bundles = [x for c in model.captures for x in (c.get("given") or [c.get("bundle", "")])]
    captures, capture_hosts, hosts_left = _capture_hosts(
        data.capture_view(analysis), {h for f in serious for h in f.hosts + f.nodes})
    skew, skew_left = _skew(data.skew_rows(analysis))
    hosts = [str(h) for h in model.hosts]
    hosts_text = ", ".join(hosts[:MAX_HOST_DETAILS]) + (f", … and {len(hosts) - MAX_HOST_DETAILS} more"
                                                          if len(hosts) > MAX_HOST_DETAILS else "")
    # the ranks' own host names, where they differ from the captures' (pods, namespaces)
    own = sorted({h for h, _ in rank_hosts_of(model).values() if h} - set(hosts))
    rank_hosts_text = (", ".join(own[:MAX_HOST_DETAILS]) + (f", … and {len(own) - MAX_HOST_DETAILS} more"
                                                            if len(own) > MAX_HOST_DETAILS else "")) if own else ""
    return {
        "version": __version__, "rank_hosts": own, "rank_hosts_text": rank_hosts_text,
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"),
        "verdict": analysis.verdict(),
        "worst": (serious[0].severity if serious else
                  "warning" if any(p.startswith("detector ") for p in analysis.problems) else "ok"),
        "banner": banner, "first_fields": data.first_screen(analysis, banner[0]) if banner else [],
        "info_notes": notes, "findings": findings, "evidence": evidence, "links": links,
        "hosts": model.hosts, "hosts_text": hosts_text, "span": span,
        "start_utc": data.utc(span.start_ns), "end_utc": data.utc(span.end_ns), "span_text": data.span_text(analysis),
        "nranks": data.known_ranks(analysis, ranks), "ncalls": len(model.tables["nccl_events"]),
        "calls_text": data.calls_text(analysis),
        "ntcp": len(model.tables["tcp_events"]), "slow_ms": slow_ms,
        "figures": figs, "plots": plots, "tables": tables,
        "show_hang": show_hang, "stuck": stuck, "hang_tables": hang_tables,
        "captures": captures, "capture_hosts": capture_hosts, "hosts_left": hosts_left,
        "notes": list(getattr(model, "notes", [])),
        "logs_only": model.logs_only,
        "nwarn": len(model.tables.get("nccl_warnings", ())),
        "nwatchdog": len(model.tables.get("watchdog_events", ())),
        "skew": skew, "skew_left": skew_left, "problems": analysis.problems,
        # one line per kind of gap and per problem met on several hosts; the details below
        "gaps": data.gap_lines(analysis),
        "duration_sources": data.DURATION_SOURCES, "bundles": bundles,
        "query_target": " ".join(_shell_quote(b) for b in bundles) or "BUNDLE",
    }


def _shell_quote(s: str) -> str:
    return shlex.quote(s)


def bytecode_cache(directory: str | None = None):
    """The compiled templates kept from one run to the next (compiling ``report.html.j2`` is
    0.08-0.12 s of every report, in the command's serial part; loading it, 2 ms): Jinja's cache in
    ``directory``, by default its per-user folder under the temporary directory (made private
    to the user; refused where someone else owns it). An entry is used only if it matches the
    template's source and this Python and Jinja; one that cannot be read or written is
    compiled again, never an error. None where no such folder can be had."""
    import jinja2

    class Cache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket) -> None:
            try:
                super().load_bytecode(bucket)
            except Exception:   # noqa: BLE001 - unreadable or damaged (Jinja checks only some of it)
                bucket.reset()

        def dump_bytecode(self, bucket) -> None:
            try:
                super().dump_bytecode(bucket)
            except OSError:     # a full or read-only disk: the next run compiles it again
                pass

    try:
        return Cache(directory)
    except (OSError, RuntimeError):
        return None


@functools.lru_cache(maxsize=4)
def _environment(templates: str, cache_dir: str | None = None):
    """The Jinja environment of a template folder; it keeps the compiled template, recompiled
    when the file changes, and takes it from :func:`bytecode_cache` (``cache_dir``) when an
    earlier run compiled it."""
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, bytecode_cache=bytecode_cache(cache_dir))
    env.filters["fmt"] = fmt
    env.filters["detail"] = lambda kv: detail(*kv)
    env.filters["key_label"] = key_label
    env.filters["utc"] = data.utc
    env.filters["pct"] = lambda v: f"{100 * float(v):.0f}%"
    env.filters["ranks"] = data.rank_ranges
    return env


def template():
    return _environment(str(template_dir())).get_template(TEMPLATE)


def prepare() -> None:
    """What :func:`render` needs before it has an analysis: the template compiled (called
    while worker processes read the bundles and this one waits)."""
    template()


def render(analysis, *, with_plotly: bool = True) -> str:
    ctx = context(analysis)
    ctx["nonce"] = secrets.token_urlsafe(18)
    ctx["plotly_js"] = Markup(plotly_js()) if (with_plotly and ctx["plots"]) else ""
    ctx["plots"] = {k: Markup(v) for k, v in ctx["plots"].items()}
    return template().render(**ctx)


def write(analysis, fh) -> None:
    fh.write(render(analysis))
