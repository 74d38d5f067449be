"""The per-host stage of the model: everything one bundle gives on its own.

:func:`read_host` opens one bundle, reads its tracer events and artefacts, builds the
host's own tables (``nccl_events`` rows, off-CPU samples, capture windows, the artefact
tables, its endpoints and network namespaces), and runs the TCP engine once over each of
its captures (verdict rows, flows, flow timing and the segment fingerprints for clock
skew, all from one pass). Nothing in it needs another host: that is what runs on
``--jobs`` processes or a Dask cluster (:mod:`forensics.execution.host_reading`), and what
:func:`forensics.model.from_parts` merges: the attribution to ranks, the clock skew
between hosts and every cross-host table come after, in the parent.

A :class:`HostPart` is plain data (DataFrames, dataclasses, lists) and pickles. Its
bundle is closed when it leaves :func:`read_host`: its manifest, clock and problems
remain, its files are gone, and a later attempt to read one raises instead of finding
nothing.
"""
from __future__ import annotations

import ctypes
import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..inputs.bundle import Bundle
from ..errors import InputError
from . import artifacts as artifacts_mod
from . import job_scope, nccl_config, tcp_ranks
from . import nccl as nccl_mod
from . import offcpu as offcpu_mod
from . import windows as windows_mod
from ..inputs.loose import LooseBundle
from ..tcp import analyze_file
from .timing import TimingCollector

# fingerprints kept per host for the clock skew: a sample chosen by the segment's own
# bytes (its raw sequence number), the same rule on every host, so the segments two hosts
# keep are the same ones (sparser samples are subsets of denser ones: one in 2**k)
FINGERPRINTS_PER_HOST = 60_000
_BYTES_PER_PACKET = 90        # a header-only capture's record, to size the sample before reading


@dataclass
class PcapPart:
    """One bundle's captures through the TCP engine, not yet attributed to ranks."""

    packets: list[pd.DataFrame] = field(default_factory=list)   # flagged packets, one frame per capture
    events: list[pd.DataFrame] = field(default_factory=list)    # (flagged packet, verdict) rows
    flows: list[pd.DataFrame] = field(default_factory=list)
    timing: list[pd.DataFrame] = field(default_factory=list)    # TimingCollector aggregates
    fingerprints: pd.DataFrame | None = None                     # skew.KEY + t, sampled
    address_pairs: frozenset = frozenset()                       # (src, dst) of the fingerprints
    packets_seen: int = 0


@dataclass
class HostPart:
    """What :func:`read_host` returns for one bundle (see the module docstring)."""

    bundle: Bundle                     # closed: manifest, clock, problems
    comms: pd.DataFrame                # its NCCL logs' communicators (nccl_debug's nccl_comms), for
                                       # the one communicator key; the parsed artefacts themselves stay
                                       # in the worker (dozens of small frames: half a host's transfer)
    pid_ranks: dict[int, int]          # the one pid -> global rank rule (nccl.process_ranks)
    endpoints: pd.DataFrame            # (host, addr, port, pid): tcp.endpoint_table
    netns: pd.DataFrame                # (host, netns, pid)
    nccl: pd.DataFrame                 # nccl_events rows, before the GPU times and communicator keys
    bpf_tcp: pd.DataFrame | None       # the tracer's kernel TCP events, not yet attributed
    offcpu: pd.DataFrame
    windows: pd.DataFrame              # capture_windows rows
    tables: dict[str, pd.DataFrame]    # artifacts.host_tables
    pcap: PcapPart

    def rename(self, host: str) -> None:
        """Relabel the host (two bundles of one host are kept apart as host#1, host#2): every
        row the capture host labels (``host``, and ``node`` where a row's own host differs)."""
        old = self.bundle.manifest.host
        self.bundle.manifest.host = host
        frames = [self.endpoints, self.netns, self.nccl, self.offcpu, self.windows, *self.tables.values(),
                  *self.pcap.packets, *self.pcap.events, *self.pcap.flows, *self.pcap.timing]
        if self.bpf_tcp is not None:
            frames.append(self.bpf_tcp)
        for df in frames:
            if "node" in df.columns:     # a log's rows: their own host where the line named one
                df["node"] = df["node"].mask(df["node"].astype("string") == old, host)
                df["host"] = df["host"].mask(df["host"].astype("string") == old, host)
            elif "host" in df.columns:
                df["host"] = host


