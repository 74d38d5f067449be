"""capture/manifest.py is the one schema of manifest.json: the writer writes its keys, the reader
reads only its keys, by their kinds, and docs/DESIGN.md shows it.

The capture side is exercised without root or a job: a :class:`capture.runner.Capture` whose
session holds this test process as the job's process (with a real TCP connection of its own),
collector records made through :meth:`Session.record`, and a staged ss snapshot."""
from __future__ import annotations

import ast
import dataclasses
import io
import json
import os
import socket
import tarfile
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT

from capture import bundle_files as bd
from capture import manifest as schema
from capture import procs
from capture.options import CaptureOptions
from capture.runner import Capture
from capture.session import clock_sample
from capture.staging import recover_staging
from forensics.inputs.bundle import (ClockSample, CollectorStatus, FileEntry, Manifest, NetnsInfo, ProcessInfo, SocketInfo,
                              field_readers, parse_manifest)


# the reader's typed records and the table each is read from
READER_RECORDS = [(ClockSample, schema.CLOCK_SAMPLE), (SocketInfo, schema.SOCKET), (ProcessInfo, schema.PROCESS),
                  (CollectorStatus, schema.RECORD), (NetnsInfo, schema.NETNS), (FileEntry, schema.FILE),
                  (Manifest, schema.TOP)]
# fields of those records that are not a key of their table
DERIVED = {(CollectorStatus, "name"), (Manifest, "raw")}
# what a record's annotation says for each kind the reader reads
ANNOTATION = {schema.INT: "int", schema.STR: "str", schema.STRS: "tuple[str, ...]", schema.ARGV: "tuple[str, ...]",
              schema.INTS: "tuple[int, ...]", schema.MAP: "dict[str, str]", schema.INTERVAL: "tuple[int, int]",
              schema.OBJECT: "dict[str, Any]", schema.RECORDS: "[", schema.RECORD_MAP: "dict[str, "}


