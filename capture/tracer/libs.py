"""The watcher's tracer with no blind window: the libraries it traces before a job maps them,
the ones it learns of when a process maps them, and restarts with overlap.

- **Ahead of time** (:class:`AheadOfTime`): at start and every ``libscan.SCAN_EVERY_S`` the
  host's libnccl files (``capture.tracer.libscan``: the linker cache, library folders, Python
  environments, image layers, running containers' roots) join the program's targets, at most
  ``program.MAX_NCCL_LIBS`` files in all (those processes map first; the rest in the order
  ``libscan.choose`` gives, the others listed in the record's ``libraries_left_out``: a
  process that maps one is traced when it maps it). A uprobe is per file: a job that maps a
  file traced already is traced from its first call, with no restart.
- **At its mapping**: the program's ``lib_map`` block (bpf/nccl.bt) prints a line when a
  process maps a libnccl whose inode it does not trace; the spool hands it over
  (``Spool.lib_maps``) and the tracer restarts at once, not at the next scan. With
  ``STALLSCOPE_HOLD`` on (``program.hold_setting``) the process is stopped in the kernel at that
  mmap and resumed here once the new program is attached (or after ``program.HOLD_MAX_S``).
- **Overlap** (:func:`overlap_restart`): the new program starts while the old one runs; once it
  is attached the old one's ring is printed and it is stopped. The records both programs made
  during the overlap are kept once (``capture.tracer.events``: the window is a
  ``tracer_overlap`` line in the spool; the key is the thread, the record's kind, process and
  fields, and entry times within ``events.DUP_NS``).

Standard library only.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time

from .. import children, procs
from ..libversion import nccl_version
from . import libscan, program
from ..elf import ElfError, exported_functions_cached

OLD_STOP_S = 30.0       # the longest wait for the old program to end after the overlap


def cudart_beside(nccl_path: str) -> list[str]:
    """The CUDA runtime files a process that maps ``nccl_path`` most likely maps too: the
    ``libcudart.so*`` in its folder (a toolkit's, an image's or an environment's lib/) and, for
    the PyPI wheels' layout (``nvidia/nccl/lib``), ``nvidia/cuda_runtime/lib``. A library
    traced before its process is known (ahead of time, or at its mapping) gets these too: the
    host waits after a launch are the calls the hang trigger reads (without them a thread
    waiting in the CUDA runtime looks idle, outside any call)."""
    folder = os.path.dirname(_real(nccl_path))
    found = sorted(glob.glob(os.path.join(folder, "libcudart.so*")))
    if os.path.basename(os.path.dirname(folder)) == "nccl":
        found += sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(folder)), "cuda_runtime", "lib",
                                               "libcudart.so*")))
    out: list[str] = []
    for path in found:
        real = _real(path)
        if os.path.isfile(real) and real not in out:
            out.append(real)
    return out


def _real(path: str) -> str:
    """``os.path.realpath``, except for a path through a process's root (``/proc/PID/root/...``,
    a container's mount namespace): resolved here, it would leave that root for ours, where
    the container's files are not (the magic link reads as ``/``)."""
    return path if path.startswith("/proc/") else os.path.realpath(path)


def add_cudart_beside(targets: program.TraceTargets, nccl_path: str) -> None:
    """``cudart_beside(nccl_path)``'s files that export CUDA runtime calls the tracer knows join
    ``targets.cudart`` (a file already there, by any path, is left as it is)."""
    for real in cudart_beside(nccl_path):
        if any(os.path.exists(k) and os.path.samefile(real, k) for k in targets.cudart):
            continue
        try:
            syms = set(exported_functions_cached(real)) & set(program.CUDART_SYMBOLS)
        except (OSError, ElfError):
            continue
        if syms:
            targets.cudart[real] = syms


class AheadOfTime:
    """The libraries the watcher traces whether or not a followed process maps them yet (see
    the module's text), and the processes held at their mapping. Does nothing outside ring
    mode (a capture traces what its processes map and --nccl-lib)."""

    def __init__(self, session):
        self.s = session
        self.enabled = bool(getattr(session.policy, "tracer_ring", False)) and not session.o.pids
        self.hold, self.hold_cgroup = program.hold_setting()
        self.found: list[libscan.FoundLib] | None = None
        self.mapped: dict[tuple, str] = {}       # (dev, inode) -> host path: seen at a process's mmap
        self.held: dict[int, float] = {}          # pid -> monotonic s by which it is resumed anyway
        self.held_at: dict[int, float] = {}       # pid -> monotonic s it was held at
        self.held_inos: dict[int, int] = {}       # inode of a library a process was held for -> that pid
        self.left_out: list[str] = []
        self.mapped_by: dict[tuple, int] = {}      # ... and the process seen mapping it (gone: forgotten)
        self.declined: set[tuple] = set()
        self.traced: set[tuple] = set()          # the libraries of the running program (kept over newcomers)        # libraries left out by the bound (no restart asked for them)
        self.next_scan = 0.0
        self.scanner: threading.Thread | None = None
        self.scanned: list[list[libscan.FoundLib]] = []     # a background scan's result, taken by poll
        self.ring = 0
        self.handovers: list[Handover] = []     # restarts with overlap under way
        self.overlaps: list[list[int]] = []     # their windows, once done (the record's ``overlaps``)

    # -------------------------------------------------------------- the program's targets
    def scan(self) -> list[libscan.FoundLib]:
        return libscan.scan(wanted=program.NCCL_SYMBOLS)

    def add_targets(self, targets: program.TraceTargets, covered: dict, versions: dict) -> None:
        """The files found ahead of time and at their mapping join ``targets`` (and ``covered``,
        by (dev, inode)) up to MAX_NCCL_LIBS files; the inodes traced, the hold."""
        if not self.enabled:
            return
        # a file gone under a live process (a job's folder removed while it runs): bpftrace refuses
        # the whole program for one attach point it cannot open
        for libs in (targets.nccl, targets.cudart, targets.cuda):
            for path in [p for p in libs if not os.path.isfile(p)]:
                del libs[path]
        for key in [k for k, p in covered.items() if p not in targets.nccl]:
            del covered[key]
        if self.found is None:
            self.found = self.scan()
            self.next_scan = time.monotonic() + libscan.SCAN_EVERY_S
        limit = max_libs()
        inos = {k[1] for k in covered}
        held = {i for i, p in self.held_inos.items() if os.path.isdir(f"/proc/{p}")}
        seen = [libscan.FoundLib(path=p, key=k, where="mapped", symbols=set(program.NCCL_SYMBOLS))
                for k, p in self.mapped.items() if k[1] not in inos]
        first = [f for f in seen if f.key[1] in held][:limit]       # a held process waits for these
        self.bound(targets, covered, limit - len(first))
        rest = [f for f in seen if f.key[1] not in held][:max(0, limit - len(targets.nccl) - len(first))]
        extra = first + rest
        chosen, out = libscan.choose([f for f in self.found if f.key not in covered],
                                     limit - len(targets.nccl) - len(extra))
        self.left_out = self.left_out + [f.path for f in out] + [f.path for f in seen if f not in extra]
        for f in extra + chosen:
            if f.key in covered:
                continue
            covered[f.key] = f.path
            targets.nccl.setdefault(f.path, set()).update(f.symbols or set(program.NCCL_SYMBOLS))
            add_cudart_beside(targets, f.path)
            v = nccl_version(f.path)
            if v:
                versions[f.path] = v
        self.traced = set(covered)
        targets.known_inodes = {k[1] for k in covered}
        for path in targets.nccl:
            try:
                targets.known_inodes.add(os.stat(path).st_ino)
            except OSError:
                pass
        targets.hold, targets.hold_cgroup = self.hold, self.hold_cgroup

    def bound(self, targets: program.TraceTargets, covered: dict, limit: int) -> None:
        """At most ``limit`` libraries of the followed processes: --nccl-lib's, those a held
        process waits for, those the running program traces (a running job stays traced), then
        those of the newest processes;
        the others are ``declined`` (no restart for them: their processes are untraced, the
        tracer-free trigger watches them) until a slot frees."""
        self.left_out = []
        limit = max(0, limit)
        if len(targets.nccl) <= limit:
            self.declined.clear()
            return
        newest: dict[tuple, int] = {}
        for info in self.s.procs.values():
            for lib in info.nccl_libs:
                newest[lib.key] = max(newest.get(lib.key, -1), info.start_ticks or 0)
        pinned = set()
        for p in self.s.o.nccl_libs:
            try:
                st = os.stat(os.path.realpath(p))
                pinned.add((st.st_dev, st.st_ino))
            except OSError:
                pass
        held = {i for i, p in self.held_inos.items() if os.path.isdir(f"/proc/{p}")}
        was = {k[1] for k in self.traced}
        order = sorted(covered, key=lambda k: (k not in pinned, k[1] not in held, k[1] not in was, -newest.get(k, -1)))
        for key in order[limit:]:
            path = covered.pop(key)
            if key in pinned:
                continue
            targets.nccl.pop(path, None)
            self.declined.add(key)
            self.left_out.append(path)

    def rendered(self, targets: program.TraceTargets, ring: int) -> None:
        self.ring = ring
        if self.enabled:
            self.s.record("tracer", libraries_ahead=sorted(f.path for f in self.found or []),
                          libraries_left_out=self.left_out[:50], hold=bool(targets.hold and ring))

    # -------------------------------------------------------------- while the watcher runs
    def poll(self, tracing, now: float) -> str | None:
        """The spool's lib_map events and the periodic scan: why to restart now, or None. Resumes
        the held processes whose library the running program covers, and any held too long."""
        if not self.enabled:
            return None
        why = []
        spool = tracing.spool
        events, spool.lib_maps[:] = (list(spool.lib_maps), []) if spool is not None else ([], [])
        inodes = {k[1] for k in tracing.covered} | {k[1] for k in self.mapped}
        for ev in events:
            pid, ino = int(ev.get("pid", 0)), int(ev.get("ino", 0))
            if ev.get("held") and pid not in self.held:
                self.held[pid] = now + hold_max_s()
                self.held_at[pid] = now
                self.held_inos[ino] = pid
            if ino in inodes:
                continue
            path = _mapped_path(pid, ino)
            if path is None:
                continue
            hp = procs.host_path(pid, path, ino)
            try:
                st = os.stat(hp)
            except OSError:
                continue
            self.mapped[(st.st_dev, st.st_ino)] = hp
            self.mapped_by[(st.st_dev, st.st_ino)] = pid
            inodes.add(ino)
            why.append(f"pid {pid} maps {hp}")
        if now >= self.next_scan and (self.scanner is None or not self.scanner.is_alive()):
            for key, pid in list(self.mapped_by.items()):
                if not os.path.isdir(f"/proc/{pid}"):
                    self.mapped.pop(key, None)
                    self.mapped_by.pop(key, None)
            self.next_scan = now + libscan.SCAN_EVERY_S
            # off the watcher's loop: a host with many containers takes seconds to look through
            self.scanner = threading.Thread(target=lambda: self.scanned.append(self.scan()), name="libscan",
                                            daemon=True)
            self.scanner.start()
        if self.scanned:
            self.found = self.scanned.pop()
            self.scanned.clear()
            inos = {k[1] for k in tracing.covered}
            new = [f.path for f in self.found if f.key[1] not in inos and f.path not in self.left_out]
            if new:
                why.append(f"found {', '.join(new[:3])}" + (f" (+{len(new) - 3})" if len(new) > 3 else ""))
        ready = spool is not None and spool.ready.is_set() and tracing.alive()
        done = [h for h in self.handovers if not h.is_alive()]
        if done:
            self.handovers = [h for h in self.handovers if h.is_alive()]
            self.overlaps = (self.overlaps + [h.window for h in done if h.window])[-50:]
            self.s.record("tracer", overlaps_monotonic_ns=list(self.overlaps))
        for pid, due in list(self.held.items()):
            if now >= due or (ready and not why and self._covered(pid, tracing)):
                self.resume(pid, late=now >= due)
        return "; ".join(why)[:1000] or None

    def _covered(self, pid: int, tracing) -> bool:
        try:
            libs, _ = procs.mapped_libs(pid, program.NCCL_SYMBOLS)
        except OSError:
            return True
        return all(tracing.covers(lib) for lib in libs.get("nccl", []))

    def busy(self) -> bool:
        """A restart with overlap whose new program is not attached yet (no other restart until
        then; the old program's stop may go on beside the next restart)."""
        return any(h.is_alive() and not h.attached.is_set() for h in self.handovers)

    def restarted(self, tracing) -> None:
        """After a restart: the held processes whose library is covered now go on (once the new
        program is attached: :meth:`poll`)."""
        if tracing.alive() and tracing.spool is not None and tracing.spool.ready.is_set() and not self.busy():
            for pid in list(self.held):
                if self._covered(pid, tracing):
                    self.resume(pid)

    def resume(self, pid: int, late: bool = False) -> None:
        self.held.pop(pid, None)
        since = self.held_at.pop(pid, None)
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            return
        if since is not None:
            self.s.log(f"pid {pid} resumed after {time.monotonic() - since:.1f}s held at its libnccl's mapping"
                       + (" (not covered: the hold's limit)" if late else " (traced from its first call)"))
        if late:
            self.s.notes.append(f"pid {pid} resumed after {hold_max_s():g}s held at its libnccl's mapping "
                                "without the tracer covering it")

    def resume_all(self) -> None:
        for pid in list(self.held):
            self.resume(pid)


def hold_max_s() -> float:
    """program.HOLD_MAX_S, or ``STALLSCOPE_HOLD_MAX_S``."""
    try:
        return max(1.0, float(os.environ.get("STALLSCOPE_HOLD_MAX_S", program.HOLD_MAX_S)))
    except ValueError:
        return program.HOLD_MAX_S


def max_libs() -> int:
    """How many NCCL library files one program traces: program.MAX_NCCL_LIBS, or
    ``STALLSCOPE_MAX_NCCL_LIBS`` (a shared test machine whose other jobs should not fill it)."""
    try:
        return max(1, int(os.environ.get("STALLSCOPE_MAX_NCCL_LIBS", program.MAX_NCCL_LIBS)))
    except ValueError:
        return program.MAX_NCCL_LIBS


def _mapped_path(pid: int, ino: int) -> str | None:
    """The path /proc/PID/maps names for the file of inode ``ino`` (None if none)."""
    try:
        for path, _dev, inode in procs.mappings(pid):
            if inode == ino:
                return path
    except (OSError, ValueError):
        return None
    return None


def overlap_restart(tracing, t0: int) -> dict | None:
    """Restart the ring-mode tracer with overlap (the module's text): the new program started
    into the same spool at once; a thread (:class:`Handover`) waits for it to attach, has the
    old one's ring printed and stops it, so the watcher's loop never waits. Returns what the
    restart record adds (``overlap``: true); None when it does not apply (no old program
    running, not ring mode): the caller then stops the old one first. A new program that does
    not attach is stopped and the old one kept."""
    s = tracing.s
    old, spool = tracing.proc, tracing.spool
    if old is None or old.poll() is not None or spool is None or not (s.records.get("tracer") or {}).get("ring_slots"):
        return None
    h = Handover(tracing, old, tracing.stderr_fh, dict(tracing.covered))
    tracing.start_tracer(restart=True, overlap=True)
    h.start()
    tracing.libs.handovers.append(h)
    return {"overlap": True}


class Handover(threading.Thread):
    """The second half of a restart with overlap, off the watcher's loop: the new program
    attached, the old ring printed, the old program stopped, the window marked in the spool
    (``tracer_overlap``), the held processes resumed. ``window``: CLOCK_MONOTONIC ns [the
    new program's launch, the old one's end]."""

    def __init__(self, tracing, old, old_err, old_covered):
        super().__init__(name="tracer-handover", daemon=True)
        self.tracing, self.old, self.old_err, self.old_covered = tracing, old, old_err, old_covered
        self.old_stream = old.stdout
        self.launch_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)   # its probes record from their attach on
        self.window: list[int] | None = None
        self.failed = False
        self.attached = threading.Event()    # the new program attached (or failed): another restart may start

    def run(self) -> None:
        tr = self.tracing
        s, spool, new = tr.s, tr.spool, tr.proc
        deadline = time.monotonic() + s.o.ready_timeout_s + 0.5 * program.MAX_NCCL_LIBS * 41
        while time.monotonic() < deadline and not spool.ready.is_set() and new.poll() is None \
                and not s.stop_evt.is_set():
            time.sleep(0.05)
        if not spool.ready.is_set():                 # the new program failed: keep the old one
            self.failed = True
            self.attached.set()
            children.stop(new, signal.SIGINT, grace_s=5)
            if tr.proc is new:
                tr.stderr_fh.close()
                tr.proc, tr.stderr_fh, tr.covered = self.old, self.old_err, self.old_covered
            s.notes.append("tracer restart: the new program did not attach; the old one ran on")
            return
        self.attached.set()
        dumps = spool.ring_dumps
        program.trigger_dump()                        # the old ring's records (and the new one's, kept once)
        end = time.monotonic() + 5.0
        while spool.ring_dumps < dumps + 2 and time.monotonic() < end and self.old.poll() is None:
            time.sleep(0.05)
        children.kill_group(self.old, signal.SIGINT)
        end = time.monotonic() + OLD_STOP_S
        while time.monotonic() < end and not spool.drained(self.old_stream):
            time.sleep(0.05)
        children.stop(self.old, signal.SIGINT, grace_s=5)
        self.old_err.close()
        self.window = [self.launch_ns, time.clock_gettime_ns(time.CLOCK_MONOTONIC)]
        spool.mark(json.dumps({"ev": "tracer_overlap", "t0": self.window[0], "t1": self.window[1]},
                              separators=(",", ":")))
