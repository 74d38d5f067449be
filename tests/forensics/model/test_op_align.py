"""The tracer's op numbers aligned to the job's own (forensics.model.op_align): runs of one
program cut at tracer restarts, shifted by NCCL's COLL opCount, by peers' times, or estimated
across a restart; and the hang verdicts a watcher's bundle then gives (the same as a capture's)."""
from __future__ import annotations

import pandas as pd

from forensics.findings.hang import hang_frontiers
from forensics.model import op_align
from forensics.model.nccl import unify_comm_ids
from forensics.model.schema import conform
from traced_job import MS, RANKS, T0, context, job

RESTART_AT = 30          # the tracer restarted before the job's op 30 (every rank's count from 0 again)
GAP = 5                  # ops the restart's untraced seconds hid


def watcher_rows(n_ops=51, skip_rank=2, skip_at=50, ring_from=10, restart_at=RESTART_AT, gap=GAP):
    """A watcher's view of the synthetic job: a mismatch at #skip_at (rank skip_rank never
    enters it; the others wait inside it), the ring holding ops from ring_from on, the calls
    before restart_at counted from the init (run 0), those from restart_at + gap counted from
    0 by the restarted tracer (run 1, 'attach'), the ones in between never traced."""
    rows = job(n_ops=n_ops, entered=lambda k, r: not (r == skip_rank and k >= skip_at),
               completed=lambda k, r: k < skip_at)
    out = []
    for r in rows:
        k = r["op_count"]
        if k < ring_from or restart_at <= k < restart_at + gap:
            continue
        if k < restart_at:
            out.append(dict(r, op_count_source="init", tracer_run=0))
        else:
            out.append(dict(r, op_count=k - restart_at - gap, op_count_source="attach", tracer_run=1))
    return out


def frame(rows) -> pd.DataFrame:
    return conform(pd.DataFrame(rows), "nccl_events")


def test_runs_are_cut_at_restarts_and_only_the_program_that_saw_the_init_counts_from_it():
    # pid 1: init at t=5, calls 0..9 (program 0), the tracer restarted at t=100, calls 0..4 again
    coll = pd.DataFrame({"t0": [10 + i for i in range(10)] + [110 + i for i in range(5)] + [20, 21, 22],
                         "pid": [1] * 15 + [2] * 3, "comm": ["0xa"] * 15 + ["0xb"] * 3,
                         "op_count": list(range(10)) + list(range(5)) + [7, 8, 9]})
    events = [{"ev": "tracer_start", "t": 0}, {"ev": "tracer_start", "t": 100},
              {"ev": "comm_init", "t0": 5, "pid": 1, "comm": "0xa", "rc": 0}]
    run, source = op_align.tracer_runs(coll, events)
    assert run.tolist() == [0] * 10 + [1] * 5 + [0] * 3
    assert source.tolist() == ["init"] * 10 + ["attach"] * 5 + ["attach"] * 3
    # a count that falls with no start mark between (the marks lost) is a new run too
    run, source = op_align.tracer_runs(coll, events[2:])
    assert run.tolist() == [0] * 10 + [1] * 5 + [0] * 3 and source.tolist()[:10] == ["init"] * 10