@pytest.fixture
def written(tmp_path):
    """(manifest dict, the capture) of a capture whose job is this process, written as a finished
    capture writes it (``Capture.finalize``): processes with their sockets and ss counters, the
    collectors' records, files."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    cap = Capture(CaptureOptions(output=str(tmp_path), duration_s=1, pids=[os.getpid()], ifaces=["lo"]),
                  stderr=io.StringIO())
    s = cap.s
    try:
        s.staging = tmp_path / "staging"
        s.budget = bd.Budget.plan(64 << 20)
        info = procs.ProcInfo(pid=os.getpid(), comm="python", exe="/usr/bin/python3", cmdline=["python3", "-m", "x"],
                              env={"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
                                   "NCCL_SOCKET_IFNAME": "lo"},
                              netns_inode=procs.netns_inode(os.getpid()), start_ticks=1, python=True,
                              hostname="h", job_reasons=["pid"])
        s.jobs.own()
        s.jobs.procs[info.pid] = info
        ns = s.jobs.ensure_netns(info.netns_inode, info.pid)
        ns.pids.append(info.pid)
        ns.ifaces = ["lo"]
        loc, peer = client.getsockname(), client.getpeername()
        ss = s.staging / "sys" / ns.label / "ss-tinp-end.txt"
        ss.parent.mkdir(parents=True)
        ss.write_text(f"ESTAB 0 0 {loc[0]}:{loc[1]} {peer[0]}:{peer[1]} users:((\"python\",pid={os.getpid()},fd=5))\n"
                      "\t cubic rtt:0.05/0.025 cwnd:10 bytes_sent:10 bytes_retrans:1 bytes_received:5 segs_out:3 "
                      "lost:0 retrans:0/1\n")
        s.clock.append(clock_sample())
        s.record("ss@host:end", status="ok", command="ss -tinp", rc=0, files=[s.rel(ss)], started_ns=1, ended_ns=2,
                 covered_ns=[1, 2])
        s.record("tracer", status="skipped", reason="--no-bpf")
        s.clock.append(clock_sample())
        m = cap.manifest_dict(time.time_ns(), s.jobs.process_facts(s.staging), partial=False)
        m["files"] = bd.file_entries(s.staging)
        yield m, cap
    finally:
        s.pool.shutdown(wait=False)
        for sk in (server, client, listener):
            sk.close()


# ------------------------------------------------------------------ the writer
def test_a_written_manifest_has_exactly_the_schemas_keys(written):
    m, _ = written
    assert schema.problems(m) == []
    assert list(m) == [f.name for f in schema.TOP.fields if f.always]
    [p] = m["processes"]
    assert set(p) == set(schema.PROCESS.names)
    assert any(set(x) == set(schema.SOCKET.names) for x in p["sockets"]), \
        f"no socket with the ss snapshot's counters: {p['sockets']}"
    assert list(m["collectors"]["tracer"]) == list(schema.RECORD.defaults())
    assert m["clock_samples"] and all(set(c) == {"monotonic_ns", "realtime_ns", "uncertainty_ns"}
                                      for c in m["clock_samples"])


def test_the_check_finds_a_key_the_schema_lacks_and_a_missing_one(written):
    m, _ = written
    m = json.loads(json.dumps(m))
    m["bogus"] = 1
    m["processes"][0]["sockets"][0]["bogus_counter"] = 2
    m["collectors"]["tracer"]["bogus_extra"] = 3
    del m["netns"][0]["label"]
    assert schema.problems(m) == [
        "manifest: unknown key 'bogus'",
        "manifest.collectors['tracer']: unknown key 'bogus_extra'",
        "manifest.netns[0]: missing key 'label'",
        "manifest.processes[0].sockets[0]: unknown key 'bogus_counter'",
    ]
    with pytest.raises(KeyError, match="bogus"):
        schema.PROCESS.make(pid=1, bogus=2)


def test_the_staged_manifest_keys_are_the_schemas(written):
    """What a killed capture leaves for recovery: the staged manifest with ``capture``."""
    _, cap = written
    cap.out_path = Path(cap.s.staging.parent / "stallscope-h-20260101T000000Z.tar.gz")
    cap.write_staged_manifest()
    staged = json.loads((cap.s.staging / ".manifest.staged.json").read_text())
    assert [p for p in schema.problems(staged) if "unknown" in p] == []
    assert set(staged["capture"]) == set(schema.STAGED.names)


def test_a_recovered_manifest_keys_are_the_schemas(written):
    """A killed capture's staging folder made into a partial bundle (capture/staging.py)."""
    _, cap = written
    s = cap.s
    cap.out_path = s.staging.parent / "stallscope-h-20260101T000000Z.tar.gz"
    cap.write_staged_manifest()
    killed = s.staging.rename(s.staging.parent / f".stallscope-h-20260101T000000Z.staging-{2 ** 22 + 1}")
    out = recover_staging(killed)
    with tarfile.open(out) as t:
        m = json.load(t.extractfile(f"{out.name[:-len('.tar.gz')]}/manifest.json"))
    assert [p for p in schema.problems(m) if "unknown" in p] == []
    assert m["partial"] is True and set(m["recovered"]) == set(schema.RECOVERED.names)
    assert m["clock_samples"][-1]["source"] == "recovery" and "capture" not in m


def _record_keywords(path: Path) -> set[tuple[str, int, str]]:
    """(file, line, key) of every key a ``.record(..)`` call passes, ``**{"k": ..}`` included."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record"):
            continue
        for kw in node.keywords:
            if kw.arg is not None:
                out.add((path.name, node.lineno, kw.arg))
                continue
            for d in ast.walk(kw.value):
                if isinstance(d, ast.Dict):
                    out.update((path.name, node.lineno, k.value) for k in d.keys if isinstance(k, ast.Constant))
    return out


def _make_keywords(path: Path) -> set[tuple[str, int, str, str]]:
    """(file, line, table, key) of every key a ``schema.<TABLE>.make(..)`` call passes."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        f = node.func if isinstance(node, ast.Call) else None
        if isinstance(f, ast.Attribute) and f.attr == "make" and isinstance(f.value, ast.Attribute) \
                and isinstance(f.value.value, ast.Name) and f.value.value.id == "schema":
            out.update((path.name, node.lineno, f.value.attr, kw.arg) for kw in node.keywords if kw.arg is not None)
    return out


