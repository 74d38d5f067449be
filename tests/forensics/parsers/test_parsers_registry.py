"""The parser registry: every format registered once, selection by path and content, schemas."""
from __future__ import annotations

import re
import shutil
import sys

import pandas as pd
import pytest

from conftest import FIXTURES
from forensics.errors import InputError
from forensics.parsers import get, parse_file, parse_tree, parsers, registry

P = FIXTURES / "parsers"
NAMES = {"nccl_debug", "nccl_tests", "ib_counters", "ss", "flight_recorder", "nccl_inspector",
         "nccl_profiler_trace", "pyspy", "torch_watchdog", "proc_threads", "native_stacks", "ncclras",
         "torch_elastic", "ib_status", "kernel_log", "fr_analyzer", "launcher_exits", "torch_init", "nvidia_smi"}


def test_every_format_registered_once_with_its_declarations():
    got = {p.NAME for p in parsers()}
    assert got == NAMES
    for p in parsers():
        assert p.DESCRIPTION and p.GLOBS and p.SCHEMAS, p.NAME
        assert get(p.NAME) is p


def test_module_docstring_documents_every_column():
    for p in parsers():
        doc = " ".join(sys.modules[p.__module__].__doc__.split())
        for table, schema in p.SCHEMAS.items():
            assert table in doc, (p.NAME, table)
            for col in schema:
                assert re.search(rf"\b{re.escape(col)}\b", doc), (p.NAME, table, col)


@pytest.mark.parametrize("path, name", [
    ("nccl_debug/nccl_debug_info_init.log", "nccl_debug"),
    ("nccl_debug/nccl_debug_warn.log", "nccl_debug"),
    ("nccl_tests/nccl_tests_output_mixed.txt", "nccl_tests"),
    ("nccl_tests/all_reduce_perf.json", "nccl_tests"),
    ("ib_counters/perfquery_x_allzero.txt", "ib_counters"),
    ("ib_counters/sysfs_grep_start.txt", "ib_counters"),
    ("ss/ss_tinp_loopback.txt", "ss"),
    ("ss/ss_tinpH_loopback.txt", "ss"),
    ("flight_recorder/nccl_trace_rank_0", "flight_recorder"),
    ("flight_recorder/json_nccl_trace_rank_1.json", "flight_recorder"),
    ("nccl_inspector/readme_pretty_printed.log", "nccl_inspector"),
    ("nccl_inspector/prometheus_textfile.prom", "nccl_inspector"),
    ("nccl_profiler_trace/example_readme_trace.json", "nccl_profiler_trace"),
    ("pyspy/pyspy_dump_rank0.txt", "pyspy"),
    ("pyspy/pyspy_dump_rank1.json", "pyspy"),
    ("torch_watchdog/watchdog.log", "torch_watchdog"),
    ("proc_threads/python_poll_recv_end.json", "proc_threads"),
    ("native_stacks/eu-stack_pause.txt", "native_stacks"),
    ("native_stacks/gdb_pause.txt", "native_stacks"),
    ("ncclras/doc_healthy.txt", "ncclras"),
    ("kernel_log/dmesg_xid_link_oom.txt", "kernel_log"),
])
def test_content_sniffing_picks_the_parser(path, name):
    # fixture paths say nothing about the format: selection is by content alone
    head = (P / path).read_bytes()[:registry.SNIFF_BYTES]
    assert registry.select(None, head)[0].NAME == name
    assert parse_file(P / path).parser == name


def test_sniffers_do_not_claim_each_others_samples():
    samples = {"nccl_debug": "nccl_debug/nccl_debug_coll.log", "nccl_tests": "nccl_tests/nccl_tests_output_mixed.txt",
               "ib_counters": "ib_counters/perfquery_basic_derived.txt", "ss": "ss/ss_tainp_listen.txt",
               "flight_recorder": "flight_recorder/nccl_trace_rank_1", "pyspy": "pyspy/pyspy_dump_rank0.txt",
               "nccl_inspector": "nccl_inspector/example-hostname-pid1639453.log",
               "nccl_profiler_trace": "nccl_profiler_trace/example_readme_trace.json",
               "torch_watchdog": "torch_watchdog/watchdog.log"}
    for owner, path in samples.items():
        head = (P / path).read_bytes()[:registry.SNIFF_BYTES]
        claimed = {p.NAME for p in parsers() if p.sniff(head)}
        assert claimed == {owner}, (path, claimed)


@pytest.mark.parametrize("path, pattern, expected", [
    ("/b/logs/rank0.log", "logs/*", True),
    ("/b/logs/sub/rank0.log", "logs/*", False),
    ("/b/logs/sub/rank0.log", "logs/**/*", True),
    ("/b/sys/ss-start.txt", "sys/ss*", True),
    ("/b/sys/ip-link.json", "sys/ss*", False),
    ("flight-recorder/nccl_trace_rank_3", "flight-recorder/*", True),
    ("/tmp/nccl_trace_rank_3", "nccl_trace_rank_*", True),
])
def test_glob_matches_bundle_paths(path, pattern, expected):
    assert registry.glob_matches(path, pattern) is expected


