"""The event model: one or more hosts' bundles -> DuckDB tables (DESIGN.md "Event tables").

Each host's part (:func:`.hosts.read_host`, run where :mod:`forensics.execution` says; the
pipeline from the user's paths is ``forensics.execution.host_reading.read_model``) opens its
bundle (:mod:`forensics.inputs.bundle`), converts tracer times to UTC with each manifest's
clock samples and reads its artefacts; :func:`from_parts` merges them, attributes TCP events
to processes, ranks and the collective in flight, and reads the rest (NCCL logs, nccl-tests, py-spy, ss,
Flight Recorder, Inspector: :mod:`forensics.model.artifacts`, which also puts GPU times on
``nccl_events``), and returns a :class:`Model`: the tables as DataFrames plus
``connect()`` for SQL (an in-memory DuckDB, or a file with ``path=``). Column schemas
live in :mod:`forensics.model.schema`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import combinations

import pandas as pd

from ..inputs.bundle import Bundle
from . import artifacts as artifacts_mod
from . import logs as logs_mod
from . import nccl as nccl_mod
from . import timing as timing_mod
from . import tcp_ranks
from ..inputs.loose import merge, nothing_read
from .schema import SCHEMAS, concat, conform, empty
from .hosts import HostPart
from .skew import SkewEstimate, estimate_skew


@dataclass
class Model:
    tables: dict[str, pd.DataFrame]
    hosts: list[str]
    problems: list[str] = field(default_factory=list)
    skew: list[SkewEstimate] = field(default_factory=list)
    captures: list[dict] = field(default_factory=list)   # per bundle: what was captured (capture_summary)
    notes: list[str] = field(default_factory=list)        # how the logs were read (their times' zone, ...)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    @property
    def logs_only(self) -> bool:
        """Whether this model was made from the logs alone: every input was loose evidence
        (:mod:`forensics.inputs.loose`), so no tracer, no packets and no process facts of a capture.
        The verdict, the findings' wording and the report's first lines say so."""
        return bool(self.captures) and all(c.get("kind") == "loose" for c in self.captures)

    def skew_report(self) -> str:
        if len(self.captures) < 2:
            return "clock skew between hosts: n/a (one bundle)"
        lines = []
        for s in self.skew:
            if s.skew_ns is None:
                lines.append(f"clock skew {s.host_b} - {s.host_a}: unknown ({s.status})")
            else:
                lines.append(f"clock skew {s.host_b} - {s.host_a}: {s.skew_ns / 1e6:+.3f} ms "
                             f"from {s.matched_segments} common segments ({s.status})")
        return "\n".join(lines)

    def connect(self, path: str | os.PathLike | None = None, opened=None):
        """A DuckDB connection over every table (:class:`.database.EventDatabase`): in memory,
        the event tables loaded at the first query that could read them; written whole to
        ``path`` when given. Sets ``collectives``, which it makes in SQL. ``opened``: the
        database of ``path`` opened already (:func:`.database.open_database`)."""
        from .database import connect
        con, self.tables["collectives"] = connect(self.tables, str(path) if path else None, opened=opened)
        return con


def memo(memos: dict, key, make):
    """``make()`` computed once for ``key`` and kept in ``memos`` (the values the detectors
    share, ``findings.Context.memo``; the report's, ``report.data.memo``): a DataFrame or dict
    comes back as a copy, so no reader changes another's view of it."""
    if key not in memos:
        memos[key] = make()
    v = memos[key]
    return v.copy() if isinstance(v, (pd.DataFrame, dict)) else v


def from_parts(parts: list[HostPart], *, skew: bool = True) -> Model:
    """The model of every host's part (:func:`.hosts.read_host`, in the order of the
    sources): loose evidence read in shares merged back, two bundles of one host kept apart,
    then what needs every host (:func:`_build`). InputError when nothing could be read."""
    parts = merge(parts)
    nothing_read(parts)
    hosts = [p.bundle.host for p in parts]
    dup = {h for h in hosts if hosts.count(h) > 1}
    if dup:   # two bundles of one host (e.g. two captures): keep them apart
        seen: dict[str, int] = {}
        for p in parts:
            h = p.bundle.host
            if h in dup:
                seen[h] = seen.get(h, 0) + 1
                p.rename(f"{h}#{seen[h]}")
    return _build(parts, skew=skew)


def _build(parts: list[HostPart], skew: bool) -> Model:
    """Every host's part put together: what needs more than one host (attribution of TCP
    events, packets, flows and sockets to ranks across hosts; GPU times; one communicator
    key; the collective in flight; clock skew)."""
    bundles = [p.bundle for p in parts]
    pid_ranks = {p.bundle.host: p.pid_ranks for p in parts}
    endpoints = pd.concat([p.endpoints for p in parts], ignore_index=True)
    ranks = tcp_ranks.rank_table(pid_ranks)
    netns = pd.concat([p.netns for p in parts], ignore_index=True)
    attr = tcp_ranks.Attribution(endpoints, ranks, netns)

    # every host's rows attributed together: one lookup per table, not one per host
    bpf = [p.bpf_tcp for p in parts if p.bpf_tcp is not None]
    pcap_events, packets, flows = tcp_ranks.attribute_pcaps([p.pcap for p in parts], attr)
    tcp_parts = [tcp_ranks.bpf_tcp_events(pd.concat(bpf, ignore_index=True) if bpf else None, attr), pcap_events]
    timing = timing_mod.flow_timing(attr, [t for p in parts for t in p.pcap.timing])
    nccl = concat([p.nccl for p in parts], "nccl_events").sort_values(["timestamp_ns", "rank"], kind="stable",
                                                                  na_position="last").reset_index(drop=True)
    tcp = concat(tcp_parts, "tcp_events").sort_values("timestamp_ns", kind="stable",
                                                                na_position="last").reset_index(drop=True)
    nccl, artifact_tabs = artifacts_mod.artifact_tables(bundles, nccl, attr,
                                                        {p.bundle.host: p.tables for p in parts})  # + GPU times
    # after the GPU times: those map only onto counts the tracer took from the init
    nccl = nccl_mod.unify_comm_ids(nccl, {p.bundle.host: p.comms for p in parts}, artifact_tabs.get("coll_log_ops"),
                                   _tracer_ends(bundles), artifact_tabs.get("fr_entries"))
    tcp = tcp_ranks.collective_in_flight(tcp, nccl)
    tcp = tcp_ranks.mark_dsacked(tcp, artifact_tabs.get("sockets"))   # resends the peers had: spurious

    estimates: list[SkewEstimate] = []
    if skew and len(bundles) > 1:
        estimates = _skew(parts, endpoints)
    skew_df = pd.DataFrame([s.__dict__ for s in estimates], columns=list(SCHEMAS["clock_skew"]))
    captures = [capture_summary(b) for b in bundles]
    notes = logs_mod.attribute(artifact_tabs, captures)      # log lines' hosts, ranks, times across files
    problems = [(b.host, str(b.source), p) for b in bundles for p in b.problems]
    tables = {
        "nccl_events": nccl, "tcp_events": tcp, "packets": packets, "flows": flows, "collectives": empty("collectives"),
        "clock_skew": conform(skew_df, "clock_skew"),
        "problems": conform(pd.DataFrame(problems, columns=["host", "bundle", "problem"]), "problems"),
        **artifact_tabs,
        "offcpu": concat([p.offcpu for p in parts], "offcpu"),
        "flow_timing": timing,
        "capture_windows": concat([p.windows for p in parts], "capture_windows"),
    }
    hosts = [b.host for b in bundles if b.loose is None]
    if len(hosts) < len(bundles):   # loose evidence: the hosts its lines name, file by file
        hosts += [h for h in logs_mod.job_hosts(tables) if h not in hosts]
        named = logs_mod.file_hosts(tables)
        for c in captures:
            for f in c.get("files_read") or []:
                f["hosts"] = named.get(f["path"], [])
    return Model(tables=tables, hosts=hosts, problems=[f"{h}: {p}" for h, _, p in problems],
                 skew=estimates, captures=captures, notes=notes)


def capture_summary(b: Bundle) -> dict:
    """What one bundle holds and lacks: collectors with status and reason, time covered,
    processes, partial-capture flags; the report's capture section and --json "capture".
    Loose evidence: the files read and by what, the files not read and why, the kinds of
    evidence absent and what that limits (:meth:`forensics.inputs.loose.LooseBundle.summary`)."""
    m = b.manifest
    if b.loose is not None:
        return {"host": b.host, "bundle": " ".join(b.loose.given) or b.loose.label, "given": list(b.loose.given),
                **b.summary(),
                "problems": list(b.problems),
                "collectors": [], "processes": [], "started_ns": None, "ended_ns": None}
    tz = m.value("timezone")
    return {
        "host": b.host, "bundle": str(b.source), "schema_version": m.schema_version,
        "tool_version": m.tool_version, "kernel": m.kernel, "started_ns": m.started_ns, "ended_ns": m.ended_ns,
        "partial": bool(m.value("partial")),
        "partial_reason": m.value("partial_reason"),
        "clock_samples": len(m.clock_samples),
        "collectors": [{"name": c.name, "status": c.status, "reason": c.reason, "command": c.command, "rc": c.rc,
                        "files": list(c.files), "covered_ns": list(c.covered_ns) if c.covered_ns else None}
                       for c in m.collectors.values()],
        "processes": [{"pid": p.pid, "rank": p.rank, "world_size": p.world_size, "comm": p.comm,
                       "cmdline": " ".join(p.cmdline), "libnccl": list(p.libnccl), "master_port": p.master_port,
                       "hostname": p.hostname} for p in m.processes],
        "files": len(m.files), "bytes": sum(f.bytes or 0 for f in m.files),
        "problems": list(b.problems),
        **({"user_attached": attached} if (attached := m.user_attached()) else {}),
        **({"timezone": tz} if isinstance(tz, dict) else {}),
        # a watcher's incident: the job that hung (model/job_scope.py read the bundle as it alone)
        **({"job": {k: job.get(k) for k in ("id", "pids", "ranks", "started_ns", "launcher")}}
           if isinstance(job := m.value("job"), dict) else {}),
        **({"watch": watch_summary(w)} if isinstance(w := m.value("watch"), dict) else {}),
    }


def watch_summary(w: dict) -> dict:
    """A watcher bundle's stage and stall (manifest ``watch``): what the report says of whether
    the stall resolved (forensics.findings.stall)."""
    st = w.get("stall")
    return {"stage": w.get("stage") if isinstance(w.get("stage"), str) else None,
            "stall": st if isinstance(st, dict) else None}


def _tracer_ends(bundles) -> dict[str, int]:
    """host -> UTC ns of the end of what its tracer covered: its collector record's covered_ns,
    else (a bundle that records none) the capture's end."""
    out = {}
    for b in bundles:
        c = b.manifest.collectors.get("tracer")
        if c is not None and c.covered_ns:
            out[b.host] = int(c.covered_ns[1])
        elif b.manifest.ended_ns:
            out[b.host] = int(b.manifest.ended_ns)
    return out


def _skew(parts: list[HostPart], endpoints: pd.DataFrame) -> list[SkewEstimate]:
    """Pairwise skew between hosts from their captures' sampled segment fingerprints
    (:func:`.hosts.scan_pcaps`). Only hosts whose captures hold a common connection (the
    same address pair) are matched: the others get "no common segments" at no cost."""
    prints = {p.bundle.host: p.pcap.fingerprints for p in parts}
    pairs = {p.bundle.host: p.pcap.address_pairs for p in parts}
    out = []
    for a, c in combinations([p.bundle for p in parts], 2):
        pa, pc = prints[a.host], prints[c.host]
        if pa is None or pc is None:
            out.append(SkewEstimate(a.host, c.host, None, None, 0, "no pcap on one side"))
            continue
        if not (pairs[a.host] & pairs[c.host]):
            out.append(SkewEstimate(a.host, c.host, None, None, 0, "no common segments"))
            continue
        own = set(endpoints.loc[endpoints["host"] == a.host, "addr"].astype(str))
        other = set(endpoints.loc[endpoints["host"] == c.host, "addr"].astype(str))
        addrs = (own - other) or own
        out.append(estimate_skew(pa, pc, addrs, a.host, c.host))
    return out


__all__ = ["Model", "from_parts"]
