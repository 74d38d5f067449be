"""Job detection without the tracer's symbols (capture/procs.py) and the NCCL version read
from the library itself (capture/libversion.py), on real processes: children that load the
lab's libnccl, a copy of it, a libnccl whose NCCL API is hidden, or nothing but NCCL_*
variables; one inside its own mount namespace (``unshare -rm``). No root needed."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from capture import elf, libversion, procs
from capture import jobs as jobs_mod
from capture.options import CaptureOptions
from capture.tracer import program


HIDDEN_SRC = r"""
/* a libnccl whose NCCL API is not exported (as NCCL linked with hidden visibility) */
__attribute__((visibility("hidden"))) int ncclAllReduce(void) { return 0; }
static const char version[] __attribute__((used)) = "NCCL version 2.32.3+cuda13.0";
int lab_hidden_marker(void) { return ncclAllReduce(); }
"""
PLUGIN_SRC = "int ncclNetPlugin_v8_marker(void) { return 8; }\n"


def _gcc(src: str, out: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    c = out.with_suffix(".c")
    c.write_text(src)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(c)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    """The lab's libnccl built fresh (it embeds NCCL's version literal), a copy of it under a
    path of its own, a hidden-API libnccl and an NCCL network plugin."""
    build = tmp_path_factory.mktemp("labbuild")
    p = subprocess.run(["make", "-s", "-C", str(ROOT / "tests" / "lab"), "all", f"BUILD={build}"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        pytest.skip(f"the lab's libnccl could not be built: {p.stderr[-300:]}")
    other = tmp_path_factory.mktemp("venv-copy") / "libnccl.so.2"
    shutil.copy2(build / "libnccl.so.2", other)
    shutil.copy2(build / "libcudart.so.12", other.parent / "libcudart.so.12")
    hidden_dir = tmp_path_factory.mktemp("hidden")
    return {"lab": build / "libnccl.so.2", "copy": other, "hidden": _gcc(HIDDEN_SRC, hidden_dir / "libnccl.so.2"),
            "plugin": _gcc(PLUGIN_SRC, hidden_dir / "libnccl-net.so")}


LOADER = ("import ctypes, sys, time\n"
          "for p in sys.argv[1:]: ctypes.CDLL(p)\n"
          "print('ready', flush=True); time.sleep(60)\n")


class Child:
    """A python process that loads the given libraries, then sleeps (killed on exit)."""

    def __init__(self, *paths, env=None, argv=None):
        self.p = subprocess.Popen(argv or [sys.executable, "-c", LOADER, *map(str, paths)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env)
        line = self.p.stdout.readline()
        if line != b"ready\n":
            self.p.kill()
            err = self.p.communicate(timeout=10)[1].decode(errors="replace")
            pytest.fail(f"child did not start: {line!r} {err[-500:]}")
        self.pid = self.p.pid

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.p.kill()
        self.p.wait()


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}


def _inspect(pid):
    return procs.inspect(pid, program.NCCL_SYMBOLS, by_env=True)


# ---------------------------------------------------------------- the version in the library
def test_the_lab_library_carries_nccl_version_literal_and_it_is_read(libs):
    assert libversion.nccl_version(libs["lab"]) == "2.21.5+cuda12.4"
    assert libversion.nccl_version(libs["hidden"]) == "2.32.3+cuda13.0"
    assert libversion.nccl_version(libs["plugin"]) is None
    assert libversion.nccl_version(libs["lab"].parent / "libcudart.so.12") is None
    assert libversion.nccl_version(libs["lab"].parent / "no-such-file.so") is None


def test_only_read_only_data_is_scanned_when_the_sections_are_known(libs):
    ranges = libversion.data_ranges(libs["lab"])
    rodata = [s for s in elf.sections(libs["lab"]) if s.name == ".rodata"]
    assert ranges == [(rodata[0].offset, rodata[0].size)]
    assert sum(n for _, n in ranges) < os.path.getsize(libs["lab"]) / 4


def test_chunked_scan_finds_a_string_across_a_chunk_boundary_and_bounds_headerless_files(tmp_path):
    """No ELF section headers: the whole file, up to the bound; the literal placed across a
    chunk boundary is found whole (not cut at the boundary), and one beyond the bound is not read."""
    f = tmp_path / "blob"
    lit = b"\0NCCL version 2.19.3+cuda12.2\0"
    chunk = 4096
    at = 3 * chunk - 10                        # straddles the third boundary
    f.write_bytes(b"\x01" * at + lit + b"\x02" * (5 * chunk))
    m = libversion.scan(f, libversion.VERSION_RE, libversion.data_ranges(f), chunk=chunk, overlap=64)
    assert m is not None and m.group(1) == b"2.19.3+cuda12.2"
    ends_at_boundary = tmp_path / "edge"       # the chunk ends inside the suffix: the next one extends it
    ends_at_boundary.write_bytes(b"\x01" * (chunk - 20) + lit + b"\x02" * chunk)
    m = libversion.scan(ends_at_boundary, libversion.VERSION_RE, [(0, os.path.getsize(ends_at_boundary))],
                        chunk=chunk, overlap=64)
    assert m.group(1) == b"2.19.3+cuda12.2"
    assert libversion.data_ranges(f, limit=at) == [(0, at)]
    assert libversion.scan(f, libversion.VERSION_RE, [(0, at)], chunk=chunk, overlap=64) is None
    rccl = tmp_path / "rccl"
    rccl.write_bytes(b"x\0RCCL version : 2.18.3-abc\0")
    assert libversion.nccl_version(rccl) == "2.18.3-abc"


def test_version_matches_what_the_log_parser_keeps(libs):
    """The library's literal is the log's ``NCCL version`` line: both give the same string, so a
    process whose version comes from its library compares equal with one whose log states it."""
    from forensics.parsers.nccl_grammar import VERSION_RE
    raw = [s for s in re.findall(rb"NCCL version [!-~]+", libs["lab"].read_bytes())]
    assert raw, "no version literal in the lab library"
    assert VERSION_RE.search(raw[0].decode())["version"] == libversion.nccl_version(libs["lab"])


# ---------------------------------------------------------------- jobs
def test_a_libnccl_without_the_probed_api_is_a_job_marked_untraceable(libs):
    with Child(libs["hidden"], env=_plain_env()) as c:
        info = _inspect(c.pid)
        assert info is not None, "a process mapping a libnccl must be a job whatever it exports"
        assert info.nccl_libs == [] and not info.traceable
        [lib] = info.untraced_nccl_libs
        assert lib.path == str(libs["hidden"]) and lib.traceable is False and lib.symbols == set()
        assert info.job_reasons == ["libnccl"] and info.nccl_version == "2.32.3+cuda13.0"
        m = info.to_manifest()
        assert m["libnccl"] == [str(libs["hidden"])] == m["libnccl_untraced"]
        assert m["nccl_version"] == "2.32.3+cuda13.0"


def test_the_lab_library_is_traceable_with_its_version(libs):
    with Child(libs["lab"], env=_plain_env()) as c:
        info = _inspect(c.pid)
        assert info.traceable and info.untraced_nccl_libs == []
        [lib] = info.nccl_libs
        assert lib.symbols == set(program.NCCL_SYMBOLS) & set(elf.exported_functions(libs["lab"]))
        assert lib.kind == "nccl" and lib.version == "2.21.5+cuda12.4"
        assert [l.path for l in info.cudart_libs] == [str(libs["lab"].parent / "libcudart.so.12")]
        m = info.to_manifest()
        assert m["libnccl"] == [str(libs["lab"])] and m["libnccl_untraced"] == []
        assert m["nccl_version"] == "2.21.5+cuda12.4" and m["job_reasons"] == ["libnccl"]


def test_an_nccl_plugin_alone_makes_a_job_but_is_no_library_to_trace(libs):
    with Child(libs["plugin"], env=_plain_env()) as c:
        info = _inspect(c.pid)
        assert info is not None and info.job_reasons == ["nccl-plugin"]
        assert info.nccl_libs == [] and info.untraced_nccl_libs == [] and info.nccl_version is None
        assert procs.libraries([info]) == {}


def test_nccl_variables_alone_make_a_job_except_for_the_captures_own_children(libs):
    """A process with NCCL_* in its environment and no libnccl (NCCL linked statically, hidden)
    is a job; the same process started by the capture (here: this test) is one of the
    capture's own helpers and is not, unless it maps NCCL."""
    env = dict(_plain_env(), NCCL_SOCKET_IFNAME="lo")
    with Child(env=env) as own:
        info = _inspect(own.pid)
        assert info.job_reasons == ["nccl-env"] and info.env["NCCL_SOCKET_IFNAME"] == "lo"
        assert procs.inspect(own.pid, program.NCCL_SYMBOLS) is None            # not asked: not a job
        assert own.pid not in [i.pid for i in procs.discover(program.NCCL_SYMBOLS, by_env=True)]
    # not ours: started through a shell that exits (reparented away from this process)
    script = f"{sys.executable} -c 'import time; time.sleep(60)' >/dev/null 2>&1 & echo $!"
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=10).stdout
    orphan = int(out.strip())
    try:
        assert not procs.descends_from(orphan, os.getpid())
        cache: dict = {}
        found = {i.pid: i for i in procs.discover(program.NCCL_SYMBOLS, not_nccl=cache, by_env=True)}
        assert found[orphan].job_reasons == ["nccl-env"] and orphan not in cache
        assert orphan not in {i.pid for i in procs.discover(program.NCCL_SYMBOLS)}     # by_env off (default)
    finally:
        os.kill(orphan, 9)


