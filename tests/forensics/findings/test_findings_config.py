"""The misconfiguration / transport and nccl_tests_bandwidth detectors, rule by rule, on
bundles assembled from lab NCCL logs and reference samples (synthetic_bundle.py), and on
the shipped lab bundles (no warning there: NET/Socket without IB devices is right)."""
from __future__ import annotations

import glob

import pytest

from conftest import FIXTURES
from forensics.analysis import analyze
from forensics.findings import Context
from forensics.findings import config as config_det
from forensics.findings import nccl_tests as tests_det
from forensics.execution.host_reading import read_model
from synthetic_bundle import LAB, PARSERS, lab_bundle, make_bundle, process

NO_IB = {"ib-counters:start": {"status": "skipped",
                               "reason": "no InfiniBand/RoCE devices (/sys/class/infiniband is empty)"}}
IB_FILES = {"ib/start/sysfs.txt": PARSERS / "ib_counters" / "sysfs_grep_start.txt",
            "ib/end/sysfs.txt": PARSERS / "ib_counters" / "sysfs_grep_end.txt"}
MINE = ("misconfiguration", "transport", "nccl_tests_bandwidth")


def _mine(a):
    return [f for f in a.findings if f.kind in MINE]


def _rule(a, rule):
    return [f for f in _mine(a) if f.details.get("rule") == rule]


def _sql_rows(a, f) -> int:
    return len(a.con.execute(f.sql).fetchall())


def _log(rank: int, scenario: str = "clean") -> str:
    return (LAB / scenario / "logs" / f"nccl-rank{rank}.log").read_text()


def test_lab_job_gets_only_info(tmp_path):
    a = analyze([lab_bundle(tmp_path, collectors=NO_IB)])
    assert all(f.severity == "info" for f in _mine(a))
    (t,) = [f for f in a.findings if f.kind == "transport"]
    assert t.ranks == [0, 1, 2, 3] and "NET/Socket on eth0" in t.summary and "no IB/RoCE device" in t.summary
    assert _sql_rows(a, t) == 4
    a.close()


@pytest.mark.parametrize("scenario", sorted(p.name for p in (FIXTURES / "bundles").iterdir() if p.is_dir()))
def test_shipped_bundles_raise_no_config_warning(scenario):
    m = read_model(glob.glob(str(FIXTURES / "bundles" / scenario / "*.tar.gz")), skew=False)
    con = m.connect()
    ctx = Context(model=m, con=con)
    found = config_det.detect(ctx) + tests_det.detect(ctx)
    assert [f.summary for f in found if f.severity != "info"] == []
    for f in found:
        assert con.execute(f.sql).fetchall(), f.sql


def test_socket_transport_with_ib_devices_is_a_warning(tmp_path):
    a = analyze([lab_bundle(tmp_path, extra=IB_FILES)])
    (f,) = _rule(a, "socket_with_ib")
    assert f.severity == "warning" and f.ranks == [0, 1, 2, 3] and f.nodes == ["node"]
    # the ranks by their own names (NCCL's log prefix), the capture that held them in nodes
    assert f.hosts == ["node0", "node1", "node2", "node3"]
    assert "NCCL_IB_DISABLE=1" in f.summary and "mlx4_0,mlx5_0" in f.summary
    assert _sql_rows(a, f) == 4
    a.close()


def test_wrong_and_differing_interfaces(tmp_path):
    logs = {3: _log(3).replace("[0]eth0:", "[0]docker0:"),
            1: _log(1).replace("[0]eth0:10.203.0.11<0>", "[0]eth0:10.203.0.11<0> [1]eth1:10.9.0.11<0>")}
    a = analyze([lab_bundle(tmp_path, logs=logs)])
    (bad,) = _rule(a, "suspicious_interface")
    assert bad.severity == "warning" and bad.ranks == [3] and "docker0" in bad.summary
    (multi,) = _rule(a, "multiple_interfaces")
    assert multi.severity == "info" and multi.ranks == [1]
    (differ,) = _rule(a, "interfaces_differ")
    assert differ.severity == "warning" and differ.ranks == [0, 1, 2, 3]
    for f in (bad, multi, differ):
        assert _sql_rows(a, f) >= 1
    a.close()


def test_gdr_disabled_on_roce_without_peermem(tmp_path):
    lines = [ln for ln in (PARSERS / "nccl_debug" / "nccl_debug_info_init.log").read_text().splitlines()
             if ln.startswith("hostname1:")]
    b = make_bundle(tmp_path, "hostname1", [process(25668, 0, {"NCCL_DEBUG": "INFO"}, world=16)],
                    {"logs/nccl.log": "\n".join(lines) + "\n",
                     "sys/lsmod.txt": "Module Size Used by\nmlx5_ib 450560 0\nnvidia 56623104 2\n"})
    a = analyze([b])
    (f,) = _rule(a, "gdr_disabled")
    assert f.severity == "warning" and f.ranks == [0] and "nvidia_peermem is not loaded" in f.summary
    assert _sql_rows(a, f) == 1
    (t,) = [f for f in a.findings if f.kind == "transport"]
    assert "RDMA (RoCE)" in t.summary and "ib_counters" in t.action
    a.close()


