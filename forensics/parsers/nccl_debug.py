"""NCCL_DEBUG logs (``NCCL_DEBUG=INFO|WARN|TRACE``, any NCCL from 2.3 to 2.30; WARN lines of 1.x-2.2).

A line is ``[<timestamp>] <host>:<pid>:<tid> [<cudaDev>] NCCL <LEVEL> <message>`` (some
collectors print ``<host> [<cudaDev>]``, no pid:tid; a WARN pasted without any host is read
too) after
any launcher prefix (Ray ``(RayTrainWorker pid=…)``, Open MPI ``[1,0]<stdout>:``,
torchrun ``[0]``, log collectors ``<date> <host> >>``), which is skipped by anchoring
on the NCCL prefix itself. The timestamp (NCCL >= 2.26) is optional, ``host`` may be
empty, WARN lines carry ``file:line`` and, from 2.30.7, ``(func)``. Bare
``NCCL version x`` lines (no prefix) are read too, and WARN lines of NCCL before 2.3, which
printed no ``NCCL`` (``host:pid:tid [dev] file:line WARN msg``, 2.0's ``host [dev] …``, 1.x's
``WARN file:line msg``: :data:`OLD_WARN_RE`). A host name is ``[A-Za-z0-9._-]``: a backtick,
quote or word glued before the prefix is not part of it. Lines that carry no NCCL prefix
(application output) are counted, not warned about; lines that mention NCCL but do
not parse, and recognised messages whose fields are malformed, are warned about.

Tables (every table also has ``line``: 1-based line number in the file):

``nccl_log_lines`` -- one row per NCCL line:
    ts (str, the timestamp as printed or NA), ts_local (datetime, naive local time),
    host (str, may be empty), pid (int), tid (int), dev (int, NA on CALL/VERSION lines and ``[-1]``),
    level (INFO|WARN|TRACE|CALL|ABORT|VERSION), kind (init|coll|channel|net|gdr|env|ring|
    tree|topology|nchannels|version|error_return|warn|other), message (str).
``nccl_coll`` -- COLL lines (``<Op>: opCount <hex> sendbuff … stream …``), issued ops:
    ts, ts_local, host, pid, tid, dev, op (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER,
    BROADCAST, REDUCE, SEND, RECV, ALL_TO_ALL, GATHER, SCATTER, or the name in upper
    snake case), op_name (as printed), op_count (int, parsed from hex), sendbuff,
    recvbuff (str, NA for ``(nil)``), count (int), datatype (int, ncclDataType_t),
    datatype_name (int8 … fp8e5m2), bytes (int: count x element size), red_op (int),
    red_op_name (sum|prod|max|min|avg|premulsum), root (int: the root, or the peer for
    SEND/RECV), peer (int: root for SEND/RECV, else NA), comm (str, per-process pointer),
    nranks (int), stream (str).
``nccl_comms`` -- ``comm … rank … nranks … - Init START|COMPLETE`` lines:
    host, pid, tid, dev, func (ncclCommInitRank… or NA), comm (pointer), rank, nranks,
    cuda_dev, nvml_dev (int), bus_id (str, hex as printed), comm_id (str ``0x…``, the
    cross-host communicator key; NA before 2.18), parent (str, split comms), status
    (START|COMPLETE).
``nccl_channels`` -- ``Channel CC[/conn] : r[d] -> r[d] [send|receive] via …`` lines:
    host, pid, tid, dev, channel (int), conn_index (int), src_rank, dst_rank (int),
    src_dev, dst_dev (str: busId hex before 2.18, nvmlDev after), direction
    (send|receive or NA), via (str), transport (NET|P2P|SHM|COLLNET|…), net (IB|Socket|
    plugin name, NET only), net_dev (int), gdrdma (bool).
``nccl_rings`` -- topology lines: host, pid, dev, kind (ring|tree|trees|ring_order),
    channel (int), rank (int), prev, next (int, rings), up (int), down (str
    ``d0/d1/d2``; trees), order (str, ring_order: the ranks in ring order), nchannels
    (int, ring_order's ``/NN``).
``nccl_warnings`` -- WARN lines (and libfabric's error lines, ``src_file`` ``libfabric``; in a log
    without a WARN line, each process's first ``file:line -> N`` error return): ts, ts_local, host, pid, tid, dev, src_file, src_line
    (int), func (str, NCCL >= 2.30.7), message, peer (str: the peer named in socket/IB
    errors), ib_status (int: IB work completion status in completion errors).

``nccl_warnings`` also: peer_addr (str: the peer's address or host name without the port),
    peer_port (int), ib_opcode, ib_len, vendor_err (int), ib_side (Send|Recv), local_gid,
    remote_gid (str), ib_device (str: the HCA a completion error names): the fields of IB
    completion errors in all their wordings.
``nccl_coll_last`` -- with ``coll="positions"`` instead of ``nccl_coll``'s rows: the last COLL
    line of each (host, pid, comm), by opCount, and how many there were: host, pid, tid, dev,
    comm, op, op_name, op_count, count, datatype, nranks, lines, line (of the last one), ts.

Every table of lines has the launcher context of its lines (:mod:`.lines`): ctx_rank,
ctx_local_rank, ctx_host, ctx_pid (int/str), ctx_clock (str as printed).

Lines are found without a Python loop over the log (:mod:`.text`): COLL lines are parsed into
columns by ``logscan.c`` (:mod:`.nccl_coll`) (a line in another form, e.g. an upper-case pointer, goes through the
regular expressions below instead); the init's Channel and Trees lines, and the prefixes of the
other INFO lines in the common form, by ``logscan.c`` too (:mod:`.nccl_topo`); every other NCCL
line is located by its marker and only those lines are decoded. A WARN line hard-wrapped by a terminal (exactly as long as a common
terminal width, followed by a line with no NCCL prefix) is joined with its continuation.

Facts: ``nccl_version`` (first seen), ``versions`` (all distinct), ``other_lines``
(count of non-NCCL lines), ``processes`` keyed ``"host:pid"`` with host, pid, version,
transport (IB|Socket|plugin from ``Using network``, else inferred from NET lines),
ib_devices ([{index, name, port, link_layer}]), oob_interface, oob_address,
socket_interfaces ([{index, name, address}]), interfaces (names), gdr (True if any
GPU Direct RDMA Enabled or GDRDMA channel, False if only Disabled, else None),
nchannels (int), env ({NCCL_*: value}), ranks ({comm pointer: rank}), comm_ids, bootstrap_address
(the address of ``Bootstrap : Using <if>:<addr>``).
"""
from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import pandas as pd

