"""``hang_host``: a rank that never enqueued the collective its peers wait in, seen stuck in its
own host code (forensics/findings/host_stall.py, the lab's ``host-stuck``): on a CPU in a busy
loop, or blocked in a syscall of its own. Synthetic tables of the 4-rank jobs of
tests/traced_job.py (the tracer saw every call: rank 2 never entered #25) and
tests/captured_job.py (a late capture: positions from the COLL lines). Each positive case has
negative twins that must stay what they were: the mismatch's rank parked in ``pause()``, a rank
inside a CUDA wait, the gpu-hang's rank inside the collective, evidence from before the hang,
a futex or a socket wait the syscall alone cannot place."""
from __future__ import annotations

import pandas as pd

import captured_job
from forensics.findings import Context
from forensics.findings.hang import hang_mismatch, hang_state, hang_stuck
from forensics.model import Model
from forensics.model.schema import TABLES, conform, empty
from traced_job import MS, RANKS, T0, job

STUCK_AT = 25
END = T0 + 8000 * MS                      # the capture's end: 5.5 s after the last progress
SINCE = T0 + (STUCK_AT - 1) * 100 * MS    # about when the hang began (last completion: +5 ms)
SYSDEPS = "../sysdeps/unix/sysv/linux/"


def _thread(r: int, state: str, syscall=None, fd=None, inode=None, sample_ns=END - 100 * MS, tid=None) -> dict:
    return {"host": f"node{r}", "pid": 100 + r, "rank": r, "phase": "end", "sample_ns": sample_ns,
            "tid": 100 + r if tid is None else tid, "name": "sslab_rank", "state": state, "syscall_name": syscall,
            "fd": fd, "socket_inode": inode, "wait_events": "in" if inode is not None else None}


def _stack(r: int, frames: list[tuple[str, str | None]], status: str, phase: str = "end") -> list[dict]:
    """The main thread's native stack, innermost first: (function, source file)."""
    return [{"host": f"node{r}", "pid": 100 + r, "rank": r, "phase": phase, "thread_id": str(100 + r),
             "os_tid": 100 + r, "thread_name": "sslab_rank", "status": status, "active": status == "running",
             "depth": d, "function": fn, "code_file": fl, "artifact": f"stacks/native-{100 + r}-{phase}.txt"}
            for d, (fn, fl) in enumerate(frames)]


SPIN = [("host_busy_loop", "src/rank_driver.c"), ("train", "src/rank_driver.c"), ("main", "src/rank_driver.c"),
        ("__libc_start_main", "../csu/libc-start.c")]
BLOCK = [("__GI___libc_read", SYSDEPS + "read.c"), ("host_blocked_read", "src/rank_driver.c"),
         ("train", "src/rank_driver.c"), ("main", "src/rank_driver.c")]
PAUSE = [("__libc_pause", SYSDEPS + "pause.c"), ("train", "src/rank_driver.c"), ("main", "src/rank_driver.c")]
CUDA_WAIT = [("__futex_abstimed_wait_common", "./nptl/futex-internal.c"), ("pthread_cond_wait", "./nptl/x.c"),
             ("cudaStreamSynchronize", "src/cudart.c"), ("train", "src/rank_driver.c"), ("main", "src/rank_driver.c")]
LOCK = [("__futex_abstimed_wait_common", "./nptl/futex-internal.c"), ("___pthread_mutex_lock", "./nptl/m.c"),
        ("load_batch", "src/loader.c"), ("train", "src/rank_driver.c")]


def _context(threads=(), stacks=(), sockets=(), offcpu=(), entered_all=False, started_ns=None, **other) -> Context:
    """Rank 2 never enters #25 (or, ``entered_all``, enters it with the others: a gpu-hang's
    shape); nothing completes from #25 on; the capture ended at END. ``other``: rows of more
    tables (the Flight Recorder's entries, watchdog lines)."""
    if entered_all:
        n = job(n_ops=STUCK_AT + 1, completed=lambda k, r: k < STUCK_AT)
    else:
        n = job(n_ops=30, entered=lambda k, r: not (r == 2 and k >= STUCK_AT), completed=lambda k, r: k < STUCK_AT)
    tables = {name: empty(name) for name in TABLES}
    for name, rows in (("nccl_events", n), ("threads", threads), ("stacks", stacks), ("sockets", sockets),
                       ("offcpu", offcpu), *other.items()):
        if rows:
            tables[name] = conform(pd.DataFrame(list(rows)), name)
    caps = [{"host": f"node{r}", "started_ns": started_ns or T0 - 1000 * MS, "ended_ns": END} for r in range(RANKS)]
    m = Model(tables=tables, hosts=[f"node{r}" for r in range(RANKS)], captures=caps)
    return Context(model=m, con=m.connect())


