"""The network: TCP events grouped by what they mean (the timeline's markers), the
links between ranks, the flows table, InfiniBand counters, and the rendezvous store's
traffic told apart from the collectives'.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ...tcp.classes import CLASS_LABEL, DATA_LOSS_CLASSES, EVENT_CLASS, classify, events_of
from .common import optional_table


# TCP events grouped by what they mean (forensics/tcp/classes.py, the findings' table too): the
# per-rank table counts lost data (retransmissions and lost segments, not spurious ones), one
# class per packet (classify: a spurious retransmission's 'retransmission' row is left out)
RETRANSMIT_EVENTS = events_of(*DATA_LOSS_CLASSES)
DUPACK_EVENTS = events_of("duplicate_ack")
RESET_EVENTS = events_of("reset")
MARKER_CLASSES = {e: CLASS_LABEL[c] for e, c in EVENT_CLASS.items()}


def marker_labels(t: pd.DataFrame) -> pd.Series:
    """Per tcp_events row: the label of its class (:func:`classify`), "other TCP" for an event
    of no class, None for a row another verdict of its packet overrides (not drawn twice)."""
    cls = classify(t)
    out = cls.map(CLASS_LABEL).astype(object)
    return out.where(cls.notna(), np.where(t["event"].isin(list(EVENT_CLASS)), None, "other TCP"))


def link_matrix(model) -> pd.DataFrame | None:
    """One row per (rank, peer rank) link with TCP flows: flows, retransmissions (the flows
    table: rank owns the originator, peer_rank the responder) and the worst ACK round-trip
    p99 of its data (``flow_timing``: rank sends, peer_rank ACKs), in ms."""
    f = model.tables["flows"]
    parts = []
    if len(f):
        f = f.dropna(subset=["rank", "peer_rank"])
        if len(f):
            parts.append(f.assign(rank=f["rank"].astype("int64"), peer_rank=f["peer_rank"].astype("int64"),
                                  retx=pd.to_numeric(f["retransmissions"], errors="coerce").fillna(0))
                         .groupby(["rank", "peer_rank"]).agg(flows=("retx", "size"), retransmissions=("retx", "sum")))
    ft = optional_table(model, "flow_timing")
    if ft is not None and {"rank", "peer_rank", "rtt_p99_ns"} <= set(ft.columns):
        ft = ft.dropna(subset=["rank", "peer_rank"])
        if len(ft):
            parts.append(ft.assign(rank=ft["rank"].astype("int64"), peer_rank=ft["peer_rank"].astype("int64"),
                                   rtt=pd.to_numeric(ft["rtt_p99_ns"], errors="coerce") / 1e6)
                         .groupby(["rank", "peer_rank"]).agg(rtt_p99_ms=("rtt", "max")))
    if not parts:
        return None
    out = pd.concat(parts, axis=1).reset_index()
    for c in ("flows", "retransmissions", "rtt_p99_ms"):
        if c not in out:
            out[c] = np.nan
    return out


FLOW_COLUMNS = ["host", "rank", "peer_rank", "orig_addr", "orig_port", "resp_addr", "resp_port", "packets", "bytes",
                "retransmissions", "duplicate_acks", "lost_segments", "rsts", "zero_windows", "rtt_ms", "history"]
FLOW_SUMS = ["packets", "bytes", "retransmissions", "duplicate_acks", "lost_segments", "rsts", "zero_windows"]


def flow_table(model, limit: int = 200) -> tuple[pd.DataFrame, int, dict[str, Any]]:
    """Flows, the troubled ones first (when there are more than ``limit``: the most
    retransmissions first); (rows shown, total flows, the totals row: sums over every flow)."""
    f = model.tables["flows"]
    if f.empty:
        return f, 0, {}
    trouble = f[["retransmissions", "duplicate_acks", "rsts", "lost_segments", "zero_windows"]].fillna(0).sum(axis=1)
    f = f.assign(_trouble=trouble, bytes=f["bytes_orig"].fillna(0) + f["bytes_resp"].fillna(0),
                 packets=f["packets_orig"].fillna(0) + f["packets_resp"].fillna(0),
                 rtt_ms=pd.to_numeric(f["rtt_mean_ns"], errors="coerce") / 1e6)
    order = ["_trouble", "bytes"] if len(f) <= limit else ["retransmissions", "_trouble", "bytes"]
    f = f.sort_values(order, ascending=False, kind="stable")
    totals = {c: f[c].fillna(0).sum() for c in FLOW_SUMS}
    totals["host"] = f"all {len(f)}"
    return f[FLOW_COLUMNS].head(limit), len(f), totals


def ib_table(model) -> pd.DataFrame | None:
    ib = optional_table(model, "ib_counters")
    if ib is None:
        return None
    ib = ib.sort_values(["problem", "delta"], ascending=[False, False], kind="stable")
    return ib[["host", "device", "port", "counter", "start", "end", "delta", "problem", "meaning", "action"]]


DEFAULT_STORE_PORT = 29500     # torch.distributed's default MASTER_PORT (TCPStore)


def store_ports(model) -> set[int]:
    """The rendezvous store's ports: every rank process's MASTER_PORT, else torch's default
    when the processes known hold ranks but name no port."""
    ports, ranked = set(), False
    for c in model.captures:
        for p in c.get("processes", []) or []:
            ranked |= p.get("rank") is not None
            if p.get("master_port"):
                try:
                    ports.add(int(p["master_port"]))
                except (TypeError, ValueError):
                    pass
    return ports or ({DEFAULT_STORE_PORT} if ranked else set())


def store_traffic(model, tcp: pd.DataFrame) -> pd.Series:
    """Which of ``tcp``'s events (tcp_events rows) are on a rendezvous store connection."""
    ports = store_ports(model)
    if not ports or tcp.empty:
        return pd.Series(False, index=tcp.index)
    sport = pd.to_numeric(tcp["sport"], errors="coerce")
    dport = pd.to_numeric(tcp["dport"], errors="coerce")
    return (sport.isin(ports) | dport.isin(ports)).fillna(False)
