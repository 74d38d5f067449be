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

from . import data

MAX_INTERVALS = 5000        # collective intervals drawn on the timeline
MAX_MARKERS = 2500          # TCP markers drawn on the timeline
MAX_HEATMAP_COLUMNS = 600   # op counts per heatmap row (binned beyond)

OP_COLORS = {"ALL_REDUCE": "#1f77b4", "ALL_GATHER": "#2ca02c", "REDUCE_SCATTER": "#9467bd", "BROADCAST": "#8c564b",
             "REDUCE": "#17becf", "SEND": "#bcbd22", "RECV": "#e377c2"}
SOURCE_DASH = {"gpu": "solid", "host_sync": "dash", "call": "dot"}
MARKERS = {"retransmission": ("triangle-up", "#d62728"), "lost segment": ("triangle-down", "#d62728"),
           "duplicate ACK": ("circle", "#ff7f0e"), "out-of-order segment": ("circle-open", "#ff7f0e"),
           "spurious retransmission": ("triangle-up-open", "#7f7f7f"), "ACKed unseen segment": ("square-open", "#7f7f7f"),
           "keep-alive or window update": ("diamond-open", "#7f7f7f"), "zero window": ("square", "#9467bd"),
           "reset": ("x", "#111111"), "other TCP": ("diamond", "#7f7f7f")}


def esc(v: Any) -> str:
    """Bundle text for plotly labels and hover text: HTML-escaped, missing values as '-'."""
    try:
        missing = v is None or bool(pd.isna(v))
    except (TypeError, ValueError):     # list-likes
        missing = False
    # quotes stay: plotly decodes &lt; &gt; &amp; only, and without a raw '<' no tag can form
    return html.escape("-" if missing else str(v), quote=False)


@dataclass
class Figure:
    key: str                 # element id suffix
    title: str
    spec: dict               # {"data": [...], "layout": {...}}
    notes: list[str] = field(default_factory=list)


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


def _rank_hosts(analysis) -> dict[int, str]:
    """Global rank -> host, from the manifests' processes (what a late capture still knows)."""
    out: dict[int, str] = {}
    for c in analysis.model.captures:
        for p in c.get("processes", []) or []:
            if p.get("rank") is not None and c.get("host"):
                out.setdefault(int(p["rank"]), str(c["host"]))
    return out


def _state_finding(analysis):
    """The top finding judged from the state at capture (a hang the tracer did not see begin)."""
    return next((f for f in analysis.findings if f.details.get("state_at_capture")), None)


