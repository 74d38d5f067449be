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

A capture that began after the link came back saw no resend: :func:`flap_before_capture` reads
the sockets' resend counters at its start instead (every busy connection of one rank had resent,
no other pair of ranks had), dated by a Flight Recorder collective that stalled on every rank
before the capture where the ring buffer reaches back that far; a warning, as the counters say
where, not when.

Layer ``transport``: the collective was enqueued everywhere and the transport stalled.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..coerce import cell_int, cell_ints
from .base import STOPS_JOB_SCORE, Context, Finding, detector
from ..wording import ms, ranks_text
from .ranks import label, rank_directory
from ..model.windows import capture_start_ns

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
    """The outage the capture watched (:func:`watched_flap`), else the one its sockets' counters
    say ended before it began (:func:`flap_before_capture`)."""
    return watched_flap(ctx) or flap_before_capture(ctx)


def watched_flap(ctx: Context) -> list[Finding]:
    """The RTO-backoff rule of the module docstring, on the retransmissions the capture saw."""
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


# ----------------------------------------------------------------------- before the capture
#
# A capture started after the link came back sees no resend; the sockets still count them. ss's
# ``retrans:cur/total`` is per connection since it opened, so its first snapshot says which
# connections resent data before the capture, not when. An outage of seconds leaves the RTO
# backoff's resends (0.2 + 0.4 + 0.8 s ...) on every connection of the dead link that had data in
# flight, and none on the others; the random loss of a busy machine leaves a stray resend here
# and there. Where the Flight Recorder's ring reaches back before the capture, the collective
# that stalled says when, and that every rank had enqueued it (the ranks waited on the network,
# not on one another's host).
PAST_MIN_RESENDS = 2           # a connection pair's resends before the capture that an outage leaves
PAST_TWO_RANK_RESENDS = 4      # a two-rank job's one pair: more, as nothing else corroborates
PAST_NOISE = 1                 # resends a pair not on the link may carry (a busy host's stray timeout)
STALL_MIN_NS = 1_000_000_000   # a Flight Recorder collective that took this long ...
STALL_FACTOR = 20              # ... and this many times the rank's median is a stall


def _pair_resends(sockets: pd.DataFrame, phase: str) -> pd.DataFrame:
    """Per connection between two ranks in ``phase``'s snapshot (either end's row): the ranks
    ``a`` < ``b``, the connection's key and its resends (ss prints no ``retrans:`` for a
    connection that never resent: 0 where its TCP info is there), less those the peer D-SACKed
    (``dsack_dups``: it had that data; a late ACK of a busy host, not a link that lost it)."""
    s = sockets[(sockets["phase"] == phase) & (sockets["state"].astype("string") == "ESTAB").fillna(False)]
    r = pd.to_numeric(s["rank"], errors="coerce")
    p = pd.to_numeric(s["peer_rank"], errors="coerce")
    s = s[(r.notna() & p.notna() & (r != p) & pd.to_numeric(s["rtt_ms"], errors="coerce").notna()).to_numpy()]
    if s.empty:
        return pd.DataFrame(columns=["a", "b", "conn", "resends"])
    r, p = r[s.index].astype("int64"), p[s.index].astype("int64")
    # one key for both ends' rows of a connection: its two (address, port) endpoints, ordered
    me = s["local_addr"].astype(str) + ":" + s["local_port"].astype(str)
    you = s["peer_addr"].astype(str) + ":" + s["peer_port"].astype(str)
    conn = np.where((me < you).to_numpy(), me + "|" + you, you + "|" + me)
    out = pd.DataFrame({"a": np.minimum(r, p).to_numpy(), "b": np.maximum(r, p).to_numpy(), "conn": conn,
                        "resends": (pd.to_numeric(s["retrans_total"], errors="coerce").fillna(0)
                                    - pd.to_numeric(s["dsack_dups"], errors="coerce").fillna(0)).clip(lower=0)
                        .astype("int64").to_numpy()})
    return out.groupby(["a", "b", "conn"], as_index=False)["resends"].sum()


