"""One communicator key and one op numbering across hosts whose tracers attached late
(forensics.model.nccl.unify_comm_ids / align_op_counts)."""
from __future__ import annotations

import pandas as pd

from forensics.model.nccl import unify_comm_ids
from forensics.model.schema import conform

MS = 1_000_000
STEP = 300 * MS
T0 = 1_800_000_000_000_000_000
PATTERN = [("ALL_REDUCE", 131072), ("ALL_REDUCE", 65536), ("ALL_REDUCE", 1)]


def calls(host: str, rank: int, first_step: int, steps: int, late_ms: float = 0.0, tracer_hash=None,
          jitter_ms: float = 0.4) -> list[dict]:
    """A process's calls from step first_step on, numbered from 0 (its tracer attached then)
    unless tracer_hash is given (then numbered from the job's start); each step's three calls
    end together, at the same time on every rank (the last entry completes them)."""
    rows = []
    for s in range(first_step, first_step + steps):
        end = T0 + s * STEP + 260 * MS + (rank * jitter_ms) * MS
        for i, (op, count) in enumerate(PATTERN):
            n = 3 * s + i
            rows.append({"timestamp_ns": T0 + s * STEP + int(late_ms * MS) + i * 100_000, "end_ns": end,
                         "duration_ns": end - (T0 + s * STEP), "op": op, "count": count, "rank": rank,
                         "nranks": None, "comm_id_hash": tracer_hash, "comm_ptr": f"0x55{rank}0", "host": host,
                         "pid": 100 + rank, "op_count": n if tracer_hash else n - 3 * first_step})
    return rows


def comms(rank: int, comm_id: str = "0x8b62d62cbd5debb0") -> pd.DataFrame:
    return pd.DataFrame({"pid": [100 + rank], "comm": [f"0x55{rank}0"], "comm_id": [comm_id], "rank": [rank],
                         "nranks": [4]})


def frame(rows) -> pd.DataFrame:
    return conform(pd.DataFrame(rows), "nccl_events")


def test_late_tracers_join_on_nccls_comm_id_and_end_time_aligned_op_counts():
    # four hosts whose captures started at steps 0, 7, 10, 11; rank 0 straggles by 250 ms
    starts = {0: 7, 1: 11, 2: 0, 3: 10}
    rows = [r for rank, s in starts.items() for r in calls(f"node{rank}", rank, s, 40, 250 if rank == 0 else 0)]
    out = unify_comm_ids(frame(rows), {f"node{r}": comms(r) for r in starts})
    assert set(out["comm_id_hash"]) == {"0x8b62d62cbd5debb0"} and set(out["nranks"]) == {4}
    # every host's numbers now say which collective it is: the step's
    for rank, s in starts.items():
        oc = out[out["rank"] == rank]["op_count"].astype(int).tolist()
        shift = oc[0] - 0
        assert oc == [shift + i for i in range(len(oc))]
    # the same collective has one number everywhere: entries at the same step
    first = {rank: out[(out["rank"] == rank)]["op_count"].min() for rank in starts}
    ref = first[2]                                            # the earliest capture, the reference
    assert {rank: first[rank] - ref for rank in starts} == {0: 21, 1: 33, 2: 0, 3: 30}


def test_without_the_init_lines_or_overlap_nothing_is_joined_by_accident():
    rows = calls("node0", 0, 0, 10) + calls("node1", 1, 50, 10)          # captures that never overlap
    out = unify_comm_ids(frame(rows), {"node0": comms(0), "node1": comms(1)})
    # a host aligned to nothing keeps no op_count (never matched to another rank's #n by chance);
    # the one that keeps its numbers is the capture of the latest calls (the one at a hang)
    assert out[out["rank"] == 1]["op_count"].notna().all()
    assert out[out["rank"] == 0]["op_count"].isna().all()
    # no Init lines: the tracer's pointers stay per process, the numbers do not change
    plain = frame(calls("node0", 0, 0, 5) + calls("node1", 1, 2, 5))
    same = unify_comm_ids(plain, {})
    pd.testing.assert_frame_equal(same.drop(columns="op_count_source"), plain.drop(columns="op_count_source"))
    assert set(same["op_count_source"]) == {"attach"}


def test_a_tracer_that_saw_the_init_keeps_its_hash_and_numbers_and_the_others_follow_it():
    rows = calls("node0", 0, 0, 20, tracer_hash="0xce2b8d82a1f58f52") + calls("node1", 1, 6, 10)
    out = unify_comm_ids(frame(rows), {"node0": comms(0), "node1": comms(1)})
    assert set(out["comm_id_hash"]) == {"0xce2b8d82a1f58f52"}          # the hash the other host's tracer saw
    n0 = out[out["rank"] == 0]["op_count"].astype(int).tolist()
    assert n0 == list(range(60))                                       # absolute numbers untouched
    assert out[out["rank"] == 1]["op_count"].astype(int).tolist() == list(range(18, 48))


def test_calls_without_ends_are_aligned_by_their_entries():
    """The watcher traces no returns and a hung job completes nothing: a communicator whose
    inits no tracer saw (a job started after the watcher) is aligned by the calls' entries,
    which differ by a rank's straggle but much less than a step."""
    starts = {0: 0, 1: 2, 2: 5}
    rows = [r for rank, s in starts.items() for r in calls("vm", rank, s, 30, late_ms=7 * rank)]
    for r in rows:
        r["end_ns"] = r["duration_ns"] = None
    out = unify_comm_ids(frame(rows), {"vm": pd.concat([comms(r) for r in starts])})
    first = {rank: int(out[out["rank"] == rank]["op_count"].min()) for rank in starts}
    assert {rank: first[rank] - first[0] for rank in starts} == {0: 0, 1: 6, 2: 15}
