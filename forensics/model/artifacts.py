"""The bundle's parsed artefacts (NCCL logs, nccl-tests, py-spy, ss, Flight Recorder,
Inspector) as model tables, attributed to host, pid and rank.

:func:`read_artifacts` parses every artefact of one bundle once, with the parser the
registry (:mod:`forensics.parsers`) assigns by folder and content; :func:`artifact_tables`
turns all bundles' artefacts into the tables ``nccl_config``, ``nccl_warnings``,
``host_facts`` (:mod:`.nccl_config`), ``fr_entries``, ``fr_pg_status`` and the GPU
durations of ``nccl_events`` (:mod:`.gpu_times`), and here ``nccl_tests``, ``nccl_tests_runs``,
``stacks``, ``sockets`` and the job's own logs' ``watchdog_events``, ``process_exits``,
``ib_ports``, ``kernel_events``, ``fr_report`` and ``gpu_events`` (:func:`log_table`; joined across files by :mod:`.logs`).

Where a parser looks:

- ``logs/**`` (and loose evidence, :mod:`forensics.inputs.loose`): by content. A structured file
  (Inspector JSONL, a profiler trace, a Flight Recorder dump, a py-spy dump) is read by the one
  parser its first bytes show; a text log by every text parser whose markers stand anywhere in
  it (a job's output holds NCCL lines, watchdog timeouts, torchrun's summary, an nccl-tests run
  together; :class:`forensics.parsers.text.TextParser`). Other files (dmesg, tcpdump's stderr)
  are left to their own readers; a loose file nobody claims is listed as not read, with why;
- ``nccl-tests/**`` nccl-tests output (and, by content, the other text formats in it),
  ``flight-recorder/**``, ``stacks/**``, ``sys/**/ss*``, ``sys/**/ibstat*``: by folder.

NCCL_DEBUG logs are parsed with their COLL lines reduced to the last one of each process and
communicator (``nccl_coll_last``: one line per call, millions in a big log; calls come from the
tracer); their line numbers are kept.

A bundle without these folders costs one directory listing. Everything a parser
warns about becomes a line of the bundle's problems (host-prefixed by the model), at
most :data:`WARNINGS_PER_FILE` per file; nothing here raises on bad content.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import gpu_times, inits, nccl_config, state
from ..errors import InputError
from ..parsers import registry
from ..parsers.ib_counters import IbCountersParser, ib_deltas, snapshot_values
from ..parsers.registry import ParseResult, looks_binary
from ..parsers.text import LogText
from .schema import concat, conform, empty

WARNINGS_PER_FILE = 5
# parsers tried on files under logs/ and on loose evidence (content decides: every text parser
# whose markers the file holds, or the one structured format its first bytes show)
LOG_PARSERS = ("nccl_inspector", "nccl_profiler_trace", "nccl_tests", "flight_recorder", "pyspy", "nccl_debug",
               "torch_watchdog", "torch_elastic", "ib_status", "ib_counters", "ncclras", "kernel_log", "fr_analyzer",
               "launcher_exits", "torch_init", "nvidia_smi")
# loose evidence may also be what a capture would have put in its own folders
LOOSE_PARSERS = LOG_PARSERS + ("ss", "native_stacks")
# folder -> the parser its files are for (content does not decide: a bad file there is a warning)
FOLDER_PARSERS = {"nccl-tests": "nccl_tests", "flight-recorder": "flight_recorder", "stacks": "pyspy"}
ARTIFACT_TABLES = ("nccl_config", "nccl_warnings", "host_facts", "nccl_tests", "nccl_tests_runs", "stacks", "sockets",
                   "fr_entries", "fr_pg_status", "ib_counters", "coll_log_ops", "threads", "watchdog_events",
                   "process_exits", "ib_ports", "ras_ranks", "kernel_events", "fr_report", "init_errors", "gpu_events",
                   "comm_inits")
# capture's native stacks (eu-stack / gdb / py-spy --native) sit in stacks/ beside py-spy's dumps
NATIVE_STACKS_RE = re.compile(r"(?:^|/)native-[^/]*$")
PHASE_RE = re.compile(r"(?:^|[-_.])(start|end)(?:[-_.]|$)")


@dataclass
class BundleArtifacts:
    """What one bundle's artefacts parsed into: parser name -> [(bundle-relative path, result)]."""

    host: str
    results: dict[str, list[tuple[str, ParseResult]]] = field(default_factory=dict)
    empty_logs: list[str] = field(default_factory=list)
    # per NCCL_DEBUG log: the last COLL line of each (pid, comm) (state.coll_positions)
    coll_positions: list[tuple[str, pd.DataFrame]] = field(default_factory=list)

    def of(self, parser: str) -> list[tuple[str, ParseResult]]:
        return self.results.get(parser, [])

    def table(self, parser: str, table: str) -> pd.DataFrame:
        """One parser table over every file, with an ``artifact`` column (the file)."""
        parts = []
        for rel, res in self.of(parser):
            df = res.tables.get(table)
            if df is not None and len(df):
                parts.append(df.assign(artifact=rel))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


