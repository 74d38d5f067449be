"""An incident's bundle, cut from the watcher's rings (``capture.watch.watcher``) in two stages. At the
trigger (:meth:`IncidentWriter.write_first`) the rings' last ``--before`` are copied into the
incident's own staging folder, the state of the job is taken then (the snapshots of a capture's
end, native stacks for a hang, Flight Recorder dumps through their pipes, the logs), and the
bundle is written at once with ``"trigger"`` and ``"watch"`` (``stage`` first) in its manifest.
``--after`` later (:meth:`IncidentWriter.complete`) the same archive is completed with what the
rings and logs hold since and the stall's outcome (``watch.stall``); every file of the first
archive is kept (module functions ``merge_into``, ``replace_if_superset``). While it is made,
the session's staging folder, records, budget and notes are the incident's; the rings go on
meanwhile.

Standard library only."""
from __future__ import annotations

import copy
import os
import re
import shutil
import tarfile
import threading
import time
from pathlib import Path

from .. import bundle_files as bd
from .. import manifest as schema
from ..options import CaptureFailed
from ..policy import ring_previous
from ..session import clock_sample, utc_span
from ..staging import DISK_FULL, STAGED_MANIFEST, fit_budget, lock_staging, tcpdump_files
from ..tracer import events, program
from .monitors import RingMonitor
from .triggers import PENDING, Trigger

RING_DUMP_WAIT_S = 10.0              # the completion waits this long for the tracer's ring dump to be spooled
# the first archive waits at most this long for the ring's dump and for Flight Recorder dumps (a
# rank that diverged may never answer; a tracer behind on a loaded host): what comes later goes
# into the completion
FIRST_WAIT_S = 3.0


