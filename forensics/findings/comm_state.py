"""The state at capture, per communicator and rank: what a capture that missed the hang's onset
still knows, fused (:mod:`.late_state` judges it).

Per rank: its **position** (the last collective it launched: NCCL_DEBUG COLL lines,
``coll_log_ops``, Flight Recorder ``last_enqueued_collective`` - 1; the last it completed:
Flight Recorder ``last_completed_collective`` - 1), **where** its main thread is (``stacks``:
inside an NCCL call or a CUDA wait, or elsewhere), and its sockets (``sockets`` samples).
Per communicator (:class:`CommState`): the window every one of its hosts watched
(:mod:`forensics.model.windows`), how long nothing progressed before its end (a collective the
tracer saw, a Flight Recorder completion, bytes acknowledged or received between two ranks),
and whether that makes it hung (``STATE_MIN_SILENCE_NS``, or several times its normal
collective duration, with some rank positively inside a collective).

Inputs: the model's tables through a findings ``Context``. Outputs: :class:`CommState` records
(:func:`communicator_states`), and the stuck sockets between a communicator's ranks
(:func:`stuck_sockets`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..coerce import cell_int
from ..model.windows import host_windows
from .onset import Onset
from .sql import model_table

STATE_MIN_SILENCE_NS = 3_000_000_000   # no progress this long (or 5x the p99 collective) before the window's end
DURATION_FACTOR = 5.0
STUCK_BACKOFF = 1                      # an RTO backoff this deep on a socket with data unacked: a dead path
STUCK_LASTACK_MS = 1_000.0             # ... or nothing acknowledged for this long while data is unacked
# a frame that means "inside NCCL or waiting for the GPU"
NCCL_FRAME_RE = re.compile(
    r"(?:^|[^A-Za-z])(?:cuda|cu)(?:Stream|Event|Device|Ctx)Synchronize|^p?nccl[A-Z]|ncclGroupEnd|"
    r"ProcessGroupNCCL|WorkNCCL|c10d::|synchronize_stream")
NCCL_FILE_RE = re.compile(r"torch/distributed/|torch/cuda/")
# libc's internal names of the calls a stack ends in, shown as the call itself
_LIBC_PREFIX = re.compile(r"^(?:__GI_)?_*(?:libc_)?")
TRACER = "tracer (calls after attach)"
RECV_SYSCALLS = {"recvfrom", "recvmsg", "read", "recv", "readv", "recvmmsg"}
# a thread blocked in one of these on a socket waits on that socket's peer: to receive from
# it, or (a full send buffer, a sender's wait for the receiver's clear-to-send) for it to read
WAIT_SYSCALLS = RECV_SYSCALLS | {"poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait",
                                 "epoll_pwait2", "sendto", "sendmsg", "write", "writev"}


@dataclass
class RankState:
    rank: int
    host: str | None = None
    pid: int | None = None
    position: int | None = None           # last op launched on the communicator
    position_op: str | None = None
    position_source: str | None = None
    completed: int | None = None          # last op completed (Flight Recorder)
    in_nccl: bool | None = None           # main thread inside NCCL / a CUDA wait (stacks)
    where: str | None = None              # main thread's innermost frames
    last_progress_ns: int | None = None   # latest progress seen (any source)
    progress_source: str | None = None
    sources: set = field(default_factory=set)


@dataclass
class CommState:
    key: str                              # NCCL commId, "pg:<id>" (Flight Recorder) or "world"
    label: str
    nranks: int | None
    ranks: dict[int, RankState]
    window: tuple[int, int] | None        # the window every host of the communicator watched
    silence_ns: int | None                # no progress for this long before the window's end
    need_ns: int
    hung: bool
    inflight: list[int]                   # ranks with positive evidence of being inside a collective
    sources: list[str]
    overlap: bool = True                  # False: the hosts' captures (barely) overlapped; each judged alone
    onset: "Onset | None" = None          # since when (hung communicators: late_hang_findings)
    first_open: int | None = None         # the first op not every rank completed (ditto)
    capture_start_ns: int | None = None   # when the first capture began (model.windows.capture_start_ns)


# --------------------------------------------------------------------------- building the state

def communicator_states(ctx) -> list[CommState]:
    """Every communicator the artefacts know, with its ranks' fused state."""
    procs = _process_evidence(ctx)
    comms = _positions(ctx)
    windows = host_windows(model_table(ctx, "capture_windows"))
    out = []
    for key, (label_, nranks, pos) in comms.items():
        ranks: dict[int, RankState] = {}
        for r in pos.itertuples(index=False):
            g = int(r.rank)
            st = ranks.setdefault(g, RankState(g, _str(r.host), cell_int(r.pid)))
            if pd.notna(r.position):
                st.position, st.position_op, st.position_source = int(r.position), _str(r.op), r.source
                st.sources.add(r.source)
            if pd.notna(r.completed):
                st.completed = int(r.completed)
        for st in ranks.values():
            ev = procs.get((st.host, st.pid))
            if ev is not None:
                st.in_nccl, st.where = ev["in_nccl"], ev["where"]
                st.last_progress_ns, st.progress_source = ev["last_progress_ns"], ev["progress_source"]
                st.sources |= ev["sources"]
        out.append(_judge(ctx, key, label_, nranks, ranks, windows))
    return out


