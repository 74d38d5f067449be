"""Hangs judged from the state at capture, and only inside the hosts' common window.

Synthetic model tables of a 4-rank job, one rank per host, as a late capture (the tracer
saw no collective: they were all entered before it attached) or as per-host captures that
started and stopped apart. Every negative case has a positive twin.
"""
from __future__ import annotations

import json

from forensics.findings import Context
from forensics.findings.connection_reset import reset_state
from forensics.findings.hang import hang_frontiers, hang_state as hangs_at_capture, hang_stuck
from forensics.model.schema import empty
from captured_job import RANKS, S, T0, WINDOW, captures, context, windows

MS = 1_000_000
COMM = "0x92504a7cbb72bbba"


def hang_state(ctx: Context) -> list:
    """What the analysis says without the tracer: the hangs (hang.hang_state), then the resets
    (connection_reset.reset_state), the two detectors that judge the state at capture."""
    return hangs_at_capture(ctx) + reset_state(ctx)


def addr(r: int) -> str:
    return f"10.9.0.{10 + r}"


def coll_logs(pos: dict[int, int]):
    return [{"host": f"node{r}", "pid": 100 + r, "rank": r, "log_pid": 100 + r, "comm_ptr": f"0x5{r}",
             "comm_id": COMM, "comm_rank": r, "nranks": RANKS, "last_op_count": p, "last_op": "ALL_REDUCE",
             "last_count": 1024, "lines": p + 1, "artifact": f"logs/nccl-rank{r}.log"} for r, p in pos.items()]


def stack(r: int, frames: list[str]):
    """The main thread's native stack (innermost first), as capture's eu-stack dump gives it."""
    return [{"host": f"node{r}", "pid": 100 + r, "rank": r, "phase": None, "thread_id": str(100 + r),
             "os_tid": 100 + r, "thread_name": "sslab_rank", "depth": d, "function": f,
             "artifact": f"stacks/native-{100 + r}.txt"} for d, f in enumerate(frames)]


IN_NCCL = ["__futex_abstimed_wait_common", "pthread_cond_wait", "cudaStreamSynchronize", "train_step", "main"]
PAUSED = ["__GI___pause", "other_code_path", "main"]
COMPUTING = ["__GI___clock_nanosleep", "nanosleep", "compute", "train_step", "main"]


def sock(r: int, p: int, t: int, acked: int = 1000, received: int = 1000, unacked=None, backoff=None, lastack=None,
         inode=None):
    """One ss sample of rank r's connection to rank p."""
    return {"host": f"node{r}", "netns": "host", "phase": None, "pid": 100 + r, "rank": r, "peer_rank": p,
            "state": "ESTAB", "local_addr": addr(r), "local_port": 40000 + p, "peer_addr": addr(p),
            "peer_port": 50000 + r, "bytes_acked": acked, "bytes_received": received, "unacked": unacked,
            "backoff": backoff, "lastack_ms": lastack, "sample_ns": t, "inode": inode}


def ring_samples(moving_until=None, **kw):
    """Samples every 2 s of each rank's connections to its ring neighbours; bytes grow at every
    sample up to ``moving_until`` (a job still running), else they stay put (a hang)."""
    rows = []
    for i, t in enumerate(range(WINDOW[0], WINDOW[1] + 1, 2 * S)):
        grow = moving_until is not None and t <= moving_until
        n = 1000 + (i * 4096 if grow else 0)
        for r in range(RANKS):
            for p in ((r + 1) % RANKS, (r - 1) % RANKS):
                rows.append(sock(r, p, t, acked=n, received=n, **kw))
    return rows


# --------------------------------------------------------------------------- mismatch