def test_single_channel_and_version_mismatch(tmp_path):
    logs = {r: _log(r).replace("2 coll channels", "1 coll channels") for r in range(4)}
    logs[1] = f"node1:{_pid(1)}:{_pid(1)} [0] NCCL INFO NCCL version 2.18.3+cuda12.2\n" + logs[1]
    a = analyze([lab_bundle(tmp_path, logs=logs)])
    (few,) = _rule(a, "few_channels")
    assert few.severity == "warning" and few.ranks == [0, 1, 2, 3] and _sql_rows(a, few) == 4
    (ver,) = _rule(a, "nccl_version_differs")
    assert ver.severity == "warning" and "2.18.3+cuda12.2 on rank 1" in ver.summary
    assert "2.21.5+cuda12.4 on rank 0" in ver.summary and _sql_rows(a, ver) == 2
    a.close()


@pytest.mark.parametrize("versions,differ", [
    (["2.21.5", "2.21.5+cuda12.4"], False),           # the library's own version and its log's
    (["2.21.5+cuda12.4", "2.21.5+cuda12.4"], False),
    (["2.21.5+cuda11.8", "2.21.5+cuda12.4"], True),   # one release, two builds
    (["2.18.3+cuda12.2", "2.21.5"], True),
    (["2.21.5"], False)])
def test_versions_differ_by_release_or_build_not_by_a_missing_suffix(versions, differ):
    from forensics.findings.config import versions_differ
    assert versions_differ(versions) is differ


def _pid(rank: int) -> int:
    from synthetic_bundle import lab_pids
    return lab_pids("clean")[rank]


