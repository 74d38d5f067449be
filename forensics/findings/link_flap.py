"""``link_flap``: one rank's link went down for seconds and came back.

A dead link shows in TCP as retransmission timeouts: the sender resends the same data after
its RTO, then after twice that, and so on (RTO backoff), with nothing answered in between. A
link that comes back ends the backoff: the next timer's resend gets through, and collectives
complete again. Random loss looks different: fast retransmits milliseconds apart, repaired
within a round trip. Rule, per connection and direction (the tracer's ``tcp_retransmit_skb``
rows and the packets' ``retransmission`` verdicts, each on its own, the longer chain of a
connection kept): a *backoff chain* is at least
``MIN_CHAIN`` resends (one fewer when its first gap is ``DEEP_GAP_NS`` or more: a capture
that began during the outage sees the backoff from deep in it), the first gap at least ``MIN_GAP_NS``, each next one ``BACKOFF`` times
the one before (about twice), spanning ``MIN_SPAN_NS`` or more. At least ``MIN_CONNECTIONS``
chains that overlap in time and share one rank blame that rank's link (one chain alone: both of its
ends are candidates; the rank on more chains wins). Ranks on as many chains (each other's only
peer: a two-rank job) are told apart by their own captures: a host drops what it sends while its
link has no carrier before tcpdump's capture point, so the end whose tracer saw its kernel resend
and whose own tcpdump saw (almost) none of those resends leave had the link that went down; with
nothing to tell them apart, both ends are named: the link between them. A chain during which one of its ends completed
a collective is no outage: data crossed that rank's link meanwhile (random loss on a lightly used
connection spaces its resends seconds apart, by chance about doubling). Packets' verdicts from
different captures are never joined into one chain (each host's pcap sees its own resends), nor
resends of different segments (the ``packets`` table's ``seq_raw``: a dead link's timer resends
the one segment at the head of the queue). The link came back when a collective completed
after the last resend of the episode; a link still down at the end is a hang, which the hang
detectors report, so no finding here.

Layer ``transport``: the collective was enqueued everywhere and the transport stalled.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..coerce import cell_ints
from .base import STOPS_JOB_SCORE, Context, Finding, detector
from ..wording import ms, ranks_text
from .ranks import label, rank_directory

MIN_CHAIN = 4                  # resends of one connection in backoff (3 in a row lost: not random loss)
MIN_GAP_NS = 150_000_000       # Linux's RTO is 200 ms at least (TCP_RTO_MIN)
BACKOFF = (1.6, 2.6)           # each gap about twice the one before (timer jitter: not exactly 2)
MIN_SPAN_NS = 1_000_000_000    # a chain spans a second at least (4 resends: 0.4 + 0.8 + 1.6 s)
# a chain first seen with a gap this long was already deep in its backoff (three timeouts, 1.4 s
# of silence, before it): a capture started during the outage; three resends then suffice
DEEP_GAP_NS = 1_500_000_000
EDGE_NS = 50_000_000          # a completion this close to a chain's first or last resend is not inside it
MIN_CONNECTIONS = 2            # a link's outage stalls every connection on it at once
# a rank's own tcpdump saw at most this share of the resends its kernel made: they never left
# its host (a link without carrier: the kernel drops what it sends before the capture point)
DARK_SHARE = 0.25
COLS = ["timestamp_ns", "event", "source", "saddr", "sport", "daddr", "dport", "rank", "peer_rank"]


def backoff_chains(rt: pd.DataFrame) -> pd.DataFrame:
    """The RTO backoff chains of ``rt`` (retransmission rows of one source): one row per
    chain with the connection (saddr, sport, daddr, dport, rank, peer_rank), ``t0``/``t1``
    (first and last resend), ``n`` resends and ``gaps_ns`` (the gaps between them)."""
    out = []
    if rt.empty:
        return pd.DataFrame(columns=["saddr", "sport", "daddr", "dport", "rank", "peer_rank", "t0", "t1", "n",
                                     "gaps_ns"])
    rt = rt.sort_values("timestamp_ns", kind="stable")
    # one capture's view at a time (two hosts' pcaps interleaved make gaps neither saw) and, where
    # the packets say which segment each resend carried, one segment's resends (a dead link resends
    # the same head segment after every timeout; random loss resends other ones)
    by = ["saddr", "sport", "daddr", "dport"] + [c for c in ("host", "seq_raw") if c in rt.columns]
    for key, g in rt.groupby(by, sort=False, dropna=False):
        t = pd.to_numeric(g["timestamp_ns"], errors="coerce").dropna().astype("int64").to_numpy()
        if len(t) < MIN_CHAIN - 1:
            continue
        gaps = np.diff(t)
        i = 0
        while i < len(gaps):
            if gaps[i] < MIN_GAP_NS:
                i += 1
                continue
            j = i + 1                 # gaps i..j-1: each about BACKOFF times the one before
            while j < len(gaps) and BACKOFF[0] * gaps[j - 1] <= gaps[j] <= BACKOFF[1] * gaps[j - 1]:
                j += 1
            n = j - i + 1             # resends t[i]..t[j]
            deep = n >= MIN_CHAIN - 1 and gaps[i] >= DEEP_GAP_NS   # seen from deep in the backoff
            if (n >= MIN_CHAIN or deep) and t[j] - t[i] >= MIN_SPAN_NS:
                rank = pd.to_numeric(g["rank"], errors="coerce").dropna()
                peer = pd.to_numeric(g["peer_rank"], errors="coerce").dropna()
                out.append({"saddr": key[0], "sport": key[1], "daddr": key[2], "dport": key[3],
                            "rank": int(rank.iloc[0]) if len(rank) else None,
                            "peer_rank": int(peer.iloc[0]) if len(peer) else None,
                            "t0": int(t[i]), "t1": int(t[j]), "n": n, "gaps_ns": [int(x) for x in gaps[i:j]]})
            i = j
    return pd.DataFrame(out)


def _completions(ctx: Context) -> dict[int, np.ndarray]:
    """Rank -> the sorted times its collectives of more than one rank completed (the
    ``collectives`` table's per-rank ``end_ns``): when each rank's link was carrying data."""
    c = ctx.model.tables.get("collectives")
    if c is None or c.empty or "ranks" not in c or "end_ns" not in c:
        return {}
    c = c[pd.to_numeric(c["nranks"], errors="coerce").fillna(0) > 1]
    out: dict[int, list[int]] = {}
    for ranks, ends in zip(c["ranks"], c["end_ns"]):
        if np.ndim(ranks) != 1 or np.ndim(ends) != 1:
            continue
        for r, e in zip(cell_ints(ranks), cell_ints(ends)):
            if r is not None and e is not None:
                out.setdefault(r, []).append(e)
    return {r: np.sort(np.asarray(v, dtype=np.int64)) for r, v in out.items()}


def _moved_during(done: dict[int, np.ndarray], ranks, t0: int, t1: int) -> bool:
    """Whether one of ``ranks`` completed a collective strictly inside (t0, t1), ``EDGE_NS``
    clear of both ends (clocks of two sources; the resend at t1 is the one that got through)."""
    for r in ranks:
        if r is None or pd.isna(r) or int(r) not in done:
            continue
        e = done[int(r)]
        i = np.searchsorted(e, t0 + EDGE_NS, side="right")
        if i < len(e) and e[i] < t1 - EDGE_NS:
            return True
    return False


def _with_segments(ctx: Context, rt: pd.DataFrame) -> pd.DataFrame:
    """``rt`` with ``seq_raw``: the sequence number each pcap resend carried, from the
    ``packets`` table's row of the same capture and frame (NA for the tracer's rows and where
    the packets do not say)."""
    p = ctx.model.tables.get("packets")
    keys = ["host", "capture", "frame"]
    if p is None or p.empty or not all(k in p and k in rt for k in keys) or "seq_raw" not in p:
        return rt
    seg = p[keys + ["seq_raw"]].drop_duplicates(keys)
    pcap = (rt["source"].eq("pcap") if "source" in rt else pd.Series(True, index=rt.index)).to_numpy(dtype=bool)
    # a left merge on unique keys keeps the left rows, in their order
    seq = rt.loc[pcap, keys].merge(seg, on=keys, how="left")["seq_raw"]
    col = pd.array([pd.NA] * len(rt), dtype="Int64")
    col[pcap] = pd.to_numeric(seq, errors="coerce").astype("Int64").to_numpy()
    return rt.assign(seq_raw=col)


def _owner_ranks(ctx: Context) -> dict[str, int]:
    """Address -> the rank owning it (rank_directory), to name a chain's ends."""
    return {info.addr: r for r, info in rank_directory(ctx).items() if getattr(info, "addr", None)}