def _stalled_collective(ctx: Context, before_ns: int) -> dict | None:
    """The Flight Recorder's collective enqueued before ``before_ns`` that took longest, where it
    stalled (``STALL_MIN_NS`` and ``STALL_FACTOR`` times the rank's median) on two ranks or more,
    all of which enqueued it within a quarter of that (else a rank came late: its host, not the
    network, held the others; None): its seq id, op, the longest duration, the ranks' median, when it was created and how far apart
    the ranks enqueued it."""
    fe = ctx.model.tables.get("fr_entries")
    if fe is None or fe.empty:
        return None
    d = pd.to_numeric(fe["duration_ms"], errors="coerce") * 1e6
    t = pd.to_numeric(fe["time_created_ns"], errors="coerce")
    med = d.groupby(fe["rank"]).transform("median")
    hit = (d >= STALL_MIN_NS) & (d >= STALL_FACTOR * med) & (t < before_ns) & (t > 1e18)
    if not hit.any():
        return None
    key = fe.loc[hit, ["pg_id", "collective_seq_id"]].astype(str).agg("/".join, axis=1)
    counts = key.value_counts()
    counts = counts[counts >= 2]
    if counts.empty:
        return None
    best = key[key.isin(counts.index)].index[d[key[key.isin(counts.index)].index].argmax()]
    same = fe.index[(fe["pg_id"].astype(str) == str(fe.at[best, "pg_id"])) &
                    (fe["collective_seq_id"].astype(str) == str(fe.at[best, "collective_seq_id"]))]
    if t[same].max() - t[same].min() > d[best] / 4:
        return None              # one rank enqueued it late: its peers waited on its host, not the network
    return {"seq": cell_int(fe.at[best, "collective_seq_id"]), "op": str(fe.at[best, "profiling_name"]),
            "stalled_ns": int(d[best]), "median_ns": int(med[best]), "created_ns": int(t[same].min()),
            "spread_ns": int(t[same].max() - t[same].min()),
            "ranks": sorted({int(x) for x in pd.to_numeric(fe.loc[same, "rank"], errors="coerce").dropna()})}