@dataclass(frozen=True)
class _Job:
    rel: str
    path: Path
    parsers: tuple[str, ...]         # run each (the folder says what the file is)
    sniffed: tuple[str, ...] = ()    # then the first of these whose sniffer accepts the file
    content: bool = False            # instead: every parser of ``sniffed`` whose content claims it


def _jobs(bundle) -> list[_Job]:
    if bundle.loose is not None:      # loose evidence: typed by content alone
        return [_Job(rel, path, (), LOOSE_PARSERS, content=True) for rel, path in bundle.loose_files()]
    jobs = []
    for folder, name in FOLDER_PARSERS.items():
        if (bundle.root / folder).is_dir():
            # a benchmark's output carries NCCL_DEBUG lines too, an attached job log anything
            content = name == "nccl_tests"
            extra = tuple(p for p in LOG_PARSERS if p != name) if content else ()
            for rel, path in bundle.files(f"{folder}/**/*"):
                own = "native_stacks" if folder == "stacks" and NATIVE_STACKS_RE.search(rel) else name
                if registry.known(own):
                    jobs.append(_Job(rel, path, (own,), extra, content=content))
    if (bundle.root / "logs").is_dir():
        jobs += [_Job(rel, path, (), LOG_PARSERS, content=True) for rel, path in bundle.files("logs/**/*")]
    if (bundle.root / "sys").is_dir():
        jobs += [_Job(rel, path, ("ss",)) for rel, path in bundle.files("sys/**/ss*")]
        jobs += [_Job(rel, path, ("ib_status",)) for rel, path in bundle.files("sys/**/ibstat*")]
        if registry.known("ncclras"):
            jobs += [_Job(rel, path, ("ncclras",)) for rel, path in bundle.files("sys/**/ncclras*")]
    if (bundle.root / "proc").is_dir() and registry.known("proc_threads"):
        jobs += [_Job(rel, path, ("proc_threads",)) for rel, path in bundle.files("proc/**/*threads*")]
    return jobs