def test_late_mismatch_names_the_rank_behind_and_where_it_is():
    ctx = context(coll_log_ops=coll_logs({0: 44, 1: 41, 2: 44, 3: 44}),
                  stacks=stack(0, IN_NCCL) + stack(1, PAUSED) + stack(2, IN_NCCL) + stack(3, IN_NCCL),
                  sockets=ring_samples())
    f = hang_state(ctx)
    assert [(x.kind, x.ranks) for x in f] == [("hang_mismatch", [1])]
    assert "never entered collective #42 (ALL_REDUCE)" in f[0].summary
    assert "pause() <- other_code_path <- main" in f[0].summary
    assert "before the capture" in f[0].summary and "15.0 s" in f[0].summary
    assert f[0].peer_ranks == [0, 2, 3]
    assert len(ctx.con.execute(f[0].sql).fetchall()) == len(f[0].evidence) == RANKS


def test_a_running_job_with_ranks_at_different_ops_is_not_hung():
    # the same positions, but bytes move between the ranks until the end: the job runs
    ctx = context(coll_log_ops=coll_logs({0: 44, 1: 41, 2: 44, 3: 44}),
                  stacks=stack(0, IN_NCCL) + stack(1, PAUSED) + stack(2, IN_NCCL) + stack(3, IN_NCCL),
                  sockets=ring_samples(moving_until=WINDOW[1]))
    assert hang_state(ctx) == []


def test_stacks_alone_tell_the_rank_outside_nccl():
    # no COLL logs, no Flight Recorder, no tracer: the world from RANK/WORLD_SIZE, the stacks
    ctx = context(stacks=stack(0, IN_NCCL) + stack(1, IN_NCCL) + stack(2, PAUSED) + stack(3, IN_NCCL),
                  sockets=ring_samples())
    f = hang_state(ctx)
    assert [(x.kind, x.ranks) for x in f] == [("hang_mismatch", [2])]
    assert "is not inside any NCCL call" in f[0].summary and "pause()" in f[0].summary


def test_long_compute_with_nothing_in_flight_is_not_a_hang():
    ctx = context(coll_log_ops=coll_logs({r: 44 for r in range(RANKS)}),
                  stacks=[row for r in range(RANKS) for row in stack(r, COMPUTING)], sockets=ring_samples())
    assert hang_state(ctx) == []
    # its twin: the same job with every rank waiting in the collective is hung
    ctx = context(coll_log_ops=coll_logs({r: 44 for r in range(RANKS)}),
                  stacks=[row for r in range(RANKS) for row in stack(r, IN_NCCL)], sockets=ring_samples())
    assert [x.kind for x in hang_state(ctx)] == ["hang_stuck"]


def test_a_short_window_is_not_enough_to_call_a_hang():
    short = (T0, T0 + 2 * S)
    ctx = context(caps=captures(short), capture_windows=windows({r: short for r in range(RANKS)}),
                  coll_log_ops=coll_logs({0: 44, 1: 41, 2: 44, 3: 44}))
    assert hang_state(ctx) == []


def test_captures_that_never_overlapped_judge_each_host_alone():
    # hosts 0, 1 captured [0 s, 15 s], hosts 2, 3 [20 s, 35 s] (a slow pdsh loop, a tracer
    # that took long to attach): no common window, but no host saw its ranks move
    early, late = (T0, T0 + 15 * S), (T0 + 20 * S, T0 + 35 * S)
    spans = {0: early, 1: early, 2: late, 3: late}
    pos = coll_logs({0: 44, 1: 41, 2: 44, 3: 44})
    ctx = context(capture_windows=windows(spans), coll_log_ops=pos)
    f = hang_state(ctx)
    assert [(x.kind, x.ranks) for x in f] == [("hang_mismatch", [1])], [x.summary for x in f]
    assert "the hosts' captures did not overlap" in f[0].summary
    # one host whose ranks moved in its own window clears it: a running job
    moving = [dict(row, host="node2", pid=102, rank=2, sample_ns=t)
              for i, t in enumerate(range(late[0], late[1] + 1, 2 * S))
              for row in [sock(2, 3, t, acked=1000 + i * 4096, received=1000 + i * 4096)]]
    ctx = context(capture_windows=windows(spans), coll_log_ops=pos, sockets=moving)
    assert hang_state(ctx) == []


# --------------------------------------------------------------------------- stuck

