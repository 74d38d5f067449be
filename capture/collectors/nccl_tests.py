"""``--nccl-tests CMD``: a command (an nccl-tests binary, usually under mpirun) run beside the
capture, its output kept as an attachment (at most half the attachments' part, 16 MiB) and
stopped at the end if still running.

Standard library only."""
from __future__ import annotations

import shlex
import signal
import subprocess
import threading
import time

from .. import bundle_files as bd
from .. import children
from .collector import Collector


class NcclTests(Collector):
    name = "nccl-tests"
    share = "attach"

    def __init__(self, session):
        super().__init__(session)
        self.run: dict | None = None

    def start(self) -> None:
        s = self.s
        if not s.o.nccl_tests:
            return
        out = s.staging / "nccl-tests" / "output.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        limit = s.budget.take(min(16 << 20, max(64 << 10, s.budget.attach // 2)), "attach")
        argv = ["sh", "-c", s.o.nccl_tests]
        proc = children.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        result = {"proc": proc, "out": out, "bytes": 0, "truncated": False, "errors": []}

        def pump():
            result["bytes"], result["truncated"] = bd.stream_copy(proc.stdout, out, limit, result["errors"])
        th = threading.Thread(target=pump, daemon=True)
        th.start()
        result["thread"] = th
        self.run = result
        s.record(self.name, status="running", command=shlex.join(argv), started_ns=time.time_ns(),
                 files=[s.rel(out)])

    def stop(self) -> None:
        t, s = self.run, self.s
        if not t:
            return
        self.run = None
        finished = t["proc"].poll() is not None
        rc = children.stop(t["proc"], signal.SIGINT, grace_s=3)
        t["thread"].join(timeout=5)
        reason = None if finished else "still running at the end of the capture: stopped"
        if t["errors"]:
            reason = ((reason + "; ") if reason else "") + "; ".join(t["errors"])
        elif t["truncated"]:
            reason = ((reason + "; ") if reason else "") + "output truncated to the byte budget"
        status = "ok" if (rc == 0 or not finished) else "failed"
        if finished and rc != 0:
            reason = f"exit code {rc}"
        t1 = time.time_ns()
        s.record(self.name, status=status, rc=rc, reason=reason, ended_ns=t1,
                 covered_ns=[s.records[self.name]["started_ns"], t1])
