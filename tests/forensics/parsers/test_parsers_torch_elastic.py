"""torchrun's failure summary and agent lines."""
from __future__ import annotations

from conftest import FIXTURES
from forensics.parsers.torch_elastic import TorchElasticParser, signal_name

D = FIXTURES / "parsers" / "torch_elastic"


def test_summary_root_cause_failures_and_agent_lines():
    r = TorchElasticParser.parse(D / "childfailed.log")
    assert r.warnings == []
    t = r.tables["process_exits"]
    assert t["kind"].tolist() == ["sigterm", "sigterm", "agent_failed", "failure", "root_cause"]
    root = t[t["kind"] == "root_cause"].iloc[0]
    assert (root["host"], root["rank"], root["local_rank"], root["exitcode"], root["pid"], root["signal"]) == \
        ("node-7.cluster.internal", 13, 5, -6, 41234, "SIGABRT")
    assert root["time"] == "2024-03-05_10:11:12" and root["traceback"].startswith("Signal 6 (SIGABRT)")
    fail = t[t["kind"] == "failure"].iloc[0]
    assert (fail["rank"], fail["exitcode"], fail["signal"], fail["line"]) == (14, -15, "SIGTERM", 18)
    agent = t[t["kind"] == "agent_failed"].iloc[0]
    assert (agent["local_rank"], agent["pid"], agent["exitcode"]) == (5, 41234, -6)


def test_srun_labels_in_front_of_the_summary_and_signal_names():
    text = "\n".join(f"3: {ln}" for ln in (D / "childfailed.log").read_text().splitlines())
    t = TorchElasticParser.parse(text.encode()).tables["process_exits"]
    assert t.loc[t["kind"] == "root_cause", "rank"].tolist() == [13]
    assert t["ctx_rank"].isna().all()        # an srun task number is not a rank (one torchrun per node)
    assert signal_name(-9) == "SIGKILL" and signal_name(1) is None


def test_launcher_lines_give_process_exits():
    from forensics.parsers.torch_elastic import TorchElasticParser
    text = (b"srun: error: node7: tasks 4-5: Killed\n"
            b"srun: error: node8: task 9: Exited with exit code 1\n"
            b"slurmstepd: error: Detected 1 oom-kill event(s) in StepId=1234.0 cgroup.\n"
            b"mpirun noticed that process rank 3 with PID 4242 on node node7 exited on signal 11 (Segmentation fault).\n"
            b"subprocess.CalledProcessError: Command '['python', '-u', 'train.py', '--local_rank=3']' died with "
            b"<Signals.SIGKILL: 9>.\n")
    import pandas as pd
    rows = [{k: (None if not isinstance(v, str) and pd.isna(v) else v) for k, v in r.items()}
            for r in TorchElasticParser.parse_bytes(text, "x.log").tables["process_exits"].to_dict("records")]
    got = [(r["kind"], r.get("host"), r.get("rank"), r.get("exitcode"), r.get("signal")) for r in rows]
    assert got[:3] == [("slurm_task", "node7", 4, None, "SIGKILL"), ("slurm_task", "node7", 5, None, "SIGKILL"),
                       ("slurm_task", "node8", 9, 1, None)]
    assert got[3][0] == "slurm_oom" and got[3][4] == "SIGKILL"
    assert got[4] == ("mpi_rank", "node7", 3, -11, "SIGSEGV")
    assert rows[5]["kind"] == "launch" and rows[5]["local_rank"] == 3 and rows[5]["signal"] == "SIGKILL"