from . import lines as lines_mod
from ..coerce import group_int
from ..native import line_count
from .nccl_coll import (COLL_HEAD_RE, COLL_LAST_SCHEMA, COLL_RE, COLL_SCHEMA, coll_derived, concat_rows,
                        last_positions, scan_coll)
from .heads import NCCL_DEBUG_MARKERS
from .nccl_grammar import (BARE_WARN_RE, BOOTSTRAP_RE, CHANNEL_RE, ENV_RE, ERROR_RETURN_FIELDS_RE, ERROR_RETURN_RE,
                           GDR_RE, HOSTLESS_WARN_RE, IB_DEV_RE, INFO_VERSION_RE, INIT_HINT_RE, INIT_RE,
                           LIBFABRIC_ERROR_RE, LIBFABRIC_RE, LINE_RE, MENTION_RE, NCCL_RESULTS, NCHANNELS_RE,
                           NEEDLES, NET_IB_RE, NET_SOCKET_RE, NO_IB_DEVICE_RE, OLD_NEEDLES, OLD_WARN_RE, PIDLESS_RE,
                           RING_ORDER_RE, RING_RE, SOCK_DEV_RE, TOPO_RE, TREES_ITEM_RE, TREE_RE, USING_NET_RE,
                           V1_WARN_RE, VERSION_RE, WRAP_WIDTHS)
from .nccl_topo import VIA_RE, TopoLines, refine_processes, scan_topology
from .nccl_warn_fields import ib_fields, peer_fields
from .registry import WarningLog, register, typed_frame
from .text import Lines, LogText, TextParser


def _dev(v):
    """The cudaDev of a line's ``[N]``: None where absent, or ``[-1]`` (NCCL prints -1 before the
    communicator has a device: a ``ncclCommInitRank`` that failed on its CUDA call)."""
    d = group_int(v)
    return None if d is None or d < 0 else d


# the launcher context of a line (lines.Context.as_row)
CTX = lines_mod.CONTEXT_COLUMNS


