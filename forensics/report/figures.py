"""Plotly figures of the report, as plain ``{"data", "layout"}`` dicts.

Built without ``plotly.graph_objects`` (slow to import, validates every point): the
report embeds these dicts as JSON and plotly.js draws them. Every string that comes
from a bundle is HTML-escaped here, because plotly renders a subset of HTML in hover
text and labels. Large captures are thinned to fixed budgets (``MAX_INTERVALS``,
``MAX_MARKERS``, ``MAX_HEATMAP_COLUMNS``) so the report stays small; what was thinned
is said in the figure's note.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..model.rank_hosts import rank_hosts_of
from . import data
from ..model.windows import host_windows

MAX_INTERVALS = 5000        # collective intervals drawn on the timeline
MAX_MARKERS = 2500          # TCP markers drawn on the timeline
MAX_HEATMAP_COLUMNS = 200   # columns of a heatmap row (op counts or time, binned beyond)
MAX_HEATMAP_CELLS = 60_000  # cells of one heatmap view (fewer time columns for very many ranks)
MAX_LANES = 32              # above this many ranks the timeline draws only the outliers' lanes:
MAX_BLAMED_LANES = 32       # ... the ranks a finding blames (at most this many)
LATEST_LANES = 16           # ... and the latest ranks by lateness; the heatmap then shows every rank
MAX_LINK_AXIS = 128         # ranks per axis of the link matrix (consecutive ranks grouped beyond)

OP_COLORS = {"ALL_REDUCE": "#1f77b4", "ALL_GATHER": "#2ca02c", "REDUCE_SCATTER": "#9467bd", "BROADCAST": "#8c564b",
             "REDUCE": "#17becf", "SEND": "#bcbd22", "RECV": "#e377c2"}
SOURCE_DASH = {"gpu": "solid", "host_sync": "dash", "call": "dot"}
MARKERS = {"retransmission": ("triangle-up", "#d62728"), "lost segment": ("triangle-down", "#d62728"),
           "duplicate ACK": ("circle", "#ff7f0e"), "out-of-order segment": ("circle-open", "#ff7f0e"),
           "spurious retransmission": ("triangle-up-open", "#7f7f7f"), "ACKed unseen segment": ("square-open", "#7f7f7f"),
           "keep-alive or window update": ("diamond-open", "#7f7f7f"), "zero window": ("square", "#9467bd"),
           "reset": ("x", "#111111"), "other TCP": ("diamond", "#7f7f7f"),
           "rendezvous store (not NCCL)": ("x-thin-open", "#b0b0b0")}
STORE_LABEL = "rendezvous store (not NCCL)"


def esc(v: Any) -> str:
    """Bundle text for plotly labels and hover text: HTML-escaped, missing values as '-'."""
    try:
        missing = v is None or bool(pd.isna(v))
    except (TypeError, ValueError):     # list-likes
        missing = False
    # quotes stay: plotly decodes &lt; &gt; &amp; only, and without a raw '<' no tag can form
    return html.escape("-" if missing else str(v), quote=False)


def int_text(s: pd.Series, missing: str) -> pd.Series:
    """Whole numbers as text, ``missing`` where there is none (pandas 3 keeps a missing value
    missing through ``astype(str)``; older pandas writes "<NA>")."""
    v = pd.to_numeric(s, errors="coerce").astype("Int64")
    return v.astype(str).astype(object).where(v.notna().to_numpy(), missing)


def esc_each(s: pd.Series) -> pd.Series:
    """:func:`esc` of every value of ``s``, worked out once per distinct value (a few hundred
    addresses and names among thousands of markers)."""
    codes, uniq = pd.factorize(s)                  # missing values: code -1
    table = np.array([esc(u) for u in uniq] + ["-"], dtype=object)
    return pd.Series(table[codes], index=s.index)


@dataclass
class Figure:
    key: str                 # element id suffix
    title: str
    spec: dict               # {"data": [...], "layout": {...}}
    notes: list[str] = field(default_factory=list)
    section: str = "plots"   # the report section that shows it (plots, network, nccl)


def _short(s: Any, n: int = 22) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= n else s[: n - 1] + "…"


def _rank_positions(ranks: list[int]) -> dict[int, int]:
    return {r: i for i, r in enumerate(sorted(ranks))}


def _thin(df: pd.DataFrame, limit: int, keep: pd.Series | None = None) -> pd.DataFrame:
    """At most ``limit`` rows: every row of ``keep`` (capped) plus an even stride of the rest."""
    if len(df) <= limit:
        return df
    keep = keep if keep is not None else pd.Series(False, index=df.index)
    must = df[keep].head(limit // 2)
    rest = df[~df.index.isin(must.index)]
    step = max(1, int(np.ceil(len(rest) / max(1, limit - len(must)))))
    return pd.concat([must, rest.iloc[::step]]).sort_index()


def _state_finding(analysis):
    """The top finding judged from the state at capture (a hang the tracer did not see begin)."""
    return next((f for f in analysis.findings if f.details.get("state_at_capture")), None)


def _blamed_ranks(analysis) -> set[int]:
    """Ranks an error or warning names (the ones the reader is sent to look at)."""
    return {int(r) for f in analysis.findings if f.severity in ("error", "warning") for r in f.ranks}


def timeline(analysis, slow_ms: float, ranks: pd.DataFrame | None = None) -> Figure | None:
    """One lane per rank (collectives, TCP markers, the hang point); above ``MAX_LANES`` ranks
    only the outliers' lanes (:func:`data.outlier_ranks`). ``ranks``: :func:`data.rank_table`
    when the caller has it already."""
    iv = data.intervals(analysis)
    tcp = analysis.model.tables["tcp_events"]
    tcp = tcp.dropna(subset=["rank", "timestamp_ns"]) if len(tcp) else tcp
    state_f = _state_finding(analysis)
    windows = analysis.model.tables.get("capture_windows")
    if iv.empty and tcp.empty and state_f is None:
        return None
    rank_hosts = rank_hosts_of(analysis.model)
    span = data.time_span(analysis)
    t0 = span.start_ns
    state_ranks = {int(r) for r in (state_f.details.get("ranks") or {})} if state_f is not None else set()
    every = sorted(set(iv["rank"].astype(int)) | set(tcp["rank"].astype(int) if len(tcp) else []) | state_ranks)
    # the capture node of each rank (its intervals' host first), and the lane names
    hosts = {**{r: n for r, (_, n) in rank_hosts.items() if n},
             **(iv.groupby("rank")["host"].first().to_dict() if len(iv) else {})}
    lane_names = _lane_names(hosts, {r: h for r, (h, _) in rank_hosts.items() if h})
    notes: list[str] = []
    lanes = _lanes(analysis, every, ranks, notes)
    ranks = lanes.ranks
    if lanes.outliers:
        keep = set(ranks)
        iv = iv[iv["rank"].astype(int).isin(keep)]
        tcp = tcp[tcp["rank"].astype(int).isin(keep)] if len(tcp) else tcp
    pos = _rank_positions(ranks)
    traces: list[dict] = _window_traces(windows, hosts, ranks, pos, t0)
    if state_f is not None:
        traces += _state_traces(state_f, pos, t0)
    if len(iv):
        traces += _interval_traces(iv, pos, t0, slow_ms, notes)
    if len(tcp):
        traces += _tcp_traces(analysis, tcp, pos, t0, notes)
    if state_f is not None and state_f.details.get("window_ns"):
        since = (f"Hung since {data.utc(state_f.since_ns)[11:19]} UTC, before the capture"
                 if state_f.since_ns is not None else "Hung since before the capture")
        notes.append(f"{since}: the bars are each rank's state at capture (its position in the collective sequence "
                     "and where its main thread is), not calls seen starting"
                     + ("." if state_f.since_ns is not None else "; the onset is not in this capture."))
    shapes, annotations = _stop_marks(analysis, t0)
    height = max(260, (48 if lanes.outliers else 70) * len(ranks) + 140)
    layout = {
        "height": height, "margin": {"l": 150, "r": 20, "t": 40, "b": 50}, "hovermode": "closest",
        # the whole capture, so the reader sees when activity stopped
        "xaxis": {"title": {"text": f"seconds since {data.utc(t0)}"}, "zeroline": False,
                  "range": [0, round((span.end_ns - t0) / 1e9 * 1.005, 3)] if span.end_ns else None},
        "yaxis": {"tickvals": list(range(len(ranks))),
                  "ticktext": [esc(f"rank {r} · {lane_names.get(r, '')}".rstrip(" ·")) for r in ranks],
                  "autorange": "reversed", "zeroline": False, "fixedrange": True},
        # below the axis title: a fixed distance when the plot is tall (a share of it otherwise)
        "legend": {"orientation": "h", "y": round(-80 / (height - 90), 3) if lanes.outliers else -0.25},
        "shapes": shapes, "annotations": annotations,
    }
    return Figure("timeline", lanes.title, {"data": traces, "layout": layout}, notes)


def _lane_names(hosts: dict[int, str], own: dict[int, str]) -> dict[int, str]:
    """Each rank's lane name: its own host (``own``: the name its process uses), and the
    capture's node (``hosts``) where that differs; the node alone where the own host is unknown."""
    return {r: _short(own.get(r) or hosts.get(r, ""), 14) + (f" @ {_short(hosts[r], 12)}" if own.get(r) and
                                                             hosts.get(r) and hosts[r] != own[r] else "")
            for r in set(hosts) | set(own)}