def own_resends(ctx: Context, rt: pd.DataFrame, directory, ranks, t0: int, t1: int) -> dict[int, tuple[int, int]]:
    """Per rank of ``ranks``: (resends its kernel made from its address in [t0, t1], as its
    host's tracer saw them; how many of those its host's tcpdump saw leave: the packets'
    resends from that address on that host, between the first and the last of them). Only
    ranks whose host's tracer saw it resend there and whose tcpdump ran all that time
    (``capture_windows``): elsewhere nothing is known."""
    w = ctx.model.tables.get("capture_windows")
    if w is None or w.empty or "host" not in rt:
        return {}
    w = w[w["kind"] == "tcpdump"]
    ts = pd.to_numeric(rt["timestamp_ns"], errors="coerce")
    out = {}
    for r in ranks:
        addr = getattr(directory.get(r), "addr", None)
        if not addr:
            continue
        k = rt[(rt["event"] == "tcp_retransmit_skb") & (rt["saddr"] == addr) & ts.between(t0 - EDGE_NS, t1 + EDGE_NS)]
        if k.empty or k["host"].isna().all():
            continue
        host = k["host"].mode().iat[0]
        kt = pd.to_numeric(k.loc[k["host"] == host, "timestamp_ns"], errors="coerce")
        a, b = int(kt.min()), int(kt.max())
        ww = w[w["host"] == host]
        if not ((pd.to_numeric(ww["first_ns"], errors="coerce") <= a)
                & (pd.to_numeric(ww["last_ns"], errors="coerce") >= b)).any():
            continue
        seen = rt[(rt["event"] == "retransmission") & (rt["saddr"] == addr) & (rt["host"] == host)
                  & ts.between(a - EDGE_NS, b + EDGE_NS)]
        out[r] = (int(len(kt)), int(len(seen)))
    return out


