"""Network findings over TCP: ``network_loss`` and ``slow_link``.

network_loss: collectives are slow compared with the job's own clean collectives (those
with no TCP trouble in their window), and retransmissions / duplicate ACKs sit inside
the slow collectives' windows. The blame goes to the endpoint (rank, host, NIC address)
that the lossy connections share: a retransmission is counted on the *link*, not on the
sender, because the sender is often the healthy side (its segments, or the ACKs coming
back, died at the faulty NIC). When only one link is lossy, both its ends are named.

slow_link: one link's (or one endpoint's links') round-trip time is far above the other
links' without retransmissions: a slow or congested path (a down-negotiated port, a
rate-limited or oversubscribed link) that queues instead of dropping. The RTT compared is
the tail (p99) of the ACK round-trip of the link's data connections (``flow_timing``):
in a ring every link moves data at the slowest one's pace, so throughput is alike
everywhere, but only the bottleneck holds a queue.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .base import SEVERITY_RANK, Context, Finding, detector, impact_severity
from .link_delays import (BULK_SHARE, LONE_MIN_CONNECTIONS, LONE_QUEUE_MIN_NS, MIN_LINKS, MIN_RTT_SAMPLES,
                          bulk_waits_too, link_queue_delays, link_rtts, lone_link_queues, lone_link_sql, queue_links,
                          rtt_split)
from .link_loss import first_loss_on, first_ns, link_loss_rates, lossy_floor, pinned
from .bottleneck import link_rates, transfer_excess
from ..model.windows import capture_start_ns
from .loss_direction import loss_direction
from ..tcp.classes import DATA_LOSS_CLASSES, FLOW_DATA_LOST_SQL, LOSS_CLASSES, flow_data_lost
from ..wording import ms, ranks_text
from .collectives import ALL_WATCHED_ENTERED_SQL, collective_windows, in_windows
from .cpu_contention import starved_ends
from .impact import Impact, clean_baselines, impact
from .ranks import hosts_of, label, rank_directory, who_text
from .sql import sql_int, sql_list, sql_str
from .trouble import COUNT_COLUMNS, dedup_counts, dedup_sql, shared_endpoint, tcp_sources, trouble_events, trouble_sql

KINDS = ("network_loss", "slow_link")
MIN_LOSS_EVENTS = 3        # retransmissions/dup ACKs (deduplicated) inside slow collectives
MIN_SLOW_COLLECTIVES = 2   # one slow collective is an anecdote
MIN_BASELINE = 5           # clean collectives needed to call it a baseline
SLOW_FACTOR = 3.0          # slow = this many times the clean baseline's p50
MAX_EVIDENCE = 20

CLEAR_RTT_RATIO = 10.0     # a queue this much above the other links' needs less slowdown to be a warning
QUEUE_SHARE = 0.10         # ... or a queueing delay of this share of a collective (no fast collectives seen)
STARVED_CONFIDENCE = 0.5   # the blamed host was starved of CPU: its late ACKs explain the symptom as well


# --------------------------------------------------------------------------- network_loss

@detector("network_loss", kinds=KINDS)
def network_loss(ctx: Context) -> list[Finding]:
    w = collective_windows(ctx)
    done = w[w["complete"]].reset_index(drop=True)
    ev = trouble_events(ctx)
    queued = queue_links(ctx) if len(ev) else set()
    if queued:      # drops on a link whose RTT rose with its queue are that queue's: slow_link's
        on_queue = pd.MultiIndex.from_arrays([pd.to_numeric(ev["a"], errors="coerce"),
                                              pd.to_numeric(ev["b"], errors="coerce")]).isin(list(queued))
        ev = ev[~np.asarray(on_queue, dtype=bool)]
    trouble_ev = ev[ev["cls"].isin(LOSS_CLASSES)]
    lost = ev[ev["cls"].isin(DATA_LOSS_CLASSES)]
    if done.empty or lost.empty:
        return []
    # TCP trouble (any loss class) and lost data inside each completed collective's window
    t0 = done["t0"].to_numpy(dtype=np.int64)
    t1 = done["t1"].to_numpy(dtype=np.int64)
    n_in, n_lost = _inside_counts(trouble_ev, t0, t1), _inside_counts(lost, t0, t1)
    dur = done["duration_ns"].to_numpy(dtype=np.float64)
    clean_mask = n_in == 0
    clean = dur[clean_mask]
    baseline = float(np.median(clean)) if len(clean) >= MIN_BASELINE else None
    thr = max(SLOW_FACTOR * baseline, 1e6) if baseline else ctx.options.slow_ms * 1e6
    # slow and holding lost or retransmitted data: duplicate ACKs alone are reordering or a queue
    slow = (dur > thr) & (n_lost > 0)
    if slow.sum() < MIN_SLOW_COLLECTIVES:
        return _loss_without_slowdown(ctx, lost, done, baseline, impact(done, slow, clean_mask))
    sw = done[slow]
    inside = in_windows(ev["timestamp_ns"].to_numpy(), sw["t0"].to_numpy(dtype=np.int64),
                        sw["t1"].to_numpy(dtype=np.int64))
    counts = dedup_counts(ev[inside])
    lossc = counts[counts["cls"].isin(DATA_LOSS_CLASSES)]
    if lossc["n"].sum() < MIN_LOSS_EVENTS:
        return []
    blame = pinned(ctx, shared_endpoint(lossc))
    directory = rank_directory(ctx)
    per_cls = counts.groupby("cls")["n"].sum()
    nret = int(per_cls.get("retransmission", 0))
    nlost = int(per_cls.get("lost_segment", 0))
    ndup = int(per_cls.get("duplicate_ack", 0))
    nrst = int(per_cls.get("reset", 0))
    sdur = sw["duration_ns"].to_numpy(dtype=np.float64)
    p50, p99 = float(np.median(sdur)), float(np.quantile(sdur, 0.99))
    ops = sw["op"].dropna()
    op = ops.mode().iat[0] if len(ops) else "collective"
    blamed = blame.ranks
    peers = sorted({int(x) for a, b in blame.links for x in (a, b)} - set(blamed))
    who = who_text(directory, blamed)
    if len(blamed) == 2 and tuple(blamed) in {tuple(sorted(lk)) for lk in blame.links}:
        who += ", the link between them"
    base_txt = f"vs {ms(baseline)} for clean collectives" if baseline else f"(slow: > {ms(thr)})"
    trouble = [f"{nret} TCP retransmissions"] + ([f"{nlost} lost segments"] if nlost else []) + \
              ([f"{ndup} duplicate ACKs"] if ndup else []) + ([f"{nrst} resets"] if nrst else [])
    # the share of the job's collective time the slow collectives' excess explains: a few
    # retransmissions on a busy host that cost nothing measurable are no warning
    imp = impact(done, slow, clean_mask)
    flat = _flat_rtt_text(ctx, blame.links)
    way = loss_direction(lossc, blamed)
    summary = (f"{who}: {int(slow.sum())} of {len(done)} collectives slow ({op} p50 {ms(p50)}, p99 {ms(p99)} "
               f"{base_txt}) with {', '.join(trouble)} on "
               f"{'its' if len(blamed) == 1 else 'their'} links"
               + (f" (to {ranks_text(peers)})" if peers else "") + f" inside them; they explain {imp.text()}"
               + (f"; {flat}" if flat else "") + (f"; {way.text}" if way.one_way else "") + ".")
    severity, rate_txt = lossy_floor(ctx, blame.links, impact_severity(imp.share, imp.slow))
    if rate_txt:
        summary = summary[:-1] + f"; {rate_txt}."
    second = sorted(blame.coverage.values(), reverse=True)
    sep = 1.0 - (second[len(blamed)] / second[0]) if len(second) > len(blamed) and second[0] else 0.0
    confidence = (0.55 + 0.35 * sep if blame.separated else 0.6) + min(0.1, lossc["n"].sum() / 500)
    # a host starved of CPU ACKs late: its peers' timers fire, resends the peer did not need
    starved, starved_details = starved_ends(ctx, blame.links)
    if starved:
        severity = max(severity, "warning", key=SEVERITY_RANK.__getitem__)
        confidence *= STARVED_CONFIDENCE
        summary = summary[:-1] + f"; {starved}."
    note = ((f"one endpoint stands out ({sep * 100:.0f}% ahead of the next)" if blame.separated else
             "lower: the trouble does not single out one endpoint")
            + f"; {int(lossc['n'].sum())} loss events inside slow collectives")
    evidence = _link_rows(counts, directory)
    sql = link_rows_sql(LOSS_CLASSES + ("reset",), slower_than_ns=int(thr), without_links=queued)
    links = [_link_dict(a, b, counts, directory) for a, b in blame.links[:MAX_EVIDENCE]]
    action = (f"Check the NIC, cable and switch port of {who} (ethtool -S / ip -s link error and drop counters "
              "on both ends, switch port counters); move the job off that host or link and compare. "
              "Retransmissions are counted per link: the sender is often the healthy side.")
    details = {
        "slow_threshold_ns": int(thr), "baseline_p50_ns": baseline, "collectives": len(done),
        "slow_collectives": int(slow.sum()), "slow_p50_ns": p50, "slow_p99_ns": p99,
        "retransmissions": nret, "lost_segments": nlost, "duplicate_acks": ndup, "resets": nrst,
        "excess_ns": imp.excess_ns, "collective_time_ns": imp.total_ns, "flat_rtt": bool(flat),
        "coverage": {str(k): round(v, 3) for k, v in blame.coverage.items()},
        "per_rank": _per_rank_durations(ctx, sw),
        "lossy_links": [{"rank_a": a, "rank_b": b} for a, b in blame.links],
        "sources": tcp_sources(ev[inside]) + ", tracer (collective times)",
    }
    if starved:
        details["cpu_starved"] = starved_details
    if way.one_way:
        details["direction"] = way.direction
        # direction is that of the lossy end: egress, what it sends is lost; ingress, what it receives
        links = [dict(lk, lossy_end=blamed[0], direction=way.direction)
                 if blamed[0] in (lk.get("rank"), lk.get("peer_rank")) else lk for lk in links]
    return [Finding(kind="network_loss", severity=severity, confidence=confidence, summary=summary,
                    confidence_note=note,
                    headline=(f"Packet loss on {{who}}'s links (to {{peers}}): {int(slow.sum())} of {len(done)} "
                              f"collectives slowed, {imp.text()}"),
                    since_ns=first_loss_on(lost, blame.links), since_source="packets: the first loss on these links",
                    since_precision_ns=1_000_000,
                    ranks=blamed, hosts=hosts_of(directory, blamed), peer_ranks=peers, links=links,
                    evidence=evidence, sql=sql, action=action, score=imp.excess_ns / 1e9,
                    details=details, impact_share=imp.share,
                    **({"layer": "transport", "chain": way.chain(who)} if way.one_way else {}))]


def _inside_counts(ev: pd.DataFrame, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Per window [t0, t1]: how many of the events fall inside (sorted times, two searchsorted)."""
    times = np.sort(ev["timestamp_ns"].to_numpy(dtype=np.int64))
    return np.searchsorted(times, t1, side="right") - np.searchsorted(times, t0, side="left")