@dataclass
class _Lanes:
    """The ranks the timeline draws a lane for, its title, and whether they are only the
    outliers (more than ``MAX_LANES`` ranks)."""

    ranks: list[int]
    title: str
    outliers: bool


def _lanes(analysis, every: list[int], rank_stats: pd.DataFrame | None, notes: list[str]) -> _Lanes:
    """Every rank's lane up to ``MAX_LANES``; beyond, the blamed ranks' and the latest ones'
    (:func:`data.outlier_ranks` of ``rank_stats``, made here when None), said in ``notes``."""
    if len(every) <= MAX_LANES:
        return _Lanes(every, "Timeline", False)
    table = rank_stats if rank_stats is not None else data.rank_table(analysis)
    named, latest = data.outlier_ranks(table, every, _blamed_ranks(analysis), LATEST_LANES, MAX_BLAMED_LANES)
    ranks = sorted(set(named) | set(latest))
    hidden = len(every) - len(ranks)
    notes.append(f"{len(every)} ranks: lanes for {len(ranks)} of them, "
                 + (f"the {len(named)} an error or warning blames and " if named else "")
                 + f"the {len(latest)} latest by lateness (p99, then the most trouble); "
                 f"{hidden} ranks are not drawn. The lateness heatmap below shows every rank, the per-rank "
                 "table their numbers.")
    return _Lanes(ranks, f"Timeline: {len(ranks)} of {len(every)} ranks", True)


