"""Hangs from PyTorch's watchdog lines: what the job's own logs say when nothing was captured.

PyTorch's ProcessGroupNCCL watchdog judges a collective hung when it is still pending after its
timeout, and says which one: each rank's ``WorkNCCL(SeqNum=n, OpType, NumelIn, ...)``, its
process group, the last work it enqueued and completed (``watchdog_events``, joined to hosts by
:mod:`forensics.model.logs`). Per process group, :func:`watchdog_hangs` reads:

- **a collective mismatch**: ranks timed out at the same SeqNum with a different OpType or
  element count (a BROADCAST against an ALLREDUCE: the ranks took different code paths), as
  PyTorch's Flight Recorder analyzer reports it from dumps;
- **ranks behind**: the ranks that never reached SeqNum n (their last enqueued work is lower,
  or their logs hold no timeout while the others' do) against the ranks waiting in n;
- **a rank left behind in a ring collective** (:func:`lag_on_ring`): ranks still waiting in an
  all-reduce, all-gather or reduce-scatter that the others completed (their oldest pending work
  is a later one): the data they lack comes from their ring predecessor, which had it, so the
  link between the two stalled;
- **every rank stuck in n**: the collective itself stalled: a peer's GPU, its process or the
  network; the job's first NCCL failure (an IB or socket error) names it where the logs hold one.

``seq`` is the SeqNum (PyTorch's numbering; no opCount is known from these lines), ``since_ns``
the earliest rank's timeout line time less how long it had waited (``ran for``): when that
collective was enqueued, to the second. No detector here: the owner of the hang kinds,
:mod:`forensics.findings.hang` (``hang_state``), consults :func:`watchdog_hangs` when neither
the tracer nor the state at capture saw the hang (:mod:`forensics.findings.precedence`).
"""
from __future__ import annotations

import pandas as pd

from ..model.nccl_errors import CLASSES
from . import warns
from .base import Finding
from ..wording import ranks_text
from .precedence import WATCHDOG, finds

TIMEOUT_KINDS = ("timeout", "terminated")
MAX_EVIDENCE = 20
SQL = ("SELECT host, rank, pg_id, kind, seq_num, op, numel_in, numel_out, last_enqueued, last_completed, ran_for_ms, "
       "time_ns, artifact, log_line FROM watchdog_events WHERE kind IN ('timeout', 'terminated', 'exception', "
       "'dump_signal') ORDER BY pg_id, rank, seq_num")


@finds(WATCHDOG)
def watchdog_hangs(ctx) -> list[Finding]:
    wd = ctx.model.tables.get("watchdog_events")
    if wd is None or wd.empty:
        return []
    # a dump signal with the rank's own last enqueued work places a rank that never timed out
    dumps = (wd["kind"] == "dump_signal") & pd.to_numeric(wd["last_enqueued"], errors="coerce").notna()
    rows = wd[wd["kind"].isin(TIMEOUT_KINDS + ("exception",)) | dumps].dropna(subset=["rank"])
    if rows.empty or not rows["kind"].isin(TIMEOUT_KINDS).any():
        return []
    out = []
    for pg, g in _groups(rows).items():
        f = _judge(ctx, pg, g, wd)
        if f is not None:
            out.append(f)
    return out


def timed_out_ranks(ctx) -> set[int]:
    """The global ranks whose PyTorch watchdog caught a collective *timeout* (not an NCCL error:
    a rank whose connection failed first has its watchdog report that error, so a rank that
    timed out was stuck before any of its sockets failed)."""
    wd = ctx.model.tables.get("watchdog_events")
    if wd is None or wd.empty:
        return set()
    r = pd.to_numeric(wd.loc[wd["kind"] == "timeout", "rank"], errors="coerce").dropna()
    return {int(x) for x in r}


# PyTorch's ProcessGroupNCCL collective timeout when the job set none (``init_process_group(timeout=)``)
DEFAULT_TIMEOUT_MS = 600_000