class NcclDebugParser(TextParser):
    NEEDLES = NEEDLES       # the lines it reads (besides MARKERS: whether it reads the file at all)
    NAME = "nccl_debug"
    DESCRIPTION = "NCCL_DEBUG log: init/transport/channel lines, COLL lines, WARN lines"
    GLOBS = ("logs/*", "logs/**/*", "*.nccl.log", "nccl_debug*", "nccl*.log")
    SCHEMAS = {
        "nccl_log_lines": {"line": "int", "ts": "str", "ts_local": "time", "host": "str", "pid": "int",
                           "tid": "int", "dev": "int", "level": "str", "kind": "str", "message": "str", **CTX},
        "nccl_coll": COLL_SCHEMA,
        "nccl_comms": {"line": "int", "host": "str", "pid": "int", "tid": "int", "dev": "int",
                       "func": "str", "comm": "str", "rank": "int", "nranks": "int", "cuda_dev": "int",
                       "nvml_dev": "int", "bus_id": "str", "comm_id": "str", "parent": "str",
                       "status": "str", **CTX},
        "nccl_channels": {"line": "int", "host": "str", "pid": "int", "tid": "int", "dev": "int",
                          "channel": "int", "conn_index": "int", "src_rank": "int", "src_dev": "str",
                          "dst_rank": "int", "dst_dev": "str", "direction": "str", "via": "str",
                          "transport": "str", "net": "str", "net_dev": "int", "gdrdma": "bool"},
        "nccl_rings": {"line": "int", "host": "str", "pid": "int", "dev": "int", "kind": "str",
                       "channel": "int", "rank": "int", "prev": "int", "next": "int", "up": "int",
                       "down": "str", "order": "str", "nchannels": "int"},
        "nccl_warnings": {"line": "int", "ts": "str", "ts_local": "time", "host": "str", "pid": "int",
                          "tid": "int", "dev": "int", "src_file": "str", "src_line": "int",
                          "func": "str", "message": "str", "peer": "str", "ib_status": "int", "peer_addr": "str",
                          "peer_port": "int", "ib_opcode": "int", "ib_len": "int", "vendor_err": "int",
                          "ib_side": "str", "local_gid": "str", "remote_gid": "str", "ib_device": "str", **CTX},
        "nccl_coll_last": COLL_LAST_SCHEMA,
    }

    MARKERS = NCCL_DEBUG_MARKERS

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        lines = head.decode("utf-8", "replace").splitlines()[:200]
        return any(MENTION_RE.search(ln) and prefixed(LINE_RE, ln) for ln in lines) \
            or any(ln.startswith("NCCL version ") for ln in lines)

    @classmethod
    def claims(cls, text: LogText) -> bool:
        """Its markers, or (a log of NCCL before 2.3) a WARN line of the old forms among the
        first lines holding ``WARN ``."""
        if super().claims(text):
            return True
        if not text.holds_any(OLD_NEEDLES):
            return False
        for n, (_, line, _) in enumerate(text.iter(text.lines_with(OLD_NEEDLES))):
            if n >= OLD_CLAIM_LINES:
                break
            if _old_warn(line) is not None:
                return True
        return False

    @classmethod
    def parse_text(cls, text: LogText, label: str, coll: str = "rows", native: bool = True, lines: bool = True):
        """Parse one log. ``coll``: ``"rows"`` (a ``nccl_coll`` row per COLL line) or
        ``"positions"`` (``nccl_coll_last``: the last line of each process and communicator,
        what the model reads; a log of millions of COLL lines costs no row per line).
        ``lines=False``: ``nccl_log_lines`` left empty (a row per NCCL line, which the model does
        not read: millions of rows in a job that creates many communicators).
        ``native=False`` reads the init's Channel lines with the regular expressions too (the
        tables are the same: the tests compare the two)."""
        log = WarningLog(label)
        facts: dict = {"nccl_version": None, "versions": [], "other_lines": 0, "processes": {}}
        if cls.unreadable(text, log, "an NCCL_DEBUG text log"):
            return cls.result(label, {}, facts, log)

        # COLL lines in C; every other NCCL line located by its marker, decoded and read here
        # and the init's Channel lines in C too (nccl_topo)
        c_rows, c_last, other = scan_coll(text, coll)
        topo, other = scan_topology(text, other, cls.SCHEMAS, lines) if native else (TopoLines(), other)
        found = _read_lines(text, other, log, topo)
        rows, bare = found.rows, found.bare
        n_coll = len(c_rows) if c_rows is not None else int(c_last["lines"].sum()) if c_last is not None else 0
        n_rows = len(found.py_rows) + len(topo.info.get("line", ()))      # every line C read is one
        facts["other_lines"] = max(0, text_lines(text) - n_rows - len(bare) - found.mentions - n_coll - len(topo))
        if not n_rows and not n_coll and not len(topo):
            return cls.result(label, _versions_only(bare, facts, log, lines), facts, log)
        _stamp_local_times(rows)
        info = [r for r in rows if r.level == "INFO"]
        tables: dict = {}

        # COLL lines the C scanner left (another form), then Init START/COMPLETE lines
        coll_py = _section(info, COLL_HEAD_RE, COLL_RE, "coll", "COLL", log, needle=": opCount ")
        comms = _section(info, INIT_HINT_RE, INIT_RE, "init", "Init", log, needle=" - Init ")
        py = _coll_columns(coll_py) if coll_py else None
        if coll == "rows":
            tables["nccl_coll"] = concat_rows([c_rows, py])
        else:
            tables["nccl_coll_last"] = last_positions([c_last, py])
        if comms:
            tables["nccl_comms"] = _comms_table(comms)
        # channel connection lines, ring order, rings and trees; WARN lines
        chans, rings = _topology_lines(info)
        if chans or topo.channels is not None:
            tables["nccl_channels"] = _merged(_channels_table(chans) if chans else None, topo.channels,
                                              cls.SCHEMAS["nccl_channels"])
        tables["nccl_rings"] = _merged(rings, topo.rings, cls.SCHEMAS["nccl_rings"])
        warns = [r for r in rows if r.level == "WARN"] or _error_returns(info)
        if warns:
            tables["nccl_warnings"] = _warnings_table(warns)

        # per-process facts from the remaining INFO lines, refined by channels and comms
        procs = _process_facts(found.py_rows, info, tables, bare, facts, log, topo)
        refine_processes(procs, chans, comms, rings, topo)
        if lines:
            found.c_kinds[found.c_at] = [r.kind for r in found.c_rows]
            c_lines = topo.lines_with_kinds(found.c_kinds, coll == "rows")
            tables["nccl_log_lines"] = _merged(_log_lines_table(found.py_rows, bare, tables["nccl_coll"]
                                                                if coll == "rows" else None), c_lines,
                                               cls.SCHEMAS["nccl_log_lines"])
        return cls.result(label, tables, facts, log)


BASE = ("line", "ts", "ts_local", "host", "pid", "tid", "dev")


_LINE_FIELDS = ("ts", "host", "pid", "tid", "dev", "level", "msg")


class _Line:
    """One line with the NCCL prefix: its fields, and the kind of line it turns out to be."""
    __slots__ = ("line", "src", "ts", "ts_local", "host", "pid", "tid", "dev", "level", "msg", "kind", "pre")

    def __init__(self, line: int, g: re.Match, pre: str = ""):
        self.line = line
        self.pre = pre                       # the text before the NCCL prefix (launcher tags)
        # Python ints: a corrupt 30-digit pid must not overflow int64 here (the typed table
        # turns out-of-range values into NA)
        if g.re is LINE_RE:                  # the common form, every field by position
            self.ts, host, pid, tid, dev, self.level, msg = g.group(*_LINE_FIELDS)
            self.host, self.pid, self.tid = host or "", int(pid), int(tid)
            self.dev = _dev(dev)
            src = (g["src"], g["srcline"], g["func"])
        else:
            fields = g.groupdict()        # a WARN pasted without its host:pid:tid has none of them
            self.ts, self.host, self.level = fields.get("ts"), fields.get("host") or "", g["level"]
            self.pid, self.tid, self.dev = group_int(fields.get("pid")), group_int(fields.get("tid")), _dev(fields.get("dev"))
            msg = g["msg"]
            src = (fields.get("src"), fields.get("srcline"), fields.get("func"))
        self.ts_local = None
        # WARN lines' file:line (func): not kept for the others (a COLL log has millions of lines)
        self.src = src if self.level == "WARN" else None
        self.msg = msg.rstrip()
        self.kind = "other"