def _flat_rtt_text(ctx, links) -> str:
    """For network_loss's links: their ACK round-trip p90 on every data connection
    (:func:`link_queue_delays`) next to the other links'. Flat (alike) says loss on a fast
    path; a queue would have made them slow_link's (:func:`queue_links`). "" without timing."""
    q = link_queue_delays(ctx)
    if q.empty or not links:
        return ""
    mine = q[[(int(a), int(b)) in set(links) for a, b in zip(q["a"], q["b"])]]
    rest = q.drop(index=mine.index)
    if mine.empty or rest.empty:
        return ""
    return (f"the RTT stayed flat (ACK round-trip p90 {_us(float(mine['q'].max()))} on its lossy links vs "
            f"{_us(float(rest['q'].median()))} on the others): drops on a fast path, not a queue")


def _loss_without_slowdown(ctx, lost, done, baseline, imp) -> list[Finding]:
    """Lost data inside collectives that stayed fast (or too few slow ones to matter): worth a
    line, not an alarm."""
    inside = in_windows(lost["timestamp_ns"].to_numpy(), done["t0"].to_numpy(dtype=np.int64),
                        done["t1"].to_numpy(dtype=np.int64))
    counts = dedup_counts(lost[inside])
    if counts["n"].sum() < MIN_LOSS_EVENTS:
        return []
    blame = pinned(ctx, shared_endpoint(counts))
    directory = rank_directory(ctx)
    n = int(counts["n"].sum())
    who = who_text(directory, blame.ranks)
    how = (f"only {imp.slow} collective(s) holding them were slow, explaining {imp.text()}" if imp.slow else
           f"the collectives holding them stayed fast (p50 {ms(baseline)})")
    summary = (f"{n} retransmitted or lost TCP segments inside collectives on links of {who}, "
               f"but {how}: no measurable impact yet.")
    severity, rate_txt = lossy_floor(ctx, blame.links, "info")
    headline = None
    if rate_txt:
        summary = summary[:-1] + f"; {rate_txt}."
        worst = link_loss_rates(ctx)
        worst = worst[worst["lossy"]]["rate"].max()
        headline = (f"Packet loss on {{who}}'s links: {worst * 100:.1f}% of data segments resent or lost "
                    "({since}); little cost to the job yet")
    sql = link_rows_sql(DATA_LOSS_CLASSES)
    return [Finding(kind="network_loss", severity=severity, confidence=0.4 if not rate_txt else 0.7,
                    summary=summary, ranks=blame.ranks, peer_ranks=sorted({x for lk in blame.links for x in lk}
                                                                          - set(blame.ranks)),
                    headline=headline or "", since_ns=first_ns(counts), since_source="packets",
                    since_precision_ns=1_000_000,
                    hosts=hosts_of(directory, blame.ranks), links=[_link_dict(a, b, counts, directory)
                                                                  for a, b in blame.links[:MAX_EVIDENCE]],
                    evidence=_link_rows(counts, directory), sql=sql,
                    action=(f"Check the NIC, cable and switch port of {who} (ethtool -S / ip -s link drop counters on "
                            "both ends, switch port counters): the link drops packets." if rate_txt else
                            "Watch the link's error counters; no action needed while collectives stay fast."),
                    details={"events": n, "baseline_p50_ns": baseline, "slow_collectives": imp.slow,
                             "sources": tcp_sources(lost[inside]) + ", tracer (collective times)"},
                    impact_share=imp.share)]