def collective_timeout(ctx) -> tuple[int, str]:
    """(ms, where it was read) of the job's collective timeout: how long a rank may wait inside a
    collective before PyTorch's watchdog aborts the job, and so how long a stall may last before
    it is a hang rather than a slow phase. The Flight Recorder's ``timeout_ms`` of its entries,
    else the watchdog lines' ``Timeout(ms)``, else PyTorch's default (``DEFAULT_TIMEOUT_MS``,
    "PyTorch's default": a job outside PyTorch has no watchdog, and NCCL itself none).
    The smallest seen wins: the first process group to time out ends the job."""
    for name, what in (("fr_entries", "the Flight Recorder's timeout_ms"),
                       ("watchdog_events", "the watchdog's Timeout(ms)")):
        t = ctx.model.tables.get(name)
        if t is None or t.empty or "timeout_ms" not in t:
            continue
        v = pd.to_numeric(t["timeout_ms"], errors="coerce")
        v = v[v > 0]
        if len(v):
            return int(v.min()), what
    return DEFAULT_TIMEOUT_MS, "PyTorch's default"


def abort_cascade(ctx, ranks, peers) -> list[bool]:
    """Per (rank, peer rank) of a socket failure: whether it is the abort cascade of a hang,
    both ends having timed out in their watchdog (:func:`timed_out_ranks`): the first rank
    whose watchdog fired aborted its communicator, closing its sockets under peers still
    waiting in the same collective. A connection that failed *first* would have failed its
    ranks' collectives with an NCCL error, not left them to time out."""
    timed = timed_out_ranks(ctx)
    return [pd.notna(r) and pd.notna(p) and int(r) in timed and int(p) in timed for r, p in zip(ranks, peers)]


def _groups(rows: pd.DataFrame) -> dict:
    """Rows by process group: a timeout line without a PG tag takes the PG its rank's exception
    line names for the same SeqNum (else the only PG the logs name, else the default)."""
    rows = rows.assign(_r=rows["rank"].astype("int64"), _s=pd.to_numeric(rows["seq_num"], errors="coerce"))
    tagged = rows.dropna(subset=["pg_id"])
    by = {(r, s): int(p) for r, s, p in zip(tagged["_r"], tagged["_s"], tagged["pg_id"])}
    pgs = sorted({int(p) for p in tagged["pg_id"]})
    default = pgs[0] if len(pgs) == 1 else 0
    pg = [int(p) if pd.notna(p) else by.get((r, s), default) for p, r, s in zip(rows["pg_id"], rows["_r"], rows["_s"])]
    rows = rows.assign(_pg=pg)
    return {p: g for p, g in rows.groupby("_pg")}


def _world(ctx) -> list[int]:
    """The job's ranks the logs know (their NCCL Init lines)."""
    cfg = ctx.model.tables.get("nccl_config")
    if cfg is None or cfg.empty:
        return []
    return sorted({int(r) for r in pd.to_numeric(cfg["rank"], errors="coerce").dropna()})


def _whole(ctx, world: list[int]) -> bool:
    """Whether the ranks ``world`` the logs know are all the job's: as many as the largest
    communicator's ``nranks`` of its Init lines (``comm_inits``) or the manifest's world size,
    where one says it (an excerpt may show one rank's Init of four)."""
    sizes = [pd.to_numeric(t[c], errors="coerce").max() for t, c in
             ((ctx.model.tables.get("comm_inits"), "nranks"), (ctx.model.tables.get("nccl_config"), "world_size"))
             if t is not None and c in t]
    size = max((int(v) for v in sizes if pd.notna(v)), default=None)
    return bool(world) and (size is None or len(world) >= size)


