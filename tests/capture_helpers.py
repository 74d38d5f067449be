"""What the tests that run ``stallscope capture`` share: the capture as a subprocess whose
stderr is read as it comes, and the manifest of a bundle it wrote."""
from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import tarfile
import time
import threading
from pathlib import Path

from conftest import ROOT

PY = sys.executable


class CaptureProc:
    """``python3 -m capture ARGS`` (``module="forensics capture"``: the stallscope command)
    in a subprocess. A thread reads its stderr (the progress lines must not fill the pipe)
    into ``err`` and sets ``capturing`` once capture says it is capturing."""

    def __init__(self, args: list[str], module: str = "capture", user: list[str] | None = None, env=None,
                 cwd=None):
        # cwd: where ``-m capture`` is imported from (default: this checkout); a copy readable
        # by ``user`` when the checkout may not be (see ``readable_copy``)
        self.p = subprocess.Popen((user or []) + [PY, "-m", *module.split(), "--progress", "lines"] + args,
                                  cwd=cwd or ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env)
        self.err: list[str] = []
        self.capturing = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stderr:
            self.err.append(line)
            if "capturing:" in line:
                self.capturing.set()

    def wait_capturing(self, timeout=60):
        assert self.capturing.wait(timeout), "capture did not start:\n" + "".join(self.err)

    def finish(self, sig=None, timeout=120) -> tuple[int, str]:
        """Send ``sig`` (if given and still running), wait; the exit code and stdout."""
        if sig is not None and self.p.poll() is None:
            self.p.send_signal(sig)
        # stdout is a few lines: the pipe cannot fill before the exit; stderr belongs to
        # the reader thread (communicate() would read it too and close it under the thread)
        self.p.wait(timeout=timeout)
        out = self.p.stdout.read()
        self.reader.join(timeout=30)
        return self.p.returncode, out


def readable_copy(dest: Path, sources: dict[str, Path]) -> Path:
    """Copy ``sources`` (name in dest -> file or folder) into dest, readable by every user:
    folders 0755, executables and shared objects 0755, other files 0644; dest itself 0755.
    An unprivileged child must not depend on where the checkout lives (a clone under a
    0700 folder is unreadable to it: 'cannot open shared object file: Permission denied')."""
    import os
    import shutil
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name, src in sources.items():
        dst = dest / name
        if Path(src).is_dir():
            shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    for p in [dest, *dest.rglob("*")]:
        if p.is_symlink():
            continue
        if p.is_dir():
            os.chmod(p, 0o755)
        else:
            exe = os.access(p, os.X_OK) or ".so" in p.name
            os.chmod(p, 0o755 if exe else 0o644)
    return dest


def alive(pid: int) -> bool:
    """pid runs (a zombie has ended: it only waits for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def check_bundle(path: Path) -> dict:
    """The bundle at ``path`` is whole: every file the manifest lists is in it with the listed
    size and sha256 and nothing else is, every collector has a status (a skip with its reason),
    and the clock was sampled at least twice. Returns the manifest."""
    with tarfile.open(path) as t:
        members = {m.name.split("/", 1)[1]: m for m in t.getmembers() if m.isfile()}
        manifest = json.load(t.extractfile(members["manifest.json"]))
        listed = {f["path"]: f for f in manifest["files"]}
        assert set(listed) == set(members) - {"manifest.json"}
        for name, f in listed.items():
            data = t.extractfile(members[name]).read()
            assert len(data) == f["bytes"] and hashlib.sha256(data).hexdigest() == f["sha256"], name
    assert manifest["schema_version"] == 1 and manifest["host"] and manifest["kernel"]
    assert manifest["started_ns"] < manifest["ended_ns"]
    for rec in manifest["collectors"].values():
        assert rec["status"] in ("ok", "skipped", "failed")
        assert rec["status"] != "skipped" or rec["reason"]
    samples = manifest["clock_samples"]
    assert len(samples) >= 2 and all(s["monotonic_ns"] > 0 and s["realtime_ns"] > 0 for s in samples)
    return manifest


def wait_for(pred, timeout: float, what: str, poll: float = 0.2):
    """pred()'s first truthy value within timeout seconds; AssertionError naming what otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def bundle_manifest(bundle: Path) -> dict:
    """manifest.json of a bundle archive, read in place."""
    with tarfile.open(bundle) as t:
        m = next(x for x in t.getmembers() if x.name.endswith("/manifest.json"))
        return json.load(t.extractfile(m))


def send_last_datagrams(n: int = 7) -> tuple[int, list[bytes]]:
    """n numbered UDP datagrams to a loopback port of our own (bound while they are sent, so
    they are delivered: no ICMP): (the port, the payloads in order). What a capture must keep
    when it ends, or cuts a bundle, a moment later."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    port = sink.getsockname()[1]
    payloads = [b"stallscope-last-%d" % i for i in range(n)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for p in payloads:
            s.sendto(p, ("127.0.0.1", port))
    sink.close()
    return port, payloads


def udp_payloads_in_bundle(bundle: Path, port: int) -> list[bytes]:
    """The payloads of the UDP datagrams to ``port`` in every pcap of a bundle, in file order."""
    import dpkt
    seen = []
    with tarfile.open(bundle) as t:
        for m in t.getmembers():
            if "/pcap/" in m.name and m.name.endswith(".pcap") and m.isfile():
                for _, buf in dpkt.pcap.Reader(t.extractfile(m)):
                    ip = dpkt.ethernet.Ethernet(buf).data
                    if isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.udp.UDP) and ip.data.dport == port:
                        seen.append(bytes(ip.data.data))
    return seen