def _prefixed_rows(info: dict[str, np.ndarray], at: np.ndarray) -> list[_Line]:
    """The rows of the INFO lines at ``at`` among those whose prefix C read
    (``nccl_topo.TopoLines.info``): what ``_Line`` makes of the same line's LINE_RE match."""
    out = []
    new = _Line.__new__
    for line, pre, ts, host, pid, tid, dev, msg in zip(*(info[k][at].tolist() for k in (
            "line", "pre", "ts", "host", "pid", "tid", "dev", "msg"))):
        r = new(_Line)
        r.line, r.pre, r.ts, r.host, r.pid, r.tid, r.dev, r.msg = line, pre, ts, host, pid, tid, dev, msg
        r.level, r.kind, r.src, r.ts_local = "INFO", "other", None, None
        out.append(r)
    return out


def _kind_alone(msg: str) -> tuple[str | None, str | None]:
    """(the kind of an INFO line C read, from its message alone: its :data:`INFO_FACTS` entry's
    (or ``other``) where no pass below reads the line (no fact to read into its process, no
    Init, COLL, topology line or error return: what their passes look for first), None where
    one does (the line is a row); the kind of its fact where a later line of its process with a
    fact of the same reader makes reading it pointless (:data:`LAST_WINS`), else None)."""
    if msg.startswith(TOPOLOGY_STARTS) or " - Init " in msg or ": opCount " in msg or "->" in msg:
        return None, None
    if (hit := _FACT_OF.get(msg, False)) is False:
        hit = _fact_of(msg)
    if hit is None or hit[1] is None:
        return ("other" if hit is None else hit[0]), None
    return None, hit[0] if hit[1] in LAST_WINS else None


def _drop_overwritten(info: dict, family: np.ndarray, kinds: np.ndarray, need: np.ndarray) -> None:
    """Of the INFO lines C read (``info``), those whose fact a later line of the same process
    overwrites (``family``: each line's :data:`LAST_WINS` kind, or None) become no row: ``need``
    cleared, ``kinds`` set. Called only where the regular expressions read no INFO line (one of
    those could come between)."""
    at = np.flatnonzero(pd.notna(family))
    if len(at):
        later = pd.DataFrame({"h": info["host"][at], "p": info["pid"][at], "f": family[at]}).duplicated(keep="last")
        gone = at[later.to_numpy()]
        need[gone], kinds[gone] = False, family[gone]


_FINDERS: dict = {}


def _finder(rx: re.Pattern):
    """``rx.search``, or the same as ``rx.match`` where ``rx`` is anchored at the start (``^``,
    no alternative at the top): a search tries every position of the line."""
    f = _FINDERS.get(rx)
    if f is None:
        f = _FINDERS[rx] = rx.match if rx.pattern.startswith("^") and "|" not in rx.pattern \
            and not rx.flags & re.MULTILINE else rx.search
    return f


def _columns(names, rows: list) -> dict[str, list]:
    return {k: list(map(attrgetter(k), rows)) for k in names}


def _section(info: list, hint: re.Pattern, rx: re.Pattern, kind: str, what: str,
             log: WarningLog, needle: str = "") -> list[tuple[_Line, re.Match]]:
    """The lines ``hint`` picks, each with its ``rx`` match and marked ``kind``; a one-line
    warning for each that ``rx`` does not match. ``needle``: text every line ``hint`` picks
    holds (the others are passed over without a search); ``rx`` matches only lines ``hint``
    picks (so ``hint`` is tried only where ``rx`` fails)."""
    out = []
    hint_at, find = _finder(hint), _finder(rx)
    for r in info:
        if needle in r.msg:
            if (c := find(r.msg)) is not None:
                r.kind = kind
                out.append((r, c))
            elif hint_at(r.msg):
                log.add(r.line, f"malformed {what} line: {r.msg[:120]!r}")
    return out


def _merged(py, c: pd.DataFrame | None, schema: dict):
    """A table of the lines read here (``py``: as a parser hands it over) and those C read
    (``c``: a typed frame), in line order."""
    if c is None or not len(c):
        return py
    if py is None or not len(py):
        return c
    typed = typed_frame(py, schema)
    for k in (k for k, kind in schema.items() if kind == "time"):     # as objects: see nccl_topo._log_lines
        typed[k] = np.asarray(py[k].tolist() if k in py else [None] * len(typed), dtype=object)
    both = pd.concat([typed, c], ignore_index=True)
    return both.sort_values("line", kind="stable").reset_index(drop=True)


def _table(names, pairs: list[tuple[_Line, re.Match]]) -> dict[str, list]:
    """Columns: ``names`` of each line, then every group of its match."""
    t = _columns(names, [r for r, _ in pairs])
    for k in pairs[0][1].re.groupindex:
        t[k] = [c[k] for _, c in pairs]
    return t


def _add_version(facts: dict, version: str) -> None:
    if facts["nccl_version"] is None:
        facts["nccl_version"] = version
    if version not in facts["versions"]:
        facts["versions"].append(version)

# --------------------------------------------------------------------------- reading the lines

@dataclass
class _NcclLines:
    """The NCCL lines of a log besides the COLL lines the C scanner read: ``rows`` (lines with
    the NCCL prefix, with or without pid:tid, or a WARN pasted without its host:pid:tid), ``bare`` (``NCCL version x``
    without a prefix: (line, version, the text before it)) and ``mentions`` (lines naming an
    NCCL level that do not parse, each warned about); ``rows`` are ``c_rows`` (the INFO lines
    whose prefix C read that a pass below reads, at ``c_at`` among them; ``c_kinds``: the kind
    of each of them, None for those) and ``py_rows`` (the others) in line order."""

    rows: list[_Line] = field(default_factory=list)
    c_rows: list[_Line] = field(default_factory=list)
    c_at: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    c_kinds: np.ndarray = field(default_factory=lambda: np.empty(0, object))
    py_rows: list[_Line] = field(default_factory=list)
    bare: list[tuple[int, str, str]] = field(default_factory=list)
    mentions: int = 0


