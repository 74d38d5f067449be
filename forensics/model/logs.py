"""Log lines joined across files: every row of a log table given its host, rank, pid and time.

One incident's evidence comes in many files: each rank's NCCL_DEBUG_FILE, the job's merged
stdout, torchrun's summary, an ``ibstat`` someone ran. A line names what its own prefix names
(NCCL's ``host:pid:tid``, PyTorch's ``[rankN]``, a launcher's tag); the rest comes from other
lines (:class:`Directory`):

- NCCL's Init lines tie each process (host, pid) to its global rank (``nccl_config``);
  torchrun's summary ties a rank to its host and pid (``process_exits``); a line that carries
  both an NCCL prefix and a launcher's rank tag ties that tag to the host;
- a row with a rank but no host (a watchdog timeout) takes its rank's host; a row with a host
  and pid but no rank takes its process's rank;
- a row still without a host takes the one host its file's other lines name (a per-rank
  file), else the capture's (a bundle's own log), else ``unknown:<file>``: never the machine
  that runs the analysis.

Times: a line's own time (NCCL >= 2.26, c10's ``E0321 02:07:08.408``) first, else its
launcher's or log shipper's (:mod:`forensics.parsers.lines`). A time without a zone is the local
time of the host that printed it: the capture's zone where its manifest records one
(``timezone``), else UTC; a time without a year (c10, syslog) takes the year the evidence's dated
lines give. :func:`attribute` returns the notes that say which assumptions were made.

The WARN lines are also classified here (:mod:`.nccl_errors`): class, cascade, the job's first
failure, the peer's host and rank, the IB status's name.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from ..parsers import lines as lines_mod
from . import nccl_errors
from ..parsers.nccl_warn_fields import ib_fields, peer_fields
from .schema import conform

UNKNOWN = "unknown:"
YEAR_ASSUMED = "this year (no line gives one)"     # the note saying the times' year is a guess
# the note saying times printed without a zone were read as UTC, a guess (the host's local time)
ZONE_ASSUMED = "log times without a zone are read as UTC"


@dataclass
class Directory:
    """Who is who across the evidence: (host, pid) -> rank, rank -> host and pid, address ->
    host and rank, and the hosts each file's lines name."""

    rank_of: dict[tuple[str, int], int] = field(default_factory=dict)
    hosts_of_rank: dict[int, set] = field(default_factory=dict)
    pid_of_rank: dict[int, set] = field(default_factory=dict)
    addr: dict[str, tuple[str | None, int | None]] = field(default_factory=dict)
    file_hosts: dict[str, set] = field(default_factory=dict)
    hosts: set = field(default_factory=set)
    # (node, bundle path) of files the user attached by hand: maybe the whole job's log, so a
    # line of theirs that names no host is not given the capture's host
    attached: set = field(default_factory=set)

    def host_of_rank(self, rank) -> str | None:
        if rank is None or pd.isna(rank):
            return None
        h = self.hosts_of_rank.get(int(rank), set())
        return next(iter(h)) if len(h) == 1 else None

    def one_pid(self, rank) -> int | None:
        if rank is None or pd.isna(rank):
            return None
        p = self.pid_of_rank.get(int(rank), set())
        return next(iter(p)) if len(p) == 1 else None

    def add(self, host, pid, rank) -> None:
        host = None if host is None or pd.isna(host) or host == "" else str(host)
        if host is not None:
            self.hosts.add(host)
        if rank is None or pd.isna(rank):
            return
        rank = int(rank)
        if host is not None:
            self.hosts_of_rank.setdefault(rank, set()).add(host)
            if pid is not None and not pd.isna(pid):
                self.rank_of[(host, int(pid))] = rank
        if pid is not None and not pd.isna(pid):
            self.pid_of_rank.setdefault(rank, set()).add(int(pid))


def _s(v) -> str:
    """A cell as text ("" for NA)."""
    return "" if v is None or v is pd.NA or (isinstance(v, float) and v != v) else str(v)


def host_text(host) -> str:
    """A host as a person reads it: the name the log prints, and for rows whose lines name no
    host (``unknown:<file>``) "host unknown (<file name>)": the file, never its path."""
    h = str(host)
    if not h.startswith(UNKNOWN):
        return h
    rel = h[len(UNKNOWN):]
    name = rel.replace(":", "/").rstrip("/").rsplit("/", 1)[-1] or rel
    return f"host unknown ({name})"


_UNKNOWN_IN_TEXT = re.compile(r"unknown:(?P<rel>[^\s,;()]+?)(?=:?(?:\s|$|[,;()]))")


