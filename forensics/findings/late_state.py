"""The state at capture: hangs judged without seeing their onset (the on-call case).

Someone is paged minutes after a job stopped progressing and starts ``stallscope capture``
on every host. The tracer sees no call entered before it attached, so the collectives the
ranks are stuck in are invisible to it. :mod:`.comm_state` fuses what such a capture still
has, per communicator and rank, and this module judges the hang from it:

- **position**: the last collective each rank *launched* (NCCL_DEBUG COLL lines,
  ``coll_log_ops``; Flight Recorder ``last_enqueued_collective`` - 1) and the last it
  *completed* (Flight Recorder ``last_completed_collective`` - 1);
- **where**: the native or Python stack of each rank's main thread (``stacks``): inside an
  NCCL call or a CUDA wait, or elsewhere ("pause() <- other_code_path <- main");
- **progress**: anything that moved while the capture watched: a collective the tracer saw
  launched or completed, a Flight Recorder completion, bytes acknowledged or received on a
  socket between two ranks (``sockets`` samples);
- **the network**: sockets holding unacknowledged data behind an RTO backoff, the packets'
  retransmissions and resets, NCCL's WARN lines about reset or closed connections;
- **who waits on whom**: threads blocked receiving on a socket (``threads``: the syscall's
  fd resolved to the socket's inode) point at the peer they wait for.

A communicator is hung when none of its ranks made progress for ``STATE_MIN_SILENCE_NS``
(and several times its normal collective duration) up to the end of the window every one
of its hosts watched (:mod:`forensics.model.windows`), and some rank is positively inside
a collective. A job whose ranks all sit outside NCCL with nothing in flight is busy
elsewhere (long compute, data loading, a checkpoint), not hung: no finding.

The verdicts (:func:`late_verdicts`) are of the kinds :mod:`.hang` and
:mod:`.connection_reset` own, which emit them (``hang_state``, ``reset_state``) under the
precedence of :mod:`.precedence`: ``hang_mismatch`` (ranks behind the others, or outside
NCCL while the others wait in it), ``hang_stuck`` (every rank inside #n: the dead link from
the sockets and packets, else the rank whose "GPU" made no progress: the one its peers wait
on), ``connection_reset`` (a reset on the ring before the hang). This module registers no
detector. Each finding names the sources it rests on and the age of its evidence.
"""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pandas as pd

from ..coerce import cell_int
from .comm_state import (WAIT_SYSCALLS, CommState, RankState, collective_p99_ns,
                         communicator_states, frames_text, socket_samples, stuck_sockets, wait_sink)
from ..model.windows import capture_start_ns
from .base import HEADLINE_CHARS, Context, Finding
from .precedence import HANG_KINDS, STATE_HANGS, STATE_RESETS, finds
from .onset import ONSET_UNKNOWN, comm_onset
from .socket_errors import reset_warnings
from ..wording import ms, ranks_text
from .ranks import label, rank_directory, who_text
from .sql import model_table, sql_evidence, sql_int, sql_str
from .trouble import dedup_counts, shared_endpoint, trouble_events

MAX_EVIDENCE = 20
# a reset this long before the last sign of progress, and progress after it, did not break the ring
RESET_BEFORE_ONSET_NS = 2_000_000_000


# --------------------------------------------------------------------------- the verdicts

def late_verdicts(ctx: Context) -> list[Finding]:
    """:func:`late_hang_findings`, a memo of the analysis: the sources ``state at capture``
    of :mod:`.precedence` take their kinds from it (hangs for ``hang_state``, resets for
    ``reset_state``: :func:`state_hangs`, :func:`state_resets`)."""
    return list(ctx.memo("late_hang_findings", lambda: late_hang_findings(ctx)))


@finds(STATE_HANGS)
def state_hangs(ctx: Context) -> list[Finding]:
    """The source ``state at capture: hangs``: the hangs of :func:`late_verdicts`."""
    return [f for f in late_verdicts(ctx) if f.kind in HANG_KINDS]


@finds(STATE_RESETS)
def state_resets(ctx: Context) -> list[Finding]:
    """The source ``state at capture: resets``: the resets of :func:`late_verdicts`."""
    return [f for f in late_verdicts(ctx) if f.kind in ("connection_reset",)]