def _interval_traces(iv: pd.DataFrame, pos: dict[int, int], t0: int, slow_ms: float, notes: list[str]) -> list[dict]:
    """The collective calls of the drawn lanes: a bar per call, one trace per (op, duration
    source, completed or not, communicator), and invisible markers that carry the hover text;
    thinned to ``MAX_INTERVALS`` (every slow or unfinished call kept), said in ``notes``."""
    traces: list[dict] = []
    dur_ms = (iv["end"] - iv["start"]) / 1e6
    total = len(iv)
    iv = _thin(iv.assign(dur_ms=dur_ms), MAX_INTERVALS,
               keep=iv["open"] | (dur_ms >= slow_ms)).copy()
    if len(iv) < total:
        notes.append(f"{total} collective calls; {len(iv)} drawn (every slow or unfinished one, "
                     "an even sample of the rest); the tables hold all of them.")
    iv["y"] = iv["rank"].astype(int).map(pos) + np.minimum(iv["lane"], 3) * 0.2 - 0.3
    iv["x0"] = ((iv["start"] - t0) / 1e9).round(6)
    iv["x1"] = ((iv["end"] - t0) / 1e9).round(6)
    iv["src"] = iv["duration_source"].fillna("call").astype(str)
    iv["opname"] = iv["op"].fillna("?").astype(str)
    iv["comm"] = iv["comm_id_hash"].fillna("?").astype(str)
    for (op, src, is_open, comm), g in iv.groupby(["opname", "src", "open", "comm"], sort=True):
        color = "#999999" if is_open else OP_COLORS.get(op, "#444444")
        name = f"{op} · {src}" + (" · not completed" if is_open else "")
        k = len(g)
        x = np.empty(3 * k, dtype=object)
        y = np.empty(3 * k, dtype=object)
        x[0::3], x[1::3], x[2::3] = g["x0"].to_numpy(), g["x1"].to_numpy(), None
        y[0::3], y[1::3], y[2::3] = g["y"].round(3).to_numpy(), g["y"].round(3).to_numpy(), None
        traces.append({"type": "scatter", "mode": "lines", "name": esc(name), "legendgroup": esc(name),
                       "x": x.tolist(), "y": y.tolist(), "hoverinfo": "skip",
                       "line": {"color": color, "width": 7, "dash": SOURCE_DASH.get(src, "solid")},
                       "opacity": 0.85})
        # per point only numbers; what is constant per trace goes in its template
        custom = np.column_stack([g["op_count"].fillna(-1).astype("int64").to_numpy(),
                                  g["dur_ms"].round(3).to_numpy(), g["bytes"].fillna(-1).astype("int64").to_numpy(),
                                  g["rank"].astype("int64").to_numpy()])
        state = "not completed by the end of the capture" if is_open else "completed"
        traces.append({"type": "scatter", "mode": "markers", "name": esc(name), "legendgroup": esc(name),
                       "showlegend": False, "x": ((g["x0"] + g["x1"]) / 2).round(6).tolist(),
                       "y": g["y"].round(3).tolist(), "marker": {"size": 9, "opacity": 0, "color": color},
                       "customdata": custom.tolist(),
                       "hovertemplate": (f"<b>{esc(op)}</b> #%{{customdata[0]}} on rank %{{customdata[3]}}"
                                         f"<br>%{{customdata[1]}} ms: {esc(data.DURATION_SOURCES.get(src, src))}"
                                         f"<br>%{{customdata[2]}} bytes, comm {esc(comm)}<br>{state}"
                                         "<extra></extra>")})
    return traces