def test_the_captures_own_tracer_mapping_nccl_is_no_job(libs):
    """bpftrace maps the libraries it probes: the capture's tracer (``Jobs.tools``, where the
    tracer collector puts the pid it starts) is no job to a rescan, while the same process is
    one to a capture that did not start it (a watcher followed its own tracer as an NCCL
    process of a job of its own)."""
    with Child(libs["lab"], env=_plain_env()) as tool:
        ours = jobs_mod.Jobs(CaptureOptions(output="unused"))
        ours.tools.add(tool.pid)
        assert tool.pid not in {i.pid for i in ours.discover(program.NCCL_SYMBOLS)}
        assert tool.pid not in ours.procs
        theirs = jobs_mod.Jobs(CaptureOptions(output="unused"))
        assert tool.pid in {i.pid for i in theirs.discover(program.NCCL_SYMBOLS)}


def test_a_process_with_neither_is_no_job(libs):
    with Child(env=_plain_env()) as c:
        assert _inspect(c.pid) is None


# ---------------------------------------------------------------- the library files in use
def test_libraries_are_keyed_by_the_mapped_file_not_its_path(libs, tmp_path):
    """Two processes mapping the same file under two names (a hard link) share one entry; a
    copy is another file; a libnccl without the probed API is listed, untraceable."""
    link = tmp_path / "libnccl.so.2"
    os.link(libs["lab"], link)
    os.link(libs["lab"].parent / "libcudart.so.12", tmp_path / "libcudart.so.12")      # its $ORIGIN runpath
    env = _plain_env()
    with Child(libs["lab"], env=env) as a, Child(link, env=env) as b, Child(libs["copy"], env=env) as c, \
            Child(libs["hidden"], env=env) as d:
        found = procs.libraries_in_use(program.NCCL_SYMBOLS, pids=[a.pid, b.pid, c.pid, d.pid])
        st = os.stat(libs["lab"])
        lab = found[(st.st_dev, st.st_ino)]
        assert lab.kind == "nccl" and lab.traceable and lab.version == "2.21.5+cuda12.4"
        assert set(lab.users) == {a.pid, b.pid} and lab.paths == {str(libs["lab"]), str(link)}
        cst = os.stat(libs["copy"])
        assert set(found[(cst.st_dev, cst.st_ino)].users) == {c.pid}
        hst = os.stat(libs["hidden"])
        hidden = found[(hst.st_dev, hst.st_ino)]
        assert not hidden.traceable and hidden.version == "2.32.3+cuda13.0" and hidden.kind == "nccl"
        kinds = sorted(l.kind for l in found.values())
        assert kinds == ["cudart", "cudart", "nccl", "nccl", "nccl"]     # the lab's and the copy's runtime
        # the same from the records a watcher keeps
        recs = [_inspect(p) for p in (a.pid, b.pid, c.pid, d.pid)]
        assert {k: set(v.users) for k, v in procs.libraries(recs).items()} == \
            {k: set(v.users) for k, v in found.items()}
        assert lab.host_path() in (str(libs["lab"]), str(link))
    assert lab.host_path() is None                         # its processes are gone