def read_artifacts(bundle) -> BundleArtifacts:
    """Every artefact of ``bundle`` parsed once (module docstring); what a loose set's files
    were read by, or why not, is noted on the bundle (``read_by``, ``not_read``)."""
    arts = BundleArtifacts(bundle.host)
    loose = bundle.loose is not None
    for job in _jobs(bundle):
        rel, path = job.rel, job.path
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if size == 0:
            if rel.startswith("logs/") and "nccl" in Path(rel).name.lower():
                arts.empty_logs.append(rel)
            elif loose:
                bundle.not_read[rel] = "empty file"
            elif not rel.startswith(("logs/", "sys/")):
                bundle.problems.append(f"{rel}: empty file")
            continue
        try:
            text = LogText.open(path, rel)
        except InputError as e:
            if loose:
                bundle.not_read[rel] = str(e).split(": ", 1)[-1]
            else:
                bundle.problems.append(str(e))
            continue
        try:
            if loose and _stallscope_output(text.head()):
                bundle.not_read[rel] = "a report stallscope wrote (not evidence)"
                continue
            chosen = _chosen(job, text)
            if loose:
                if chosen:
                    bundle.read_by[rel] = chosen
                else:
                    bundle.not_read[rel] = ("binary data no parser recognises" if looks_binary(text.head())
                                            else "no parser recognises its content (no NCCL, PyTorch, nccl-tests or "
                                                 "InfiniBand output in it)")
            for name in chosen:
                res = _parse(registry.get(name), text, rel, bundle)
                arts.results.setdefault(name, []).append((rel, res))
                if name == "nccl_debug":
                    arts.coll_positions.append((rel, _positions(res)))
        finally:
            text.close()
    if (bundle.root / "ib").is_dir() and any(True for _ in bundle.files("ib/**/*")):
        # the ib/ folder is one tree (start/end snapshots of every port): parsed once, for the
        # ib_counters table and the host facts both
        res = IbCountersParser.parse(bundle.root / "ib")
        bundle.problems.extend(res.warnings[:WARNINGS_PER_FILE])
        arts.results.setdefault("ib_counters", []).insert(0, ("ib", res))
    if arts.empty_logs:
        bundle.problems.append(f"logs/: {len(arts.empty_logs)} NCCL log file(s) are empty "
                               f"({', '.join(arts.empty_logs[:4])}{', ...' if len(arts.empty_logs) > 4 else ''}); "
                               "the capture's byte budget or the job left nothing in them")
    return arts


OWN_OUTPUT_RE = re.compile(rb'<meta name="generator" content="stallscope|\A# stallscope: |\A\{\s*"schema_version": \d+,'
                           rb'\s*"verdict":|"displayTimeUnit".*stallscope')


def _stallscope_output(head: bytes) -> bool:
    """An HTML report, Markdown summary, findings JSON or Perfetto trace of stallscope's own."""
    return OWN_OUTPUT_RE.search(head[:4096]) is not None


def _chosen(job: _Job, text: LogText) -> list[str]:
    """The parsers that read one file: the job's own, then by content. A structured format
    (JSON, a pickle) is one file's only format; any number of text parsers may share a log (a
    job's output holds NCCL lines, watchdog timeouts and an nccl-tests run together)."""
    chosen = list(job.parsers)
    head = text.head()
    if job.content:
        binary = looks_binary(head)
        cands = [registry.get(n) for n in job.sniffed if registry.known(n)]
        if not binary:   # every text parser's markers and needles found in one pass over the file
            text.first([m for p in cands for m in getattr(p, "MARKERS", ()) + getattr(p, "NEEDLES", ())])
        structured = [p for p in cands if p.STRUCTURED and _sniff(p, head)]
        if structured:
            return chosen + [structured[0].NAME]
        if not binary:
            chosen += [p.NAME for p in cands if not p.STRUCTURED and _claims(p, text) and p.NAME not in chosen]
        return chosen
    for name in job.sniffed:
        if _sniff(registry.get(name), head):
            chosen.append(name)
            if name != "nccl_tests":    # one format per file, but nccl-tests output may carry NCCL lines
                break
    return chosen


def _claims(parser, text: LogText) -> bool:
    try:
        return bool(parser.claims(text))
    except Exception:   # a sniffer bug must not stop the others
        return False


def _positions(res: ParseResult) -> pd.DataFrame:
    """The last COLL line of each (host, pid, comm) of one NCCL log (``nccl_coll_last``), in the
    columns :func:`.state.coll_log_table` reads."""
    t = res.tables.get("nccl_coll_last")
    if t is None or t.empty:
        return pd.DataFrame(columns=["log_host", "log_pid", "comm_ptr", "last_op_count", "last_op", "last_count",
                                     "nranks", "lines", "last_line", "last_ts", "ctx_clock"])
    return pd.DataFrame({"log_host": t["host"], "log_pid": t["pid"], "comm_ptr": t["comm"],
                         "last_op_count": t["op_count"], "last_op": t["op"], "last_count": t["count"],
                         "nranks": t["nranks"], "lines": t["lines"], "last_line": t["line"], "last_ts": t["ts"],
                         "ctx_clock": t["ctx_clock"]})


