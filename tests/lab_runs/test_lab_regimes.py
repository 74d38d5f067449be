"""The lab in the regimes users meet (tests/lab/README.md, "Captures and host regimes").

Late, staggered per-host captures while the job keeps running; hangs that hold as long as
asked; Linux default TCP settings and CPU contention; a GPU (stream) hang; PyTorch Flight
Recorder dumps through the debug pipe. Tests marked ``root`` skip without root or without
the tools they need, and say why; the loopback ones run anywhere gcc and make exist.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capture_helpers import bundle_manifest
from conftest import ROOT
from forensics.parsers import registry
from tests.lab import launcher, netns, scenarios

LAB = ROOT / "tests" / "lab"

PY = sys.executable
SMALL = ["--buckets", "131072,65536", "--compute-ms", "30"]

# torch's Flight Recorder entry keys (FlightRecorder.hpp, dump format 2.7; "duration_ms" only
# with timing, once an entry is retired)
FR_ENTRY_KEYS = {"frames", "record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id",
                 "profiling_name", "time_created_ns", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes",
                 "state", "time_discovered_started_ns", "time_discovered_completed_ns", "retired", "timeout_ms",
                 "is_p2p"}


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (not installed)")


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces, nsenter, tcpdump and bpftrace")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text(errors="replace").splitlines() if l.startswith("{")]


@pytest.fixture(scope="module")
def lab_build(tmp_path_factory) -> Path:
    need("gcc", "make")
    build = tmp_path_factory.mktemp("labbuild") / "build"
    p = subprocess.run(["make", "-C", str(LAB), "all", f"BUILD={build}"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return build


def start(build: Path, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "tests.lab.launcher", "--build", str(build), "--out", str(out), *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen, out: Path, rc: int = 0, timeout: float = 240) -> dict:
    try:
        so, se = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:       # the launcher tears down on SIGTERM; never leave it running
            p.terminate()
            p.communicate(timeout=120)
    assert p.returncode == rc, se[-3000:]
    if os.geteuid() == 0:
        left = netns.leftovers(owner=p.pid)
        assert left == {"namespaces": [], "pids": [], "links": []}, left
    d = json.loads((out / "scenario.json").read_text())
    d["_out"] = out
    return d


def run(build: Path, out: Path, *args: str, rc: int = 0) -> dict:
    return finish(start(build, out, *args), out, rc)


def wait_until(pred, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the launcher ended while waiting for {what}: {proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def capturing(out: Path, rank: int) -> bool:
    f = out / "logs" / f"capture-node{rank}.err"
    return f.exists() and "capturing:" in f.read_text(errors="replace")


# ---------------------------------------------------------------- no root
def test_launcher_options_and_defaults():
    a = launcher.parse_args(["--no-netns", "--scenario", "mismatch-hang", "--hold-s", "900"])
    assert a.capture == "none" and a.tcp == "lab" and a.stress == 0 and a.flight_recorder
    assert a.watchdog_timeout_s > 900                       # the watchdog cannot end the hold early
    assert isinstance(a.seed, int)                          # drawn, and recorded in scenario.json config
    a = launcher.parse_args(["--no-netns", "--capture", "per-host", "--capture-start", "onset+10", "--seed", "3",
                             "--capture-args=--no-bpf --max-bytes 50M"])
    assert a.tcp == "defaults" and a.seed == 3               # per-host captures: Linux's TCP defaults
    assert scenarios.parse_capture_start("onset+10") == ("onset", 10.0)
    assert scenarios.parse_capture_start("before") == ("before", 0.0)
    assert scenarios.parse_stagger("0-5") == (0.0, 5.0) and scenarios.parse_stagger("2") == (2.0, 2.0)
    a = launcher.parse_args(["--no-netns", "--scenario", "gpu-hang", "--start-s", "2"])
    assert a.hang_at == "time"                              # --start-s alone: the first collective after it
    a = launcher.parse_args(["--no-netns", "--scenario", "gpu-hang"])
    assert a.hang_at == "op"
    for bad in (["--capture-start", "later"], ["--capture-stagger-s", "5-1"], ["--tcp", "lab", "--no-quickack"],
                ["--capture-stop-spread-s", "-1"]):
        with pytest.raises(SystemExit):
            launcher.parse_args(["--no-netns", *bad])


def test_the_stop_margin_is_a_second_of_steps_between_one_and_five():
    def steps(ms, n=4):
        return [[{"ev": "step", "step": k, "t_ns": int(k * ms * 1e6)} for k in range(n)] for _ in range(2)]
    assert launcher.stop_margin_steps(steps(60), 40) == 5          # fast steps: 5, as always
    assert launcher.stop_margin_steps(steps(400), 40) == 3         # 1 s of 0.4 s steps
    assert launcher.stop_margin_steps(steps(25000), 25000) == 1    # a 25 s step: one, not 2 minutes more
    assert launcher.stop_margin_steps(steps(25000, n=1), 25000) == 1   # one step logged: --compute-ms stands in
    assert launcher.stop_margin_steps([[], []], 40) == 5


def check_gpu_hang_truth(d: dict, rank: int, at_op: int) -> None:
    f = d["fault"]
    assert f["kind"] == "gpu-hang" and f["ranks"] == [rank] and f["op_index"] == at_op == f["opCount"]
    assert f["collective_seq_id"] == at_op + 1 and f["mid_collective"] is True
    assert f["ranks_entered"] == list(range(d["world_size"]))      # every rank is inside #at_op
    assert d["started_ns"] < f["start_time_ns"] < d["ended_ns"] and d["onset_ns"] == f["start_time_ns"]
    assert f["stuck_thread"]["function"] == "sslab_gpu_kernel_hang"
    assert all(n > at_op for n in d["ops_issued"])                 # the peers went on enqueueing
    assert d["ops_completed"] == [at_op] * d["world_size"]         # nobody got through #at_op
    assert all(r["state"] == "killed" for r in d["ranks"])
    # the library's own record: the stuck stream thread, at the onset
    hang = [e for e in read_jsonl(d["_out"] / "truth" / f"rank{rank}.jsonl") if e["ev"] == "gpu_hang"]
    assert len(hang) == 1 and hang[0]["opCount"] == at_op and hang[0]["t_ns"] == f["start_time_ns"]
    assert hang[0]["tid"] == f["stuck_thread"]["tid"]
    # where the threads are: /proc (no ptrace), taken during the hold
    for r in range(d["world_size"]):
        threads = json.loads((d["_out"] / "stacks" / f"threads-rank{r}.json").read_text())
        stream = [t for t in threads if t["name"] == "cuda-stream"]
        assert len(stream) == 1 and stream[0]["state"] == "S", threads
        assert {t["name"] for t in threads} >= {"sslab_rank", "cuda-stream", "pt_nccl_watchdg"}
        if r == rank:   # sleeping in nanosleep inside sslab_gpu_kernel_hang, forever
            assert stream[0]["tid"] == hang[0]["tid"]
            assert stream[0]["syscall_nr"] in (35, 230) and "nanosleep" in stream[0]["wchan"], stream
        else:           # waiting in poll(2) on its ring sockets
            assert stream[0]["syscall_nr"] == 7 and "poll" in stream[0]["wchan"], stream
        main = [t for t in threads if t["name"] == "sslab_rank"][0]   # cudaStreamSynchronize: a futex
        assert main["syscall_nr"] == 202, threads


def check_fr_dumps(d: dict, at_op: int) -> None:
    """Every rank's dump parses (pickle and forensics' parser): torch's layout, and the hang in it."""
    fr = d["flight_recorder"]
    assert fr["requests"] and all(req["ranks"] == list(range(d["world_size"])) for req in fr["requests"])
    for r in range(d["world_size"]):
        path = d["_out"] / "fr" / f"node{r}" / f"nccl_trace_rank_{r}"
        assert d["ranks"][r]["flight_recorder"] == f"fr/node{r}/nccl_trace_rank_{r}"
        doc = pickle.loads(path.read_bytes())
        assert doc["version"] == "2.7" and doc["nccl_version"] == "2.21.5"
        assert doc["pg_config"] == {"0": {"name": "0", "desc": "default_pg",
                                          "ranks": "[" + ", ".join(map(str, range(d["world_size"]))) + "]"}}
        st = doc["pg_status"]["0"]
        # torch's 1-based collective_seq_id = opCount + 1: #at_op is seq at_op+1, started, never completed
        assert st["last_completed_collective"] == at_op < st["last_started_collective"] == at_op + 1
        assert st["last_enqueued_collective"] == d["ops_issued"][r]
        for e in doc["entries"]:
            assert FR_ENTRY_KEYS <= set(e) <= FR_ENTRY_KEYS | {"duration_ms"}, set(e) ^ FR_ENTRY_KEYS
            assert e["process_group"] == ("0", "default_pg") and e["op_id"] == e["collective_seq_id"]
        by_seq = {e["collective_seq_id"]: e for e in doc["entries"]}
        assert by_seq[1]["profiling_name"] == "nccl:broadcast"
        assert by_seq[at_op]["state"] == "completed" and by_seq[at_op]["retired"] is True
        assert isinstance(by_seq[at_op]["duration_ms"], float)
        hung = by_seq[at_op + 1]
        assert hung["state"] == "started" and hung["time_discovered_completed_ns"] is None
        assert d["fault"]["start_time_ns"] < hung["time_discovered_started_ns"]
        if r in d["fault"]["ranks"]:    # enqueued before its stream reached it and hung (the peers: any time)
            assert hung["time_created_ns"] <= d["fault"]["start_time_ns"]
        later = [e for q, e in by_seq.items() if q > at_op + 1]    # the rest of its burst, queued behind it
        assert all(e["state"] == "scheduled" and e["time_discovered_started_ns"] is None for e in later)
        res = registry.parse_file(path)
        assert res.parser == "flight_recorder" and not res.warnings, res.warnings
        assert res.facts["rank"] == r and res.facts["entries"] == len(doc["entries"])
        stat = res.table("fr_pg_status").iloc[0]
        assert stat["last_completed_collective"] < stat["last_started_collective"]
        ent = res.table("fr_entries")
        assert ent.loc[ent["collective_seq_id"] == at_op + 1, "state"].tolist() == ["started"]
        assert set(ent["op"]) <= {"ALL_REDUCE", "BROADCAST"}