def _dead_link_samples(dead: int, backoff: bool = True):
    """Rank `dead`'s NIC stopped: its neighbours' connections to it hold data behind a growing
    RTO backoff (``backoff`` False: ss printed none, as in its first seconds); every other
    connection is drained."""
    rows = []
    for i, t in enumerate(range(WINDOW[0], WINDOW[1] + 1, 2 * S)):
        for r in range(RANKS):
            for p in ((r + 1) % RANKS, (r - 1) % RANKS):
                stuck = dead in (r, p) and r != dead
                rows.append(sock(r, p, t, unacked=12 if stuck else None,
                                 backoff=min(i + 3, 9) if stuck and backoff else None,
                                 lastack=20_000.0 + i * 2000 if stuck else 30.0))
    return rows


def test_late_dead_link_names_the_rank_every_stuck_socket_touches():
    ctx = context(coll_log_ops=coll_logs({r: 68 for r in range(RANKS)}),
                  stacks=[row for r in range(RANKS) for row in stack(r, IN_NCCL)], sockets=_dead_link_samples(2))
    f = hang_state(ctx)
    assert [(x.kind, x.ranks) for x in f] == [("hang_stuck", [2])]
    assert "inside collective #68" in f[0].summary and "RTO backoff" in f[0].summary


def test_a_dead_link_whose_sockets_show_no_backoff_yet():
    """No ss sample printed a backoff (a watcher's bundle seconds into the hang): the dead link
    is still named, without an RTO figure (it was an internal error, the detector lost)."""
    ctx = context(coll_log_ops=coll_logs({r: 68 for r in range(RANKS)}),
                  stacks=[row for r in range(RANKS) for row in stack(r, IN_NCCL)],
                  sockets=_dead_link_samples(2, backoff=False))
    f = hang_state(ctx)
    assert [(x.kind, x.ranks) for x in f] == [("hang_stuck", [2])]
    assert "RTO backoff" not in f[0].summary


def test_a_reset_the_ring_made_progress_after_broke_nothing():
    """A refused connection at the job's start (a rank's bootstrap connect before the root
    listened: a RST answering its SYN), then minutes of progress, then a hang: the hang is not
    that reset's (a watcher's bundle holds the job's start; make watch-align named it)."""
    moving_until = WINDOW[0] + 8 * S
    reset = [{"timestamp_ns": WINDOW[0] + S, "event": ev, "source": "bpf", "saddr": addr(0), "sport": 29500,
              "daddr": addr(1), "dport": 36654, "host": "node0", "pid": 100, "rank": 0, "peer_rank": 1}
             for ev in ("tcp_send_reset", "tcp_receive_reset")]
    ctx = context(coll_log_ops=coll_logs({r: 68 for r in range(RANKS)}),
                  stacks=[row for r in range(RANKS) for row in stack(r, IN_NCCL)],
                  sockets=ring_samples(moving_until=moving_until), tcp_events=reset)
    f = hang_state(ctx)
    assert [x.kind for x in f] == ["hang_stuck"], [x.summary for x in f]
    # its twin: the same reset as the last progress ended breaks the ring
    late = [dict(r, timestamp_ns=moving_until + S) for r in reset]
    ctx = context(coll_log_ops=coll_logs({r: 68 for r in range(RANKS)}),
                  stacks=[row for r in range(RANKS) for row in stack(r, IN_NCCL)],
                  sockets=ring_samples(moving_until=moving_until), tcp_events=late)
    assert [(x.kind, x.ranks) for x in hang_state(ctx)] == [("connection_reset", [0])]


def test_drained_links_and_no_wait_graph_blame_nobody():
    ctx = context(coll_log_ops=coll_logs({r: 68 for r in range(RANKS)}),
                  stacks=[row for r in range(RANKS) for row in stack(r, IN_NCCL)], sockets=ring_samples())
    f = hang_state(ctx)
    assert [(x.kind, x.ranks) for x in f] == [("hang_stuck", [])]