def _per_rank_durations(ctx, windows: pd.DataFrame) -> dict:
    n = ctx.table("nccl_events")
    n = n[n["completed"].fillna(False).astype(bool) & n["duration_ns"].notna() & n["rank"].notna()]
    if n.empty:
        return {}
    key = windows[["comm_id_hash", "op_count"]].assign(slow=True)
    m = n.merge(key, on=["comm_id_hash", "op_count"], how="left")
    m["slow"] = m["slow"].fillna(False).astype(bool)
    g = m.assign(d=m["duration_ns"].astype("float64")).groupby(["rank", "slow"])["d"]
    out = {}
    for (rank, slow), k, p50, p99 in zip(g.size().index, g.size(), g.median(), g.quantile(0.99)):
        out.setdefault(str(int(rank)), {})["slow" if slow else "other"] = {
            "n": int(k), "p50_ns": float(p50), "p99_ns": float(p99)}
    return out


# the collectives collective_windows() calls complete (per-process keys hold one process's calls)
COMPLETE_SQL = f"ranks_completed = ranks_entered AND ({ALL_WATCHED_ENTERED_SQL} OR contains(comm_id_hash, ':'))"


def link_rows_sql(classes, slower_than_ns: int | None = None, without_links=()) -> str:
    """The SQL of :func:`_link_rows`: TCP trouble of ``classes`` inside completed collectives
    (with ``slower_than_ns``: only those slower than that which hold lost data, the slow
    windows of network_loss), deduplicated per directed connection like the evidence; events
    on ``without_links`` (rank pairs: the queueing links, slow_link's) left out."""
    loss = sql_list(DATA_LOSS_CLASSES)
    cond = COMPLETE_SQL
    if slower_than_ns is not None:
        cond += (f"\n    AND last_end_ns - first_entry_ns > {sql_int(slower_than_ns)}"
                 f"\n    AND EXISTS (SELECT 1 FROM ev WHERE ev.cls IN ({loss}) "
                 "AND ev.timestamp_ns BETWEEN c.first_entry_ns AND c.last_end_ns)")
    counts = ", ".join(f"CAST(coalesce(sum(n) FILTER (WHERE cls = {sql_str(c)}), 0) AS BIGINT) AS {col}"
                       for c, col in COUNT_COLUMNS.items())
    total = " + ".join(COUNT_COLUMNS.values())
    inside = dedup_sql("(SELECT * FROM ev WHERE EXISTS (SELECT 1 FROM win WHERE ev.timestamp_ns "
                       "BETWEEN win.t0 AND win.t1))")
    ev = trouble_sql(tuple(classes))
    if without_links:
        pairs = " OR ".join(f"(least(sender_rank, receiver_rank) = {sql_int(a)} AND "
                            f"greatest(sender_rank, receiver_rank) = {sql_int(b)})" for a, b in sorted(without_links))
        ev = f"(SELECT * FROM {ev} WHERE NOT ({pairs}))"
    return f"""WITH ev AS {ev},
win AS (
  SELECT first_entry_ns AS t0, last_end_ns AS t1 FROM collectives c
  WHERE {cond}
),
d AS {inside}
SELECT sender_rank, receiver_rank, "from", "to", {counts}, min(first_ns) AS first_ns
FROM d GROUP BY sender_rank, receiver_rank, saddr, sport, daddr, dport, "from", "to"
ORDER BY {total} DESC, first_ns, "from", "to" LIMIT {MAX_EVIDENCE}"""


def _link_rows(counts: pd.DataFrame, directory) -> list[dict]:
    """Per directed connection: deduplicated counts per class and the first event, the
    busiest first (ties: earliest, then by endpoints); what :func:`link_rows_sql` returns."""
    if counts.empty:
        return []
    piv = counts.pivot_table(index=["sender", "receiver", "saddr", "sport", "daddr", "dport"], columns="cls",
                             values="n", aggfunc="sum", fill_value=0).reset_index()
    for c in COUNT_COLUMNS:
        if c not in piv.columns:
            piv[c] = 0
    first = counts.groupby(["sender", "receiver", "saddr", "sport", "daddr", "dport"])["first_ns"].min()
    piv = piv.merge(first.reset_index(), on=["sender", "receiver", "saddr", "sport", "daddr", "dport"])
    piv["total"] = piv[list(COUNT_COLUMNS)].sum(axis=1)
    piv["from_"] = piv["saddr"].astype(str) + ":" + piv["sport"].astype(str)
    piv["to_"] = piv["daddr"].astype(str) + ":" + piv["dport"].astype(str)
    piv = piv.sort_values(["total", "first_ns", "from_", "to_"], ascending=[False, True, True, True],
                          kind="stable").head(MAX_EVIDENCE)
    return [{"sender_rank": int(r.sender), "receiver_rank": int(r.receiver), "from": r.from_, "to": r.to_,
             **{COUNT_COLUMNS[c]: int(getattr(r, c)) for c in COUNT_COLUMNS}, "first_ns": int(r.first_ns)}
            for r in piv.itertuples(index=False)]


def _link_dict(a: int, b: int, counts: pd.DataFrame, directory) -> dict:
    c = counts[(counts["a"] == a) & (counts["b"] == b)]
    d = {"rank": int(a), "peer_rank": int(b),
         "saddr": directory.get(int(a)).addr if directory.get(int(a)) else None,
         "daddr": directory.get(int(b)).addr if directory.get(int(b)) else None}
    for cls, col in COUNT_COLUMNS.items():
        d[col] = int(c.loc[c["cls"] == cls, "n"].sum())
    return d


# --------------------------------------------------------------------------- slow_link

@dataclass
class SlowGroups:
    """What slow_link compares: ``links`` (a, b, rtt, p50, flows, lossy: every link with the
    statistic named ``metric``), split into the ``slow`` group and the ``fast`` one;
    ``by_queue``: the slow group is the links whose every connection queues (``queued``,
    :func:`queue_links`) rather than the links whose RTT tail stands out; ``drops``: each
    link's lost or retransmitted data (:func:`link_drops`)."""

    links: pd.DataFrame
    fast: pd.DataFrame
    slow: pd.DataFrame
    metric: str
    by_queue: bool
    queued: set
    drops: dict