def test_gpu_hang_loopback_truth_threads_and_flight_recorder(lab_build, tmp_path):
    """No root: the stream ("GPU") of rank 1 hangs inside collective #7; the Flight
    Recorder dump asked for through each rank's pipe shows it."""
    out = tmp_path / "gh"
    d = run(lab_build, out, "--scenario", "gpu-hang", "--no-netns", "--ranks", "3", "--rank", "1", "--at-op", "7",
            "--hold-s", "2", "--fr-dump-after-s", "0.7", "--buckets", "4096,2048", "--no-stacks")
    check_gpu_hang_truth(d, 1, 7)
    check_fr_dumps(d, 7)
    assert not list((out / "fr").glob("*.pipe"))     # the FIFOs are gone with the ranks


def test_gpu_hang_at_a_time_and_a_failing_capture(lab_build, tmp_path):
    """No root. gpu-hang with --start-s alone hangs the first collective that starts after it.
    A capture that cannot run (bad arguments) is reported, never breaks the run, and fails
    the launcher only with --require-captures; the job it was to watch still ends cleanly."""
    d = run(lab_build, tmp_path / "t", "--scenario", "gpu-hang", "--no-netns", "--ranks", "2", "--rank", "0",
            "--start-s", "0.4", "--hold-s", "1", "--buckets", "4096", "--compute-ms", "20", "--no-flight-recorder")
    f = d["fault"]
    assert f["kind"] == "gpu-hang" and f["trigger"] == "time" and f["ranks_entered"] == [0, 1]
    assert (f["start_time_ns"] - d["train_start_ns"]) / 1e9 >= 0.4 and f["op_index"] > 1
    assert d["ops_completed"] == [f["op_index"]] * 2 and d["flight_recorder"] is None
    assert not (tmp_path / "t" / "fr").exists()
    out = tmp_path / "c"
    args = ["--scenario", "clean", "--no-netns", "--ranks", "2", "--buckets", "4096", "--compute-ms", "20",
            "--capture", "per-host", "--capture-stagger-s", "0", "--capture-args=--no-such-option"]
    d = run(lab_build, out, *args, "--require-captures", rc=1)
    assert d["capture"]["failed_ranks"] == [0, 1]
    for c in d["captures"]:
        assert not c["ok"] and c["rc"] == 2 and "before it was capturing" in c["error"] and c["bundle"] is None
        assert any("--no-such-option" in l for l in c["stderr_tail"])
    assert all(r["exit_code"] == 0 for r in d["ranks"]) and d["capture"]["job_stop"]["step"] >= 5
    assert run(lab_build, out, *args)["capture"]["failed_ranks"] == [0, 1]     # rc 0 without --require-captures