def _str(v) -> str | None:
    """A nullable string column's value: None for NA (whose truth value raises)."""
    return v if isinstance(v, str) else None


def _positions(ctx) -> dict[str, tuple[str, int | None, pd.DataFrame]]:
    """communicator key -> (label, nranks, rows: rank, host, pid, position, op, source, completed)."""
    cols = ["rank", "host", "pid", "position", "op", "source", "completed"]
    out: dict[str, tuple[str, int | None, pd.DataFrame]] = {}
    logs = model_table(ctx, "coll_log_ops")
    logs = logs[logs["comm_id"].notna() & logs["rank"].notna()] if len(logs) else logs
    world_of: dict[tuple, str] = {}   # (host, pid) -> its largest communicator (the world): FR's default PG
    if len(logs):
        for cid, g in logs.groupby("comm_id"):
            rows = pd.DataFrame({"rank": g["rank"].astype("int64"), "host": g["host"], "pid": g["pid"],
                                 "position": g["last_op_count"], "op": g["last_op"],
                                 "source": "NCCL_DEBUG COLL lines", "completed": pd.NA})
            n = pd.to_numeric(g["nranks"], errors="coerce").max()
            out[str(cid)] = (f"communicator {cid}", None if pd.isna(n) else int(n), rows[cols])
        big = logs.sort_values("nranks", kind="stable").drop_duplicates(["host", "pid"], keep="last")
        world_of = {(h, int(p)): str(c) for h, p, c in zip(big["host"], big["pid"], big["comm_id"])
                    if pd.notna(p)}       # a row of no pid names no process's world
    fr = model_table(ctx, "fr_pg_status")
    if len(fr):
        fr = fr.dropna(subset=["rank", "pid"])
        for pg, g in fr.groupby(fr["pg_id"].astype(str)):
            enq = pd.to_numeric(g["last_enqueued_collective"], errors="coerce") - 1
            done = pd.to_numeric(g["last_completed_collective"], errors="coerce") - 1
            rows = pd.DataFrame({"rank": g["rank"].astype("int64"), "host": g["host"], "pid": g["pid"],
                                 "position": enq, "op": None, "source": "Flight Recorder", "completed": done})
            # the default process group is the world communicator the logs already name
            target = {world_of.get((h, int(p))) for h, p in zip(g["host"], g["pid"])} - {None}
            key = target.pop() if pg == "0" and len(target) == 1 else f"pg:{pg}"
            if key in out:
                lab, n, have = out[key]
                merged = have.merge(rows[["host", "pid", "position", "completed"]], on=["host", "pid"], how="outer",
                                    suffixes=("", "_fr"))
                # the logs say what was launched; Flight Recorder adds what completed (and fills gaps)
                merged["source"] = merged["source"].fillna("Flight Recorder")
                merged["position"] = merged["position"].fillna(merged["position_fr"])
                merged["completed"] = merged["completed_fr"]
                merged["rank"] = merged["rank"].fillna(
                    merged[["host", "pid"]].merge(rows, on=["host", "pid"], how="left")["rank"])
                out[key] = (lab, n, merged.dropna(subset=["rank"])[cols])
            else:
                out[key] = (f"process group {pg}", None, rows[cols])
    if not out:
        # neither logs nor Flight Recorder: the world of the processes' RANK / WORLD_SIZE
        rows, size = [], None
        for c in ctx.model.captures:
            for p in c.get("processes", []):
                if p.get("rank") is not None:
                    rows.append({"rank": int(p["rank"]), "host": c["host"], "pid": p["pid"], "position": pd.NA,
                                 "op": None, "source": None, "completed": pd.NA})
                    size = max(size or 0, int(p.get("world_size") or 0)) or None
        if rows:
            out["world"] = ("the job's world (RANK / WORLD_SIZE)", size, pd.DataFrame(rows)[cols])
    return out