def test_a_job_in_its_own_mount_namespace_is_seen_through_its_root(libs, tmp_path):
    """A container's libnccl: mapped under a path that exists only in the process's mount
    namespace (a tmpfs mounted there alone). The job is found, its library opened through
    /proc/PID/root, its version read, and the file keyed as the kernel names it."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    only_there = tmp_path / "only-there"
    only_there.mkdir()
    lib_in_ns = only_there / "usr-lib" / "libnccl.so.2"
    script = (f"mount -t tmpfs none {only_there} && mkdir {lib_in_ns.parent} && "
              f"cp {libs['lab']} {libs['lab'].parent / 'libcudart.so.12'} {lib_in_ns.parent}/ && "
              f"exec {sys.executable} -c \"$0\" {lib_in_ns}")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"unshare -rm not permitted here: {probe.stderr.decode(errors='replace').strip()}")
    with Child(argv=["unshare", "-rm", "sh", "-c", script, LOADER], env=_plain_env()) as c:
        assert not lib_in_ns.exists()                       # not in our namespace
        info = _inspect(c.pid)
        assert info is not None and info.traceable
        [lib] = info.nccl_libs
        assert lib.path == str(lib_in_ns) and lib.host_path == f"/proc/{c.pid}/root{lib_in_ns}"
        assert lib.version == "2.21.5+cuda12.4"
        assert lib.symbols == set(program.NCCL_SYMBOLS) & set(elf.exported_functions(libs["lab"]))
        [shared] = [s for s in procs.libraries([info]).values() if s.kind == "nccl"]
        st = os.stat(lib.host_path)
        assert shared.key == (lib.dev, st.st_ino) and shared.host_path() == lib.host_path
        assert info.to_manifest()["libnccl"] == [str(lib_in_ns)]


def test_mappings_name_the_device_and_inode_of_each_file(libs):
    with Child(libs["lab"], env=_plain_env()) as c:
        rows = {path: (dev, ino) for path, dev, ino in procs.mappings(c.pid)}
        st = os.stat(libs["lab"])
        assert rows[str(libs["lab"])] == (st.st_dev, st.st_ino)
        assert (str(libs["lab"]), st.st_ino) in procs.mapped_files(c.pid)


def test_discover_keeps_a_rescan_cheap_for_processes_that_are_no_job(libs, monkeypatch):
    """The not_nccl cache still applies with the new rules: a process that is no job is not
    inspected again while it does not change."""
    seen = []
    real = procs.inspect
    monkeypatch.setattr(procs, "inspect", lambda pid, *a, **k: seen.append(pid) or real(pid, *a, **k))
    with Child(env=_plain_env()) as c:
        cache: dict = {}
        procs.discover(program.NCCL_SYMBOLS, not_nccl=cache, by_env=True)
        assert c.pid in cache
        time.sleep(0.05)
        procs.discover(program.NCCL_SYMBOLS, not_nccl=cache, by_env=True)
        assert seen.count(c.pid) == 1


def test_refresh_shows_the_libnccl_of_a_job_found_by_its_variables_before_it_loaded_it(libs):
    """A Python job is found by its NCCL_* variables at start-up, before ``import torch`` maps
    libnccl; a watcher that keeps the record sees the library once it is mapped."""
    script = ("import ctypes, sys\n"
              "print('ready', flush=True); sys.stdin.readline()\n"
              f"ctypes.CDLL({str(libs['lab'])!r}); print('loaded', flush=True); sys.stdin.readline()\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=dict(_plain_env(), NCCL_DEBUG="INFO"))
    try:
        assert p.stdout.readline() == b"ready\n"
        info = _inspect(p.pid)
        assert info.job_reasons == ["nccl-env"] and not info.traceable
        assert procs.refresh(info, program.NCCL_SYMBOLS) is False             # unchanged: nothing read
        p.stdin.write(b"go\n")
        p.stdin.flush()
        assert p.stdout.readline() == b"loaded\n"
        assert procs.refresh(info, program.NCCL_SYMBOLS) is True
        assert info.traceable and info.job_reasons == ["libnccl", "nccl-env"]
        assert info.nccl_version == "2.21.5+cuda12.4" and info.cudart_libs
        assert procs.refresh(info, program.NCCL_SYMBOLS) is False
    finally:
        p.kill()
        p.wait()


def test_refresh_keeps_the_libnccl_of_a_job_that_exits(libs):
    """A job that ends during the capture is a zombie until reaped: virtual size 0, no maps. Its
    record keeps the libnccl and version it had (the manifest's, the analyzer's library version)."""
    # it exits when told (its stdin closed), once inspected alive: not before, however slow the machine
    script = (f"import ctypes, sys; ctypes.CDLL({str(libs['lab'])!r}); print('loaded', flush=True); "
              "sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=_plain_env())
    try:
        assert p.stdout.readline() == b"loaded\n"
        info = _inspect(p.pid)
        assert info.traceable and info.nccl_version == "2.21.5+cuda12.4"
        p.stdin.close()
        for _ in range(500):                       # exited, not reaped: a zombie
            if "Z" in (Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[:1] or [""])[0]:
                break
            time.sleep(0.02)
        assert procs.refresh(info, program.NCCL_SYMBOLS) is False
        assert info.traceable and info.nccl_version == "2.21.5+cuda12.4" and "libnccl" in info.job_reasons
    finally:
        p.kill()
        p.wait()