# ---------------------------------------------------------------- root
@pytest.fixture(scope="module")
def root_lab(lab_build):
    need_root()
    need("ip", "unshare", "bridge", "ss", "nsenter", "tcpdump")
    netns.sweep()
    return lab_build


@pytest.mark.root
def test_gpu_hang_stacks_in_namespaces(root_lab, tmp_path):
    need("gdb")
    d = run(root_lab, tmp_path / "gh", "--scenario", "gpu-hang", "--ranks", "3", "--rank", "2", "--at-op", "9",
            "--hold-s", "1.5", "--fr-dump-after-s", "0.5", "--no-pcap", *SMALL)
    check_gpu_hang_truth(d, 2, 9)
    check_fr_dumps(d, 9)
    stacks = {r: (d["_out"] / "stacks" / f"rank{r}.txt").read_text() for r in range(3)}

    def thread(text: str, name: str) -> str:
        return [b for b in text.split("\nThread ") if f'"{name}"' in b.split("\n", 1)[0]][0]
    stuck = thread(stacks[2], "cuda-stream")
    frames = [l for l in stuck.splitlines() if l.startswith("#")]
    assert "nanosleep" in frames[0] or "nanosleep" in frames[1], stuck
    assert "sslab_gpu_kernel_hang" in stuck and "launch_run" in stuck and "stream_main" in stuck
    for r in (0, 1):
        peer = thread(stacks[r], "cuda-stream")
        assert "poll" in peer and "run_xfers" in peer and "sslab_gpu_kernel_hang" not in peer
    for r in range(3):
        assert "cudaStreamSynchronize" in thread(stacks[r], "sslab_rank")