def flap_before_capture(ctx: Context) -> list[Finding]:
    """A link whose connections all resent data before the capture began, and which carried
    the job's collectives again while it ran: an outage (or a burst of loss) that was over.

    Rule (the comment above ``PAST_MIN_RESENDS``): in the sockets' first snapshot, the
    connection pairs between ranks with ``PAST_MIN_RESENDS`` resends or more all share one rank
    X and are two or more (or the one pair of a two-rank job, ``PAST_TWO_RANK_RESENDS``: its two
    ends are named); no pair without X carries more than ``PAST_NOISE``; the resends X's pairs
    made while the capture ran (the last snapshot's counts less the first's) are fewer than those
    before it (else the trouble goes on, the other rules' case); and a collective of every rank
    completed during the capture (else the job hangs, the hang detectors' case). Severity
    warning: the counters say where, not when; a stalled Flight Recorder collective enqueued
    before the capture says when and raises the confidence."""
    so = ctx.model.tables.get("sockets")
    if so is None or so.empty or "phase" not in so:
        return []
    start = _pair_resends(so, "start")
    if start.empty:
        return []
    pairs = start.groupby(["a", "b"])["resends"].max()
    hot = pairs[pairs >= PAST_MIN_RESENDS]
    world = sorted({int(x) for x in set(start["a"]) | set(start["b"])})
    if hot.empty:
        return []
    touch = {r: sum(r in ab for ab in hot.index) for r in world}
    everywhere = [r for r, n in touch.items() if n == len(hot)]
    if len(hot) >= 2 and len(everywhere) == 1:
        blamed = everywhere
    elif len(hot) == 1 and len(world) == 2 and int(start["resends"].sum()) >= PAST_TWO_RANK_RESENDS:
        blamed = [int(x) for x in hot.index[0]]
    else:
        return []
    on_link = [ab for ab in pairs.index if set(ab) & set(blamed)]
    off = pairs[[ab not in on_link for ab in pairs.index]]
    if len(off) and int(off.max()) > PAST_NOISE:
        return []
    mine = start[[(a, b) in on_link for a, b in zip(start["a"], start["b"])]]
    before = int(mine["resends"].sum())
    end = _pair_resends(so, "end")
    during = None
    if len(end):
        e = end.set_index("conn")["resends"]
        common = mine[mine["conn"].isin(e.index)]
        during = int((e[common["conn"]].to_numpy() - common["resends"].to_numpy()).clip(min=0).sum())
        if during >= before:
            return []
    cap0 = capture_start_ns(ctx.model)
    c = ctx.model.tables.get("collectives")
    if c is None or c.empty:
        return []
    whole = pd.to_numeric(c["ranks_completed"], errors="coerce") >= pd.to_numeric(c["nranks"], errors="coerce")
    done = pd.to_numeric(c.loc[whole & (pd.to_numeric(c["nranks"], errors="coerce") > 1), "last_end_ns"],
                         errors="coerce").dropna()
    if done.empty or (cap0 is not None and int(done.max()) < cap0):
        return []
    stall = _stalled_collective(ctx, cap0) if cap0 is not None else None
    d = rank_directory(ctx)
    peers = sorted({int(r) for ab in hot.index for r in ab if int(r) not in blamed})
    who = " and ".join(label(d, r) for r in blamed)
    link_of = f"{who}'s link" if len(blamed) == 1 else f"the link between {who}"
    per = sorted(int(v) for v in hot.to_numpy())
    span = f"{per[0]}" if per[0] == per[-1] else f"{per[0]}-{per[-1]}"
    n_other, noise = int(len(off)), int(off.max()) if len(off) else 0
    elsewhere = (f"the {n_other} other pair(s) of ranks none" if not noise else
                 f"the {n_other} other pair(s) of ranks at most {noise} per connection")
    chain = [f"at the capture's start the connections of {who} to {ranks_text(peers) if peers else 'each other'} had "
             f"already resent data ({before} resends in all, {span} on each pair's busiest connection: ss's "
             "retransmission count, since each connection opened)" + (f"; {elsewhere}" if n_other else "")]
    if stall is not None:
        chain.append(f"the Flight Recorder: {stall['op']} #{stall['seq']} took {ms(stall['stalled_ns'])} "
                     f"(the ranks' median {ms(stall['median_ns'])}) on {ranks_text(stall['ranks'])}, which had all "
                     f"enqueued it within {ms(stall['spread_ns'])}: they waited on the network, not on one another")
    chain.append("collectives completed on every rank while the capture ran"
                 + (f", with {during} resend(s) on those connections" if during is not None else "")
                 + ": the link had come back; the counters say where the data was lost, not when: a link that went "
                   "down and came back, or a burst of loss that ended")
    since = stall["created_ns"] if stall is not None else None
    links = [{"rank": blamed[0], "peer_rank": p} for p in (peers if len(blamed) == 1 else blamed[1:])]
    return [Finding(
        kind="link_flap", severity="warning", confidence=0.7 if stall is not None else 0.55,
        headline=(f"Link trouble before the capture: {link_of} resent data on every busy connection, then "
                  "recovered") + (" ({since})" if since is not None else ""),
        confidence_note=("resends on every connection of one rank's link before the capture, none elsewhere"
                         + (", and a collective that stalled on every rank then" if stall is not None else
                            "; when is unknown (no Flight Recorder entry reaches back that far)")),
        summary=(f"Before the capture began, {link_of} lost data: its connections to "
                 f"{ranks_text(peers) if peers else 'each other'} had resent {before} time(s) ({span} on each pair's "
                 "busiest connection)" + (f", {elsewhere}" if n_other else "")
                 + (f"; {stall['op']} #{stall['seq']} took {ms(stall['stalled_ns'])} then, against a median of "
                    f"{ms(stall['median_ns'])}" if stall is not None else "")
                 + ". Collectives completed while the capture ran: the link came back (a flapping port or cable, "
                   "a switch reboot, or a burst of loss that ended)."),
        ranks=blamed, peer_ranks=peers, links=links,
        evidence=[{"a": int(a), "b": int(b), "connection": cn, "resends_before_capture": int(v)}
                  for a, b, cn, v in mine.sort_values("resends", ascending=False).head(30).itertuples(index=False)],
        sql=("SELECT host, rank, peer_rank, local_addr, local_port, peer_addr, peer_port, retrans_total FROM sockets "
             "WHERE phase = 'start' AND state = 'ESTAB' AND peer_rank IS NOT NULL ORDER BY retrans_total DESC NULLS LAST"),
        action=(f"The switch port and cable of {who}'s host" + ("" if len(blamed) == 1 else "s") + ": the switch's "
                "log for link down/up before the capture began, the NIC's carrier_changes "
                "(/sys/class/net/<if>/carrier_changes), dmesg for 'Link is Down'; capture from the job's start "
                "(or the watcher) to see the next one as it happens"),
        score=STOPS_JOB_SCORE / 2, since_ns=since,
        since_source="the Flight Recorder: the stalled collective's creation" if since is not None else None,
        layer="transport", chain=chain,
        details={"rule": "retransmitted_before_capture", "resends_before": before, "resends_during": during,
                 "pairs": {f"{int(a)}-{int(b)}": int(v) for (a, b), v in pairs.items() if v},
                 "stalled_collective": stall})]