def _one(ctx) -> object:
    f = hang_mismatch(ctx)
    assert len(f) == 1, [(x.kind, x.ranks) for x in f]
    return f[0]


# --------------------------------------------------------------------------- spin

def _fr(timeout_ms: int) -> list[dict]:
    """The Flight Recorder's entries of ranks 0, 1 and 3 for #25, with the job's timeout."""
    return [{"host": f"node{r}", "rank": r, "pid": 100 + r, "collective_seq_id": STUCK_AT, "state": "started",
             "profiling_name": "nccl:all_reduce", "timeout_ms": timeout_ms} for r in (0, 1, 3)]


def test_a_rank_spinning_in_host_code_past_the_timeout_is_a_host_hang_that_names_its_frame():
    # the peers waited 5.5 s; the job's collective timeout (its Flight Recorder's) is 5 s
    f = _one(_context([_thread(2, "R")], _stack(2, SPIN, "running"), fr_entries=_fr(5000)))
    assert (f.kind, f.ranks, f.peer_ranks, f.layer, f.severity) == ("hang_host", [2], [0, 1, 3], "host", "error")
    assert f.chain[0] == "rank 2 never enqueued ALL_REDUCE #25; ranks 0, 1, 3 enqueued it and wait inside it"
    assert "was on a CPU, spinning in host_busy_loop <- train <- main" in f.chain[1]
    assert "busy loop" in f.chain[2] and "not the cause" in f.chain[2]
    assert "stuck in host code before ALL_REDUCE #25 (on a CPU in host_busy_loop)" in f.headline
    assert f.op_count == STUCK_AT and f.details["host_activity"]["mode"] == "spin"
    assert f.summary.startswith("Hang (host-side stall)") and "host_busy_loop" in f.action
    assert (f.details["timeout_ms"], f.details["timeout_source"]) == (5000, "the Flight Recorder's timeout_ms")


def test_a_host_stall_younger_than_the_timeout_is_a_warning_naming_the_rank_waited_for():
    # the same rank 5.5 s into PyTorch's default 10 min: a checkpoint looks the same until then
    f = _one(_context([_thread(2, "R")], _stack(2, SPIN, "running")))
    assert (f.kind, f.ranks, f.peer_ranks, f.layer, f.severity) == ("hang_host", [2], [0, 1, 3], "host", "warning")
    assert f.summary.startswith("Stall (host side)") and "a slow phase or a hang" in f.summary
    assert "5.50 s into the job's 10 min collective timeout (PyTorch's default)" in f.chain[2], f.chain[2]
    assert "slow phase (a checkpoint, an evaluation)" in f.chain[2] and "not the cause" in f.chain[2]
    assert f.headline.startswith("Stall: {who} in host code before ALL_REDUCE #25 (on a CPU in host_busy_loop)")
    assert "ends by itself" in f.action and "host_busy_loop" in f.action
    assert f.details["stalled_ns"] == f.details["waited_ns"] and f.details["timeout_ms"] == 600_000
    # a longer timeout read from the job's own evidence keeps it a warning
    assert _one(_context([_thread(2, "R")], _stack(2, SPIN, "running"), fr_entries=_fr(1_800_000))).severity \
        == "warning"


def test_a_watchdog_that_fired_makes_the_host_stall_a_hang():
    wd = [{"host": "node0", "pid": 100, "rank": 0, "kind": "timeout", "seq_num": STUCK_AT, "op_type": "ALLREDUCE",
           "timeout_ms": 600_000, "ran_for_ms": 600_100}]
    f = _one(_context([_thread(2, "S", "read", fd=7)], _stack(2, BLOCK, "sleeping"), watchdog_events=wd))
    assert (f.kind, f.severity) == ("hang_host", "error") and f.summary.startswith("Hang (host-side stall)")


