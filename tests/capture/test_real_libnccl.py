"""A real libnccl on a machine without a GPU, captured and analysed end to end (issue 42).

The PyPI wheels ``nvidia-nccl-cu12`` (2.18.1, and a current one: 2.32.3, else the newest pip
finds) are downloaded once into ``${XDG_CACHE_HOME:-~/.cache}/stallscope/wheels`` (never into
the repository) and their ``libnccl.so.2`` taken out. ``real_nccl/driver.c`` dlopens it and,
once capture says it is capturing (a gate file), calls ncclGetVersion, ncclGetUniqueId,
ncclCommInitRank (fails: no GPU, NCCL logs WARN lines under NCCL_DEBUG=INFO), ncclAllReduce
and ncclBroadcast on a NULL communicator (rejected) and ncclCommDestroy(NULL). ``stallscope
capture --pid --nccl-lib --attach`` traces it (the tracer uprobes the real library's exports)
and keeps its output; ``analyze`` of the bundle must end in a report, and the model must hold
every traced call, the library's version and the WARN lines.

Needs root, bpftrace, gcc and the wheels (the package registry); skips saying which is missing.
About 30-60 s per version, most of it the tracer attaching to a 300-450 MB library.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from capture_helpers import CaptureProc
from conftest import ROOT, require_root, require_tool
from forensics.cli import Env, main
from forensics.execution.host_reading import read_model

DRIVER = ROOT / "tests" / "capture" / "real_nccl" / "driver.c"
WHEELS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stallscope" / "wheels"
PACKAGE = "nvidia-nccl-cu12"
CURRENT = "2.32.3"
MEMBER = "nvidia/nccl/lib/libnccl.so.2"


def _download(spec: str) -> Path | None:
    """The wheel of ``spec`` in the cache, downloaded there first if need be (pip download
    --no-deps); None when pip cannot get it."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    before = set(WHEELS.glob("*.whl"))
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(WHEELS), spec],
                       capture_output=True, text=True, timeout=900)
    if r.returncode:
        return None
    name = spec.split("==")[0].replace("-", "_")
    version = spec.split("==")[1] if "==" in spec else None
    found = [w for w in WHEELS.glob(f"{name}-*.whl") if version is None or w.name.startswith(f"{name}-{version}-")]
    new = [w for w in found if w not in before] or found
    return max(new, key=lambda w: w.stat().st_mtime) if new else None


def real_libnccl(which: str) -> tuple[Path, str]:
    """(libnccl.so.2, its version) of the wheel ``which`` ("2.18.1", or "current": CURRENT,
    else the newest the registry has), extracted into the cache once; skips when unavailable."""
    name = PACKAGE.replace("-", "_")
    pinned = CURRENT if which == "current" else which
    wheel = next(iter(sorted(WHEELS.glob(f"{name}-{pinned}-*.whl"))), None) or _download(f"{PACKAGE}=={pinned}")
    if wheel is None and which == "current":
        wheel = _download(PACKAGE)
    if wheel is None:
        pytest.skip(f"pip download --no-deps {PACKAGE}=={pinned} failed (no package registry?)")
    version = wheel.name.split("-")[1]
    lib = WHEELS / f"nccl-{version}" / "libnccl.so.2"
    if not lib.is_file():
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(".part")
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        os.replace(tmp, lib)
    return lib, version


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    require_tool("gcc")
    exe = tmp_path_factory.mktemp("driver") / "nccl_driver"
    r = subprocess.run(["gcc", "-O1", "-o", str(exe), str(DRIVER), "-ldl"], capture_output=True, text=True)
    if r.returncode:
        pytest.fail(f"the driver did not build: {r.stderr}")
    return exe


