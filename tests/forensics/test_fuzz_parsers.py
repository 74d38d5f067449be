"""Fuzzing every reader of untrusted input, CI-sized (issue 7).

Per target (tests/fuzz/targets.py: pcap, pcapng, bpf events, manifest and every registered
parser) 10,000 seeded inputs mutated from real samples, plus hypothesis-built structured
inputs for the formats with structure worth generating (manifest, tracer events, Flight
Recorder pickles, pcap records). Contract: a result with one-line warnings, or the
project's own one-line error; never another exception, never a hang, never code run by a
pickle. The counts are printed at the end of the run (tests/fuzz/report.py).

``STALLSCOPE_FUZZ_EXAMPLES`` scales the mutation runs; ``make fuzz`` (bench/fuzz.py) is the
long run. Inputs that once broke a reader are kept in tests/fixtures/fuzz/<target>/.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from fuzz import background, runner
from fuzz.plan import DEEP, EXAMPLES, JOBS, PARALLEL, TIME_LIMIT_S
from fuzz.targets import ALL_TARGETS, PWNED, TARGETS, Workdir, malicious_pickle

HYPO = settings(max_examples=max(1, EXAMPLES // 20), deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
REGRESSIONS = FIXTURES / "fuzz"


def _run(kind: str, name: str, n: int, tmp_path: Path) -> None:
    """``n`` inputs of ``name``: the background run's (tests/conftest.py started it at the
    start of the session: fuzz/background.py), else run here."""
    crashes = tmp_path / "crashes"
    r = background.result(kind, name)
    if r is None and JOBS > 1 and name in PARALLEL:
        r = runner.run_parallel(name, n, 0, JOBS, TIME_LIMIT_S, crashes)
    elif r is not None:
        crashes = background.STARTED["out"].parent / "crashes" / name
    if r is not None:
        assert r["inputs"] == n, r
        assert not r["failures"], (f"{len(r['failures'])} failure(s); shrunk inputs in {crashes}\n" + "\n".join(
            f"{f['kind']} at {f['where']}: {f['message']}\n  input: {bytes.fromhex(f['input_hex'])[:300]!r}\n"
            f"{f['trace']}" for f in r["failures"]))
        return
    out = runner.run_target(name, n, seed=0, crash_dir=crashes, time_limit=TIME_LIMIT_S,
                            work=Workdir(tmp_path / "work"))
    assert out.inputs == n
    assert not out.failures, (f"{len(out.failures)} distinct failure(s); shrunk inputs in {crashes}\n"
                              + "\n".join(f.describe() for f in out.failures.values()))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_mutated_inputs_keep_the_contract(name, tmp_path):
    _run("mutated", name, EXAMPLES, tmp_path)


@pytest.mark.parametrize("name", sorted(DEEP))
def test_deeper_paths_keep_the_contract(name, tmp_path):
    _run("deep", name, DEEP[name], tmp_path)


def test_an_input_that_spins_is_a_hang_and_one_that_waits_is_not(tmp_path):
    """The time limit is CPU time: a reader in a loop is caught however busy the machine is,
    and an input that merely waits for the CPU (a loaded CI machine) is not a hang."""
    import time
    from fuzz.targets import Target

    def spin(data, work):
        while True:
            pass

    def wait(data, work):
        time.sleep(0.5)

    for check, hangs in ((spin, 1), (wait, 0)):
        t = Target("limit", lambda: [b"x"], lambda rng, t: b"x", check)
        out = runner.run_target(t, 2, time_limit=0.3, work=Workdir(tmp_path / check.__name__))
        assert out.inputs == 2
        assert [f.kind for f in out.failures.values()] == ["hang"] * hangs, out.failures
    runner.COUNTS.pop("limit", None)     # not a parser: not in the printed counts


def test_every_parser_is_a_target():
    from forensics.parsers import parsers
    assert {p.NAME for p in parsers()} <= set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_mutations_still_reach_the_parsers(name):
    """The inputs keep enough structure to produce rows (or the runs above are hollow):
    at least 5% of 300 inputs give a non-empty table."""
    import random
    t = TARGETS[name]
    rng = random.Random(1)
    hits = 0
    work = Workdir()
    try:
        for _ in range(300):
            hits += _rows(name, t.generate(rng, t), work) > 0
    finally:
        work.close()
    assert hits >= 15, f"{name}: only {hits} of 300 mutated inputs produced rows"


def _rows(name: str, data: bytes, work: Workdir) -> int:
    from forensics.errors import StallscopeError
    if name in ("pcap", "pcapng"):
        from forensics.tcp import analyze_file
        try:
            return analyze_file(work.file("x.pcap", data), keep="all").stats.tcp_packets
        except StallscopeError:
            return 0
    if name == "bpf_events":
        from forensics.inputs.bundle import Bundle
        from fuzz.targets import MINIMAL_MANIFEST, _folder_bundle
        with Bundle.open(_folder_bundle(work, MINIMAL_MANIFEST, data)) as b:
            return len(b.read_bpf_events())
    if name == "manifest":
        from forensics.inputs.bundle import parse_manifest
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError):
            return 0
        m = parse_manifest(raw, [], "h")
        return len(m.processes) + len(m.clock_samples) + len(m.collectors)
    from forensics.parsers import get
    return sum(len(df) for df in get(name).parse(data).tables.values())


# ------------------------------------------------------------------ regressions

REGRESSION_CASES = sorted((p.parent.name, p) for p in REGRESSIONS.glob("*/*") if p.is_file()
                          and p.parent.name in ALL_TARGETS)


@pytest.mark.parametrize("target,path", REGRESSION_CASES, ids=[f"{t}/{p.name}" for t, p in REGRESSION_CASES])
def test_inputs_that_once_crashed(target, path):
    assert runner.reproduce(target, path.read_bytes()) is None


def test_huge_pickle_memo_indices_are_refused_before_unpickling():
    """LONG_BINPUT 0xFFFFFFFF made the C unpickler allocate and clear tens of GB (a hang)."""
    from forensics.parsers import get
    paths = sorted(REGRESSIONS.glob("flight_recorder/memo_index_*"))
    assert paths, "the memo index regression inputs are missing"
    for path in paths:
        r = get("flight_recorder").parse(path.read_bytes())
        assert any("memo index" in w for w in r.warnings), (path.name, r.warnings)


@pytest.mark.parametrize("path", sorted(REGRESSIONS.glob("bpf_events_model/*")), ids=lambda p: p.name)
def test_corrupt_events_are_skipped_with_a_problem_line(path, tmp_path):
    from forensics.inputs.bundle import Bundle
    from fuzz.targets import MINIMAL_MANIFEST, _folder_bundle
    with Bundle.open(_folder_bundle(Workdir(tmp_path), MINIMAL_MANIFEST, path.read_bytes())) as b:
        events = b.read_bpf_events()
        bad = [p for p in b.problems if p.startswith("bpf/events.jsonl: ") and "skipped" in p]
    assert len(bad) == 1, b.problems
    # the one sane record of coll_without_stream.jsonl (the host wait) is kept
    assert len(events) == (1 if path.name == "coll_without_stream.jsonl" else 0)


# ------------------------------------------------------------------ pickles never run code

@pytest.mark.parametrize("seed", range(12))
def test_malicious_pickles_are_refused_without_running(seed):
    import random
    from forensics.parsers import get
    data = malicious_pickle(random.Random(seed))
    PWNED.unlink(missing_ok=True)
    r = get("flight_recorder").parse(data)
    assert not PWNED.exists()
    assert any("refused pickle" in w or "unreadable pickle" in w for w in r.warnings), r.warnings
    assert all(len(df) == 0 for df in r.tables.values())


def test_the_malicious_pickles_would_run_code_if_unpickled(tmp_path):
    """The generator is real: plain pickle.loads on the GLOBAL+REDUCE route runs os.system."""
    import random
    rng = random.Random(0)
    for _ in range(200):
        data = malicious_pickle(rng)
        if data.startswith(b"\x80\x02cos\nsystem\n(") and data.endswith(b"tR."):
            break
    else:
        pytest.fail("no os.system REDUCE pickle generated")
    PWNED.unlink(missing_ok=True)
    try:
        pickle.loads(data)
        assert PWNED.exists()
    finally:
        PWNED.unlink(missing_ok=True)


# ------------------------------------------------------------------ hypothesis: structured inputs

ints = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.sampled_from([0, -1, 2 ** 63 - 1, 2 ** 63, 2 ** 64]))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=12))
json_any = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                                      max_size=4), max_leaves=12)


def maybe(strategy):
    return st.one_of(strategy, json_any)


manifest_st = st.fixed_dictionaries({}, optional={
    "schema_version": maybe(st.integers(0, 3)), "host": maybe(st.text(max_size=20)),
    "started_ns": maybe(ints), "ended_ns": maybe(ints), "partial": maybe(st.booleans()),
    "clock_samples": maybe(st.lists(st.fixed_dictionaries({"monotonic_ns": maybe(ints), "realtime_ns": maybe(ints)},
                                                          optional={"uncertainty_ns": maybe(ints)}), max_size=5)),
    "collectors": maybe(st.dictionaries(st.text(max_size=10), st.fixed_dictionaries(
        {}, optional={"status": maybe(st.sampled_from(["ok", "failed", "skipped", "running"])),
                      "reason": maybe(st.text(max_size=20)), "rc": maybe(ints), "started_ns": maybe(ints),
                      "files": maybe(st.lists(st.text(max_size=20), max_size=3))}), max_size=4)),
    "processes": maybe(st.lists(st.fixed_dictionaries({"pid": maybe(ints)}, optional={
        "rank": maybe(ints), "world_size": maybe(ints), "env": maybe(st.dictionaries(st.text(max_size=8),
                                                                                    scalars, max_size=3)),
        "cmdline": maybe(st.lists(scalars, max_size=3)), "libnccl": maybe(st.lists(scalars, max_size=2)),
        "sockets": maybe(st.lists(st.fixed_dictionaries({"saddr": maybe(st.text(max_size=15)),
                                                         "sport": maybe(ints)}), max_size=2))}), max_size=4)),
    "netns": maybe(st.lists(st.fixed_dictionaries({"inode": maybe(ints)}, optional={
        "label": maybe(st.text(max_size=10)), "pids": maybe(st.lists(scalars, max_size=3))}), max_size=3)),
    "files": maybe(st.lists(st.fixed_dictionaries({"path": maybe(st.sampled_from(
        ["bpf/events.jsonl", "pcap/x.pcap", "../../etc/passwd", "/etc/passwd", "a/../../b", "manifest.json"])),
        "bytes": maybe(ints)}), max_size=4)),
    "options": maybe(st.dictionaries(st.sampled_from(["pcap", "bpf", "max_bytes"]), scalars, max_size=3)),
})


@HYPO
@given(manifest_st)
def test_structured_manifests(raw):
    runner.count("manifest (hypothesis)", 1)
    data = json.dumps(raw, allow_nan=True).encode()
    assert runner.reproduce("manifest", data) is None


event_kinds = st.sampled_from(["coll", "group", "host_wait", "sock_state", "tcp_retransmit_skb", "tcp_send_reset",
                               "tcp_receive_reset", "offcpu", "comm_init", "comm_destroy", "unique_id",
                               "tracer_start", "tracer_end", "tracer_stopped", "unknown_kind"])
event_st = st.fixed_dictionaries({"ev": maybe(event_kinds)}, optional={
    k: maybe(v) for k, v in {
        "t": ints, "t0": ints, "t1": ints, "pid": st.integers(0, 70000), "tid": st.integers(0, 70000),
        "op": st.sampled_from(["ALL_REDUCE", "BROADCAST", "SEND", "RECV", "x"]), "fn": st.text(max_size=12),
        "comm": st.sampled_from(["0x1", "0x2", "zz"]), "stream": st.sampled_from(["0x1", "0x2", ""]),
        "rank": st.integers(-1, 8), "nranks": st.integers(0, 8), "op_count": ints, "count": ints,
        "datatype": st.integers(-1, 20), "red_op": st.integers(-1, 10), "root": st.integers(-1, 8),
        "comm_id_hash": st.sampled_from(["0xab", "0xcd", ""]), "returned": st.booleans(), "rc": ints,
        "saddr": st.sampled_from(["10.0.0.1", "10.0.0.2", "::1", "x"]),
        "daddr": st.sampled_from(["10.0.0.1", "10.0.0.2", "fe80::1", ""]), "sport": st.integers(0, 70000),
        "dport": st.integers(0, 70000), "netns": ints, "family": st.sampled_from([2, 4, 6, 10]),
        "state": st.text(max_size=12), "oldstate": st.text(max_size=12), "newstate": st.text(max_size=12),
        "unique_id": st.lists(st.text(max_size=18), max_size=16),
    }.items()})


@settings(HYPO, max_examples=max(1, EXAMPLES // 100))
@given(st.lists(event_st, min_size=1, max_size=12))
def test_structured_tracer_events_through_the_model(events):
    runner.count("bpf_events_model (hypothesis)", 1)
    data = b"\n".join(json.dumps(e, allow_nan=True).encode() for e in events)
    assert runner.reproduce("bpf_events_model", data) is None


fr_entry = st.fixed_dictionaries({}, optional={
    k: maybe(v) for k, v in {
        "record_id": ints, "pg_id": ints, "collective_seq_id": ints, "p2p_seq_id": ints, "op_id": ints,
        "profiling_name": st.sampled_from(["nccl:all_reduce", "nccl:send 0->1", "", "nccl:", "x:y:z"]),
        "process_group": st.tuples(st.text(max_size=4), st.text(max_size=8)),
        "time_created_ns": ints, "time_discovered_started_ns": ints, "time_discovered_completed_ns": ints,
        "duration_ms": st.floats(allow_nan=True), "state": st.sampled_from(["scheduled", "started", "completed"]),
        "input_sizes": st.lists(st.lists(ints, max_size=3), max_size=3), "output_sizes": json_any,
        "input_dtypes": st.lists(st.text(max_size=6), max_size=3), "is_p2p": st.booleans(),
        "retired": st.booleans(), "timeout_ms": ints, "thread_id": scalars,
        "frames": st.lists(st.fixed_dictionaries({"name": scalars, "filename": scalars, "line": scalars}),
                           max_size=3),
    }.items()})
fr_dump = st.fixed_dictionaries({"version": maybe(st.sampled_from(["2.5", "2.10", ""]))}, optional={
    "entries": maybe(st.lists(fr_entry, max_size=5)), "rank": maybe(ints),
    "pg_config": maybe(st.dictionaries(st.text(max_size=4), maybe(st.fixed_dictionaries(
        {"name": scalars, "desc": scalars, "ranks": maybe(st.lists(ints, max_size=4))})), max_size=3)),
    "pg_status": maybe(st.dictionaries(st.text(max_size=4), maybe(st.fixed_dictionaries(
        {"last_enqueued_collective": maybe(ints), "last_started_collective": maybe(ints)})), max_size=3)),
    "comm_lib_version": scalars})


@HYPO
@given(fr_dump, st.integers(0, 5), st.booleans())
def test_structured_flight_recorder_dumps(dump, protocol, as_json):
    runner.count("flight_recorder (hypothesis)", 1)
    if as_json:
        data = json.dumps(dump, allow_nan=True, default=list).encode()
    else:
        data = pickle.dumps(dump, protocol=protocol)
    assert runner.reproduce("flight_recorder", data) is None


def _pcap(linktype: int, records: list[tuple[int, int, int, int, bytes]], nsec: bool, big: bool) -> bytes:
    e = ">" if big else "<"
    magic = 0xA1B23C4D if nsec else 0xA1B2C3D4
    out = io.BytesIO()
    out.write(struct.pack(e + "IHHiIII", magic, 2, 4, 0, 0, 65535, linktype))
    for sec, frac, caplen, origlen, data in records:
        out.write(struct.pack(e + "IIII", sec, frac, caplen, origlen) + data)
    return out.getvalue()


def _frame(eth: bool, ip: bytes, tcp: bytes, payload: bytes) -> bytes:
    return (b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" if eth else b"") + ip + tcp + payload


ip_hdr = st.builds(lambda ihl, tot, frag, proto, src, dst: struct.pack(
    ">BBHHHBBH4s4s", 0x40 | ihl, 0, tot, 1, frag, 64, proto, 0, src, dst),
    st.integers(0, 15), st.integers(0, 0xFFFF), st.sampled_from([0, 0x2000, 0x4000, 0x1FFF, 0x2001]),
    st.sampled_from([6, 6, 6, 17, 1]), st.sampled_from([b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02"]),
    st.sampled_from([b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02"]))
tcp_hdr = st.builds(lambda sp, dp, seq, ack, off, flags, win, opts: struct.pack(
    ">HHIIBBHHH", sp, dp, seq, ack, off << 4, flags, win, 0, 0) + opts,
    st.sampled_from([1, 5000, 5001]), st.sampled_from([1, 5000, 5001]), st.integers(0, 2 ** 32 - 1),
    st.integers(0, 2 ** 32 - 1), st.integers(0, 15), st.integers(0, 255), st.integers(0, 0xFFFF),
    st.sampled_from([b"", b"\x01\x01\x01\x00", b"\x02\x04\x05\xb4", b"\x03\x03\x07\x00", b"\x05\x0a" + b"\x00" * 8,
                     b"\x04\x02\x01\x00", b"\x00\x00\x00\x00", b"\xff"]))
record_st = st.tuples(st.integers(0, 2 ** 32 - 1), st.integers(0, 2 ** 32 - 1),
                      st.booleans(), st.booleans(), ip_hdr, tcp_hdr, st.binary(max_size=40),
                      st.integers(-8, 8), st.integers(0, 2000))


@HYPO
@given(st.sampled_from([1, 1, 1, 101, 113, 276, 0, 12, 228, 9999]), st.lists(record_st, max_size=12),
       st.booleans(), st.booleans())
def test_structured_pcap_records(linktype, recs, nsec, big):
    """Header fields the walker and decoder trust: caplen vs origlen vs the bytes there, IP
    header length and total length, fragment offsets, TCP data offset, options."""
    runner.count("pcap (hypothesis)", 1)
    records = []
    for sec, frac, eth, cap_ok, ip, tcp, payload, skew, orig in recs:
        data = _frame(eth and linktype == 1, ip, tcp, payload)
        caplen = len(data) if cap_ok else max(0, len(data) + skew)
        records.append((sec, frac, caplen, orig if not cap_ok else len(data), data))
    assert runner.reproduce("pcap", _pcap(linktype, records, nsec, big)) is None