def test_running_with_no_stack_says_on_a_cpu_and_no_function():
    f = _one(_context([_thread(2, "R")]))
    assert f.kind == "hang_host" and f.details["host_activity"]["frames"] == []
    assert "no stack of it: the function is not known" in f.chain[1] and "(on a CPU)" in f.headline
    assert f.confidence <= 0.8 and "lower" in f.confidence_note


def test_scheduler_samples_alone_tell_a_spinning_rank():
    oc = [{"timestamp_ns": END - 2000 * MS, "host": "node2", "pid": 102, "tid": 102, "rank": 2, "oncpu_delta_ns": 0,
           "runq_delta_ns": 0},
          {"timestamp_ns": END - 1000 * MS, "host": "node2", "pid": 102, "tid": 102, "rank": 2,
           "oncpu_delta_ns": 700 * MS, "runq_delta_ns": 250 * MS}]
    f = _one(_context(offcpu=oc))
    assert f.kind == "hang_host" and "95% of its last sampled interval" in f.chain[1]
    # its twin: the same thread asleep (ran 1% of the interval) says nothing
    oc[1] = dict(oc[1], oncpu_delta_ns=10 * MS, runq_delta_ns=0)
    assert _one(_context(offcpu=oc)).kind == "hang_mismatch"


# --------------------------------------------------------------------------- block

def test_a_rank_blocked_reading_a_pipe_is_a_host_hang_that_names_syscall_and_frame():
    f = _one(_context([_thread(2, "S", "read", fd=7)], _stack(2, BLOCK, "sleeping")))
    assert (f.kind, f.ranks, f.layer) == ("hang_host", [2], "host")
    assert "blocked in the read syscall (fd 7, not a socket) in host_blocked_read <- train <- main" in f.chain[1]
    assert "(blocked in read(2) in host_blocked_read)" in f.headline and "read(2)" in f.action


def test_a_lock_with_the_application_frame_is_a_host_hang_a_bare_futex_is_not():
    f = _one(_context([_thread(2, "S", "futex")], _stack(2, LOCK, "sleeping")))
    assert f.kind == "hang_host" and "futex" in f.chain[1] and "load_batch" in f.chain[1]
    assert _one(_context([_thread(2, "S", "futex")])).kind == "hang_mismatch"


def test_a_socket_wait_to_a_peer_rank_is_not_host_code_one_to_elsewhere_is():
    socks = [{"host": "node2", "phase": "end", "pid": 102, "rank": 2, "peer_rank": 1, "state": "ESTAB", "inode": 555}]
    assert _one(_context([_thread(2, "S", "recvfrom", fd=9, inode=555)], sockets=socks)).kind == "hang_mismatch"
    socks = [dict(socks[0], peer_rank=None)]
    f = _one(_context([_thread(2, "S", "recvfrom", fd=9, inode=555)], sockets=socks))
    assert f.kind == "hang_host" and "a socket to no rank of the job" in f.chain[1]


# --------------------------------------------------------------------------- negative twins

def test_the_mismatch_rank_parked_in_pause_stays_a_mismatch():
    f = _one(_context([_thread(2, "S", "pause")], _stack(2, PAUSE, "sleeping")))
    assert f.kind == "hang_mismatch" and f.layer is None and f.chain == []
    assert "Hang (rank mismatch)" in f.summary


def test_a_rank_behind_inside_a_cuda_wait_stays_a_mismatch():
    f = _one(_context([_thread(2, "S", "futex")], _stack(2, CUDA_WAIT, "sleeping")))
    assert f.kind == "hang_mismatch"


