"""NCCL_DEBUG logs (``NCCL_DEBUG=INFO|WARN|TRACE``, any NCCL from 2.5 to 2.30).

A line is ``[<timestamp>] <host>:<pid>:<tid> [<cudaDev>] NCCL <LEVEL> <message>`` after
any launcher prefix (Ray ``(RayTrainWorker pid=…)``, Open MPI ``[1,0]<stdout>:``,
torchrun ``[0]``, log collectors ``<date> <host> >>``), which is skipped by anchoring
on the NCCL prefix itself. The timestamp (NCCL >= 2.26) is optional, ``host`` may be
empty, WARN lines carry ``file:line`` and, from 2.30.7, ``(func)``. Bare
``NCCL version x`` lines (no prefix) are read too. Lines that carry no NCCL prefix
(application output) are counted, not warned about; lines that mention NCCL but do
not parse, and recognised messages whose fields are malformed, are warned about.

Tables (every table also has ``line``: 1-based line number in the file):

``nccl_log_lines`` -- one row per NCCL line:
    ts (str, the timestamp as printed or NA), ts_local (datetime, naive local time),
    host (str, may be empty), pid (int), tid (int), dev (int, NA on CALL/VERSION lines),
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
``nccl_warnings`` -- WARN lines: ts, ts_local, host, pid, tid, dev, src_file, src_line
    (int), func (str, NCCL >= 2.30.7), message, peer (str: the peer named in socket/IB
    errors), ib_status (int: IB work completion status in completion errors).

Facts: ``nccl_version`` (first seen), ``versions`` (all distinct), ``other_lines``
(count of non-NCCL lines), ``processes`` keyed ``"host:pid"`` with host, pid, version,
transport (IB|Socket|plugin from ``Using network``, else inferred from NET lines),
ib_devices ([{index, name, port, link_layer}]), oob_interface, oob_address,
socket_interfaces ([{index, name, address}]), interfaces (names), gdr (True if any
GPU Direct RDMA Enabled or GDRDMA channel, False if only Disabled, else None),
nchannels (int), env ({NCCL_*: value}), ranks ({comm pointer: rank}), comm_ids.
"""
from __future__ import annotations

import re

import pandas as pd

from .registry import Parser, WarningLog, decode_text, looks_binary, register, split_lines

# The NCCL prefix, found anywhere in the line (launchers prepend their own tags).
LINE_RE = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d\d-\d\d[ T_][^\]]*|[A-Z][a-z]{2} [^\]]*\d)\] ?)?"
    r"(?P<host>[^\s:]*):(?P<pid>\d+):(?P<tid>\d+) "
    r"(?:\[(?P<dev>\d+)\] )?"
    r"(?:(?P<tms>\d+\.\d+) (?P<tfunc>[^\s:]+):(?P<tline>\d+) "
    r"|(?P<src>[^\s:()]+):(?P<srcline>\d+) (?:\((?P<func>[^)\s]*)\) )?)?"
    r"NCCL (?P<level>INFO|WARN|TRACE|CALL|ABORT)\b ?(?P<msg>.*)$"
)
VERSION_RE = re.compile(r"(?:^|[\s\]>:])NCCL version (?P<version>\d+\.\d+\.\d+\S*)")
MENTION_RE = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|CALL|ABORT)\b")