class IncidentWriter:
    """Writes one incident's bundle for the watcher ``w`` (its capture, packet ring, folder)."""

    def __init__(self, w):
        self.w = w
        self.s = w.s
        self.o = w.o
        self.window0 = 0                # UTC ns: the start of the incident's window

    def write_first(self, inc: dict) -> None:
        """Stage one, at the trigger: the bundle of ``inc`` from the rings' last ``--before`` and
        the state of the job now (stacks, snapshots, Flight Recorder dumps, logs): a complete,
        analysable archive at once. Its staging folder is kept (``inc["first"]`` of the
        watcher's incident gets it) for :meth:`complete`; the watcher's ``bundles`` gets its path
        (None when it could not be written)."""
        s, w = self.s, self.w
        first: Trigger = inc["first"]
        w0_real = first.realtime_ns - int(self.o.before_s * 1e9)
        self.window0 = w0_real
        try:
            out = bd.choose_output(str(w.folder) + os.sep, s.host, first.realtime_ns)
        except (FileExistsError, FileNotFoundError) as e:
            s.log(f"incident not written: {e}")
            w.bundles.append(None)
            inc["staged"] = None
            return
        arcroot = out.name[: -len(".tar.gz")]
        dest = w.folder / f".{arcroot}.staging-{os.getpid()}"
        snap = w.cap.collector("snapshots")
        saved = (s.staging, s.records, snap.started, s.budget, s.notes, s.futures)
        lock, ok = None, False
        try:
            dest.mkdir(parents=True)
            lock = lock_staging(dest)
            collectors = copy.deepcopy(s.records)
            took = [("state", time.monotonic())]
            # the ring's dump and the packets' flush run while the state is taken (each ~1 s)
            dump = start_dump(w)
            flush = threading.Thread(target=w.packets.flush, name="stallscope-flush", daemon=True)
            flush.start()
            s.staging, s.records, snap.started = dest, collectors, set()
            s.budget = bd.Budget.plan(self.o.max_bytes, pcap=self.o.pcap, tracer=self.o.bpf)
            s.notes, s.futures = list(saved[4]), []
            inc["fr_pending"] = self.state_at_trigger(first, fr_wait_s=FIRST_WAIT_S)
            took.append(("ring dump", time.monotonic()))
            wait_dump(w, dump, FIRST_WAIT_S)          # the records up to now
            flush.join()                           # the packets up to now onto the ring files
            took.append(("copy", time.monotonic()))
            pcap_files = self.copy_rings(dest, w0_real / 1e9, src=saved[0])
            took.append(("records", time.monotonic()))
            self.finish_copied(dest, pcap_files, saved[0])
            took.append(("archive", time.monotonic()))
            manifest = self.manifest(inc, w0_real, stage="first")
            self.archive(dest, out, arcroot, manifest, level=1)    # fast: gzip -1 (the completion: -6)
            written = time.time_ns()
            took.append(("", time.monotonic()))
            inc["staged"] = {"out": out, "dest": dest, "arcroot": arcroot, "records": s.records, "notes": s.notes,
                             "budget": s.budget, "window0": w0_real, "written_ns": written}
            w.bundles.append(out)
            ok = True
            steps = ", ".join(f"{a} {t1 - t0:.1f}s" for (a, t0), (_, t1) in zip(took, took[1:]))
            s.log(f"incident bundle {out} ({out.stat().st_size} bytes) in {took[-1][1] - took[0][1]:.1f}s ({steps}): "
                  f"{first.kind}: {first.reason}; completed with the {self.o.after_s:g}s after the trigger at its end")
        except Exception as e:  # noqa: BLE001 - the watcher goes on; what was copied stays for --recover
            w.bundles.append(None)
            inc["staged"] = None
            s.log(f"incident bundle not written ({type(e).__name__}: {e}); what was copied is kept in {dest}")
        finally:
            if lock is not None:
                lock.close()
            s.staging, s.records, snap.started, s.budget, s.notes, s.futures = saved
            if not ok:
                w.last_incident_end = time.monotonic()
                (s.staging / PENDING).unlink(missing_ok=True)

    def complete(self, inc: dict) -> None:
        """Stage two, ``--after`` later: the first archive completed with the after-window (the
        rings since, the logs as they are now) and the stall's outcome (``watch.stall``). What
        the first held stays: the new copies go into a scratch folder and are merged into the
        first's staging folder (a file the first had is replaced only by a longer copy of itself,
        the tracer's records are rebuilt from both copies of its raw output), and the new archive
        replaces the first only when it holds every member of it at least as long; otherwise it is
        written beside it. The watcher's ``bundles`` keeps the first's path (or gets the new one)."""
        s, w = self.s, self.w
        st = inc.get("staged")
        try:
            if st is None:
                return
            self.window0 = st["window0"]
            dest, out = st["dest"], st["out"]
            scratch = dest.with_name(dest.name.replace(".staging-", ".after-"))
            snap = w.cap.collector("snapshots")
            saved = (s.staging, s.records, snap.started, s.budget, s.notes, s.futures)
            lock = None
            try:
                lock = lock_staging(dest)
                scratch.mkdir(parents=True)
                dump_ring(w, wait_s=RING_DUMP_WAIT_S)
                w.packets.flush()
                pcap_files = self.copy_rings(scratch, self.window0 / 1e9, src=saved[0])
                s.staging, s.records, snap.started = scratch, copy.deepcopy(st["records"]), set()
                s.budget, s.notes, s.futures = st["budget"], list(st["notes"]), []
                late = [p for p in inc.get("fr_pending") or () if s.records.get(p.key, {}).get("status") != "ok"]
                if late:                                             # Flight Recorder dumps that came late
                    fr = w.cap.collector("flight-recorder-trigger")
                    fr.deadline = time.monotonic() + FIRST_WAIT_S
                    fr.wait(late)
                w.cap.collector("attachments").collect()          # the logs, with what followed the trigger
                s.wait_pool(timeout=120)
                merge_raw(dest / ".raw", scratch / "bpf" / "raw")
                self.finish_copied(scratch, pcap_files, saved[0])
                merge_into(scratch, dest)
                s.staging = dest
                manifest = self.manifest(inc, self.window0, stage="complete", first_written_ns=st["written_ns"])
                tmp = dest.parent / f".{out.name}.complete-{os.getpid()}"
                self.archive(dest, tmp, st["arcroot"], manifest)
                final = replace_if_superset(tmp, out)
                if final != out:
                    w.bundles.append(final)
                    s.log(f"incident bundle {out}: its completion is {final} (the first is kept as it was)")
                else:
                    s.log(f"incident bundle {out} completed ({out.stat().st_size} bytes): {stall_words(inc)}")
                shutil.rmtree(dest, ignore_errors=True)
            except Exception as e:  # noqa: BLE001 - the first archive stands; what was copied stays
                s.log(f"incident bundle {out}: not completed ({type(e).__name__}: {e}); the first archive stands")
            finally:
                if lock is not None:
                    lock.close()
                shutil.rmtree(scratch, ignore_errors=True)
                s.staging, s.records, snap.started, s.budget, s.notes, s.futures = saved
        finally:
            w.last_incident_end = time.monotonic()
            (s.staging / PENDING).unlink(missing_ok=True)

    def manifest(self, inc: dict, w0_real: int, stage: str, first_written_ns: int | None = None) -> dict:
        """The incident bundle's manifest at ``stage`` (first | complete)."""
        s, w = self.s, self.w
        first: Trigger = inc["first"]
        s.clock.append(clock_sample())
        for rec in s.records.values():
            if rec.get("status") == "running":
                rec["status"] = "ok"
        manifest = w.cap.manifest_dict(time.time_ns(), s.jobs.process_facts(s.staging), partial=False)
        extra = {} if first_written_ns is None else {"first_written_ns": first_written_ns}
        stall = inc.get("stall")
        if stall is not None:
            extra["stall"] = schema.STALL.make(**{k: v for k, v in stall.items() if not k.startswith("_")})
        manifest.update(schema.TOP.make(
            trigger=dict(first.to_manifest(),
                         **schema.TRIGGER.make(also=[t.to_manifest() for t in inc["triggers"][1:]][:50])),
            watch=schema.WATCH.make(
                started_ns=s.started_ns, before_s=self.o.before_s, after_s=self.o.after_s,
                hang_after=w.hang_after_text(), ring_bytes=self.o.ring_bytes,
                window_ns=[w0_real, time.time_ns()], watcher_pid=os.getpid(),
                pcap_ring=schema.PCAP_RING.make(mode=w.packets.mode(), linger_s=w.packets.linger_s,
                                                runs=[r for r in w.packets.runs
                                                      if r.get("stopped_ns", time.time_ns()) >= w0_real]),
                stage=stage, **extra)))
        manifest["options"].update(schema.OPTIONS.make(watch=True))
        job = s.jobs.job_of(first.pids or [])     # the job that hung, and the others followed
        if job is not None:
            manifest["job"] = job
        return manifest

    def archive(self, dest: Path, out: Path, arcroot: str, manifest: dict, level: int = 6) -> None:
        try:
            fit_budget(dest, out, arcroot, manifest, self.o.max_bytes, level=level)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            raise CaptureFailed(f"cannot write {out}: {e.strerror}; kept in {dest}") from None

    def copy_rings(self, dest: Path, w0: float, src: Path) -> list[tuple[dict, list[Path]]]:
        """The rings' files (in the watch's staging folder ``src``) that hold data from w0 (epoch
        s) on, copied into dest; the start snapshots and logs of the watch copied whole. Returns
        each tcpdump's copies, oldest first."""
        skip = {STAGED_MANIFEST, ".lock", PENDING, ".manifest.staged.tmp"}
        ring_pcaps = set()
        pcaps = []
        for t in list(self.w.packets.tcpdumps.values()) + self.w.packets.done:
            if not t.get("out"):
                continue
            files = [f for f in tcpdump_files(t["out"])
                     if re.fullmatch(re.escape(t["out"].name) + r"\d*", f.name)]
            ring_pcaps.update(files)
            live = []
            for f in files:
                try:
                    st = f.stat()
                except OSError:
                    continue
                if st.st_mtime >= w0:
                    live.append((st.st_mtime_ns, f))
            copies = []
            stem = t["out"].name[:-5] if t["out"].name.endswith(".pcap") else t["out"].name
            for i, (_, f) in enumerate(sorted(live)):
                name = f"{stem}-{i:03d}.pcap" if len(live) > 1 else f"{stem}.pcap"
                d = dest / t["out"].parent.relative_to(src) / name
                d.parent.mkdir(parents=True, exist_ok=True)
                try:
                    shutil.copyfile(f, d)
                    copies.append(d)
                except OSError:
                    pass
            pcaps.append((t, copies))
        raw = src / "bpf" / "raw"
        for p in sorted(src.rglob("*")):
            if not p.is_file() or p.name in skip or p in ring_pcaps:
                continue
            rel = p.relative_to(src)
            if raw in p.parents:
                if p.name.startswith("seg-"):
                    try:
                        if p.stat().st_mtime < w0:
                            continue
                    except OSError:
                        continue
            elif p.name == ring_previous(Path("ss-series.txt")).name:
                continue                         # the older half of an ss series: joined below
            d = dest / rel
            d.parent.mkdir(parents=True, exist_ok=True)
            try:
                if p.name == "ss-series.txt":
                    older = ring_previous(p)
                    with open(d, "wb") as out:
                        for part in (older, p):
                            if part.exists():
                                with open(part, "rb") as fh:
                                    shutil.copyfileobj(fh, out)
                else:
                    shutil.copyfile(p, d)
            except OSError:
                pass
        return pcaps

    def state_at_trigger(self, first: Trigger, fr_wait_s: float | None = None) -> list:
        """What a capture takes at its end, into the incident's folder: native stacks (a hang:
        with --stacks auto; always with --stacks always), Flight Recorder dumps through their
        pipes (waited for at most ``fr_wait_s``, default --fr-dump-wait), the end snapshots (ss,
        thread states, counters), the logs. Returns the Flight Recorder dumps asked for."""
        s = self.s
        mode = self.o.stacks
        if mode == "always" or (mode == "auto" and first.kind == "hang"):
            if s.is_root:
                stacks = self.w.cap.collector("native-stacks")
                for pid in sorted(s.procs):      # in the snapshot pool, side by side (each ~0.5 s)
                    if os.path.isdir(f"/proc/{pid}"):
                        s.submit(stacks.take, pid, "hung", f"watch trigger: {first.reason}")
            else:
                s.record("native-stacks:hung", status="skipped", reason="needs root")
        fr = self.w.cap.collector("flight-recorder-trigger")
        pending = fr.trigger()
        if fr_wait_s is not None:
            fr.deadline = min(fr.deadline, time.monotonic() + fr_wait_s)
        self.w.cap.collector("snapshots").take("end")
        fr.wait(pending)
        self.w.cap.collector("attachments").collect()
        s.wait_pool(timeout=120)
        return pending

    def finish_copied(self, dest: Path, pcaps: list[tuple[dict, list[Path]]], ring: Path) -> None:
        """events.jsonl from the copied tracer lines; the copied pcaps' collectors say what they hold."""
        s = self.s
        raw = dest / "bpf" / "raw"
        if raw.is_dir():
            extra = [raw / n for n in ("offcpu.1.jsonl", "offcpu.jsonl") if (raw / n).exists()]
            try:
                summ = events.postprocess(raw, dest / "bpf" / "events.jsonl", s.budget.tracer, extra=extra,
                                                 call_returns=self.o.call_returns)
                kept = dest / ".raw"                 # hidden (not archived): the completion merges it
                shutil.rmtree(kept, ignore_errors=True)
                raw.rename(kept)
                if "tracer" in s.records:
                    s.record("tracer", status="ok", summary={k: v for k, v in summ.items() if k != "messages"},
                             tracer_messages=summ.get("messages", []), ended_ns=time.time_ns(),
                             covered_ns=utc_span(s.clock + [clock_sample()], summ.get("span_monotonic_ns")))
            except Exception as e:  # noqa: BLE001 - the raw lines stay in the bundle
                s.record("tracer", status="failed", reason=f"building bpf/events.jsonl failed: "
                         f"{type(e).__name__}: {e}; the raw tracer output is kept in bpf/raw/")
        w0 = int(self.window0)
        for key, rec in s.records.items():
            cov = rec.get("covered_ns")
            if not cov or not key.startswith(("ss-series", "offcpu")):
                continue
            first = None                           # what the copied rings hold, not the watch's start
            for f in rec.get("files") or ():
                try:
                    with open(dest / f, "rb") as fh:
                        m = re.match(rb"# stallscope-sample realtime_ns=(\d+)", fh.readline())
                    first = int(m.group(1)) if m else None
                except OSError:
                    pass
            rec["covered_ns"] = [first if first is not None else max(cov[0], w0), cov[1]]
        for t, copies in pcaps:
            if not copies and t in self.w.packets.done:    # an earlier run of the packet ring, before the window
                s.records.pop(t["key"], None)
                continue
            spans = [sp for f in copies if (sp := bd.pcap_span(f))]
            err = dest / t["err"].relative_to(ring)
            files = [s.rel(f) for f in copies] + ([s.rel(err)] if err.exists() else [])
            s.record(t["key"], status="ok", files=files,
                     packets=sum(bd.pcap_records(f) for f in copies), ended_ns=time.time_ns(),
                     covered_ns=[min(a for a, _ in spans), max(b for _, b in spans)] if spans else None,
                     netns=t["ns"].label, iface=t["iface"], ring=True)


