"""Snapshots: the ``start`` and ``end`` rows of ``capture.collectors.specs`` (ss, ip, counters,
sysctl, dmesg, nvidia-smi, py-spy, thread states ...), each run once per scope (the host, each
network namespace of the job, each interface NCCL uses, each process), concurrently in the
session's pool. Namespaces, interfaces and processes found later get their ``start`` snapshots
when found; a snapshot already taken is never taken again (its file is never overwritten).

Standard library only."""
from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

from .. import bundle_files as bd
from .. import children
from ..session import tail
from . import specs
from .collector import Collector


class Snapshots(Collector):
    """Runs the snapshot specs: ``start`` rows when the capture starts and as scopes appear,
    ``end`` rows in ``finish`` (after the continuous collectors stopped)."""

    name = "snapshots"

    def __init__(self, session):
        super().__init__(session)
        self.started: set[str] = set()      # instance keys already run (each once)

    def start(self) -> None:
        self.submit(self.jobs("start"))

    def adopt(self, fresh, new_ns, new_ifaces) -> None:
        if new_ifaces:
            self.submit(self.jobs("start", ifaces=new_ifaces))
        if new_ns:
            self.submit(self.jobs("start", nss=new_ns))
        if fresh:
            self.submit(self.jobs("start", pids=[i.pid for i in fresh]))

    def finish(self) -> None:
        """The start snapshots still running finish (60 s at most), then the end ones start."""
        self.s.wait_pool(timeout=60)
        self.take("end")

    def take(self, phase: str) -> None:
        """Every scope's snapshots of ``phase``, submitted to the session's pool."""
        self.submit(self.jobs(phase))

    def jobs(self, phase: str, nss=None, ifaces=None, pids=None):
        """(collector, context) pairs of a phase. With no scope given: every scope; with some
        given (a namespace, interface or process found later): only those, so the snapshots
        already taken are not taken again (a second run would overwrite the first one's file
        with whatever budget is left)."""
        s = self.s
        limited = nss is not None or ifaces is not None or pids is not None
        if not limited:
            nss = list(s.netns.values())
            ifaces = [(ns, i) for ns in s.netns.values() for i in ns.ifaces]
            pids = list(s.procs)
        jobs = []
        for c in specs.SPECS:
            if phase not in c.when:
                continue
            if c.scope == "host" and not limited:
                jobs.append((c, {"pid": "self", "ns": s.jobs.own(), "phase": phase,
                                 "procs": dict(s.procs)}))
            elif c.scope == "netns":
                for ns in nss or ():
                    jobs.append((c, {"pid": ns.pid, "ns": ns, "phase": phase}))
            elif c.scope == "iface":
                for ns, iface in ifaces or ():
                    jobs.append((c, {"pid": ns.pid, "ns": ns, "iface": iface, "phase": phase}))
            elif c.scope == "process":
                for pid in pids or ():
                    info = s.procs[pid]
                    if c.python_only and not info.python:
                        continue
                    jobs.append((c, {"pid": pid, "ns": s.jobs.ensure_netns(info.netns_inode, pid), "phase": phase}))
        return jobs

    def submit(self, jobs) -> None:
        for c, ctx in jobs:
            if c.when == ("continuous",) or c.name in ("attachments", "flight-recorder-trigger"):
                continue
            self.s.submit(self.run_snapshot, c, ctx)

    def instance_key(self, c: specs.Spec, ctx: dict) -> str:
        key = c.name
        if c.scope in ("netns", "iface"):
            key += f"@{ctx['ns'].label}"
        if c.scope == "iface":
            key += f"/{ctx['iface']}"
        if c.scope == "process":
            key += f"@pid{ctx['pid']}"
        return f"{key}:{ctx['phase']}"

    def run_snapshot(self, c: specs.Spec, ctx: dict) -> None:
        s = self.s
        key = self.instance_key(c, ctx)
        with s.lock:   # each snapshot once: a file already written is never overwritten
            if key in self.started:
                return
            self.started.add(key)
        t0 = time.time_ns()
        reason = s.skip_reason(c)
        ns = ctx.get("ns")
        if reason is None and ns is not None and not ns.own and c.argv and not s.is_root:
            reason = "entering another network namespace needs root"
        if reason is None and c.scope in ("netns", "iface") and ns is not None:
            live = s.live_pid(ns)
            if live is None:
                reason = "network namespace gone (its processes exited)"
            else:
                ctx = dict(ctx, pid=live)
        if reason is None and c.scope == "process" and not os.path.isdir(f"/proc/{ctx['pid']}"):
            reason = "process exited"
        if reason:
            s.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=time.time_ns())
            return
        out = s.staging / s.fill(c.out, ctx)
        try:
            if c.argv:
                argv = s.ns_prefix(ns) + [s.fill(a, ctx) for a in c.argv]
                s.record(key, command=shlex.join(argv), started_ns=t0)
                rc, so, se = children.run(argv, timeout=c.timeout_s)
                n, trunc = bd.write_capped(out, so, s.budget, c.per_file_max)
                status = "ok" if rc in c.ok_rc else ("skipped" if c.optional else "failed")
                reason = None
                if rc is None:
                    status = "failed"
                    reason = f"still running after {c.timeout_s:g}s: killed (its output so far is kept)"
                elif status != "ok":
                    reason = (f"{c.optional}: " if c.optional else "") + f"exit code {rc}"
                    if ns is not None and not ns.own and s.live_pid(ns) is None:
                        status, reason = "skipped", "network namespace gone (its processes exited)"
                if trunc:
                    reason = ((reason + "; ") if reason else "") + "output truncated to the byte budget"
                t1 = time.time_ns()      # a snapshot covers the time its command ran
                s.record(key, status=status, reason=reason, rc=rc, files=[s.rel(out)] if n or out.exists() else [],
                         stderr_tail=tail(se), ended_ns=t1, covered_ns=[t0, t1] if status == "ok" else None)
                return
            fn = getattr(specs, c.func)
            s.record(key, command=f"stallscope:{c.func}({ctx.get('pid', '')})", started_ns=t0)
            try:
                data = fn(ctx)
            except FileNotFoundError:
                if c.scope in ("netns", "iface") and ns is not None and s.live_pid(ns) is None:
                    raise LookupError("network namespace gone (its processes exited)") from None
                raise
            if isinstance(data, bytes):
                data = {"": data}
            files, truncated = [], False
            for suffix, blob in data.items():
                if c.out.endswith(("/{phase}",)) or suffix.startswith("/"):
                    path = Path(str(out) + suffix)
                else:
                    stem, dot, ext = str(out).rpartition(".")
                    path = Path(f"{stem}{suffix}.{ext}") if dot else Path(str(out) + suffix)
                _, t = bd.write_capped(path, blob, s.budget, c.per_file_max)
                truncated |= t
                files.append(s.rel(path))
            t1 = time.time_ns()
            s.record(key, status="ok", rc=0, files=files, ended_ns=t1, covered_ns=[t0, t1],
                     reason="output truncated to the byte budget" if truncated else None)
        except LookupError as e:   # does not apply here (no IB devices, ...)
            s.record(key, status="skipped", reason=str(e).strip("'\""), ended_ns=time.time_ns())
        except Exception as e:  # noqa: BLE001 - a collector failing must not stop the capture
            s.record(key, status="failed", reason=f"{type(e).__name__}: {e}", ended_ns=time.time_ns())
