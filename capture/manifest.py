"""The schema of a bundle's ``manifest.json``: the one definition the writer and the reader share.

Every key of the manifest is a :class:`Field` of a :class:`Table`: its name, its kind (what the
JSON value is; one of :data:`KINDS`) and what it means. :data:`TOP` holds the top-level keys;
the keys that hold objects or lists of objects name their own table (:data:`PROCESS`,
:data:`SOCKET`, :data:`RECORD` for each collector's record, :data:`NETNS`, :data:`FILE`,
:data:`CLOCK_SAMPLE`, ...). Any field may be ``null`` where the fact is unknown.

The writer (``capture``) builds every object of the manifest through :meth:`Table.make`, which
refuses a key its table lacks; the collectors' records start from :meth:`Table.defaults` of
:data:`RECORD`. The reader (``forensics/inputs/bundle.py``) reads each field of its typed records by
the kind its table gives, and cannot name a field the table lacks. ``tests/capture/test_manifest_schema.py``
checks both sides against these tables, and that docs/DESIGN.md ("Bundle layout") carries
:func:`markdown`'s tables (``python -m capture.manifest`` prints them).

``always``: the current writer writes the key in every manifest of a finished capture (a
collector's record: :meth:`capture.session.Session.record` creates it). Keys that are not
``always`` appear in some bundles only (the watcher's, a recovered one, one collector's record).
Bundles written before a key existed lack it; the reader takes a missing key as unknown.

Standard library only: imported by the capture side and by the analyzer.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1

# ------------------------------------------------------------------ kinds
INT = "int"
NUMBER = "number"
STR = "str"
BOOL = "bool"
STRS = "list[str]"
INTS = "list[int]"
ARGV = "argv"
MAP = "map"
INTERVAL = "interval"
INTERVALS = "list[interval]"
OBJECT = "object"
RECORDS = "records"
RECORD_MAP = "record map"

KINDS = {
    INT: "an integer (int64)",
    NUMBER: "a number",
    STR: "a string",
    BOOL: "true or false",
    STRS: "a list of strings",
    INTS: "a list of integers",
    ARGV: "a list of strings (a number in it is read as its text)",
    MAP: "an object of strings (name -> value)",
    INTERVAL: "[first, last], two integers, first <= last",
    INTERVALS: "a list of intervals",
    OBJECT: "an object (its keys in the table named, or free-form)",
    RECORDS: "a list of objects, each as the table named",
    RECORD_MAP: "an object of objects (key -> an object as the table named)",
}


@dataclass(frozen=True, eq=False)      # a key is itself (compared and hashed by identity)
class Field:
    """One key: ``name``, ``kind`` (a key of :data:`KINDS`), ``doc`` (its meaning), ``always``
    (module docstring), ``table`` (the table of an object or of the objects it holds; None:
    free-form) and ``default`` (a record's value until a collector sets it)."""

    name: str
    kind: str
    doc: str
    always: bool = True
    table: "Table | None" = None
    default: Any = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")


@dataclass(frozen=True, eq=False)      # a table is itself (compared and hashed by identity)
class Table:
    """The keys of one object of the manifest, in the order the writer writes them."""

    name: str
    doc: str
    fields: tuple[Field, ...]

    def __post_init__(self):
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: a key defined twice")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        """The field ``name``; KeyError when this table does not define it."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"manifest {self.name}: no key {name!r} in the schema (capture/manifest.py)")

    def make(self, **values) -> dict:
        """The object of ``values`` in the order given; KeyError for a key this table lacks."""
        for name in values:
            self.field(name)
        return values

    def defaults(self) -> dict:
        """The ``always`` keys with their defaults (each a fresh copy)."""
        return {f.name: copy.copy(f.default) for f in self.fields if f.always}

    def unknown(self, obj: dict) -> list[str]:
        """The keys of ``obj`` this table does not define."""
        known = set(self.names)
        return [k for k in obj if k not in known]

    def missing(self, obj: dict) -> list[str]:
        """The ``always`` keys ``obj`` lacks."""
        return [f.name for f in self.fields if f.always and f.name not in obj]


# ------------------------------------------------------------------ the tables
CLOCK_SAMPLE = Table("clock_samples[]", "CLOCK_MONOTONIC and CLOCK_REALTIME read back to back", (
    Field("monotonic_ns", INT, "CLOCK_MONOTONIC, ns (the midpoint of the bracket)"),
    Field("realtime_ns", INT, "CLOCK_REALTIME (UTC), ns"),
    Field("uncertainty_ns", INT, "the bracket's width: how far apart the two readings may be"),
    Field("source", STR, "a sample added by recovery: `recovery` or `guardian, when the capture died`",
          always=False),
))

TIMEZONE = Table("timezone", "the host's time zone (log lines without a zone are read in it)", (
    Field("name", STR, "the zone's abbreviation (`UTC`, `CET`, ...)"),
    Field("utc_offset_s", INT, "its offset east of UTC at the capture, in seconds"),
))

OPTIONS = Table("options", "the capture's options", (
    Field("duration_s", NUMBER, "--duration (null: until stopped)"),
    Field("pids", INTS, "--pid"),
    Field("ifaces", STRS, "--iface"),
    Field("max_bytes", INT, "--max-bytes"),
    Field("nccl_libs", STRS, "--nccl-lib"),
    Field("nccl_tests", STR, "--nccl-tests"),
    Field("attach", STRS, "--attach"),
    Field("bpf", BOOL, "whether the tracer ran (--no-bpf: false)"),
    Field("pcap", BOOL, "whether tcpdump ran (--no-pcap: false); the reader expects pcaps unless false"),
    Field("snaplen", INT, "tcpdump's snap length"),
    Field("call_returns", BOOL, "uretprobes on the collectives (t1, rc of each call)"),
    Field("stacks", STR, "--stacks: auto | always | never"),
    Field("stacks_grace_s", NUMBER, "--stacks auto: how long the job is watched for progress"),
    Field("stacks_timeout_s", NUMBER, "each stack tool's time limit"),
    Field("fr_dump_wait_s", NUMBER, "how long a Flight Recorder dump is waited for"),
    Field("watch", BOOL, "true in a watcher's incident bundle", always=False),
))

BUDGET = Table("budget", "the byte budget's shares of --max-bytes and their use (capture/bundle_files.py)", (
    Field("max_bytes", INT, "--max-bytes"),
    Field("pcap", INT, "the pcaps' share"),
    Field("tracer", INT, "the tracer's share"),
    Field("other", INT, "the share of snapshots, logs and attachments"),
    Field("attach", INT, "the part of `other` kept for attachments"),
    Field("reserve", INT, "kept for the manifest, tar headers and gzip"),
    Field("other_used", INT, "bytes granted from `other`"),
    Field("attach_used", INT, "bytes granted from `attach`"),
))

ATTACHMENT = Table("collectors.*.sources[]", "one file the attachments collector copied", (
    Field("source", STR, "where it was found on the host"),
    Field("path", STR, "its path in the bundle"),
    Field("why", STR, "why it was attached (`--attach`, `NCCL_DEBUG_FILE of pid N`, ...)"),
))

RESTART = Table("collectors.*.restarts[]", "a restart of the tracer on the libraries the job maps now "
                "(capture/collectors/tracer.py)", (
    Field("at_ns", INT, "UTC ns: when it was decided"),
    Field("why", STR, "the libraries that appeared, or that no process maps any more"),
    Field("libraries", STRS, "the NCCL libraries the new program probes"),
    Field("stopped_ns", INT, "UTC ns: the old program stopped from here"),
    Field("started_ns", INT, "UTC ns: the new program started (its uprobes attach after it)"),
))

RECORD = Table("collectors.*", "one collector instance's record; key `name[@scope][:phase]`", (
    Field("status", STR, "ok | skipped | failed (running: still running when the manifest was staged)"),
    Field("reason", STR, "why it was skipped or failed, or what to know about its output"),
    Field("command", STR, "the command it ran"),
    Field("rc", INT, "the command's exit code"),
    Field("files", STRS, "the bundle files it wrote", default=[]),
    Field("stderr_tail", STR, "the end of the command's stderr", default=""),
    Field("started_ns", INT, "UTC ns"),
    Field("ended_ns", INT, "UTC ns"),
    Field("covered_ns", INTERVAL, "the UTC ns interval its output really covers (the tracer's first and last "
          "flush, tcpdump's first and last packet, a snapshot's sample time)", always=False),
    # collector-specific keys
    Field("sources", RECORDS, "attachments: the files copied", always=False, table=ATTACHMENT),
    Field("pipe", STR, "flight-recorder-trigger: the pipe written to", always=False),
    Field("dump", STR, "flight-recorder-trigger: the dump it produced", always=False),
    Field("samples", INT, "ss-series, offcpu: samples taken", always=False),
    Field("events", INT, "offcpu: events written", always=False),
    Field("packets", INT, "tcpdump: packets in its files", always=False),
    Field("dropped_by_kernel", INT, "tcpdump: packets the kernel dropped", always=False),
    Field("netns", STR, "tcpdump: the namespace's label", always=False),
    Field("iface", STR, "tcpdump: the interface", always=False),
    Field("ring", BOOL, "tcpdump: copied from the watcher's packet ring", always=False),
    Field("waiting", BOOL, "tcpdump (watcher, --pcap-ring on-trouble): not started, waiting for TCP trouble",
          always=False),
    Field("libraries", STRS, "tracer: the NCCL libraries probed", always=False),
    Field("cuda_libraries", STRS, "tracer: the CUDA runtime and driver libraries probed", always=False),
    Field("blocks", STRS, "tracer: the probe blocks of its program", always=False),
    Field("kernel_tracepoints", STRS, "tracer: the kernel tracepoints attached", always=False),
    Field("btf", BOOL, "tracer: whether the kernel has BTF", always=False),
    Field("call_returns", BOOL, "tracer: uretprobes on the collectives", always=False),
    Field("ring_slots", INT, "tracer (watcher): the ring's slots per thread", always=False),
    Field("library_versions", MAP, "tracer: each probed NCCL library's version, read from the file",
          always=False),
    Field("restarts", RECORDS, "tracer: its restarts on the libraries that appeared (the last 50)",
          always=False, table=RESTART),
    Field("summary", OBJECT, "tracer: counts of bpf/events.jsonl by kind, lost and dropped events, its span",
          always=False),
    Field("libraries_ahead", STRS, "tracer (watcher): the host's libnccl files found before any job mapped them "
          "(capture/tracer/libscan.py)", always=False),
    Field("libraries_left_out", STRS, "tracer (watcher): libnccl files found but not traced, past the bound on "
          "libraries (the first 50)", always=False),
    Field("hold", BOOL, "tracer (watcher): a process that maps an untraced libnccl is stopped until the "
          "restarted program covers it (STALLSCOPE_HOLD)", always=False),
    Field("overlaps_monotonic_ns", INTERVALS, "tracer (watcher): the [start, end] windows (monotonic ns) in which "
          "an old and a new program both ran (the last 50): events seen by both are kept once", always=False),
    Field("tracer_messages", STRS, "tracer: bpftrace's other output lines (the first 20)", always=False),
    Field("tool", STR, "native-stacks: the tool that took them", always=False),
    Field("decision", STR, "native-stacks: why they were taken (or not)", always=False),
    Field("threads", INT, "native-stacks: threads in the stacks", always=False),
    Field("seconds", NUMBER, "native-stacks: how long the process was stopped", always=False),
    Field("resumed_threads", INT, "native-stacks: threads found stopped and resumed", always=False),
))

SOCKET = Table("processes[].sockets[]", "a TCP socket of the process at the end (/proc/PID/net/tcp, fds)", (
    Field("fd", INT, "the process's descriptor"),
    Field("inode", INT, "the socket's inode"),
    Field("family", INT, "4 or 6"),
    Field("saddr", STR, "local address"),
    Field("sport", INT, "local port"),
    Field("daddr", STR, "peer address"),
    Field("dport", INT, "peer port"),
    Field("state", STR, "TCP state name (ESTABLISHED, ...)"),
    Field("retransmits", INT, "the kernel's retransmit counter of the socket"),
    # from the end ss snapshot of its namespace, where ss listed the connection
    Field("retrans_now", INT, "ss: unacknowledged retransmitted segments", always=False),
    Field("retrans_total", INT, "ss: retransmissions in the connection's life", always=False),
    Field("bytes_retrans", INT, "ss: bytes retransmitted", always=False),
    Field("bytes_sent", INT, "ss: bytes sent", always=False),
    Field("bytes_received", INT, "ss: bytes received", always=False),
    Field("lost", INT, "ss: segments presumed lost", always=False),
    Field("rtt_ms", NUMBER, "ss: smoothed round-trip time", always=False),
    Field("cwnd", INT, "ss: congestion window", always=False),
    Field("segs_out", INT, "ss: segments sent", always=False),
))

# the ss counters copied onto a socket (``capture.jobs.Jobs.process_facts``), in the order written
SS_COUNTERS = ("retrans_now", "retrans_total", "bytes_retrans", "bytes_sent", "bytes_received", "lost", "rtt_ms",
               "cwnd", "segs_out")

PROCESS = Table("processes[]", "a process of the job (capture/procs.py)", (
    Field("pid", INT, "its pid (as capture sees it)"),
    Field("rank", INT, "RANK (or OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID) of its environment"),
    Field("local_rank", INT, "LOCAL_RANK (or the MPI and Slurm equivalents)"),
    Field("world_size", INT, "WORLD_SIZE (or the MPI and Slurm equivalents)"),
    Field("master_addr", STR, "MASTER_ADDR"),
    Field("master_port", INT, "MASTER_PORT"),
    Field("comm", STR, "its command name"),
    Field("exe", STR, "its executable"),
    Field("cmdline", ARGV, "its arguments"),
    Field("env", MAP, "the rank variables and the NCCL_, TORCH_, TORCHELASTIC_, PYTORCH_, CUDA_, UCX_, GLOO_ ones"),
    Field("libnccl", STRS, "every NCCL library it maps"),
    Field("libnccl_untraced", STRS, "those exporting none of the entry points the tracer probes"),
    Field("nccl_version", STR, "the version string its libnccl file carries (capture/libversion.py; the analyzer "
          "uses it when no log line states one)"),
    Field("job_reasons", STRS, "why it is a job (capture/procs.py: JOB_REASONS)"),
    Field("libcudart", STRS, "the CUDA runtime libraries it maps"),
    Field("libcuda", STRS, "the CUDA driver libraries it maps"),
    Field("netns_inode", INT, "its network namespace's inode"),
    Field("start_ticks", INT, "its start time (clock ticks after boot, /proc/PID/stat)"),
    Field("python", BOOL, "whether it runs Python"),
    Field("hostname", STR, "the host name it sees (its UTS namespace)"),
    # added for a finished capture (capture.jobs.Jobs.process_facts); the staged manifest lacks them
    Field("netns", STR, "its namespace's label (`netns[].label`)"),
    Field("alive_at_end", BOOL, "whether it was alive when the capture ended"),
    Field("sockets", RECORDS, "its TCP sockets at the end", table=SOCKET),
    Field("ppid", INT, "its parent's pid (the launcher: torchrun, srun's step, mpirun's daemon)", always=False),
    Field("cgroup", STR, "its cgroup (/proc/PID/cgroup, the unified hierarchy's path)", always=False),
    Field("job", STR, "the job it belongs to (capture/jobs.py: `job.id` of its job)", always=False),
))

NETNS = Table("netns[]", "a network namespace of the job (capture/jobs.py)", (
    Field("inode", INT, "the namespace's inode"),
    Field("label", STR, "`host` (capture's own), `netns-<name>` or `netns-<inode>`: names its sys/ and pcap/ files"),
    Field("name", STR, "its `ip netns` name"),
    Field("own", BOOL, "whether it is capture's own"),
    Field("pids", INTS, "the job's processes in it"),
    Field("ifaces", STRS, "the interfaces followed in it"),
))

FILE = Table("files[]", "a file of the bundle", (
    Field("path", STR, "its path in the bundle"),
    Field("bytes", INT, "its size"),
    Field("sha256", STR, "its SHA-256, hex"),
))

TRIGGER = Table("trigger", "what made the watcher cut the bundle (capture/watch/triggers.py)", (
    Field("kind", STR, "hang | log | on-demand | ..."),
    Field("reason", STR, "in words"),
    Field("realtime_ns", INT, "UTC ns"),
    Field("monotonic_ns", INT, "CLOCK_MONOTONIC ns"),
    Field("pids", INTS, "the processes concerned"),
    Field("source", STR, "what saw it: `tracer`, `tracer-free (ss series)` (a job the tracer does not cover), "
          "a log's path, `trigger`"),
    Field("also", RECORDS, "the first trigger only: the triggers that followed within the incident (at most 50), "
          "each as this table", always=False),
))

PCAP_RUN = Table("watch.pcap_ring.runs[]", "one run of the watcher's packet ring", (
    Field("started_ns", INT, "UTC ns"),
    Field("why", STR, "what started it"),
    Field("stopped_ns", INT, "UTC ns; absent while it runs", always=False),
))

PCAP_RING = Table("watch.pcap_ring", "the watcher's packet ring", (
    Field("mode", STR, "--pcap-ring: on-trouble | always"),
    Field("linger_s", NUMBER, "--pcap-linger"),
    Field("runs", RECORDS, "its runs that overlap the window", table=PCAP_RUN),
))

STALL = Table("watch.stall", "a hang trigger's stall, as the watcher followed it through the after-window "
              "(capture/watch/stall.py)", (
    Field("state", STR, "pending (the first archive, written at the trigger) | resolved (progress resumed in "
          "the after-window) | stuck (still stuck at the end of the window) | ended (its processes exited)"),
    Field("stalled_since_ns", INT, "UTC ns: the stuck processes' last progress before the trigger"),
    Field("resumed_ns", INT, "UTC ns: when the last of them made progress again (resolved only)", always=False),
    Field("resolved_after_s", NUMBER, "seconds from stalled_since_ns to resumed_ns (resolved only)", always=False),
    Field("pids", INTS, "the stuck processes"),
    Field("ranks", INTS, "their ranks, where known"),
    Field("waited_for", RECORDS, "the traced processes of the host outside every collective at the trigger "
          "(what the stuck ones waited for, if on this host): {pid, rank}", always=False),
    Field("source", STR, "tracer | tracer-free (ss series)"),
))

WATCH = Table("watch", "the watcher's settings and the incident's window (capture/watch/incident.py)", (
    Field("started_ns", INT, "when the watch started, UTC ns"),
    Field("before_s", NUMBER, "--before"),
    Field("after_s", NUMBER, "--after"),
    Field("hang_after", STR, "--hang-after as applied"),
    Field("ring_bytes", INT, "--ring-bytes"),
    Field("window_ns", INTERVAL, "the window the bundle covers, UTC ns"),
    Field("watcher_pid", INT, "the watcher's pid"),
    Field("pcap_ring", OBJECT, "the packet ring", table=PCAP_RING),
    Field("stage", STR, "first (written at the trigger: the before-window and the state then) | complete "
          "(the same archive completed with the after-window, every file of the first kept)", always=False),
    Field("first_written_ns", INT, "UTC ns: when the first archive was on disk", always=False),
    Field("stall", OBJECT, "hang triggers: the stall and whether it resolved", always=False, table=STALL),
))

OTHER_JOB = Table("job.others[]", "another job whose processes the watcher followed meanwhile", (
    Field("id", STR, "its id (as `job.id`)"),
    Field("pids", INTS, "its processes"),
    Field("started_ns", INT, "its first process's start, UTC ns"),
))

JOB = Table("job", "the job that hung, of those the watcher followed (capture/jobs.py: Jobs.job_of)", (
    Field("id", STR, "`ppid:<launcher pid>` and `@<cgroup>`: processes with one launcher and cgroup are one job"),
    Field("pids", INTS, "its processes"),
    Field("ranks", INTS, "their ranks (the environment's)"),
    Field("launcher", STR, "the launcher's command line, as far as it was read"),
    Field("cgroup", STR, "their cgroup"),
    Field("started_ns", INT, "its first process's start, UTC ns"),
    Field("why", STR, "how it was chosen: the trigger's processes, and what ties the others to them"),
    Field("others", RECORDS, "the other jobs followed; the analysis leaves their processes out", table=OTHER_JOB),
))

RECOVERED = Table("recovered", "how a killed capture's staging folder became this bundle (capture/staging.py)", (
    Field("by_pid", INT, "the process that recovered it"),
    Field("at_ns", INT, "when, UTC ns"),
    Field("staging", STR, "the staging folder's name"),
    Field("died", OBJECT, "what the guardian recorded when the capture died (free-form), or null"),
))

STAGED = Table("capture", "the live capture a staged manifest belongs to (capture/runner.py)", (
    Field("pid", INT, "the capture's pid"),
    Field("bundle", STR, "the bundle it will write"),
    Field("arcroot", STR, "the archive's top folder"),
    Field("staged_ns", INT, "when this manifest was staged, UTC ns"),
))

TOP = Table("manifest.json", "the bundle's manifest (capture/runner.py: Capture.manifest_dict)", (
    Field("schema_version", INT, f"this schema's version ({SCHEMA_VERSION}); a newer one is read as far as it can"),
    Field("tool", STR, "`stallscope`"),
    Field("tool_version", STR, "capture's version"),
    Field("host", STR, "the short host name in the bundle's name"),
    Field("hostname", STR, "the full host name (the reader's fallback for `host`)"),
    Field("boot_id", STR, "the kernel's boot id (the clocks' relation holds within one boot)"),
    Field("kernel", STR, "the kernel's release"),
    Field("machine", STR, "the machine's architecture"),
    Field("timezone", OBJECT, "the host's time zone", table=TIMEZONE),
    Field("started_ns", INT, "the capture's start, UTC ns"),
    Field("ended_ns", INT, "its end, UTC ns (null in a staged manifest)"),
    Field("partial", BOOL, "a recovered or cut capture"),
    Field("partial_reason", STR, "why it is partial", always=False),
    Field("clock", STR, "which clock the times of which files are on"),
    Field("clock_samples", RECORDS, "at the start, every 5 s, at the end", table=CLOCK_SAMPLE),
    Field("options", OBJECT, "the capture's options", table=OPTIONS),
    Field("root", BOOL, "whether capture ran as root"),
    Field("budget", OBJECT, "the byte budget", table=BUDGET),
    Field("collectors", RECORD_MAP, "every collector instance's record, by key (`ss@host:start`, "
          "`tcpdump@netns-x/eth0`, `native-stacks@pid<PID>:hung`, `tracer`)", table=RECORD),
    Field("netns", RECORDS, "the job's network namespaces", table=NETNS),
    Field("processes", RECORDS, "the job's processes", table=PROCESS),
    Field("notes", STRS, "what capture wants the reader to know (cut files, missing pids, ...)"),
    Field("files", RECORDS, "every file of the bundle but the manifest", table=FILE),
    Field("trigger", OBJECT, "watcher bundles: the first trigger", always=False, table=TRIGGER),
    Field("watch", OBJECT, "watcher bundles: the watch's settings and window", always=False, table=WATCH),
    Field("job", OBJECT, "watcher bundles: the job that hung (its processes; the others followed)", always=False,
          table=JOB),
    Field("recovered", OBJECT, "recovered bundles: how", always=False, table=RECOVERED),
    Field("capture", OBJECT, "staged manifests only (removed by recovery): the live capture", always=False,
          table=STAGED),
))


def tables(root: Table = TOP) -> list[Table]:
    """``root`` and every table under it, each once, in the order they are first named."""
    out: list[Table] = []

    def walk(t: Table) -> None:
        if any(t is seen for seen in out):
            return
        out.append(t)
        for f in t.fields:
            if f.table is not None:
                walk(f.table)
    walk(root)
    return out


def problems(manifest: dict) -> list[str]:
    """What in a manifest the schema does not define, and the ``always`` keys it lacks, as
    ``path: key`` lines (empty: it matches). Free-form objects are not looked into."""
    out: list[str] = []

    def check(obj: Any, table: Table, where: str) -> None:
        if not isinstance(obj, dict):
            return
        out.extend(f"{where}: unknown key {k!r}" for k in table.unknown(obj))
        out.extend(f"{where}: missing key {k!r}" for k in table.missing(obj))
        for f in table.fields:
            v = obj.get(f.name)
            if f.table is None or v is None:
                continue
            if f.kind == RECORDS and isinstance(v, list):
                for i, item in enumerate(v):
                    check(item, f.table, f"{where}.{f.name}[{i}]")
            elif f.kind == RECORD_MAP and isinstance(v, dict):
                for k, item in v.items():
                    check(item, f.table, f"{where}.{f.name}[{k!r}]")
            elif f.kind == OBJECT:
                check(v, f.table, f"{where}.{f.name}")
    check(manifest, TOP, "manifest")
    return out


def markdown() -> str:
    """The schema as Markdown: the kinds, then one table per object (docs/DESIGN.md carries this text)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")
    parts = ["| kind | JSON value |\n|---|---|\n" + "\n".join(f"| {k} | {cell(v)} |" for k, v in KINDS.items())]
    for t in tables():
        lines = [f"`{t.name}`: {t.doc}", "", "| key | kind | content |", "|---|---|---|"]
        for f in t.fields:
            kind = f.kind if f.table is None else f"{f.kind} `{f.table.name}`"
            lines.append(f"| `{f.name}` | {kind} | {cell(f.doc)}{'' if f.always else ' (some bundles only)'} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
