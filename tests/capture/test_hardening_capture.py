"""Capture faults (issue 7, capture side; root).

- SIGKILL of a capture leaves no tracer, tcpdump or probe behind: covered with the real
  tracer and tcpdump by tests/lab_runs/test_capture_lab.py::
  test_sigkill_mid_capture_leaves_no_child_no_probe_and_a_recoverable_bundle, and without
  root by tests/capture/test_capture.py::test_sigkill_stops_nccl_tests_children_and_keeps_the_data.
- A full disk (a 2 MiB tmpfs as the output folder): the staged files are cut to what fits
  and a valid bundle of them is written, marked partial with notes, exit code 3, a clear
  message, no traceback; where not even that fits, one line says where the staged data
  are kept (exit code 3) for --recover.
- A tracer that cannot attach (--nccl-lib naming a library without the NCCL API): reported
  in the manifest (tracer failed, with the reason), exit code 3, tcpdump and the rest ran.
- The packets of the last moments before a stop reach the bundle: tcpdump hands each
  packet over as it comes instead of holding it up to a second in libpcap's block ring
  (which a SIGINT or a kill by the job's teardown loses).
- py-spy is bounded and never stops the job: a py-spy that hangs is killed after its
  timeout, the capture is not held up, and py-spy is asked not to pause the process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from capture_helpers import CaptureProc, bundle_manifest, send_last_datagrams, udp_payloads_in_bundle
from conftest import ROOT, require_root, require_tool

PY = sys.executable
LAB_LIB = ROOT / "tests" / "lab" / "build" / "libnccl.so.2"


def _capture(args: list[str], env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "forensics", "capture", "--progress", "lines"] + args, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_full_disk_gives_a_bundle_of_what_fitted(tmp_path):
    require_root()
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (container without CAP_SYS_ADMIN?)")
    try:
        # 50 MB of "nccl-tests" output into a 2 MiB file system
        p = _capture(["--no-bpf", "--no-pcap", "--duration", "3s", "-o", str(mnt),
                      "--nccl-tests", "yes nccl-tests-output-line | head -c 50000000"])
        assert p.returncode == 3, p.stderr
        assert "Traceback" not in p.stderr and "the output file system was full" in p.stderr, p.stderr
        bundle = Path(p.stdout.strip())
        assert bundle.parent == mnt and bundle.name.endswith(".tar.gz")
        assert sorted(x.name for x in mnt.iterdir()) == [bundle.name]     # no staging folder, no .partial
        m = bundle_manifest(bundle)
        assert m["partial"] is True and "file system was full" in m["partial_reason"]
        assert any("file system was full" in n for n in m["notes"])
        assert "No space left on device" in m["collectors"]["nccl-tests"]["reason"]
        from forensics.inputs.bundle import Bundle
        with Bundle.open(bundle, workdir=tmp_path) as b:      # a valid bundle, with what was captured
            out = b.path("nccl-tests/output.txt")
            assert out is not None and out.stat().st_size > 100_000
            assert b"\nnccl-tests-output-line\n" in out.read_bytes()[:100]   # its tail is kept
            assert any("nccl-tests/output.txt" in x for x in b.manifest.raw["notes"])
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_when_not_even_a_cut_bundle_fits_the_data_stay_and_one_line_says_where(tmp_path, monkeypatch):
    """No root needed: writing the archive always fails with ENOSPC."""
    import errno

    from capture import runner
    from capture.options import CaptureFailed, CaptureOptions

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(runner, "fit_budget", full)
    import io
    with pytest.raises(CaptureFailed) as e:
        runner.run_capture(CaptureOptions(output=str(tmp_path), duration_s=1.0, bpf=False, pcap=False,
                                          nccl_tests="echo some output", progress="off"), stderr=io.StringIO())
    msg = str(e.value)
    assert "\n" not in msg and "No space left on device" in msg and "--recover" in msg
    staged = [d for d in tmp_path.iterdir() if ".staging-" in d.name]
    assert len(staged) == 1 and str(staged[0]) in msg
    assert (staged[0] / "nccl-tests" / "output.txt").read_bytes() == b"some output\n"
    # the command line turns it into one line and exit code 3
    from forensics.cli import Env, main
    err = io.StringIO()
    rc = main(["capture", "--no-bpf", "--no-pcap", "--duration", "1s", "-o", str(tmp_path), "--progress", "off"],
              Env(stdout=io.StringIO(), stderr=err))
    assert rc == 3 and err.getvalue().count("\n") == 1 and err.getvalue().startswith("stallscope: error: cannot write")


def test_tracer_that_cannot_attach_is_reported_and_the_rest_runs(tmp_path):
    require_root()
    require_tool("bpftrace", "tcpdump")
    libz = next((p for p in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1",
                             "/usr/lib64/libz.so.1") if os.path.exists(p)), None)
    if libz is None:
        pytest.skip("no libz.so.1 to point --nccl-lib at")
    p = _capture(["--nccl-lib", libz, "--iface", "lo", "--duration", "3s", "-o", str(tmp_path)])
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr and "exports none of the NCCL API" in p.stderr
    m = bundle_manifest(Path(p.stdout.strip()))
    col = m["collectors"]
    assert col["tracer"]["status"] == "failed" and libz in col["tracer"]["reason"]
    assert "exports none of the NCCL API" in col["tracer"]["reason"]
    assert col["tcpdump@host/lo"]["status"] == "ok" and col["ss@host:end"]["status"] == "ok"
    assert any(f["path"] == "bpf/events.jsonl" for f in m["files"])   # kernel TCP events still traced
    # and the analyzer says so
    from forensics.inputs.bundle import Bundle
    with Bundle.open(p.stdout.strip(), workdir=tmp_path) as b:
        assert any(x.startswith("collector tracer failed: --nccl-lib") for x in b.problems), b.problems


def test_a_hanging_py_spy_is_bounded_and_does_not_pause_the_job(tmp_path):
    require_root()
    if not LAB_LIB.exists():
        pytest.skip("the lab's libnccl.so.2 is not built (make -C tests/lab)")
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "py-spy").write_text(f'#!/bin/sh\necho "$$ $*" >> {calls}\nexec sleep 100000\n')
    (fake / "py-spy").chmod(0o755)
    job = subprocess.Popen([PY, "-c", f"import ctypes, time; ctypes.CDLL({str(LAB_LIB)!r}); "
                            "print('ready', flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "ready"
        env = dict(os.environ, PATH=f"{fake}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        t0 = time.monotonic()
        p = _capture(["--no-bpf", "--no-pcap", "--pid", str(job.pid), "--duration", "1s", "-o", str(tmp_path)],
                     env=env)
        took = time.monotonic() - t0
    finally:
        job.kill()
        job.wait()
    assert p.returncode == 3, p.stderr        # py-spy failed: a partial capture
    assert took < 45, f"capture held up {took:.0f}s by py-spy"
    m = bundle_manifest(Path(p.stdout.strip()))
    spy = {k: v for k, v in m["collectors"].items() if k.startswith("py-spy@")}
    assert set(spy) == {f"py-spy@pid{job.pid}:start", f"py-spy@pid{job.pid}:end"}, spy
    for rec in spy.values():
        assert rec["status"] == "failed" and rec["reason"].startswith("still running after 10s: killed"), rec
        assert "--nonblocking" in rec["command"]
    lines = calls.read_text().split("\n")
    pids = [int(ln.split()[0]) for ln in lines if ln]
    assert len(pids) == 2 and all("dump --nonblocking --pid" in ln for ln in lines if ln)
    assert not [q for q in pids if os.path.exists(f"/proc/{q}")], "a py-spy outlived the capture"


def test_the_packets_just_before_the_stop_are_in_the_bundle(tmp_path):
    require_root()
    require_tool("tcpdump")
    cap = CaptureProc(["--no-bpf", "--iface", "lo", "--duration", "5m", "-o", str(tmp_path)],
                      module="forensics capture")
    try:
        cap.wait_capturing()
        port, sent = send_last_datagrams()
        rc, out = cap.finish(signal.SIGINT)   # at once: well inside libpcap's 1 s block timeout
    finally:
        if cap.p.poll() is None:
            cap.p.kill()
            cap.p.wait()
    assert rc == 0, "".join(cap.err)
    seen = udp_payloads_in_bundle(Path(out.strip()), port)
    assert seen == sent, seen
