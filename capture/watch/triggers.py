"""How a watcher is triggered and found: a :class:`Trigger` (what fired, when, why), the
registry of the watchers running on this host (``registry_dir``: ``stallscope capture
--trigger`` finds them there) and the on-demand trigger itself (``trigger_watchers``).

Standard library only."""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import manifest as schema

PENDING = ".incident-pending"        # in the ring's staging folder while an incident's data are only there
TRIGGER_NAME = "stallscope.trigger"


def registry_dir() -> Path:
    """Where running watchers say who they are (``--trigger`` finds them there)."""
    if os.geteuid() == 0:
        return Path("/run/stallscope")
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"stallscope-{os.geteuid()}"


@dataclass
class Trigger:
    kind: str                  # hang | log | on-demand
    reason: str
    realtime_ns: int
    monotonic_ns: int
    pids: list[int] = field(default_factory=list)
    source: str | None = None

    def to_manifest(self) -> dict:
        return schema.TRIGGER.make(kind=self.kind, reason=self.reason, realtime_ns=self.realtime_ns,
                                   monotonic_ns=self.monotonic_ns, pids=self.pids, source=self.source)


# --------------------------------------------------------------------------- --trigger
def live_watchers() -> list[dict]:
    """The watchers running on this host, from their registry files (those of dead ones are
    removed: a SIGKILLed watcher cannot remove its own)."""
    out = []
    d = registry_dir()
    for f in sorted(d.glob("watch-*.json")) if d.is_dir() else []:
        try:
            info = json.loads(f.read_text())
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            f.unlink(missing_ok=True)          # that watcher is gone
            continue
        if b"capture" not in cmd and b"forensics" not in cmd:
            f.unlink(missing_ok=True)          # the pid was reused
            continue
        out.append(dict(info, pid=pid))
    return out


def trigger_watchers(reason: str, stderr=None) -> int:
    """``stallscope capture --trigger``: every watcher running on this host writes a bundle.
    The reason goes through each one's trigger file; SIGUSR1 wakes it. Returns how many."""
    err = stderr or sys.stderr
    n = 0
    for info in live_watchers():
        pid = info["pid"]
        try:
            tp = Path(info["trigger_file"])
            tmp = tp.with_name(f".{tp.name}.{os.getpid()}")
            tmp.write_text(reason + "\n")
            os.replace(tmp, tp)
            os.kill(pid, signal.SIGUSR1)
        except OSError as e:
            print(f"stallscope capture: watcher {pid}: {e}", file=err)
            continue
        print(f"stallscope capture: triggered watcher {pid} (bundles into {info.get('output')})", file=err)
        n += 1
    return n
