"""What analyze takes: bundles, loose files, folders and archives of them, mixed; hostile inputs."""
from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import FIXTURES
from forensics.inputs.archive import Budget
from forensics.errors import InputError
from forensics.inputs.intake import gather
from shipped import shipped
from test_hardening import cli, time_limit

WATCHDOG = (FIXTURES / "parsers" / "torch_watchdog" / "watchdog.log").read_bytes()
WARN = (FIXTURES / "parsers" / "nccl_debug" / "nccl_debug_warn.log").read_bytes()


def test_special_files_given_are_refused_with_one_line_and_never_read(tmp_path):
    fifo = tmp_path / "some.fifo"
    os.mkfifo(fifo)
    with time_limit(30):
        for path, what in (("/dev/zero", "a device"), (str(fifo), "a FIFO")):
            rc, out, err = cli("analyze", path, "-o", str(tmp_path / "r.html"))
            lines = err.strip().splitlines()
            assert rc == 2 and len(lines) == 1 and what in lines[0] and path in lines[0], err
    assert not (tmp_path / "r.html").exists()


def test_a_folder_is_walked_links_followed_once_loops_ended_specials_listed(tmp_path):
    root = tmp_path / "job"
    (root / "rank0").mkdir(parents=True)
    (root / "rank0" / "stderr.log").write_bytes(WATCHDOG)
    (root / "rank0" / "again.log").symlink_to(root / "rank0" / "stderr.log")
    (root / "rank0" / "loop").symlink_to(root)
    (root / "rank0" / "nowhere").symlink_to(tmp_path / "missing")
    os.mkfifo(root / "pipe")
    (root / "empty.log").write_bytes(b"")
    with time_limit(30), gather([root]) as intake:
        assert intake.bundles == []
        files = [f.rel for f in intake.loose.files]
        not_read = {n.rel.rsplit("/", 1)[-1]: n.reason for n in intake.loose.not_read}
    assert files == [f"{root}/rank0/again.log"] or files == [f"{root}/rank0/stderr.log"]
    assert "FIFO" in not_read["pipe"] and "loop" in not_read["loop"] and "nothing" in not_read["nowhere"]
    assert "empty" in not_read["empty.log"]
    assert any("the same file" in r for r in not_read.values())


def test_bundles_inside_a_folder_and_loose_files_beside_them(tmp_path):
    import shutil
    bundle = shipped("reset")
    inc = tmp_path / "incident"
    inc.mkdir()
    shutil.copy(bundle, inc / bundle.name)
    (inc / "job.log").write_bytes(WARN)
    (inc / "notes.txt").write_text("the job hung around 3 am; restarted at 4\n")
    with gather([inc]) as intake:
        assert intake.bundles == [str(inc / bundle.name)]
        assert [Path(f.rel).name for f in intake.loose.files] == ["job.log", "notes.txt"]
        assert intake.describe() == "1 bundle(s) and 2 loose file(s)"
    rc, out, err = cli("analyze", str(inc), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "f.json"), "-q")
    assert rc in (0, 1), err
    caps = json.loads((tmp_path / "f.json").read_text())["capture"]["hosts"]
    loose = [c for c in caps if c.get("kind") == "loose"]
    assert len(caps) == 2 and len(loose) == 1
    assert [Path(f["path"]).name for f in loose[0]["files_read"]] == ["job.log"]
    (nr,) = loose[0]["not_read"]
    assert nr["path"].endswith("notes.txt") and "no parser recognises" in nr["reason"]
    html = (tmp_path / "r.html").read_text()
    assert "notes.txt" in html and "not read: no parser recognises" in html