COLL_HEAD_RE = re.compile(r"^\w+: opCount ")
COLL_RE = re.compile(
    r"^(?P<op_name>\w+): opCount (?P<op_count>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) "
    r"recvbuff (?P<recvbuff>\S+) count (?P<count>\d+) datatype (?P<datatype>\d+) "
    r"op (?P<red_op>\d+) root (?P<root>-?\d+) comm (?P<comm>\S+) "
    r"\[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)\s*$"
)
INIT_RE = re.compile(
    r"^(?:\[Rank \d+\] )?(?:(?P<func>nccl\w+) )?comm (?P<comm>\S+) rank (?P<rank>\d+) "
    r"nranks (?P<nranks>\d+) cudaDev (?P<cuda_dev>-?\d+)(?: nvmlDev (?P<nvml_dev>-?\d+))?"
    r"(?: busId (?P<bus_id>[0-9a-fA-F]+))?(?: commId (?P<comm_id>0x[0-9a-fA-F]+))?"
    r"(?: parent (?P<parent>\S+))?.*? - Init (?P<status>START|COMPLETE)\s*$"
)
INIT_HINT_RE = re.compile(r" - Init (?:START|COMPLETE)")
TOPO_RE = re.compile(
    r"^comm (?P<comm>\S+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
    r"localRanks (?P<local_ranks>\d+) localRank (?P<local_rank>\d+)"
)
CHANNEL_RE = re.compile(
    r"^Channel (?P<channel>\d+)(?:/(?P<conn_index>\d+))? : (?P<src_rank>\d+)\[(?P<src_dev>[0-9a-fA-F]+)\] "
    r"-> (?P<dst_rank>\d+)\[(?P<dst_dev>[0-9a-fA-F]+)\](?: \[(?P<direction>send|receive)\])? "
    r"via (?P<via>\S.*?)\s*$"
)
RING_ORDER_RE = re.compile(r"^Channel (?P<channel>\d+)(?:/(?P<nchannels>\d+))? :(?P<order>(?:\s+\d+)+)\s*$")
RING_RE = re.compile(r"^Ring (?P<channel>\d+) : (?P<prev>-?\d+) -> (?P<rank>-?\d+) -> (?P<next>-?\d+)")
TREE_RE = re.compile(r"^Tree (?P<channel>\d+) : (?P<up>-?\d+) -> (?P<rank>-?\d+) -> (?P<down>[-\d/]+)")
TREES_ITEM_RE = re.compile(r"\[(?P<channel>\d+)\] (?P<down>[-\d/]+)->(?P<rank>-?\d+)->(?P<up>-?\d+)")
NET_IB_RE = re.compile(r"^NET/IB ?: Using (?P<devs>.*?)\s*;\s*OOB (?P<oob>\S+)")
IB_DEV_RE = re.compile(r"\[(?P<index>\d+)\](?P<name>[^\s:\[\]]+):(?P<port>\d+)(?::\d+)*/(?P<ll>\w+)")
NET_SOCKET_RE = re.compile(r"^NET/Socket ?: Using (?P<devs>.+)$")
SOCK_DEV_RE = re.compile(r"\[(?P<index>\d+)\](?P<name>[^\s:\[\]]+):(?P<addr>\S+?)<\d+>")
USING_NET_RE = re.compile(r"^Using network (?P<net>\S+)")
GDR_RE = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled)\b")
ENV_RE = re.compile(r"^(?P<var>NCCL_\w+) set (?:by environment )?to (?P<val>.*?)\s*$")
NCHANNELS_RE = re.compile(r"^(?P<n>\d+) coll channels\b")
ERROR_RETURN_RE = re.compile(r"^\S+:\d+ (?:\(\w+\) )?-> \d+")
PEER_RE = re.compile(r"\bpeer (?P<peer>[^\s,]+)")
IB_STATUS_RE = re.compile(r"\bwith (?:error |status=)(?:[A-Za-z_]+\()?(?P<st>\d+)")
INFO_VERSION_RE = re.compile(r"^NCCL version (?P<version>\S+)")

OPS = {
    "AllReduce": "ALL_REDUCE", "AllGather": "ALL_GATHER", "ReduceScatter": "REDUCE_SCATTER",
    "Broadcast": "BROADCAST", "Reduce": "REDUCE", "Send": "SEND", "Recv": "RECV",
    "AlltoAll": "ALL_TO_ALL", "AllToAll": "ALL_TO_ALL", "Gather": "GATHER", "Scatter": "SCATTER",
}
# ncclDataType_t: (name, bytes per element)
DATATYPES = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
    5: ("uint64", 8), 6: ("half", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bf16", 2),
    10: ("fp8e4m3", 1), 11: ("fp8e5m2", 1),
}
RED_OPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}