def _different_calls(to: pd.DataFrame, n, pg_txt: str, dir_hosts, ran, details: dict,
                     common: dict) -> Finding | None:
    """``hang_mismatch`` where the ranks' watchdog lines name different calls at the same
    SeqNum ``n`` (:func:`_signatures`), else None."""
    sig = _signatures(to, n)
    if sig is None:
        return None
    odd, majority, calls = sig
    others = sorted(set(calls) - set(odd))
    mine = "; ".join(f"rank {r} called {calls[r]}" for r in odd[:4])
    return Finding(
        kind="hang_mismatch", severity="error", confidence=0.9,
        headline=(("Hang: {who} called a different collective than {peers}" if others else
                   "Hang: {who} called different collectives")
                  + (f" at SeqNum {n}" if n is not None else " at the same point") + " ({since})"),
        confidence_note="each rank's own watchdog line names the call it waits in",
        summary=(f"Collective mismatch at {f'SeqNum {n}' if n is not None else 'the oldest pending work'} of "
                 f"{pg_txt}: {mine}{_hosts_of(odd, dir_hosts)}"
                 + (f" while {ranks_text(others)} called {majority}" if others else "")
                 + f"; every one timed out after {timeout_text(ran)}."),
        ranks=odd, hosts=_host_list(odd, dir_hosts), peer_ranks=others,
        action=(f"Find why {ranks_text(odd)} issued a different collective at this step (a data-dependent branch, "
                "uneven buckets or batches): every rank must issue the same collectives in the same order."),
        score=1e6 + (ran or 0) / 1e3, details={**details, "calls": {str(k): v for k, v in calls.items()}},
        **common)