def hosts_in_text(text: str) -> str:
    """``text`` with every ``unknown:<file>`` placeholder read as :func:`host_text` says."""
    if UNKNOWN not in text:
        return text
    return _UNKNOWN_IN_TEXT.sub(lambda m: host_text(UNKNOWN + m["rel"]), text)


def short_host(name) -> str | None:
    """A host name as NCCL prints it: cut at the first dot (``gpu004.cluster.local`` ->
    ``gpu004``); addresses stay whole."""
    if name is None or pd.isna(name) or not str(name):
        return None
    s = str(name)
    if s.replace(".", "").isdigit() or ":" in s:
        return s
    return s.split(".")[0]


def directory(tables: dict[str, pd.DataFrame]) -> Directory:
    d = Directory()
    cfg = tables.get("nccl_config", pd.DataFrame())
    for row in cfg.itertuples(index=False) if len(cfg) else ():
        own = _s(row.log_host) or _s(row.host) or None
        d.add(own, row.log_pid if pd.notna(row.log_pid) else row.pid, row.rank)
        if _s(row.host) and _s(row.host) != own:
            d.add(row.host, row.pid, row.rank)
        for col in ("socket_addrs", "oob_addr", "bootstrap_addr"):
            for a in _s(getattr(row, col)).split(","):
                if a.strip():
                    d.addr.setdefault(a.strip(), (own, int(row.rank) if pd.notna(row.rank) else None))
        for art in _s(row.artifact).split(","):
            if art and own:
                d.file_hosts.setdefault(art, set()).add(own)
    ex = tables.get("process_exits", pd.DataFrame())
    known = {short_host(h) for h in d.hosts}
    for row in ex.itertuples(index=False) if len(ex) else ():
        h = _s(row.host) or None
        if h and short_host(h) in known:
            h = short_host(h)
        d.add(h, row.pid, row.rank)
    # a line with both an NCCL host prefix and a launcher's rank tag: that tag is that host's
    # (and a launcher's address, Ray's ip=, that host's address)
    w = tables.get("nccl_warnings", pd.DataFrame())
    if len(w):
        for h, ip in set(zip(w["log_host"], w["ctx_host"])):
            if isinstance(h, str) and isinstance(ip, str) and (ip.replace(".", "").isdigit() or ":" in ip):
                d.addr.setdefault(ip, (h, None))
        pairs = w.dropna(subset=["log_host", "ctx_rank"])
        for h, r in set(zip(pairs["log_host"], pairs["ctx_rank"])):
            if int(r) not in d.hosts_of_rank:
                d.hosts_of_rank.setdefault(int(r), set()).add(h)
        for art, g in w.dropna(subset=["log_host"]).groupby("artifact"):
            d.file_hosts.setdefault(art, set()).update(g["log_host"])
    return d


@dataclass
class Clocks:
    """How log times become UTC: each capture's zone offset, the year for times without one."""

    offsets: dict[str | None, int]      # node -> seconds east of UTC (others, loose evidence: UTC)
    year: int
    notes: list[str]

    @classmethod
    def of(cls, captures: list[dict], texts: list[str]) -> "Clocks":
        offsets, zones = {}, set()
        for c in captures:
            tz = c.get("timezone") or {}
            off = tz.get("utc_offset_s") if isinstance(tz, dict) else None
            if isinstance(off, int):
                offsets[c.get("host")] = off
                zones.add(tz.get("name") or f"UTC{off / 3600:+g}")
        years = Counter(t.year for t in (lines_mod.clock(x) for x in texts if lines_mod.has_year(x)) if t is not None)
        starts = [c.get("started_ns") for c in captures if c.get("started_ns")]
        if years:
            year, why = years.most_common(1)[0][0], "the year of the evidence's dated lines"
        elif starts:
            year, why = datetime.fromtimestamp(min(starts) / 1e9, tz=timezone.utc).year, "the capture's year"
        else:
            year, why = datetime.now(timezone.utc).year, YEAR_ASSUMED
        notes = []
        if offsets:
            notes.append(f"log times without a zone are read in each capture host's zone ({', '.join(sorted(zones))}); "
                         "loose logs' in UTC")
        elif any(t is not None and t.tzinfo is None for t in (lines_mod.clock(x, year) for x in texts)):
            notes.append(f"{ZONE_ASSUMED} (no capture recorded the hosts' zone)")
        notes.append(f"times without a year (PyTorch's c10 log prefix) are read in {year}: {why}")
        return cls(offsets, year, notes)

    def utc_ns(self, texts: pd.Series, nodes: pd.Series) -> pd.Series:
        """UTC ns of each printed time (NA where unreadable), read in its node's zone."""
        out = pd.Series(pd.NA, index=texts.index, dtype="Int64")
        ok = texts.notna()
        if not ok.any():
            return out
        cache: dict[tuple, int | None] = {}
        vals = []
        for t, n in zip(texts[ok], nodes[ok] if nodes is not None else [None] * int(ok.sum())):
            key = (t, n if isinstance(n, str) else None)
            if key not in cache:
                cache[key] = self._one(str(t), key[1])
            vals.append(cache[key])
        out[ok] = pd.array(vals, dtype="Int64")
        return out

    def _one(self, text: str, node: str | None) -> int | None:
        dt = lines_mod.clock(text, self.year)
        if dt is None:
            return None
        if dt.tzinfo is None:
            off = self.offsets.get(node, 0)
            return int((dt.replace(tzinfo=timezone.utc).timestamp() - off) * 1e9)
        return int(dt.timestamp() * 1e9)