def slow_groups(ctx: Context) -> SlowGroups | None:
    """The slow links against the others, or None when no group stands out. The RTT tail of
    the links without loss tells it when it can (:func:`.link_delays.rtt_split`, the bulk waiting too:
    :func:`.link_delays.bulk_waits_too`); else (every link's tail lifted: delayed ACKs and timeouts of a
    busy host, drops at the slow link's own queue) the links whose every connection queues."""
    links, metric = link_rtts(ctx)
    if links.empty:
        return None
    # links with lost data (duplicate ACKs alone are not) and a flat RTT belong to network_loss;
    # a link whose every connection queues is a slow link even when its queue drops (queue_links)
    drops = link_drops(ctx)
    queued = queue_links(ctx)
    lossy = {lk for lk, n in drops.items() if n >= MIN_LOSS_EVENTS}
    pairs = [(int(x), int(y)) for x, y in zip(links["a"], links["b"])]
    links["lossy"] = [lk in lossy for lk in pairs]
    on_queue = np.array([lk in queued for lk in pairs], dtype=bool)
    cand = links[(~links["lossy"].to_numpy(dtype=bool) | on_queue) & links["rtt"].notna().to_numpy()] \
        .sort_values("rtt").reset_index(drop=True)
    k = rtt_split(cand)
    if k is not None and not bulk_waits_too(ctx, cand.iloc[k:], cand.iloc[:k]):
        k = None
    if k is not None:
        return SlowGroups(links, cand.iloc[:k], cand.iloc[k:], metric, False, queued, drops)
    if not queued:
        return None
    # every connection of these links queues: the slow group, lossy or not (drops at the
    # queue); compared with the links that do not queue (a busy host's stray
    # retransmissions on them leave their bulk RTT flat)
    qd = link_queue_delays(ctx).set_index(["a", "b"])
    links = links.drop(columns=["rtt", "p50", "flows"]).merge(
        qd.rename(columns={"q": "rtt", "connections": "flows"}).reset_index(), on=["a", "b"], how="left")
    links["flows"] = links["flows"].fillna(0).astype("int64")
    is_slow = np.array([(int(x), int(y)) in queued for x, y in zip(links["a"], links["b"])], dtype=bool)
    slow = links[is_slow].sort_values("rtt").reset_index(drop=True)
    fast = links[~is_slow & links["rtt"].notna().to_numpy()].sort_values("rtt").reset_index(drop=True)
    if fast.empty:
        return None
    return SlowGroups(links, fast, slow, "ACK round-trip p90 on every connection", True, queued, drops)


@dataclass
class SlowBlame:
    """Whom slow_link blames: ``ranks`` and their ``peers`` on the slow links, ``who`` in
    words, ``leaning`` (:func:`_leaning_end`) when one end of a single slow link is the more
    likely."""

    ranks: list[int]
    peers: list[int]
    who: str
    leaning: tuple | None


def _slow_blame(directory, slow_links: list[tuple[int, int]], fast: pd.DataFrame) -> SlowBlame:
    """One slow link: both its ends (or the end its other links lean to); several: the rank
    they share, else every rank on them."""
    common = set(slow_links[0])
    for lk in slow_links[1:]:
        common &= set(lk)
    leaning = None
    if len(slow_links) == 1:
        blamed = sorted(slow_links[0])
        leaning = _leaning_end(slow_links[0], fast)
    elif common:
        blamed = sorted(common)
    else:
        blamed = sorted({r for lk in slow_links for r in lk})
    peers = sorted({r for lk in slow_links for r in lk} - set(blamed))
    who = " or ".join(label(directory, r) for r in blamed) if len(blamed) <= 2 else ranks_text(blamed)
    if len(slow_links) == 1:
        who += ", the link between them"
    if leaning is not None:
        end, other, mine, theirs = leaning
        # one link stands out, and one of its ends has its other connections queueing too:
        # a NIC, cable or switch port carries all of a host's connections, so that end it is
        blamed, peers = [end], [other]
        who = (f"{label(directory, end)} (more likely than rank {other}: its other links' RTT p99 is "
               f"{_us(mine)} vs {_us(theirs)} on rank {other}'s)")
    return SlowBlame(blamed, peers, who, leaning)


@dataclass
class QueueCost:
    """What the slow links' queue cost the job: ``imp`` (:class:`~.impact.Impact`), the
    severity's ``ceiling``, the sentence's ``text``, when the first collective paid it
    (``first_paid``), the collectives' p10/p50/p90 and the queue's ``share`` of a collective's
    p50 (None without MIN_BASELINE completed collectives)."""

    imp: Impact
    ceiling: str = "info"
    text: str = ""
    first_paid: int | None = None
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    share: float | None = None


def _rate_cost(ctx: Context, cost: QueueCost, done: pd.DataFrame, slow_links) -> float:
    """The share of the collective time the slow links' rate cost (:func:`.bottleneck.transfer_excess`),
    put in ``cost`` when above what it says already; 0 when the rates show no bottleneck."""
    extra = transfer_excess(ctx, done, slow_links, BULK_SHARE)
    total = cost.imp.total_ns
    if extra is None or total <= 0 or not extra.any():
        return 0.0
    share = min(1.0, float(extra.sum()) / total)
    if share > cost.imp.share:
        slow_bps, fast_bps = link_rates(ctx, slow_links, BULK_SHARE)
        cost.imp = Impact(share, float(extra.sum()), total, int((extra > 0).sum()))
        cost.text += (f"; its rate ({slow_bps / 1e6:.0f} Mbit/s while busy vs {fast_bps / 1e6:.0f} on the other "
                      f"links) made {int((extra > 0).sum())} collective(s) that cross it take at least "
                      f"{ms(float(extra.sum()))} longer in all")
    return share


def _history_cost(ctx: Context, cost: QueueCost, done: pd.DataFrame) -> float:
    """The share of the collective time that is the slowdown since before the capture, where the
    Flight Recorder's ring reaches back before it began: per op, the median ``duration_ms`` of
    its entries created before the first capture's start against those created after, for the op
    with the most entries on both sides; 0 without both, or when the later median is under
    ``SLOW_FACTOR`` times the earlier. Put in ``cost`` (with its sentence) when above what it
    says already: a capture started after the link slowed down has no fast collective of its
    own, but the job's ring buffer remembers them."""
    fe = ctx.model.tables.get("fr_entries")
    cap0 = capture_start_ns(ctx.model)
    if fe is None or fe.empty or cap0 is None or cost.imp.total_ns <= 0:
        return 0.0
    d = pd.to_numeric(fe["duration_ms"], errors="coerce") * 1e6
    t = pd.to_numeric(fe["time_created_ns"], errors="coerce")
    ok = (d > 0) & (t > 1e18)
    f = pd.DataFrame({"op": fe["profiling_name"].astype("string"), "dur": d, "after": t >= cap0})[ok.to_numpy(bool)]
    if f.empty:
        return 0.0
    n = f.groupby(["op", "after"]).size().unstack(fill_value=0)
    if True not in n or False not in n:
        return 0.0
    both = n[(n[True] >= MIN_BASELINE) & (n[False] >= MIN_BASELINE)]
    if both.empty:
        return 0.0
    op = str(both.min(axis=1).idxmax())
    g = f[f["op"] == op]
    before, during = float(g.loc[~g["after"], "dur"].median()), float(g.loc[g["after"], "dur"].median())
    if during < SLOW_FACTOR * max(before, 1.0):
        return 0.0
    share = 1.0 - before / during
    if share > cost.imp.share:
        cost.imp = Impact(share, share * cost.imp.total_ns, cost.imp.total_ns, len(done))
        cost.text += (f"; the Flight Recorder's {op} took {ms(before)} (median) before the capture began and "
                      f"{ms(during)} during it: {share:.0%} of each collective's time is the slowdown")
    return share


