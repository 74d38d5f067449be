"""TCP trouble per link: lost segments, retransmissions and resets between two ranks.

Everything here is a DataFrame operation over ``tcp_events`` (no per-event Python loop): the
detectors in ``network.py``, ``connection_reset.py``, ``straggler.py`` and ``hang.py`` combine
these pieces and phrase the verdict; the classes of trouble are the one table of
:mod:`forensics.tcp.classes`, which the report uses too.

Counting rule: one lost segment shows up several times in ``tcp_events`` (the kernel
tracepoint on the sender, the sender's pcap, the receiver's pcap when the retransmission got
through). Per directed connection and class of event, the count is the largest count any
*one* source saw (one pcap, or the tracer), not the sum, so a link is not blamed twice for
being captured on both ends (:func:`dedup_counts`; :func:`dedup_sql` over :func:`trouble_sql`
in SQL).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..tcp.classes import (DATA_LOSS_CLASSES, EVENT_CLASS, LOSS_CLASSES, RESEND_EVENTS, class_sql, classify,
                           dense_codes, subsumed_sql)
from .sql import sql_int, sql_list

COUNT_COLUMNS = {"retransmission": "retransmissions", "duplicate_ack": "duplicate_acks",
                 "lost_segment": "lost_segments", "reset": "resets"}


def trouble_events(ctx, classes=LOSS_CLASSES + ("reset",)) -> pd.DataFrame:
    """tcp_events of the given classes between two known ranks, with columns
    cls, sender, receiver (ranks: who sent the retransmission / the RST), a, b (the
    unordered link), key (directed connection), src (which source saw it). A memo of the
    analysis per classes (several detectors read it)."""
    every = tuple(dict.fromkeys(LOSS_CLASSES + DATA_LOSS_CLASSES + ("reset",) + tuple(classes)))
    t = ctx.memo(("trouble_events", every), lambda: _trouble_events(ctx, every))
    return t[t["cls"].isin(classes).to_numpy()].reset_index(drop=True)


def _trouble_events(ctx, classes: tuple[str, ...]) -> pd.DataFrame:
    t = ctx.table("tcp_events")
    if t.empty:
        return _empty_trouble()
    cls = classify(t)   # one class per packet: a spurious retransmission is not also a retransmission
    t = t.assign(cls=cls)[cls.isin(classes).to_numpy()]
    t = t.dropna(subset=["rank", "peer_rank", "timestamp_ns"])
    t = t[t["rank"] != t["peer_rank"]]
    if t.empty:
        return _empty_trouble()
    # tcp_receive_reset is reported by the socket that got the RST: the sender is its peer
    recv = (t["event"] == "tcp_receive_reset").to_numpy()
    r, p = t["rank"].astype("int64").to_numpy(), t["peer_rank"].astype("int64").to_numpy()
    sender, receiver = np.where(recv, p, r), np.where(recv, r, p)
    # text: each column as codes into its distinct values ("<NA>" when unknown), addresses and
    # ports each on one shared table so that the flip of a received reset is a swap of codes;
    # the joined keys are made once per distinct combination (a few thousand connections),
    # not once per event (10^5-10^6 at fleet scale)
    addr, addr_txt = _codes(t["saddr"], t["daddr"])
    port, port_txt = _codes(t["sport"], t["dport"])
    n = len(t)
    sa, da, sp, dp = addr[:n], addr[n:], port[:n], port[n:]
    src_a, dst_a = np.where(recv, da, sa), np.where(recv, sa, da)
    src_p, dst_p = np.where(recv, dp, sp), np.where(recv, sp, dp)
    key = _joined([(src_a, addr_txt), (src_p, port_txt), (dst_a, addr_txt), (dst_p, port_txt)], (":", ">", ":"))
    seen_by = _joined([_codes(t[c]) for c in ("source", "host", "capture")], (":", ":"))
    out = pd.DataFrame({
        "timestamp_ns": t["timestamp_ns"].astype("int64").to_numpy(), "cls": t["cls"].to_numpy(),
        "event": t["event"].to_numpy(), "sender": sender, "receiver": receiver,
        "a": np.minimum(sender, receiver), "b": np.maximum(sender, receiver),
        "key": key, "src": seen_by,
        "saddr": addr_txt[src_a], "daddr": addr_txt[dst_a], "sport": port_txt[src_p], "dport": port_txt[dst_p],
    })
    return out.sort_values("timestamp_ns", kind="stable").reset_index(drop=True)


TCP_SOURCE_NAMES = {"pcap": "packets (tcpdump)", "bpf": "kernel TCP tracepoints (tracer)"}


def tcp_sources(ev: pd.DataFrame) -> str:
    """What saw ``ev``'s events (trouble_events rows), in words: "packets (tcpdump) on 4
    hosts, kernel TCP tracepoints (tracer) on 4 hosts"."""
    if ev.empty:
        return ""
    parts = ev["src"].astype(str).str.split(":", n=2, expand=True)
    out = []
    for source, g in parts.groupby(0, sort=True):
        hosts = g[1].nunique()
        out.append(f"{TCP_SOURCE_NAMES.get(source, source)} on {hosts} host{'' if hosts == 1 else 's'}")
    return ", ".join(out)