@pytest.mark.root
def test_per_host_captures_of_a_running_job(root_lab, tmp_path):
    """One capture per host inside its namespaces (host name node<r>), a pdsh-like loop
    seconds apart; the job keeps training until every capture has ended."""
    out = tmp_path / "clean"
    d = run(root_lab, out, "--scenario", "clean", "--ranks", "3", "--capture", "per-host", "--capture-stagger-s", "1-2",
            "--capture-duration-s", "3", "--capture-args=--no-bpf", "--seed", "11", *SMALL)
    assert d["tcp"] == "defaults" and d["config"]["tcp"] == "defaults"
    cap, caps = d["capture"], d["captures"]
    rng = random.Random(11)
    offsets = [0.0] + sorted(rng.uniform(1, 2) for _ in range(2))
    order = [0, 1, 2]
    rng.shuffle(order)
    want = {r: round(offsets[i], 3) for i, r in enumerate(order)}
    assert cap["delays_s"] == [want[r] for r in range(3)]   # reproducible from --seed
    assert [c["rank"] for c in caps] == [0, 1, 2] and all(c["ok"] and c["rc"] == 0 for c in caps), caps
    planned = [c["planned_ns"] for c in caps]         # each host at its offset from the first start
    first = min(planned)
    assert sorted(cap["delays_s"])[0] == 0.0 and all(1 <= d <= 2 for d in sorted(cap["delays_s"])[1:])
    assert all(abs((p - first) / 1e9 - d) < 0.002 for p, d in zip(planned, cap["delays_s"])), (planned, cap["delays_s"])
    starts = [c["started_ns"] for c in caps]
    assert all(0 <= s - p < 1e9 for s, p in zip(starts, planned)) and len(set(starts)) == len(starts), (starts, planned)
    exits = [r["exit_ns"] for r in d["ranks"]]
    assert all(r["exit_code"] == 0 and r["check_failures"] == 0 for r in d["ranks"])
    assert len({r["steps_done"] for r in d["ranks"]}) == 1 == len(set(d["ops_issued"]))
    assert d["job_ended_ns"] == max(exits) and cap["job_stop"]["step"] == d["ranks"][0]["steps_done"]
    for c in caps:
        bundle = out / c["bundle"]
        assert bundle.parent == out / "bundles" / f"node{c['rank']}"
        assert bundle.name.startswith(f"stallscope-node{c['rank']}-")
        m = bundle_manifest(bundle)
        assert m["host"] == m["hostname"] == f"node{c['rank']}"
        assert [p["rank"] for p in m["processes"]] == [c["rank"]]
        assert c["started_ns"] <= m["started_ns"] and m["ended_ns"] <= c["stopped_ns"]
        assert m["ended_ns"] < min(exits)          # every capture ended while the job still ran
        assert c["capturing_ns"] + 3e9 <= c["stop_sent_ns"] < c["stopped_ns"]
        pid = d["ranks"][c["rank"]]["pid"]
        assert c["command"][:3] == ["nsenter", f"--net=/proc/{pid}/ns/net", f"--uts=/proc/{pid}/ns/uts"]
        assert "--no-bpf" in c["command"]