def _sniff(parser, head: bytes) -> bool:
    try:
        return bool(parser.sniff(head))
    except Exception:   # a sniffer bug must not stop the others
        return False


def _parse(parser, text: LogText, rel: str, bundle) -> ParseResult:
    try:
        if parser.NAME == "nccl_debug":
            res = parser.parse_text(text, rel, coll="positions", lines=False)   # what the model reads
        elif hasattr(parser, "parse_text"):
            res = parser.parse_text(text, rel)
        else:
            # a structured format (JSON, a pickle) reads the bytes as they are; the other
            # parsers the text as repaired (:mod:`forensics.parsers.normalize`)
            res = parser.parse_bytes(bytes(text.raw if parser.STRUCTURED else text.data), rel)
    except Exception as exc:   # parsers promise not to raise; if one does, it is a warning, not a crash
        msg = f"{rel}: {parser.NAME} parser failed: {type(exc).__name__}: {exc}"
        bundle.problems.append(msg)
        return ParseResult(parser=parser.NAME, source=rel, warnings=[msg])
    warn = res.warnings
    bundle.problems.extend(warn[:WARNINGS_PER_FILE])
    if len(warn) > WARNINGS_PER_FILE:
        bundle.problems.append(f"{rel}: {len(warn) - WARNINGS_PER_FILE} more warning(s)")
    return res


def phase_of(rel: str) -> str | None:
    m = PHASE_RE.search(Path(rel).stem)
    return m[1] if m else None


def _map_rank(df: pd.DataFrame, ranks: dict[int, int]) -> pd.Series:
    return pd.to_numeric(df["pid"], errors="coerce").map(ranks).astype("Int64")


# --------------------------------------------------------------------------- simple tables

def stacks_table(bundle, arts: BundleArtifacts, ranks: dict[int, int]) -> pd.DataFrame:
    """py-spy dumps and capture's native stacks, one row per frame."""
    parts = [t for t in (arts.table("pyspy", "stacks"), arts.table("native_stacks", "stacks")) if len(t)]
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if df.empty:
        return empty("stacks")
    df = df.rename(columns={"file": "code_file"})
    df["host"] = bundle.host
    df["rank"] = _map_rank(df, ranks)
    df["phase"] = df["artifact"].map(phase_of)
    return conform(df, "stacks")


def sockets_table(bundle, arts: BundleArtifacts, ranks: dict[int, int]) -> pd.DataFrame:
    """One host's ``ss`` samples, ranked by its own processes; :func:`attribute_sockets`
    adds what needs every host's endpoints."""
    parts = []
    for rel, res in arts.of("ss"):
        df = res.tables.get("sockets")
        if df is None or df.empty:
            continue
        parts.append(df.assign(artifact=rel, netns=rel.split("/")[1] if rel.count("/") >= 2 else None,
                               phase=res.facts.get("phase") or phase_of(rel)))
    if not parts:
        return empty("sockets")
    df = pd.concat(parts, ignore_index=True)
    df["host"] = bundle.host
    df["rank"] = _map_rank(df, ranks)
    return df