def ring_waits(waits: set[tuple[int, int]], syscall: str, first_inode: int):
    """Ring sockets between every rank and its two neighbours, and a thread of rank r
    blocked in ``syscall`` on its socket to p for each (r, p) of ``waits``."""
    socks, threads = [], []
    inode = first_inode
    for r in range(RANKS):
        for p in ((r + 1) % RANKS, (r - 1) % RANKS):
            inode += 1
            socks.append(sock(r, p, WINDOW[1], inode=inode))
            if (r, p) in waits:
                threads.append({"host": f"node{r}", "pid": 100 + r, "rank": r, "phase": "end",
                                "sample_ns": WINDOW[1], "tid": 200 + r, "name": "cuda-stream", "state": "S",
                                "wchan": "wait_woken", "syscall_name": syscall, "fd": 9, "socket_inode": inode})
    return socks, threads


def test_gpu_hang_blames_the_rank_its_peers_wait_on():
    # rank 3's stream stopped mid-collective: its ring neighbours' stream threads block in
    # recvfrom() on their sockets to rank 3; the others wait on their own neighbours
    socks, threads = ring_waits({(0, 3), (2, 3), (1, 0)}, "recvfrom", 7000)
    stacks_ = [row for r in range(RANKS) for row in stack(r, IN_NCCL)]
    ctx = context(coll_log_ops=coll_logs({r: 30 for r in range(RANKS)}), stacks=stacks_, sockets=socks,
                  threads=threads)
    f = hang_state(ctx)
    assert [(x.kind, x.ranks) for x in f] == [("hang_stuck", [3])]
    assert f[0].peer_ranks == [0, 2]
    # without the thread states nobody can be named
    ctx = context(coll_log_ops=coll_logs({r: 30 for r in range(RANKS)}), stacks=stacks_, sockets=socks)
    assert [(x.kind, x.ranks) for x in hang_state(ctx)] == [("hang_stuck", [])]


def test_wait_for_graph_sink_is_one_rank_or_nobody():
    from forensics.findings.comm_state import graph_sink as _graph_sink
    # a ring waiting down to rank 2 (poll for its clear-to-send, recv for its data)
    assert _graph_sink([(1, 2), (3, 2), (0, 3), (0, 1)]) == 2
    assert _graph_sink([(0, 1), (1, 0)]) is None             # a cycle: a deadlock, no one culprit
    assert _graph_sink([(0, 1), (2, 3)]) is None             # two sinks
    assert _graph_sink([(0, 1), (1, 2), (2, 1)]) is None     # the sink is a pair
    assert _graph_sink([]) is None


def test_gpu_hang_from_poll_waits_in_both_directions():
    # the lab's transfers poll: the sender waits (POLLIN) for rank 1's clear-to-send, the
    # receiver for rank 1's data; rank 1's stream sleeps in its hung "kernel"
    socks, threads = ring_waits({(0, 1), (2, 1), (3, 2)}, "poll", 8000)
    threads.append({"host": "node1", "pid": 101, "rank": 1, "phase": "end", "sample_ns": WINDOW[1], "tid": 201,
                    "name": "cuda-stream", "state": "S", "wchan": "hrtimer_nanosleep",
                    "syscall_name": "clock_nanosleep", "fd": None, "socket_inode": None})
    stacks_ = [row for r in range(RANKS) for row in stack(r, IN_NCCL)]
    # and its stream thread's stack: where the "kernel" stopped
    stacks_ += [{"host": "node1", "pid": 101, "rank": 1, "phase": None, "thread_id": "201", "os_tid": 201,
                 "thread_name": "cuda-stream", "depth": d, "function": fn, "artifact": "stacks/native-101.txt"}
                for d, fn in enumerate(["clock_nanosleep", "nanosleep", "sslab_gpu_kernel_hang", "launch_run"])]
    ctx = context(coll_log_ops=coll_logs({r: 30 for r in range(RANKS)}), stacks=stacks_, sockets=socks,
                  threads=threads)
    f = hang_state(ctx)
    assert [(x.kind, x.ranks) for x in f] == [("hang_stuck", [1])], [x.summary for x in f]
    assert f[0].peer_ranks == [0, 2]
    # the thread named like the ones its peers wait in, and where it is
    assert "thread cuda-stream in clock_nanosleep() <- nanosleep <- sslab_gpu_kernel_hang" in f[0].summary


