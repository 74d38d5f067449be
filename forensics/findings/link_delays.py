"""How long each link's data waits: the round-trip figures ``slow_link`` and ``network_loss``
compare across links (:mod:`.network`).

From the ``flow_timing`` table (per connection direction and capture point: ACK round-trip
percentiles, all ACKs and the clean ones whose wait saw no hole repaired,
:mod:`forensics.model.timing`) and, for models without it, the flows' mean RTT: per link
(an unordered rank pair) the RTT tail (:func:`link_rtts`), the queueing delay every data
connection shows (:func:`link_queue_delays`), the split between fast and slow links
(:func:`rtt_split`), the links that queue (:func:`queue_links`) and whether a standing-out
tail is a queue at all (:func:`bulk_waits_too`). Measurement only: the findings are
:mod:`.network`'s.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

RTT_GAP = 5.0              # slow links' RTT at least this many times the others'
RTT_MIN_EXCESS_NS = 100_000  # ... and at least 100 µs above them (µs-scale jitter is not a slow link)
QUEUE_GAP = 2.0            # ... with their bulk data held at least this many times longer (bulk_waits_too)
MIN_LINKS = 3              # a link needs peers to be compared with
MIN_RTT_SAMPLES = 20       # ACK RTTs needed before a connection's p99 means anything
BULK_SHARE = 0.10          # a connection with less than this share of the busiest ones' bytes is not a data one
# a link with no peer to compare with (a job of two ranks) against its own floor: a datacenter
# path's buffers hold a few ms at line rate; a standing queue of this much is a link slower than
# its senders (a down-negotiated port, a shaper or policer) or one that other traffic congests
LONE_QUEUE_MIN_NS = 10_000_000
LONE_MIN_CONNECTIONS = 2   # the bulk connections that must show it (one socket's RTT can be its host's stall)


def link_rtts(ctx) -> tuple[pd.DataFrame, str]:
    """:func:`_link_rtts`, computed once per analysis (``slow_groups`` and, when it finds no
    group, ``lone_slow_link`` read it); the table comes back as the caller's own copy."""
    links, metric = ctx.memo("link_rtts", lambda: _link_rtts(ctx))
    return links.copy(), metric


def _link_rtts(ctx) -> tuple[pd.DataFrame, str]:
    """Per link (unordered rank pair): the RTT statistic slow_link compares, and its name.

    Best: the ACK RTT p99 that two of the link's connections reach (``flow_timing``, each
    row one direction of a connection seen from one capture, with at least MIN_RTT_SAMPLES
    ACKs). Per connection, the largest p99 over its directions and capture points: a
    bottleneck's queue lengthens the tail, not the median, and only of the direction (and
    capture point) whose segments or ACKs wait in it. Per link, the second largest over its
    connections (a link with one connection: that one): the queue delays every connection
    through it, while one connection's tail can be a single stalled ACK (a busy host's
    scheduler, a delayed ACK) that says nothing of the path. Fallback (models without
    flow_timing): the median of the flows' mean RTT."""
    t = ctx.model.tables.get("flow_timing")
    if t is not None and len(t):
        t = t.dropna(subset=["rank", "peer_rank", "rtt_p99_ns"])
        t = t[(t["rank"] != t["peer_rank"]) & (t["rtt_samples"] >= MIN_RTT_SAMPLES)]

        if len(t):
            src = t["saddr"].astype(str) + ":" + t["sport"].astype(str)
            dst = t["daddr"].astype(str) + ":" + t["dport"].astype(str)
            t = t.assign(a=np.minimum(t["rank"], t["peer_rank"]).astype("int64"),
                         b=np.maximum(t["rank"], t["peer_rank"]).astype("int64"),
                         conn=np.where(src < dst, src + " " + dst, dst + " " + src),
                         rtt=t["rtt_p99_ns"].astype("float64"), p50=t["rtt_p50_ns"].astype("float64"),
                         p90=t["rtt_p90_ns"].astype("float64"))
            conn = t.groupby(["a", "b", "conn"])["rtt"].max().reset_index()
            conn = conn.sort_values(["a", "b", "rtt"], ascending=[True, True, False])
            nth = conn.groupby(["a", "b"]).cumcount()
            size = conn.groupby(["a", "b"])["rtt"].transform("size")
            second = conn[(nth == np.minimum(size, 2) - 1).to_numpy()].set_index(["a", "b"])
            g = t.groupby(["a", "b"])
            links = g.agg(p50=("p50", "median"), p90=("p90", "max"), flows=("rtt", "size"))
            links["rtt"] = second["rtt"]
            return links.reset_index()[["a", "b", "rtt", "p50", "p90", "flows"]], "ACK round-trip p99"
    f = ctx.table("flows").dropna(subset=["rank", "peer_rank", "rtt_mean_ns"])
    f = f[f["rank"] != f["peer_rank"]]
    if f.empty:
        return pd.DataFrame(columns=["a", "b", "rtt", "p50", "p90", "flows"]), ""
    f = f.assign(a=np.minimum(f["rank"], f["peer_rank"]).astype("int64"),
                 b=np.maximum(f["rank"], f["peer_rank"]).astype("int64"), rtt=f["rtt_mean_ns"].astype("float64"))
    links = f.groupby(["a", "b"]).agg(rtt=("rtt", "median"), flows=("rtt", "size")).reset_index()
    links["p50"] = links["p90"] = np.nan
    return links, "mean TCP round-trip"