def _read_lines(text: LogText, other: np.ndarray, log: WarningLog, topo: TopoLines) -> _NcclLines:
    """Decode the lines holding one of :data:`NEEDLES`, and the INFO lines at the offsets
    ``other`` (those the C scanners did not read), but not the lines the C scanners read
    (``topo``: its INFO lines' prefixes become rows here, in line order)."""
    found = _NcclLines()
    sel = text.lines_with(NEEDLES, also=[other])
    if len(topo.starts) and len(sel):
        at = np.minimum(np.searchsorted(topo.starts, sel.start), len(topo.starts) - 1)     # both sorted
        keep = topo.starts[at] != sel.start
        sel = Lines(sel.start[keep], sel.end[keep], sel.line[keep])
    if topo.info:
        code = topo.info["code"]
        alone = [_kind_alone(m) for m in topo.info_msgs]
        found.c_kinds = np.array([k for k, _ in alone], dtype=object)[code]
        need = np.array([k is None for k, _ in alone], bool)[code]
        found.py_rows = _read_selected(text, sel, log, found) if len(sel) else []
        if not any(r.level == "INFO" for r in found.py_rows):
            _drop_overwritten(topo.info, np.array([f for _, f in alone], dtype=object)[code], found.c_kinds, need)
        found.c_at = np.flatnonzero(need)
        found.rows = found.c_rows = _prefixed_rows(topo.info, found.c_at)
        if found.py_rows:       # both in line order
            found.rows = list(heapq.merge(found.c_rows, found.py_rows, key=attrgetter("line")))
        return found
    found.rows = found.py_rows = _read_selected(text, sel, log, found)
    return found


def _read_selected(text: LogText, sel: Lines, log: WarningLog, found: _NcclLines) -> list:
    """The rows of the lines ``sel`` (their bare version lines and mentions go into ``found``)."""
    out: list = []
    search = LINE_RE.search
    for ln, line, end in zip(sel.line.tolist(), text.texts(sel), sel.end.tolist()):
        if "NCCL" not in line:
            if (lf := _libfabric(ln, line)) is not None:
                out.append(lf)
            elif (o := _old_warn(line)) is not None:        # NCCL before 2.3: no "NCCL " in its lines
                out.append(_Line(ln, o, line[:o.start()]))
            continue
        g = search(line) if len(line) <= LONG_LINE else prefixed(LINE_RE, line)
        if g is None:
            if (v := VERSION_RE.search(line)) is not None:
                found.bare.append((ln, v["version"], line[:v.start() + 1]))
            elif (h := prefixed(PIDLESS_RE, line) or prefixed(HOSTLESS_WARN_RE, line)) is not None:
                out.append(_Line(ln, h, line[:h.start()]))
            elif (o := _old_warn(line)) is not None:
                out.append(_Line(ln, o, line[:o.start()]))
            elif (b := BARE_WARN_RE.search(line)) is not None and not lines_mod.strip_tags(line[:b.start()])[1].strip():
                out.append(_Line(ln, b, line[:b.start()]))
            elif MENTION_RE.search(line):
                found.mentions += 1
                log.add(ln, f"NCCL line without a parsable host:pid:tid prefix: {line[:120]!r}")
            continue
        r = _Line(ln, g, line[:g.start()])
        if r.level == "WARN" and len(line) in WRAP_WIDTHS:
            r.msg = _unwrap(text, end, r.msg)
        out.append(r)
    return out


def _synthetic(line: int, pre: str, **fields) -> _Line:
    """A WARN row of a line without NCCL's prefix (libfabric's, an error return)."""
    r = _Line.__new__(_Line)
    r.line, r.pre, r.ts, r.ts_local, r.host, r.level, r.kind = line, pre, None, None, "", "WARN", "other"
    r.pid, r.tid, r.dev = fields.get("pid"), fields.get("tid"), fields.get("dev")
    r.src = (fields.get("src"), fields.get("srcline"), fields.get("func"))
    r.msg = fields["msg"]
    return r


def _libfabric(ln: int, line: str) -> _Line | None:
    """libfabric's own warning line as a WARN row (message ``libfabric <prov:subsys>: ...``),
    when it says something failed (:data:`LIBFABRIC_ERROR_RE`; the provider's notices are not kept)."""
    m = LIBFABRIC_RE.search(line)
    if m is None or not LIBFABRIC_ERROR_RE.search(m["msg"]):
        return None
    where = ":".join(p for p in m["path"].split(":") if p)
    return _synthetic(ln, line[:m.start()], pid=int(m["pid"]), src="libfabric", srcline=m["srcline"],
                      func=m["func"], msg=f"libfabric {where}: {m['func']}(): {m['msg']}")


def _error_returns(info: list[_Line]) -> list[_Line]:
    """A log with no WARN line: the first ``file:line -> N`` error return of each process as a
    WARN row (``init.cc:1200 -> 2 (ncclSystemError)``): NCCL failed, and this is all it said."""
    out, seen = [], set()
    for r in info:
        if "->" not in r.msg or (m := ERROR_RETURN_FIELDS_RE.match(r.msg)) is None or (r.host, r.pid) in seen:
            continue
        seen.add((r.host, r.pid))
        code = int(m["code"])
        w = _synthetic(r.line, r.pre, pid=r.pid, tid=r.tid, dev=r.dev, src=m["src"], srcline=m["srcline"],
                       func=m["func"], msg=f"{m['src']}:{m['srcline']} -> {code} ({NCCL_RESULTS.get(code, 'error')})")
        w.host, w.ts, w.ts_local = r.host, r.ts, r.ts_local
        out.append(w)
    return out


