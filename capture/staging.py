"""The staging folder of a capture and what becomes of it: the bundle written within its
byte limit (``fit_budget``, ``trim``), the lock that tells a live capture's folder from a killed
one's, and the recovery of a killed capture's folder into a partial bundle
(``recover_staging``, ``recover_orphans``; ``stallscope capture --recover``).

Everything is staged in a hidden folder next to the bundle
(``.stallscope-<host>-<UTC>.staging-<pid>``), locked (flock) while its capture lives. A
capture that is killed (SIGKILL, OOM) leaves that folder behind with a manifest refreshed
every few seconds; its guardian (``children.Guardian``) stops its children and says so.

Standard library only."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import time
from pathlib import Path

from . import __version__
from . import bundle_files as bd
from . import manifest as schema
from .session import clock_sample, utc_span
from .tracer import events


def tcpdump_files(out: Path) -> list[Path]:
    """The files one tcpdump writes for ``-w out``: out itself, or its ring (out0, out1, ...)."""
    return list(out.parent.glob(out.name + "*"))


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
STAGED_MANIFEST = ".manifest.staged.json"
LOCK_FILE = ".lock"
DIED_MARKER = ".capture-died.json"
STAGING_RE = re.compile(r"^\.(.+)\.staging-(\d+)$")


def fit_budget(staging: Path, out_path: Path, arcroot: str, manifest: dict, limit: int, level: int = 6) -> dict:
    """Write manifest and archive (gzip ``level``), trimming the biggest capped files until within limit."""
    mpath = staging / "manifest.json"
    for attempt in range(8):
        manifest["files"] = bd.file_entries(staging)
        blob = bd.dumps_manifest(manifest)
        mpath.write_bytes(blob)
        sizes = [f["bytes"] for f in manifest["files"]] + [len(blob)]
        dirs = len({str(Path(f["path"]).parent) for f in manifest["files"]}) + 2
        bound = bd.archive_bound(sizes, dirs)
        if bound > limit:
            trim(staging, bound - limit, manifest)
            continue
        size = bd.write_archive(staging, out_path, arcroot, level)
        if size <= limit:
            bd.commit_archive(out_path)
            return manifest
        os.unlink(str(out_path) + ".partial")
        trim(staging, size - limit + 4096, manifest)
    raise RuntimeError("could not fit the bundle into --max-bytes")


def trim(staging: Path, excess: int, manifest: dict) -> None:
    """Drop the oldest pcap ring files, then cut the largest files, until excess bytes are freed."""
    def rel(p: Path) -> str:
        return p.relative_to(staging).as_posix()
    excess += 64 * 1024
    notes = manifest.setdefault("notes", [])
    ring = sorted(staging.glob("pcap/*-[0-9][0-9][0-9].pcap"), key=lambda p: p.name)
    for p in ring:
        if excess <= 0:
            break
        excess -= p.stat().st_size + bd.TAR_BLOCK
        notes.append(f"dropped {rel(p)} to stay within --max-bytes")
        p.unlink()
    while excess > 0:
        files = sorted((p for p in bd.list_files(staging) if p.name != "manifest.json"),
                       key=lambda p: p.stat().st_size, reverse=True)
        if not files or files[0].stat().st_size == 0:
            break
        big = files[0]
        size = big.stat().st_size
        keep = max(0, size - excess)
        if big.suffix == ".pcap" or keep == 0:
            notes.append(f"dropped {rel(big)} ({size} bytes) to stay within --max-bytes")
            big.unlink()
            excess -= size + bd.TAR_BLOCK
            continue
        if big.suffix == ".jsonl":  # keep whole lines from the start
            with open(big, "rb") as fh:
                head = fh.read(keep)
            keep = head.rfind(b"\n") + 1
            bd.truncate_file(big, keep, from_end=False)
        else:
            bd.truncate_file(big, keep, from_end=True)
        notes.append(f"cut {rel(big)} from {size} to {keep} bytes to stay within --max-bytes")
        excess -= size - keep


# ------------------------------------------------------------------ killed captures
def lock_staging(staging: Path, block: bool = True):
    """Hold the staging folder's lock (released by the kernel when its holder dies)."""
    fh = open(staging / LOCK_FILE, "a+b")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except OSError:
        fh.close()
        raise
    return fh


