"""Hostile and broken bundles, end to end (issue 7, analyzer side).

tests/forensics/test_bundle.py covers the unpacker's rules one by one at the library level; here the
same inputs go through the command line (one line on stderr, exit code 2, no traceback), a
real decompression bomb is stopped early, folders and archives give the same tables, files
that are not regular files (FIFOs, devices, links) in an unpacked folder are never read
through, a partly broken bundle still gets an analysis that says what is missing, inputs
are never modified and outputs never overwritten without --force.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT
from forensics.inputs.bundle import Bundle
from forensics.cli import Env, main
from forensics.errors import InputError
from shipped import BUNDLES, shipped



def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(list(argv), Env(stdout=out, stderr=err, debug=False))
    return rc, out.getvalue(), err.getvalue()


@contextmanager
def time_limit(seconds: float):
    def boom(*_):
        raise TimeoutError(f"took over {seconds}s (blocked?)")
    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def tree_digest(path: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime of every file under path (or of path itself)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in files}


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for info, data in members:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    path.write_bytes(gzip.compress(buf.getvalue()))
    return path


def _member(name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, link: str = ""):
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, link
    ti.size = len(data) if kind == tarfile.REGTYPE else 0
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        ti.devmajor, ti.devminor = 1, 3
    return ti, data if kind == tarfile.REGTYPE else None


MANIFEST = _member("b/manifest.json", b'{"schema_version": 1, "host": "h", "clock_samples": []}')


def _broken_archives(tmp: Path) -> dict[str, Path]:
    good = shipped("loss").read_bytes()
    cases = {
        "truncated": good[: len(good) // 2],
        "cut_trailer": good[:-4],
        "bit_flip": good[:2000] + bytes([good[2000] ^ 0x40]) + good[2001:],
        "not_gzip": b"this is not a bundle\n" * 20,
        "empty": b"",
        "gzip_of_garbage": gzip.compress(os.urandom(3000)),
    }
    out = {k: tmp / f"stallscope-{k}-20260101T000000Z.tar.gz" for k in cases}
    for k, data in cases.items():
        out[k].write_bytes(data)
    hostile = {
        "dotdot": [MANIFEST, _member("b/../../../escaped.txt")],
        "absolute": [MANIFEST, _member("/tmp/stallscope-hardening-abs.txt")],
        "symlink": [MANIFEST, _member("b/bpf/events.jsonl", kind=tarfile.SYMTYPE, link="/etc/passwd")],
        "hardlink": [MANIFEST, _member("b/logs/x", kind=tarfile.LNKTYPE, link="/etc/passwd")],
        "chardev": [MANIFEST, _member("b/dev", kind=tarfile.CHRTYPE)],
        "fifo": [MANIFEST, _member("b/bpf/events.jsonl", kind=tarfile.FIFOTYPE)],
    }
    for k, members in hostile.items():
        out[k] = _tar(tmp / f"stallscope-{k}-20260101T000000Z.tar.gz", members)
    return out


def test_broken_and_hostile_archives_get_one_line_from_the_cli(tmp_path, monkeypatch):
    import tempfile
    unpack = tmp_path / "tmp"          # where Bundle.open unpacks (tempfile's folder)
    unpack.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(unpack))
    for case, arc in _broken_archives(tmp_path).items():
        rc, out, err = cli("query", str(arc), "select 1")
        lines = err.strip().splitlines()
        assert rc == 2, (case, rc, err)
        assert len(lines) == 1 and lines[0].startswith("stallscope: error: "), (case, err)
        assert arc.name in lines[0] and "Traceback" not in err and out == "", (case, err)
    assert not Path("/tmp/stallscope-hardening-abs.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()
    assert list(unpack.iterdir()) == [], "unpack folders left behind"


def test_cli_process_prints_no_traceback(tmp_path):
    """The real console entry point, in its own process, on a truncated archive."""
    arc = _broken_archives(tmp_path)["truncated"]
    p = subprocess.run([sys.executable, "-m", "forensics", "query", str(arc), "select 1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "truncated" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_gzip_bomb_is_stopped_before_it_is_unpacked(tmp_path):
    """256 MiB of zeros in a ~250 KiB archive: refused at the cap, after reading little more
    than the cap, and nothing stays on disk."""
    arc = tmp_path / "stallscope-bomb-20260101T000000Z.tar.gz"
    size = 256 << 20
    with gzip.open(arc, "wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w|") as t:
        man = b'{"schema_version": 1, "host": "h"}'
        ti = tarfile.TarInfo("b/manifest.json")
        ti.size = len(man)
        t.addfile(ti, io.BytesIO(man))
        ti = tarfile.TarInfo("b/pcap/bomb.pcap")
        ti.size = size

        class Zeros(io.RawIOBase):
            left = size

            def readable(self):
                return True

            def readinto(self, b):
                n = min(len(b), self.left)
                b[:n] = bytes(n)
                self.left -= n
                return n
        t.addfile(ti, io.BufferedReader(Zeros(), 1 << 20))
    assert arc.stat().st_size < size // 500
    work = tmp_path / "work"
    work.mkdir()
    t0 = time.monotonic()
    with pytest.raises(InputError, match="limit per file") as e:
        Bundle.open(arc, workdir=work, max_member_bytes=8 << 20)
    assert "\n" not in str(e.value)
    assert time.monotonic() - t0 < 5
    assert list(work.iterdir()) == []
    with pytest.raises(InputError, match="decompression bomb"):
        Bundle.open(arc, workdir=work, max_total_bytes=16 << 20)
    assert list(work.iterdir()) == []


def _unpack(arc: Path, dest: Path) -> Path:
    dest.mkdir()
    with tarfile.open(arc) as t:        # our own shipped fixture: trusted
        t.extractall(dest, filter="data")
    return next(dest.iterdir())


TABLE_COUNTS = ("select (select count(*) from nccl_events), (select count(*) from tcp_events), "
                "(select count(*) from packets), (select count(*) from flows), (select count(*) from problems)")


def test_a_folder_gives_the_same_tables_as_its_archive(tmp_path):
    arc = shipped("loss")
    folder = _unpack(arc, tmp_path / "u")
    rc1, from_arc, _ = cli("query", str(arc), TABLE_COUNTS, "--csv")
    rc2, from_dir, _ = cli("query", str(folder), TABLE_COUNTS, "--csv")
    assert rc1 == rc2 == 0
    assert from_arc == from_dir and int(from_arc.splitlines()[1].split(",")[0]) > 0


def test_fifos_devices_and_links_in_a_folder_are_never_read(tmp_path):
    """An unpacked folder is untrusted too: a FIFO where events.jsonl or a log should be
    would block a reader forever; a link would read a file outside the bundle."""
    from forensics.execution.host_reading import read_model
    from forensics.parsers import parse_tree
    folder = _unpack(shipped("loss"), tmp_path / "u")
    secret = tmp_path / "secret.log"
    secret.write_text("NCCL INFO secret outside the bundle\n")
    (folder / "bpf" / "events.jsonl").unlink()
    os.mkfifo(folder / "bpf" / "events.jsonl")
    (folder / "logs").mkdir(exist_ok=True)
    os.mkfifo(folder / "logs" / "nccl-fifo.log")
    (folder / "logs" / "nccl-link.log").symlink_to(secret)
    (folder / "ib").mkdir(exist_ok=True)
    os.mkfifo(folder / "ib" / "perfquery-mlx5_0-1.txt")
    with time_limit(60):
        results = parse_tree(folder)
        m = read_model([folder], skew=False)
    warned = "\n".join(w for r in results for w in r.warnings)
    assert "nccl-fifo.log: not a regular file" in warned and "nccl-link.log: symbolic link, skipped" in warned
    assert not any("secret outside" in str(df.to_dict()) for r in results for df in r.tables.values())
    assert any("bpf/events.jsonl" in p and "missing" in p for p in m.problems), m.problems


# --------------------------------------------------------------------------- a partly broken bundle

@pytest.fixture
def broken_bundle(tmp_path) -> tuple[Path, dict]:
    """The loss bundle with a pcap gone, events cut mid-line, a failed collector and no
    clock samples."""
    folder = _unpack(shipped("loss"), tmp_path / "u")
    man = json.loads((folder / "manifest.json").read_text())
    gone = sorted((folder / "pcap").glob("*.pcap"))[0]
    gone.unlink()
    ev = folder / "bpf" / "events.jsonl"
    data = ev.read_bytes()
    ev.write_bytes(data[: len(data) * 2 // 3 + 11])
    man["clock_samples"] = []
    failed = next(k for k in man["collectors"] if k.startswith("ss"))
    man["collectors"][failed].update(status="failed", reason="ss: exit code 1")
    (folder / "manifest.json").write_text(json.dumps(man))
    return folder, {"pcap": gone.relative_to(folder).as_posix(), "collector": failed, "manifest": man}


def test_partly_broken_bundle_still_gets_an_analysis_that_says_what_is_missing(broken_bundle):
    from forensics.analysis import analyze
    folder, what = broken_bundle
    a = analyze([folder])
    try:
        problems = "\n".join(a.problems)
        assert f"{what['pcap']}: listed in the manifest but missing from the bundle" in problems
        assert "bpf/events.jsonl: " in problems and "unreadable line(s) skipped" in problems
        assert f"collector {what['collector']} failed: ss: exit code 1" in problems
        # the clock: how the tracer's times were placed, and within what error
        clock = [p for p in a.problems if "clock: no clock samples" in p]
        assert len(clock) == 1 and "error up to +" in clock[0] and " s (" in clock[0], a.problems
        bound = float(clock[0].split("error up to +")[1].split(" s")[0])
        m = what["manifest"]
        assert 0 <= bound <= (m["ended_ns"] - m["started_ns"]) / 1e9
        # the capture summary carries the same, per host, for the report's capture section
        cap = a.model.captures[0]
        assert cap["clock_samples"] == 0 and any(what["pcap"] in p for p in cap["problems"])
        assert {c["name"]: c["status"] for c in cap["collectors"]}[what["collector"]] == "failed"
        # and the analysis still ran: calls on the UTC timeline inside the capture
        nccl = a.model["nccl_events"]
        assert len(nccl) > 0
        ts = nccl["timestamp_ns"].dropna().astype("int64")
        assert ts.min() >= m["started_ns"] - 10 ** 9 and ts.max() <= m["ended_ns"] + 10 ** 9
        assert isinstance(a.verdict(), str) and json.dumps(a.to_json(), default=str)
    finally:
        a.close()


def test_shipped_tracer_events_all_pass_the_field_checks(tmp_path):
    """The type checks that keep corrupt events from the model drop nothing real."""
    for arc in sorted(BUNDLES.glob("*/*.tar.gz")):
        with Bundle.open(arc, workdir=tmp_path) as b:
            lines = [ln for ln in b.path("bpf/events.jsonl").read_bytes().splitlines() if ln.strip()]
            events = b.read_bpf_events()
            assert len(events) == len(lines), [p for p in b.problems if "events.jsonl" in p]


# --------------------------------------------------------------------------- inputs and outputs

def test_inputs_are_never_modified(tmp_path):
    arc = shipped("loss")
    folder = _unpack(arc, tmp_path / "u")
    before = {**tree_digest(arc), **tree_digest(folder)}
    from forensics.analysis import analyze
    for src in (arc, folder):
        a = analyze([src])
        a.close()
        assert cli("query", str(src), "select count(*) from nccl_events")[0] == 0
    pcap = sorted((folder / "pcap").glob("*.pcap"))[0]
    assert cli("tcp", str(pcap), "--flows")[0] in (0, 2)
    assert {**tree_digest(arc), **tree_digest(folder)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u"]


def test_outputs_are_never_overwritten_without_force(tmp_path):
    arc = shipped("loss")
    pcap = next(p for p in (FIXTURES / "pcaps" / "crafted").glob("*.pcap"))
    csv = tmp_path / "out.csv"
    csv.write_text("keep me\n")
    rc, _, err = cli("tcp", str(pcap), "--csv", str(csv))
    assert rc == 2 and "already exists" in err and csv.read_text() == "keep me\n"
    rc, _, _ = cli("tcp", str(pcap), "--csv", str(csv), "--force")
    assert rc == 0 and csv.read_text().startswith("frame,")
    db = tmp_path / "events.duckdb"
    db.write_bytes(b"not mine to overwrite")
    rc, _, err = cli("query", "--db", str(db), str(arc), "select 1")
    assert rc == 2 and "never overwrites" in err and db.read_bytes() == b"not mine to overwrite"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.duckdb", "out.csv"]


def test_analyze_outputs_are_never_overwritten_without_force(tmp_path):
    try:
        import forensics.report  # noqa: F401
    except ImportError:
        pytest.skip("forensics.report (the analyze renderers) is not there yet")
    arc = shipped("loss")
    for flag, name in (("-o", "report.html"), ("--json", "f.json"), ("--markdown", "s.md"), ("--db", "e.duckdb")):
        existing = tmp_path / name
        existing.write_text("keep me")
        args = ["analyze", str(arc), "-q", flag, str(existing)]
        if flag != "-o":
            args += ["-o", str(tmp_path / "other.html")]
        rc, _, err = cli(*args)
        assert rc == 2 and "already exists" in err and existing.read_text() == "keep me", (flag, err)
        assert not (tmp_path / "other.html").exists()


def test_manifest_text_cannot_forge_output_lines(tmp_path):
    """Host, collector names, reasons and file paths come from the (untrusted) manifest: a
    newline in them must not start a line of its own in stallscope's output."""
    root = tmp_path / "stallscope-h-20260101T000000Z"
    (root / "bpf").mkdir(parents=True)
    (root / "manifest.json").write_bytes((FIXTURES / "fuzz" / "manifest" / "newlines_in_names.json").read_bytes())
    rc, out, err = cli("query", str(root), "select 1")
    assert rc == 0 and out.strip().endswith("(1 row)")
    lines = err.splitlines()
    assert len(lines) >= 3 and all(ln.startswith("stallscope: warning: ") for ln in lines), err
    assert not any(ln.startswith("stallscope: error: forged") or ln.startswith("forged") for ln in lines)


def test_a_damaged_pcap_in_one_of_two_hosts_does_not_stop_the_analysis(tmp_path):
    """One host's unreadable capture is a problem line, for one bundle or several (the
    clock-skew pass across hosts reads every pcap too)."""
    a = _unpack(shipped("loss"), tmp_path / "a")
    b = _unpack(shipped("clean"), tmp_path / "b")
    bad = sorted((a / "pcap").glob("*.pcap"))[0]
    bad.write_bytes(b"garbage, not a capture\n")
    rc, out, err = cli("query", str(a), str(b), "select count(*) from nccl_events", "--csv")
    assert rc == 0, err
    assert int(out.splitlines()[1]) > 0
    assert f"{bad.relative_to(a).as_posix()}: unreadable capture" in err