def test_glob_breaks_ties_between_parsers_claiming_a_bundle_folder():
    # logs/ holds NCCL logs and watchdog logs; content decides, the glob narrows
    head = (P / "torch_watchdog/watchdog.log").read_bytes()
    assert registry.select("/b/logs/train.log", head)[0].NAME == "torch_watchdog"
    head = (P / "nccl_debug/nccl_debug_warn.log").read_bytes()
    assert registry.select("/b/logs/train.log", head)[0].NAME == "nccl_debug"


def test_explicit_name_overrides_selection_and_unknown_name_is_input_error():
    r = parse_file(P / "nccl_debug/nccl_debug_coll.log", name="torch_watchdog")
    assert r.parser == "torch_watchdog" and len(r.tables["watchdog"]) == 0 and r.warnings
    with pytest.raises(InputError):
        parse_file(P / "nccl_debug/nccl_debug_coll.log", name="no_such_parser")


def test_unreadable_file_is_input_error_and_unknown_content_a_warning(tmp_path):
    with pytest.raises(InputError):
        parse_file(tmp_path / "missing.log")
    for p in parsers():
        with pytest.raises(InputError):
            p.parse(tmp_path / "missing.log")
    other = tmp_path / "notes.txt"
    other.write_text("hello world\nnothing to see\n")
    r = parse_file(other)
    assert r.parser == "" and len(r.warnings) == 1 and "no parser" in r.warnings[0]


def test_tables_have_exactly_the_declared_schema():
    dtypes = {"str": pd.StringDtype(), "int": pd.Int64Dtype(), "uint": pd.UInt64Dtype(), "bool": pd.BooleanDtype()}
    for path in sorted(P.glob("*/*")):
        if path.is_dir() or path.suffix in (".md", ".py"):
            continue
        r = parse_file(path)
        schemas = get(r.parser).SCHEMAS
        assert set(r.tables) == set(schemas), path
        for name, df in r.tables.items():
            assert list(df.columns) == list(schemas[name]), (path, name)
            for col, kind in schemas[name].items():
                if kind in dtypes:
                    assert df[col].dtype == dtypes[kind], (path, name, col, df[col].dtype)
                elif kind == "float":
                    assert df[col].dtype == "float64", (path, name, col)


def test_warning_lines_name_file_and_line(tmp_path):
    f = tmp_path / "nccl.log"
    f.write_text("host:1:2 [0] NCCL INFO AllReduce: opCount zz sendbuff\n")
    r = parse_file(f, name="nccl_debug")
    assert r.warnings == [f"{f}:1: malformed COLL line: 'AllReduce: opCount zz sendbuff'"]


def test_warnings_are_capped_per_file(tmp_path):
    f = tmp_path / "ss.txt"
    f.write_text("State Recv-Q Send-Q Local Address:Port Peer Address:Port\n" + "BOGUS 1 2 a:1 b:2\n" * 500)
    r = parse_file(f, name="ss")
    assert len(r.warnings) == registry.MAX_WARNINGS + 1
    assert r.warnings[-1].endswith("more warnings suppressed")
    assert all("\n" not in w for w in r.warnings)


def test_parse_tree_reads_a_bundle_folder(tmp_path):
    b = tmp_path / "bundle"
    (b / "logs").mkdir(parents=True)
    (b / "sys").mkdir()
    (b / "stacks").mkdir()
    (b / "flight-recorder").mkdir()
    (b / "nccl-tests").mkdir()
    shutil.copy(P / "nccl_debug/nccl_debug_info_init.log", b / "logs/nccl.host1.123.log")
    shutil.copy(P / "torch_watchdog/watchdog.log", b / "logs/train-stdout.log")
    shutil.copy(P / "ss/ss_tinp_loopback.txt", b / "sys/ss-start.txt")
    shutil.copy(P / "pyspy/pyspy_dump_rank0.txt", b / "stacks/pyspy-48213.txt")
    shutil.copy(P / "flight_recorder/nccl_trace_rank_0", b / "flight-recorder/nccl_trace_rank_0")
    shutil.copy(P / "nccl_tests/nccl_tests_output_mixed.txt", b / "nccl-tests/all_reduce_perf.txt")
    shutil.copytree(P / "ib_counters/tree_bundle/ib", b / "ib")
    (b / "manifest.json").write_text("{}")
    (b / "logs/dmesg.txt").write_text("[  12.5] NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.\n")
    (b / "nccl-tests/rows-only.txt").write_text("  8  2  float  sum  -1  12.90  0.00  0.00  0  12.87  0.00  0.00  0\n")
    results = parse_tree(b)
    by_parser = {r.parser: r for r in results}
    assert set(by_parser) == {"nccl_debug", "torch_watchdog", "ss", "pyspy", "flight_recorder", "nccl_tests",
                              "ib_counters", "kernel_log"}
    # manifest.json is nobody's; dmesg's Xid line is the kernel log's; the ib/ tree is one result;
    # a headerless nccl-tests fragment is read because only nccl_tests claims nccl-tests/
    assert len(results) == 9
    rows_only = [r for r in results if r.source.endswith("rows-only.txt")][0]
    assert len(rows_only.tables["nccl_tests"]) == 2
    assert by_parser["ss"].facts["phase"] == "start"
    assert set(by_parser["ib_counters"].tables["ib_counters"]["phase"]) == {"start", "end"}
    assert all(not r.warnings for r in results)