@pytest.mark.parametrize("which", ["2.18.1", "current"])
def test_real_libnccl_captured_and_analysed(which, driver, tmp_path):
    require_root()
    require_tool("bpftrace")
    lib, version = real_libnccl(which)
    gate, log, out = tmp_path / "gate", tmp_path / "driver.log", tmp_path / "bundles"
    out.mkdir()
    env = dict(os.environ, NCCL_DEBUG="INFO")
    with open(log, "wb") as fh:
        job = subprocess.Popen([str(driver), str(lib), str(gate)], stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(300):
            if b"ready" in log.read_bytes() or job.poll() is not None:
                break
            time.sleep(0.1)
        assert b"ready" in log.read_bytes(), log.read_text(errors="replace")
        cap = CaptureProc(["--pid", str(job.pid), "--nccl-lib", str(lib), "--no-pcap", "-o", str(out),
                           "--duration", "6s", "--attach", str(log)])
        cap.wait_capturing(timeout=120)
        gate.touch()
        for _ in range(600):
            if b"call ncclCommDestroy" in log.read_bytes() or job.poll() is not None:
                break
            time.sleep(0.1)
        # reaped only once the capture ended: the capture sees the job exit, a zombie (no maps)
        rc, stdout = cap.finish(timeout=120)
        assert job.wait(timeout=60) == 0, log.read_text(errors="replace")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert rc == 0, "".join(cap.err)
    bundle = stdout.strip().splitlines()[-1]
    calls = dict(re.findall(r"^call (\w+) rc=(\d+)", log.read_text(errors="replace"), re.M))
    # ncclCommInitRank: ncclUnhandledCudaError (1) without a GPU; ncclSuccess on a machine with one
    gpu = calls.get("ncclCommInitRank") == "0"
    assert calls == {"ncclGetVersion": "0", "ncclGetUniqueId": "0", "ncclCommInitRank": "0" if gpu else "1",
                     "ncclAllReduce": "4", "ncclBroadcast": "4", "ncclCommDestroy": "0"}, calls

    # analyze: a report, never an internal error
    so, se = io.StringIO(), io.StringIO()
    rc = main(["analyze", bundle, "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "f.json")],
              Env(stdout=so, stderr=se))
    assert rc in (0, 1) and "internal error" not in se.getvalue(), se.getvalue()
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["verdict"] and not [p for p in doc["capture"]["problems"] if p.startswith("detector ")]

    # every traced call
    events = [json.loads(ln) for ln in _member(bundle, "bpf/events.jsonl").splitlines() if ln.strip()]
    mine = [e for e in events if e.get("pid") == job.pid]
    assert any(e["ev"] == "unique_id" for e in mine), mine
    init = [e for e in mine if e["ev"] == "comm_init"]
    assert [(e["fn"], e.get("rc")) for e in init] == [("ncclCommInitRank", 0 if gpu else 1)], init
    assert {e["fn"]: e.get("rc") for e in mine if e["ev"] == "coll"} == {"ncclAllReduce": 4, "ncclBroadcast": 4}
    assert any(e["ev"] == "comm_destroy" for e in mine), mine
    m = read_model([bundle])
    nccl = m["nccl_events"]
    assert sorted(nccl["op"]) == ["ALL_REDUCE", "BROADCAST"] and set(nccl["pid"]) == {job.pid}

    # the library's version: from its file (without a GPU the init fails before NCCL prints it)
    cfg = m["nccl_config"]
    row = cfg[cfg["pid"] == job.pid].iloc[0]
    assert str(row["nccl_version"]).startswith(version), row.to_dict()
    assert str(lib) in str(row["libnccl"]), row.to_dict()

    # the WARN lines: the CUDA failure of the init, the NULL communicator of each collective
    w = m["nccl_warnings"]
    msgs = w.loc[w["pid"] == job.pid, "message"].tolist()
    assert gpu or any("Cuda failure" in x for x in msgs), msgs
    assert any(x.startswith("AllReduce : comm argument is NULL") for x in msgs), msgs
    assert any(x.startswith("Broadcast : comm argument is NULL") for x in msgs), msgs
    assert row["warnings"] == len(msgs) == log.read_text(errors="replace").count(" NCCL WARN ")


def _member(bundle: str, suffix: str) -> str:
    import tarfile
    with tarfile.open(bundle) as t:
        name = next(n for n in t.getnames() if n.endswith(suffix))
        return t.extractfile(name).read().decode("utf-8", "replace")