def _process_evidence(ctx) -> dict[tuple, dict]:
    """(host, pid) -> in_nccl, where, last_progress_ns, progress_source, sources."""
    out: dict[tuple, dict] = {}

    def get(host, pid) -> dict:
        return out.setdefault((host, int(pid)), {"in_nccl": None, "where": None, "last_progress_ns": None,
                                                "progress_source": None, "sources": set()})

    def progress(host, pid, t, source):
        e = get(host, pid)
        e["sources"].add(source)
        if t is not None and (e["last_progress_ns"] is None or t > e["last_progress_ns"]):
            e["last_progress_ns"], e["progress_source"] = int(t), source

    # stacks: where each process's main thread is
    st = model_table(ctx, "stacks")
    if len(st):
        for (host, pid), g in st.dropna(subset=["pid"]).groupby(["host", "pid"]):
            frames = _main_thread_frames(g, int(pid))
            if not frames:
                continue
            e = get(host, pid)
            e["sources"].add("stacks")
            e["in_nccl"] = any(NCCL_FRAME_RE.search(f) or NCCL_FILE_RE.search(fl or "") for f, fl in frames)
            e["where"] = frames_text(frames)
    # the tracer: any call launched or completed while it watched
    n = model_table(ctx, "nccl_events")
    if len(n):
        n = n.dropna(subset=["pid"])
        t = pd.concat([n["timestamp_ns"], n["end_ns"].where(n["completed"].fillna(False).astype(bool))], axis=1)
        last = t.max(axis=1)
        for (host, pid), v in last.groupby([n["host"], n["pid"]]).max().items():
            progress(host, pid, None if pd.isna(v) else int(v), TRACER)
    # Flight Recorder completions (realtime clocks only: monotonic stamps cannot be placed)
    fe = model_table(ctx, "fr_entries")
    if len(fe):
        done = pd.to_numeric(fe["time_discovered_completed_ns"], errors="coerce")
        fe = fe.assign(_d=done)[(done > 1e18).fillna(False).to_numpy()].dropna(subset=["pid"])
        for (host, pid), v in fe.groupby(["host", "pid"])["_d"].max().items():
            progress(host, pid, int(v), "Flight Recorder")
    # sockets: bytes acknowledged or received between two samples of a connection between ranks
    for (host, pid), t in _socket_progress(ctx).items():
        progress(host, pid, t, "socket samples")
    return out


def _main_thread_frames(g: pd.DataFrame, pid: int) -> list[tuple[str, str | None]]:
    """Innermost-first (function, file) of the process's main thread in its latest dump."""
    if "phase" in g and g["phase"].notna().any():
        order = {"start": 0, None: 1, "end": 2}
        last = max(g["phase"].unique(), key=lambda p: order.get(p if isinstance(p, str) else None, 1))
        g = g[g["phase"] == last] if isinstance(last, str) else g
    tid = pd.to_numeric(g["os_tid"], errors="coerce")
    main = g[(tid == pid).fillna(False).to_numpy()]
    if main.empty:
        main = g[(g["thread_name"].astype("string") == "MainThread").fillna(False).to_numpy()]
    if main.empty:
        return []
    main = main[main["thread_id"] == main["thread_id"].iloc[0]].sort_values("depth", kind="stable")
    return [(str(f), None if pd.isna(fl) else str(fl)) for f, fl in zip(main["function"], main["code_file"])
            if isinstance(f, str) and f]


def frames_text(frames: list[tuple[str, str | None]], depth: int = 3) -> str:
    """"pause() <- other_code_path <- main": the innermost distinct frames, libc's internal
    names shown as the call."""
    names: list[str] = []
    for f, _ in frames:
        name = _LIBC_PREFIX.sub("", f.split("(")[0].strip()) or f
        if name in ("syscall", "futex_wait", "futex_abstimed_wait_common", "futex_abstimed_wait_common64"):
            continue
        if not names or names[-1] != name:
            names.append(name)
        if len(names) == depth:
            break
    if not names:
        return ""
    return " <- ".join([names[0] + "()"] + names[1:])