def _queue_cost(ctx: Context, lo: float, base: float, ratio: float, slow_links=()) -> QueueCost:
    """The cost of a queue of ``lo`` against ``base`` (the other links' RTT; ``ratio``: lo over
    base) to the job's completed collectives; ``slow_links``: its links, (low rank, high rank)."""
    w = collective_windows(ctx)
    done = w[w["complete"]].reset_index(drop=True)
    dur = done["duration_ns"].to_numpy(dtype=np.float64)
    cost = QueueCost(Impact(0.0, 0.0, float(np.nansum(dur)), 0))
    if len(dur) < MIN_BASELINE:
        return cost
    p10, p50, p90 = (float(x) for x in np.quantile(dur, [0.1, 0.5, 0.9]))
    cost.p10, cost.p50, cost.p90 = p10, p50, p90
    cost.text = f"; collectives p50 {ms(p50)}, p90 {ms(p90)} vs {ms(p10)} at the fastest decile"
    spread = p90 / max(p10, 1.0)
    # the collectives that paid the queue: SLOW_FACTOR times their class's fastest decile
    # (no collective is known clean of a queue: the fastest stand in for clean ones)
    paid = dur > SLOW_FACTOR * clean_baselines(done, np.zeros(len(done), dtype=bool))
    cost.imp = impact(done, paid, ~paid)
    if paid.any():
        cost.first_paid = int(done.loc[paid, "t0"].min())
    # A capture that started after the link slowed down has no fast collectives to compare
    # with: every collective crosses the bottleneck. The queueing delay itself (its RTT
    # above the other links') is then the lower bound of what each collective pays.
    share = cost.share = min(1.0, (lo - base) / max(p50, 1.0))
    if spread < SLOW_FACTOR and share >= QUEUE_SHARE:
        cost.text = (f"; its queue adds at least {_us(lo - base)} per round trip, {share:.0%} of a "
                     f"collective's p50 ({ms(p50)})")
        if share > cost.imp.share:
            cost.imp = Impact(share, share * cost.imp.total_ns, cost.imp.total_ns, len(dur))
    # ... and a link slow of rate costs each collective more than a round trip: the time its
    # bytes take longer over it (forensics/findings/bottleneck.py)
    rate_share = _rate_cost(ctx, cost, done, slow_links) if spread < SLOW_FACTOR else 0.0
    # ... or, where the Flight Recorder remembers collectives from before the capture, what they took then
    if spread < SLOW_FACTOR:
        rate_share = max(rate_share, _history_cost(ctx, cost, done))
    # the job paid for it: collectives spread out, clearly, or somewhat behind a very clear queue
    if spread >= SLOW_FACTOR or (ratio >= CLEAR_RTT_RATIO and spread >= 1.5) \
            or p50 >= ctx.options.slow_ms * 1e6 or (ratio >= CLEAR_RTT_RATIO and max(share, rate_share) >= QUEUE_SHARE):
        cost.ceiling = "error"
    return cost


def _slow_link_summary(ctx, g: SlowGroups, blame: SlowBlame, slow_links, base: float, cost: QueueCost,
                       n_drops: int) -> str:
    """slow_link's summary: who, the RTT of the slow links against the others', with or
    without drops, and what the queue cost."""
    slow, fast = g.slow, g.fast
    medians = ""
    if slow["p50"].notna().any() and fast["p50"].notna().any():
        m_slow, m_fast = float(slow["p50"].median()), float(fast["p50"].median())
        # a queue at a bursty bottleneck lifts the tail alone; a standing one the median too
        alike = "alike: " if m_slow < 2 * max(m_fast, 1.0) else ""
        medians = f" (medians {alike}{_us(m_slow)} vs {_us(m_fast)})"
    if blame.leaning is not None:
        link_word, verb = f"its link to rank {blame.peers[0]}", "shows"
    elif len(blame.ranks) == 1:
        link_word, verb = f"its links (to {ranks_text(blame.peers)})", "show"
    else:
        link_word, verb = "the link", "shows"
    article = "an" if g.metric[0] in "AEIOU" else "a"
    if bool(slow["lossy"].any()):
        # drops and a queue on one link: the queue decides (a rate plateau with a rising RTT is a
        # slow or congested link that drops at its queue; loss on a fast path keeps a flat RTT)
        how = (f"with {n_drops} lost or retransmitted segments: it drops at its queue, a slow or congested link "
               f"rather than loss (decided by the queue: {_queue_text(ctx, slow_links)}; loss on a fast path "
               "keeps a flat RTT)")
    else:
        how = "without retransmissions: a slow or congested path that queues instead of dropping"
    rtt_txt = _us_range(float(slow["rtt"].min()), float(slow["rtt"].max()))
    return (f"{blame.who}: {link_word} {verb} {article} {g.metric} of {rtt_txt} vs {_us(base)} on the other "
            f"links{medians}, {how}{cost.text}; it explains {cost.imp.text()}.")


def _slow_link_rows(links: pd.DataFrame, slow_links) -> list[dict]:
    """slow_link's evidence: one row per link, the slowest first (what :func:`slow_link_sql` returns)."""
    return [{"rank_a": int(r.a), "rank_b": int(r.b), "rtt_us": round(float(r.rtt) / 1e3, 1),
             "rtt_p50_us": None if pd.isna(r.p50) else round(float(r.p50) / 1e3, 1),
             "connections": int(r.flows), "lossy": bool(r.lossy), "slow": (int(r.a), int(r.b)) in slow_links}
            for r in links.sort_values(["rtt", "a", "b"], ascending=[False, True, True], kind="stable")
            .head(MAX_EVIDENCE).itertuples(index=False)
            if pd.notna(r.rtt)]