def reset_context(warn: list[dict]):
    """Every rank inside #20, its ring connections seen, and these NCCL WARN lines."""
    flows = [{"host": f"node{r}", "capture": "c", "stream": r, "orig_addr": addr(r), "orig_port": 40000,
              "resp_addr": addr((r + 1) % RANKS), "resp_port": 50000, "rank": r, "peer_rank": (r + 1) % RANKS}
             for r in range(RANKS)]
    return context(coll_log_ops=coll_logs({r: 20 for r in range(RANKS)}),
                   stacks=[row for r in range(RANKS) for row in stack(r, IN_NCCL)], sockets=ring_samples(),
                   nccl_warnings=warn, flows=flows)


def test_reset_before_the_capture_from_ncclwarn_lines():
    warn = [{"host": "node1", "pid": 101, "rank": 1, "log_pid": 101, "message":
             "socketProgressOpt: Call to recv from 10.9.0.12<50001> failed : Connection reset by peer",
             "peer": "10.9.0.12<50001>"}]
    f = hang_state(reset_context(warn))
    assert [(x.kind, x.ranks, x.peer_ranks) for x in f] == [("connection_reset", [2], [1])]


def test_reset_without_timestamps_names_the_link_reset_at_both_ends():
    # NCCL < 2.26: no time on the WARN lines. The link 2-3 broke; both ends aborted and reset
    # their other connections: rank 0 sees a reset from 3, rank 1 a close from 2
    def w(r, peer, text):
        return {"host": f"node{r}", "pid": 100 + r, "rank": r, "log_pid": 100 + r, "peer": f"{addr(peer)}<5000{r}>",
                "message": f"socketProgressOpt: Call to recv from {addr(peer)}<5000{r}> failed : {text}"}
    warn = [w(0, 3, "Connection reset by peer"), w(1, 2, "Connection closed by remote peer"),
            w(2, 3, "Connection reset by peer"), w(3, 2, "Connection reset by peer")]
    f = hang_state(reset_context(warn))
    assert [(x.kind, x.ranks, x.peer_ranks) for x in f] == [("connection_reset", [3], [2])]
    # ranks 0 and 1 also reset each other as they aborted, after their first errors: the
    # link is the one whose two ends each failed first on the other
    warn = [w(0, 3, "Connection reset by peer"), w(1, 2, "Connection reset by peer"),
            w(0, 1, "Connection reset by peer"), w(1, 0, "Connection reset by peer"),
            w(2, 3, "Connection reset by peer"), w(3, 2, "Connection reset by peer")]
    for i, x in enumerate(warn):
        x["log_line"] = 10 + i
    f = hang_state(reset_context(warn))
    assert [(x.kind, sorted(x.ranks + x.peer_ranks)) for x in f] == [("connection_reset", [2, 3])]


# --------------------------------------------------------------------------- windows (tracer path)

def _ops(rank: int, k_from: int, k_to: int, open_last: bool):
    """Rank `rank`'s collectives k_from..k_to every 100 ms, each completing 5 ms later (the
    last one open when `open_last`: the host's capture stopped looking right after it)."""
    rows = []
    for k in range(k_from, k_to + 1):
        t = T0 + k * 100 * MS
        done = not (open_last and k == k_to)
        rows.append({"timestamp_ns": t, "duration_ns": 5 * MS if done else None, "duration_source": "host_sync",
                     "end_ns": t + 5 * MS if done else None, "op": "ALL_REDUCE", "rank": rank, "nranks": RANKS,
                     "comm_id_hash": COMM, "comm_ptr": f"0x{rank}", "op_count": k, "count": 1, "bytes": 4,
                     "host": f"node{rank}", "pid": 100 + rank, "tid": 100 + rank, "completed": done})
    return rows