OLD_CLAIM_LINES = 200      # lines holding "WARN " looked at for an old WARN line before a log is let go


def _old_warn(line: str) -> re.Match | None:
    """A WARN line of NCCL before 2.3 (:data:`OLD_WARN_RE`, :data:`V1_WARN_RE`), or None."""
    if "WARN " not in line or len(line) > LONG_LINE:     # no file name runs on for megabytes
        return None
    return OLD_WARN_RE.search(line) or V1_WARN_RE.search(line)


LONG_LINE = 4096        # longer lines are searched for their prefix only near their NCCL mentions
PREFIX_SPAN = 1024      # the most characters a line's NCCL prefix (time, host:pid:tid, device, file:line (func)) spans
MENTIONS_TRIED = 8      # per line: the first mentions of "NCCL <LEVEL>" whose prefix is looked for


def prefixed(rx: re.Pattern, line: str) -> re.Match | None:
    """``rx.search(line)`` (:data:`LINE_RE` or :data:`HOSTLESS_WARN_RE`) for a line whose prefix
    spans at most :data:`PREFIX_SPAN` characters before one of its first mentions of
    ``NCCL <LEVEL>``: only there is a match looked for, then taken on the whole line. A plain
    search tries every position of the line, each running its host or file name to the next
    colon: quadratic, minutes on a line of a few megabytes (a log with no newlines, a dump)."""
    for i, m in enumerate(MENTION_RE.finditer(line)):
        if i == MENTIONS_TRIED:
            break
        g = rx.search(line, max(0, m.start() - PREFIX_SPAN), m.end())
        if g is not None:
            return rx.match(line, g.start())
    return None


def _versions_only(bare: list[tuple[int, str, str]], facts: dict, log: WarningLog, lines: bool = True) -> dict:
    """The tables of a log with no NCCL line but bare version lines (or none at all): their
    ``nccl_log_lines`` rows (``lines``), none without."""
    for _, v, _ in bare:
        _add_version(facts, v)
    if not bare:
        log.add(None, "no NCCL_DEBUG lines found")
    bv = [{"line": ln, "level": "VERSION", "kind": "version", "message": "NCCL version " + v,
           **lines_mod.context(pre).as_row()} for ln, v, pre in bare]
    return {"nccl_log_lines": bv} if lines else {}


def _stamp_local_times(rows: list[_Line]) -> None:
    """Set ``ts_local`` of the rows that print a timestamp (NCCL >= 2.26): naive local time,
    as printed, in one vectorised parse for the log."""
    if any(r.ts is not None for r in rows):
        stamps = pd.to_datetime(pd.Series([None if r.ts is None else r.ts.replace("_", " ") for r in rows],
                                          dtype="object"), errors="coerce", format="mixed").tolist()
        for r, t in zip(rows, stamps):
            r.ts_local = t


# --------------------------------------------------------------------------- the tables

def _coll_columns(pairs: list[tuple[_Line, re.Match]]) -> pd.DataFrame:
    """COLL rows the regular expression read (lines not in the form the C scanner reads)."""
    t = _table(BASE, pairs)
    df = pd.DataFrame(t)
    df["message"] = [r.msg for r, _ in pairs]
    df["op_count"] = [int(h, 16) for h in df["op_count"]]
    for k in ("count", "datatype", "red_op", "root", "nranks"):
        df[k] = [int(v) for v in df[k]]
    for k in ("sendbuff", "recvbuff"):
        df[k] = [None if v == "(nil)" else v for v in df[k]]
    df = pd.concat([df, pd.DataFrame(_contexts([r for r, _ in pairs]), index=df.index)], axis=1)
    return coll_derived(df)


def _comms_table(comms: list[tuple[_Line, re.Match]]) -> dict[str, list]:
    """``nccl_comms`` of the Init START/COMPLETE lines."""
    t = _table(("line", "host", "pid", "tid", "dev"), comms)
    for k in ("rank", "nranks", "cuda_dev", "nvml_dev"):
        t[k] = list(map(int, t[k])) if None not in t[k] else [group_int(v) for v in t[k]]
    t.update(_contexts([r for r, _ in comms]))
    return t


# the topology lines besides Channel connections and "Trees", tried in this order
TOPOLOGY_LINES = (("ring_order", RING_ORDER_RE), ("ring", RING_RE), ("tree", TREE_RE))


# how every topology line starts (each of their expressions is anchored on one of these)
TOPOLOGY_STARTS = ("Channel ", "Ring ", "Tree")


def _topology_lines(info: list[_Line]) -> tuple[list[tuple[_Line, re.Match]], list[dict]]:
    """(Channel connection lines with their matches, ``nccl_rings`` rows) of the INFO lines
    not read yet; a line is one of them, and is marked with its kind."""
    chans, rings = [], []
    search = CHANNEL_RE.match
    for r in info:
        if r.kind != "other" or not r.msg.startswith(TOPOLOGY_STARTS):
            continue
        if (c := search(r.msg)) is not None:
            r.kind = "channel"
            chans.append((r, c))
        else:
            rings.extend(_ring_rows(r))
    return chans, rings