def _codes(*cols: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The columns, one after the other, as codes into one table of their distinct values as
    text (objects; the last one "<NA>", the code of a missing value): (codes, table)."""
    both = pd.concat(cols, ignore_index=True) if len(cols) > 1 else cols[0]
    codes, values = pd.factorize(both, use_na_sentinel=True)
    table = np.array([str(v) for v in values] + ["<NA>"], dtype=object)
    return np.where(codes < 0, len(values), codes), table


def _joined(parts: list[tuple[np.ndarray, np.ndarray]], seps: tuple[str, ...]) -> np.ndarray:
    """Per row, the parts' texts (codes into their tables) joined with seps; each distinct
    combination is joined once."""
    combo = dense_codes([(codes, len(table)) for codes, table in parts], len(parts[0][0]))
    _, first = np.unique(combo, return_index=True)
    texts = []
    for row in first:
        txt = parts[0][1][parts[0][0][row]]
        for (codes, table), sep in zip(parts[1:], seps):
            txt += sep + table[codes[row]]
        texts.append(txt)
    return np.array(texts, dtype=object)[combo]


def trouble_sql(classes=LOSS_CLASSES + ("reset",)) -> str:
    """:func:`trouble_events` as SQL over ``tcp_events`` (a subquery: the same rows, flip of
    tcp_receive_reset included), for the runnable SQL of the findings. Columns:
    timestamp_ns, event, cls, sender_rank, receiver_rank, saddr, sport, daddr, dport (text,
    '<NA>' when unknown, as the evidence writes them), "from", "to", src."""
    events = sql_list(e for e, c in EVENT_CLASS.items() if c in classes or e in RESEND_EVENTS)
    return f"""(
  SELECT timestamp_ns, event, cls, sender_rank, receiver_rank, saddr, sport, daddr, dport,
         saddr || ':' || sport AS "from", daddr || ':' || dport AS "to", src
  FROM (
    SELECT timestamp_ns, event, {class_sql("t", tuple(classes))} AS cls,
           CASE WHEN recv THEN peer_rank ELSE rank END AS sender_rank,
           CASE WHEN recv THEN rank ELSE peer_rank END AS receiver_rank,
           CASE WHEN recv THEN da ELSE sa END AS saddr, CASE WHEN recv THEN dp ELSE sp END AS sport,
           CASE WHEN recv THEN sa ELSE da END AS daddr, CASE WHEN recv THEN sp ELSE dp END AS dport,
           coalesce(source, '<NA>') || ':' || coalesce(host, '<NA>') || ':' || coalesce(capture, '<NA>') AS src
    FROM (
      SELECT *, event = 'tcp_receive_reset' AS recv, coalesce(saddr, '<NA>') AS sa, coalesce(daddr, '<NA>') AS da,
             coalesce(CAST(sport AS VARCHAR), '<NA>') AS sp, coalesce(CAST(dport AS VARCHAR), '<NA>') AS dp
      FROM tcp_events t
      WHERE event IN ({events}) AND rank IS NOT NULL AND peer_rank IS NOT NULL AND timestamp_ns IS NOT NULL
        AND rank <> peer_rank AND NOT {subsumed_sql("t")}
    ) t
  ) WHERE cls IN ({sql_list(classes)})
)"""


def dedup_sql(trouble: str) -> str:
    """:func:`dedup_counts` as SQL over a :func:`trouble_sql` subquery (optionally filtered):
    per directed connection and class, the largest count one source saw. Columns:
    sender_rank, receiver_rank, saddr, sport, daddr, dport, "from", "to", cls, n, first_ns."""
    return f"""(
  SELECT arg_min(sender_rank, first_ns) AS sender_rank, arg_min(receiver_rank, first_ns) AS receiver_rank,
         saddr, sport, daddr, dport, "from", "to", cls, max(n) AS n, min(first_ns) AS first_ns
  FROM (SELECT arg_min(sender_rank, timestamp_ns) AS sender_rank, arg_min(receiver_rank, timestamp_ns) AS receiver_rank,
               saddr, sport, daddr, dport, "from", "to", cls, src, count(*) AS n, min(timestamp_ns) AS first_ns
        FROM {trouble} GROUP BY saddr, sport, daddr, dport, "from", "to", cls, src)
  GROUP BY saddr, sport, daddr, dport, "from", "to", cls
)"""


def trouble_rows(e: pd.DataFrame, limit: int = 20) -> list[dict]:
    """Evidence rows of :func:`trouble_events` rows, earliest first (ties by event and
    endpoints), as :func:`trouble_rows_sql` returns them."""
    e = e.assign(from_=e["saddr"].astype(str) + ":" + e["sport"].astype(str),
                 to_=e["daddr"].astype(str) + ":" + e["dport"].astype(str))
    e = e.sort_values(["timestamp_ns", "event", "from_", "to_"], kind="stable").head(limit)
    return [{"timestamp_ns": int(x.timestamp_ns), "event": x.event, "sender_rank": int(x.sender),
             "receiver_rank": int(x.receiver), "from": x.from_, "to": x.to_} for x in e.itertuples(index=False)]


def trouble_rows_sql(where: str, classes=LOSS_CLASSES + ("reset",), limit: int = 20) -> str:
    """The SQL of :func:`trouble_rows` over the events of ``classes`` that match ``where``
    (SQL over :func:`trouble_sql`'s columns)."""
    return f"""SELECT timestamp_ns, event, sender_rank, receiver_rank, "from", "to"
FROM {trouble_sql(tuple(classes))}
WHERE {where}
ORDER BY timestamp_ns, event, "from", "to" LIMIT {sql_int(limit)}"""


def _empty_trouble() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=d) for c, d in (
        ("timestamp_ns", "int64"), ("cls", object), ("event", object), ("sender", "int64"), ("receiver", "int64"),
        ("a", "int64"), ("b", "int64"), ("key", object), ("src", object), ("saddr", object), ("daddr", object),
        ("sport", object), ("dport", object))})