def _judge(ctx, pg: int, g: pd.DataFrame, wd: pd.DataFrame) -> Finding | None:
    to = g[g["kind"].isin(TIMEOUT_KINDS)]
    if to.empty:
        return None
    seqs = pd.to_numeric(to["seq_num"], errors="coerce")
    n = int(seqs.mode().iloc[0]) if seqs.notna().any() else None
    timed = sorted(set(to["_r"]))
    # each rank's position: the last work it enqueued (at least the one it timed out in)
    pos: dict[int, int] = {}
    for r, s in zip(to["_r"], seqs):
        if pd.notna(s):
            pos[r] = max(pos.get(r, -1), int(s))
    exc = g[g["kind"].isin(("exception", "dump_signal"))]
    for r, e in zip(exc["_r"], pd.to_numeric(exc["last_enqueued"], errors="coerce")):
        if pd.notna(e):
            pos[r] = max(pos.get(r, -1), int(e))
    world = _world(ctx) if pg == 0 or g["_pg"].nunique() == 1 else []
    members = sorted(set(timed) | set(pos) | set(world))
    behind = sorted(r for r in members if n is not None and r in pos and pos[r] < n)
    silent = sorted(r for r in world if r not in pos and r not in timed)        # logged, never timed out
    dir_hosts = rank_hosts(ctx)
    since_ns = _since(to)
    ran = pd.to_numeric(to["ran_for_ms"], errors="coerce").max()
    ran = None if pd.isna(ran) else float(ran)      # no line said how long: NA (nullable), not 0
    pg_txt = f"process group {pg}"
    op = _op_at(to, n)
    what = f"collective SeqNum {n}" + (f" ({op})" if op else "") if n is not None else "a collective"
    evidence = _evidence(g, wd)
    details = {"pg_id": pg, "seq": n, "op": op, "timed_out_ranks": timed, "positions": {str(k): v for k, v in
                                                                                          pos.items()}}
    common = dict(seq=n, op_count=None, since_ns=since_ns,
                  since_source="PyTorch watchdog: its timeout line's time less the time the work had run"
                  if since_ns else None, evidence=evidence, sql=SQL)
    # 1. the same SeqNum, different collectives
    if (mismatch := _different_calls(to, n, pg_txt, dir_hosts, ran, details, common)) is not None:
        return mismatch
    # 2. ranks that never reached n
    lagging = behind or (silent if timed else [])
    if lagging and n is not None:
        if len(behind) == 1:
            how = f"its last enqueued work is SeqNum {pos[behind[0]]}"
        elif behind:
            how = "last enqueued: " + ", ".join(f"rank {r} SeqNum {pos[r]}" for r in behind[:4])
        else:
            how = ("no watchdog timeout in " + ("its" if len(lagging) == 1 else "their")
                   + " logs: never enqueued, or waiting outside NCCL")
        waiting = sorted(r for r in members if r not in lagging)
        return Finding(
            kind="hang_mismatch", severity="error", confidence=0.85 if behind else 0.7,
            headline=("Hang: {who} never reached " + what + "; {peers} timed out waiting in it ({since})"),
            confidence_note=("each rank's last enqueued work is in its logs" if behind else
                             "lower: these ranks logged no timeout: never enqueued, or waiting outside NCCL"),
            summary=(f"Hung: {ranks_text(lagging)}{_hosts_of(lagging, dir_hosts)} never reached {what} of {pg_txt} "
                     f"({how}); {ranks_text(waiting)} timed out waiting in it after {timeout_text(ran)}."),
            ranks=lagging, hosts=_host_list(lagging, dir_hosts), peer_ranks=waiting,
            action=(f"Find where {ranks_text(lagging)} went instead: its stack (py-spy dump), the last lines "
                    "of its own output (an exception swallowed on that rank, a data-dependent branch, uneven "
                    "batches, early stopping); the waiting ranks are healthy."),
            score=1e6 + (ran or 0) / 1e3, details={**details, "behind": lagging, "waiting": waiting}, **common)
    # 3. every rank inside n: what stalled it
    first = warns.rows_of(ctx, [c for c in _cause_classes()])
    first = first[first["first"].fillna(False).astype(bool)] if len(first) else first
    if len(first):       # a socket failure between two ranks that had timed out: the abort cascade
        first = first[~pd.Series(abort_cascade(ctx, first["rank"], first["peer_rank"]), index=first.index, dtype=bool)]
    if not len(first) and (lag := lag_on_ring(ctx, to, g, world, common, details)) is not None:
        return lag
    dump = wd[(wd["kind"] == "dump_signal") & wd["peer_rank"].notna()]
    cause, blamed = "", []
    if len(first):
        f0 = first.iloc[0]
        cause = (f"; the first failure in the logs: {f0['class'].replace('_', ' ')} on {f0['host']}"
                 + (f" at {warns.utc_clock(f0['time_ns'])}" if pd.notna(f0["time_ns"]) else "")
                 + f" (\"{str(f0['message'])[:100]}\")")
        blamed = warns.ranks_of_hosts(ctx, [f0["host"]]) if isinstance(f0["host"], str) else []
    elif len(dump):
        r0 = int(dump["peer_rank"].mode().iloc[0])
        cause = f"; rank {r0}'s watchdog fired first (the dump signals name it)"
    hosts = sorted({h for h in (first["host"].head(1) if len(first) else []) if isinstance(h, str)})
    # "every rank" only where the logs know the job's ranks (their Init lines); else those that logged
    # a rank whose own timeout is a later SeqNum went past n (a broadcast's root): said apart
    at_n = sorted({r for r, q in zip(to["_r"], seqs) if n is None or q == n}) or timed
    ahead = sorted({r for r, q in zip(to["_r"], seqs) if n is not None and pd.notna(q) and q > n} - set(at_n))
    everyone = "every rank" if _whole(ctx, world) and not ahead else ranks_text(at_n)
    past = f", {ranks_text(ahead)} already past it" if ahead else ""
    return Finding(
        kind="hang_stuck", severity="error", confidence=0.75 if cause else 0.6,
        headline=((f"Hang: {everyone} timed out in " + what + past + "; first failure on {who} ({since})") if blamed else
                  (f"Hang: {everyone} timed out in " + what + past + (f"; first failure on {hosts[0]}" if hosts else
                                                              "; the logs name no cause") + " ({since})")),
        confidence_note=("the logs name the first failure" if cause else
                         "lower: the hang is certain, the logs name no cause"),
        summary=(f"Hung: every rank of {pg_txt} that logged ({ranks_text(at_n)}) timed out in {what} after "
                 f"{timeout_text(ran)}" + (f", {ranks_text(ahead)} in a later one" if ahead else "")
                 + f": the collective itself stalled (a peer's GPU or process, or the network){cause}."),
        ranks=blamed, hosts=hosts or _host_list(blamed, dir_hosts), peer_ranks=sorted(set(timed) - set(blamed)),
        action=("Find the first error of the job: the NCCL WARN lines (IB or socket errors name the link and the "
                "peer), dmesg on each host (Xid, NIC resets), the ranks' stacks; then restart without the host at "
                "fault."), score=1e6 + (ran or 0) / 1e3, details=details, **common)


