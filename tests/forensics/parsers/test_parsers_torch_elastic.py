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