def rtt_split(cand: pd.DataFrame) -> int | None:
    """Index of the first slow link of ``cand`` (sorted by rtt): the largest ratio between
    neighbours that leaves the slow group a minority, or one endpoint's links (a slow NIC in a
    job of three: two links of three), when it is a clear gap; else None."""
    if len(cand) < MIN_LINKS:
        return None
    rtt = cand["rtt"].to_numpy(dtype=np.float64)
    ratios = rtt[1:] / np.maximum(rtt[:-1], 1.0)
    k_min = int(np.ceil(len(rtt) / 2))   # index of the first slow link is at least half-way
    ends = [{int(a), int(b)} for a, b in zip(cand["a"], cand["b"])]
    one_end = [bool(set.intersection(*ends[k:])) for k in range(1, len(rtt))]
    ratios = np.where((np.arange(1, len(rtt)) >= k_min) | np.array(one_end, dtype=bool), ratios, 0.0)
    k = int(np.argmax(ratios)) + 1
    if ratios[k - 1] < RTT_GAP or rtt[k] - rtt[k - 1] < RTT_MIN_EXCESS_NS:
        return None
    return k


def link_queue_delays(ctx) -> pd.DataFrame:
    """Per link (a, b): ``q``, the clean ACK round-trip p90 that *every* data connection of the
    link shows (per connection the largest over the capture points that saw it, then the least
    over the link's connections; clean: the ACKs whose wait saw no hole repaired, see
    :mod:`forensics.model.timing`). A bottleneck's queue delays most segments of every
    connection through it; loss delays only the segments behind a hole, and
    Linux's delayed ACK (up to 40 ms for a lone small segment) only the directions that
    carry little, which are left out (less than BULK_SHARE of the busiest connections' bytes).
    A memo of the analysis: network_loss and slow_link read it up to five times."""
    return ctx.memo("link_queue_delays", lambda: _link_queue_delays(ctx))