def dedup_counts(ev: pd.DataFrame) -> pd.DataFrame:
    """Per directed connection and class: the count the best-placed single source saw,
    with first/last time. Columns: key, cls, sender, receiver, a, b, saddr, daddr, n,
    first_ns, last_ns."""
    if ev.empty:
        return pd.DataFrame(columns=["key", "cls", "sender", "receiver", "a", "b", "saddr", "daddr", "sport",
                                     "dport", "n", "first_ns", "last_ns"])
    per_src = ev.groupby(["key", "cls", "src"], sort=False).size().rename("n").reset_index()
    n = per_src.groupby(["key", "cls"], sort=False)["n"].max()
    meta = ev.groupby(["key", "cls"], sort=False).agg(
        sender=("sender", "first"), receiver=("receiver", "first"), a=("a", "first"), b=("b", "first"),
        saddr=("saddr", "first"), daddr=("daddr", "first"), sport=("sport", "first"), dport=("dport", "first"),
        first_ns=("timestamp_ns", "min"), last_ns=("timestamp_ns", "max"))
    return meta.join(n).reset_index()


@dataclass
class LinkBlame:
    """The rank(s) a set of troubled TCP links share (:func:`shared_endpoint`); the hosts a
    set of failing WARN-line pairs share are :class:`forensics.findings.warns.HostBlame`."""

    ranks: list[int]            # the endpoint(s) the trouble shares (two when it cannot tell them apart)
    coverage: dict[int, float]  # rank -> share of the trouble on links touching it
    separated: bool             # one endpoint stands out
    links: list[tuple[int, int]]