RING_COLLECTIVES = ("ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER")   # each rank receives from its ring predecessor


def lag_on_ring(ctx, to: pd.DataFrame, g: pd.DataFrame, world: list[int], common: dict, details: dict) -> Finding | None:
    """A ``hang_stuck`` finding naming the ring link a hang stalled on, from the watchdog lines of
    one process group (``to``: its timeout rows, ``g``: all its rows, ``world``: the job's ranks
    when the group is the world's), or None.

    The watchdog's timeout line names each rank's *oldest* pending work. When some ranks
    (``lagging``) still wait in SeqNum m, a ring collective (:data:`RING_COLLECTIVES`), while the
    others completed it (their oldest pending work is later, or their exception line's last
    completed work is m or more), the lagging ranks lack data the others had: on the ring each
    rank receives only from its predecessor (the NCCL log's ``Ring xx : p -> r -> n`` lines of
    its lowest channel, ``nccl_config.ring_prev``, of processes with one communicator). A lagging rank whose predecessor completed m was never sent, or
    never got, its predecessor's last data: the link predecessor -> rank stalled (either end's
    NIC, cable or switch port; the logs cannot tell which end). A lagging rank whose predecessor
    lags too is downstream of the stall and names no link. Both ends of each such link are the
    finding's ranks, the other ranks its peers. None where the group is not the world's, the
    logs hold no ring lines for those ranks (or their ring lines disagree), m is another kind of
    collective (a broadcast's root finishes first by design), or no rank completed m."""
    seqs = pd.to_numeric(to["seq_num"], errors="coerce")
    if not world or seqs.isna().all():
        return None
    m = int(seqs.min())
    op = _op_at(to, m)
    if op not in RING_COLLECTIVES:
        return None
    done = {int(r) for r, q in zip(to["_r"], seqs) if pd.notna(q) and q > m}
    exc = g[g["kind"] == "exception"]
    done |= {int(r) for r, c in zip(exc["_r"], pd.to_numeric(exc["last_completed"], errors="coerce"))
             if pd.notna(c) and c >= m}
    lagging = sorted({int(r) for r, q in zip(to["_r"], seqs) if q == m} - done)
    ring = _ring(ctx)
    edges = [(ring[r][0], r) for r in lagging if r in ring and ring[r][0] in done
             and ring.get(ring[r][0], (None, None))[1] == r]
    if not lagging or not edges:
        return None
    ends = sorted({x for e in edges for x in e})
    peers = sorted((set(done) | set(lagging) | set(world)) - set(ends))
    what = f"collective SeqNum {m} ({op})"
    links_txt = ", ".join(f"rank {p} -> rank {r}" for p, r in edges)
    (p0, r0) = edges[0]
    addrs = _addrs(ctx)
    trees = _has_trees(ctx)
    return Finding(
        kind="hang_stuck", severity="error", confidence=0.6 if trees else 0.7, layer="peer",
        headline=(f"Hang: ring link {links_txt} stalled: {ranks_text(lagging)} still "
                  f"{'waits' if len(lagging) == 1 else 'wait'} in SeqNum {m} ({op}), which {ranks_text(sorted(done))} "
                  "completed ({since})"),
        confidence_note=("each rank's watchdog names its oldest pending collective; the ring from the NCCL log's "
                         "Ring lines" + ("; the logs show tree channels too: a tree all-reduce would read "
                                         "otherwise" if trees else "")),
        summary=(f"Hung: {ranks_text(lagging)} of the job timed out still waiting in {what}, while "
                 f"{ranks_text(sorted(done))} had completed it and timed out in a later one. On the ring every "
                 f"rank receives from its predecessor: rank {r0} still waits for data of rank {p0}, which had "
                 f"completed SeqNum {m}: the link {links_txt} stalled (either end's NIC, cable or switch port; "
                 "the logs cannot tell which end)."),
        ranks=ends, peer_ranks=peers,
        links=[{"rank": p, "peer_rank": r, **({"saddr": addrs[p], "daddr": addrs[r]} if p in addrs and r in addrs
                                                else {}), "event": f"ring data never arrived in SeqNum {m}"}
               for p, r in edges],
        chain=[f"watchdog: {ranks_text(lagging)} timed out in SeqNum {m} ({op}), the oldest pending work",
               f"watchdog: {ranks_text(sorted(done))} had completed SeqNum {m} (timed out in a later one)",
               "NCCL Ring lines: " + "; ".join(f"rank {r} receives from rank {p}" for p, r in edges),
               f"so the data on {links_txt} never arrived: that link stalled"],
        action=(f"Check the link between rank {p0} and rank {r0}: both hosts' NIC counters and link state "
                "(ip -s link, ethtool, dmesg for link down / NIC resets), the switch ports; a capture "
                "(stallscope capture) would name the end whose packets go unanswered."),
        score=1e6 + (pd.to_numeric(to["ran_for_ms"], errors="coerce").max() or 0) / 1e3,
        details={**details, "seq": m, "op": op, "lagging": lagging, "completed": sorted(done),
                 "ring_links": [[p, r] for p, r in edges]},
        **{**common, "seq": m})