def socket_samples(ctx) -> pd.DataFrame:
    """sockets between two ranks with a sample time (ss-series blocks; start/end snapshots at
    the capture's start/end)."""
    s = model_table(ctx, "sockets")
    if s.empty:
        return s
    s = s[s["peer_rank"].notna() & s["rank"].notna() & s["pid"].notna()].copy()
    if s.empty:
        return s
    bounds = {c["host"]: (c.get("started_ns"), c.get("ended_ns")) for c in ctx.model.captures}
    t = pd.to_numeric(s["sample_ns"], errors="coerce")
    start = s["host"].map(lambda h: bounds.get(h, (None, None))[0])
    end = s["host"].map(lambda h: bounds.get(h, (None, None))[1])
    t = t.fillna(pd.to_numeric(start.where(s["phase"] == "start"), errors="coerce"))
    t = t.fillna(pd.to_numeric(end.where(s["phase"] == "end"), errors="coerce"))
    s["t"] = t
    s = s.dropna(subset=["t"])
    s["conn"] = (s["local_addr"].astype(str) + ":" + s["local_port"].astype(str) + ">" + s["peer_addr"].astype(str)
                 + ":" + s["peer_port"].astype(str))
    return s.sort_values("t", kind="stable")


def _socket_progress(ctx) -> dict[tuple, int]:
    """(host, pid) -> the latest sample time at which a connection to another rank had more
    bytes acknowledged or received than at its previous sample."""
    s = socket_samples(ctx)
    if s.empty:
        return {}
    moved = np.zeros(len(s), dtype=bool)
    for col in ("bytes_acked", "bytes_received"):
        v = pd.to_numeric(s[col], errors="coerce")
        prev = v.groupby([s["host"], s["conn"]]).shift()
        moved |= (v > prev).fillna(False).to_numpy()
    m = s[moved]
    return {(h, int(p)): int(t) for (h, p), t in m.groupby(["host", "pid"])["t"].max().items()}


def _judge(ctx, key, label_, nranks, ranks: dict[int, RankState], windows) -> CommState:
    hosts = {st.host for st in ranks.values() if st.host}
    spans = [windows[h] for h in hosts if h in windows]
    window = (max(a for a, _ in spans), min(b for _, b in spans)) if spans else None
    p99 = collective_p99_ns(ctx)
    need = int(max(STATE_MIN_SILENCE_NS, DURATION_FACTOR * p99))
    sources = sorted({s for st in ranks.values() for s in st.sources})
    inflight = sorted(r for r, st in ranks.items() if st.in_nccl or
                      (st.completed is not None and st.position is not None and st.position > st.completed))
    # ranks that launched collectives a peer never launched wait in them: those cannot complete
    pos = [st.position for st in ranks.values() if st.position is not None]
    ahead = [r for r, st in ranks.items() if st.position is not None and st.position > min(pos)] if pos else []
    # a thread blocked on a socket to another rank is inside a transfer (NCCL's data moves only
    # inside collectives); with no progress anywhere, it waits in one
    waiting = sorted({a for a, _ in wait_sink(ctx, set(ranks))[1]})
    if waiting:
        sources = sorted(set(sources) | {"thread states"})
    inflight = sorted(set(inflight) | set(ahead) | set(_stuck_socket_ranks(ctx, set(ranks))) | set(waiting))
    if window is not None and window[1] - window[0] < need and len(spans) == len(hosts) > 1:
        # captures that never (or barely) overlapped: each host watched its own ranks. A
        # communicator none of whose hosts saw its ranks progress in its own window, long
        # enough, with positive evidence of being inside a collective, is hung all the same
        # (a rank cannot complete a collective without its peers); one host that saw progress
        # clears it
        per = []
        for h in hosts:
            a, b = windows[h]
            seen_h = [st.last_progress_ns for st in ranks.values() if st.host == h and st.last_progress_ns is not None]
            per.append(b - max(max(seen_h), a) if seen_h else b - a)
        silence = min(per)
        union = (min(a for a, _ in spans), max(b for _, b in spans))
        return CommState(key, label_, nranks, ranks, union, silence, need, silence >= need and bool(inflight),
                         inflight, sources, overlap=False)
    if window is None or window[1] <= window[0]:
        return CommState(key, label_, nranks, ranks, window, None, need, False, inflight, sources)
    end = window[1]
    seen = [st.last_progress_ns for st in ranks.values() if st.last_progress_ns is not None]
    last = max(seen) if seen else None
    silence = end - max(last, window[0]) if last is not None else end - window[0]
    hung = silence >= need and bool(inflight) and (last is None or last <= end - need)
    return CommState(key, label_, nranks, ranks, window, silence, need, hung, inflight, sources)