def dark(counts: tuple[int, int]) -> bool:
    """Whether a rank's resends (:func:`own_resends`) never reached its wire: the kernel made
    ``MIN_CHAIN`` or more and its own tcpdump saw at most ``DARK_SHARE`` of them leave."""
    kernel, wire = counts
    return kernel >= MIN_CHAIN and wire <= DARK_SHARE * kernel


def whose_link(tied: list[int], own: dict[int, tuple[int, int]]) -> list[int]:
    """The rank(s) whose link the finding blames, of those on the most chains (``tied``):
    one alone is it; of several, the one whose own resends never reached its wire
    (:func:`dark`) while the others' did or are unknown; else, of two (each other's only
    peer: the connections of a two-rank job), both ends; else the lowest."""
    if len(tied) == 1:
        return tied
    out = [r for r in tied if r in own and dark(own[r])]
    if len(out) == 1:
        return out
    return tied if len(tied) == 2 else tied[:1]


def _ends_text(d, tied: list[int], blamed: list[int], own: dict[int, tuple[int, int]]) -> str:
    """The chain's step that says which of the ranks on the most stalled connections (``tied``,
    several) had the link that went down, and from what."""
    said = "; ".join(f"{label(d, r)}'s own capture saw {own[r][1]} of the {own[r][0]} resends its kernel made "
                     "leave its interface" for r in tied if r in own)
    if len(blamed) == 1:
        return (f"{said}: a host drops what it sends while its link has no carrier, before tcpdump sees it, "
                f"so the link that went down was {label(d, blamed[0])}'s")
    return ((said + ": " if said else "") + "nothing tells which end's link went down (the connections "
            "stalled alike at both ends): the link between them")


