"""Flight Recorder dumps given alone (no capture: no process to place them on) are compared per
process group: the ranks that never enqueued the collective the others wait in are the finding's,
and dumps that agree, or whose highest collective completed, name no one
(forensics/findings/reports.py: fr_dump_hangs)."""
from __future__ import annotations

import pickle

from forensics.analysis import analyze

T0 = 1_724_779_239_936_775_119


def _entry(seq, state):
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": T0 + seq,
            "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
            "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": T0 + seq + 10 if state == "completed" else None,
            "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False, "frames": []}


def _dumps(tmp_path, last: dict[int, tuple[int, str]], world: int):
    """One dump per rank: collectives 1..n completed, then n in ``state`` (rank -> (n, state))."""
    paths = []
    for rank, (n, state) in last.items():
        entries = [_entry(s, "completed") for s in range(1, n)] + [_entry(n, state)]
        d = {"version": "2.5", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
             "pg_status": {"0": {"last_enqueued_collective": n, "last_started_collective": -1,
                                 "last_completed_collective": n if state == "completed" else n - 1}},
             "entries": entries, "rank": rank}
        p = tmp_path / f"nccl_trace_rank_{rank}"
        p.write_bytes(pickle.dumps(d, protocol=2))
        paths.append(p)
    return paths


def _hangs(paths):
    a = analyze(paths)
    try:
        return [(f.kind, f.severity, f.ranks, f.seq, f.summary) for f in a.findings if f.kind.startswith("hang")]
    finally:
        a.close()


def test_the_rank_behind_is_named_and_the_waiting_ranks_are_not(tmp_path):
    hangs = _hangs(_dumps(tmp_path, {0: (5, "started"), 1: (4, "completed"), 2: (5, "scheduled")}, 3))
    assert [(k, s, r, q) for k, s, r, q, _ in hangs] == [("hang_mismatch", "error", [1], 5)], hangs
    assert "ranks 0, 2 enqueued and wait in" in hangs[0][4], hangs[0][4]


def test_dumps_that_agree_name_no_one(tmp_path):
    assert _hangs(_dumps(tmp_path, {0: (5, "started"), 1: (5, "started")}, 2)) == []


def test_a_highest_collective_that_completed_names_no_one(tmp_path):
    # a dump taken by hand on a running job: rank 0 already finished #5, rank 1 has not enqueued it yet
    assert _hangs(_dumps(tmp_path, {0: (5, "completed"), 1: (4, "completed")}, 2)) == []


def test_dumps_taken_apart_on_a_running_job_name_no_one(tmp_path):
    # each host's capture dumped at its own end, a few collectives apart (the lab's slow-link,
    # accuracy campaign seed 44): rank 2 waits in #9 but completed #6-#8, which every rank must
    # have enqueued, so ranks 0 (last #3) and 1 (last #6) dumped earlier, they are not behind
    paths = _dumps(tmp_path, {0: (3, "completed"), 1: (6, "started"), 2: (9, "started")}, 3)
    assert _hangs(paths) == []
    # its twin: the ranks ahead completed nothing past the rank behind: it never enqueued #9
    hangs = _hangs(_dumps(tmp_path, {0: (8, "completed"), 1: (9, "started"), 2: (9, "started")}, 3))
    assert [(k, r, q) for k, _, r, q, _ in hangs] == [("hang_mismatch", [0], 9)], hangs



def test_the_findings_sql_shows_each_ranks_last_enqueued_collective(tmp_path):
    """The finding's runnable query gives what the finding compared, pg_status or not."""
    paths = _dumps(tmp_path, {0: (5, "started"), 1: (4, "completed")}, 2)
    for with_status in (True, False):
        if not with_status:           # a dump format with no pg_status (1.x, 2.0): the entries say it
            for p in paths:
                d = pickle.loads(p.read_bytes())
                del d["pg_status"]
                p.write_bytes(pickle.dumps(d, protocol=2))
        a = analyze(paths)
        try:
            [f] = [f for f in a.findings if f.kind == "hang_mismatch"]
            assert [(r[1], r[2]) for r in a.con.execute(f.sql).fetchall()] == [(0, 5), (1, 4)], f.sql
        finally:
            a.close()
    assert "pg_id = '0'" in f.sql
    from forensics.findings.reports import fr_positions_sql
    assert "'0'' OR ''1''=''1'" in fr_positions_sql("0' OR '1'='1")      # dump text stays one literal