@detector("slow_link", kinds=KINDS)
def slow_link(ctx: Context) -> list[Finding]:
    """A link (or one endpoint's links) whose RTT stands far above the others' (:func:`slow_groups`),
    blamed (:func:`_slow_blame`) and weighed by what its queue cost the job (:func:`_queue_cost`)."""
    g = slow_groups(ctx)
    if g is None:
        return lone_slow_link(ctx)
    fast, slow, metric = g.fast, g.slow, g.metric
    base = float(np.median(fast["rtt"]))
    slow_links = [(int(x), int(y)) for x, y in zip(slow["a"], slow["b"])]
    directory = rank_directory(ctx)
    blame = _slow_blame(directory, slow_links, fast)
    blamed, leaning = blame.ranks, blame.leaning
    lo, hi = float(slow["rtt"].min()), float(slow["rtt"].max())
    ratio = float(slow["rtt"].min()) / max(base, 1.0)
    cost = _queue_cost(ctx, lo, base, ratio, [(min(a, b), max(a, b)) for a, b in slow_links])
    imp = cost.imp
    # a host starved of CPU ACKs late: the round-trip of its links grows on the host, not the wire
    starved, starved_details = starved_ends(ctx, slow_links)
    severity = impact_severity(imp.share, imp.slow, max(cost.ceiling, "warning" if starved else "error",
                                                        key=SEVERITY_RANK.__getitem__))
    n_drops = sum(g.drops.get(lk, 0) for lk in slow_links)
    summary = _slow_link_summary(ctx, g, blame, slow_links, base, cost, n_drops)
    if starved:
        summary = summary[:-1] + f"; {starved}."
    # the slow flag: at or above the gap between the fast and the slow group (and, on the RTT
    # tail, not lossy unless the link queues: then its drops are the queue's)
    cut = (float(fast["rtt"].max()) + float(slow["rtt"].min())) / 2
    sql = slow_link_sql(metric.startswith("ACK"), cut, queue=g.by_queue, queued=g.queued)
    confidence = min(0.9, 0.5 + 0.1 * np.log10(max(ratio, 1.0))
                     + (0.15 if len(blamed) == 1 and leaning is None else 0.05 if leaning else 0.0))
    confidence *= STARVED_CONFIDENCE if starved else 1.0
    first_paid = cost.first_paid
    return [Finding(kind="slow_link", severity=severity, confidence=confidence, summary=summary, ranks=blamed,
                    headline=(f"Slow link at {{who}}: {metric} {_us_range(lo, hi)} vs {_us(base)} on the other "
                              f"links; it explains {imp.text()}"),
                    since_ns=first_paid, since_source="tracer: the first collective that paid its queue"
                    if first_paid is not None else None, since_precision_ns=1_000_000 if first_paid else None,
                    hosts=hosts_of(directory, blamed), peer_ranks=blame.peers,
                    links=[{"rank": x, "peer_rank": y, "rtt_us": round(float(r) / 1e3, 1),
                            "saddr": directory[x].addr if x in directory else None,
                            "daddr": directory[y].addr if y in directory else None}
                           for (x, y), r in zip(slow_links, slow["rtt"])],
                    evidence=_slow_link_rows(g.links, slow_links), sql=sql,
                    action=_slow_link_action(directory, blamed, slow_links, leaning),
                    score=imp.excess_ns / 1e9, impact_share=imp.share,
                    details={"metric": metric, "rtt_baseline_ns": base, "slow_links": slow_links,
                             "rtt_slow_ns": [float(x) for x in slow["rtt"]],
                             "collective_p10_ns": cost.p10, "collective_p50_ns": cost.p50,
                             "collective_p90_ns": cost.p90, "queue_share": cost.share, "slow_collectives": imp.slow,
                             "excess_ns": imp.excess_ns, "collective_time_ns": imp.total_ns,
                             "drops_at_queue": bool(slow["lossy"].any()), "drops": n_drops,
                             **({"cpu_starved": starved_details} if starved else {})})]


LONE_CONFIDENCE = 0.6      # a link judged against its own floor, with no other link to compare with


def _lone_units(directory, q: pd.DataFrame, links: pd.DataFrame) -> tuple[pd.Series, str, int]:
    """What lone_slow_link compares: (one label per row of ``q``, ``"hosts"`` or ``"ranks"``,
    how many units the job's links make, those of ``q`` and of ``links`` together). A unit is
    the pair of hosts a link joins where the directory places every link's two ends
    (``"hosts"``), else the rank pair itself (``"ranks"``). A two-node job of eight ranks has
    several rank links, all through the one path between its two hosts: they share its queue
    and cannot stand for each other's healthy baseline, so they are judged as one path,
    against its floor. A link inside one host crosses no NIC: it stays a unit of its own."""
    ends = pd.concat([q[["a", "b"]], links[["a", "b"]]], ignore_index=True) if len(links) else q[["a", "b"]]

    def host(r):
        info = directory.get(int(r))
        return info.host if info is not None else None
    a, b = ends["a"].astype("int64").tolist(), ends["b"].astype("int64").tolist()
    hosts = [(host(x), host(y)) for x, y in zip(a, b)]
    if all(x is not None and y is not None for x, y in hosts):
        labels, by = [f"{min(x, y)}|{max(x, y)}" if x != y else f"{r}|{p}@{x}"
                      for (x, y), r, p in zip(hosts, a, b)], "hosts"
    else:
        labels, by = [f"{r}|{p}" for r, p in zip(a, b)], "ranks"
    return pd.Series(labels[:len(q)], index=q.index), by, len(set(labels))