def attribute_sockets(df: pd.DataFrame, attr) -> pd.DataFrame:
    """Every host's :func:`sockets_table` rows with the rank of the local end (where the
    host's own processes did not tell) and of the peer, from every host's endpoints."""
    if df.empty:
        return empty("sockets")
    df = df.reset_index(drop=True)
    own = attr.owner(df["local_addr"].astype(str), pd.to_numeric(df["local_port"], errors="coerce"))
    df["rank"] = pd.to_numeric(df["rank"], errors="coerce").astype("Int64").fillna(
        pd.to_numeric(own["rank"], errors="coerce").astype("Int64").set_axis(df.index))
    df["peer_rank"] = pd.to_numeric(attr.peer_rank(df["peer_addr"].astype(str),
                                                   pd.to_numeric(df["peer_port"], errors="coerce")),
                                    errors="coerce").astype("Int64").set_axis(df.index)
    return conform(df, "sockets")


FAILURE_HOST_RE = re.compile(r"^\s*(?:\.\.\s*)?(?P<host>[^\s:]+?)(?: pid \d+)?: Test (?:NCCL |CUDA )?(?:failure|timeout)")


# the cause nccl-tests quotes after a failure: "Test NCCL failure common.cu:1204 'unhandled cuda error'"
FAILURE_CAUSE_RE = re.compile(r"Test (?:NCCL |CUDA )?failure \S+ '")


def failure_hosts(failures: list) -> list[str]:
    """The hosts nccl-tests' failure lines name (``HOST: Test NCCL failure ...``, `` .. HOST pid
    N: Test failure ...``), in the order they first fail."""
    return list(dict.fromkeys(m["host"] for f in failures if (m := FAILURE_HOST_RE.search(str(f)))))


def failure_text(failures: list) -> str | None:
    """The failure line to quote: the first that says why (nccl-tests' quoted cause), else the
    first; without the host in front (the finding names the hosts)."""
    if not failures:
        return None
    text = str(next((f for f in failures if FAILURE_CAUSE_RE.search(str(f))), failures[0]))
    if (m := FAILURE_HOST_RE.search(text)):
        text = text[m.end("host"):].lstrip(" :")
        text = re.sub(r"^pid \d+:\s*", "", text)
    return text.strip()


def _tests_host(bundle, rel: str, devs, failures: list) -> str:
    """The host an nccl-tests run is reported under: the one its failure line names (nccl-tests
    prints the failing host), else the capture's, else (loose output) the host of its rank 0,
    else a label made from the file."""
    for f in failures or []:
        if (m := FAILURE_HOST_RE.search(str(f))):
            return m["host"]
    if bundle.loose is None:
        return bundle.host
    if devs is not None and len(devs) and devs["host"].notna().any():
        d = devs.dropna(subset=["host"]).sort_values("rank", kind="stable")
        return str(d["host"].iloc[0])
    return f"unknown:{rel}"