def _ring(ctx) -> dict[int, tuple[int, int]]:
    """rank -> (ring predecessor, ring successor) from the NCCL logs' Ring lines (its lowest
    channel). Only processes with one communicator: a Ring line prints the ranks of its own
    communicator, which for another than the world's are not the global ranks. A rank whose
    processes disagree is left out."""
    cfg = ctx.model.tables.get("nccl_config")
    if cfg is None or cfg.empty or "ring_prev" not in cfg:
        return {}
    if "comms" in cfg:
        cfg = cfg[~(pd.to_numeric(cfg["comms"], errors="coerce") > 1).fillna(False).to_numpy(bool)]
    cfg = cfg[["rank", "ring_prev", "ring_next"]].apply(pd.to_numeric, errors="coerce").dropna().astype("int64")
    out: dict[int, tuple[int, int]] = {}
    for r, g in cfg.drop_duplicates().groupby("rank"):
        if len(g) == 1:
            out[int(r)] = (int(g["ring_prev"].iloc[0]), int(g["ring_next"].iloc[0]))
    return out


def _addrs(ctx) -> dict[int, str]:
    """rank -> its one NET/Socket address, where the logs name exactly one."""
    cfg = ctx.model.tables.get("nccl_config")
    if cfg is None or cfg.empty or "socket_addrs" not in cfg:
        return {}
    out = {}
    for r, a in zip(pd.to_numeric(cfg["rank"], errors="coerce"), cfg["socket_addrs"]):
        if pd.notna(r) and isinstance(a, str) and a and "," not in a:
            out.setdefault(int(r), a)
    return out


def _has_trees(ctx) -> bool:
    cfg = ctx.model.tables.get("nccl_config")
    return cfg is not None and "tree_channels" in cfg and bool((pd.to_numeric(cfg["tree_channels"], errors="coerce")
                                                                 .fillna(0) > 0).any())


def _cause_classes() -> list[str]:
    return [c.name for c in CLASSES if c.kind != "none"]