def test_an_op_open_at_one_host_window_end_is_not_a_hang():
    # hosts 0 and 1 stop tracing at 4.0 s with op #40 open; hosts 2 and 3 trace until 9 s
    # and see #40 complete, then the job computes for a while (no collective after #40)
    ev = _ops(0, 0, 40, True) + _ops(1, 0, 40, True) + _ops(2, 0, 40, False) + _ops(3, 0, 40, False)
    spans = {0: (T0, T0 + 4005 * MS), 1: (T0, T0 + 4005 * MS), 2: (T0, T0 + 9 * S), 3: (T0, T0 + 9 * S)}
    caps = [{"host": f"node{r}", "started_ns": a, "ended_ns": b, "processes": []} for r, (a, b) in spans.items()]
    ctx = context(caps=caps, nccl_events=ev, capture_windows=windows(spans, "tracer"))
    assert hang_frontiers(ctx).empty and hang_stuck(ctx) == []
    # the twin: every host traced until 9 s and hosts 0 and 1 never completed #40: a hang
    spans = {r: (T0, T0 + 9 * S) for r in range(RANKS)}
    ctx = context(caps=caps, nccl_events=ev, capture_windows=windows(spans, "tracer"))
    assert [f.kind for f in hang_stuck(ctx)] == ["hang_stuck"]


def test_the_capture_end_is_when_the_tracer_stopped_not_when_the_bundle_was_written():
    # the tracer stopped at 4.0 s with #40 just launched; snapshots and attachments took the
    # capture 4.5 s more: that is not 4.5 s without progress
    ev = [row for r in range(RANKS) for row in _ops(r, 0, 40, True)]
    caps = [{"host": f"node{r}", "started_ns": T0, "ended_ns": T0 + 8500 * MS, "processes": []} for r in range(RANKS)]
    spans = {r: (T0, T0 + 4005 * MS) for r in range(RANKS)}
    ctx = context(caps=caps, nccl_events=ev, capture_windows=windows(spans, "tracer") + windows(
        {r: (T0, T0 + 8500 * MS) for r in range(RANKS)}))
    assert hang_stuck(ctx) == []
    ctx = context(caps=caps, nccl_events=ev, capture_windows=windows({r: (T0, T0 + 8500 * MS) for r in range(RANKS)}))
    assert [f.kind for f in hang_stuck(ctx)] == ["hang_stuck"]


# --------------------------------------------------------------------------- the report

def test_report_first_screen_of_a_late_capture_says_what_is_known_and_not():
    import json
    import re

    from forensics.analysis import Analysis
    from forensics.findings import run_detectors
    from forensics.report.html import render

    ctx = context(coll_log_ops=coll_logs({0: 44, 1: 41, 2: 44, 3: 44}),
                  stacks=stack(0, IN_NCCL) + stack(1, PAUSED) + stack(2, IN_NCCL) + stack(3, IN_NCCL),
                  sockets=ring_samples())
    findings, problems = run_detectors(ctx)
    a = Analysis(model=ctx.model, con=ctx.con, findings=findings, problems=problems)
    assert a.top.kind == "hang_mismatch" and a.top.ranks == [1]
    page = render(a, with_plotly=False)
    headline = re.search(r'id="verdict-text">([^<]*)<', page)[1]
    # one line: who (with the host its logs name), where, since when (undated here)
    assert headline == ("Hang: rank 1 (node1) never entered ALL_REDUCE #41; ranks 0, 2, 3 wait in it "
                        "(since before the capture)"), headline
    since = re.search(r'<dd class="field-since">([^<]*)<', page)[1]
    assert since.startswith("not dated"), since
    assert re.search(r'<dd class="field-stuck-at">[^<]*NCCL opCount 41<', page)
    # the whole verdict is one click away, and says what the capture cannot know
    full = re.search(r'<details class="full">.*?<p>([^<]*)</p>', page, re.S)[1]
    assert full.startswith("Hung since before the capture (no progress seen in the 15.0 s")
    assert "The onset is not in this capture." in full
    # the timeline is drawn from the state rows alone (the tracer saw no call)
    plot = json.loads(re.search(r'<script type="application/json" id="plot-data-timeline">(.*?)</script>', page,
                                re.S)[1].replace("\\u003c", "<"))
    names = {t["name"] for t in plot["data"]}
    assert {"state at capture: blamed", "state at capture: waiting"} <= names