def late_hang_findings(ctx) -> list[Finding]:
    """Findings for the hung communicators of :func:`communicator_states`: per communicator,
    a mismatch (:func:`_mismatch`), else what it is stuck on (:func:`_stuck`: a reset on the
    ring, a dead path, the rank the others wait on, or no cause seen)."""
    out = []
    directory = rank_directory(ctx)
    for c in communicator_states(ctx):
        if not c.hung:
            continue
        c.onset = comm_onset(ctx, c.ranks, set(c.ranks), c.key, collective_p99_ns(ctx), samples=socket_samples(ctx))
        c.first_open = first_open(c)
        c.capture_start_ns = capture_start_ns(ctx.model)
        f = _mismatch(ctx, c, directory) or _stuck(ctx, c, directory)
        if f is not None:
            # every verdict says what it rests on, before saying what it cannot know
            unknown = ONSET_UNKNOWN if c.onset is None else ""
            f.summary = f.summary.replace(ONSET_UNKNOWN, f" Evidence: {f.details['sources']}.{unknown}")
            _contract(f, c)
            out.append(f)
    return out


def first_open(c: CommState) -> int | None:
    """The NCCL opCount of the first collective not every rank of ``c`` completed: one past
    the fewest any rank completed (Flight Recorder), else the lowest position launched (a
    rank's last launch is the earliest it can still be waiting in, as far as logs say)."""
    done = [st.completed for st in c.ranks.values() if st.completed is not None]
    if done:
        return min(done) + 1
    pos = [st.position for st in c.ranks.values() if st.position is not None]
    return min(pos) if pos else None


def _contract(f: Finding, c: CommState) -> None:
    """The fields every hang finding carries (docs/DESIGN.md, findings): the op as NCCL
    counts it, as PyTorch does where Flight Recorder was read (its collective_seq_id counts
    the process group's collectives from 1, NCCL's opCount from 0), and since when."""
    if f.kind not in ("hang_mismatch", "hang_stuck", "connection_reset"):
        return
    if f.op_count is None:
        f.op_count = f.details.get("op_count") if f.kind == "hang_mismatch" and c.first_open is None \
            else c.first_open
    fr = any("Flight Recorder" in st.sources for st in c.ranks.values())
    if f.seq is None and fr and f.op_count is not None:
        f.seq = int(f.op_count) + 1
    if c.onset is not None and f.since_ns is None:
        f.since_ns, f.since_source, f.since_precision_ns = c.onset.ns, c.onset.source, c.onset.precision_ns
    f.headline = f.headline or _headline(f, c)


def _headline(f: Finding, c: CommState) -> str:
    """The one-line verdict (placeholders filled by findings.contract)."""
    n = f.op_count
    op = next((st.position_op for st in c.ranks.values() if st.position_op and st.position == n), None) \
        or f.details.get("op")
    at = (f"{op} #{n}" if op else f"collective #{n}") if n is not None else "a collective"
    if f.kind == "connection_reset":
        return "Hang: a TCP reset broke {who}'s connection to {peers}; NCCL cannot recover it ({since})"
    if f.kind == "hang_mismatch":
        if "fr_seq_id" in f.details:
            return "Hang: {who} called a different collective than {peers} at " + at + " ({since})"
        return "Hang: {who} never entered " + at + "; {peers} wait in it ({since})"
    if "stuck_connections" in f.details:
        if len(f.ranks) != 1:     # one dead link seen: either end's NIC or cable
            return ("Hang: the link between {who} is down (data unacknowledged; which end, the evidence cannot "
                    "tell); every rank stuck in " + at + " ({since})")
        return "Hang: {who}'s link is down (data to {peers} unacknowledged); every rank stuck in " + at + " ({since})"
    if "wait_for" in f.details:
        return "Hang: {who}'s GPU stopped inside " + at + "; {peers} wait on it ({since})"
    return "Hang: every rank stuck inside " + at + "; TCP shows no cause (GPU, kernel or RDMA?) ({since})"