def test_the_gpu_hang_shape_is_hang_stuck_never_host():
    # every rank entered #25; rank 2's main thread waits in cudaStreamSynchronize (its stream hung)
    ctx = _context([_thread(2, "S", "futex")], _stack(2, CUDA_WAIT, "sleeping"), entered_all=True)
    assert hang_mismatch(ctx) == []
    assert [f.kind for f in hang_stuck(ctx)] == ["hang_stuck"]
    # even a rank busy on a CPU is no host hang once it entered the collective
    ctx = _context([_thread(2, "R")], _stack(2, SPIN, "running"), entered_all=True)
    assert hang_mismatch(ctx) == [] and [f.kind for f in hang_stuck(ctx)] == ["hang_stuck"]


def test_evidence_from_before_the_hang_says_nothing():
    # /proc sampled before the hang began: not evidence of what the rank does in it
    assert _one(_context([_thread(2, "R", sample_ns=SINCE - 1000 * MS)])).kind == "hang_mismatch"
    # a stack taken at the start of a capture that began before the hang: the same; its twin, a
    # capture that began after the hang, is used
    hung = _stack(2, SPIN, "running", phase="hung")
    assert _one(_context(stacks=hung)).kind == "hang_mismatch"
    assert _one(_context(stacks=hung, started_ns=SINCE + 2000 * MS)).kind == "hang_host"


def test_no_threads_no_stacks_stays_a_mismatch():
    f = _one(_context())
    assert f.kind == "hang_mismatch" and f.ranks == [2]


# --------------------------------------------------------------------------- a late capture

def _late(stack_1: list[tuple[str, str | None]], status: str):
    rows = captured_job
    stacks = [{"host": f"node{r}", "pid": 100 + r, "rank": r, "phase": "hung", "thread_id": str(100 + r),
               "os_tid": 100 + r, "thread_name": "sslab_rank", "status": status if r == 1 else "sleeping",
               "depth": d, "function": fn, "code_file": fl}
              for r in range(RANKS) for d, (fn, fl) in enumerate(stack_1 if r == 1 else CUDA_WAIT)]
    pos = {0: 44, 1: 41, 2: 44, 3: 44}
    coll = [{"host": f"node{r}", "pid": 100 + r, "rank": r, "log_pid": 100 + r, "comm_ptr": f"0x5{r}",
             "comm_id": "0x92504a7cbb72bbba", "comm_rank": r, "nranks": RANKS, "last_op_count": p,
             "last_op": "ALL_REDUCE", "last_count": 1024, "lines": p + 1, "artifact": f"logs/nccl-rank{r}.log"}
            for r, p in pos.items()]
    return hang_state(rows.context(coll_log_ops=coll, stacks=stacks))


def test_a_late_capture_turns_the_rank_behind_into_a_host_hang_from_its_stack():
    f = _late(SPIN, "running")
    assert [(x.kind, x.ranks) for x in f] == [("hang_host", [1])]
    assert f[0].chain[0].startswith("rank 1 never enqueued ALL_REDUCE #42;") and f[0].op_count == 42 and "host_busy_loop <- train <- main" in f[0].chain[1]
    f = _late(BLOCK, "sleeping")
    assert [x.kind for x in f] == ["hang_host"] and "blocked in the read syscall in host_blocked_read" in f[0].chain[1]
    # the twin: the same capture with the rank parked in pause()
    assert [x.kind for x in _late(PAUSE, "sleeping")] == ["hang_mismatch"]


def test_a_mismatch_quotes_no_stack_taken_before_the_hang():
    # a capture attached before the job took its stacks at its start (the job looked idle): the
    # main thread then waited at the gate; that is not where the rank is in the hang
    gate = [("__GI___clock_nanosleep", SYSDEPS + "clock_nanosleep.c"), ("sleep_ms", "src/rank_driver.c"),
            ("main", "src/rank_driver.c")]
    f = _one(_context([_thread(2, "S", "pause")], _stack(2, gate, "sleeping", phase="hung")))
    assert f.kind == "hang_mismatch" and "stack" not in f.summary and f.details["stacks"] == {}
    # its twin: the same stack from a capture that began after the hang is quoted
    f = _one(_context([_thread(2, "S", "pause")], _stack(2, gate, "sleeping", phase="hung"),
                      started_ns=SINCE + 2000 * MS))
    assert "rank 2's stack: __GI___clock_nanosleep <- sleep_ms <- main" in f.summary, f.summary