# --------------------------------------------------------------------------- stage two's merge
def merge_raw(kept: Path, new: Path) -> None:
    """The first stage's tracer segments (``kept``) into the second's (``new``): a segment only
    the first copied is added, one both copied keeps the longer copy (a segment grows; the
    spool drops whole segments by age)."""
    if not kept.is_dir():
        return
    new.mkdir(parents=True, exist_ok=True)
    for f in kept.iterdir():
        d = new / f.name
        if f.is_file() and (not d.exists() or d.stat().st_size < f.stat().st_size):
            shutil.copyfile(f, d)


def merge_into(src: Path, dest: Path) -> None:
    """The after-window's copies (``src``) into the first stage's folder (``dest``): a file the
    first lacks is added, one it has is replaced by a copy at least as long (the same ring file
    or log, grown); a shorter copy (a ring that turned over) leaves the first's in place."""
    for f in sorted(src.rglob("*")):
        if not f.is_file() or any(p.startswith(".") for p in f.relative_to(src).parts):
            continue
        d = dest / f.relative_to(src)
        try:
            if d.exists() and d.stat().st_size > f.stat().st_size:
                continue
            d.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, d)
        except OSError:
            pass


def archive_members(path: Path) -> dict[str, int]:
    """An archive's files (path below its top folder -> size)."""
    with tarfile.open(path) as t:
        return {m.name.split("/", 1)[-1]: m.size for m in t if m.isfile()}


