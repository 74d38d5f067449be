"""The watcher's two-stage incidents (issue 43, item 3), without the lab or root: the default
hang threshold, a hang trigger's stall followed through the after-window (resolved, still
stuck, ended) from the tracer's call-state lines, the completion's merge that keeps every file
of the first archive, and the analysis of the outcome (``forensics.findings.stall``). The lab
runs are in tests/lab_runs/test_watch_checkpoint.py."""
from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from capture.watch import incident, monitors, watcher
from capture.watch.triggers import Trigger
from forensics.findings import stall
from forensics.findings.base import Context, Finding

S = 1_000_000_000


def _op(tid, cls, pid, t0=0, last_t0=0, last_t1=0, sec=0, longest=0, sp=0, ret=0):
    return f"@op[{tid}, {cls}]: ({t0}, 17, {pid}, {last_t0}, {last_t1}, {sec}, {longest}, {sp}, {ret})"


def _segment(raw: Path, lines: list[str]) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    with open(raw / "seg-000000.txt", "a") as fh:
        fh.write("".join(line + "\n" for line in lines))


class _Info:
    def __init__(self, rank):
        self.rank = rank

    def rank_facts(self):
        return {"rank": self.rank}


@pytest.fixture
def ranks():
    """Three live processes standing for a job's ranks 0-2 (the watcher asks /proc whether they live)."""
    ps = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
    yield ps
    for p in ps:
        p.kill()
        p.wait()


def _watcher(raw: Path, ranks, hang_after_s=None) -> watcher.Watcher:
    w = watcher.Watcher.__new__(watcher.Watcher)          # its trigger logic alone: no capture behind it
    w.o = SimpleNamespace(hang_after_s=hang_after_s)
    w.monitor = monitors.RingMonitor(raw, call_returns=False)
    w.s = SimpleNamespace(procs={p.pid: _Info(r) for r, p in enumerate(ranks)})
    w.quiet = monitors.QuietJobs()
    return w


def test_the_default_threshold_is_ten_seconds_or_ten_slowest_collectives(tmp_path, ranks):
    w = _watcher(tmp_path / "raw", ranks)
    assert w.hang_after_ns(100 * S) == 10 * S                  # nothing completed yet: the floor
    w.monitor.durations.append((99 * S, 2 * S))                # a 2 s collective a second ago
    assert w.hang_after_ns(100 * S) == 20 * S
    assert w.hang_after_ns(500 * S) == 10 * S                  # older than 5 minutes: forgotten
    assert _watcher(tmp_path / "raw2", ranks, hang_after_s=3).hang_after_ns(0) == 3 * S
    assert "max(10s" in w.hang_after_text()


def _checkpoint_lines(ranks) -> list[str]:
    """Rank 0 returned from its last wait (in host code, a checkpoint); ranks 1 and 2 launched a
    collective at 1 s and wait for it since (their synchronize open)."""
    a, b, c = (p.pid for p in ranks)
    return [_op(10, 0, a, last_t0=int(0.9 * S)), _op(10, 1, a, last_t0=int(0.95 * S), last_t1=1 * S),
            _op(11, 0, b, last_t0=1 * S), _op(11, 1, b, t0=1 * S + 2000),
            _op(12, 0, c, last_t0=1 * S), _op(12, 1, c, t0=1 * S + 5000)]


def _trigger(w: watcher.Watcher, now_ns: int):
    stuck = w.monitor.stuck(now_ns, w.hang_after_ns(now_ns))
    trig = Trigger("hang", "test", 1_000 * S + now_ns, now_ns, pids=[s["pid"] for s in stuck], source="tracer")
    return trig, stuck


def test_a_stall_that_resolves_in_the_window_says_after_how_long_and_whom_everyone_waited_for(tmp_path, ranks):
    raw = tmp_path / "raw"
    w = _watcher(raw, ranks)
    _segment(raw, _checkpoint_lines(ranks))
    w.monitor.poll()
    trig, stuck = _trigger(w, 12 * S)
    assert sorted(s["pid"] for s in stuck) == [ranks[1].pid, ranks[2].pid]    # rank 0 is in no collective
    inc = {"first": trig, "stall": w.stall_of(trig, stuck)}
    st = inc["stall"]
    assert st["state"] == "pending" and st["ranks"] == [1, 2]
    assert st["waited_for"] == [{"pid": ranks[0].pid, "rank": 0}]
    assert st["stalled_since_ns"] == 1_000 * S + 1 * S + 2000          # their last progress, in UTC
    w.follow_stall(inc)
    assert st["state"] == "pending"                                    # nothing moved yet
    a, b, c = (p.pid for p in ranks)
    _segment(raw, [_op(11, 1, b, last_t0=1 * S + 2000, last_t1=31 * S)])   # rank 1's wait returns at 31 s
    w.monitor.poll()
    w.follow_stall(inc)
    assert st["state"] == "pending"                                    # rank 2 still waits
    _segment(raw, [_op(12, 1, c, last_t0=1 * S + 5000, last_t1=31 * S + 500)])
    w.monitor.poll()
    w.follow_stall(inc)
    assert st["state"] == "resolved" and st["resolved_after_s"] == 30.0
    assert st["resumed_ns"] == 1_000 * S + 31 * S + 500


