"""A capture started before the job's sockets exist (a prolog) captures the packets of the
interfaces the job starts using later; when no packet capture runs at all, stderr and the
manifest say why (capture/jobs.py: Jobs.refresh_ifaces; capture/collectors/tcpdump.py: Tcpdump.no_pcap_warning)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from capture_helpers import CaptureProc
from netns import NetnsPair

from capture import bundle_files as bd

PY = sys.executable

# the "job": waits for the go line, sleeps 1.5 s, then connects across the veth and sends for 3 s
LATE = textwrap.dedent("""
    import os, socket, sys, time
    print(os.getpid(), flush=True)
    sys.stdin.readline()
    time.sleep(1.5)
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
    end = time.monotonic() + 3
    while time.monotonic() < end:
        c.sendall(b"x" * 1400)
        time.sleep(0.01)
    print("sent", flush=True)
    time.sleep(30)
""")

SINK = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
    print("ready", flush=True)
    s.settimeout(60)
    c, _ = s.accept()
    while c.recv(1 << 16):
        pass
""")


def _extract(bundle: str, dest: Path) -> Path:
    with tarfile.open(bundle) as t:
        t.extractall(dest)
    return next(dest.iterdir())


def test_tcpdump_starts_on_an_interface_the_job_uses_after_the_capture_started(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (ip netns, tcpdump)")
    missing = [t for t in ("ip", "tcpdump", "nsenter") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH (iproute2, tcpdump, util-linux)")
    port = 5301
    with NetnsPair() as pair:
        sink = subprocess.Popen(["ip", "netns", "exec", pair.ns["b"], PY, "-c", SINK, pair.ip["b"], str(port)],
                                stdout=subprocess.PIPE, text=True)
        pair.procs.append(sink)
        assert sink.stdout.readline().strip() == "ready"
        job = subprocess.Popen(["ip", "netns", "exec", pair.ns["a"], PY, "-c", LATE, pair.ip["b"], str(port)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        pair.procs.append(job)       # stopped by pid and the namespaces deleted by pair.close()
        pid = int(job.stdout.readline())
        cap = CaptureProc(["--pid", str(pid), "--duration", "6s", "--no-bpf", "-o", str(tmp_path)])
        try:
            cap.wait_capturing()
            job.stdin.write("go\n")
            job.stdin.flush()
            rc, out = cap.finish(timeout=120)
        finally:
            if cap.p.poll() is None:
                cap.p.kill()
                cap.p.wait()
        err = "".join(cap.err)
        assert rc == 0, err
        assert job.stdout.readline().strip() == "sent"
    root = _extract(out.strip(), tmp_path / "x")
    m = json.loads((root / "manifest.json").read_text())
    label = next(ns["label"] for ns in m["netns"] if pid in ns["pids"])
    key = f"tcpdump@{label}/{pair.dev['a']}"
    rec = m["collectors"][key]
    assert rec["status"] == "ok" and rec["packets"] > 100, rec
    assert "interfaces now in use" in err and "no packet capture" not in err
    assert "tcpdump" not in m["collectors"]            # the start's "no interface yet" placeholder is gone
    pcaps = [root / f for f in rec["files"] if f.endswith(".pcap")]
    assert pcaps and sum(bd.pcap_records(p) for p in pcaps) > 100
    first, last = rec["covered_ns"]                    # the first and last packet, inside the capture
    assert m["started_ns"] + 1e9 < first < last <= m["ended_ns"] and 2e9 < last - first < 5e9, rec
    assert any(pair.dev["a"] in n["ifaces"] for n in m["netns"])
    snap = m["collectors"][f"ss@{label}:start"]            # a snapshot covers the time its command ran
    assert snap["covered_ns"] == [snap["started_ns"], snap["ended_ns"]]
    series = m["collectors"][f"ss-series@{label}"]         # the job's namespace sampled every 2 s
    assert series["status"] == "ok" and series["samples"] >= 2 and series["covered_ns"][0] < series["covered_ns"][1]


def test_no_packet_capture_is_a_warning_on_stderr_and_in_the_manifest(tmp_path):
    """A job with no connection and no NCCL_SOCKET_IFNAME: nothing to capture. One warning
    line says why, the manifest's notes and the tcpdump collector say the same (without root:
    why is "needs root")."""
    job = subprocess.Popen([PY, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                           stdout=subprocess.PIPE, text=True, env={"PATH": os.environ.get("PATH", "/usr/bin")})
    try:
        assert job.stdout.readline().strip() == "ready"
        cap = CaptureProc(["--pid", str(job.pid), "--duration", "1s", "--no-bpf", "--ss-every", "0",
                           "-o", str(tmp_path)])
        rc, out = cap.finish(timeout=120)
        # --no-pcap: by design, no warning
        quiet = CaptureProc(["--pid", str(job.pid), "--duration", "1s", "--no-bpf", "--no-pcap", "-o", str(tmp_path)])
        qrc, _ = quiet.finish(timeout=120)
    finally:
        job.kill()
        job.wait()
    assert qrc == 0 and "no packet capture" not in "".join(quiet.err), quiet.err
    err = "".join(cap.err)
    assert rc == 0, err
    warn = [l for l in err.splitlines() if l.startswith("stallscope capture: warning: no packet capture: ")]
    assert len(warn) == 1, err
    why = warn[0].split("no packet capture: ", 1)[1]
    if os.geteuid() == 0 and shutil.which("tcpdump"):
        assert why.startswith("no interface in use by the job's processes"), why
    m = json.loads((_extract(out.strip(), tmp_path / "x") / "manifest.json").read_text())
    assert f"no packet capture: {why}" in m["notes"]
    assert m["collectors"]["tcpdump"]["status"] == "skipped" and m["collectors"]["tcpdump"]["reason"] == why
    assert m["collectors"]["ss-series"] == {**m["collectors"]["ss-series"], "status": "skipped",
                                            "reason": "--ss-every 0 (ss at the start and end only)"}