def nccl_tests_tables(bundle, arts: BundleArtifacts) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, runs = [], []
    for rel, res in arts.of("nccl_tests"):
        t = res.tables.get("nccl_tests")
        devs = res.tables.get("nccl_tests_devices")
        f = res.facts
        host = _tests_host(bundle, rel, devs, f.get("failures"))
        if t is not None and len(t):
            rows.append(t.assign(host=host, artifact=rel))
        tests = list(dict.fromkeys([x for x in (t["test"].dropna().unique() if t is not None and len(t) else [])]))
        if not tests and f.get("avg_busbw_gbps") is None and not f.get("failures") \
                and f.get("out_of_bounds") is None:
            continue                 # a footer alone ("Out of bounds values : 56 FAILED") is a run
        for test in tests or [None]:
            sub = t[t["test"] == test] if test is not None else t.iloc[0:0]
            bus = pd.to_numeric(sub["busbw_gbps"], errors="coerce")
            peak_size = sub["size_bytes"].max() if len(sub) else None
            at_peak = bus[sub["size_bytes"] == peak_size] if len(sub) else bus
            avg = (f.get("avg_busbw_by_test") or {}).get(test) if test else None
            if avg is None and (len(tests) <= 1):
                avg = f.get("avg_busbw_gbps")
            hosts = sorted(set(devs["host"].dropna())) if devs is not None and len(devs) else []
            runs.append({
                "host": host, "artifact": rel, "test": test, "version": f.get("version"),
                "ranks": int(devs["rank"].nunique()) if devs is not None and len(devs) else None,
                "nodes": len(hosts) or None, "test_hosts": ",".join(hosts) or None,
                "gpus": ",".join(sorted(set(devs["gpu"].dropna()))) if devs is not None and len(devs) else None,
                "rows": len(sub), "min_size_bytes": sub["size_bytes"].min() if len(sub) else None,
                "max_size_bytes": peak_size,
                "max_busbw_gbps": float(bus.max()) if bus.notna().any() else None,
                "max_busbw_size_bytes": sub.loc[bus.idxmax(), "size_bytes"] if bus.notna().any() else None,
                "busbw_at_max_size_gbps": float(at_peak.max()) if at_peak.notna().any() else None,
                "avg_busbw_gbps": avg, "avg_status": f.get("avg_busbw_status"),
                "wrong_total": float(pd.to_numeric(sub["wrong"], errors="coerce").sum()) if len(sub) else None,
                "out_of_bounds": f.get("out_of_bounds"), "failures": len(f.get("failures") or []),
                "failure_text": failure_text(f.get("failures") or []),
                "failure_hosts": ",".join(failure_hosts(f.get("failures") or [])) or None,
            })
    tests = conform(pd.concat(rows, ignore_index=True), "nccl_tests") if rows else empty("nccl_tests")
    return tests, conform(pd.DataFrame(runs), "nccl_tests_runs") if runs else empty("nccl_tests_runs")


def log_table(bundle, arts: BundleArtifacts, parser: str, table: str, name: str) -> pd.DataFrame:
    """One log parser's rows as the model table ``name``: the file (``artifact``), its line
    (``log_line``), the capture that holds it (``node``; NA for loose evidence). Hosts, pids and
    ranks the lines do not name are joined across files later (:mod:`.logs`)."""
    df = arts.table(parser, table)
    if df.empty:
        return empty(name)
    df = df.rename(columns={"line": "log_line"})
    df["node"] = bundle.node
    if "host" not in df.columns:
        df["host"] = pd.NA
    return conform(df, name)


def ras_table(bundle, arts: BundleArtifacts) -> pd.DataFrame:
    """What NCCL RAS reports named (``ras_ranks``): the ranks of its communicator entries and
    the job processes it lists missing or dead (rank NA); ``host`` is the node RAS names."""
    parts = []
    for name in ("ras_ranks", "ras_processes"):
        df = arts.table("ncclras", name)
        if len(df):
            df = df.rename(columns={"node": "host", "line": "log_line", "gpus": "gpu"})
            parts.append(df.assign(behind=True, missing=True) if name == "ras_processes" else df)
    if not parts:
        return empty("ras_ranks")
    df = pd.concat(parts, ignore_index=True)
    df["node"] = bundle.node
    return conform(df, "ras_ranks")


# --------------------------------------------------------------------------- IB counters

def ib_counters_table(bundle, arts: BundleArtifacts) -> pd.DataFrame:
    """Start/end deltas per port and counter of the bundle's ib/ tree; for a snapshot without
    phases (loose ``perfquery`` output), the values since the counters were last cleared
    (``start`` NA, :func:`forensics.parsers.ib_counters.snapshot_values`)."""
    df = arts.table("ib_counters", "ib_counters")
    if df.empty:
        return empty("ib_counters")
    # start/end snapshots give deltas; a file of one snapshot (a pasted perfquery) its values since
    # the last clear
    phased = df.groupby("artifact")["phase"].transform(lambda p: p.notna().any()).astype(bool)
    parts = [t for t in (ib_deltas(df[phased].drop(columns="artifact")) if phased.any() else None,
                         snapshot_values(df[~phased].drop(columns="artifact")) if (~phased).any() else None)
             if t is not None and len(t)]
    if not parts:
        return empty("ib_counters")
    d = pd.concat(parts, ignore_index=True)
    d["host"] = bundle.host
    return conform(d, "ib_counters")