def test_every_key_the_writer_makes_is_in_its_table():
    """Also the paths no test here runs (the watcher's incident, a disk-full bundle)."""
    keys = set()
    for f in sorted((ROOT / "capture").rglob("*.py")):
        keys |= _make_keywords(f)
    assert {t for _, _, t, _ in keys} >= {"TOP", "OPTIONS", "PROCESS", "SOCKET", "NETNS", "FILE", "CLOCK_SAMPLE",
                                          "TRIGGER", "WATCH", "PCAP_RING", "PCAP_RUN", "RECOVERED", "STAGED", "RECORD"}
    unknown = sorted(k for k in keys if k[3] not in getattr(schema, k[2]).names)
    assert unknown == [], f"keys written that their table lacks: {unknown}"


def test_every_key_a_collector_records_is_in_the_schema():
    keys = set()
    for f in sorted((ROOT / "capture").rglob("*.py")):
        keys |= _record_keywords(f)
    assert len({k for _, _, k in keys}) >= 20, "the scan found too few record keys: is it still reading the calls?"
    unknown = sorted(k for k in keys if k[2] not in schema.RECORD.names)
    assert unknown == [], f"record keys capture/manifest.py's RECORD lacks: {unknown}"


def test_shipped_bundles_use_only_the_schemas_keys():
    """Bundles written by earlier captures (tests/fixtures) hold no key the schema lacks; keys
    added since (timezone, nccl_version ...) may be missing from them."""
    seen = 0
    for arc in sorted(FIXTURES.rglob("*.tar.gz")):
        with tarfile.open(arc) as t:
            for member in t:
                if member.name.endswith("/manifest.json") and member.name.count("/") == 1:
                    m = json.load(t.extractfile(member))
                    assert [p for p in schema.problems(m) if "unknown" in p] == [], arc.name
                    seen += 1
    assert seen >= 10


# ------------------------------------------------------------------ the reader
@pytest.mark.parametrize("cls,table", READER_RECORDS, ids=[c.__name__ for c, _ in READER_RECORDS])
def test_every_field_the_reader_reads_is_a_schema_key_of_its_type(cls, table):
    for f in dataclasses.fields(cls):
        if (cls, f.name) in DERIVED:
            continue
        spec = table.field(f.name)
        assert ANNOTATION[spec.kind] in str(f.type), f"{cls.__name__}.{f.name}: {f.type} for a {spec.kind}"
        if spec.table is not None and spec.kind != schema.OBJECT:      # nested records: read as the table's class
            [nested] = [c for c, t in READER_RECORDS if t is spec.table]
            assert nested.__name__ in str(f.type), f"{cls.__name__}.{f.name}: {f.type}, not {nested.__name__}"


def test_a_reader_field_the_schema_lacks_fails():
    @dataclasses.dataclass
    class Wider:
        pid: int
        bogus: int | None = None
    assert [n for n, _ in field_readers(Wider, schema.PROCESS, derived=("bogus",))] == ["pid"]
    with pytest.raises(KeyError, match="bogus"):
        field_readers(Wider, schema.PROCESS)
    with pytest.raises(KeyError, match="bogus"):
        Manifest(None, None, "h", None, None, None, None, [], {}, [], [], [], {}, {}).value("bogus")