def read_host(path, *, skew: bool = True) -> HostPart:
    """The per-host stage for one bundle (tar.gz or folder), or for loose evidence (a
    :class:`~forensics.inputs.intake.LooseSet`, read as :class:`~forensics.inputs.loose.LooseBundle`); raises
    InputError when the path is no bundle. Runs in a worker process as well as in the caller's."""
    with small_pages(), _no_cyclic_gc():
        return _read_host(path, skew)


def _read_host(path, skew: bool) -> HostPart:
    b = open_source(path)
    try:
        # a watcher's incident: the job that hung alone (job_scope: the other jobs' processes out)
        sc, events = job_scope.scope(b, b.read_bpf_events())
        arts = artifacts_mod.read_artifacts(b)
        comms = job_scope.drop_rows({"c": arts.table("nccl_debug", "nccl_comms")}, sc)["c"]
        ranks = nccl_mod.process_ranks(b, events, comms)
        endpoints = tcp_ranks.endpoint_table(b, events)
        facts = nccl_config.host_facts(b, arts)
        pcap = scan_pcaps(b, fingerprints=skew, keep=sc.keeps_file)
        job_scope.drop_early_packets(pcap, sc, b.problems)
    finally:
        b.close()
    flows = pd.concat(pcap.flows, ignore_index=True) if pcap.flows else None
    return HostPart(bundle=b, comms=comms, pid_ranks=ranks, endpoints=endpoints, netns=tcp_ranks.netns_pid_table(b),
                    nccl=nccl_mod.nccl_events(b, events, ranks), bpf_tcp=tcp_ranks.bpf_tcp_frame(b, events),
                    offcpu=offcpu_mod.offcpu_samples(b, events, ranks),
                    windows=windows_mod.bundle_windows(b, events, flows),
                    tables=job_scope.drop_rows(artifacts_mod.host_tables(b, arts, ranks, facts, events), sc),
                    pcap=pcap)


_PR_SET_THP_DISABLE, _PR_GET_THP_DISABLE = 41, 42     # linux/prctl.h