def _tcp_traces(analysis, tcp: pd.DataFrame, pos: dict[int, int], t0: int, notes: list[str]) -> list[dict]:
    """The TCP events of the drawn lanes: one marker trace per class (:data:`MARKERS`), the
    rendezvous store's in grey; thinned to ``MAX_MARKERS`` (every reset kept), said in ``notes``."""
    traces: list[dict] = []
    cls = data.marker_labels(tcp)   # one marker per packet, in its class (forensics/tcp/classes.py)
    # the rendezvous store's connections (MASTER_PORT) are the launcher's, not NCCL's: their
    # start-up resets and retries are drawn in grey and named, never as NCCL trouble
    store = data.store_traffic(analysis.model, tcp)
    cls = cls.where(~store | cls.isna(), STORE_LABEL)
    tcp, cls = tcp[cls.notna().to_numpy()], cls[cls.notna()]
    total = len(tcp)
    tcp = _thin(tcp.assign(cls=cls), MAX_MARKERS, keep=cls.isin(["reset"]))
    if (cls == STORE_LABEL).any():
        notes.append("Grey markers: TCP events on the rendezvous store's connections (port "
                     + ", ".join(map(str, sorted(data.store_ports(analysis.model)))) + "): the launcher's "
                     "start-up handshakes and retries, not NCCL's traffic.")
    if len(tcp) < total:
        notes.append(f"{total} TCP events; {len(tcp)} drawn (every reset, an even sample of the rest).")
    for c, g in tcp.groupby("cls", sort=True):
        symbol, color = MARKERS[c]
        text = ("<b>" + esc_each(g["event"]) + "</b> (" + esc_each(g["source"]) + ")<br>"
                + esc_each(g["saddr"]) + ":" + int_text(g["sport"], "-") + " → "
                + esc_each(g["daddr"]) + ":" + int_text(g["dport"], "-")
                + "<br>rank " + int_text(g["rank"], "?") + " → "
                + int_text(g["peer_rank"], "?") + " · "
                + esc_each(g["coll_op"]) + " #"
                + int_text(g["coll_op_count"], "-")
                + np.where(g["coll_in_flight"].fillna(False).astype(bool), " in flight", " done"))
        traces.append({"type": "scatter", "mode": "markers", "name": esc(c),
                       "x": ((g["timestamp_ns"].astype("int64") - t0) / 1e9).round(6).tolist(),
                       "y": (g["rank"].astype(int).map(pos) - 0.42).round(3).tolist(),
                       "marker": {"symbol": symbol, "color": color, "size": 8,
                                  "line": {"width": 1, "color": color}},
                       "hovertext": text.tolist(), "hoverinfo": "text"})
    return traces


def _stop_marks(analysis, t0: int) -> tuple[list[dict], list[dict]]:
    """(shapes, annotations): a dotted red line where each communicator stopped, named by the
    collective it stopped in and who never entered it or waits in it. Only under a hang
    verdict: staggered per-host captures leave collectives that no capture saw every rank
    complete, and those are no stop."""
    shapes, annotations = [], []
    hung = any(f.kind in data.HANG_KINDS and f.severity == "error" for f in analysis.findings)
    for p in data.progress_of(analysis) if hung else []:
        if p.stuck_at_ns is None or p.stuck_op_count is None or p.stuck_op_count < 0:
            continue
        x = round((p.stuck_at_ns - t0) / 1e9, 6)
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": "#d62728", "width": 2, "dash": "dot"}})
        who = []
        if p.missing_ranks:
            who.append("never entered: ranks " + data.rank_ranges(p.missing_ranks))
        if p.waiting_ranks:
            who.append("waiting: ranks " + data.rank_ranges(p.waiting_ranks))
        annotations.append({"x": x, "y": 1, "xref": "x", "yref": "paper", "yanchor": "bottom", "showarrow": False,
                            "font": {"color": "#d62728"},
                            "text": esc(f"stopped: {p.stuck_op} #{p.stuck_op_count}") + "",
                            "hovertext": esc("; ".join(who) or "not completed by every rank")})
    return shapes, annotations


