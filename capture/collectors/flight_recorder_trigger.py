"""Flight Recorder dumps through their pipes: one byte into ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>``
of every job process that sets it makes torch dump its Flight Recorder (``capture.torchfr``);
the dumps are then awaited (``--fr-dump-wait``) and attached by the attachments collector.
Triggered when the capture stops (torch dumps while the other collectors stop), awaited in
``finish``; the watcher triggers them at an incident.

Standard library only."""
from __future__ import annotations

import os
import time

from .. import torchfr
from .collector import Collector


class FlightRecorderTrigger(Collector):
    name = "flight-recorder-trigger"
    share = "attach"

    def __init__(self, session):
        super().__init__(session)
        self.pending: list = []
        self.deadline = 0.0

    def stop(self) -> None:
        self.pending = self.trigger()

    def finish(self) -> None:
        pending, self.pending = self.pending, []
        self.wait(pending)

    def trigger(self) -> list:
        """One byte into the debug pipe of every process whose environment sets
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE (capture.torchfr); what to wait for."""
        s = self.s
        pending, seen = [], set()
        for pid, info in sorted(s.procs.items()):
            e = info.env
            if not e.get(torchfr.PIPE_VAR):
                continue
            key = f"flight-recorder-trigger@pid{pid}"
            t0 = time.time_ns()
            rank = info.rank_facts()["rank"]
            shown, pipes = torchfr.pipe_paths(pid, e, rank)
            if not os.path.isdir(f"/proc/{pid}"):
                s.record(key, status="skipped", reason="process exited", started_ns=t0, ended_ns=t0, pipe=shown)
                continue
            if not pipes:
                s.record(key, status="skipped", started_ns=t0, ended_ns=t0, pipe=shown,
                         reason=f"no pipe {shown} in the process's file system: torch creates it only with a "
                         "trace buffer (TORCH_NCCL_TRACE_BUFFER_SIZE > 0; newer releases default to 2000)"
                         + ("" if rank is not None else "; RANK unknown"))
                continue
            before = {f: sig for f in torchfr.dump_files(pid, e, rank) if (sig := torchfr.file_sig(f))}
            results = []
            for path in pipes:
                real = os.path.realpath(path)
                if real in seen:
                    continue
                seen.add(real)
                results.append(torchfr.trigger(path))
            if not results:
                s.record(key, status="skipped", started_ns=t0, ended_ns=t0, pipe=shown,
                         reason="the same pipe as another process's, already written to")
                continue
            if not any(ok for ok, _ in results):
                # nobody reading (ENXIO): the process group that polled it is gone, nothing to ask
                idle = all(msg.startswith("nobody has the pipe open") for _, msg in results)
                s.record(key, status="skipped" if idle else "failed", started_ns=t0, ended_ns=time.time_ns(),
                         pipe=shown,
                         command=f"write 1 byte to {shown}", reason="; ".join(msg for _, msg in results))
                continue
            s.record(key, status="running", started_ns=t0, pipe=shown, command=f"write 1 byte to {shown}")
            pending.append(torchfr.Pending(key=key, pid=pid, rank=rank, shown=shown, triggered_ns=time.time_ns(),
                                           started_ns=t0, before=before, env=dict(e)))
        if pending:
            s.log(f"Flight Recorder dump requested from {len(pending)} process(es) through their pipes")
        self.deadline = time.monotonic() + s.o.fr_dump_wait_s
        return pending

    def wait(self, pending: list) -> None:
        """Until fr_dump_wait_s after the triggers: each dump new or changed and no longer growing."""
        s = self.s
        if not pending:
            return
        got = torchfr.wait_dumps(pending, self.deadline)
        for p in pending:
            path = got.get(p.key)
            if path:
                secs = (time.time_ns() - p.triggered_ns) / 1e9
                s.record(p.key, status="ok", rc=0, ended_ns=time.time_ns(), dump=path,
                         reason=f"dump written within {secs:.1f}s; attached under flight-recorder/")
            else:
                s.record(p.key, status="failed", ended_ns=time.time_ns(),
                         reason=f"triggered, but no new dump <prefix>{p.rank if p.rank is not None else '<rank>'} "
                         f"within {s.o.fr_dump_wait_s:g}s (prefixes: "
                         f"{', '.join(torchfr.dump_prefixes(p.pid, p.env))}); newer torch polls the pipe in "
                         "its heartbeat monitor thread, every TORCH_NCCL_COORD_CHECK_MILSEC (1 s) only "
                         "while dump-on-timeout is on, else every heartbeat timeout (minutes)")