def _link_queue_delays(ctx) -> pd.DataFrame:
    t = ctx.model.tables.get("flow_timing")
    cols = ["a", "b", "q", "p50", "connections"]
    if t is None or t.empty:
        return pd.DataFrame(columns=cols)
    t = t.dropna(subset=["rank", "peer_rank", "rtt_p90_ns"])
    t = t[(t["rank"] != t["peer_rank"]) & (t["rtt_samples"] >= MIN_RTT_SAMPLES)]
    if t.empty:
        return pd.DataFrame(columns=cols)
    vol = pd.to_numeric(t["data_bytes"], errors="coerce").fillna(0)
    t = t[(vol >= BULK_SHARE * float(vol.quantile(0.9))).to_numpy()]
    # the clean ACKs (no hole repaired while they waited): loss lifts the others, a queue all
    # of them. A row without the clean columns (a table built elsewhere) falls back to every
    # ACK; a connection with too few clean ACKs cannot tell its queue from its loss: left out
    def col(name):
        return pd.to_numeric(t[name], errors="coerce") if name in t else pd.Series(np.nan, index=t.index)
    n_clean = col("rtt_clean_samples")
    known = n_clean.notna()
    t = t.assign(q=col("rtt_clean_p90_ns").where(known, col("rtt_p90_ns")),
                 p50=col("rtt_clean_p50_ns").where(known, col("rtt_p50_ns")))
    t = t[(~known | (n_clean >= MIN_RTT_SAMPLES)).to_numpy()]
    if t.empty:
        return pd.DataFrame(columns=cols)
    conn = t.groupby(
        ["saddr", "sport", "daddr", "dport"]).agg(q=("q", "max"), p50=("p50", "median"),
                                                  r=("rank", "first"), p=("peer_rank", "first")).reset_index()
    conn = conn.assign(a=np.minimum(conn["r"], conn["p"]).astype("int64"),
                       b=np.maximum(conn["r"], conn["p"]).astype("int64"), q=conn["q"].astype("float64"))
    return conn.groupby(["a", "b"]).agg(q=("q", "min"), p50=("p50", "median"),
                                        connections=("q", "size")).reset_index()


def queue_links(ctx) -> set[tuple[int, int]]:
    """Links whose every data connection queues (:func:`link_queue_delays`) far above the
    other links': a slow or congested link. Drops on such a link are its queue overflowing
    (slow_link names it); loss on a fast path leaves the bulk of the RTTs flat and lifts only
    the tail by a retransmission timeout (network_loss's)."""
    q = link_queue_delays(ctx)
    if q.empty:
        return set()
    cand = q.assign(rtt=q["q"]).sort_values("rtt").reset_index(drop=True)
    k = rtt_split(cand)
    if k is None:
        return set()
    return {(int(a), int(b)) for a, b in zip(cand["a"].iloc[k:], cand["b"].iloc[k:])}


def bulk_waits_too(ctx, slow: pd.DataFrame, fast: pd.DataFrame) -> bool:
    """Whether the links whose ACK round-trip tail stands out also hold their data longer:
    the clean p90 of their bulk connections (:func:`link_queue_delays`) at least QUEUE_GAP
    times the other links'. A slow or congested path queues most segments through it; a tail
    alone, with the bulk as fast as elsewhere, is the endpoints' doing (a receiver's delayed
    ACK after it idled behind a late peer: ~40 ms on Linux; a busy host's scheduler), not
    the path's. Where either side has no such figure, the tail is all there is: True."""
    q = link_queue_delays(ctx)
    if q.empty:
        return True
    q = q.set_index(["a", "b"])["q"]

    def of(links):
        keys = [(int(a), int(b)) for a, b in zip(links["a"], links["b"])]
        return q.reindex(keys).dropna().to_numpy(dtype=np.float64)
    slow_q, fast_q = of(slow), of(fast)
    if not len(slow_q) or not len(fast_q):
        return True
    base = float(np.median(fast_q))
    return float(slow_q.max()) >= QUEUE_GAP * max(base, 1.0) and float(slow_q.max()) - base >= RTT_MIN_EXCESS_NS