def _libc_function(name: str):
    """glibc's function ``name`` (ctypes, int arguments), or None elsewhere."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return None
        return getattr(ctypes.CDLL(None), name)
    except (ValueError, OSError, AttributeError):
        return None


@contextmanager
def small_pages():
    """The block run with the process's transparent huge pages off (Linux ``prctl``
    ``PR_SET_THP_DISABLE``), and back on after unless they were off before. numpy asks for
    huge pages for every array of 4 MiB or more (``madvise``); the kernel then zeroes 2 MiB at
    a time on the first touch, and a reading of a big log touches gigabytes of fresh columns
    once each (the effect: bench/README.md, the init-heavy log). Elsewhere, or where ``prctl``
    fails, the block runs as it is. Process-wide: a block run by two threads at once may end
    with huge pages on while the other still runs (slower, not wrong)."""
    prctl = _libc_function("prctl")
    was = prctl(_PR_GET_THP_DISABLE, 0, 0, 0, 0) if prctl is not None else -1
    off = was == 0 and prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        if off:
            prctl(_PR_SET_THP_DISABLE, 0, 0, 0, 0)


@contextmanager
def _no_cyclic_gc():
    """The block run with the cyclic garbage collector off (back on after if it was on): a
    big log's reading makes millions of objects, few of them in cycles, and the collector
    walked them again and again (bench/README.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def open_source(source) -> Bundle:
    """The bundle at a path, or loose evidence as a pseudo-bundle."""
    if isinstance(source, (str, bytes, os.PathLike)):
        return Bundle.open(source)
    return LooseBundle(source)


class _Fingerprints:
    """``analyze_file``'s per-batch hook: the sampled segments' keys and capture times."""

    def __init__(self, shift: int) -> None:
        self.mask = (1 << shift) - 1
        self.parts: list[dict[str, np.ndarray]] = []
        self.conv = None

    def __call__(self, batch, conv) -> None:
        self.conv = conv
        pk, out = batch.pk, batch.out
        seq = pk.seq.astype(np.uint64)
        # a multiplicative hash of the raw sequence number: both hosts see the same bytes
        keep = ((seq * np.uint64(0x9E3779B1)) >> np.uint64(7)) & np.uint64(self.mask) == 0   # mask 0: every one
        if not keep.any():
            return
        src, dst = conv.address_codes(out["key"][keep], out["dir"][keep])
        self.parts.append({"src": src, "sport": pk.sport[keep], "dst": dst, "dport": pk.dport[keep],
                           "seq_raw": pk.seq[keep], "len": pk.seglen[keep], "tcp_flags": pk.flags[keep],
                           "t": pk.ts[keep].astype(np.int64)})

    def frame(self) -> pd.DataFrame | None:
        if not self.parts:
            return None
        cols = {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}
        addrs = np.array(list(self.conv.addresses), dtype=object)
        out = pd.DataFrame({k: v for k, v in cols.items() if k not in ("src", "dst")})
        out["src"], out["dst"] = addrs[cols["src"]], addrs[cols["dst"]]
        return out


def _sample_shift(paths) -> int:
    """log2 of the sampling step that keeps about FINGERPRINTS_PER_HOST segments."""
    est = sum(os.path.getsize(p) for p in paths) // _BYTES_PER_PACKET
    shift = 0
    while est >> shift > FINGERPRINTS_PER_HOST:
        shift += 1
    return shift


def scan_pcaps(bundle: Bundle, *, fingerprints: bool = True, keep=None) -> PcapPart:
    """Every capture of the bundle through the TCP engine, once: flagged packets with their
    verdict rows, flows, the flow timing aggregates (:class:`~.timing.TimingCollector`) and,
    with ``fingerprints``, the sampled segment keys :func:`~.skew.estimate_skew` matches.
    ``keep(rel)``: whether a capture is read (:meth:`.job_scope.JobScope.keeps_file`)."""
    part = PcapPart()
    caps = [(rel, p) for rel, p in bundle.pcaps() if keep is None or keep(rel)]
    shift = _sample_shift([p for _, p in caps]) if fingerprints else 0
    prints: list[pd.DataFrame] = []
    for rel, path in caps:
        timing = TimingCollector()
        fp = _Fingerprints(shift) if fingerprints else None

        def hook(batch, conv, timing=timing, fp=fp):
            timing(batch, conv)
            if fp is not None:
                fp(batch, conv)
        try:
            res = analyze_file(path, keep="flagged", on_batch=hook)
        except InputError as e:
            bundle.problems.append(f"{rel}: unreadable capture ({e})")
            continue
        part.packets_seen += res.stats.frames
        t = timing.aggregate(rel)
        if t is not None:
            part.timing.append(t.assign(host=bundle.host))
        if fp is not None and (f := fp.frame()) is not None:
            prints.append(f)
        bundle.problems.extend(f"{rel}: {d}" for d in res.stats.defects)
        if res.stats.frames == 0:
            bundle.problems.append(f"{rel}: no packets (tcpdump captured nothing on this interface): "
                                   "no packet evidence for the ranks behind it")
        elif res.stats.tcp_packets == 0:
            bundle.problems.append(f"{rel}: {res.stats.frames} frames but no TCP: no packet evidence "
                                   "(traffic over RDMA or another protocol?)")
        pk, ev = tcp_ranks.verdict_rows(res.packets, bundle.host, rel)
        if pk is not None:
            part.packets.append(pk)
        if ev is not None:
            part.events.append(ev)
        f = res.flows
        if len(f):
            fl = f.copy()
            fl["capture"] = rel
            fl["host"] = bundle.host
            fl["orig_addr"] = fl["orig_addr"].astype(str)
            fl["resp_addr"] = fl["resp_addr"].astype(str)
            part.flows.append(fl)
    if prints:
        part.fingerprints = pd.concat(prints, ignore_index=True)
        pairs = part.fingerprints[["src", "dst"]].drop_duplicates()
        part.address_pairs = frozenset(zip(pairs["src"], pairs["dst"]))
    return part