def test_a_folder_with_another_tools_manifest_is_walked_not_read_as_a_bundle(tmp_path):
    """A run folder whose manifest.json is its own metadata, beside the job's log: the log is
    read; a folder with stallscope's manifest is still a bundle."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text('{"run": 1, "config": {"lr": 0.1}}\n')
    (run / "job.log").write_bytes(WARN)
    with gather([run]) as intake:
        assert intake.bundles == [] and [Path(f.rel).name for f in intake.loose.files] == ["job.log", "manifest.json"]
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "manifest.json").write_text('{"schema_version": 3, "collectors": {}}\n')
    with gather([ours]) as intake:
        assert intake.bundles == [str(ours)]


def _zip(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members:
            z.writestr(name, data)
    return path


def test_archives_of_logs_are_unpacked_nested_and_cleaned_up(tmp_path):
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("node1/nccl.log", WARN)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in (("logs/watchdog.log", WATCHDOG), ("logs/per-node.zip", inner.getvalue())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    arc = tmp_path / "logs.tar.gz"
    arc.write_bytes(buf.getvalue())
    gz = tmp_path / "train.log.gz"
    gz.write_bytes(gzip.compress(WATCHDOG))
    work = tmp_path / "work"
    work.mkdir()
    with gather([arc, gz], workdir=work) as intake:
        names = sorted(f.rel for f in intake.loose.files)
        assert names == [f"{arc}:logs/per-node.zip:node1/nccl.log", f"{arc}:logs/watchdog.log", f"{gz}:train.log"]
        assert all(Path(f.path).is_file() for f in intake.loose.files)
    assert list(work.iterdir()) == [], "unpacked files left behind"
    rc, out, err = cli("analyze", str(arc), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "f.json"), "-q")
    assert rc == 1, err                              # the watchdog timeouts are a hang
    doc = json.loads((tmp_path / "f.json").read_text())
    assert any(f["kind"] in ("hang_stuck", "hang_mismatch") for f in doc["findings"])


def test_a_zip_bomb_is_cut_said_and_the_rest_read(tmp_path, monkeypatch):
    bomb = _zip(tmp_path / "evidence.zip", [("big.log", b"\0" * (48 << 20)), ("rank1.log", WATCHDOG)])
    assert bomb.stat().st_size < (1 << 20)
    monkeypatch.setenv("STALLSCOPE_UNPACK_BYTES", "4M")
    with gather([bomb]) as intake:
        notes = {n.rel.rsplit(":", 1)[-1]: n.reason for n in intake.loose.not_read}
        sizes = {Path(f.rel).name.split(":")[-1]: f.size for f in intake.loose.files}
    assert "cut after" in notes["big.log"] and "decompression bomb" in notes["big.log"]
    assert sizes["big.log"] <= 2 << 20 and sizes["rank1.log"] == len(WATCHDOG)
    rc, out, err = cli("analyze", str(bomb), "-o", str(tmp_path / "r.html"), "-q")
    assert rc == 1, err


def test_hostile_members_never_land_outside_and_links_are_not_made(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, kind, data in (("../escaped.log", tarfile.REGTYPE, WATCHDOG), ("/abs.log", tarfile.REGTYPE, WATCHDOG),
                                 ("link.log", tarfile.SYMTYPE, None), ("ok.log", tarfile.REGTYPE, WARN),
                                 ("dev", tarfile.CHRTYPE, None)):
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            if data is not None:
                info.size = len(data)
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    arc = tmp_path / "logs.tar"
    arc.write_bytes(buf.getvalue())
    work = tmp_path / "work"
    work.mkdir()
    with gather([arc], workdir=work) as intake:
        assert [Path(f.rel).name for f in intake.loose.files] == ["logs.tar:ok.log"]
        reasons = " | ".join(n.reason for n in intake.loose.not_read)
        for what in ("climbs out", "absolute", "symbolic link", "device node"):
            assert what in reasons, reasons
        assert not any(p.is_symlink() for p in work.rglob("*"))
    assert not (tmp_path / "escaped.log").exists() and not Path("/abs.log").exists()
    assert list(work.iterdir()) == []


def test_nothing_readable_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "a.txt").write_text("hello\n")
    (tmp_path / "b.bin").write_bytes(bytes(range(256)) * 16)     # binary however it is sniffed (NULs, controls)
    rc, out, err = cli("analyze", str(tmp_path / "a.txt"), str(tmp_path / "b.bin"), "-o", str(tmp_path / "r.html"))
    lines = err.strip().splitlines()
    assert rc == 2 and lines[-1].startswith("stallscope: error: nothing stallscope can read"), err
    assert "a.txt" in lines[-1] and "b.bin" in lines[-1] and "binary" in lines[-1]
    assert not (tmp_path / "r.html").exists()
    corrupt = tmp_path / "logs.tar.gz"
    corrupt.write_bytes(b"\x1f\x8b" + os.urandom(100))
    rc, out, err = cli("analyze", str(corrupt), "-o", str(tmp_path / "r.html"))
    assert rc == 2 and "logs.tar.gz" in err and len(err.strip().splitlines()) == 1, err


def test_inputs_are_never_modified(tmp_path):
    import hashlib
    f = tmp_path / "job.log"
    f.write_bytes(WATCHDOG + WARN)
    z = _zip(tmp_path / "more.zip", [("x/y.log", WARN)])
    before = {p: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in (f, z)}
    rc, *_ = cli("analyze", str(f), str(z), "-o", str(tmp_path / "r.html"), "-q")
    assert rc in (0, 1)
    assert before == {p: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in (f, z)}


def test_budget_parsing_and_bad_value():
    with pytest.raises(InputError, match="not a size"):
        os.environ["STALLSCOPE_UNPACK_BYTES"] = "lots"
        try:
            gather([str(FIXTURES / "parsers" / "torch_watchdog" / "watchdog.log")])
        finally:
            del os.environ["STALLSCOPE_UNPACK_BYTES"]
    assert Budget.of(8 << 20).member_cap == 4 << 20


def test_loose_files_split_over_jobs_give_the_same_analysis(tmp_path, monkeypatch):
    """--jobs 2 reads the loose files in two shares (two processes); merged back, the tables
    and findings equal one process's."""
    import forensics.inputs.intake as intake_mod
    from forensics.analysis import analyze
    from forensics.execution import Execution
    monkeypatch.setattr(intake_mod, "SPLIT_MIN_BYTES", 0)
    sample = FIXTURES / "logs" / "21-debug-file-ib-retry-exc"
    with gather([sample]) as intake:
        assert [s.parts for s in intake.sources(2) if not isinstance(s, str)] == [2, 2]

    def run(jobs):
        a = analyze([sample], execution=Execution(jobs=jobs))
        try:
            doc = a.to_json()
            tables = {k: a.model.tables[k].sort_values(list(a.model.tables[k].columns)[:3], kind="stable")
                      .reset_index(drop=True) for k in ("nccl_warnings", "nccl_config")}
            return doc, tables
        finally:
            a.close()
    one, t1 = run(1)
    two, t2 = run(2)
    assert json.dumps(one["findings"], sort_keys=True) == json.dumps(two["findings"], sort_keys=True)
    for k in t1:
        assert t1[k].astype(str).equals(t2[k].astype(str)), k
    (c1,), (c2,) = one["capture"]["hosts"], two["capture"]["hosts"]
    assert sorted(f["path"] for f in c1["files_read"]) == sorted(f["path"] for f in c2["files_read"])