def lone_link_queues(ctx) -> pd.DataFrame:
    """Per link (a, b) between two ranks, from the sockets ``ss`` sampled (``sockets``: the
    start and end snapshots and the capture's series): ``srtt`` (the kernel's smoothed RTT) and
    ``floor`` (its windowed minimum RTT: the path's propagation and serialization), each the
    median over the link's bulk connections of the connection's own figure (the median of its
    samples' srtt, the least of its min RTTs), ``queue`` the median of srtt less floor, and
    ``connections`` (bulk: at least BULK_SHARE of the link's busiest connection's bytes acked).
    A link of its own floor: what ``slow_link`` reads where there are too few links to compare
    (fewer than MIN_LINKS). Times in ns; the same rows as :func:`lone_link_sql`."""
    cols = ["a", "b", "srtt", "floor", "queue", "connections"]
    s = ctx.model.tables.get("sockets")
    if s is None or s.empty or "minrtt_ms" not in s.columns:
        return pd.DataFrame(columns=cols)
    r, p = pd.to_numeric(s["rank"], errors="coerce"), pd.to_numeric(s["peer_rank"], errors="coerce")
    srtt, floor = pd.to_numeric(s["rtt_ms"], errors="coerce"), pd.to_numeric(s["minrtt_ms"], errors="coerce")
    ok = (r.notna() & p.notna() & (r != p) & srtt.notna() & floor.notna()
          & (s["state"].astype("string") == "ESTAB").fillna(False)).to_numpy(dtype=bool)
    if not ok.any():
        return pd.DataFrame(columns=cols)
    t = pd.DataFrame({"a": np.minimum(r, p)[ok].astype("int64"), "b": np.maximum(r, p)[ok].astype("int64"),
                      "me": (s["local_addr"].astype(str) + ":" + s["local_port"].astype(str))[ok],
                      "you": (s["peer_addr"].astype(str) + ":" + s["peer_port"].astype(str))[ok],
                      "srtt": srtt[ok] * 1e6, "floor": floor[ok] * 1e6,
                      "acked": pd.to_numeric(s["bytes_acked"], errors="coerce").fillna(0)[ok]})
    conn = t.groupby(["a", "b", "me", "you"]).agg(srtt=("srtt", "median"), floor=("floor", "min"),
                                                  acked=("acked", "max")).reset_index()
    busiest = conn.groupby(["a", "b"])["acked"].transform("max")
    conn = conn[(conn["acked"] > 0) & (conn["acked"] >= BULK_SHARE * busiest)]
    if conn.empty:
        return pd.DataFrame(columns=cols)
    conn = conn.assign(queue=conn["srtt"] - conn["floor"])
    return conn.groupby(["a", "b"]).agg(srtt=("srtt", "median"), floor=("floor", "median"),
                                        queue=("queue", "median"),
                                        connections=("queue", "size")).reset_index()[cols]


def lone_link_sql() -> str:
    """:func:`lone_link_queues` in SQL over ``sockets`` (times in µs), with ``queueing``: the
    link holds a standing queue (LONE_QUEUE_MIN_NS on LONE_MIN_CONNECTIONS bulk connections)."""
    return f"""WITH s AS (
  SELECT least(rank, peer_rank) AS rank_a, greatest(rank, peer_rank) AS rank_b,
         local_addr || ':' || local_port AS me, peer_addr || ':' || peer_port AS you,
         rtt_ms * 1e6 AS srtt, minrtt_ms * 1e6 AS floor, coalesce(bytes_acked, 0) AS acked
  FROM sockets WHERE rank IS NOT NULL AND peer_rank IS NOT NULL AND rank <> peer_rank
    AND rtt_ms IS NOT NULL AND minrtt_ms IS NOT NULL AND state = 'ESTAB'
), c AS (
  SELECT rank_a, rank_b, me, you, median(srtt) AS srtt, min(floor) AS floor, max(acked) AS acked
  FROM s GROUP BY ALL
), bulk AS (
  SELECT * FROM (SELECT *, max(acked) OVER (PARTITION BY rank_a, rank_b) AS busiest FROM c)
  WHERE acked > 0 AND acked >= {BULK_SHARE} * busiest
)
SELECT rank_a, rank_b, round(median(srtt) / 1e3, 1) AS srtt_us, round(median(floor) / 1e3, 1) AS floor_us,
       round(median(srtt - floor) / 1e3, 1) AS queue_us, count(*) AS connections,
       median(srtt - floor) >= {LONE_QUEUE_MIN_NS} AND count(*) >= {LONE_MIN_CONNECTIONS} AS queueing
FROM bulk GROUP BY ALL ORDER BY queue_us DESC, rank_a, rank_b"""


__all__ = ["BULK_SHARE", "LONE_MIN_CONNECTIONS", "LONE_QUEUE_MIN_NS", "MIN_LINKS", "MIN_RTT_SAMPLES", "QUEUE_GAP",
           "RTT_GAP", "RTT_MIN_EXCESS_NS", "bulk_waits_too", "link_queue_delays", "link_rtts", "lone_link_queues",
           "lone_link_sql", "queue_links", "rtt_split"]