def test_nccl_coll_lines_give_the_job_s_own_numbers():
    rows = watcher_rows()
    log = pd.DataFrame([{"host": f"node{r}", "pid": 100 + r, "comm_ptr": f"0x{r}",
                         "last_op_count": 49 if r == 2 else 50, "last_op": "AllReduce"} for r in range(RANKS)])
    ended = {f"node{r}": T0 + 50 * 100 * MS + 3_000 * MS for r in range(RANKS)}   # hung 3 s at the end
    out = unify_comm_ids(frame(rows), {}, log, ended)
    late = out[out["timestamp_ns"] >= T0 + (RESTART_AT + GAP) * 100 * MS]
    assert set(late["op_count_source"]) == {"log"}
    # every call has its job number back: entered at T0 + k * 100 ms
    k = (late["timestamp_ns"] - T0) // (100 * MS)
    assert (late["op_count"] == k).all()
    early = out[out["op_count_source"] == "init"]
    assert (early["op_count"] == (early["timestamp_ns"] - T0) // (100 * MS)).all()


def test_a_log_line_of_another_op_or_of_a_job_still_running_is_not_believed():
    rows = watcher_rows()
    hung = {"node0": T0 + 50 * 100 * MS + 3_000 * MS}
    log = pd.DataFrame([{"host": "node0", "pid": 100, "comm_ptr": "0x0", "last_op_count": 900,
                         "last_op": "Broadcast"}])
    out = unify_comm_ids(frame(rows), {}, log, hung)
    assert "log" not in set(out["op_count_source"].dropna())
    # the capture ended while the job still ran: its log went on past the tracer's last call
    log = log.assign(last_op="AllReduce")
    out = unify_comm_ids(frame(rows), {}, log, {"node0": T0 + 50 * 100 * MS + 200 * MS})
    assert "log" not in set(out["op_count_source"].dropna())


def test_across_a_restart_without_logs_the_numbers_are_estimated_past_the_known_ones():
    out = unify_comm_ids(frame(watcher_rows()), {})
    late = out[out["timestamp_ns"] >= T0 + (RESTART_AT + GAP) * 100 * MS]
    assert set(late["op_count_source"]) == {"estimated"}
    # one collective, one number on every rank; none collides with a number counted from the init
    per_op = late.groupby("timestamp_ns")["op_count"].nunique()
    assert (per_op == 1).all()
    assert late["op_count"].min() > out.loc[out["op_count_source"] == "init", "op_count"].max()
    # the gap's calls are estimated from the rate before it: here exactly
    assert (late["op_count"] == (late["timestamp_ns"] - T0) // (100 * MS)).all()


def test_the_watchers_hang_verdict_is_the_captures():
    """The same incident seen by a capture from the start and by the watcher (ring mid-job, a
    restart, no call returns): the same kind, op and rank."""
    full = job(n_ops=51, entered=lambda k, r: not (r == 2 and k >= 50), completed=lambda k, r: k < 50)
    end = T0 + 60 * 100 * MS
    capture = hang_frontiers(context(full, ended_ns=end))
    watcher = hang_frontiers(context(unify_comm_ids(frame(watcher_rows()), {}).to_dict("records"), ended_ns=end))
    assert capture[["kind", "op_count"]].values.tolist() == [["mismatch", 50]]
    assert watcher[["kind", "op_count"]].values.tolist() == [["mismatch", 50]]
    assert list(watcher["missing_ranks"].iloc[0]) == list(capture["missing_ranks"].iloc[0]) == [2]
    # without the runs (the restarted counts read as counted from the init) it was not
    naive = frame(watcher_rows()).assign(op_count_source="init")
    wrong = hang_frontiers(context(unify_comm_ids(naive, {}).to_dict("records"), ended_ns=end))
    assert wrong[["kind", "op_count"]].values.tolist() != [["mismatch", 50]]


def test_runs_of_one_program_are_aligned_by_time_to_a_rank_whose_counts_are_known():
    # rank 0's tracer saw the init; the others attached at op 12 and count from 0 there
    rows = []
    for r in job(n_ops=40):
        if r["rank"] == 0:
            rows.append(dict(r, op_count_source="init", tracer_run=0))
        elif r["op_count"] >= 12:
            rows.append(dict(r, op_count=r["op_count"] - 12, op_count_source="attach", tracer_run=0,
                             end_ns=None, duration_ns=None))
    out = unify_comm_ids(frame(rows), {})
    others = out[out["rank"] != 0]
    assert set(others["op_count_source"]) == {"peers"}
    assert (others["op_count"] == (others["timestamp_ns"] - T0) // (100 * MS)).all()


def test_the_calls_in_an_untraced_gap_follow_the_jobs_rhythm():
    # steps of 4 collectives back to back every 150 ms; the gap hides steps 10-13
    known = [s * 150 * MS + i * 100_000 for s in range(10) for i in range(4)]
    assert op_align.calls_between(known, 14 * 150 * MS) == 16
    # calls at an even pace of 10 ms: 9 between the last (at 90 ms) and the one at 190 ms
    assert op_align.calls_between([k * 10 * MS for k in range(10)], 190 * MS) == 9
    assert op_align.calls_between([5], 10) == 0


def test_flight_recorder_records_give_the_job_s_own_numbers():
    rows = watcher_rows()
    # PyTorch records each collective (collective_seq_id from 1) just before it calls NCCL
    fr = pd.DataFrame([{"host": r["host"], "pid": r["pid"], "rank": r["rank"], "is_p2p": False, "op": "allreduce",
                        "collective_seq_id": (r["timestamp_ns"] - T0) // (100 * MS) + 1,
                        "time_created_ns": r["timestamp_ns"] - 40_000} for r in job(n_ops=51)])
    out = unify_comm_ids(frame(rows), {}, None, None, fr)
    late = out[out["timestamp_ns"] >= T0 + (RESTART_AT + GAP) * 100 * MS]
    assert set(late["op_count_source"]) == {"flight_recorder"}
    assert (late["op_count"] == (late["timestamp_ns"] - T0) // (100 * MS)).all()
    # records of another op near the calls are no evidence
    out = unify_comm_ids(frame(rows), {}, None, None, fr.assign(op="broadcast"))
    assert "flight_recorder" not in set(out["op_count_source"].dropna())


def test_flight_recorder_records_align_whatever_string_dtype_their_op_has():
    # a bundle's Flight Recorder table holds its op as pandas' "string" (NA-backed) dtype and the
    # tracer's as str: the two must still match by op (a MergeError crashed the analysis once:
    # the lab's slow-link with staggered captures, accuracy campaign seed 44)
    rows = watcher_rows()
    fr = pd.DataFrame([{"host": r["host"], "pid": r["pid"], "rank": r["rank"], "is_p2p": False, "op": "allreduce",
                        "collective_seq_id": (r["timestamp_ns"] - T0) // (100 * MS) + 1,
                        "time_created_ns": r["timestamp_ns"] - 40_000} for r in job(n_ops=51)])
    for fr_op, nccl_op in (("string", "str"), ("str", "string"), ("string", "string")):
        nccl = frame(rows)
        nccl["op"] = nccl["op"].astype(nccl_op)
        out = unify_comm_ids(nccl, {}, None, None, fr.assign(op=fr["op"].astype(fr_op)))
        late = out[out["timestamp_ns"] >= T0 + (RESTART_AT + GAP) * 100 * MS]
        assert set(late["op_count_source"]) == {"flight_recorder"}, (fr_op, nccl_op)


def test_flight_recorder_records_win_over_a_log_that_went_on_after_the_capture():
    """A slow job (seconds between calls under loss) looks hung to the COLL log's rule when its
    capture stops; its log went on, so its last opCount is far past the tracer's last call. The
    Flight Recorder's records, matched call by call, give the right numbers (the lab's
    late-loss in CI: rank 0 numbered 66 ops ahead of its peers, no collective had every rank)."""
    rows = watcher_rows()
    fr = pd.DataFrame([{"host": r["host"], "pid": r["pid"], "rank": r["rank"], "is_p2p": False, "op": "allreduce",
                        "collective_seq_id": (r["timestamp_ns"] - T0) // (100 * MS) + 1,
                        "time_created_ns": r["timestamp_ns"] - 40_000} for r in job(n_ops=51)])
    log = pd.DataFrame([{"host": "node0", "pid": 100, "comm_ptr": "0x0", "last_op_count": 116,
                         "last_op": "AllReduce"}])
    ended = {f"node{r}": T0 + 50 * 100 * MS + 3_000 * MS for r in range(RANKS)}
    out = unify_comm_ids(frame(rows), {}, log, ended, fr)
    late = out[out["timestamp_ns"] >= T0 + (RESTART_AT + GAP) * 100 * MS]
    assert set(late["op_count_source"]) == {"flight_recorder"}
    assert (late["op_count"] == (late["timestamp_ns"] - T0) // (100 * MS)).all()
    # without the records the log alone is believed (the rule of a hang: quiet before the end)
    out = unify_comm_ids(frame(rows), {}, log, ended)
    assert set(out.loc[(out["host"] == "node0") & (out["timestamp_ns"] >= T0 + (RESTART_AT + GAP) * 100 * MS),
                       "op_count_source"]) == {"log"}
