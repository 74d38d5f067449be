"""forensics.inputs.bundle: safe unpacking of untrusted archives, partly broken bundles, clock maps.

Malicious archives are crafted here with tarfile; each must be refused with one
``InputError`` line and leave nothing outside the (removed) unpack folder.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES
from forensics.inputs.bundle import Bundle, ClockMap, ClockSample, unpack_archive
from forensics.errors import InputError

BUNDLES = FIXTURES / "bundles"
SCENARIOS = sorted(p.name for p in BUNDLES.iterdir() if p.is_dir()) if BUNDLES.is_dir() else []


def bundle_path(scenario: str) -> Path:
    return next((BUNDLES / scenario).glob("*.tar.gz"))


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], gz: bool = True) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for info, data in members:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti, data


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = link
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        ti.devmajor, ti.devminor = 1, 3
    return ti, None


GOOD = [_file("b/manifest.json", b'{"schema_version": 1, "host": "h", "clock_samples": []}')]

MALICIOUS = {
    "dotdot": [*GOOD, _file("b/../../escaped.txt")],
    "absolute": [*GOOD, _file("/tmp/stallscope-escaped-abs.txt")],
    "symlink": [*GOOD, _special("b/link", tarfile.SYMTYPE, "/etc/passwd")],
    "symlink_then_write": [_special("b/d", tarfile.SYMTYPE, "/tmp"), _file("b/d/escaped.txt")],
    "hardlink": [*GOOD, _special("b/hl", tarfile.LNKTYPE, "/etc/passwd")],
    "chardev": [*GOOD, _special("b/null", tarfile.CHRTYPE)],
    "fifo": [*GOOD, _special("b/fifo", tarfile.FIFOTYPE)],
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_archive_refused_and_nothing_escapes(tmp_path, case):
    arc = _tar(tmp_path / f"{case}.tar.gz", MALICIOUS[case])
    work = tmp_path / "work"
    work.mkdir()
    before = set(tmp_path.rglob("*"))
    with pytest.raises(InputError) as e:
        Bundle.open(arc, workdir=work)
    msg = str(e.value)
    assert "\n" not in msg and arc.name in msg
    assert list(work.iterdir()) == []                       # the unpack folder is gone
    assert set(tmp_path.rglob("*")) == before                 # nothing new anywhere under tmp
    assert not Path("/tmp/stallscope-escaped-abs.txt").exists()
    assert not Path("/tmp/escaped.txt").exists()


def test_oversized_member_and_total_caps(tmp_path):
    big = _tar(tmp_path / "big.tar.gz", [*GOOD, _file("b/pcap/x.pcap", b"\0" * 200_000)])
    with pytest.raises(InputError, match="limit per file"):
        Bundle.open(big, workdir=tmp_path, max_member_bytes=100_000)
    many = _tar(tmp_path / "bomb.tar.gz", [*GOOD] + [_file(f"b/f{i}", b"\0" * 60_000) for i in range(5)])
    assert many.stat().st_size < 5_000          # highly compressible: a (small) bomb
    with pytest.raises(InputError, match="decompression bomb"):
        Bundle.open(many, workdir=tmp_path, max_total_bytes=200_000)
    assert [p.name for p in tmp_path.iterdir()] == ["big.tar.gz", "bomb.tar.gz"]


def test_member_count_cap(tmp_path):
    arc = _tar(tmp_path / "n.tar.gz", [*GOOD] + [_file(f"b/f{i}") for i in range(20)])
    with pytest.raises(InputError, match="archive members"):
        Bundle.open(arc, workdir=tmp_path, max_members=10)


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.999])
def test_truncated_gzip_is_one_line(tmp_path, cut):
    src = bundle_path("loss") if SCENARIOS else _tar(tmp_path / "s.tar.gz", [*GOOD, _file("b/x", os.urandom(50_000))])
    data = src.read_bytes()
    arc = tmp_path / "cut.tar.gz"
    arc.write_bytes(data[: int(len(data) * cut)])
    work = tmp_path / "w"
    work.mkdir()
    with pytest.raises(InputError) as e:
        Bundle.open(arc, workdir=work)
    assert "truncated" in str(e.value) and "\n" not in str(e.value)
    assert list(work.iterdir()) == []


def test_not_an_archive_and_missing(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"\x1f\x8bthis is not gzip at all" * 10)
    with pytest.raises(InputError):
        Bundle.open(junk, workdir=tmp_path)
    with pytest.raises(InputError, match="no such bundle"):
        Bundle.open(tmp_path / "nope.tar.gz")
    empty = tmp_path / "emptydir"
    empty.mkdir()
    with pytest.raises(InputError, match="not a stallscope bundle"):
        Bundle.open(empty)


def test_unpack_directly_rejects_duplicate_names(tmp_path):
    arc = _tar(tmp_path / "dup.tar.gz", [*GOOD, _file("b/x"), _file("b/x")])
    dest = tmp_path / "d"
    dest.mkdir()
    with pytest.raises(InputError, match="twice"):
        unpack_archive(arc, dest)


@pytest.mark.skipif(not SCENARIOS, reason="no shipped bundles")
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_shipped_bundle_loads(scenario, tmp_path):
    truth = json.loads((BUNDLES / scenario / "scenario.json").read_text())
    arc = bundle_path(scenario)
    assert arc.stat().st_size < 1_000_000
    with Bundle.open(arc, workdir=tmp_path) as b:
        m = b.manifest
        assert m.schema_version == 1 and m.host and len(m.clock_samples) >= 2
        assert m.started_ns <= truth["started_ns"] and truth["ended_ns"] <= m.ended_ns
        ranks = {p.pid: p.rank for p in m.processes if p.rank is not None}
        assert sorted(ranks.items()) == sorted((r["pid"], r["rank"]) for r in truth["ranks"])
        assert m.collectors["tracer"].status == "ok"
        ev = b.read_bpf_events()
        assert sum(e["ev"] == "comm_init" for e in ev) == truth["world_size"]
        assert b.pcaps(), b.problems
        # the tracer's own times land inside the capture once converted
        t = np.array([e["t"] for e in ev if e["ev"] in ("tracer_start", "tracer_end")], dtype=np.int64)
        utc = b.clock.to_utc(t)
        assert (utc >= m.started_ns - 1_000_000_000).all() and (utc <= m.ended_ns + 1_000_000_000).all()
    assert not any(tmp_path.iterdir())                        # closed: unpack folder removed


@pytest.mark.skipif(not SCENARIOS, reason="no shipped bundles")
def test_partly_broken_bundle_loads_with_problems(tmp_path):
    with Bundle.open(bundle_path("loss"), workdir=tmp_path) as b:
        folder = tmp_path / "copy"
        shutil.copytree(b.root, folder)
    # missing pcap, truncated events file (cut mid-line), failed collector, no clock samples
    pcap = sorted((folder / "pcap").iterdir())[0]
    pcap.unlink()
    ev = folder / "bpf" / "events.jsonl"
    data = ev.read_bytes()
    ev.write_bytes(data[: len(data) // 2 + 7])
    man = json.loads((folder / "manifest.json").read_text())
    man["clock_samples"] = []
    man["collectors"]["tracer"]["status"] = "failed"
    man["collectors"]["tracer"]["reason"] = "bpftrace killed"
    man["processes"][0]["pid"] = "not a pid"
    (folder / "manifest.json").write_text(json.dumps(man))
    b = Bundle.open(folder)                                   # a folder: used in place
    assert b.root == folder
    problems = "\n".join(b.problems)
    assert f"{pcap.relative_to(folder)}: listed in the manifest but missing" in problems
    assert "bpf/events.jsonl: " in problems and "truncated" in problems    # size differs from the manifest
    assert "collector tracer failed: bpftrace killed" in problems
    assert "no clock samples" in problems
    assert "processes[0] has no pid" in problems
    events = b.read_bpf_events()
    assert events and "unreadable line" in b.problems[-1]
    assert b.clock is not None and "approximated" in "\n".join(b.problems)   # fallback clock from tracer start
    b.close()
    assert folder.exists()                                    # never deletes a user's folder


def test_folder_bundle_does_not_follow_links(tmp_path):
    root = tmp_path / "b"
    (root / "bpf").mkdir(parents=True)
    (root / "manifest.json").write_text('{"schema_version": 1, "host": "h"}')
    secret = tmp_path / "secret.txt"
    secret.write_text('{"ev": "coll"}\n')
    (root / "bpf" / "events.jsonl").symlink_to(secret)
    b = Bundle.open(root)
    assert b.path("bpf/events.jsonl") is None and b.read_bpf_events() == []
    assert b.path("../secret.txt") is None


# --------------------------------------------------------------------------- clock

def test_clock_piecewise_linear_and_nearest_at_ends():
    base = 1_800_000_000_000_000_000
    # offset grows by 1000 ns over the first 10 s, then by 3000 ns over the next 10 s
    s = [ClockSample(10_000_000_000, base + 10_000_000_000),
         ClockSample(20_000_000_000, base + 20_000_001_000),
         ClockSample(30_000_000_000, base + 30_000_004_000)]
    c = ClockMap(list(reversed(s)))                            # order of samples does not matter
    mono = np.array([0, 10_000_000_000, 15_000_000_000, 20_000_000_000, 25_000_000_000, 40_000_000_000],
                    dtype=np.int64)
    got = c.to_utc(mono)
    want = np.array([base + 0, base + 10_000_000_000, base + 15_000_000_500, base + 20_000_001_000,
                     base + 25_000_002_500, base + 40_000_004_000], dtype=np.int64)
    assert got.dtype == np.int64 and (got == want).all()       # exact to the ns: no float64 epoch
    assert ClockMap([s[0]]).to_utc(np.array([5], dtype=np.int64))[0] == base + 5
    with pytest.raises(ValueError):
        ClockMap([])