@pytest.mark.root
def test_late_capture_of_a_gpu_hang_takes_the_flight_recorder(root_lab, tmp_path):
    """The on-call case with the tracer: the hang began, FR dumps were asked for, the hosts
    are captured two seconds later one after the other; the hang lasts until they are done."""
    need("bpftrace")
    out = tmp_path / "late"
    d = run(root_lab, out, "--scenario", "gpu-hang", "--ranks", "3", "--rank", "1", "--at-op", "8",
            "--capture", "per-host", "--capture-start", "onset+2", "--capture-stagger-s", "0-1",
            "--capture-duration-s", "3", "--fr-dump-after-s", "0.5", "--hold-s", "1", "--no-pcap", "--no-stacks",
            *SMALL)
    onset = d["fault"]["start_time_ns"]
    assert d["fault"]["kind"] == "gpu-hang" and d["onset_ns"] == onset
    caps = d["captures"]
    assert all(c["ok"] for c in caps), caps
    assert caps[0]["started_ns"] >= onset + 2e9 and d["hold"]["end_ns"] > max(c["stopped_ns"] for c in caps)
    assert any("extended until the last capture ended" in n for n in d["notes"])
    for c in caps:
        m = bundle_manifest(out / c["bundle"])
        assert m["host"] == f"node{c['rank']}" and m["collectors"]["tracer"]["status"] == "ok"
        assert m["started_ns"] > onset                                  # late: the onset is not in it
        fr = [f["path"] for f in m["files"] if f["path"].startswith("flight-recorder/")]
        assert fr == [f"flight-recorder/nccl_trace_rank_{c['rank']}"]   # only its own host's dump