def attribute(tables: dict[str, pd.DataFrame], captures: list[dict]) -> list[str]:
    """Fill the log tables' hosts, ranks, pids and times in place (module docstring); the notes
    on the assumptions made, for the report."""
    d = directory(tables)
    d.attached = {(c.get("host"), p) for c in captures for p in c.get("user_attached") or ()}
    texts = _clock_texts(tables)
    clocks = Clocks.of(captures, texts)
    notes = list(clocks.notes) if texts else []
    wd = tables.get("watchdog_events")
    if wd is not None and len(wd):
        tables["watchdog_events"] = _watchdog(wd, d, clocks)
    w = tables.get("nccl_warnings")
    quoted = _quoted_warnings(tables, w)
    if len(quoted):
        w = quoted if w is None or w.empty else pd.concat([w, quoted], ignore_index=True)
    if w is not None and len(w):
        tables["nccl_warnings"] = _warnings(w, d, clocks)
    ex = tables.get("process_exits")
    if ex is not None and len(ex):
        # a summary's full name (gpu187.cluster.local) becomes NCCL's short one only when another
        # line names the host by it; else it stays as printed
        ex = ex.copy()
        ex["host"] = ex["host"].map(lambda h: short_host(h) if short_host(h) in d.hosts else h).astype("string")
        ex["host"] = _fill_hosts(ex, d)
        # the summary's own time, else the clock of the line's launcher or log shipper prefix
        t = clocks.utc_ns(ex["time"].astype("string").str.replace("_", " ", regex=False), ex["node"])
        ex["time_ns"] = t.fillna(clocks.utc_ns(ex["ctx_clock"], ex["node"])) if "ctx_clock" in ex else t
        tables["process_exits"] = conform(ex, "process_exits")
    ie = tables.get("init_errors")
    if ie is not None and len(ie):
        ie = ie.copy()
        ie["host"] = _fill_hosts(ie, d)
        ie["time_ns"] = clocks.utc_ns(ie["ctx_clock"], ie["node"])
        tables["init_errors"] = conform(ie, "init_errors")
    co = tables.get("coll_log_ops")
    if co is not None and len(co):
        co = co.copy()
        co["rank"] = co["rank"].fillna(_process_ranks(co, d))
        co["host"] = _fill_hosts(co, d)
        t = clocks.utc_ns(co["last_ts"].astype("string").str.replace("_", " ", regex=False), co["node"])
        co["time_ns"] = t.fillna(clocks.utc_ns(co["ctx_clock"], co["node"]))
        tables["coll_log_ops"] = conform(co, "coll_log_ops")
    cfg = tables.get("nccl_config")
    if cfg is not None and len(cfg) and cfg["host"].isna().any():
        cfg = cfg.copy()
        cfg["host"] = _fill_hosts(cfg.assign(artifact=cfg["artifact"].astype("string").str.split(",").str[0]), d)
        tables["nccl_config"] = conform(cfg, "nccl_config")
    ke = tables.get("kernel_events")
    if ke is not None and len(ke):
        ke = ke.copy()
        ke["host"] = _fill_hosts(ke, d)
        human = ke["time"].astype("string").where(ke["time"].astype("string").str.contains(":", regex=False))
        ke["time_ns"] = clocks.utc_ns(human, ke["node"])      # dmesg's seconds since boot give no time
        tables["kernel_events"] = conform(ke, "kernel_events")
    for name in ("ib_ports", "gpu_events"):       # rows whose host is their file's or the capture's
        t = tables.get(name)
        if t is not None and len(t):
            t = t.copy()
            t["host"] = _fill_hosts(t, d)
            tables[name] = conform(t, name)
    return notes