MIN_LINK_EVENTS = 3      # a link with this much trouble (and MIN_LINK_SHARE of the worst link's) ...
MIN_LINK_SHARE = 0.1     # ... is troubled in its own right, not noise


def shared_endpoint(counts: pd.DataFrame, weight: str = "n", tie_ratio: float = 0.8) -> LinkBlame:
    """The endpoint the troubled links share.

    First rule: when two or more links are troubled in their own right (MIN_LINK_EVENTS
    and MIN_LINK_SHARE of the worst link) and have exactly one rank in common, that rank
    is blamed alone: one fault explains every one of them, and a rank absent from one of
    them cannot. Otherwise, by coverage: a rank's coverage is the share of the trouble on
    links touching it, and the blamed ranks are those within ``tie_ratio`` of the best.
    A single troubled link gives both its ends: the evidence cannot tell which NIC (or
    cable end) is at fault."""
    if counts.empty:
        return LinkBlame([], {}, False, [])
    per_link = counts.groupby(["a", "b"])[weight].sum()
    total = float(per_link.sum())
    ends = pd.concat([per_link.rename_axis(["r", "o"]).reset_index(), per_link.rename_axis(["o", "r"]).reset_index()])
    cov = (ends.groupby("r")[weight].sum() / total).sort_values(ascending=False)
    coverage = {int(r): float(v) for r, v in cov.items()}
    links = [(int(a), int(b)) for (a, b), _ in per_link.sort_values(ascending=False).items()]
    own = per_link[(per_link >= MIN_LINK_EVENTS) & (per_link >= MIN_LINK_SHARE * float(per_link.max()))]
    if len(own) >= 2:
        common = set.intersection(*({int(a), int(b)} for a, b in own.index))
        if len(common) == 1:
            return LinkBlame(sorted(common), coverage, True, links)
    best = float(cov.iloc[0])
    blamed = sorted(int(r) for r, v in cov.items() if v >= tie_ratio * best)
    return LinkBlame(blamed, coverage, len(blamed) == 1, links)


def kernel_logged_reset(ctx, r) -> bool:
    """Did the RST sender's kernel log tcp_send_reset on that connection? A reset seen on the
    wire (or received) that its sender's kernel never sent was forged by a firewall or a
    middlebox. Without tracer TCP events there is nothing to compare with: assume it did."""
    t = ctx.table("tcp_events")
    bpf = t[t["source"] == "bpf"] if len(t) else t
    if bpf.empty:
        return True
    s = bpf[(bpf["event"] == "tcp_send_reset") & (bpf["saddr"].astype(str) == str(r["saddr"]))
            & (bpf["daddr"].astype(str) == str(r["daddr"]))]
    return bool((s["sport"].astype("Int64").astype(str) == str(r["sport"])).any())


__all__ = ["COUNT_COLUMNS", "LinkBlame", "MIN_LINK_EVENTS", "MIN_LINK_SHARE", "TCP_SOURCE_NAMES", "dedup_counts",
           "dedup_sql", "kernel_logged_reset", "shared_endpoint", "tcp_sources", "trouble_events", "trouble_rows",
           "trouble_rows_sql", "trouble_sql"]