def _ring_rows(r: _Line) -> list[dict]:
    """The ``nccl_rings`` rows of one line (none if it is no topology line)."""
    msg = r.msg
    for kind, rx in TOPOLOGY_LINES:
        if (c := _finder(rx)(msg)) is not None:
            r.kind = "tree" if kind == "tree" else "ring"
            row = {"line": r.line, "host": r.host, "pid": r.pid, "dev": r.dev, "kind": kind}
            if kind == "ring_order":      # the most common by far: one per channel per rank
                channel, n, order = c.group("channel", "nchannels", "order")
                row["channel"] = int(channel)
                if n is not None:
                    row["nchannels"] = int(n)
                row["order"] = " ".join(order.split())
                return [row]
            for k, v in c.groupdict().items():
                if v is not None:
                    row[k] = " ".join(v.split()) if k == "order" else (v if k == "down" else int(v))
            return [row]
    if msg.startswith("Trees "):
        r.kind = "tree"
        return [{"line": r.line, "host": r.host, "pid": r.pid, "dev": r.dev, "kind": "trees",
                 "channel": int(t["channel"]), "rank": int(t["rank"]), "up": int(t["up"]), "down": t["down"]}
                for t in TREES_ITEM_RE.finditer(msg)]
    return []


def _channels_table(chans: list[tuple[_Line, re.Match]]) -> dict[str, list]:
    """``nccl_channels`` of the Channel connection lines, with the transport their ``via`` names."""
    t = _table(("line", "host", "pid", "tid", "dev"), chans)
    for k in ("channel", "conn_index", "src_rank", "dst_rank"):
        t[k] = [group_int(v) for v in t[k]]
    parsed = {v: VIA_RE.match(v) for v in dict.fromkeys(t["via"])}      # a log has few distinct vias
    vias = [parsed[v] for v in t["via"]]
    t["transport"] = [v["transport"] if v else None for v in vias]
    t["net"] = [v["net"] if v and v["transport"] == "NET" else None for v in vias]
    t["net_dev"] = [group_int(v["net_dev"]) if v and v["transport"] == "NET" else None for v in vias]
    t["gdrdma"] = ["/GDRDMA" in v for v in t["via"]]
    return t


def _warnings_table(warns: list[_Line]) -> dict[str, list]:
    """``nccl_warnings`` of the WARN lines (each marked ``warn``)."""
    t = _columns(BASE, warns)
    for r in warns:
        r.kind = "warn"
    t["src_file"] = [r.src[0] for r in warns]
    t["src_line"] = [group_int(r.src[1]) for r in warns]
    t["func"] = [r.src[2] for r in warns]
    t["message"] = [r.msg for r in warns]
    t.update(peer_fields(t["message"]))
    t.update(ib_fields([r.msg for r in warns]))
    t.update(_contexts(warns))
    return t