def op_enum(name: str) -> str:
    return OPS.get(name) or re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def _int(v):
    """An int from a regex group of digits, or None where the group took no part."""
    return None if v is None else int(v)


class NcclDebugParser(Parser):
    NAME = "nccl_debug"
    DESCRIPTION = "NCCL_DEBUG log: init/transport/channel lines, COLL lines, WARN lines"
    GLOBS = ("logs/*", "logs/**/*", "*.nccl.log", "nccl_debug*", "nccl*.log")
    SCHEMAS = {
        "nccl_log_lines": {"line": "int", "ts": "str", "ts_local": "time", "host": "str", "pid": "int",
                           "tid": "int", "dev": "int", "level": "str", "kind": "str", "message": "str"},
        "nccl_coll": {"line": "int", "ts": "str", "ts_local": "time", "host": "str", "pid": "int",
                      "tid": "int", "dev": "int", "op": "str", "op_name": "str", "op_count": "int",
                      "sendbuff": "str", "recvbuff": "str", "count": "int", "datatype": "int",
                      "datatype_name": "str", "bytes": "int", "red_op": "int", "red_op_name": "str",
                      "root": "int", "peer": "int", "comm": "str", "nranks": "int", "stream": "str"},
        "nccl_comms": {"line": "int", "host": "str", "pid": "int", "tid": "int", "dev": "int",
                       "func": "str", "comm": "str", "rank": "int", "nranks": "int", "cuda_dev": "int",
                       "nvml_dev": "int", "bus_id": "str", "comm_id": "str", "parent": "str",
                       "status": "str"},
        "nccl_channels": {"line": "int", "host": "str", "pid": "int", "tid": "int", "dev": "int",
                          "channel": "int", "conn_index": "int", "src_rank": "int", "src_dev": "str",
                          "dst_rank": "int", "dst_dev": "str", "direction": "str", "via": "str",
                          "transport": "str", "net": "str", "net_dev": "int", "gdrdma": "bool"},
        "nccl_rings": {"line": "int", "host": "str", "pid": "int", "dev": "int", "kind": "str",
                       "channel": "int", "rank": "int", "prev": "int", "next": "int", "up": "int",
                       "down": "str", "order": "str", "nchannels": "int"},
        "nccl_warnings": {"line": "int", "ts": "str", "ts_local": "time", "host": "str", "pid": "int",
                          "tid": "int", "dev": "int", "src_file": "str", "src_line": "int",
                          "func": "str", "message": "str", "peer": "str", "ib_status": "int"},
    }

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        lines = head.decode("utf-8", "replace").splitlines()[:200]
        return any(MENTION_RE.search(ln) and LINE_RE.search(ln) for ln in lines) \
            or any(ln.startswith("NCCL version ") for ln in lines)

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        log = WarningLog(label)
        facts: dict = {"nccl_version": None, "versions": [], "other_lines": 0, "processes": {}}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, {}, facts, log)
        if looks_binary(data):
            log.add(None, "binary data, not an NCCL_DEBUG text log")
            return cls.result(label, {}, facts, log)

        # One pass over the lines, a regular expression or two for each line that mentions
        # NCCL: what a pandas string method does inside too, without its fixed cost per call
        # (a fuzz input parses in ~3 ms, not ~19; a 152,000-line COLL log in 5 s, not 9)
        lines = split_lines(decode_text(data))
        n_lines = 0
        rows: list[_Line] = []
        bare: list[tuple[int, str]] = []           # (line, version): "NCCL version x" without a prefix
        n_mentions = 0
        for ln, text in enumerate(lines, 1):
            if text.strip():
                n_lines += 1
            if "NCCL" not in text:
                continue
            g = LINE_RE.search(text)
            if g is None:
                if (v := VERSION_RE.search(text)) is not None:
                    bare.append((ln, v["version"]))
                elif MENTION_RE.search(text):
                    n_mentions += 1
                    log.add(ln, f"NCCL line without a parsable host:pid:tid prefix: {text[:120]!r}")
                continue
            rows.append(_Line(ln, g))
        facts["other_lines"] = n_lines - len(rows) - len(bare) - n_mentions

        if not rows:
            for _, v in bare:
                _add_version(facts, v)
            if not bare:
                log.add(None, "no NCCL_DEBUG lines found")
            bv = [{"line": ln, "level": "VERSION", "kind": "version", "message": "NCCL version " + v}
                  for ln, v in bare]
            return cls.result(label, {"nccl_log_lines": bv}, facts, log)
        if any(r.ts is not None for r in rows):
            # naive local time, as printed (NCCL >= 2.26): one vectorised parse for the log
            stamps = pd.to_datetime(pd.Series([None if r.ts is None else r.ts.replace("_", " ") for r in rows],
                                              dtype="object"), errors="coerce", format="mixed").tolist()
            for r, t in zip(rows, stamps):
                r.ts_local = t
        info = [r for r in rows if r.level == "INFO"]
        tables: dict = {}

        # --- COLL lines (issued collectives), then Init START/COMPLETE lines
        coll = _section(info, COLL_HEAD_RE, COLL_RE, "coll", "COLL", log)
        comms = _section(info, INIT_HINT_RE, INIT_RE, "init", "Init", log)
        if coll:
            t = _table(BASE, coll)
            t["op"] = [op_enum(n) for n in t["op_name"]]
            t["op_count"] = [int(h, 16) for h in t["op_count"]]
            for k in ("count", "datatype", "red_op", "root", "nranks"):
                t[k] = [int(v) for v in t[k]]
            for k in ("sendbuff", "recvbuff"):
                t[k] = [None if v == "(nil)" else v for v in t[k]]
            types = [DATATYPES.get(d, (None, None)) for d in t["datatype"]]
            t["datatype_name"] = [name for name, _ in types]
            t["bytes"] = [n * size if size is not None else None for n, (_, size) in zip(t["count"], types)]
            t["red_op_name"] = [RED_OPS.get(o, "premulsum") for o in t["red_op"]]
            t["peer"] = [root if op in ("SEND", "RECV") else None for op, root in zip(t["op"], t["root"])]
            tables["nccl_coll"] = t
        if comms:
            t = _table(("line", "host", "pid", "tid", "dev"), comms)
            for k in ("rank", "nranks", "cuda_dev", "nvml_dev"):
                t[k] = [_int(v) for v in t[k]]
            tables["nccl_comms"] = t

        # --- Channel connection lines, ring order, rings and trees (a line is one of them)
        chans, rings = [], []
        for r in info:
            if r.kind != "other":
                continue
            msg = r.msg
            if (c := CHANNEL_RE.search(msg)) is not None:
                r.kind = "channel"
                chans.append((r, c))
                continue
            for kind, rx in (("ring_order", RING_ORDER_RE), ("ring", RING_RE), ("tree", TREE_RE)):
                if (c := rx.search(msg)) is not None:
                    r.kind = "tree" if kind == "tree" else "ring"
                    row = {"line": r.line, "host": r.host, "pid": r.pid, "dev": r.dev, "kind": kind}
                    for k, v in c.groupdict().items():
                        if v is not None:
                            row[k] = " ".join(v.split()) if k == "order" else (v if k == "down" else int(v))
                    rings.append(row)
                    break
            else:
                if msg.startswith("Trees "):
                    r.kind = "tree"
                    for t in TREES_ITEM_RE.finditer(msg):
                        rings.append({"line": r.line, "host": r.host, "pid": r.pid, "dev": r.dev, "kind": "trees",
                                      "channel": int(t["channel"]), "rank": int(t["rank"]), "up": int(t["up"]),
                                      "down": t["down"]})
        if chans:
            t = _table(("line", "host", "pid", "tid", "dev"), chans)
            for k in ("channel", "conn_index", "src_rank", "dst_rank"):
                t[k] = [_int(v) for v in t[k]]
            vias = [VIA_RE.match(v) for v in t["via"]]
            t["transport"] = [v["transport"] if v else None for v in vias]
            t["net"] = [v["net"] if v and v["transport"] == "NET" else None for v in vias]
            t["net_dev"] = [_int(v["net_dev"]) if v and v["transport"] == "NET" else None for v in vias]
            t["gdrdma"] = ["/GDRDMA" in v for v in t["via"]]
            tables["nccl_channels"] = t
        tables["nccl_rings"] = rings

        # --- WARN lines
        warns = [r for r in rows if r.level == "WARN"]
        if warns:
            t = _columns(BASE, warns)
            for r in warns:
                r.kind = "warn"
            t["src_file"] = [r.src[0] for r in warns]
            t["src_line"] = [_int(r.src[1]) for r in warns]
            t["func"] = [r.src[2] for r in warns]
            t["message"] = [r.msg for r in warns]
            t["peer"] = [(m["peer"] if (m := PEER_RE.search(r.msg)) else None) for r in warns]
            t["ib_status"] = [(_int(m["st"]) if (m := IB_STATUS_RE.search(r.msg)) else None) for r in warns]
            tables["nccl_warnings"] = t

        # --- Per-process facts from the remaining INFO lines
        procs: dict = facts["processes"]

        def proc(r: _Line) -> dict:
            key = f"{r.host}:{r.pid}"
            if key not in procs:
                procs[key] = {"host": r.host, "pid": r.pid, "version": None,
                              "transport": None, "ib_devices": [], "oob_interface": None,
                              "oob_address": None, "socket_interfaces": [], "interfaces": [],
                              "gdr": None, "nchannels": None, "env": {}, "ranks": {}, "comm_ids": []}
            return procs[key]

        for r in rows:
            proc(r)
        for r in info:
            if r.kind != "other":
                continue
            p, text, ln = proc(r), r.msg, r.line
            if (g := INFO_VERSION_RE.match(text)):
                r.kind = "version"
                p["version"] = p["version"] or g["version"]
                _add_version(facts, g["version"])
            elif (g := NET_IB_RE.match(text)):
                r.kind = "net"
                p["ib_devices"] = [{"index": int(d["index"]), "name": d["name"], "port": int(d["port"]),
                                    "link_layer": d["ll"]} for d in IB_DEV_RE.finditer(g["devs"])]
                if not p["ib_devices"]:
                    log.add(ln, f"NET/IB line lists no device: {text[:120]!r}")
                oob_if, _, oob_addr = g["oob"].partition(":")
                p["oob_interface"], p["oob_address"] = oob_if, re.sub(r"<\d+>$", "", oob_addr) or None
                p["transport"] = p["transport"] or "IB"
            elif (g := NET_SOCKET_RE.match(text)):
                r.kind = "net"
                p["socket_interfaces"] = [{"index": int(d["index"]), "name": d["name"], "address": d["addr"]}
                                          for d in SOCK_DEV_RE.finditer(g["devs"])]
                if not p["socket_interfaces"]:
                    log.add(ln, f"NET/Socket line lists no interface: {text[:120]!r}")
                p["transport"] = p["transport"] or "Socket"
            elif (g := USING_NET_RE.match(text)):
                r.kind = "net"
                p["transport"] = g["net"]
            elif (g := GDR_RE.search(text)):
                r.kind = "gdr"
                p["gdr"] = True if g["state"] == "Enabled" or p["gdr"] else False
            elif (g := ENV_RE.match(text)):
                r.kind = "env"
                val = g["val"][:-1] if g["val"].endswith(".") else g["val"]
                p["env"][g["var"]] = val
            elif (g := NCHANNELS_RE.match(text)):
                r.kind = "nchannels"
                p["nchannels"] = int(g["n"])
            elif TOPO_RE.match(text):
                r.kind = "topology"
            elif ERROR_RETURN_RE.match(text):
                r.kind = "error_return"
        for _, v in bare:
            _add_version(facts, v)
        if bare and len(procs) == 1:
            only = next(iter(procs.values()))
            only["version"] = only["version"] or bare[0][1]

        # Channels and comms refine the per-process view.
        nets: dict[str, list[str]] = {}
        for r, c in chans:
            key = f"{r.host}:{r.pid}"
            if "/GDRDMA" in c["via"]:
                procs[key]["gdr"] = True
            v = VIA_RE.match(c["via"])
            if v and v["transport"] == "NET" and v["net"] is not None:
                nets.setdefault(key, []).append(v["net"])
        for key, used in nets.items():       # IB when any NET channel is, else the first one's
            if procs[key]["transport"] is None:
                procs[key]["transport"] = "IB" if any(n.startswith("IB") for n in used) else used[0]
        for r, c in comms:
            p = procs[f"{r.host}:{r.pid}"]
            p["ranks"][c["comm"]] = _int(c["rank"])
            if c["comm_id"] is not None and c["comm_id"] not in p["comm_ids"]:
                p["comm_ids"].append(c["comm_id"])
        # Without a "N coll channels" line, "Channel 00/NN : ranks" gives nChannels.
        ring_orders: dict = {}
        for row in rings:
            if row["kind"] == "ring_order" and row.get("nchannels") is not None:
                key = f"{row['host']}:{row['pid']}"
                ring_orders[key] = max(ring_orders.get(key, 0), row["nchannels"])
        for key, p in procs.items():
            if p["nchannels"] is None and key in ring_orders:
                p["nchannels"] = ring_orders[key]
            p["interfaces"] = sorted({d["name"] for d in p["ib_devices"]} | {d["name"] for d in p["socket_interfaces"]}
                                     | ({p["oob_interface"]} if p["oob_interface"] else set()))

        t = _columns(BASE, rows)
        t["level"] = [r.level for r in rows]
        t["kind"] = [r.kind for r in rows]
        t["message"] = [r.msg for r in rows]
        if bare:   # the bare version lines too, in file order
            for ln, v in bare:
                for col in t.values():
                    col.append(None)
                t["line"][-1], t["level"][-1], t["kind"][-1] = ln, "VERSION", "version"
                t["message"][-1] = "NCCL version " + v
            order = sorted(range(len(t["line"])), key=t["line"].__getitem__)
            t = {k: [col[i] for i in order] for k, col in t.items()}
        tables["nccl_log_lines"] = t
        return cls.result(label, tables, facts, log)


