"""Every parser survives random and mutated input: a result with warnings, never an exception.

Inputs: random bytes, random printable text, and the real fixtures cut into lines and
mutated (truncated, spliced, characters replaced, lines duplicated or dropped); for the
binary Flight Recorder format, the pickles themselves truncated and bit-flipped.
"""
from __future__ import annotations

import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from forensics.parsers import get, parsers

P = FIXTURES / "parsers"
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SOURCES = {
    "nccl_debug": ["nccl_debug/nccl_debug_info_init.log", "nccl_debug/nccl_debug_coll.log",
                   "nccl_debug/nccl_debug_warn.log"],
    "nccl_tests": ["nccl_tests/nccl_tests_output_mixed.txt", "nccl_tests/all_reduce_perf.json"],
    "ib_counters": ["ib_counters/perfquery_x_traffic_wrapped_header.txt", "ib_counters/sysfs_grep_start.txt",
                    "ib_counters/perfquery_old_names.txt"],
    "ss": ["ss/ss_tinp_loopback.txt", "ss/ss_tainp_crafted_ipv6_retrans.txt"],
    "flight_recorder": ["flight_recorder/json_nccl_trace_rank_1.json"],
    "nccl_inspector": ["nccl_inspector/example-hostname-pid1639453.log", "nccl_inspector/prometheus_textfile.prom"],
    "nccl_profiler_trace": ["nccl_profiler_trace/example_readme_trace.json"],
    "pyspy": ["pyspy/pyspy_dump_rank0.txt", "pyspy/pyspy_dump_native_locals_rank1.txt", "pyspy/pyspy_dump_rank1.json"],
    "torch_watchdog": ["torch_watchdog/watchdog.log"],
    "native_stacks": ["native_stacks/eu-stack_pause.txt", "native_stacks/gdb_pause.txt"],
    "fr_analyzer": ["fr_analyzer/fr_trace_2_5.txt", "fr_analyzer/fr_trace_2_7.txt"],
    "ncclras": ["ncclras/doc_incomplete.txt", "ncclras/doc_mismatch_op_counts.txt", "ncclras/doc_mismatch_status.txt"],
    "proc_threads": ["proc_threads/python_poll_recv_end.json"],
    "torch_elastic": ["torch_elastic/childfailed.log"],
    "launcher_exits": ["launcher_exits/deaths.log"],
    "torch_init": ["torch_init/never_met.log", "torch_init/agent_traceback.log"],
    "nvidia_smi": ["nvidia_smi/gpu_lost.txt"],
    "ib_status": ["ib_status/ibstat_one_down.txt", "ib_status/ibstatus.txt", "ib_status/ibv_devinfo_v.txt"],
    "kernel_log": ["kernel_log/dmesg_xid_link_oom.txt"],
}
LINES = {name: [ln for f in files for ln in (P / f).read_bytes().splitlines()] for name, files in SOURCES.items()}
PICKLES = [(P / "flight_recorder" / n).read_bytes() for n in ("nccl_trace_rank_0", "proto5_nccl_trace_rank_1",
                                                              "typed_list_nccl_trace_rank_2")]


@st.composite
def mutated_line(draw, lines):
    line = draw(st.sampled_from(lines))
    op = draw(st.sampled_from(["keep", "cut", "replace", "insert", "splice"]))
    if op == "keep" or not line:
        return line
    i = draw(st.integers(0, len(line)))
    if op == "cut":
        return line[:i]
    if op == "replace":
        j = draw(st.integers(i, len(line)))
        return line[:i] + draw(st.binary(max_size=8)) + line[j:]
    if op == "insert":
        return line[:i] + draw(st.sampled_from([b" ", b":", b"-1", b"nan", b"0x", b"[", b"]", b"{", b"}", b'"',
                                                b"\t", b"\x00", b"\xff", b"99999999999999999999999"])) + line[i:]
    other = draw(st.sampled_from(lines))
    return line[:i] + other[draw(st.integers(0, len(other))):]


def inputs(name):
    lines = LINES[name]
    text = st.lists(mutated_line(lines), max_size=30).map(b"\n".join)
    out = [text, st.binary(max_size=600), st.text(max_size=400).map(lambda s: s.encode("utf-8", "surrogatepass"))]
    if name == "flight_recorder":
        out.append(st.tuples(st.sampled_from(PICKLES), st.integers(0, 2000), st.integers(0, 255),
                             st.integers(0, 3000)).map(_damage_pickle))
        out.append(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                                lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=20), c,
                                                                                     max_size=4), max_leaves=20)
                   .map(lambda v: pickle.dumps({"version": "2.5", "entries": v, "pg_config": v, "pg_status": v},
                                               protocol=2)))
    return st.one_of(*out)


def _damage_pickle(args):
    data, cut, byte, pos = args
    data = bytearray(data[: max(cut, 2)])
    if data:
        data[pos % len(data)] = byte
    return bytes(data)


def check(name, data):
    p = get(name)
    r = p.parse(data)                          # bytes are always readable: no InputError either
    assert r.parser == name
    assert set(r.tables) == set(p.SCHEMAS)
    for t, df in r.tables.items():
        assert list(df.columns) == list(p.SCHEMAS[t])
    assert all(isinstance(w, str) and "\n" not in w for w in r.warnings)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_parser_never_raises(name):
    assert {p.NAME for p in parsers()} == set(SOURCES)

    @FUZZ
    @given(inputs(name))
    def run(data):
        check(name, data)
    run()


def test_fuzz_inputs_do_reach_the_parsers():
    # the mutated-fixture strategy keeps enough structure to produce rows, or this test is hollow
    for name in SOURCES:
        data = b"\n".join(LINES[name])
        r = get(name).parse(data)
        assert sum(len(t) for t in r.tables.values()) > 0, name