def _log_lines_table(rows: list[_Line], bare: list[tuple[int, str, str]],
                     coll_rows: pd.DataFrame | None) -> pd.DataFrame:
    """``nccl_log_lines``: every line read here, the bare version lines, and the ``nccl_coll``
    rows (``coll_rows``; None with ``coll="positions"``), by line."""
    t = _columns(BASE + ("level", "kind", "msg"), rows)
    t["message"] = t.pop("msg")
    t.update(_contexts(rows))
    for ln, v, pre in bare:   # the bare version lines too
        ctx = lines_mod.context(pre).as_row()
        for k, col in t.items():
            col.append(ctx.get(k))
        t["line"][-1], t["level"][-1], t["kind"][-1] = ln, "VERSION", "version"
        t["message"][-1] = "NCCL version " + v
    # the values as read (object columns: no type inferred, no int through float)
    t = pd.DataFrame({k: np.asarray(v, np.int64) if k == "line" else pd.array(v, dtype=object) for k, v in t.items()})
    if coll_rows is not None and len(coll_rows):
        c = coll_rows
        cl = c[[k for k in list(BASE) + ["message"] + list(CTX) if k in c]].assign(level="INFO", kind="coll")
        t = pd.concat([t[~t["line"].isin(cl["line"])], cl], ignore_index=True) if len(t) else cl
    return t.sort_values("line", kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- per-process facts

def _process(procs: dict, host: str, pid: int) -> dict:
    """The facts of process ``host:pid`` in ``procs``, made empty on first use."""
    key = f"{host}:{pid}"
    if key not in procs:
        procs[key] = {"host": host, "pid": pid, "version": None,
                      "transport": None, "ib_devices": [], "oob_interface": None,
                      "oob_address": None, "socket_interfaces": [], "interfaces": [],
                      "gdr": None, "nchannels": None, "env": {}, "ranks": {}, "comm_ids": [],
                      "bootstrap_address": None}
    return procs[key]


def _process_facts(rows: list[_Line], info: list[_Line], tables: dict, bare: list[tuple[int, str, str]],
                   facts: dict, log: WarningLog, topo: TopoLines) -> dict:
    """``facts["processes"]``: one entry per process seen (in ``rows``, the lines C did not read;
    the lines C read, ``topo``; a COLL row), filled from the INFO lines not read yet (:data:`INFO_FACTS`, each
    line marked with its kind); also adds the versions to ``facts``. Returns the processes."""
    procs: dict = facts["processes"]
    seen: dict = {}
    for r in rows:
        if r.pid is not None and not (r.src and r.src[0] == "libfabric"):   # libfabric's lines: no NCCL process
            seen.setdefault((r.host, r.pid), r.line)
    first = sorted([(ln, key) for key, ln in seen.items()] + [(ln, (h, p)) for ln, h, p in topo.first_seen],
                   key=lambda x: x[0])
    for _, (host, pid) in first:
        if f"{host}:{pid}" not in procs:
            _process(procs, host, pid)
    for t in (tables.get("nccl_coll"), tables.get("nccl_coll_last")):
        if t is not None and len(t):
            for host, pid in t[["host", "pid"]].drop_duplicates().itertuples(index=False):
                key = f"{host}:{pid}"
                if key not in procs and pd.notna(pid):
                    _process(procs, host, int(pid))
    mine: dict = {}                 # (host, pid) -> its process's facts (every line's is made above)
    for r in info:
        if r.kind != "other" or r.pid is None:          # a line of no pid tells of no process
            continue
        if (hit := _FACT_OF.get(r.msg, False)) is False:
            hit = _fact_of(r.msg)
        if hit is not None:
            if (p := mine.get((r.host, r.pid))) is None:
                p = mine[(r.host, r.pid)] = _process(procs, r.host, r.pid)
            r.kind = hit[0]
            if hit[1] is not None:
                hit[1](p, hit[2], r, facts, log)
    for _, v, _ in bare:
        _add_version(facts, v)
    if bare and len(procs) == 1:
        only = next(iter(procs.values()))
        only["version"] = only["version"] or bare[0][1]
    return procs


_FACT_OF: dict[str, tuple | None] = {}      # message -> (kind, reader, match) of its INFO_FACTS entry


def _fact_of(msg: str) -> tuple | None:
    """(the kind, the reader, the match) of the first :data:`INFO_FACTS` entry ``msg`` matches
    (None: none), looked for once per distinct message (an init log repeats most of them on
    every rank of every communicator): the fact itself is read into its process line by line."""
    hit = next(((kind, read, g) for kind, hint, find, read in INFO_FACTS if hint in msg and (g := find(msg))), None)
    if len(_FACT_OF) > 50_000:
        _FACT_OF.clear()
    _FACT_OF[msg] = hit
    return hit


def _fact_version(p: dict, g: re.Match, r: _Line, facts: dict, log: WarningLog) -> None:
    p["version"] = p["version"] or g["version"]
    _add_version(facts, g["version"])


def _fact_net_ib(p: dict, g: re.Match, r: _Line, facts: dict, log: WarningLog) -> None:
    p["ib_devices"] = [{"index": int(d["index"]), "name": d["name"], "port": int(d["port"]),
                        "link_layer": d["ll"]} for d in IB_DEV_RE.finditer(g["devs"])]
    if not p["ib_devices"] and not NO_IB_DEVICE_RE.search(g["devs"]):
        log.add(r.line, f"NET/IB line lists no device: {r.msg[:120]!r}")
    oob_if, _, oob_addr = g["oob"].partition(":")
    p["oob_interface"], p["oob_address"] = oob_if, re.sub(r"<\d+>$", "", oob_addr) or None
    p["transport"] = p["transport"] or "IB"


def _fact_net_socket(p: dict, g: re.Match, r: _Line, facts: dict, log: WarningLog) -> None:
    p["socket_interfaces"] = [{"index": int(d["index"]), "name": d["name"], "address": d["addr"]}
                              for d in SOCK_DEV_RE.finditer(g["devs"])]
    if not p["socket_interfaces"]:
        log.add(r.line, f"NET/Socket line lists no interface: {r.msg[:120]!r}")
    p["transport"] = p["transport"] or "Socket"


def _fact_using_net(p: dict, g: re.Match, r: _Line, facts: dict, log: WarningLog) -> None:
    p["transport"] = g["net"]


def _fact_bootstrap(p: dict, g: re.Match, r: _Line, facts: dict, log: WarningLog) -> None:
    p["bootstrap_address"] = p["bootstrap_address"] or g["addr"]


def _fact_gdr(p: dict, g: re.Match, r: _Line, facts: dict, log: WarningLog) -> None:
    p["gdr"] = True if g["state"] == "Enabled" or p["gdr"] else False


def _fact_env(p: dict, g: re.Match, r: _Line, facts: dict, log: WarningLog) -> None:
    val = g["val"][:-1] if g["val"].endswith(".") else g["val"]
    p["env"][g["var"]] = val


def _fact_nchannels(p: dict, g: re.Match, r: _Line, facts: dict, log: WarningLog) -> None:
    p["nchannels"] = int(g["n"])


# readers of a field no other reader writes, unconditionally: a process's lines of one are read
# for nothing before its last one (_drop_overwritten)
LAST_WINS = (_fact_using_net, _fact_nchannels)


# The INFO lines that give a process fact: (the kind a line gets, text every line it finds
# holds, how it is found, what reads its fact into the process; None: a kind without a fact),
# tried in this order.
INFO_FACTS = (
    ("version", "NCCL version ", INFO_VERSION_RE.match, _fact_version),
    ("net", "NET/IB", NET_IB_RE.match, _fact_net_ib),
    ("net", "NET/Socket", NET_SOCKET_RE.match, _fact_net_socket),
    ("net", "Using network ", USING_NET_RE.match, _fact_using_net),
    ("net", "Bootstrap", BOOTSTRAP_RE.match, _fact_bootstrap),
    ("gdr", "GPU Direct RDMA ", GDR_RE.search, _fact_gdr),
    ("env", "NCCL_", ENV_RE.match, _fact_env),
    ("nchannels", " coll channels", NCHANNELS_RE.match, _fact_nchannels),
    ("topology", "comm ", TOPO_RE.match, None),
    ("error_return", "-> ", ERROR_RETURN_RE.match, None),
)


# --------------------------------------------------------------------------- the other lines

def text_lines(text: LogText) -> int:
    """Lines holding more than blanks."""
    return line_count(text.data, text.size)[1]


def _unwrap(text: LogText, end: int, msg: str) -> str:
    """A WARN message hard-wrapped by a terminal, joined with its continuation lines (up to 3:
    while each is as long as the wrap, and none is an NCCL line of its own)."""
    for nxt in text.following(end, 3):
        if not nxt.strip() or prefixed(LINE_RE, nxt) or "NCCL " in nxt:
            break
        msg += nxt.rstrip()
        if len(nxt) not in WRAP_WIDTHS:
            break
    return msg


_CTX_CACHE: dict[str, dict] = {}

def _contexts(rows: list) -> dict[str, list]:
    """The launcher context columns of ``rows`` (lines read by the regular expressions)."""
    return lines_mod.context_columns(r.pre for r in rows)


register(NcclDebugParser)
