"""stallscope capture against the fault-injection lab (root): real ranks in network
namespaces, the real tracer and tcpdump, the bundle checked against the lab's
ground truth (scenario.json and its libnccl's own record).

The lab starts behind a gate (a shell that waits for a file, then execs the
launcher), so capture can attach first with ``--pid <gate>``: the ranks are the
gate's descendants, and the other labs that may run on this machine at the
same time (same libnccl file) are left out.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from capture.procs import descendants
from capture_helpers import CaptureProc, alive, check_bundle
from conftest import ROOT, require_root, require_tool

LAB = ROOT / "tests" / "lab"
LIB = LAB / "build" / "libnccl.so.2"
PY = sys.executable


@pytest.fixture(scope="module")
def lab_ready():
    require_root()
    require_tool("bpftrace", "tcpdump", "nft", "ip", "nsenter")
    if subprocess.run(["make", "-s", "-C", str(LAB)], capture_output=True).returncode or not LIB.exists():
        pytest.skip("the lab could not be built (make -C tests/lab)")


class Run:
    """A gated lab scenario plus one ``stallscope capture`` watching it."""

    def __init__(self, tmp: Path, scenario: list[str], capture_args: list[str]):
        self.tmp = tmp
        self.go = tmp / "GO"
        self.lab_out = tmp / "lab"
        self.bundles = tmp / "bundles"
        self.bundles.mkdir()
        launcher = [PY, "-m", "tests.lab.launcher", "--out", str(self.lab_out), "--no-stacks"] + scenario
        gate = f'while [ ! -e "{self.go}" ]; do sleep 0.05; done; exec "$@"'
        self.lab = subprocess.Popen(["sh", "-c", gate, "sh"] + launcher, cwd=ROOT, stdout=subprocess.DEVNULL,
                                    stderr=open(tmp / "launcher.err", "wb"))
        self.capture = CaptureProc(["--pid", str(self.lab.pid), "--nccl-lib", str(LIB), "-o", str(self.bundles)]
                                   + capture_args, module="forensics capture")
        self.cap = self.capture.p
        self.err_lines = self.capture.err

    def start_lab(self, timeout=90):
        self.capture.wait_capturing(timeout)
        self.go.touch()

    def wait_lab(self, timeout=120) -> dict:
        self.lab.wait(timeout=timeout)
        assert self.lab.returncode == 0, (self.tmp / "launcher.err").read_text()[-2000:]
        return json.loads((self.lab_out / "scenario.json").read_text())

    def finish(self, sig=signal.SIGINT, timeout=90) -> tuple[int, Path]:
        rc, out = self.capture.finish(sig, timeout)
        paths = [Path(l) for l in out.splitlines() if l.endswith(".tar.gz")]
        assert paths and paths[0].exists(), "".join(self.err_lines)
        return rc, paths[0]

    def cleanup(self):
        self.go.touch()
        for p in (self.cap, self.lab):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def leftovers(marker: str) -> list[str]:
    """bpftrace/tcpdump processes whose command line names this test's folder."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and re.search(r"\b(bpftrace|tcpdump)\b", cmd):
            out.append(f"{d}: {cmd}")
    return out


def read_events(bundle: Path) -> tuple[dict, list[dict], Path]:
    dest = bundle.parent / "x"
    dest.mkdir(exist_ok=True)
    with tarfile.open(bundle) as t:
        t.extractall(dest)
    root = next(dest.iterdir())
    manifest = json.loads((root / "manifest.json").read_text())
    events = [json.loads(l) for l in (root / "bpf" / "events.jsonl").read_text().splitlines()]
    return manifest, events, root