def test_verdict_of_a_quiet_job_says_it_is_busy_outside_nccl():
    from forensics.analysis import Analysis
    from forensics.findings import run_detectors

    ctx = context(coll_log_ops=coll_logs({r: 44 for r in range(RANKS)}),
                  stacks=[row for r in range(RANKS) for row in stack(r, COMPUTING)], sockets=ring_samples())
    findings, problems = run_detectors(ctx)
    a = Analysis(model=ctx.model, con=ctx.con, findings=findings, problems=problems)
    assert not [f for f in findings if f.severity in ("error", "warning")], [f.summary for f in findings]
    assert a.verdict().startswith("No collective completed in the 15.0 s the capture watched")
    assert "no hang" in a.verdict() and "clock_nanosleep() <- nanosleep <- compute" in a.verdict()


def fr_rows(r: int, calls: list[tuple[str, int]], completed_upto: int):
    """Rank r's Flight Recorder ring: its collectives #1.. (profiling name, element count)."""
    return [{"host": f"node{r}", "rank": r, "pid": 100 + r, "record_id": k, "pg_id": 0, "collective_seq_id": k + 1,
             "profiling_name": name, "op": "ALL_REDUCE", "is_p2p": False, "input_numel": numel, "input_dtypes": "Float",
             "state": "completed" if k + 1 <= completed_upto else "started"} for k, (name, numel) in enumerate(calls)]


def test_flight_recorder_names_the_rank_that_called_something_else():
    same = [("nccl:all_reduce", 1024)] * 5
    odd = same[:3] + [("nccl:all_reduce", 512), ("nccl:all_reduce", 1)]   # it skipped a bucket and went on
    fr = fr_rows(0, same, 3) + fr_rows(1, same, 3) + fr_rows(2, odd, 3) + fr_rows(3, same, 3)
    status = [{"host": f"node{r}", "rank": r, "pid": 100 + r, "pg_id": "0", "last_enqueued_collective": 5,
               "last_started_collective": 4, "last_completed_collective": 3} for r in range(RANKS)]
    ctx = context(fr_entries=fr, fr_pg_status=status, sockets=ring_samples())
    f = hang_state(ctx)
    assert [(x.kind, x.ranks) for x in f] == [("hang_mismatch", [2])]
    assert "collective #4 of process group 0" in f[0].summary and "nccl:all_reduce of 512 Float" in f[0].summary
    # the twin: the same calls everywhere, every rank inside #4 (enqueued 5, completed 3)
    ctx = context(fr_entries=fr_rows(0, same, 3) + fr_rows(1, same, 3) + fr_rows(2, same, 3) + fr_rows(3, same, 3),
                  fr_pg_status=status, sockets=ring_samples())
    assert [(x.kind, x.ranks) for x in hang_state(ctx)] == [("hang_stuck", [])]


def test_reset_before_the_capture_from_real_nccl_logs():
    """The shipped reset bundle as a capture that started after the reset would see it: no
    calls, no packets; NCCL's WARN lines of every rank (all four say "reset by peer", the
    cascade of aborts) still name the connection the lab's firewall reset (ring 1 -> 2, sent
    by rank 2's host) by the failed send that started it."""
    from forensics.execution.host_reading import read_model
    from shipped import shipped

    bundle = shipped("reset")
    truth = json.loads((bundle.parent / "scenario.json").read_text())["fault"]
    m = read_model([bundle])
    for t in ("nccl_events", "tcp_events", "flows", "packets"):
        m.tables[t] = empty(t)
    ctx = Context(model=m, con=m.connect())
    f = hang_state(ctx)
    assert [(x.kind, x.ranks, x.peer_ranks) for x in f] == [("connection_reset", truth["ranks"],
                                                               [truth["reset_sent_to_rank"]])]
    assert len(ctx.con.execute(f[0].sql).fetchall()) == len(f[0].evidence) > 0