# the log tables whose rows carry a host (after :func:`attribute`)
HOSTED_TABLES = ("nccl_config", "nccl_warnings", "watchdog_events", "process_exits", "init_errors", "ib_ports",
                 "coll_log_ops", "gpu_events")


def file_hosts(tables: dict[str, pd.DataFrame]) -> dict[str, list[str]]:
    """file -> the hosts its rows name (loose evidence is grouped by them in the report)."""
    out: dict[str, set] = {}
    for name in HOSTED_TABLES + ("nccl_tests_runs",):
        t = tables.get(name)
        if t is None or t.empty or "artifact" not in t:
            continue
        for art, h in zip(t["artifact"].astype("string"), t["host"].astype("string")):
            if isinstance(art, str) and isinstance(h, str):
                for a in art.split(","):
                    out.setdefault(a, set()).add(h)
    return {a: sorted(h) for a, h in out.items()}


def job_hosts(tables: dict[str, pd.DataFrame], names: tuple[str, ...] = HOSTED_TABLES) -> list[str]:
    """The hosts the log tables ``names`` name (the job's own, not ``unknown:`` labels), sorted."""
    out = set()
    for name in names:
        t = tables.get(name)
        if t is not None and len(t) and "host" in t:
            out |= {h for h in t["host"].dropna().astype(str) if h and not h.startswith(UNKNOWN)}
    return sorted(out)


# --------------------------------------------------------------------------- tables

def _clock_texts(tables) -> list[str]:
    out: list[str] = []
    for name, cols in (("nccl_warnings", ("ts", "ctx_clock")), ("watchdog_events", ("log_time", "ctx_clock")),
                       ("process_exits", ("time", "ctx_clock")), ("coll_log_ops", ("last_ts", "ctx_clock"))):
        t = tables.get(name)
        if t is None or t.empty:
            continue
        for c in cols:
            if c in t:
                out += [str(x).replace("_", " ") for x in t[c].dropna().unique()[:2000]]
    return out


def _process_ranks(df: pd.DataFrame, d: Directory) -> pd.Series:
    """The rank NCCL's Init lines give each row's process (``log_host``, ``log_pid``), NA if none."""
    return pd.Series([d.rank_of.get((h, int(p))) if isinstance(h, str) and pd.notna(p) else None
                      for h, p in zip(df["log_host"], df["log_pid"])], index=df.index, dtype="Float64")


def _fill_hosts(df: pd.DataFrame, d: Directory) -> pd.Series:
    """``host`` where the row names one; else its rank's host; its launcher tag's host; the one
    host its file's lines name; the capture's; ``unknown:<file>``."""
    host = df["host"].astype("string")
    if "rank" in df:
        host = host.fillna(pd.Series([d.host_of_rank(r) for r in df["rank"]], index=df.index, dtype="string"))
    if "ctx_host" in df:
        host = host.fillna(df["ctx_host"].astype("string"))
    if "ctx_rank" in df:
        host = host.fillna(pd.Series([d.host_of_rank(r) for r in df["ctx_rank"]], index=df.index, dtype="string"))
    one = {a: next(iter(h)) for a, h in d.file_hosts.items() if len(h) == 1}
    host = host.fillna(df["artifact"].map(one).astype("string"))
    node = df["node"].astype("string")
    if d.attached:        # a file the user attached speaks for the job, not for the capture's host
        shared = pd.Series([(n, a) in d.attached for n, a in zip(node, df["artifact"].astype("string"))],
                           index=df.index, dtype=bool)
        node = node.mask(shared)
    host = host.fillna(node)
    return host.fillna(UNKNOWN + df["artifact"].astype("string"))


NCCL_TESTS_FAILURE_RE = re.compile(r"Test NCCL failure \S+ '(?P<err>[^']*?)(?: / (?P<last>[^']*))?'")


