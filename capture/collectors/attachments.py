"""Attachments: the files a hang investigation reads beside the captured data, copied into the
bundle at the end: ``--attach`` globs, each job process's ``NCCL_DEBUG_FILE``, its stdout/stderr
when they are files (a launcher's or a Slurm job's output: the watchdog and NCCL WARN lines),
and Flight Recorder dumps. Smallest first, each at most an equal share of what is left, so one
huge log cannot leave the other ranks' logs nothing; a job's own output is attached from its end.

Standard library only."""
from __future__ import annotations

import glob
import os
import shlex
import stat
import time
from pathlib import Path

from .. import bundle_files as bd
from .. import torchfr
from .collector import Collector

JOB_OUTPUT_TAIL = 64 << 20       # of a traced process's stdout/stderr file, the last part attached


class Attachments(Collector):
    name = "attachments"
    share = "attach"

    def __init__(self, session) -> None:
        super().__init__(session)
        self.owners: dict[str, int] = {}     # path -> the process whose output it is (sources' last call)

    def finish(self) -> None:
        self.collect()

    def sources(self, dumps: bool = True) -> tuple[list[tuple[str, str]], list[str]]:
        """(path, why) of files to attach, and patterns that matched nothing; ``dumps=False``:
        without the Flight Recorder dumps (the watcher's log trigger). ``owners`` gets, for each
        path found through a process (its stdout or stderr, its NCCL_DEBUG_FILE, its dumps), that
        process: the watcher's log trigger names it."""
        s = self.s
        found, missing = [], []
        owner: dict[str, int] = {}
        for pat in s.o.attach:
            hits = sorted(glob.glob(pat)) or ([pat] if os.path.isfile(pat) else [])
            if not hits:
                missing.append(pat)
            found += [(h, "--attach") for h in hits if os.path.isfile(h)]
        for pid, info in s.procs.items():
            e = info.env
            root = f"/proc/{pid}/root"
            cwd = f"/proc/{pid}/cwd"

            def resolve(p):
                base = p if p.startswith("/") else os.path.join(cwd, p)
                return base if os.path.exists(os.path.dirname(base) or "/") else root + p
            # the job's own output, where its stdout or stderr is a file (a launcher's log, a Slurm
            # job's output file): watchdog timeouts and NCCL WARN lines land there; read through
            # /proc/PID/fd, so a file of another mount namespace is found too
            for fd in (1, 2):
                link = f"/proc/{pid}/fd/{fd}"
                try:
                    if stat.S_ISREG(os.stat(link).st_mode):
                        found.append((link, f"{'stdout' if fd == 1 else 'stderr'} of pid {pid} ({os.readlink(link)})"))
                        owner[link] = pid
                except OSError:
                    pass
            dbg = e.get("NCCL_DEBUG_FILE")
            if dbg:
                pat = resolve(dbg.replace("%h", "*").replace("%p", str(pid)))
                hits = sorted(glob.glob(pat))
                found += [(h, f"NCCL_DEBUG_FILE of pid {pid}") for h in hits]
                owner.update(dict.fromkeys(hits, pid))
            # dumps that exist, whatever enabled them: <prefix><rank> for every prefix this torch may
            # use (TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE or the defaults); every
            # rank's <prefix><n> when the rank is unknown (capture.torchfr)
            if dumps:
                hits = torchfr.dump_files(pid, e, info.rank_facts()["rank"])
                found += [(h, f"Flight Recorder dump of pid {pid}") for h in hits]
                owner.update(dict.fromkeys(hits, pid))
        seen, out = set(), []
        for path, why in found:
            try:
                st = os.stat(path)
                real = (st.st_dev, st.st_ino)      # the same file through /proc/PID/fd and its own path
            except OSError:
                real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                out.append((path, why))
        self.owners = {p: owner[p] for p, _ in out if p in owner}
        return out, missing

    def collect(self) -> None:
        s = self.s
        key = "attachments:end"
        t0 = time.time_ns()
        sources, missing = self.sources()
        if not sources and not missing:
            s.record(key, status="skipped", reason="nothing to attach (no --attach, no NCCL_DEBUG_FILE or "
                     "Flight Recorder dumps in the processes' environment)", started_ns=t0, ended_ns=t0)
            return
        files, notes = [], []

        def size(src: tuple[str, str]) -> int:
            try:
                return os.path.getsize(src[0])
            except OSError:
                return 0
        # smallest first, each at most an equal share of what is left: one huge log
        # cannot leave the other ranks' logs nothing
        sources = sorted(sources, key=size)
        for n_left, (path, why) in zip(range(len(sources), 0, -1), sources):
            try:
                with open(path, "rb") as fh:
                    head = fh.read(4096)
                name = os.path.basename(path)
                job_output = why.startswith(("stdout of pid", "stderr of pid"))
                if job_output:                     # /proc/PID/fd/N: named after the stream, pid and file
                    target = os.path.basename(why.split("(", 1)[1].rstrip(")")) if "(" in why else "out"
                    name = f"job-{why.split()[0]}-{why.split()[3]}-{target}"
                if head[:1] == b"\x80" or "nccl_trace_rank" in name or why.startswith("Flight Recorder"):
                    folder = "flight-recorder"
                elif b"nccl-tests" in head or b"Avg bus bandwidth" in head or b"# nThread" in head:
                    folder = "nccl-tests"
                else:
                    folder = "logs"
                dst = s.staging / folder / name
                i = 1
                while dst.exists():
                    dst = s.staging / folder / f"{i}-{name}"
                    i += 1
                if job_output:
                    # the job's own output may be gigabytes: its last part is what tells the stall
                    with open(path, "rb") as fh:
                        size = os.fstat(fh.fileno()).st_size
                        fh.seek(max(0, size - JOB_OUTPUT_TAIL))
                        data = fh.read(JOB_OUTPUT_TAIL)
                    if size > JOB_OUTPUT_TAIL:
                        notes.append(f"{path} ({why}): its last {JOB_OUTPUT_TAIL >> 20} MiB of {size} bytes attached")
                else:
                    data = Path(path).read_bytes()
                if folder == "flight-recorder":
                    grant = s.budget.take(len(data) + 1024, "attach")
                    if grant < len(data) + 1024:
                        s.budget.give_back(grant, "attach")
                        notes.append(f"{path}: not attached ({len(data)} bytes exceed the byte budget)")
                        continue
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_bytes(data)
                else:
                    share = max(0, s.budget.room("attach") // n_left - 2 * bd.TAR_BLOCK)
                    _, trunc = bd.write_capped(dst, data, s.budget, min(64 << 20, share), pool="attach",
                                               keep_head=True)
                    if trunc:
                        notes.append(f"{path}: cut in the middle to fit the byte budget (its start and end kept)")
                files.append({"source": path, "path": s.rel(dst), "why": why})
            except OSError as e:
                notes.append(f"{path}: {e.strerror}")
        status = "failed" if missing else "ok"
        reason = "; ".join(([f"no file matches {m!r}" for m in missing]) + notes) or None
        s.record(key, status=status, reason=reason, command="copy " + " ".join(shlex.quote(s) for s, _ in sources),
                 rc=0, files=[f["path"] for f in files], sources=files, started_ns=t0, ended_ns=time.time_ns())