@pytest.mark.root
def test_hang_holds_past_the_run_timeout_with_linux_tcp_defaults_and_contention(root_lab, tmp_path):
    """--hold-s 10 holds 10 s although --run-timeout-s is 5; Linux's TCP settings are left
    alone with --tcp defaults; --stress runs busy loops for the whole run, then they are gone."""
    out = tmp_path / "hold"
    p = start(root_lab, out, "--scenario", "mismatch-hang", "--ranks", "2", "--rank", "1", "--at-op", "5",
              "--hold-s", "10", "--run-timeout-s", "5", "--tcp", "defaults", "--stress", "1", "--no-pcap",
              "--no-stacks", *SMALL)
    try:
        wait_until(lambda: (out / "logs" / "rank1.out").exists()
                   and '"ev":"skip"' in (out / "logs" / "rank1.out").read_text(), 60, "the skip", p)
        nss = {n.rsplit("-", 1)[1]: n for n in netns.list_namespaces() if n.startswith(f"{netns.PREFIX}{p.pid}-")}
        for r in ("r0", "r1"):
            er = netns.run(["ip", "netns", "exec", nss[r], "sysctl", "-n", "net.ipv4.tcp_early_retrans"]).stdout
            assert er.strip() == "3"                              # tail-loss probes on, as on a host
            assert "quickack" not in netns.run(["ip", "-n", nss[r], "route", "show"]).stdout
        hogs = netns.ns_pids(nss["sw"])
        assert len(hogs) == 1
        assert Path(f"/proc/{hogs[0]}/cmdline").read_bytes().split(b"\0")[:2] == [b"sh", b"-c"]
    except BaseException:
        p.terminate()
        raise
    d = finish(p, out)
    f = d["fault"]
    assert (d["hold"]["end_ns"] - f["start_time_ns"]) / 1e9 >= 10 and d["hold"]["watchdog_timeout_s"] >= 600
    assert all(r["state"] == "killed" for r in d["ranks"])       # still hung at the end: nothing ended it early
    assert d["stress"]["processes"] == 1 and not any(Path(f"/proc/{pid}").exists() for pid in d["stress"]["pids"])
    assert d["tcp"] == "defaults" and d["config"]["quickack"] is False
    assert not [e for r in range(2) for e in read_jsonl(out / "logs" / f"rank{r}.out") if e["ev"] == "watchdog"]


@pytest.mark.root
def test_sigterm_during_a_held_hang_with_captures(root_lab, tmp_path):
    """SIGTERM while captures run in a long hold: they get their Ctrl-C and write their
    bundles, everything is torn down, scenario.json says what happened."""
    out = tmp_path / "term"
    p = start(root_lab, out, "--scenario", "mismatch-hang", "--ranks", "3", "--rank", "2", "--at-op", "6",
              "--hold-s", "120", "--capture", "per-host", "--capture-start", "onset+0.5", "--capture-stagger-s", "0",
              "--capture-duration-s", "120", "--capture-args=--no-bpf", "--no-pcap", "--no-stacks", *SMALL)
    try:
        wait_until(lambda: all(capturing(out, r) for r in range(3)), 90, "the captures", p)
    except BaseException:
        p.terminate()
        raise
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    d = finish(p, out, rc=128 + signal.SIGTERM, timeout=120)
    assert time.monotonic() - t0 < 60
    assert any("signal 15" in n for n in d["notes"]) and d["fault"]["kind"] == "mismatch-hang"
    assert all(r["state"] == "killed" for r in d["ranks"])
    for c in d["captures"]:
        assert c["ok"] and c["stop_sent_ns"] and (out / c["bundle"]).exists(), c