def _quoted_warnings(tables: dict, w: pd.DataFrame | None) -> pd.DataFrame:
    """NCCL's last WARN as others quote it, without its prefix: after PyTorch's ``Last error:``
    and in nccl-tests' ``Test NCCL failure ... 'error / last error'``; rows of ``nccl_warnings``
    (``src_file`` says who quoted it) unless the log holds that WARN line itself."""
    rows = []
    wd = tables.get("watchdog_events")
    if wd is not None and len(wd):
        for r in wd[wd["kind"] == "last_error"].itertuples(index=False):
            if isinstance(r.error, str) and r.error.strip():
                rows.append({"host": r.host, "rank": r.rank, "pid": r.pid, "message": r.error.strip(),
                             "src_file": "PyTorch Last error", "artifact": r.artifact, "log_line": r.log_line,
                             "node": r.node, "ctx_clock": r.ctx_clock})
    runs = tables.get("nccl_tests_runs")
    if runs is not None and len(runs):
        for r in runs.itertuples(index=False):
            m = NCCL_TESTS_FAILURE_RE.search(r.failure_text) if isinstance(r.failure_text, str) else None
            if m and m["last"] and m["last"].strip():
                rows.append({"host": r.host, "message": m["last"].strip(), "src_file": "nccl-tests",
                             "artifact": r.artifact, "node": None})
    if not rows:
        return pd.DataFrame()
    q = pd.DataFrame(rows)
    if w is not None and len(w):
        have = set(w["message"].dropna().astype(str))
        q = q[~q["message"].isin(have)]
    if q.empty:
        return q
    msgs = q["message"].astype(str).tolist()
    for k, v in {**ib_fields(msgs), **peer_fields(msgs)}.items():
        q[k] = v
    q["log_host"] = q["host"]
    q["class"] = nccl_errors.classify(q["message"])
    return conform(q, "nccl_warnings")


def _warnings(w: pd.DataFrame, d: Directory, clocks: Clocks) -> pd.DataFrame:
    w = w.copy()
    w["rank"] = w["rank"].fillna(_process_ranks(w, d))
    w["rank"] = w["rank"].fillna(w["ctx_rank"])
    w["host"] = _fill_hosts(w, d)
    t = clocks.utc_ns(w["ts"], w["node"])
    src = pd.Series(np.where(t.notna(), "nccl", None), index=w.index, dtype="object")
    launcher = clocks.utc_ns(w["ctx_clock"], w["node"])
    src = src.where(t.notna(), np.where(launcher.notna(), "launcher", None))
    w["time_ns"], w["time_source"] = t.fillna(launcher), src
    # the peer: the address's host and rank, or the host name NCCL printed
    peer = w["peer_addr"].astype("string")
    hosts = [d.addr.get(p, (None, None))[0] if isinstance(p, str) else None for p in peer]
    ranks = [d.addr.get(p, (None, None))[1] if isinstance(p, str) else None for p in peer]
    named = [short_host(p) if isinstance(p, str) and not any(c.isdigit() for c in p.split(".")[0][:1])
             and ":" not in p else None for p in peer]
    w["peer_host"] = [h or n for h, n in zip(hosts, named)]
    by_host: dict[str, set] = {}
    for r, hs in d.hosts_of_rank.items():
        for h in hs:
            by_host.setdefault(h, set()).add(r)
    w["peer_rank"] = [r if r is not None else (next(iter(by_host[h])) if h in by_host and len(by_host[h]) == 1
                                                else None) for r, h in zip(ranks, w["peer_host"])]
    if "class" not in w or w["class"].isna().all():
        w["class"] = nccl_errors.classify(w["message"], w.get("src_file"))
    w["cascade"] = nccl_errors.is_cascade(w["class"].astype("string").fillna("other"), w["ib_status"])
    w["ib_status_name"] = w["ib_status"].map(nccl_errors.ib_status_name)
    w["first"] = nccl_errors.first_failures(w.assign(time_ns=pd.to_numeric(w["time_ns"], errors="coerce")))
    return conform(w, "nccl_warnings")


def _watchdog(wd: pd.DataFrame, d: Directory, clocks: Clocks) -> pd.DataFrame:
    wd = wd.copy()
    if "ctx_rank" in wd:     # a line whose own text names no rank (DistBackendError, Last error) after ``[rank3]:``
        wd["rank"] = wd["rank"].fillna(wd["ctx_rank"])
    wd["host"] = _fill_hosts(wd, d)
    wd["pid"] = wd["pid"].fillna(pd.Series([d.one_pid(r) for r in wd["rank"]], index=wd.index, dtype="Float64"))
    t = clocks.utc_ns(wd["log_time"], wd["node"])
    launcher = clocks.utc_ns(wd["ctx_clock"], wd["node"])
    wd["time_source"] = np.where(t.notna(), "c10", np.where(launcher.notna(), "launcher", None))
    wd["time_ns"] = t.fillna(launcher)
    return conform(wd, "watchdog_events")


__all__ = ["Clocks", "Directory", "attribute", "directory", "file_hosts", "host_text", "hosts_in_text", "job_hosts",
           "short_host", "UNKNOWN", "YEAR_ASSUMED", "ZONE_ASSUMED"]