@detector("link_flap", kinds=("link_flap",))
def link_flap(ctx: Context) -> list[Finding]:
    t = ctx.model.tables.get("tcp_events")
    if t is None or t.empty:
        return []
    # each source on its own (the tracer may have attached seconds after tcpdump started: the
    # packets then hold more of the backoff); per connection the longer chain
    rt = _with_segments(ctx, t[t["event"].isin(("tcp_retransmit_skb", "retransmission"))])
    chains = pd.concat([backoff_chains(rt[rt["event"] == ev]) for ev in ("tcp_retransmit_skb", "retransmission")],
                       ignore_index=True)
    if chains.empty:
        return []
    chains = chains.sort_values("n", ascending=False, kind="stable").drop_duplicates(
        ["saddr", "sport", "daddr", "dport"]).reset_index(drop=True)
    addr_rank = _owner_ranks(ctx)
    ends = []
    for _, c in chains.iterrows():
        a = c["rank"] if c["rank"] is not None and not pd.isna(c["rank"]) else addr_rank.get(c["saddr"])
        b = c["peer_rank"] if c["peer_rank"] is not None and not pd.isna(c["peer_rank"]) else addr_rank.get(c["daddr"])
        ends.append((None if a is None else int(a), None if b is None else int(b)))
    chains = chains.assign(a=[e[0] for e in ends], b=[e[1] for e in ends])
    done = _completions(ctx)
    quiet = [not _moved_during(done, (a, b), int(t0), int(t1))
             for a, b, t0, t1 in zip(chains["a"], chains["b"], chains["t0"], chains["t1"])]
    chains = chains[quiet]
    if chains.empty:
        return []
    # one episode: the chains that overlap the earliest one's span
    chains = chains.sort_values("t0", kind="stable")
    first = chains.iloc[0]
    ep = chains[(chains["t0"] <= first["t1"]) & (chains["t1"] >= first["t0"])]
    if len(ep) < MIN_CONNECTIONS:
        return []
    votes: dict[int, int] = {}
    for a, b in zip(ep["a"], ep["b"]):
        for r in (a, b):
            if r is not None and not pd.isna(r):
                votes[int(r)] = votes.get(int(r), 0) + 1
    if not votes:
        return []
    top = max(votes.values())
    tied = sorted(r for r, v in votes.items() if v == top)
    # when the link was back: where the connections' chains end (a resend got through), their
    # median (one chain cut short by a missed event, or one whose backoff had grown longer and
    # stalled on past the link's return, does not move it)
    t0, t_up, t1 = int(ep["t0"].min()), int(np.median(ep["t1"].to_numpy(dtype=np.float64))), int(ep["t1"].max())
    c = ctx.model.tables.get("collectives")
    back_ns = None
    if c is not None and len(c):
        ends_ns = pd.to_numeric(c["last_end_ns"], errors="coerce")
        later = ends_ns[(ends_ns > t1) & (pd.to_numeric(c["ranks_completed"], errors="coerce")
                                          >= pd.to_numeric(c["ranks_entered"], errors="coerce"))]
        back_ns = int(later.min()) if len(later) else None
    if back_ns is None:
        return []                       # still down when the evidence ends: a hang, reported as one
    d = rank_directory(ctx)
    own = own_resends(ctx, rt, d, tied, t0, t1)
    blamed = whose_link(tied, own)
    rank = blamed[0]
    peers = sorted({int(r) for ab in zip(ep["a"], ep["b"]) for r in ab
                    if r is not None and not pd.isna(r) and int(r) not in blamed})
    who = " and ".join(label(d, r) for r in blamed)
    link_of = f"{who}'s link" if len(blamed) == 1 else f"the link between {who}"
    hosts_of = f"{who}'s host" if len(blamed) == 1 else "both hosts"
    gaps = [g for gs in ep["gaps_ns"] for g in gs]
    longest = max(ep["gaps_ns"], key=len)
    links = [{"rank": rank, "peer_rank": p} for p in (peers if len(blamed) == 1 else blamed[1:])]
    chain = [f"{int(ep['n'].sum())} retransmissions on {len(ep)} connection(s) of {who} (to "
             f"{ranks_text(peers) if peers else 'each other'}) in RTO backoff: the same data resent after "
             + ", ".join(ms(g) for g in longest[:6]) + " (each gap about twice the last): nothing was answered",
             f"no data crossed that link for about {ms(t_up - t0)} (from the first timed-out resend to the "
             f"connections' resends through again, their median); its slowest connection stalled {ms(t1 - t0)}",
             f"then the resends stopped and collectives completed again ({ms(back_ns - t1)} after the last one): "
             "the link came back"] + ([_ends_text(d, tied, blamed, own)] if len(tied) > 1 else [])
    ev = rt[rt["saddr"].isin(ep["saddr"]) & rt["sport"].isin(ep["sport"])
            & (pd.to_numeric(rt["timestamp_ns"], errors="coerce") >= t0)
            & (pd.to_numeric(rt["timestamp_ns"], errors="coerce") <= t1)]
    return [Finding(
        kind="link_flap", severity="error", confidence=0.75,
        headline=f"Link flap: {link_of} was down about {ms(t_up - t0)} and came back" + " ({since})",
        confidence_note="RTO backoff on every connection of one rank's link at once, then recovery",
        summary=(f"{link_of[0].upper() + link_of[1:]} stopped carrying data for about {ms(t_up - t0)}: "
                 f"{len(ep)} connection(s) to {ranks_text(peers) if peers else 'each other'} resent the same data "
                 f"with RTO backoff ({int(ep['n'].sum())} resends, gaps up to {ms(max(gaps))}), then traffic resumed "
                 f"and collectives completed again: the link went down and came back up (a flapping port, a cable, "
                 f"a switch reboot). Every collective in flight waited, up to {ms(t1 - t0)} (the connection whose backoff "
                 "had grown longest)."),
        ranks=blamed, peer_ranks=peers, links=links,
        evidence=[{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                  for row in ev[[c_ for c_ in COLS if c_ in ev]].head(30).to_dict("records")],
        sql=("SELECT timestamp_ns, event, source, saddr, sport, daddr, dport, rank, peer_rank FROM tcp_events "
             "WHERE event IN ('tcp_retransmit_skb', 'retransmission') "
             f"AND timestamp_ns BETWEEN {t0} AND {t1} ORDER BY timestamp_ns"),
        action=(f"The switch port and cable of {hosts_of}: the switch's log for link down/up at that time, "
                "the NIC's carrier_changes (/sys/class/net/<if>/carrier_changes), dmesg for 'Link is Down'"),
        score=STOPS_JOB_SCORE, since_ns=t0, since_source="tracer and packets: the first timed-out resend",
        layer="transport", chain=chain,
        details={"down_ns": t_up - t0, "stalled_ns": t1 - t0, "back_ns": back_ns, "connections": int(len(ep)), "resends": int(ep["n"].sum()),
                 "own_resends": {str(r): {"kernel": k, "on_wire": w} for r, (k, w) in own.items()},
                 "rule": "rto_backoff_then_recovery"})]