def lone_slow_link(ctx: Context) -> list[Finding]:
    """slow_link where there are too few links to compare (fewer than MIN_LINKS: a job of two
    ranks has one, a job on two hosts has one path however many ranks it runs, see
    :func:`_lone_units`): the link (or the path between two hosts) whose bulk connections hold
    a standing queue, their smoothed RTT LONE_QUEUE_MIN_NS above the path's floor (the
    kernel's minimum RTT) on LONE_MIN_CONNECTIONS of them (:func:`.link_delays.lone_link_queues`,
    a path's figures the median of its rank links'), weighed by what the queue cost the job
    (:func:`_queue_cost`: collectives spread out, the queue's share of one, the Flight
    Recorder's durations from before the capture). Both ends are named: one link cannot say
    which end's port is slow. A warning at most where an end's host was starved of CPU (late
    ACKs lift the RTT on the host). [] when the job has links enough to compare (the comparison
    said no) or no link queues."""
    links, _ = link_rtts(ctx)
    q = lone_link_queues(ctx)
    if q.empty:
        return []
    directory = rank_directory(ctx)
    unit, by, n_units = _lone_units(directory, q, links)
    if n_units >= MIN_LINKS:
        return []
    q = q.assign(unit=unit)
    per = q.groupby("unit").agg(srtt=("srtt", "median"), floor=("floor", "median"), queue=("queue", "median"),
                                connections=("connections", "sum"))
    hot = per[(per["queue"] >= LONE_QUEUE_MIN_NS) & (per["connections"] >= LONE_MIN_CONNECTIONS)]
    if hot.empty:
        return []
    top = hot.sort_values("queue", kind="stable").index[-1]
    x = hot.loc[top]
    mine = q[q["unit"] == top].sort_values(["queue", "a", "b"], ascending=[False, True, True], kind="stable")
    pair_links = [(int(a), int(b)) for a, b in zip(mine["a"], mine["b"])]
    ranks = list(dict.fromkeys(r for lk in pair_links for r in lk))
    srtt, floor, queue = float(x["srtt"]), float(x["floor"]), float(x["queue"])
    cost = _queue_cost(ctx, srtt, floor, srtt / max(floor, 1.0), pair_links)
    imp = cost.imp
    starved, starved_details = starved_ends(ctx, pair_links)
    severity = impact_severity(imp.share, imp.slow, max(cost.ceiling, "warning" if starved else "error",
                                                        key=SEVERITY_RANK.__getitem__))
    drops_by_link = link_drops(ctx)
    n_drops = sum(drops_by_link.get(lk, 0) for lk in pair_links)
    drops = (f", with {n_drops} lost or retransmitted segments (dropped at its queue)" if n_drops else
             ", without retransmissions")
    if by == "hosts" and len(pair_links) > 1:
        h1, h2 = top.split("|")
        who = (who_text(directory, ranks) + f": the path between {h1} and {h2}, its {len(pair_links)} rank links")
        few = ("the only pair of hosts the job's links join" if n_units == 1
               else f"one of the {n_units} pairs of hosts the job's links join, too few to compare")
        what = "path"
    else:
        who = who_text(directory, ranks) + ", the link between them"
        few = ("the job's only link" if n_units == 1
               else f"one of the job's {n_units} {'host paths' if by == 'hosts' else 'links'}, too few to compare")
        what = "link"
    summary = (f"{who}: {few}, judged against its own floor: its "
               f"{int(x['connections'])} bulk connections hold a standing queue, smoothed RTT {ms(srtt)} (ss) "
               f"against a floor of {_us(floor)} (the kernel's minimum RTT), {ms(queue)} of queue{drops}: a slow "
               f"or congested path{cost.text}; it explains {imp.text()}.")
    if starved:
        summary = summary[:-1] + f"; {starved}."
    first_paid = cost.first_paid
    return [Finding(kind="slow_link", severity=severity,
                    confidence=LONE_CONFIDENCE * (STARVED_CONFIDENCE if starved else 1.0), summary=summary,
                    confidence_note=f"lower: one {what}, judged against its own floor, not against other links",
                    ranks=ranks,
                    headline=(f"Slow {what} at {{who}}: a standing queue of {ms(queue)} (RTT {ms(srtt)} vs a floor "
                              f"of {_us(floor)}); it explains {imp.text()}"),
                    since_ns=first_paid, since_source="tracer: the first collective that paid its queue"
                    if first_paid is not None else None, since_precision_ns=1_000_000 if first_paid else None,
                    hosts=hosts_of(directory, ranks),
                    links=[{"rank": a, "peer_rank": b, "rtt_us": round(float(r) / 1e3, 1),
                            "saddr": directory[a].addr if a in directory else None,
                            "daddr": directory[b].addr if b in directory else None}
                           for (a, b), r in zip(pair_links, mine["srtt"])],
                    evidence=[{"rank_a": int(r.a), "rank_b": int(r.b), "srtt_us": round(float(r.srtt) / 1e3, 1),
                               "floor_us": round(float(r.floor) / 1e3, 1),
                               "queue_us": round(float(r.queue) / 1e3, 1), "connections": int(r.connections),
                               "queueing": bool(r.queue >= LONE_QUEUE_MIN_NS
                                                and r.connections >= LONE_MIN_CONNECTIONS)}
                              for r in q.sort_values(["queue", "a", "b"], ascending=[False, True, True],
                                                     kind="stable").itertuples(index=False)],
                    sql=lone_link_sql(), action=_slow_link_action(directory, ranks, pair_links, None),
                    score=imp.excess_ns / 1e9, impact_share=imp.share,
                    details={"metric": "smoothed RTT over its floor (ss)", "rtt_baseline_ns": floor,
                             "slow_links": pair_links, "rtt_slow_ns": [float(v) for v in mine["srtt"]],
                             "queue_ns": queue, "judged_by": by,
                             "collective_p10_ns": cost.p10, "collective_p50_ns": cost.p50,
                             "collective_p90_ns": cost.p90, "queue_share": cost.share, "slow_collectives": imp.slow,
                             "excess_ns": imp.excess_ns, "collective_time_ns": imp.total_ns, "drops": n_drops,
                             **({"cpu_starved": starved_details} if starved else {})})]


def slow_link_sql(ack_rtt: bool, cut_ns: float, queue: bool = False, queued=()) -> str:
    """The SQL of slow_link's evidence: one row per link with the RTT statistic
    (:func:`link_rtts`, or with ``queue`` :func:`link_queue_delays`), whether the link is
    lossy (:func:`link_drops`) and whether it is one of the slow links (RTT above ``cut_ns``;
    without ``queue`` only a link that is not lossy, it would belong to network_loss, unless
    it is one of the ``queued`` rank pairs, whose drops are its queue's)."""
    if queue:
        ft = ("SELECT * FROM flow_timing WHERE rank IS NOT NULL AND peer_rank IS NOT NULL AND rtt_p90_ns IS NOT NULL "
              f"AND rank <> peer_rank AND rtt_samples >= {sql_int(MIN_RTT_SAMPLES)}")
        clean = ("CASE WHEN rtt_clean_samples IS NULL THEN rtt_p{q}_ns ELSE rtt_clean_p{q}_ns END")
        links = (f"SELECT rank_a, rank_b, min(q) AS rtt, median(p50) AS p50, count(*) AS connections FROM ("
                 f"SELECT saddr, sport, daddr, dport, max({clean.format(q=90)}) AS q, "
                 f"median({clean.format(q=50)}) AS p50, "
                 "any_value(least(rank, peer_rank)) AS rank_a, any_value(greatest(rank, peer_rank)) AS rank_b "
                 f"FROM ({ft}) WHERE data_bytes >= {BULK_SHARE!r} * (SELECT quantile_cont(data_bytes, 0.9) "
                 f"FROM ({ft})) AND (rtt_clean_samples IS NULL OR rtt_clean_samples >= {sql_int(MIN_RTT_SAMPLES)}) "
                 "GROUP BY saddr, sport, daddr, dport) GROUP BY ALL")
    elif ack_rtt:
        # per connection (both directions, every capture point) its largest p99; per link the
        # second largest over its connections (:func:`link_rtts`)
        ends = "CAST(saddr AS VARCHAR) || ':' || sport", "CAST(daddr AS VARCHAR) || ':' || dport"
        links = ("SELECT rank_a, rank_b, list_sort(list(p99), 'DESC')[least(2, count(*))] AS rtt, "
                 "list_aggregate(flatten(list(p50s)), 'median') AS p50, sum(n) AS connections FROM ("
                 "SELECT least(rank, peer_rank) AS rank_a, greatest(rank, peer_rank) AS rank_b, "
                 f"least({ends[0]}, {ends[1]}) AS lo, greatest({ends[0]}, {ends[1]}) AS hi, "
                 "max(rtt_p99_ns) AS p99, list(rtt_p50_ns) AS p50s, count(*) AS n FROM flow_timing "
                 "WHERE rank IS NOT NULL AND peer_rank IS NOT NULL AND rtt_p99_ns IS NOT NULL AND rank <> peer_rank "
                 f"AND rtt_samples >= {sql_int(MIN_RTT_SAMPLES)} GROUP BY ALL) GROUP BY ALL")
    else:
        links = ("SELECT least(rank, peer_rank) AS rank_a, greatest(rank, peer_rank) AS rank_b, "
                 "median(rtt_mean_ns) AS rtt, CAST(NULL AS DOUBLE) AS p50, count(*) AS connections FROM flows "
                 "WHERE rank IS NOT NULL AND peer_rank IS NOT NULL AND rtt_mean_ns IS NOT NULL "
                 "AND rank <> peer_rank GROUP BY ALL")
    on_queue = " OR ".join(f"(rank_a = {sql_int(a)} AND rank_b = {sql_int(b)})" for a, b in sorted(queued)) or "false"
    return f"""WITH links AS ({links}),
loss AS (
  SELECT least(sender_rank, receiver_rank) AS rank_a, greatest(sender_rank, receiver_rank) AS rank_b, sum(n) AS n
  FROM {dedup_sql(trouble_sql(DATA_LOSS_CLASSES))} GROUP BY ALL
),
retx AS (
  SELECT least(rank, peer_rank) AS rank_a, greatest(rank, peer_rank) AS rank_b, max({FLOW_DATA_LOST_SQL}) AS n
  FROM flows WHERE rank IS NOT NULL AND peer_rank IS NOT NULL GROUP BY ALL
),
l AS (
  SELECT l.*, coalesce(loss.n >= {sql_int(MIN_LOSS_EVENTS)}, false)
              OR coalesce(retx.n >= {sql_int(MIN_LOSS_EVENTS)}, false) AS lossy
  FROM links l LEFT JOIN loss USING (rank_a, rank_b) LEFT JOIN retx USING (rank_a, rank_b)
)
SELECT rank_a, rank_b, round(rtt / 1e3, 1) AS rtt_us, round(p50 / 1e3, 1) AS rtt_p50_us, connections, lossy,
       {'' if queue else f'(NOT lossy OR {on_queue}) AND '}rtt >= {sql_int(round(cut_ns))} AS slow
FROM l ORDER BY rtt DESC, rank_a, rank_b LIMIT {sql_int(MAX_EVIDENCE)}"""


