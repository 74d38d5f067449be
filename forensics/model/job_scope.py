"""One job per incident: a watcher's bundle read as the job that hung, the others left out.

The watcher follows every NCCL job of its host, and its rings hold all of them: a job that
ended a minute ago, one that runs beside the hung one. Its incident bundle names the job that
hung (the manifest's ``job``: the trigger's processes and those of the same launcher and
cgroup, ``capture.jobs.Jobs.job_of``) and the other jobs it followed (``job.others``); a
process it no longer followed whose calls all came before the hung job's first is another
job's too (a job that ran before).
:func:`scope` reads the bundle as that job's alone: the other jobs' processes leave the
manifest's process list (so no rank, socket or log of theirs is attributed), their tracer
events and the captures of network namespaces only they used go, and the rows of the artefact
tables that name one of their pids or come from one of their files (:func:`drop_rows`). One problem line says
what was left out. A bundle without ``job`` (a capture, an older watcher) is read whole.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

# tracer events that belong to the process in their pid (TCP events carry the softirq's victim)
PROCESS_EVENTS = frozenset({"coll", "host_wait", "group", "comm_init", "comm_destroy", "unique_id", "ret",
                            "offcpu"})


# the job's start is its first process's, read from /proc in clock ticks against a boot time in
# whole seconds: this much earlier is surely before it
START_SLACK_NS = 2_000_000_000
# tracer records about the tracer itself, kept whatever their time (its window, its restarts)
TRACER_RECORDS = frozenset({"tracer_start", "tracer_end", "tracer_stopped", "tracer_overlap", "ring_dump", "lib_map"})


class JobScope:
    """What :func:`scope` left out of one bundle: ``pids`` (other jobs' processes),
    ``netns`` (inodes) and ``labels`` (their ``sys/`` and ``pcap/`` name prefixes) only those
    used; ``since_ns`` (UTC): what happened before it is no part of the hung job (its start,
    less ``START_SLACK_NS``; None: unknown); ``job``: the hung job's id, None when the bundle
    is read whole."""

    def __init__(self, job: str | None = None, pids: frozenset = frozenset(), netns: frozenset = frozenset(),
                 labels: frozenset = frozenset(), files: frozenset = frozenset(), since_ns: int | None = None):
        self.job, self.pids, self.netns, self.labels, self.files = job, pids, netns, labels, files
        self.since_ns = since_ns

    def keeps_file(self, rel: str) -> bool:
        """Whether a bundle file (``pcap/<label>-<iface>.pcap``, ``sys/<label>/...``) is not
        only another job's."""
        parts = rel.split("/")
        if len(parts) >= 2 and parts[0] == "sys":
            return parts[1] not in self.labels
        if len(parts) == 2 and parts[0] == "pcap":
            return not any(parts[1].startswith(f"{lb}-") for lb in self.labels)
        return True


def scope(bundle, events: list) -> tuple[JobScope, list]:
    """(what was left out, the events kept) of ``bundle``, whose manifest's processes and
    namespaces lose the other jobs' (in place). The manifest's ``job`` names the kept pids;
    every other process it lists is another job's."""
    m = bundle.manifest
    job = m.value("job") if m.raw else None
    if not isinstance(job, dict) or not isinstance(job.get("pids"), list):
        return JobScope(), events
    keep = {p for p in job["pids"] if isinstance(p, int)}
    if not keep:
        return JobScope(), events
    followed = frozenset(p.pid for p in m.processes if p.pid not in keep)
    ended = _ended_before(events, keep, m)
    drop = followed | ended
    since = job.get("started_ns") - START_SLACK_NS if isinstance(job.get("started_ns"), int) else None
    events, early = _since(bundle, events, since)
    if early:
        bundle.problems.append(f"{early} tracer record(s) from before the incident's job began left out (the "
                               "watcher's rings keep the minutes before an incident)")
    if not drop:
        return JobScope(str(job.get("id") or ""), since_ns=since), events
    ns_drop = frozenset(n.inode for n in m.netns if n.pids and not (set(n.pids) & keep))
    labels = frozenset(n.label for n in m.netns if n.inode in ns_drop)
    m.processes = [p for p in m.processes if p.pid not in drop]
    m.netns = [n for n in m.netns if n.inode not in ns_drop]
    kept = type(events)(e for e in events if not _other_jobs(e, drop, ns_drop))
    files = _their_files(m, drop)
    others = [o for o in job.get("others") or [] if isinstance(o, dict)]
    bundle.problems.append(
        f"the incident's job is {job.get('id')} (pids {', '.join(map(str, sorted(keep)))}); "
        + (f"{len(followed)} process(es) of {max(len(others), 1)} other job(s) the watcher followed"
           if followed else "")
        + (" and " if followed and ended else "")
        + (f"{len(ended)} {'' if followed else 'process(es) '}that ended before it began" if ended else "")
        + f" left out (pids {', '.join(map(str, sorted(drop)[:12]))}{' ...' if len(drop) > 12 else ''}), "
        f"with {len(events) - len(kept)} tracer event(s), {len(files)} file(s) and {len(labels)} network "
        "namespace(s) of theirs")
    return JobScope(str(job.get("id") or ""), drop, ns_drop, labels, files, since), kept


def _since(bundle, events: list, since: int | None) -> tuple[list, int]:
    """(the events of ``since`` (UTC) on, how many earlier ones went): records with a time
    (``t``, a call's ``t0``) before it are another job's; the tracer's own records stay."""
    if since is None or bundle.clock is None:
        return events, 0
    idx = [i for i, e in enumerate(events) if isinstance(e, dict) and e.get("ev") not in TRACER_RECORDS
           and _stamps(e)]
    if not idx:
        return events, 0
    mono = np.array([min(_stamps(events[i])) for i in idx], dtype=np.int64)
    early = {i for i, utc in zip(idx, bundle.clock.to_utc(mono)) if utc < since}
    if not early:
        return events, 0
    return type(events)(e for i, e in enumerate(events) if i not in early), len(early)


def drop_early_packets(pcap, sc: JobScope, problems: list[str]) -> None:
    """The captures' rows from before the hung job began (``sc.since_ns``) out of ``pcap`` (a
    :class:`~forensics.model.hosts.PcapPart`, in place): flagged packets and their verdicts,
    flows whose last packet came before, and those flows' timing aggregates. One problem line
    says how many."""
    if sc.since_ns is None:
        return
    since, n_pk, gone = sc.since_ns, 0, set()
    for frames in (pcap.packets, pcap.events):
        for i, df in enumerate(frames):
            keep = pd.to_numeric(df["timestamp_ns"], errors="coerce").fillna(since) >= since
            if frames is pcap.packets:
                n_pk += int((~keep).sum())
            frames[i] = df[keep.to_numpy()].reset_index(drop=True)
    for i, df in enumerate(pcap.flows):
        old = (pd.to_numeric(df["last_ns"], errors="coerce").fillna(since) < since).to_numpy()
        for r in df[old].itertuples():
            gone |= {(r.capture, str(r.orig_addr), int(r.orig_port), str(r.resp_addr), int(r.resp_port)),
                     (r.capture, str(r.resp_addr), int(r.resp_port), str(r.orig_addr), int(r.orig_port))}
        pcap.flows[i] = df[~old].reset_index(drop=True)
    if gone:
        for i, df in enumerate(pcap.timing):
            key = zip(df["capture"], df["saddr"].astype(str), df["sport"].astype(int), df["daddr"].astype(str),
                      df["dport"].astype(int))
            pcap.timing[i] = df[[k not in gone for k in key]].reset_index(drop=True)
    if n_pk or gone:
        problems.append(f"{len(gone) // 2} flow(s) and {n_pk} flagged packet(s) of the captures from before the "
                        "incident's job began left out")


def _stamps(e: dict) -> list[int]:
    """A tracer record's monotonic times: ``t``, or a call's entry and return (``t0``, ``t1``)."""
    return [t for t in (e.get("t"), e.get("t0"), e.get("t1")) if isinstance(t, int)]


def _ended_before(events: list, keep: set, m) -> frozenset:
    """Pids the manifest does not list whose every traced call precedes the hung job's first:
    the processes of a job that ended before it began (the watcher stops following a process
    a while after it exits, but its calls stay in the ring's before-window). A process of the
    hung job runs beside its other ranks, so a rank killed mid-job overlaps them and stays."""
    listed = {p.pid for p in m.processes}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for e in events:
        if not (isinstance(e, dict) and e.get("ev") in PROCESS_EVENTS and isinstance(e.get("pid"), int)):
            continue
        ts = _stamps(e)
        if not ts:
            continue
        pid = e["pid"]
        if pid in keep:
            first[pid] = min(first.get(pid, min(ts)), *ts)
        elif pid not in listed:
            last[pid] = max(last.get(pid, max(ts)), *ts)
    if not first:
        return frozenset()
    begun = min(first.values())
    return frozenset(pid for pid, t in last.items() if t < begun)


OF_PID = re.compile(r"\bof pid (\d+)\b")                       # a collector's source: "NCCL_DEBUG_FILE of pid N"
PID_PATH = re.compile(r"^(?:proc/|stacks/[\w.-]*?-|logs/job-std(?:out|err)-)(\d+)-")


def _their_files(m, pids: frozenset) -> frozenset:
    """Bundle paths of other jobs' processes: the files a collector copied for one of them (its
    record's ``sources``: Flight Recorder dumps, NCCL_DEBUG_FILE logs, stdout/stderr), and those
    named by their pid (``proc/PID-``, ``stacks/...-PID-``, ``logs/job-stdout-PID-``)."""
    out = set()
    for _, srcs in m.record_values("sources"):
        for src in srcs if isinstance(srcs, list) else []:
            if isinstance(src, dict) and src.get("path"):
                hit = OF_PID.search(str(src.get("why") or ""))
                if hit and int(hit.group(1)) in pids:
                    out.add(str(src["path"]))
    for f in m.files:
        hit = PID_PATH.match(f.path)
        if hit and int(hit.group(1)) in pids:
            out.add(f.path)
    return frozenset(out)


def _other_jobs(ev, pids: frozenset, netns: frozenset) -> bool:
    if not isinstance(ev, dict):
        return False
    if ev.get("ev") in PROCESS_EVENTS:
        return ev.get("pid") in pids
    ns = ev.get("netns")
    return bool(netns) and isinstance(ns, int) and ns in netns


def drop_rows(tables: dict[str, pd.DataFrame], sc: JobScope) -> dict[str, pd.DataFrame]:
    """``tables`` without the rows whose ``pid`` (or ``log_pid``) is another job's process, or
    that were read from one of its files (``artifact``: :func:`_their_files`)."""
    if not sc.pids:
        return tables
    out = {}
    for name, df in tables.items():
        if isinstance(df, pd.DataFrame) and len(df):
            for col in ("pid", "log_pid"):
                if col in df.columns:
                    df = df[~pd.to_numeric(df[col], errors="coerce").isin(sc.pids)]
            if sc.files and "artifact" in df.columns:
                df = df[~df["artifact"].astype("string").isin(sc.files).fillna(False).astype(bool)]
        out[name] = df
    return out
