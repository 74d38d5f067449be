"""Unpacked bundle folders for tests, assembled from real sample files.

``make_bundle(root, host, processes, files)`` writes ``manifest.json`` (one clock sample,
no pcap/tracer expected, so the bundle itself raises no problem) and the given files
(bundle-relative path -> bytes, str or a Path to copy) into ``root/<host>``. The
artefacts come from ``tests/fixtures/lab/`` (lab output) and ``tests/fixtures/parsers/``
(the reference samples); see the tests for which.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import FIXTURES

LAB = FIXTURES / "lab"
PARSERS = FIXTURES / "parsers"
T0 = 1_795_000_000_000_000_000


def process(pid: int, rank: int | None, env: dict | None = None, world: int = 4, **kw) -> dict:
    return {"pid": pid, "rank": rank, "local_rank": 0 if rank is not None else None,
            "world_size": world if rank is not None else None, "comm": kw.get("comm", "python3"),
            "cmdline": ["python3", "train.py"], "env": env or {},
            "libnccl": kw.get("libnccl", ["/usr/lib/libnccl.so.2"]),
            "sockets": []}


def make_bundle(root: Path, host: str, processes: list[dict], files: dict[str, object],
                collectors: dict | None = None, attached: bool = False) -> Path:
    """``attached``: the files under ``logs/`` are recorded as the user's ``--attach``
    (the attachments collector's ``sources``), as ``stallscope capture --attach`` records them."""
    d = root / host
    if attached:
        logs = [rel for rel in files if rel.startswith("logs/")]
        collectors = {**(collectors or {}), "attachments:end": {
            "status": "ok", "files": logs,
            "sources": [{"source": f"/shared/{rel[5:]}", "path": rel, "why": "--attach"} for rel in logs]}}
    d.mkdir(parents=True)
    manifest = {"schema_version": 1, "tool_version": "test", "host": host, "kernel": "6.1.0-test",
                "started_ns": T0, "ended_ns": T0 + 10**10,
                "clock_samples": [{"monotonic_ns": 10**9, "realtime_ns": T0}],
                "options": {"pcap": False, "bpf": False},
                "collectors": {"tracer": {"status": "skipped", "reason": "test"}, **(collectors or {})},
                "processes": processes}
    (d / "manifest.json").write_text(json.dumps(manifest))
    for rel, content in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            if content.is_dir():
                shutil.copytree(content, p)
            else:
                shutil.copyfile(content, p)
        elif isinstance(content, str):
            p.write_text(content)
        else:
            p.write_bytes(content)
    return d


def lab_pids(scenario: str) -> dict[int, int]:
    """rank -> pid of a lab fixture's ranks (its ground truth)."""
    truth = json.loads((LAB / scenario / "scenario.json").read_text())
    return {r["rank"]: r["pid"] for r in truth["ranks"]}


def lab_bundle(root: Path, scenario: str = "clean", host: str = "node", env: dict | None = None,
               logs: dict[int, str] | None = None, extra: dict[str, object] | None = None,
               collectors: dict | None = None) -> Path:
    """A bundle of the lab's 4 ranks: their manifest entries and NCCL_DEBUG logs (``logs``
    replaces a rank's log text), plus ``extra`` files."""
    pids = lab_pids(scenario)
    base_env = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}
    procs = [process(pid, rank, {**base_env, **(env or {})}) for rank, pid in sorted(pids.items())]
    files: dict[str, object] = {}
    for rank in pids:
        src = LAB / scenario / "logs" / f"nccl-rank{rank}.log"
        files[f"logs/nccl-rank{rank}.log"] = logs[rank] if logs and rank in logs else src
    files.update(extra or {})
    return make_bundle(root, host, procs, files, collectors)