@pytest.mark.parametrize("env,var,severity", [
    ({"NCCL_P2P_DISABLE": "1"}, "NCCL_P2P_DISABLE", "warning"),
    ({"NCCL_PROTO": "Simple"}, "NCCL_PROTO", "warning"),
    ({"NCCL_PROTO": "LL,LL128,Simple"}, "NCCL_PROTO", "info"),
    ({"NCCL_ALGO": "Tree"}, "NCCL_ALGO", "warning"),
    ({"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "16"}, "NCCL_SOCKET_NTHREADS", "warning"),
    ({"NCCL_SOCKET_NTHREADS": "32"}, "NCCL_SOCKET_NTHREADS", "warning"),
    ({"NCCL_BUFFSIZE": "65536"}, "NCCL_BUFFSIZE", "warning"),
    ({"NCCL_BUFFSIZE": "2097152"}, "NCCL_BUFFSIZE", "info"),
    ({"NCCL_DEBUG": "TRACE"}, "NCCL_DEBUG", "warning"),
    ({"NCCL_MAX_NCHANNELS": "1"}, "NCCL_MAX_NCHANNELS", "warning"),
    ({"NCCL_SHM_DISABLE": "1"}, "NCCL_SHM_DISABLE", "info"),
])
def test_env_settings_known_to_hurt(tmp_path, env, var, severity):
    a = analyze([lab_bundle(tmp_path, env=env)])
    hits = [f for f in _rule(a, "env") if f.details["variable"] == var]
    assert [f.severity for f in hits] == [severity]
    assert hits[0].ranks == [0, 1, 2, 3] and f"{var}={env[var]}" in hits[0].summary
    assert _sql_rows(a, hits[0]) == 4
    a.close()


def test_harmless_env_values_stay_quiet(tmp_path):
    env = {"NCCL_P2P_DISABLE": "0", "NCCL_BUFFSIZE": "8388608", "NCCL_SOCKET_NTHREADS": "4",
           "NCCL_NSOCKS_PERTHREAD": "4", "NCCL_DEBUG": "WARN", "NCCL_MAX_NCHANNELS": "16"}
    a = analyze([lab_bundle(tmp_path, env=env)])
    assert [f.summary for f in _rule(a, "env")] == []
    a.close()


# --------------------------------------------------------------------------- nccl-tests

def _run_2_20(scale: float = 1.0) -> str:
    """The nccl-tests 2.20.0 run of the reference (2 hosts), busbw/algbw scaled by ``scale``."""
    lines = (PARSERS / "nccl_tests" / "nccl_tests_output_mixed.txt").read_text().splitlines()[:15]
    out = []
    for ln in lines:
        t = ln.split()
        if t and t[0].isdigit() and len(t) == 13:
            for i in (6, 7, 10, 11):
                t[i] = f"{float(t[i]) * scale:.2f}"
            ln = "  ".join(t)
        out.append(ln)
    return "\n".join(out) + "\n# Avg bus bandwidth    : 0.66 \n"


def test_nccl_tests_below_peers(tmp_path):
    bundles = [make_bundle(tmp_path, h, [], {"nccl-tests/output.txt": _run_2_20(s)})
               for h, s in (("a", 1.0), ("b", 1.02), ("c", 0.5))]
    a = analyze(bundles)
    (f,) = [f for f in a.findings if f.details.get("rule") == "below_peers"]
    assert f.kind == "nccl_tests_bandwidth" and f.severity == "warning" and "c" in f.hosts
    assert f.details["size_bytes"] == 65536 and f.details["ratio"] == pytest.approx(0.5, abs=0.03)
    assert "all_reduce_perf on c reached 0.51 GB/s" in f.summary and "64 KiB" in f.summary
    assert _sql_rows(a, f) == 6
    a.close()


def test_nccl_tests_equal_hosts_are_quiet(tmp_path):
    bundles = [make_bundle(tmp_path, h, [], {"nccl-tests/output.txt": _run_2_20(s)})
               for h, s in (("a", 1.0), ("b", 0.95), ("c", 1.05))]
    a = analyze(bundles)
    assert [f for f in a.findings if f.kind == "nccl_tests_bandwidth"] == []
    a.close()


def test_nccl_tests_below_expectation_on_ib(tmp_path):
    """Rows of a real multi-node run whose busbw collapsed (nccl#1453, 5.27 GB/s at >= 64 MiB)
    on hosts with two active IB ports of 40 Gb/s (sysfs sample): bound 10 GB/s."""
    mixed = (PARSERS / "nccl_tests" / "nccl_tests_output_mixed.txt").read_text().splitlines()
    header = mixed[:11]
    rows = [ln for ln in mixed if ln.startswith("[0]     67108864") or ln.startswith("[0]    134217728")]
    nccl_lines = [ln for ln in (PARSERS / "nccl_debug" / "nccl_debug_info_init.log").read_text().splitlines()
                  if ln.startswith("master_node:24570")]
    text = "\n".join(nccl_lines + header + rows) + "\n"
    a = analyze([make_bundle(tmp_path, "spark-d708", [], {"nccl-tests/output.txt": text, **IB_FILES})])
    (f,) = [f for f in a.findings if f.details.get("rule") == "below_expectation"]
    assert f.severity == "warning" and f.details["bound_gbps"] == pytest.approx(10.0)
    assert f.details["busbw_gbps"] == pytest.approx(5.30) and f.details["transport"] == "IB"
    assert "53% of the 10 GB/s that 2 x 40 Gb/s IB port(s) allow" in f.summary
    assert _sql_rows(a, f) == 4
    a.close()


def test_nccl_tests_wrong_results_are_an_error(tmp_path):
    text = _run_2_20().replace("0.23  0.23  0  ", "0.23  0.23  3  ", 1)
    assert "0.23  0.23  3  " in text
    a = analyze([make_bundle(tmp_path, "a", [], {"nccl-tests/output.txt": text})])
    (f,) = [f for f in a.findings if f.details.get("rule") == "wrong_results"]
    assert f.severity == "error" and "3 wrong values" in f.summary and _sql_rows(a, f) == 1
    a.close()


def test_nccl_tests_out_of_bounds_footer_alone_is_an_error(tmp_path):
    """A FAILED footer with no table (a ticket kept only that line) gives the error, and the
    summary says what was counted, not "0 wrong values, 0 failure line(s)"."""
    text = "./hypercube_perf -b 8 -e 8g -f 2 -g 4\n Out of bounds values : 56 FAILED\n"
    a = analyze([make_bundle(tmp_path, "a", [], {"nccl-tests/output.txt": text})])
    (f,) = [f for f in a.findings if f.details.get("rule") == "wrong_results"]
    assert f.severity == "error" and "56 out-of-bounds values." in f.summary and "0 " not in f.summary
    a.close()


def test_ib_disabled_in_env_without_logs_on_an_ib_host(tmp_path):
    """Empty NCCL logs (as in bundles whose byte budget ran out): the environment alone
    says NCCL_IB_DISABLE=1 on a host with HCAs."""
    a = analyze([lab_bundle(tmp_path, logs={r: "" for r in range(4)}, extra=IB_FILES)])
    (f,) = _rule(a, "socket_with_ib")
    assert f.severity == "warning" and f.ranks == [0, 1, 2, 3] and f.details["inferred_from_env"]
    assert "no NCCL init log" in f.summary and _sql_rows(a, f) == 4
    a.close()


def test_gdr_level_rule_only_where_rdma_is_used(tmp_path):
    lines = [ln for ln in (PARSERS / "nccl_debug" / "nccl_debug_info_init.log").read_text().splitlines()
             if ln.startswith("hostname1:")]
    env = {"NCCL_NET_GDR_LEVEL": "LOC"}
    rdma = make_bundle(tmp_path / "ib", "hostname1", [process(25668, 0, env, world=16)],
                       {"logs/nccl.log": "\n".join(lines) + "\n"})
    a = analyze([rdma])
    hits = [f for f in _rule(a, "env") if f.details["variable"] == "NCCL_NET_GDR_LEVEL"]
    assert [f.severity for f in hits] == ["warning"] and "disables GPU Direct RDMA" in hits[0].summary
    (gdr,) = _rule(a, "gdr_disabled")
    assert "state unknown" in gdr.summary            # no lsmod in this bundle
    a.close()
    a = analyze([lab_bundle(tmp_path / "sock", env=env)])
    assert [f for f in _rule(a, "env") if f.details["variable"] == "NCCL_NET_GDR_LEVEL"] == []
    a.close()