def timeline(analysis, slow_ms: float) -> Figure | None:
    iv = data.intervals(analysis)
    tcp = analysis.model.tables["tcp_events"]
    tcp = tcp.dropna(subset=["rank", "timestamp_ns"]) if len(tcp) else tcp
    state_f = _state_finding(analysis)
    windows = analysis.model.tables.get("capture_windows")
    host_of = _rank_hosts(analysis)
    if iv.empty and tcp.empty and state_f is None:
        return None
    span = data.time_span(analysis)
    t0 = span.start_ns
    state_ranks = {int(r) for r in (state_f.details.get("ranks") or {})} if state_f is not None else set()
    ranks = sorted(set(iv["rank"].astype(int)) | set(tcp["rank"].astype(int) if len(tcp) else []) | state_ranks)
    pos = _rank_positions(ranks)
    hosts = {**host_of, **(iv.groupby("rank")["host"].first().to_dict() if len(iv) else {})}
    notes: list[str] = []
    traces: list[dict] = _window_traces(windows, hosts, ranks, pos, t0)
    if state_f is not None:
        traces += _state_traces(state_f, pos, t0)

    if len(iv):
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

    if len(tcp):
        cls = data.marker_labels(tcp)   # one marker per packet, in its class (forensics/tcp/classes.py)
        tcp, cls = tcp[cls.notna().to_numpy()], cls[cls.notna()]
        total = len(tcp)
        tcp = _thin(tcp.assign(cls=cls), MAX_MARKERS, keep=cls.isin(["reset"]))
        if len(tcp) < total:
            notes.append(f"{total} TCP events; {len(tcp)} drawn (every reset, an even sample of the rest).")
        for c, g in tcp.groupby("cls", sort=True):
            symbol, color = MARKERS[c]
            text = ("<b>" + g["event"].map(esc) + "</b> (" + g["source"].map(esc) + ")<br>"
                    + g["saddr"].map(esc) + ":" + g["sport"].astype("Int64").astype(str) + " → "
                    + g["daddr"].map(esc) + ":" + g["dport"].astype("Int64").astype(str)
                    + "<br>rank " + g["rank"].astype("Int64").astype(str) + " → "
                    + g["peer_rank"].astype("Int64").astype(str).replace("<NA>", "?") + " · "
                    + g["coll_op"].map(esc) + " #"
                    + g["coll_op_count"].astype("Int64").astype(str).replace("<NA>", "-")
                    + np.where(g["coll_in_flight"].fillna(False).astype(bool), " in flight", " done"))
            traces.append({"type": "scatter", "mode": "markers", "name": esc(c),
                           "x": ((g["timestamp_ns"].astype("int64") - t0) / 1e9).round(6).tolist(),
                           "y": (g["rank"].astype(int).map(pos) - 0.42).round(3).tolist(),
                           "marker": {"symbol": symbol, "color": color, "size": 8,
                                      "line": {"width": 1, "color": color}},
                           "hovertext": text.tolist(), "hoverinfo": "text"})

    shapes, annotations = [], []
    if state_f is not None and state_f.details.get("window_ns"):
        notes.append("Hung since before the capture: the bars are each rank's state at capture (its position in "
                     "the collective sequence and where its main thread is), not calls seen starting; the onset "
                     "is not in this capture.")
    for p in data.progress(analysis.model):
        if p.stuck_at_ns is None:
            continue
        x = round((p.stuck_at_ns - t0) / 1e9, 6)
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": "#d62728", "width": 2, "dash": "dot"}})
        who = []
        if p.missing_ranks:
            who.append("never entered: ranks " + ", ".join(map(str, p.missing_ranks)))
        if p.waiting_ranks:
            who.append("waiting: ranks " + ", ".join(map(str, p.waiting_ranks)))
        annotations.append({"x": x, "y": 1, "xref": "x", "yref": "paper", "yanchor": "bottom", "showarrow": False,
                            "font": {"color": "#d62728"},
                            "text": esc(f"stopped: {p.stuck_op} #{p.stuck_op_count}") + "",
                            "hovertext": esc("; ".join(who) or "not completed by every rank")})
    height = max(260, 70 * len(ranks) + 140)
    layout = {
        "height": height, "margin": {"l": 150, "r": 20, "t": 40, "b": 50}, "hovermode": "closest",
        # the whole capture, so the reader sees when activity stopped
        "xaxis": {"title": {"text": f"seconds since {data.utc(t0)}"}, "zeroline": False,
                  "range": [0, round((span.end_ns - t0) / 1e9 * 1.005, 3)] if span.end_ns else None},
        "yaxis": {"tickvals": list(range(len(ranks))),
                  "ticktext": [esc(f"rank {r} · {_short(hosts.get(r, ''))}".rstrip(" ·")) for r in ranks],
                  "autorange": "reversed", "zeroline": False, "fixedrange": True},
        "legend": {"orientation": "h", "y": -0.25}, "shapes": shapes, "annotations": annotations,
    }
    return Figure("timeline", "Timeline", {"data": traces, "layout": layout}, notes)


def heatmap(analysis) -> Figure | None:
    """Duration (and lateness) by op count x rank for the busiest communicator."""
    n = analysis.model.tables["nccl_events"].dropna(subset=["comm_id_hash", "rank", "op_count"])
    if n.empty:
        return None
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
    late = data._lateness_long(analysis.model)
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


def _heat(p: pd.DataFrame, label: str, visible: bool) -> dict:
    z = p.to_numpy(dtype="float64").round(3)
    return {"type": "heatmap", "x": [int(c) for c in p.columns], "y": [f"rank {int(r)}" for r in p.index],
            "z": [[None if np.isnan(v) else float(v) for v in row] for row in z], "colorscale": "YlOrRd",
            "colorbar": {"title": {"text": label}}, "reversescale": True, "visible": visible, "name": label,
            "hovertemplate": "rank %{y}, op %{x}: %{z} ms<extra>" + label + "</extra>"}


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
    return Figure("nccltests", "nccl-tests bus bandwidth", {"data": traces, "layout": layout})


def _window_traces(windows, hosts: dict[int, str], ranks: list[int], pos: dict[int, int], t0: int) -> list[dict]:
    """Each host's capture window, a thin grey band under its ranks' lanes: per-host captures
    start and stop apart, and nothing outside a host's window is known there."""
    if windows is None or windows.empty or t0 is None:
        return []
    from ..model.windows import host_windows
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