def replace_if_superset(new: Path, old: Path) -> Path:
    """``new`` in ``old``'s place when it holds every file of ``old`` at least as long (the
    manifest aside); else under a free name beside it. Returns where it went."""
    have, had = archive_members(new), archive_members(old)
    if all(have.get(n, -1) >= size for n, size in had.items() if n != "manifest.json"):
        os.replace(new, old)
        return old
    stem = old.name[: -len(".tar.gz")]
    for i in range(1, 1000):
        cand = old.with_name(f"{stem}-complete{'' if i == 1 else f'-{i}'}.tar.gz")
        if not cand.exists():
            os.link(new, cand)
            os.unlink(new)
            return cand
    raise FileExistsError(f"no free name beside {old}")


def stall_words(inc: dict) -> str:
    """The stall's outcome in words (the log line at the completion)."""
    st = inc.get("stall")
    if not st:
        return f"{inc['first'].kind} trigger"
    if st["state"] == "resolved":
        return f"the stall resolved after {st['resolved_after_s']:.0f}s"
    if st["state"] == "ended":
        return "the stuck processes exited during the after-window"
    return "still stuck at the end of the window"


# --------------------------------------------------------------------------- the tracer's ring
def dump_ring(w, wait_s: float = 0.0) -> bool:
    """Ring mode: the watcher ``w``'s tracer prints its record ring (its lines go to the
    spool's segments, which the cut copies); with ``wait_s``, until the dump's end mark is
    spooled. False without a ring, or when no dump arrived in time."""
    before = start_dump(w)
    return before is not None and wait_dump(w, before, wait_s)


def start_dump(w) -> int | None:
    """Ask ``w``'s tracer for its ring's dump without waiting: the dumps read so far (for
    :func:`wait_dump`), None without a ring."""
    mon = w.monitor
    if not isinstance(mon, RingMonitor) or not w.tracing.alive():
        return None
    mon.poll()
    before = mon.ring_dumps
    program.trigger_dump()
    return before


def wait_dump(w, before: int | None, wait_s: float) -> bool:
    """Until a dump after ``before`` (:func:`start_dump`'s) is spooled, at most ``wait_s`` seconds."""
    mon = w.monitor
    if before is None or not isinstance(mon, RingMonitor):
        return False
    deadline = time.monotonic() + wait_s
    while wait_s and mon.ring_dumps == before and time.monotonic() < deadline:
        time.sleep(0.05)
        mon.poll()
    return mon.ring_dumps > before