# --------------------------------------------------------------------------- all of it

def host_tables(b, arts: BundleArtifacts, ranks: dict[int, int], host_facts: pd.DataFrame,
                events: list[dict] = ()) -> dict[str, pd.DataFrame]:
    """The artefact tables of one host that need no other host (:mod:`.hosts`' per-host stage);
    ``ranks``: the host's :func:`forensics.model.nccl.process_ranks` (the one pid -> global
    rank rule); ``gpu_records``: its Inspector and profiler-plugin records for the GPU times."""
    tests, runs = nccl_tests_tables(b, arts)
    cfg, warns = nccl_config.config_tables(b, arts, ranks)
    insp = [r for r in (gpu_times.inspector_records(b, arts), gpu_times.profiler_records(b, arts)) if len(r)]
    return {"nccl_config": cfg, "nccl_warnings": warns, "host_facts": host_facts,
            "watchdog_events": log_table(b, arts, "torch_watchdog", "watchdog", "watchdog_events"),
            "process_exits": concat([log_table(b, arts, p, "process_exits", "process_exits")
                                     for p in ("torch_elastic", "launcher_exits")], "process_exits"),
            "init_errors": log_table(b, arts, "torch_init", "init_errors", "init_errors"),
            "ib_ports": log_table(b, arts, "ib_status", "ib_ports", "ib_ports"),
            "ras_ranks": ras_table(b, arts),
            "kernel_events": log_table(b, arts, "kernel_log", "kernel_events", "kernel_events"),
            "fr_report": log_table(b, arts, "fr_analyzer", "fr_report", "fr_report"),
            "gpu_events": log_table(b, arts, "nvidia_smi", "gpu_events", "gpu_events"),
            "nccl_tests": tests, "nccl_tests_runs": runs, "stacks": stacks_table(b, arts, ranks),
            "ib_counters": ib_counters_table(b, arts), "coll_log_ops": state.coll_log_table(b, arts, cfg),
            "sockets": sockets_table(b, arts, ranks),
            "threads": state.threads_table(b, arts, ranks),
            "fr_entries": gpu_times.fr_entries(b, arts, ranks),
            "fr_pg_status": gpu_times.fr_entries(b, arts, ranks, "fr_pg_status"),
            "gpu_records": pd.concat(insp, ignore_index=True) if insp else pd.DataFrame(),
            "comm_inits": inits.comm_inits(b, list(events), arts.table("nccl_debug", "nccl_comms"))}


def artifact_tables(bundles: list, nccl: pd.DataFrame, attr, per_host: dict[str, dict[str, pd.DataFrame]]
                    ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """(nccl_events with GPU durations where the artefacts give them, the artefact tables) of
    every host: each host's :func:`host_tables` (``per_host``) put together, the sockets
    attributed with every host's endpoints (``attr``), the GPU times matched across hosts."""
    tables: dict[str, pd.DataFrame] = {}
    for name in ARTIFACT_TABLES:
        if name == "sockets":      # attributed below, with every host's endpoints
            continue
        tables[name] = concat([per_host[b.host][name] for b in bundles], name)
    socks = [per_host[b.host]["sockets"] for b in bundles if len(per_host[b.host]["sockets"])]
    tables["sockets"] = attribute_sockets(pd.concat(socks, ignore_index=True) if socks else pd.DataFrame(), attr)
    insp = [per_host[b.host]["gpu_records"] for b in bundles if len(per_host[b.host]["gpu_records"])]
    problems: list[tuple[str, str]] = []
    nccl = gpu_times.apply_gpu_durations(nccl, tables["fr_entries"],
                                         pd.concat(insp, ignore_index=True) if insp else pd.DataFrame(), problems)
    by_host = {b.host: b for b in bundles}
    for host, msg in problems:
        if host in by_host:
            by_host[host].problems.append(msg)
    return nccl, {name: tables.get(name, empty(name)) for name in ARTIFACT_TABLES}