def _signatures(to: pd.DataFrame, n) -> tuple[list[int], str, dict[int, str]] | None:
    """(odd ranks, the majority's call, every rank's call) when the ranks' timeouts at SeqNum n
    name different collectives (op type or element count); None when they agree."""
    seqs = pd.to_numeric(to["seq_num"], errors="coerce")
    if n is None and seqs.notna().any():
        return None
    # a timeout line without the WorkNCCL description ("Timeout at NCCL work: n") names no call;
    # without any SeqNum (PyTorch < 1.10) each rank's line is its oldest pending work: the same
    # position on every rank of the group, so different calls there are a mismatch too
    at = to[(seqs == n if n is not None else seqs.isna()) & to["op_type"].notna()]
    at = at.drop_duplicates("_r", keep="first")
    if len(at) < 2:
        return None
    sig = at["op_type"].astype("string").fillna("?") + pd.Series(
        [f" of {int(x)} elements" if pd.notna(x) else "" for x in pd.to_numeric(at["numel_in"], errors="coerce")],
        index=at.index, dtype="string")
    counts = sig.value_counts()
    if len(counts) < 2:
        return None
    odd_sigs = set(counts.index) if counts.iat[0] == counts.iat[1] else set(counts.index[1:])
    calls = {int(r): str(s) for r, s in zip(at["_r"], sig)}
    odd = sorted(r for r, s in calls.items() if s in odd_sigs)
    return odd, str(counts.index[0]), calls


def _op_at(to: pd.DataFrame, n) -> str | None:
    at = to[pd.to_numeric(to["seq_num"], errors="coerce") == n] if n is not None else to
    ops = at["op"].dropna().astype(str)
    return ops.mode().iloc[0] if len(ops) else None


def _since(to: pd.DataFrame) -> int | None:
    """The earliest dated timeout line less how long its work had run; a line that does not say
    (``Timeout at NCCL work``) takes the time another rank's line gives for the same SeqNum, else
    its own timeout, else none."""
    seq = pd.to_numeric(to["seq_num"], errors="coerce")
    ran = pd.to_numeric(to["ran_for_ms"], errors="coerce")
    by_seq = ran.groupby(seq).max()
    ran = ran.fillna(seq.map(by_seq)).fillna(pd.to_numeric(to["timeout_ms"], errors="coerce")).fillna(0)
    t = pd.to_numeric(to["time_ns"], errors="coerce") - ran * 1e6
    return int(t.min()) if t.notna().any() else None


def rank_hosts(ctx) -> dict[int, str]:
    """rank -> the first host the evidence places it on (:func:`.warns.host_ranks`)."""
    out: dict[int, str] = {}
    for h, rs in warns.host_ranks(ctx).items():
        for r in rs:
            out.setdefault(r, h)
    return out


def _host_list(ranks: list[int], hosts: dict[int, str]) -> list[str]:
    return sorted({hosts[r] for r in ranks if r in hosts})


def _hosts_of(ranks: list[int], hosts: dict[int, str]) -> str:
    hs = _host_list(ranks, hosts)
    return f" (on {', '.join(hs[:4])}{' ...' if len(hs) > 4 else ''})" if hs else ""


def timeout_text(ms) -> str:
    """A timeout in ms as people state it: "10 min" from two minutes up, else "45 s"."""
    if ms is None or pd.isna(ms):
        return "its timeout"
    s = float(ms) / 1e3
    return f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"


def _evidence(g: pd.DataFrame, wd: pd.DataFrame) -> list[dict]:
    # the dump signals that name a rank, besides those already in g (the ones that place one)
    extra = wd[(wd["kind"] == "dump_signal") & ~wd.index.isin(g.index)]
    rows = pd.concat([g, extra], ignore_index=True)
    cols = ["host", "rank", "pg_id", "kind", "seq_num", "op", "numel_in", "last_enqueued", "last_completed",
            "ran_for_ms", "time_ns", "artifact", "log_line"]
    return warns.evidence(rows.sort_values(["rank", "kind"], kind="stable"), cols, MAX_EVIDENCE)


__all__ = ["lag_on_ring", "rank_hosts", "watchdog_hangs"]