BASE = ("line", "ts", "ts_local", "host", "pid", "tid", "dev")
VIA_RE = re.compile(r"(?P<transport>[A-Z0-9]+)(?:/(?P<net>[^/\s]+)/(?P<net_dev>\d+))?")


class _Line:
    """One line with the NCCL prefix: its fields, and the kind of line it turns out to be."""
    __slots__ = ("line", "src", "ts", "ts_local", "host", "pid", "tid", "dev", "level", "msg", "kind")

    def __init__(self, line: int, g: re.Match):
        self.line = line
        self.ts, self.ts_local, self.host, self.level = g["ts"], None, g["host"], g["level"]
        # WARN lines' file:line (func): not kept for the others (a COLL log has millions of lines)
        self.src = (g["src"], g["srcline"], g["func"]) if self.level == "WARN" else None
        # Python ints: a corrupt 30-digit pid must not overflow int64 here (the typed table
        # turns out-of-range values into NA)
        self.pid, self.tid, self.dev = int(g["pid"]), int(g["tid"]), _int(g["dev"])
        self.msg = g["msg"].rstrip()
        self.kind = "other"


def _columns(names, rows: list) -> dict[str, list]:
    return {k: [getattr(r, k) for r in rows] for k in names}


def _section(info: list, hint: re.Pattern, rx: re.Pattern, kind: str, what: str,
             log: WarningLog) -> list[tuple[_Line, re.Match]]:
    """The lines ``hint`` picks, each with its ``rx`` match and marked ``kind``; a one-line
    warning for each that ``rx`` does not match."""
    out = []
    for r in info:
        if hint.search(r.msg):
            if (c := rx.search(r.msg)) is None:
                log.add(r.line, f"malformed {what} line: {r.msg[:120]!r}")
            else:
                r.kind = kind
                out.append((r, c))
    return out


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


register(NcclDebugParser)