def link_drops(ctx) -> dict[tuple[int, int], int]:
    """Per link (a, b): its lost or retransmitted data (DATA_LOSS_CLASSES; duplicate ACKs and
    spurious retransmissions are not), deduplicated across sources, or the flows' counters of
    it (FLOW_DATA_LOST_SQL) when they say more."""
    out: dict[tuple[int, int], int] = {}
    ev = trouble_events(ctx, classes=DATA_LOSS_CLASSES)
    if len(ev):
        for (a, b), n in dedup_counts(ev).groupby(["a", "b"])["n"].sum().items():
            out[(int(a), int(b))] = int(n)
    fl = ctx.table("flows").dropna(subset=["rank", "peer_rank"])
    if len(fl):
        per = fl.assign(a=np.minimum(fl["rank"], fl["peer_rank"]).astype("int64"),
                        b=np.maximum(fl["rank"], fl["peer_rank"]).astype("int64"),
                        lost=flow_data_lost(fl)).groupby(["a", "b"])["lost"].max()
        for (a, b), n in per.items():
            out[(int(a), int(b))] = max(out.get((int(a), int(b)), 0), int(n))
    return out


def _queue_text(ctx, slow_links) -> str:
    """The queue on ``slow_links``: every data connection's ACK round-trip p90 against the other
    links' (:func:`link_queue_delays`), and the rate its connections delivered while busy (a
    plateau at the bottleneck's pace)."""
    q = link_queue_delays(ctx)
    mine = q[[(int(a), int(b)) in set(slow_links) for a, b in zip(q["a"], q["b"])]] if len(q) else q
    rest = q.drop(index=mine.index) if len(q) else q
    parts = []
    if len(mine) and len(rest):
        parts.append(f"ACK round-trip p90 {_us(float(mine['q'].min()))} on every connection vs "
                     f"{_us(float(rest['q'].median()))} on the other links")
    t = ctx.model.tables.get("flow_timing")
    if t is not None and len(t) and "busy_rate_bps" in t.columns:
        t = t.dropna(subset=["rank", "peer_rank", "busy_rate_bps"])
        on = [(min(int(r), int(p)), max(int(r), int(p))) in set(slow_links) for r, p in zip(t["rank"], t["peer_rank"])]
        vol = pd.to_numeric(t["data_bytes"], errors="coerce").fillna(0)
        bulk = (vol >= BULK_SHARE * float(vol.quantile(0.9))).to_numpy() if len(t) else np.zeros(0, dtype=bool)
        rate = t.loc[np.asarray(on, dtype=bool) & bulk, "busy_rate_bps"]
        if len(rate):
            parts.append(f"its connections delivering a plateau of {float(rate.median()) / 1e6:.0f} Mbit/s while busy")
    return ", ".join(parts) or "its RTT rose with the queue"


def _slow_link_action(directory, blamed: list[int], slow_links: list[tuple[int, int]], leaning) -> str:
    """What to check, phrased from the labels (one end, both ends of one link, or several ranks)."""
    if leaning is not None or len(blamed) == 1:
        target = f"the NIC and switch port of {label(directory, blamed[0])}"
        where = f"across its link to rank {leaning[1]} alone" if leaning is not None else "across its links alone"
    elif len(slow_links) == 1:
        a, b = slow_links[0]
        target = (f"the NICs and switch ports at both ends of the link between {label(directory, a)} and "
                  f"{label(directory, b)}")
        where = "across that link alone"
    else:
        target = f"the NICs and switch ports of {ranks_text(blamed)}"
        where = "across those links alone"
    return (f"Check the negotiated speed and queueing of {target} (ethtool speed/duplex, tc qdisc, switch port "
            f"utilisation and pause frames); run nccl-tests {where}.")


LEAN_RATIO = 2.0    # one end's other links queue this much more than the other end's


def _leaning_end(link: tuple[int, int], fast: pd.DataFrame):
    """For a single slow link: the end whose *other* links (the fast group's) also show a
    longer queue than the other end's, as (end, other end, its other links' RTT, the other
    end's), or None when the evidence cannot separate them."""
    def others(r: int):
        v = fast.loc[(fast["a"] == r) | (fast["b"] == r), "rtt"]
        return float(v.max()) if len(v) else None
    a, b = link
    ra, rb = others(a), others(b)
    if ra is None or rb is None:
        return None
    if ra >= LEAN_RATIO * rb:
        return a, b, ra, rb
    if rb >= LEAN_RATIO * ra:
        return b, a, rb, ra
    return None


def _us(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms" if ns >= 1e6 else f"{ns / 1e3:.0f} µs"


def _us_range(lo: float, hi: float) -> str:
    if hi <= lo * 1.05:
        return _us(hi)
    if (lo >= 1e6) == (hi >= 1e6):   # one unit for both ends
        a, b = _us(lo).split(" "), _us(hi).split(" ")
        return f"{a[0]}-{b[0]} {b[1]}"
    return f"{_us(lo)}-{_us(hi)}"