def test_the_reader_reads_what_the_writer_wrote(written):
    m, _ = written
    problems: list[str] = []
    got = parse_manifest(json.loads(bd.dumps_manifest(m)), problems, "x")
    assert problems == []
    assert (got.schema_version, got.host, got.started_ns) == (schema.SCHEMA_VERSION, m["host"], m["started_ns"])
    [p] = got.processes
    assert (p.pid, p.rank, p.world_size, p.master_addr, p.master_port) == (os.getpid(), 1, 2, "10.0.0.1", 29500)
    assert p.cmdline == ("python3", "-m", "x") and p.netns == m["netns"][0]["label"] and p.hostname == "h"
    assert {(s.saddr, s.sport) for s in p.sockets} == {(s["saddr"], s["sport"]) for s in m["processes"][0]["sockets"]}
    assert got.collectors["ss@host:end"].covered_ns == (1, 2) and got.collectors["tracer"].reason == "--no-bpf"
    assert [n.label for n in got.netns] == [n["label"] for n in m["netns"]]
    assert [c.monotonic_ns for c in got.clock_samples] == [c["monotonic_ns"] for c in m["clock_samples"]]
    assert got.value("timezone") == m["timezone"] and got.options["pids"] == [os.getpid()]


@pytest.mark.parametrize("cls,table", [r for r in READER_RECORDS if r[0] is not Manifest],
                         ids=[c.__name__ for c, _ in READER_RECORDS if c is not Manifest])
def test_a_field_of_the_wrong_type_is_dropped_not_raised(cls, table):
    """Each field the reader reads, given a value of no kind (a list of objects), reads as unknown."""
    good = {"clock_samples": [{"monotonic_ns": 1, "realtime_ns": 2}], "host": "h",
            "processes": [{"pid": 1, "sockets": [{"saddr": "10.0.0.1", "sport": 1}]}], "files": [{"path": "a"}],
            "netns": [{"inode": 5}], "collectors": {"c": {"status": "ok"}}, "schema_version": 1}
    where = {schema.CLOCK_SAMPLE: good["clock_samples"][0], schema.SOCKET: good["processes"][0]["sockets"][0],
             schema.PROCESS: good["processes"][0], schema.RECORD: good["collectors"]["c"],
             schema.NETNS: good["netns"][0], schema.FILE: good["files"][0]}[table]
    keys = [f.name for f in dataclasses.fields(cls) if (cls, f.name) not in DERIVED]
    for k in keys:
        raw = json.loads(json.dumps(good))
        target = json.loads(json.dumps(where))
        target[k] = [{"x": [1]}]
        _put(raw, table, target)
        problems: list[str] = []
        got = parse_manifest(raw, problems, "x")
        assert all("\n" not in p for p in problems)
        rec = _find(got, table)
        if rec is not None:          # a required field gone drops the record, with a problem line
            assert getattr(rec, k) in (None, (), {}, "unknown", "", 0, "5"), (k, getattr(rec, k))
        else:
            assert problems or table in (schema.SOCKET, schema.NETNS, schema.FILE), k


def _put(raw: dict, table, obj: dict) -> None:
    if table is schema.CLOCK_SAMPLE:
        raw["clock_samples"] = [obj]
    elif table is schema.SOCKET:
        raw["processes"][0]["sockets"] = [obj]
    elif table is schema.PROCESS:
        raw["processes"] = [obj]
    elif table is schema.RECORD:
        raw["collectors"] = {"c": obj}
    elif table is schema.NETNS:
        raw["netns"] = [obj]
    else:
        raw["files"] = [obj]


def _find(m: Manifest, table):
    lists = {schema.CLOCK_SAMPLE: m.clock_samples, schema.SOCKET: [s for p in m.processes for s in p.sockets],
             schema.PROCESS: m.processes, schema.RECORD: list(m.collectors.values()), schema.NETNS: m.netns,
             schema.FILE: m.files}[table]
    return lists[0] if lists else None


# ------------------------------------------------------------------ the design document
def test_design_md_carries_the_schema():
    """docs/DESIGN.md holds capture/manifest.py's tables verbatim (``python -m capture.manifest``)."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    begin, end = "<!-- manifest-schema: begin -->\n", "<!-- manifest-schema: end -->"
    assert begin in text and end in text
    block = text.split(begin, 1)[1].split(end, 1)[0]
    assert block.strip() == schema.markdown().strip(), \
        "docs/DESIGN.md's manifest tables differ from capture/manifest.py: paste `python -m capture.manifest`"