def test_loss_scenario_bundle_matches_the_lab(lab_ready, tmp_path):
    from tests.lab.ids import comm_id_fold
    from forensics.tcp import analyze_file

    run = Run(tmp_path, ["--scenario", "loss", "--ranks", "3", "--rank", "1", "--steps", "16"],
              ["--duration", "5m", "--max-bytes", "64M"])
    try:
        run.start_lab()
        truth = run.wait_lab()
        time.sleep(1.0)  # last offcpu dump, lingering segments
        rc, bundle = run.finish()
    finally:
        run.cleanup()
    assert rc == 0, "".join(run.err_lines)
    assert leftovers(str(tmp_path)) == []
    check_bundle(bundle)
    manifest, events, root = read_events(bundle)
    ranks = {r["pid"]: r for r in truth["ranks"]}
    assert set(ranks) <= {p["pid"] for p in manifest["processes"]}
    mine = [e for e in events if e.get("pid") in ranks]
    # comm init: rank, nranks, the fold of the unique id read from the caller's stack
    inits = [e for e in mine if e["ev"] == "comm_init"]
    assert sorted((e["pid"], e["rank"], e["nranks"]) for e in inits) == \
        sorted((pid, r["rank"], truth["world_size"]) for pid, r in ranks.items())
    for e in inits:
        assert e["comm_id_hash"] == truth["comm_id_hash"] and e["rc"] == 0
        raw = b"".join(int(w, 16).to_bytes(8, "little") for w in e["unique_id"])
        assert f"0x{comm_id_fold(raw):016x}" == truth["comm_id_hash"]
    # every collective the lab issued, per rank, numbered from init
    for pid, r in ranks.items():
        colls = sorted((e for e in mine if e["ev"] == "coll" and e["pid"] == pid), key=lambda e: e["op_count"])
        assert len(colls) == r["ops_issued"] == truth["ops_issued"][r["rank"]]
        assert [e["op_count"] for e in colls] == list(range(r["ops_issued"]))
        assert {e["rank"] for e in colls} == {r["rank"]} and {e["comm"] for e in colls} == {r["comm"]}
        assert {e["nranks"] for e in colls} == {truth["world_size"]}
        # every call returned (its launch: collectives are asynchronous), rc ncclSuccess
        assert all(e["comm_id_hash"] == truth["comm_id_hash"] and e["rc"] == 0 and e["t1"] >= e["t0"]
                   and e["returned"] is True for e in colls)
        assert colls[0]["op"] == "BROADCAST" and colls[0]["root"] == 0
        waits = [e for e in mine if e["ev"] == "host_wait" and e["pid"] == pid]
        assert waits and all(w["fn"] == "cudaStreamSynchronize" and w["stream"] == colls[0]["stream"] for w in waits)
        assert all(w["returned"] is True and w["rc"] == 0 and w["t1"] >= w["t0"] for w in waits)
        # off-CPU samples of the rank's threads (/proc schedstat), cumulative and growing
        off = [e for e in mine if e["ev"] == "offcpu" and e["pid"] == pid and e["tid"] == pid]
        assert off and off[-1]["ns"] >= off[0]["ns"] and off[-1]["oncpu_ns"] > 0 and off[-1]["name"]
    assert [e["t0"] if "t0" in e else e["t"] for e in events] == sorted(e["t0"] if "t0" in e else e["t"]
                                                                        for e in events)
    # the loss shows as tracepoint retransmissions inside the lab's namespaces ...
    lab_ns = {n["inode"] for n in manifest["netns"] if set(n["pids"]) & set(ranks)}
    retx = [e for e in events if e["ev"] == "tcp_retransmit_skb" and e.get("netns") in lab_ns]
    assert retx and all(e["saddr"].startswith("10.203.0.") for e in retx)
    # ... and in the pcaps captured inside them
    pcaps = sorted((root / "pcap").glob("*.pcap"))
    assert len(pcaps) >= truth["world_size"]
    flagged = 0
    for p in pcaps:
        counts = analyze_file(str(p), keep="none").stats.verdict_counts
        flagged += counts.get("retransmission", 0) + counts.get("fast_retransmission", 0)
    assert flagged > 0
    # the NCCL_DEBUG_FILE logs came along from the processes' environment
    assert any(f["path"].startswith("logs/nccl-rank") for f in manifest["files"])