def _hung(c: CommState) -> str:
    """"Hung since 09:55:53 UTC (28.1 s before the capture; last sign of progress: Flight
    Recorder)", or since before the capture, with what the capture saw, where nothing dates it."""
    if c.onset is None:
        return f"Hung since before the capture ({_age(c)})"
    since = datetime.fromtimestamp(c.onset.ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S")
    start = c.capture_start_ns
    before = (f"{ms(start - c.onset.ns)} before the capture" if start is not None and start > c.onset.ns
              else "while the capture ran")
    return f"Hung since {since} UTC ({before}; last sign of progress: {c.onset.source}; {_age(c)})"


def _age(c: CommState) -> str:
    when = datetime.fromtimestamp(c.window[1] / 1e9, tz=timezone.utc).strftime("%H:%M:%S")
    if not c.overlap:
        return (f"no progress seen by any host in its own capture, at least {ms(c.silence_ns)} each (the hosts' "
                f"captures did not overlap); state at {when} UTC")
    return f"no progress seen in the {ms(c.silence_ns)} the capture watched; state at {when} UTC"


def _sources_text(c: CommState, extra=()) -> str:
    return ", ".join(sorted(set(c.sources) | set(extra))) or "none"


def fr_signature_mismatch(ctx, ranks: set[int]) -> dict | None:
    """Flight Recorder's cross-rank check: the first collective sequence id of a process
    group at which the ranks' calls differ (op, element count, dtypes). None when they agree."""
    fe = model_table(ctx, "fr_entries")
    if fe.empty:
        return None
    fe = fe[~fe["is_p2p"].fillna(False).astype(bool) & fe["collective_seq_id"].notna() & fe["rank"].notna()]
    fe = fe[fe["rank"].astype("int64").isin(ranks)]
    if fe.empty:
        return None
    sig = (fe["profiling_name"].astype("string").fillna("?") + " of "
           + fe["input_numel"].astype("Int64").astype("string").fillna("?") + " "
           + fe["input_dtypes"].astype("string").fillna("?"))
    fe = fe.assign(sig=sig.to_numpy()).drop_duplicates(["pg_id", "collective_seq_id", "rank"], keep="last")
    kinds = fe.groupby(["pg_id", "collective_seq_id"])["sig"].nunique()
    bad = kinds[kinds > 1]
    if bad.empty:
        return None
    pg, seq = min(bad.index, key=lambda k: k[1])
    at = fe[(fe["pg_id"] == pg) & (fe["collective_seq_id"] == seq)]
    counts = at["sig"].value_counts()
    odd_sigs = set(counts.index) if counts.iat[0] == counts.iat[1] else set(counts.index[1:])
    odd = sorted(int(r) for r in at.loc[at["sig"].isin(odd_sigs), "rank"])
    return {"pg_id": pg, "seq": int(seq), "odd": odd, "majority": counts.index[0],
            "calls": {int(r): str(x) for r, x in zip(at["rank"], at["sig"])}}


def _mismatch(ctx, c: CommState, directory) -> Finding | None:
    """Ranks behind the others (by position) or outside NCCL while others wait inside it, or
    (Flight Recorder) calling a different collective at one sequence id."""
    fm = fr_signature_mismatch(ctx, set(c.ranks))
    if fm is not None:
        odd, others = fm["odd"], sorted(set(fm["calls"]) - set(fm["odd"]))
        mine = "; ".join(f"rank {r} called {fm['calls'][r]}" for r in odd)
        summary = (f"{_hung(c)}: at Flight Recorder collective #{fm['seq']} of process "
                   f"group {fm['pg_id']}, {mine} while {ranks_text(others)} called {fm['majority']}: the ranks issue "
                   "different collectives (NCCL hangs or fails with 'message truncated')." + ONSET_UNKNOWN)
        sql = _state_sql(c)
        return Finding(
            kind="hang_mismatch", severity="error", confidence=0.9, summary=summary, ranks=odd,
            confidence_note="high: Flight Recorder records each rank's own call at that sequence id",
            hosts=sorted({c.ranks[r].host for r in odd if r in c.ranks and c.ranks[r].host}), peer_ranks=others,
            evidence=sql_evidence(ctx, sql, MAX_EVIDENCE), sql=sql, score=1e6 + (c.silence_ns or 0) / 1e9,
            action=(f"Find why {ranks_text(odd)} issued a different collective at this point: a skipped or reordered "
                    "collective (data-dependent branch, uneven number of buckets or batches)."),
            details=_details(c, {"fr_seq_id": fm["seq"], "calls": {str(k): v for k, v in fm["calls"].items()},
                                 "sources": _sources_text(c, ["Flight Recorder"])}))
    pos = {r: st.position for r, st in c.ranks.items() if st.position is not None}
    behind, n, op = [], None, None
    if len(pos) >= 2 and len(set(pos.values())) > 1:
        top = max(pos.values())
        behind = sorted(r for r, p in pos.items() if p < top and not c.ranks[r].in_nccl)
        if behind:
            n = min(pos[r] for r in behind) + 1
            op = next((st.position_op for st in c.ranks.values() if st.position is not None and st.position >= n
                       and st.position_op), None)
    if not behind:
        known = {r: st.in_nccl for r, st in c.ranks.items() if st.in_nccl is not None}
        outside = sorted(r for r, v in known.items() if not v)
        inside = sorted(r for r, v in known.items() if v)
        if outside and inside:
            behind = outside
    if not behind:
        return None
    waiting = sorted(r for r in c.ranks if r not in behind)
    who = ", ".join(label(directory, r) for r in behind)

    def state(r: int) -> str:
        st = c.ranks[r]
        parts = []
        if st.position is not None:
            parts.append(f"last launched #{st.position}" + (f" {st.position_op}" if st.position_op else ""))
        if st.where:
            parts.append(("inside NCCL: " if st.in_nccl else "in ") + st.where)
        return f"rank {r}: " + ", ".join(parts) if parts else f"rank {r}: no state captured"
    what = f"never entered collective #{n}" + (f" ({op})" if op else "") if n is not None else \
        "is not inside any NCCL call"
    summary = (f"{_hung(c)}: {who} {what} of {c.label}; "
               f"{ranks_text(waiting)} wait{'s' if len(waiting) == 1 else ''} in it ("
               + "; ".join(state(r) for r in behind + waiting[:4]) + ")." + ONSET_UNKNOWN)
    sql = _state_sql(c)
    return Finding(
        kind="hang_mismatch", severity="error", confidence=0.85 if n is not None else 0.7, summary=summary,
        confidence_note=("each rank's position in the collective sequence is known (COLL lines or Flight Recorder)"
                         if n is not None else "lower: no positions, only the stacks say who is outside NCCL"),
        ranks=behind, hosts=sorted({c.ranks[r].host for r in behind if c.ranks[r].host}), peer_ranks=waiting,
        evidence=sql_evidence(ctx, sql, MAX_EVIDENCE), sql=sql, score=1e6 + (c.silence_ns or 0) / 1e9,
        action=(f"Find why {ranks_text(behind)} left the collective sequence: its stack shows where it is instead "
                "(a data-dependent branch, an exception swallowed on that rank, uneven batches, early stopping); "
                "every rank must issue the same collectives in the same order. The waiting ranks are healthy."),
        details=_details(c, {"op_count": n, "op": op, "missing_ranks": behind, "waiting_ranks": waiting}))


def _stuck(ctx, c: CommState, directory) -> Finding | None:
    members = set(c.ranks)
    pos = {st.position for st in c.ranks.values() if st.position is not None}
    n = c.first_open if c.first_open is not None else min(pos) if pos else None
    upto = max(pos) if pos else None
    start = c.window[0]
    # 1. a reset on the ring: packets / kernel events in the window, or NCCL's own WARN lines
    ev = trouble_events(ctx)
    ev = ev[ev["a"].isin(members) & ev["b"].isin(members)] if len(ev) else ev
    resets = ev[ev["cls"] == "reset"] if len(ev) else ev
    if len(resets) and c.onset is not None:
        # the ring made progress after an earlier reset (a refused bootstrap connection at the
        # job's start, a peer of another job): that reset broke nothing
        resets = resets[pd.to_numeric(resets["timestamp_ns"], errors="coerce").fillna(c.onset.ns)
                        >= c.onset.ns - RESET_BEFORE_ONSET_NS]
    warn = reset_warnings(ctx, members)
    head = (f"{_hung(c)}: every rank of {c.label} is inside "
            + (f"collective #{n}" if n is not None else "a collective")
            + (f" (launched up to #{upto})" if n is not None and upto is not None and upto > n else ""))
    sql = _state_sql(c)
    if len(resets) or len(warn):
        if len(resets):
            r0 = resets.iloc[0]
            snd, rcv = int(r0["sender"]), int(r0["receiver"])
            how = f"{r0['saddr']}:{r0['sport']} -> {r0['daddr']}:{r0['dport']} ({r0['event']})"
            src = ["packets"]
        else:
            w0 = warn.iloc[0]
            snd, rcv = int(w0["peer_rank"]), int(w0["rank"])
            how = f"rank {rcv}'s NCCL: {w0['message'][:160]}"
            src = ["NCCL WARN lines"]
        summary = (f"{head}; the ring broke on a TCP reset: {label(directory, snd)} -> {label(directory, rcv)} "
                   f"({how}). NCCL cannot recover a reset connection." + ONSET_UNKNOWN)
        return Finding(
            kind="connection_reset", severity="error", confidence=0.8, summary=summary, ranks=[snd],
            confidence_note="a reset on the ring's own connections, and nothing completed after it",
            hosts=[directory[snd].host] if snd in directory and directory[snd].host else [], peer_ranks=[rcv],
            links=[{"rank": snd, "peer_rank": rcv, "event": "reset"}], evidence=sql_evidence(ctx, sql, MAX_EVIDENCE), sql=sql,
            score=2e6,
            action=("Find who reset the connection: firewall/conntrack rules (nft/iptables REJECT, conntrack table "
                    "full), a NIC or host reboot, a process closing its socket; restart the job from the last "
                    "checkpoint."),
            details=_details(c, {"op_count": n, "sources": _sources_text(c, src)}))
    # 2. a dead path: data unacknowledged behind an RTO backoff, retransmissions into silence
    stuck = stuck_sockets(ctx, members)
    loss = ev[(ev["cls"] == "retransmission") & (ev["timestamp_ns"] >= start)] if len(ev) else ev
    links = _dead_links(stuck, loss)
    if len(links):
        blame = shared_endpoint(links)
        ranks = blame.ranks
        peers = sorted({x for lk in blame.links for x in lk} - set(ranks))
        n_retx = int(links["n_retx"].sum())
        # no sample may have printed a backoff yet (ss shows none before the first RTO)
        backoff = (cell_int(pd.to_numeric(stuck["backoff"], errors="coerce").max()) if len(stuck) else None) or 0
        who = who_text(directory, ranks)
        summary = (f"{head}; {len(blame.links)} link(s), all touching {who}"
                   + (f" (to {ranks_text(peers)})" if peers else "")
                   + " hold data nobody acknowledges"
                   + (f" (RTO backoff up to {backoff})" if backoff else "")
                   + (f", {n_retx} retransmission(s) into silence while the capture ran" if n_retx else "")
                   + ": its link is down or its NIC stopped." + ONSET_UNKNOWN)
        return Finding(
            kind="hang_stuck", severity="error", confidence=0.8 if blame.separated else 0.65, summary=summary,
            confidence_note=("the dead links share one endpoint" if blame.separated else
                             "lower: the dead links do not single out one endpoint"),
            ranks=ranks, hosts=sorted({directory[r].host for r in ranks if r in directory and directory[r].host}),
            peer_ranks=peers, links=[{"rank": int(a), "peer_rank": int(b)} for a, b in blame.links[:MAX_EVIDENCE]],
            evidence=sql_evidence(ctx, sql, MAX_EVIDENCE), sql=sql, score=1e6 + (c.silence_ns or 0) / 1e9,
            action=(f"Check {who}'s link: ip link / ethtool (link detected?), dmesg for NIC resets or link down, "
                    "the switch port; then restart the job without that host."),
            details=_details(c, {"op_count": n, "sources": _sources_text(c, ["socket samples"]),
                                 "stuck_connections": int(len(stuck)), "retransmissions": n_retx}))
    # 3. links idle and drained: the rank its peers wait on made no progress ("GPU" hang)
    sink, edges = wait_sink(ctx, members)
    if sink is not None:
        waiting = sorted(a for a, b in edges if b == sink)
        stuck = _stuck_thread(ctx, c.ranks.get(sink))
        where = stuck or (c.ranks[sink].where if c.ranks.get(sink) and c.ranks[sink].where else None)
        summary = (f"{head}; every link is idle and drained, and {ranks_text(waiting)} wait on "
                   f"{label(directory, sink)} (the others on them), which waits on no peer: its GPU work (stream) "
                   f"stopped mid-collective" + (f" ({where})" if where else "") + "." + ONSET_UNKNOWN)
        return Finding(
            kind="hang_stuck", severity="error", confidence=0.7, summary=summary, ranks=[sink],
            confidence_note="from the threads' waits alone: every peer waits on this rank, and it on none",
            hosts=[directory[sink].host] if sink in directory and directory[sink].host else [],
            peer_ranks=waiting, evidence=sql_evidence(ctx, sql, MAX_EVIDENCE), sql=sql, score=1e6 + (c.silence_ns or 0) / 1e9,
            action=(f"Check {label(directory, sink)}'s GPU: nvidia-smi (utilisation stuck at 100%?), dmesg for "
                    "Xid errors, cuda-gdb or py-spy dump --native of its process; then restart the job without that "
                    "GPU."),
            details=_details(c, {"op_count": n, "sources": _sources_text(c, ["thread states"]),
                                 "wait_for": [[int(a), int(b)] for a, b in edges]}))
    summary = (f"{head}; no TCP retransmission, reset or stuck socket between its ranks and no rank that the "
               "others wait on could be told: suspect a GPU or kernel hang (nvidia-smi, dmesg Xid), or RDMA traffic "
               "invisible to TCP (see the IB counters)." + ONSET_UNKNOWN)
    return Finding(
        kind="hang_stuck", severity="error", confidence=0.5, summary=summary, ranks=[], hosts=[],
        confidence_note="low: the hang is certain, its cause is not in this evidence",
        peer_ranks=sorted(members), evidence=sql_evidence(ctx, sql, MAX_EVIDENCE), sql=sql, score=1e6 + (c.silence_ns or 0) / 1e9,
        action=("Dump the stacks of every rank (py-spy dump --native, gdb), check nvidia-smi and dmesg for Xid "
                "errors; if NCCL uses IB/RoCE, read the port counters."),
        details=_details(c, {"op_count": n}))


def _dead_links(stuck: pd.DataFrame, loss: pd.DataFrame) -> pd.DataFrame:
    """Per unordered link: stuck connections (+1 each) and retransmissions in the window; in
    the shape :func:`shared_endpoint` takes (a, b, n)."""
    parts = []
    if len(stuck):
        r, p = stuck["rank"].astype("int64").to_numpy(), stuck["peer_rank"].astype("int64").to_numpy()
        parts.append(pd.DataFrame({"a": np.minimum(r, p), "b": np.maximum(r, p), "n": 1, "n_retx": 0}))
    if len(loss):
        c = dedup_counts(loss)
        parts.append(pd.DataFrame({"a": c["a"].astype("int64"), "b": c["b"].astype("int64"),
                                   "n": c["n"].astype("int64"), "n_retx": c["n"].astype("int64")}))
    if not parts:
        return pd.DataFrame(columns=["a", "b", "n", "n_retx"])
    return pd.concat(parts, ignore_index=True).groupby(["a", "b"], as_index=False)[["n", "n_retx"]].sum()


def _stuck_thread(ctx, st: "RankState | None") -> str | None:
    """Where the stuck rank's work stopped: "thread cuda-stream in nanosleep() <- ..." for its
    thread named like the ones its peers wait in (their transfer threads, blocked on sockets)
    that sits in no socket wait itself, from its stack; None when that is not one thread or
    it has no stack."""
    if st is None or st.pid is None:
        return None
    th, stacks = model_table(ctx, "threads"), model_table(ctx, "stacks")
    if th.empty or stacks.empty:
        return None
    if "phase" in th and (th["phase"] == "end").any():
        th = th[th["phase"] == "end"]
    mine = (th["host"] == st.host) & (pd.to_numeric(th["pid"], errors="coerce") == st.pid)
    waiters = th[~mine & th["syscall_name"].isin(WAIT_SYSCALLS) & th["socket_inode"].notna()]["name"].dropna()
    if waiters.empty:
        return None
    th = th[mine]
    cand = th[~th["syscall_name"].isin(WAIT_SYSCALLS).to_numpy() & th["name"].isin(set(waiters)).to_numpy()
              & (pd.to_numeric(th["tid"], errors="coerce") != st.pid).to_numpy()]
    tids = sorted(set(pd.to_numeric(cand["tid"], errors="coerce").dropna().astype(int)))
    if len(tids) != 1:
        return None
    g = stacks[(stacks["host"] == st.host) & (pd.to_numeric(stacks["pid"], errors="coerce") == st.pid)
               & (pd.to_numeric(stacks["os_tid"], errors="coerce") == tids[0])].sort_values("depth", kind="stable")
    frames = [(str(f), None) for f in g["function"] if isinstance(f, str) and f]
    name = cand["name"].dropna()
    return (f"thread {name.iloc[0] if len(name) else tids[0]} in {frames_text(frames)}") if frames else None


# --------------------------------------------------------------------------- evidence

def _state_sql(c: CommState) -> str:
    """Per rank of the communicator: its position (COLL lines), Flight Recorder counters, the
    main thread's innermost frame, the sockets with unacknowledged data at the last sample."""
    vals = ", ".join(f"({sql_int(r)}, {sql_str(st.host or '')}, {sql_int(st.pid) if st.pid is not None else 'NULL'})"
                     for r, st in sorted(c.ranks.items())[:MAX_EVIDENCE])
    comm = sql_str(c.key)
    return f"""WITH m(rank, host, pid) AS (VALUES {vals}),
pos AS (SELECT host, pid, max(last_op_count) AS last_launched_op, arg_max(last_op, last_op_count) AS op
        FROM coll_log_ops WHERE comm_id = {comm} GROUP BY host, pid),
fr AS (SELECT host, pid, max(last_enqueued_collective) - 1 AS fr_last_enqueued_op,
              max(last_completed_collective) - 1 AS fr_last_completed_op FROM fr_pg_status GROUP BY host, pid),
top AS (SELECT host, pid, arg_min(function, depth) AS main_thread_frame FROM stacks
        WHERE os_tid = pid OR thread_name = 'MainThread' GROUP BY host, pid),
sk AS (SELECT host, pid, count(*) FILTER (WHERE unacked > 0) AS sockets_unacked, max(backoff) AS max_backoff
       FROM sockets WHERE peer_rank IS NOT NULL GROUP BY host, pid)
SELECT m.rank, m.host, m.pid, pos.last_launched_op, pos.op, fr.fr_last_enqueued_op, fr.fr_last_completed_op,
       top.main_thread_frame, coalesce(sk.sockets_unacked, 0) AS sockets_unacked, sk.max_backoff
FROM m LEFT JOIN pos USING (host, pid) LEFT JOIN fr USING (host, pid) LEFT JOIN top USING (host, pid)
LEFT JOIN sk USING (host, pid) ORDER BY m.rank"""


def _details(c: CommState, extra: dict) -> dict:
    d = {"comm": c.key, "state_at_capture": True, "sources": _sources_text(c),
         "window_ns": list(c.window) if c.window else None, "silence_ns": c.silence_ns,
         "ranks": {str(r): {"position": st.position, "position_source": st.position_source,
                            "completed": st.completed, "in_nccl": st.in_nccl, "where": st.where,
                            "last_progress_ns": st.last_progress_ns} for r, st in sorted(c.ranks.items())}}
    d.update({k: v for k, v in extra.items() if v is not None})
    return d


def state_verdict(ctx) -> str | None:
    """One sentence on the state at capture when the tracer saw no collective and no hang was
    found (None when the artefacts know no communicator either)."""
    states = [c for c in communicator_states(ctx) if c.ranks]
    if not states:
        return None
    c = max(states, key=lambda x: len(x.ranks))
    watched = f"{ms(c.window[1] - c.window[0])}" if c.window else "the capture"
    moved = sorted({st.progress_source for st in c.ranks.values() if st.progress_source})
    if moved and c.silence_ns is not None and c.silence_ns < c.need_ns:
        return (f"No hang: {c.label} progressed while the capture watched ({', '.join(moved)}), though the tracer "
                "saw no collective complete.")
    where = sorted({st.where for st in c.ranks.values() if st.where and not st.in_nccl})
    head = (f"No collective completed in the {watched} the capture watched and no rank is inside one: no hang; "
            "the job is busy outside NCCL")
    shown: list[str] = []
    for w in where:                 # the main threads' places, as many as one line holds
        if len(head) + len(" (main threads in )") + len("; ".join(shown + [w])) + 1 > HEADLINE_CHARS:
            break
        shown.append(w)
    return head + (f" (main threads in {'; '.join(shown)})" if shown else " (compute, data loading, a checkpoint)") \
        + "."