def find_orphans(folder: Path) -> list[Path]:
    """Staging folders in folder whose capture is gone (nobody holds their lock)."""
    out = []
    try:
        entries = sorted(Path(folder).iterdir())
    except OSError:
        return out
    for d in entries:
        m = STAGING_RE.match(d.name)
        if not m or not d.is_dir():
            continue
        if not any((d / f).exists() for f in (LOCK_FILE, STAGED_MANIFEST, "manifest.json")):
            continue              # not one of ours
        if (d / LOCK_FILE).exists():
            try:
                fh = lock_staging(d, block=False)
            except OSError:
                continue          # a live capture holds it
            fh.close()
        elif os.path.isdir(f"/proc/{m.group(2)}"):
            continue              # no lock yet (just created), its capture alive
        out.append(d)
    return out


def rename_ring(out: Path) -> list[Path]:
    """tcpdump -W names its files x.pcap0, x.pcap1...: renamed oldest first to x-000.pcap,
    x-001.pcap... (the new paths; none when tcpdump wrote one file)."""
    ring = sorted((p for p in tcpdump_files(out) if re.fullmatch(re.escape(out.name) + r"\d+", p.name)),
                  key=lambda p: p.stat().st_mtime_ns)
    stem = out.name[:-5] if out.name.endswith(".pcap") else out.name
    renamed = []
    for i, p in enumerate(ring):
        dst = out.parent / f"{stem}-{i:03d}.pcap"
        p.rename(dst)
        renamed.append(dst)
    return renamed


def finish_rings(staging: Path) -> None:
    """Every tcpdump ring of a killed capture's staging folder, as stop_tcpdumps does it."""
    outs = {p.with_name(m.group(1)) for p in staging.glob("pcap/*.pcap*")
            if (m := re.fullmatch(r"(.+\.pcap)\d+", p.name))}
    for out in outs:
        rename_ring(out)


