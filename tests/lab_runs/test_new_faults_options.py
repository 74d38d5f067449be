"""Issue 44's lab scenarios without root: their options and defaults, the CPU quota's
spelling, and the torchrun agent report the lab writes for a killed rank, read back by
stallscope's own parser (a rank, a pid, a signal)."""
from __future__ import annotations

from pathlib import Path

import pytest

from forensics.parsers.torch_elastic import TorchElasticParser
from tests.lab.host_faults import agent_log
from tests.lab.options import parse_args
from tests.lab.scenarios import DEFAULTS, HOLDS, SCENARIOS, quota_fraction


def test_new_scenarios_have_rows_and_defaults():
    for sc in ("rank-killed", "link-flap", "cpu-starved"):
        assert sc in SCENARIOS and sc in DEFAULTS
    assert "rank-killed" in HOLDS and "link-flap" in HOLDS and "cpu-starved" not in HOLDS
    a = parse_args(["--no-netns", "--scenario", "rank-killed", "--rank", "2"])
    assert a.kill_signal == "KILL" and a.hold_s == 8.0 and a.watchdog_timeout_s >= 600
    a = parse_args(["--no-netns", "--scenario", "rank-killed", "--kill-signal", "SEGV", "--at-op", "9"])
    assert a.kill_signal == "SEGV" and a.at_op == 9
    a = parse_args(["--no-netns", "--scenario", "link-flap", "--flaps", "2", "--down-s", "4"])
    assert (a.flaps, a.down_s, a.up_s, a.link_side) == (2, 4.0, 2.0, "switch")
    a = parse_args(["--no-netns", "--scenario", "cpu-starved", "--cpu-quota", "5%"])
    assert a.cpu_quota == "5%" and a.compute_ms == 20.0


def test_an_operators_trigger_is_a_file_and_seconds_after_the_onset():
    a = parse_args(["--no-netns", "--scenario", "loss", "--operator-trigger", "/tmp/w/stallscope.trigger@8"])
    assert a.operator_trigger == "/tmp/w/stallscope.trigger@8"


@pytest.mark.parametrize("argv", [["--scenario", "link-flap", "--flaps", "0"],
                                  ["--scenario", "link-flap", "--down-s", "0"],
                                  ["--scenario", "cpu-starved", "--cpu-quota", "150%"],
                                  ["--scenario", "cpu-starved", "--cpu-quota", "lots"],
                                  ["--scenario", "rank-killed", "--kill-signal", "TERM"],
                                  ["--scenario", "rank-killed", "--at-op", "0"],
                                  ["--scenario", "host-stuck", "--stuck-mode", "sleep"],
                                  ["--scenario", "host-stuck", "--stuck-s", "-1"],
                                  ["--scenario", "host-stuck", "--at-op", "0"],
                                  ["--scenario", "loss", "--operator-trigger", "/tmp/x"],
                                  ["--scenario", "loss", "--operator-trigger", "/tmp/x@soon"],
                                  ["--scenario", "loss", "--operator-trigger", "@3"],
                                  ["--scenario", "loss", "--operator-trigger", "/tmp/x@-1"]])
def test_bad_new_fault_options_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--no-netns", *argv])
    assert e.value.code == 2 and "error" in capsys.readouterr().err


class _Run:
    """What job.driver_args reads of a launcher Run."""
    stop_mode, gate_file, stop_file = False, None, None

    def __init__(self, a):
        self.a = a

    def fault_ranks(self):
        return [self.a.rank]

    def ops_per_step(self):
        return 3


def test_host_stuck_options_reach_the_faulty_rank_only():
    from tests.lab.job import driver_args
    assert "host-stuck" in SCENARIOS and "host-stuck" in HOLDS
    a = parse_args(["--no-netns", "--scenario", "host-stuck", "--rank", "2", "--at-op", "9"])
    assert (a.stuck_mode, a.stuck_s, a.hang_at) == ("spin", 0.0, "op")
    args = driver_args(_Run(a), 2)
    assert args[args.index("--stuck-at-op") + 1] == "9" and args[args.index("--stuck-mode") + 1] == "spin"
    assert not any(x.startswith("--stuck") for x in driver_args(_Run(a), 1))
    a = parse_args(["--no-netns", "--scenario", "host-stuck"])        # default: step 3's first collective
    args = driver_args(_Run(a), 1)
    assert args[args.index("--stuck-at-op") + 1] == "10"
    # --start-s alone: the first collective after it (as gpu-hang); a finite stall with --stuck-s
    a = parse_args(["--no-netns", "--scenario", "host-stuck", "--start-s", "2", "--stuck-mode", "block",
                    "--stuck-s", "5"])
    args = driver_args(_Run(a), 1)
    assert a.hang_at == "time" and "--stuck-at-op" not in args
    assert args[args.index("--stuck-from-s") + 1] == "2.0" and args[args.index("--stuck-s") + 1] == "5.0"
    assert args[args.index("--stuck-mode") + 1] == "block"


def test_cpu_quota_spellings():
    assert quota_fraction("10%") == 0.1 and quota_fraction("0.25") == 0.25 and quota_fraction("100%") == 1.0
    for bad in ("0%", "", "1.5", "-5%"):
        with pytest.raises(ValueError):
            quota_fraction(bad)


@pytest.mark.parametrize("code,sig", [(-9, "SIGKILL"), (-11, "SIGSEGV")])
def test_the_agent_report_parses_as_the_killed_rank(code, sig):
    text = agent_log("node3", 3, 4242, code, 1_795_000_000_123_000_000)
    t = TorchElasticParser.parse(text.encode()).tables["process_exits"]
    root = t[t["kind"] == "root_cause"].iloc[0]
    assert (root["host"], root["rank"], root["pid"], root["exitcode"], root["signal"]) == \
        ("node3", 3, 4242, code, sig)
    agent = t[t["kind"] == "agent_failed"].iloc[0]
    assert (agent["pid"], agent["exitcode"]) == (4242, code)


def test_a_rank_killed_after_it_started_is_no_failure_to_start(tmp_path):
    """The launcher checks that every rank runs the driver again when a capture is scheduled
    during the hang; a rank the fault killed since (rank-killed, capture at onset+S) must not
    read as "exited at start" (a lab error that lost the case), while one that died before it
    ever ran the driver still does."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from tests.lab import job
    from tests.lab.scenarios import ScenarioError

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    run = SimpleNamespace(driver=Path(sys.executable), ranks=[sleeper], execed=set())
    try:
        job.wait_ranks_exec(run)
        assert run.execed == {0}
    finally:
        sleeper.kill()
        sleeper.wait()
    job.wait_ranks_exec(run)            # killed since it was seen: no error
    never = subprocess.Popen(["sh", "-c", "exit 3"])
    never.wait()
    with pytest.raises(ScenarioError, match="exited at start"):
        job.wait_ranks_exec(SimpleNamespace(driver=Path(sys.executable), ranks=[never], execed=set()))


def test_init_hang_dropped_refuses_rank_0():
    """Rank 0's host holds the bootstrap root: cutting rank 0 off it drops nothing (its
    packets to its own address never cross the switch) and the job trains (seed 53, case 28:
    scored as a missed init hang)."""
    with pytest.raises(SystemExit):
        parse_args(["--scenario", "init-hang-dropped", "--rank", "0", "--ranks", "3", "--no-netns"])
    assert parse_args(["--scenario", "init-hang-dropped", "--rank", "1", "--ranks", "3", "--no-netns"]).rank == 1
