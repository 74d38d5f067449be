"""An incident's bundle, cut from the watcher's rings (``capture.watch``): the rings' last
``--before`` and the ``--after`` that followed are copied into the incident's own staging folder,
the state of the job is taken then (the snapshots of a capture's end, native stacks for a hang,
Flight Recorder dumps through their pipes, the logs), and the bundle is written with
``"trigger"`` and ``"watch"`` in its manifest. While it is made, the session's staging folder,
records, budget and notes are the incident's; the rings go on meanwhile.

Standard library only."""
from __future__ import annotations

import copy
import os
import re
import shutil
import time
from pathlib import Path

from . import bundle_files as bd
from . import manifest as schema
from . import tracer_events
from .options import CaptureFailed
from .policy import ring_previous
from .session import clock_sample, utc_span
from .staging import DISK_FULL, STAGED_MANIFEST, fit_budget, lock_staging, tcpdump_files
from .triggers import PENDING, Trigger

RING_DUMP_WAIT_S = 10.0              # the cut waits this long for the tracer's ring dump to be spooled


class IncidentWriter:
    """Writes one incident's bundle for the watcher ``w`` (its capture, packet ring, folder)."""

    def __init__(self, w):
        self.w = w
        self.s = w.s
        self.o = w.o
        self.window0 = 0                # UTC ns: the start of the incident's window

    def write(self, inc: dict) -> None:
        """The bundle of ``inc`` (its triggers), from the rings as they are now; the watcher's
        ``bundles`` gets its path (None when it could not be written)."""
        s, w = self.s, self.w
        first: Trigger = inc["first"]
        w0_real = first.realtime_ns - int(self.o.before_s * 1e9)
        self.window0 = w0_real
        w0_epoch_s = w0_real / 1e9
        try:
            out = bd.choose_output(str(w.folder) + os.sep, s.host, first.realtime_ns)
        except (FileExistsError, FileNotFoundError) as e:
            s.log(f"incident not written: {e}")
            w.bundles.append(None)
            return
        arcroot = out.name[: -len(".tar.gz")]
        dest = w.folder / f".{arcroot}.staging-{os.getpid()}"
        snap = w.cap.collector("snapshots")
        saved = (s.staging, s.records, snap.started, s.budget, s.notes, s.futures)
        lock = None
        try:
            dest.mkdir(parents=True)
            lock = lock_staging(dest)
            collectors = copy.deepcopy(s.records)
            w.dump_ring(wait_s=RING_DUMP_WAIT_S)  # the records up to now
            w.packets.flush()          # the packets up to now onto the ring files
            pcap_files = self.copy_rings(dest, w0_epoch_s)
            s.staging, s.records, snap.started = dest, collectors, set()
            s.budget = bd.Budget.plan(self.o.max_bytes, pcap=self.o.pcap, tracer=self.o.bpf)
            s.notes, s.futures = list(saved[4]), []
            self.state_at_trigger(first)
            self.finish_copied(dest, pcap_files, saved[0])
            s.clock.append(clock_sample())
            for rec in s.records.values():
                if rec.get("status") == "running":
                    rec["status"] = "ok"
            manifest = w.cap.manifest_dict(time.time_ns(), s.jobs.process_facts(s.staging), partial=False)
            manifest.update(schema.TOP.make(
                trigger=dict(first.to_manifest(),
                             **schema.TRIGGER.make(also=[t.to_manifest() for t in inc["triggers"][1:]][:50])),
                watch=schema.WATCH.make(
                    started_ns=s.started_ns, before_s=self.o.before_s, after_s=self.o.after_s,
                    hang_after=w.hang_after_text(), ring_bytes=self.o.ring_bytes,
                    window_ns=[w0_real, time.time_ns()], watcher_pid=os.getpid(),
                    pcap_ring=schema.PCAP_RING.make(mode=w.packets.mode(), linger_s=w.packets.linger_s,
                                                    runs=[r for r in w.packets.runs
                                                          if r.get("stopped_ns", time.time_ns()) >= w0_real]))))
            manifest["options"].update(schema.OPTIONS.make(watch=True))
            job = s.jobs.job_of(first.pids or [])     # the job that hung, and the others followed
            if job is not None:
                manifest["job"] = job
            try:
                fit_budget(dest, out, arcroot, manifest, self.o.max_bytes)
            except OSError as e:
                if e.errno not in DISK_FULL:
                    raise
                raise CaptureFailed(f"cannot write {out}: {e.strerror}; kept in {dest}") from None
            shutil.rmtree(dest, ignore_errors=True)
            w.bundles.append(out)
            s.log(f"incident bundle {out} ({out.stat().st_size} bytes): {first.kind}: {first.reason}")
        except Exception as e:  # noqa: BLE001 - the watcher goes on; what was copied stays for --recover
            w.bundles.append(None)
            s.log(f"incident bundle not written ({type(e).__name__}: {e}); what was copied is kept in {dest}")
        finally:
            if lock is not None:
                lock.close()
            s.staging, s.records, snap.started, s.budget, s.notes, s.futures = saved
            w.last_incident_end = time.monotonic()
            (s.staging / PENDING).unlink(missing_ok=True)

    def copy_rings(self, dest: Path, w0: float) -> list[tuple[dict, list[Path]]]:
        """The rings' files that hold data from w0 (epoch s) on, copied into dest; the start
        snapshots and logs of the watch copied whole. Returns each tcpdump's copies, oldest first."""
        s = self.s
        src = s.staging
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
        raw = s.raw_dir
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

    def state_at_trigger(self, first: Trigger) -> None:
        """What a capture takes at its end, into the incident's folder: native stacks (a hang:
        with --stacks auto; always with --stacks always), Flight Recorder dumps through their
        pipes, the end snapshots (ss, thread states, counters), the logs."""
        s = self.s
        mode = self.o.stacks
        if mode == "always" or (mode == "auto" and first.kind == "hang"):
            if s.is_root:
                stacks = self.w.cap.collector("native-stacks")
                for pid in sorted(s.procs):
                    if os.path.isdir(f"/proc/{pid}"):
                        stacks.take(pid, "hung", f"watch trigger: {first.reason}")
            else:
                s.record("native-stacks:hung", status="skipped", reason="needs root")
        fr = self.w.cap.collector("flight-recorder-trigger")
        pending = fr.trigger()
        self.w.cap.collector("snapshots").take("end")
        fr.wait(pending)
        self.w.cap.collector("attachments").collect()
        s.wait_pool(timeout=120)

    def finish_copied(self, dest: Path, pcaps: list[tuple[dict, list[Path]]], ring: Path) -> None:
        """events.jsonl from the copied tracer lines; the copied pcaps' collectors say what they hold."""
        s = self.s
        raw = dest / "bpf" / "raw"
        if raw.is_dir():
            extra = [raw / n for n in ("offcpu.1.jsonl", "offcpu.jsonl") if (raw / n).exists()]
            try:
                summ = tracer_events.postprocess(raw, dest / "bpf" / "events.jsonl", s.budget.tracer, extra=extra,
                                                 call_returns=self.o.call_returns)
                shutil.rmtree(raw, ignore_errors=True)
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