def recover_staging(staging: Path, log=None, output_folder: Path | None = None) -> Path | None:
    """Turn the staging folder of a killed capture into a bundle marked ``"partial": true``.

    The folder holds what the capture had staged: snapshots, pcaps, the tracer's
    raw lines and off-CPU samples, and a manifest refreshed every few seconds.
    Returns the bundle's path (None when another process holds the folder)."""
    log = log or (lambda msg: None)
    staging = Path(staging)
    try:
        lock = lock_staging(staging, block=False)
    except OSError:
        return None
    try:
        m = STAGING_RE.match(staging.name)
        capture_pid = int(m.group(2)) if m else None
        staged = {}
        for name in (STAGED_MANIFEST, "manifest.json"):   # killed while archiving: the final one
            try:
                staged = json.loads((staging / name).read_text())
                break
            except (OSError, ValueError):
                continue
        died = {}
        try:
            died = json.loads((staging / DIED_MARKER).read_text())
        except (OSError, ValueError):
            pass
        info = staged.pop("capture", {})
        host = staged.get("host") or bd.short_host()
        started = staged.get("started_ns") or staging.stat().st_mtime_ns
        opts = staged.get("options", {})
        limit = int(opts.get("max_bytes") or (2 << 30))
        budget = bd.Budget.plan(limit, pcap=opts.get("pcap", True), tracer=opts.get("bpf", True))
        # the killed capture's unfinished archive, if it got that far: ours to replace
        if m:
            (staging.parent / f"{m.group(1)}.tar.gz.partial").unlink(missing_ok=True)
        if info.get("bundle"):
            Path(str(info["bundle"]) + ".partial").unlink(missing_ok=True)
        finish_rings(staging)
        notes = list(staged.get("notes", []))
        raw = staging / "bpf" / "raw"
        summary = None
        if raw.is_dir():
            try:
                summary = events.postprocess(raw, staging / "bpf" / "events.jsonl", budget.tracer,
                                                    extra=[raw / "offcpu.jsonl"],
                                                    call_returns=bool(opts.get("call_returns", True)))
                shutil.rmtree(raw, ignore_errors=True)
            except Exception as e:  # noqa: BLE001 - the raw lines stay in the bundle
                notes.append(f"building bpf/events.jsonl failed ({type(e).__name__}: {e}); raw lines in bpf/raw/")
        ended = died.get("detected_realtime_ns") or info.get("staged_ns") or time.time_ns()
        collectors = staged.get("collectors", {})
        for key, rec in collectors.items():
            if rec.get("status") in ("running", None):
                rec.update(schema.RECORD.make(
                    status="failed", reason="the capture process was killed while this ran; its output up to then "
                                            "is kept"))
            if key == "tracer" and summary is not None:
                rec.update(schema.RECORD.make(
                    summary={k: v for k, v in summary.items() if k != "messages"},
                    covered_ns=utc_span([c for c in staged.get("clock_samples") or [] if isinstance(c, dict)
                                         and isinstance(c.get("monotonic_ns"), int)
                                         and isinstance(c.get("realtime_ns"), int)],
                                        summary.get("span_monotonic_ns"))))
        for f in (STAGED_MANIFEST, DIED_MARKER, ".manifest.staged.tmp"):
            (staging / f).unlink(missing_ok=True)
        manifest = dict(staged) if staged else schema.TOP.make(
            schema_version=schema.SCHEMA_VERSION, tool="stallscope", tool_version=__version__, host=host,
            kernel=os.uname().release, clock_samples=[], collectors={}, processes=[])
        samples = list(manifest.get("clock_samples", []))
        if manifest.get("boot_id") in (None, bd.boot_id()):   # same boot: the clocks' relation still holds
            if died.get("detected_monotonic_ns") and died.get("detected_realtime_ns"):
                samples.append(schema.CLOCK_SAMPLE.make(
                    monotonic_ns=died["detected_monotonic_ns"], realtime_ns=died["detected_realtime_ns"],
                    uncertainty_ns=None, source="guardian, when the capture died"))
            samples.append(dict(clock_sample(), **schema.CLOCK_SAMPLE.make(source="recovery")))
        manifest.update(schema.TOP.make(
            started_ns=started, ended_ns=ended, partial=True, collectors=collectors, clock_samples=samples,
            partial_reason=f"capture process {capture_pid} was killed before it wrote its bundle; "
                           "recovered from its staging folder", notes=notes,
            recovered=schema.RECOVERED.make(by_pid=os.getpid(), at_ns=time.time_ns(), staging=staging.name,
                                            died=died or None)))
        (staging / LOCK_FILE).unlink(missing_ok=True)
        folder = Path(output_folder) if output_folder else staging.parent
        out = bd.choose_output(str(folder), host, started)
        arcroot = out.name[: -len(".tar.gz")]
        fit_budget(staging, out, arcroot, manifest, limit)
        shutil.rmtree(staging, ignore_errors=True)
        log(f"recovered a partial bundle {out} from {staging.name} (capture {capture_pid} was killed)")
        return out
    finally:
        lock.close()


def recover_orphans(folder: Path, log=None, candidates: list[Path] | None = None) -> list[Path]:
    """Every orphaned staging folder in folder (or just ``candidates``) -> a partial bundle;
    their paths."""
    out = []
    for d in find_orphans(folder) if candidates is None else candidates:
        try:
            p = recover_staging(d, log=log)
        except Exception as e:  # noqa: BLE001 - one unreadable folder must not stop the others
            if log:
                log(f"could not recover {d}: {type(e).__name__}: {e} (kept)")
            continue
        if p is not None:
            out.append(p)
    return out