def collective_p99_ns(ctx) -> float:
    n = model_table(ctx, "nccl_events")
    if n.empty:
        return 0.0
    d = pd.to_numeric(n.loc[n["completed"].fillna(False).astype(bool), "duration_ns"], errors="coerce").dropna()
    return float(d.quantile(0.99)) if len(d) else 0.0


def stuck_sockets(ctx, members: set[int]) -> pd.DataFrame:
    """The latest sample of each connection between members that holds unacknowledged data
    with nothing acknowledged for a while (an RTO backoff, or lastack long ago)."""
    s = socket_samples(ctx)
    if s.empty:
        return s
    s = s[s["rank"].astype("int64").isin(members) & s["peer_rank"].astype("int64").isin(members)]
    last = s.drop_duplicates(["host", "conn"], keep="last")
    unacked = pd.to_numeric(last["unacked"], errors="coerce").fillna(0)
    backoff = pd.to_numeric(last["backoff"], errors="coerce").fillna(0)
    lastack = pd.to_numeric(last["lastack_ms"], errors="coerce").fillna(0)
    stuck = (unacked > 0) & ((backoff >= STUCK_BACKOFF) | (lastack >= STUCK_LASTACK_MS))
    return last[stuck.to_numpy()]


def _stuck_socket_ranks(ctx, members: set[int]) -> list[int]:
    st = stuck_sockets(ctx, members)
    return sorted(set(st["rank"].astype("int64"))) if len(st) else []


def wait_sink(ctx, members: set[int]) -> tuple[int | None, list[tuple[int, int]]]:
    """Who waits on whom: threads blocked (recv, poll, epoll, a full send) on a socket whose
    peer is another rank of the communicator. The stuck rank is the one every waiting rank
    leads to and that waits on no one outside itself: the only sink of the wait-for graph
    (its strongly connected components), of size one. A ring's ranks wait on their
    neighbours, and those on theirs, down to the rank whose stream stopped."""
    th = model_table(ctx, "threads")
    s = model_table(ctx, "sockets")
    if th.empty or s.empty:
        return None, []
    th = th[th["syscall_name"].isin(WAIT_SYSCALLS) & th["socket_inode"].notna() & th["rank"].notna()]
    if "phase" in th and (th["phase"] == "end").any():
        th = th[th["phase"] == "end"]
    s = s.dropna(subset=["inode", "peer_rank"]).drop_duplicates(["host", "inode"], keep="last")
    if th.empty or s.empty:
        return None, []
    j = th.merge(s[["host", "inode", "peer_rank"]], left_on=["host", "socket_inode"], right_on=["host", "inode"])
    edges = sorted({(int(a), int(b)) for a, b in zip(j["rank"], j["peer_rank"]) if a != b and int(a) in members
                    and int(b) in members})
    return graph_sink(edges), edges


def graph_sink(edges: list[tuple[int, int]]) -> int | None:
    """The single node all of a wait-for graph drains into: its only sink component, when that
    has one node; None when the waits form several sinks or a cycle (a deadlock, not one culprit)."""
    nodes = sorted({x for e in edges for x in e})
    if not nodes:
        return None
    out: dict[int, set[int]] = {n: set() for n in nodes}
    for a, b in edges:
        out[a].add(b)

    def reach(n: int) -> set[int]:
        seen, todo = {n}, [n]
        while todo:
            for m in out[todo.pop()]:
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return seen
    r = {n: reach(n) for n in nodes}
    # n is in a sink component when everything it reaches reaches it back
    sinks = [n for n in nodes if all(n in r[m] for m in r[n])]
    comps = {frozenset(r[n]) for n in sinks}
    if len(comps) != 1:
        return None
    (comp,) = comps
    return next(iter(comp)) if len(comp) == 1 else None