def test_small_budget_and_ctrl_c_mid_capture(lab_ready, tmp_path):
    budget = 2 << 20
    run = Run(tmp_path, ["--scenario", "clean", "--ranks", "2", "--steps", "5000", "--compute-ms", "5",
                         "--run-timeout-s", "60"], ["--duration", "5m", "--max-bytes", "2M"])
    try:
        run.start_lab()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:   # traffic is flowing and tcpdump runs
            if any("packets" in l and not re.search(r"packets 0\b", l) for l in run.err_lines):
                break
            time.sleep(0.2)
        time.sleep(1.0)
        assert run.lab.poll() is None, "the job ended before Ctrl-C: not a mid-capture stop"
        t0 = time.monotonic()
        rc, bundle = run.finish(signal.SIGINT)
        stop_s = time.monotonic() - t0
    finally:
        run.cleanup()
    assert rc in (0, 3), "".join(run.err_lines)
    assert stop_s < 60
    assert bundle.stat().st_size <= budget
    manifest = check_bundle(bundle)
    assert manifest["options"]["max_bytes"] == budget
    assert manifest["collectors"]["tracer"]["status"] == "ok"
    assert any(k.startswith("tcpdump@") and v["status"] == "ok" for k, v in manifest["collectors"].items())
    assert sum(f["bytes"] for f in manifest["files"] if f["path"].startswith("pcap/")) > 0
    assert leftovers(str(tmp_path)) == []
    # a small budget still keeps each rank namespace's start snapshots (taken once, never
    # overwritten by later rescans) and the NCCL logs' start (their configuration lines)
    # next to their end: the attachments have their own part of the budget
    sizes = {f["path"]: f["bytes"] for f in manifest["files"]}
    ns_addr = [p for p in sizes if p.startswith("sys/netns-") and p.endswith("/ip-addr-start.json")]
    assert ns_addr and all(sizes[p] > 0 for p in ns_addr), sizes
    _, _, root = read_events(bundle)
    logs = sorted((root / "logs").glob("nccl-rank*.log"))
    assert len(logs) == 2
    for log in logs:
        text = log.read_text(errors="replace")
        assert text and " NCCL INFO " in text.splitlines()[0], (manifest["collectors"].get("attachments:end"), manifest["budget"])


def test_sigkill_mid_capture_leaves_no_child_no_probe_and_a_recoverable_bundle(lab_ready, tmp_path):
    """SIGKILL the capture while the tracer and tcpdump run: within seconds none of the
    processes it started is left (matched by its process tree, not by name: other tests may
    run tracers), its uprobes are gone with bpftrace, and --recover turns the staging folder
    into a bundle marked partial with the events and packets captured until the kill."""
    run = Run(tmp_path, ["--scenario", "clean", "--ranks", "2", "--steps", "1500", "--compute-ms", "5",
                         "--run-timeout-s", "60"], ["--duration", "5m", "--max-bytes", "64M"])
    try:
        run.start_lab()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:   # records flushed, packets written
            if any(re.search(r"events [1-9]\d* .*packets [1-9]", l) for l in run.err_lines):
                break
            time.sleep(0.2)
        time.sleep(1.5)
        assert run.lab.poll() is None, "the job ended before the kill"
        tree = descendants([run.cap.pid])
        names = {p: Path(f"/proc/{p}/comm").read_text().strip() for p in tree if alive(p)}
        assert "bpftrace" in names.values() and "tcpdump" in names.values(), names
        run.cap.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and any(alive(p) for p in tree):
            time.sleep(0.1)
        assert [names.get(p, p) for p in tree if alive(p)] == []
        assert leftovers(str(run.bundles)) == []    # (the lab's own tcpdumps write under tmp_path/lab)
        for f in ("/sys/kernel/tracing/uprobe_events", "/sys/kernel/debug/tracing/uprobe_events"):
            if os.path.exists(f):
                assert str(LIB) not in Path(f).read_text() and "libcudart" not in Path(f).read_text()
        run.cap.wait(timeout=30)
        time.sleep(1.0)
        assert "died before writing its bundle" in "".join(run.err_lines)
        truth = run.wait_lab()     # the job itself never noticed
    finally:
        run.cleanup()
    assert not list(run.bundles.glob("*.tar.gz"))
    p = subprocess.run([PY, "-m", "forensics", "capture", "--recover", "-o", str(run.bundles)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    bundle = Path(p.stdout.strip())
    manifest = check_bundle(bundle)
    assert manifest["partial"] is True
    assert manifest["collectors"]["tracer"]["status"] == "failed" and "killed" in manifest["collectors"]["tracer"]["reason"]
    manifest, events, root = read_events(bundle)
    ranks = {r["pid"]: r for r in truth["ranks"]}
    for pid, r in ranks.items():
        assert [e["rank"] for e in events if e["ev"] == "comm_init" and e["pid"] == pid] == [r["rank"]]
        counts = sorted(e["op_count"] for e in events if e["ev"] == "coll" and e["pid"] == pid)
        # every collective up to the last flush before the kill, numbered from init
        assert len(counts) > 100 and counts == list(range(len(counts))) and len(counts) < r["ops_issued"]
    pcaps = sorted((root / "pcap").glob("*.pcap"))
    assert pcaps and sum(p.stat().st_size for p in pcaps) > 10_000