def test_a_stall_still_stuck_stays_pending_and_one_whose_processes_exit_ended(tmp_path, ranks):
    raw = tmp_path / "raw"
    w = _watcher(raw, ranks)
    _segment(raw, _checkpoint_lines(ranks))
    w.monitor.poll()
    trig, stuck = _trigger(w, 15 * S)
    inc = {"first": trig, "stall": w.stall_of(trig, stuck)}
    _segment(raw, [_op(10, 0, ranks[0].pid, last_t0=20 * S)])          # rank 0 moves; the stuck ones do not
    w.monitor.poll()
    w.follow_stall(inc)
    assert inc["stall"]["state"] == "pending"                          # cut() makes it "stuck" at the window's end
    for p in ranks[1:]:
        p.kill()
        p.wait()
    w.follow_stall(inc)
    assert inc["stall"]["state"] == "ended"


def test_no_stall_for_a_trigger_that_is_not_a_hang(tmp_path, ranks):
    w = _watcher(tmp_path / "raw", ranks)
    assert w.stall_of(Trigger("on-demand", "x", 1, 1), None) is None
    assert w.stall_of(Trigger("log", "NCCL WARN", 1, 1), []) is None


# ---------------------------------------------------------------- the completion keeps the first
def _tar(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(f"root/{name}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def test_the_completion_replaces_the_first_only_with_a_superset(tmp_path):
    first, full = tmp_path / "b.tar.gz", tmp_path / ".b.tar.gz.complete"
    _tar(first, {"manifest.json": b"{1}", "stacks/a.txt": b"stack", "logs/x.log": b"ab"})
    _tar(full, {"manifest.json": b"{}", "stacks/a.txt": b"stack", "logs/x.log": b"abcd", "new.txt": b"n"})
    assert incident.replace_if_superset(full, first) == first and not full.exists()
    assert incident.archive_members(first)["logs/x.log"] == 4
    # a completion that lost a file of the first (or holds a shorter copy) goes beside it
    short = tmp_path / ".b.tar.gz.complete2"
    _tar(short, {"manifest.json": b"{}", "logs/x.log": b"a"})
    beside = incident.replace_if_superset(short, first)
    assert beside.name == "b-complete.tar.gz" and incident.archive_members(first)["logs/x.log"] == 4


def test_merge_keeps_what_the_first_stage_copied(tmp_path):
    dest, src = tmp_path / "dest", tmp_path / "src"
    for d, files in ((dest, {"ss/ss-series.txt": b"0123456789", "logs/r.log": b"ab", "stacks/s.txt": b"s"}),
                     (src, {"ss/ss-series.txt": b"6789", "logs/r.log": b"abcd", "bpf/events.jsonl": b"e",
                            ".raw/seg-1.txt": b"hidden"})):
        for name, data in files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
    incident.merge_into(src, dest)
    got = {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert got == {"ss/ss-series.txt": b"0123456789",       # a ring that turned over: the first's stays
                   "logs/r.log": b"abcd",                   # grown: the longer copy
                   "stacks/s.txt": b"s", "bpf/events.jsonl": b"e"}
    kept, new = tmp_path / "kept", tmp_path / "new"
    kept.mkdir()
    new.mkdir()
    (kept / "seg-1.txt").write_bytes(b"aaaa")
    (kept / "seg-2.txt").write_bytes(b"bb")
    (new / "seg-2.txt").write_bytes(b"bbbb")
    incident.merge_raw(kept, new)
    assert {p.name: p.read_bytes() for p in new.iterdir()} == {"seg-1.txt": b"aaaa", "seg-2.txt": b"bbbb"}


# ---------------------------------------------------------------- the analysis of the outcome
def _ctx(stall_obj, stage="complete") -> Context:
    model = SimpleNamespace(captures=[{"host": "node0", "watch": {"stage": stage, "stall": stall_obj}}])
    return Context(model=model, con=None)


def _hang(ranks=(0,)) -> Finding:
    return Finding(kind="hang_mismatch", severity="error", confidence=0.9, summary="Hang: rank 0 never entered #343.",
                   ranks=list(ranks), peer_ranks=[1, 2])


RESOLVED = {"state": "resolved", "stalled_since_ns": 1_795_000_000 * S, "resumed_ns": 1_795_000_030 * S,
            "resolved_after_s": 30.0, "pids": [11, 12], "ranks": [1, 2], "waited_for": [{"pid": 10, "rank": 0}],
            "source": "tracer"}


def test_a_resolved_stall_is_a_warning_naming_the_rank_waited_for_and_no_hang():
    ctx = _ctx(RESOLVED)
    [f] = stall.stall_resolved(ctx)
    assert f.kind == "stall_resolved" and f.severity == "warning" and f.ranks == [0] and f.peer_ranks == [1, 2]
    assert "resolved after 30 s" in f.summary and "rank 0" in f.summary
    out = stall.settle(ctx, [_hang(), f])
    assert [g.kind for g in out] == ["stall_resolved"]             # the hang the trigger's state showed is gone


def test_a_stall_still_stuck_or_pending_keeps_its_hang_and_says_so():
    stuck = dict(RESOLVED, state="stuck")
    del stuck["resumed_ns"], stuck["resolved_after_s"]
    ctx = _ctx(stuck)
    assert stall.stall_resolved(ctx) == []
    [h] = stall.settle(ctx, [_hang()])
    assert h.severity == "error" and "still stuck at the end of the window" in h.summary
    [h] = stall.settle(_ctx(dict(stuck, state="pending"), stage="first"), [_hang()])
    assert "first archive" in h.summary
    # no watcher bundle: nothing changes
    plain = Context(model=SimpleNamespace(captures=[{"host": "h"}]), con=None)
    assert stall.settle(plain, [_hang()])[0].summary == _hang().summary


def test_a_malformed_stall_is_ignored_not_raised():
    for bad in ({"state": "resolved"}, {"state": 3}, "resolved", {"state": "resolved", "resolved_after_s": "x"}):
        ctx = _ctx(bad)
        assert stall.stall_resolved(ctx) == []
        assert [g.kind for g in stall.settle(ctx, [_hang()])] == ["hang_mismatch"]


def test_a_log_trigger_names_the_processes_whose_output_the_lines_are(tmp_path):
    """A WARN line in a job's log names no pid; the trigger takes those whose stdout, stderr or
    NCCL_DEBUG_FILE the file is (the attachments' owners), so the incident is that job's."""
    from capture.collectors.attachments import Attachments
    log = tmp_path / "rank0.out"
    with open(log, "w") as out:
        job = subprocess.Popen(["sleep", "30"], stdout=out, stderr=subprocess.DEVNULL)
    other = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        info = SimpleNamespace(env={}, rank_facts=lambda: {"rank": 0})
        session = SimpleNamespace(o=SimpleNamespace(attach=[]), procs={job.pid: info, other.pid: info})
        att = Attachments.__new__(Attachments)
        att.s, att.owners = session, {}
        paths, _ = att.sources(dumps=False)
        (path,) = [p for p, why in paths if "stdout" in why]
        assert att.owners == {path: job.pid}
        fired = []
        w = watcher.Watcher.__new__(watcher.Watcher)
        w.s = SimpleNamespace(notes=[])
        w.cap = SimpleNamespace(collector=lambda name: att)
        w.log_paths = lambda: paths
        w.logwatch = SimpleNamespace(poll=lambda ps: [(path, "NCCL WARN", "node0:1:2 [0] NCCL WARN boom")])
        w.fire = fired.append
        w.check_logs()
        (trig,) = fired
        assert trig.kind == "log" and trig.pids == [job.pid] and trig.source == path
    finally:
        job.kill()
        other.kill()
        job.wait()
        other.wait()


def test_an_operators_trigger_is_about_the_one_job_running(tmp_path):
    """An on-demand trigger names no process: with one job running it names that job's live
    processes (the ended ones of earlier jobs stay out of its incident); with two, none."""
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    ended = subprocess.Popen(["true"])
    ended.wait()
    try:
        jobs = {procs[0].pid: "a", procs[1].pid: "a", procs[2].pid: "b", ended.pid: "old"}
        w = watcher.Watcher.__new__(watcher.Watcher)
        w.s = SimpleNamespace(procs={p: None for p in jobs}, jobs=SimpleNamespace(job_id=jobs.get))
        fired = []
        w.fire, w.usr1, w.trigger_path = fired.append, True, None
        w.check_on_demand()
        assert fired[-1].kind == "on-demand" and fired[-1].pids == []          # two jobs running
        del w.s.procs[procs[2].pid]
        w.usr1 = True
        w.check_on_demand()
        assert fired[-1].pids == sorted([procs[0].pid, procs[1].pid])          # the one job, not the ended one
    finally:
        for p in procs:
            p.kill()
            p.wait()
