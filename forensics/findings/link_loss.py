"""How much a link loses, whatever it costs the job today (issue 36's severity floor).

Impact ranks findings (:func:`forensics.findings.base.impact_severity`); a link that resends
or loses a large share of its data segments is a fault to fix all the same. Per link between
two ranks, :func:`link_loss_rates` counts its retransmitted or lost data segments against its
data segments; :func:`lossy_floor` raises a finding about those links to a warning at least
and says the rate; :func:`lossy_endpoint` names the one rank every lossy link shares.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .base import Context
from ..tcp.classes import DATA_LOSS_CLASSES
from .trouble import dedup_counts, trouble_events

LOSSY_RATE = 0.005         # a link resending or losing this share of its data segments ...
LOSSY_MIN_SEGMENTS = 20    # ... and at least this many is a fault to fix, whatever it costs today


def link_loss_rates(ctx: Context) -> pd.DataFrame:
    """Per link between two ranks (a < b): its retransmitted or lost data segments (``lost``:
    per directed connection the larger of the two, each counted once over the captures that
    saw it), its data segments (``data``: flow_timing's, the capture that saw the most), the
    ``rate`` and whether it is ``lossy`` (LOSSY_RATE and LOSSY_MIN_SEGMENTS). A memo of the
    analysis: the blame, the severity floor and the headline all read it."""
    return ctx.memo("link_loss_rates", lambda: _link_loss_rates(ctx))


def _link_loss_rates(ctx: Context) -> pd.DataFrame:
    cols = ["a", "b", "lost", "data", "rate", "lossy"]
    ev = trouble_events(ctx, DATA_LOSS_CLASSES)
    ft = ctx.model.tables.get("flow_timing")
    if ev.empty or ft is None or ft.empty:
        return pd.DataFrame(columns=cols)
    c = dedup_counts(ev)
    per = c.pivot_table(index=["key", "a", "b"], columns="cls", values="n", aggfunc="sum", fill_value=0)
    lost = per.max(axis=1).groupby(level=["a", "b"]).sum()
    ft = ft.dropna(subset=["rank", "peer_rank"])
    r, p = ft["rank"].astype("int64"), ft["peer_rank"].astype("int64")
    data = (pd.DataFrame({"a": np.minimum(r, p), "b": np.maximum(r, p), "capture": ft["capture"],
                          "n": pd.to_numeric(ft["data_packets"], errors="coerce").fillna(0)})
            .groupby(["a", "b", "capture"])["n"].sum().groupby(level=["a", "b"]).max())
    out = pd.DataFrame({"lost": lost}).join(pd.DataFrame({"data": data}), how="inner").reset_index()
    if out.empty:
        return pd.DataFrame(columns=cols)
    out["rate"] = out["lost"] / out["data"].where(out["data"] > 0)
    out["lossy"] = (out["lost"] >= LOSSY_MIN_SEGMENTS) & (out["rate"] >= LOSSY_RATE)
    return out[cols]


def lossy_endpoint(ctx: Context) -> int | None:
    """The one rank every lossy link (:func:`link_loss_rates`) touches, when two or more are
    lossy and they share exactly one: that host's NIC, cable or port, not "A or B"."""
    rates = link_loss_rates(ctx)
    lossy = rates[rates["lossy"]] if len(rates) else rates
    if len(lossy) < 2:
        return None
    common = set.intersection(*({int(a), int(b)} for a, b in zip(lossy["a"], lossy["b"])))
    return common.pop() if len(common) == 1 else None


def lossy_floor(ctx: Context, links, severity: str) -> tuple[str, str]:
    """(severity, text): ``severity`` raised to at least a warning when one of ``links``
    ((a, b) pairs) is lossy (:func:`link_loss_rates`), with its rate in words; else as given."""
    rates = link_loss_rates(ctx)
    if rates.empty:
        return severity, ""
    want = {tuple(sorted((int(a), int(b)))) for a, b in links}
    picked = np.array([(int(a), int(b)) in want for a, b in zip(rates["a"], rates["b"])], dtype=bool)
    mine = rates[picked & rates["lossy"].to_numpy(dtype=bool)]
    if mine.empty:
        return severity, ""
    worst = mine.sort_values("rate", ascending=False).iloc[0]
    text = (f"rank {int(worst['a'])} <-> rank {int(worst['b'])} resent or lost {int(worst['lost'])} of "
            f"{int(worst['data'])} data segments ({worst['rate'] * 100:.1f}%): a link that drops this much is a "
            "fault to fix, whatever it costs the job today")
    return ("warning" if severity == "info" else severity), text


def first_loss_on(ev: pd.DataFrame, links) -> int | None:
    """The first of ``ev``'s events (trouble_events rows) on any of ``links`` ((a, b) pairs)."""
    if ev.empty or not links:
        return None
    want = pd.MultiIndex.from_tuples([tuple(sorted((int(a), int(b)))) for a, b in links])
    on = pd.MultiIndex.from_arrays([pd.to_numeric(ev["a"], errors="coerce"), pd.to_numeric(ev["b"], errors="coerce")])
    t = pd.to_numeric(ev.loc[np.asarray(on.isin(want), dtype=bool), "timestamp_ns"], errors="coerce")
    return None if t.dropna().empty else int(t.min())


def pinned(ctx: Context, blame):
    """``blame`` naming the one endpoint every lossy link shares (:func:`lossy_endpoint`)
    when the counts inside slow collectives left two candidates."""
    one = lossy_endpoint(ctx)
    if one is None or len(blame.ranks) == 1 or one not in blame.ranks:
        return blame
    return type(blame)([one], blame.coverage, True, blame.links)


def first_ns(counts: pd.DataFrame) -> int | None:
    """The first trouble event's time in ``counts`` (dedup_counts), None when empty."""
    v = pd.to_numeric(counts["first_ns"], errors="coerce").min() if len(counts) else None
    return None if v is None or pd.isna(v) else int(v)


__all__ = ["LOSSY_MIN_SEGMENTS", "LOSSY_RATE", "first_loss_on", "first_ns", "link_loss_rates", "lossy_endpoint",
           "lossy_floor", "pinned"]