def heatmap(analysis, ranks: pd.DataFrame | None = None) -> Figure | None:
    """Up to ``MAX_LANES`` ranks: duration (and lateness) by op count x rank for the busiest
    communicator. More: :func:`lateness_heatmap`, every rank by time. ``ranks``:
    :func:`data.rank_table` when the caller has it already."""
    n = analysis.model.tables["nccl_events"].dropna(subset=["comm_id_hash", "rank", "op_count"])
    if n.empty:
        return None
    every = (sorted(int(r) for r in ranks["rank"]) if ranks is not None and len(ranks)
             else sorted(set(data.with_global_rank(analysis.model, n)["rank"].astype(int))))
    if len(every) > MAX_LANES:
        fig = lateness_heatmap(analysis, every)
        if fig is not None:
            return fig
    comm = n["comm_id_hash"].value_counts().index[0]
    g = n[n["comm_id_hash"] == comm].assign(dur_ms=pd.to_numeric(n["duration_ns"], errors="coerce") / 1e6)
    notes = []
    ncomm = n["comm_id_hash"].nunique()
    if ncomm > 1:
        notes.append(f"communicator {comm} (the busiest of {ncomm}).")
    ops = g["op_count"].astype("int64")
    width = int(ops.max() - ops.min() + 1)
    binsize = max(1, int(np.ceil(width / MAX_HEATMAP_COLUMNS)))
    if binsize > 1:
        notes.append(f"op counts binned by {binsize} (the worst value of each bin).")
    g = g.assign(col=(ops // binsize) * binsize, rank=g["rank"].astype(int))
    dur = g.pivot_table(index="rank", columns="col", values="dur_ms", aggfunc="max")
    late = data.lateness_long(analysis.model)
    traces = [_heat(dur, "duration ms", visible=True)]
    buttons = [{"label": "duration", "method": "update", "args": [{"visible": [True, False]}]}]
    if late is not None and len(late):
        late = late[late["comm_id_hash"] == comm]
        late = late.assign(col=(late["op_count"].astype("int64") // binsize) * binsize)
        lt = late.pivot_table(index="rank", columns="col", values="lateness_ms", aggfunc="max")
        traces.append(_heat(lt, "lateness ms", visible=False))
        buttons.append({"label": "lateness", "method": "update", "args": [{"visible": [False, True]}]})
    layout = {"height": max(220, 40 * dur.shape[0] + 140), "margin": {"l": 70, "r": 20, "t": 40, "b": 50},
              "xaxis": {"title": {"text": "op count"}}, "yaxis": {"title": {"text": "rank"}, "autorange": "reversed",
                                                                   "type": "category"},
              "updatemenus": [{"type": "buttons", "direction": "right", "x": 0, "y": 1.18, "xanchor": "left",
                               "buttons": buttons}] if len(buttons) > 1 else []}
    return Figure("heatmap", "Collective duration by op count and rank", {"data": traces, "layout": layout}, notes)


LATENESS_VIEWS = (("entered_late_ms", "entered late", "entered %{z} ms after the first rank"),
                  ("finished_late_ms", "finished late", "finished %{z} ms after the first rank"),
                  ("duration_ms", "duration", "took %{z} ms"))


def lateness_heatmap(analysis, ranks: list[int]) -> Figure | None:
    """Every rank (y) by time (x, the timeline's axis, binned to at most
    ``MAX_HEATMAP_COLUMNS`` columns and ``MAX_HEATMAP_CELLS`` cells): how late it entered and
    finished the collectives that began in each bin after their first rank did, and their
    duration; the worst value of each cell. Across communicators (global ranks)."""
    cr = data.collective_ranks(analysis.model)
    span = data.time_span(analysis)
    if cr is None or cr.empty or span.start_ns is None or span.end_ns is None:
        return None
    t0 = span.start_ns
    ranks = sorted(set(ranks) | set(cr["rank"].astype(int)))
    ncols = min(MAX_HEATMAP_COLUMNS, max(20, MAX_HEATMAP_CELLS // len(ranks)))
    width_ns = max(1, span.end_ns - t0)
    bin_ns = _nice_ns(width_ns / ncols)
    ncols = int(min(ncols, np.ceil(width_ns / bin_ns) + 1))
    col = ((cr["first_entry_ns"] - t0) // bin_ns).clip(0, ncols - 1).astype("int64")
    cr = cr.assign(col=col.to_numpy())
    per_rank = max(2, min(40, 1100 // len(ranks)))
    traces = []
    for i, (c, label, what) in enumerate(LATENESS_VIEWS):
        p = cr.pivot_table(index="rank", columns="col", values=c, aggfunc="max")
        z = p.reindex(index=ranks, columns=range(ncols)).to_numpy(dtype="float64")
        traces.append({"type": "heatmap", "x0": round(bin_ns / 2e9, 6), "dx": round(bin_ns / 1e9, 6),
                       "y": [f"rank {r}" for r in ranks], "z": _cells(z), "colorscale": "YlOrRd",
                       "reversescale": True, "zmin": 0, "zmax": heat_max(z), "visible": i == 0, "name": label,
                       "colorbar": {"title": {"text": f"{label} (ms)"}},
                       "hovertemplate": f"%{{y}}, collectives begun at %{{x:.2f}} s: {what}<extra></extra>"})
    # what a heatmap cell cannot hold: a rank that never entered a collective its peers entered,
    # or never completed one it entered, by the end of the capture (the hang), marked on the cell;
    # (name, hover, rows, symbol, the views that show it)
    missing = data.never_entered(analysis.model)
    marks = [("never entered (by the end of the capture)", "never entered a collective begun at", missing, "x", {0}),
             ("entered, not completed", "entered, never completed a collective begun at", cr[cr["end_ns"].isna()],
              "x-thin-open", {1, 2})]
    mark_traces, mark_views = [], []
    for name, what, rows, symbol, views in marks:
        if rows is None or rows.empty:
            continue
        cells = pd.DataFrame({"rank": rows["rank"].astype("int64").to_numpy(),
                              "col": ((rows["first_entry_ns"].to_numpy(dtype="float64") - t0) // bin_ns)
                              .clip(0, ncols - 1).astype("int64")}).drop_duplicates()
        cells = cells[cells["rank"].isin(ranks)]        # a row of the heatmap (no new category)
        if cells.empty:
            continue
        mark_traces.append({"type": "scatter", "mode": "markers", "name": name, "visible": 0 in views,
                            "x": ((cells["col"] + 0.5) * bin_ns / 1e9).round(6).tolist(),
                            "y": ("rank " + cells["rank"].astype(str)).tolist(),
                            "marker": {"symbol": symbol, "color": "#101828", "size": max(4, min(10, per_rank + 2)),
                                       "line": {"width": 1, "color": "#101828"}},
                            "hovertemplate": f"%{{y}} {what} %{{x:.2f}} s<extra></extra>"})
        mark_views.append(views)
    traces += mark_traces
    buttons = [{"label": label, "method": "update",
                "args": [{"visible": [j == i for j in range(len(LATENESS_VIEWS))] + [i in v for v in mark_views]}]}
               for i, (_, label, _) in enumerate(LATENESS_VIEWS)]
    layout = {"height": 170 + per_rank * len(ranks), "margin": {"l": 80, "r": 20, "t": 50, "b": 50},
              "xaxis": {"title": {"text": f"seconds since {data.utc(t0)}"}, "zeroline": False,
                        "range": [0, round(width_ns / 1e9 * 1.005, 3)]},
              # the heatmap's rows exactly (the marks' padding would shift them), rank 0 on top
              "yaxis": {"type": "category", "range": [len(ranks) - 0.5, -0.5],
                        "title": {"text": f"{len(ranks)} ranks"}},
              "showlegend": bool(mark_traces),
              "legend": {"orientation": "h", "x": 0.3, "xanchor": "left", "y": 1.0, "yanchor": "bottom"},
              "updatemenus": [{"type": "buttons", "direction": "right", "x": 0, "y": 1.0, "yanchor": "bottom",
                               "xanchor": "left", "pad": {"b": 6}, "buttons": buttons}]}
    ncoll = cr[["comm_id_hash", "op_count"]].drop_duplicates().shape[0]
    notes = [f"Every rank, by time (the timeline's axis): {ncoll} collectives in columns of {_dur(bin_ns)} by when "
             "their first rank entered them; each cell holds the worst value of its rank in that column (blank: "
             "no collective of that rank began then). Entered / finished late: how long after the first rank of "
             "the same collective; duration: entry to completion."]
    if mark_traces:
        notes.append("× on a cell: the rank never entered a collective its peers entered in that column; "
                     "thin ×: it entered one and never completed it, by the end of the capture.")
    return Figure("heatmap", "Lateness by rank and time", {"data": traces, "layout": layout}, notes)


def _nice_ns(ns: float) -> int:
    """The smallest of 1, 2, 5 x 10^k ns at least ``ns`` (a bin width that reads well)."""
    ns = max(1.0, float(ns))
    k = 10 ** np.floor(np.log10(ns))
    return int(next(m * k for m in (1, 2, 5, 10) if m * k >= ns))


def _dur(ns: float) -> str:
    return f"{ns / 1e9:g} s" if ns >= 1e9 else f"{ns / 1e6:g} ms" if ns >= 1e6 else f"{ns / 1e3:g} µs"


def _cells(z: np.ndarray) -> list:
    """A heatmap's z for JSON: 3 significant digits (10 µs at least), NaN as null."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mag = np.floor(np.log10(np.abs(z)))
    d = np.clip(np.where(np.isfinite(mag), 2 - mag, 2), 0, 2)
    z = np.round(z * 10 ** d) / 10 ** d
    return np.where(np.isnan(z), None, z).tolist()


HEAT_SCALE = 10.0    # a heatmap's colours saturate at this many times the median cell ...
HEAT_FLOOR_MS = 50.0  # ... and never below this: a clean job's few-ms spread stays pale


def heat_max(z: np.ndarray, floor_ms: float = HEAT_FLOOR_MS) -> float:
    """The value a heatmap's scale ends at: fixed relative to the median cell (HEAT_SCALE x),
    not fitted to the run's own maximum, so a clean job is never painted dark red."""
    finite = z[np.isfinite(z)]
    med = float(np.median(finite)) if len(finite) else 0.0
    return round(max(HEAT_SCALE * med, floor_ms), 3)


def _heat(p: pd.DataFrame, label: str, visible: bool) -> dict:
    z = p.to_numpy(dtype="float64").round(3)
    return {"type": "heatmap", "x": [int(c) for c in p.columns], "y": [f"rank {int(r)}" for r in p.index],
            "z": [[None if np.isnan(v) else float(v) for v in row] for row in z], "colorscale": "YlOrRd",
            "zmin": 0, "zmax": heat_max(z),
            "colorbar": {"title": {"text": label}}, "reversescale": True, "visible": visible, "name": label,
            "hovertemplate": "rank %{y}, op %{x}: %{z} ms<extra>" + label + "</extra>"}


LINK_VIEWS = (("retransmissions", "retransmissions", "sum", "%{z} retransmissions"),
              ("rtt_p99_ms", "ACK RTT p99 ms", "max", "ACK round-trip p99 %{z} ms"))


def link_matrix(analysis, min_flows: int = data.TOP_ROWS) -> Figure | None:
    """Rank x peer rank: retransmissions on the TCP flows between them and the worst ACK
    round-trip p99 of their data (``flow_timing``); only when there are more than
    ``min_flows`` flows (the flow table then shows only the most troubled ones). Beyond
    ``MAX_LINK_AXIS`` ranks per axis, consecutive ranks share a row / column (sum of
    retransmissions, worst RTT). Blank: no flow seen between them."""
    model = analysis.model
    if len(model.tables["flows"]) <= min_flows:
        return None
    links = data.link_matrix(model)
    if links is None or links.empty:
        return None
    ranks = np.union1d(links["rank"].to_numpy(), links["peer_rank"].to_numpy()).astype("int64")
    lo, hi = int(ranks.min()), int(ranks.max())
    group = max(1, int(np.ceil((hi - lo + 1) / MAX_LINK_AXIS)))
    if group == 1:
        axis = ranks                             # the ranks that have flows, each its own row
        labels = [f"rank {r}" for r in axis]
        idx = {int(r): i for i, r in enumerate(axis)}
        links = links.assign(y=links["rank"].map(idx), x=links["peer_rank"].map(idx))
    else:
        nb = (hi - lo) // group + 1
        labels = [f"ranks {lo + i * group}-{min(hi, lo + (i + 1) * group - 1)}" for i in range(nb)]
        links = links.assign(y=(links["rank"] - lo) // group, x=(links["peer_rank"] - lo) // group)
    size = len(labels)
    traces, buttons = [], []
    views = [v for v in LINK_VIEWS if links[v[0]].notna().any()]
    for i, (c, label, how, what) in enumerate(views):
        p = links.dropna(subset=[c]).groupby(["y", "x"])[c].agg(how)
        z = np.full((size, size), np.nan)
        z[p.index.get_level_values(0).to_numpy(), p.index.get_level_values(1).to_numpy()] = p.to_numpy()
        traces.append({"type": "heatmap", "x": labels, "y": labels, "z": _cells(z), "colorscale": "YlOrRd",
                       "reversescale": True, "zmin": 0, "visible": i == 0, "name": label,
                       "colorbar": {"title": {"text": label}},
                       "hovertemplate": f"%{{y}} → %{{x}}: {what}<extra></extra>"})
        buttons.append({"label": label, "method": "update", "args": [{"visible": [j == i for j in range(len(views))]}]})
    if not traces:
        return None
    px = max(3, min(24, 900 // size))
    layout = {"height": 190 + px * size, "margin": {"l": 130, "r": 20, "t": 50, "b": 120},
              "xaxis": {"type": "category", "title": {"text": "peer rank (responder / receiver)"}},
              "yaxis": {"type": "category", "autorange": "reversed", "title": {"text": "rank (originator / sender)"}},
              "updatemenus": [{"type": "buttons", "direction": "right", "x": 0, "y": 1.0, "yanchor": "bottom",
                               "xanchor": "left", "pad": {"b": 6}, "buttons": buttons}] if len(buttons) > 1 else []}
    nflows = len(model.tables["flows"])
    notes = [f"{nflows} TCP flows between {len(ranks)} ranks, as a matrix: retransmissions per link (the flows "
             "table; rank: the connection's originator) and the worst ACK round-trip p99 of the data a rank sent "
             "(flow_timing; rank: the sender). Blank: no flow seen between the two."]
    if group > 1:
        notes.append(f"{group} consecutive ranks per row and column (the sum of their retransmissions, the worst "
                     "round-trip).")
    unknown = int(model.tables["flows"][["rank", "peer_rank"]].isna().any(axis=1).sum())
    if unknown:
        notes.append(f"{unknown} flows with an endpoint of no known rank are not in the matrix (they are in the "
                     "flows table and stallscope query).")
    return Figure("links", "TCP links between ranks", {"data": traces, "layout": layout}, notes, section="network")


def nccl_tests_chart(model, findings) -> Figure | None:
    t = data.optional_table(model, "nccl_tests")
    if t is None or not {"size_bytes", "busbw_gbps"} <= set(t.columns):
        return None
    keys = [c for c in ("host", "test", "placement") if c in t.columns]
    traces = []
    for k, g in (t.groupby(keys, dropna=False, sort=True) if keys else [((), t)]):
        k = k if isinstance(k, tuple) else (k,)
        g = g.sort_values("size_bytes")
        traces.append({"type": "scatter", "mode": "lines+markers", "name": esc(" · ".join(map(str, k)) or "busbw"),
                       "x": pd.to_numeric(g["size_bytes"], errors="coerce").tolist(),
                       "y": pd.to_numeric(g["busbw_gbps"], errors="coerce").round(3).tolist()})
    shapes = []
    for f in findings:
        exp = f.details.get("expected_busbw_gbps") if isinstance(f.details, dict) else None
        if isinstance(exp, (int, float)):
            shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": exp, "y1": exp,
                           "line": {"color": "#d62728", "dash": "dash"}})
            traces.append({"type": "scatter", "mode": "lines", "name": "expected", "x": [None], "y": [None],
                           "line": {"color": "#d62728", "dash": "dash"}})
            break
    layout = {"height": 360, "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
              "xaxis": {"type": "log", "title": {"text": "message size (bytes)"}},
              "yaxis": {"title": {"text": "bus bandwidth (GB/s)"}, "rangemode": "tozero"}, "shapes": shapes}
    return Figure("nccltests", "nccl-tests bus bandwidth", {"data": traces, "layout": layout}, section="nccl")


def _window_traces(windows, hosts: dict[int, str], ranks: list[int], pos: dict[int, int], t0: int) -> list[dict]:
    """Each host's capture window, a thin grey band under its ranks' lanes: per-host captures
    start and stop apart, and nothing outside a host's window is known there."""
    if windows is None or windows.empty or t0 is None:
        return []
    spans = host_windows(windows)
    if len({spans.get(hosts.get(r)) for r in ranks}) <= 1 and len(spans) <= 1:
        return []   # one capture watched everything: nothing to tell apart
    x, y, text = [], [], []
    for r in ranks:
        h = hosts.get(r)
        if h not in spans:
            continue
        a, b = spans[h]
        yy = round(pos[r] + 0.42, 3)
        x += [round((a - t0) / 1e9, 6), round((b - t0) / 1e9, 6), None]
        y += [yy, yy, None]
        text += [esc(f"{h}: watched {data.utc(a)} - {data.utc(b)}")] * 2 + [None]
    if not x:
        return []
    return [{"type": "scatter", "mode": "lines", "name": "capture window (per host)", "x": x, "y": y,
             "line": {"color": "#bbbbbb", "width": 3}, "hovertext": text, "hoverinfo": "text"}]


def _state_traces(f, pos: dict[int, int], t0: int) -> list[dict]:
    """The state at capture of each rank of a hang judged from it: a bar over the window the
    hosts watched, red for the blamed ranks."""
    w = f.details.get("window_ns")
    if not w or t0 is None:
        return []
    x0, x1 = round((w[0] - t0) / 1e9, 6), round((w[1] - t0) / 1e9, 6)
    out = []
    for blamed, color, name in ((True, "#d62728", "state at capture: blamed"),
                                (False, "#7f7f7f", "state at capture: waiting")):
        x, y, text = [], [], []
        for r, st in sorted((f.details.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
            r = int(r)
            if (r in f.ranks) != blamed or r not in pos:
                continue
            parts = []
            if st.get("position") is not None:
                parts.append(f"last launched #{st['position']} ({st.get('position_source')})")
            if st.get("completed") is not None:
                parts.append(f"last completed #{st['completed']}")
            if st.get("where"):
                parts.append(("inside NCCL: " if st.get("in_nccl") else "in ") + st["where"])
            label = "; ".join(parts) or "no state captured"
            x += [x0, x1, None]
            y += [pos[r], pos[r], None]
            text += [esc(f"rank {r}: {label}")] * 2 + [None]
        if x:
            out.append({"type": "scatter", "mode": "lines", "name": name, "x": x, "y": y,
                        "line": {"color": color, "width": 12}, "opacity": 0.45, "hovertext": text,
                        "hoverinfo": "text"})
    return out
