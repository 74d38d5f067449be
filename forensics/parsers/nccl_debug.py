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
    return None if v is None or v != v else int(v)


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

        lines = pd.Series(split_lines(decode_text(data)), dtype="object")
        lines.index = pd.RangeIndex(1, len(lines) + 1)   # 1-based line numbers
        n_lines = int((lines.str.strip().str.len() > 0).sum())
        lines = lines[lines.str.contains("NCCL", regex=False)]     # cheap filter before the big regex
        m = lines.str.extract(LINE_RE)
        matched = m["pid"].notna()

        # Lines without the prefix: bare version lines, or NCCL mentions that failed to parse.
        rest = lines[~matched]
        bare_versions = rest.str.extract(VERSION_RE)["version"]
        mentions = rest[bare_versions.isna() & rest.str.contains(MENTION_RE)]
        for ln, text in mentions.items():
            log.add(ln, f"NCCL line without a parsable host:pid:tid prefix: {text[:120]!r}")
        facts["other_lines"] = n_lines - int(matched.sum()) - int(bare_versions.notna().sum()) - len(mentions)

        m = m[matched].copy()
        if m.empty:
            for v in bare_versions.dropna():
                _add_version(facts, v)
            if not bare_versions.notna().any():
                log.add(None, "no NCCL_DEBUG lines found")
            bv = [{"line": ln, "level": "VERSION", "kind": "version", "message": "NCCL version " + v}
                  for ln, v in bare_versions.dropna().items()]
            return cls.result(label, {"nccl_log_lines": bv}, facts, log)
        m["line"] = m.index
        # Python ints (object columns): a corrupt 30-digit pid must not overflow int64 here;
        # the typed table turns out-of-range values into NA.
        m["pid"] = m["pid"].map(int)
        m["tid"] = m["tid"].map(int)
        m["dev"] = pd.to_numeric(m["dev"], errors="coerce")
        m["ts_local"] = pd.to_datetime(m["ts"].str.replace("_", " "), errors="coerce", format="mixed") \
            if m["ts"].notna().any() else pd.NaT
        m["msg"] = m["msg"].fillna("").str.rstrip()
        m["kind"] = "other"
        tables: dict = {}
        base = ["line", "ts", "ts_local", "host", "pid", "tid", "dev"]
        msg = m["msg"]
        info = m["level"] == "INFO"

        # --- COLL lines
        c = _section(m, info & msg.str.contains(COLL_HEAD_RE), COLL_RE, "op_name", "coll", "COLL", log)
        if len(c):
            coll = m.loc[c.index, base].join(c)
            coll["op"] = coll["op_name"].map(op_enum)
            coll["op_count"] = coll["op_count"].map(lambda h: int(h, 16))
            for col in ("count", "datatype", "red_op", "root", "nranks"):
                coll[col] = coll[col].map(int)
            for col in ("sendbuff", "recvbuff"):
                coll[col] = coll[col].where(coll[col] != "(nil)", None)
            coll["datatype_name"] = coll["datatype"].map(lambda d: DATATYPES.get(d, (None, None))[0])
            size = coll["datatype"].map(lambda d: DATATYPES.get(d, (None, None))[1])
            coll["bytes"] = [c_ * s if s is not None else None for c_, s in zip(coll["count"], size)]
            coll["red_op_name"] = coll["red_op"].map(lambda o: RED_OPS.get(o, "premulsum"))
            coll["peer"] = coll["root"].where(coll["op"].isin(["SEND", "RECV"]), None)
            tables["nccl_coll"] = coll

        # --- Init START/COMPLETE
        ini = _section(m, info & msg.str.contains(INIT_HINT_RE), INIT_RE, "status", "init", "Init", log)
        if len(ini):
            comms = m.loc[ini.index, ["line", "host", "pid", "tid", "dev"]].join(ini)
            for col in ("rank", "nranks", "cuda_dev", "nvml_dev"):
                comms[col] = pd.to_numeric(comms[col], errors="coerce")
            tables["nccl_comms"] = comms

        # --- Channel connection lines, ring order, rings and trees
        other = msg[info & (m["kind"] == "other")]      # not a COLL or Init line
        ch = other.str.extract(CHANNEL_RE).dropna(subset=["via"]) if len(other) else pd.DataFrame()
        if len(ch):
            m.loc[ch.index, "kind"] = "channel"
        if len(ch):
            chan = m.loc[ch.index, ["line", "host", "pid", "tid", "dev"]].join(ch)
            parts = chan["via"].str.extract(r"^(?P<transport>[A-Z0-9]+)(?:/(?P<net>[^/\s]+)/(?P<net_dev>\d+))?")
            chan["transport"] = parts["transport"]
            is_net = parts["transport"] == "NET"
            chan["net"] = parts["net"].where(is_net, None)
            chan["net_dev"] = pd.to_numeric(parts["net_dev"].where(is_net, None), errors="coerce")
            chan["gdrdma"] = chan["via"].str.contains("/GDRDMA", regex=False)
            for col in ("channel", "conn_index", "src_rank", "dst_rank"):
                chan[col] = pd.to_numeric(chan[col], errors="coerce")
            tables["nccl_channels"] = chan

        rings = []
        for kind, rx in (("ring_order", RING_ORDER_RE), ("ring", RING_RE), ("tree", TREE_RE)):
            other = msg[info & (m["kind"] == "other")]
            if other.empty:
                break
            sub = other.str.extract(rx).dropna(subset=["channel"])
            m.loc[sub.index, "kind"] = "ring" if kind.startswith("ring") else "tree"
            for ln, r in sub.iterrows():
                row = {"line": ln, "host": m.at[ln, "host"], "pid": m.at[ln, "pid"], "dev": _int(m.at[ln, "dev"]),
                       "kind": kind}
                for k, v in r.items():
                    if isinstance(v, str):
                        row[k] = " ".join(v.split()) if k == "order" else (v if k == "down" else int(v))
                rings.append(row)
        trees = msg[info & (m["kind"] == "other") & msg.str.startswith("Trees ")]
        for ln, text in trees.items():
            m.at[ln, "kind"] = "tree"
            for t in TREES_ITEM_RE.finditer(text):
                rings.append({"line": ln, "host": m.at[ln, "host"], "pid": m.at[ln, "pid"],
                              "dev": _int(m.at[ln, "dev"]), "kind": "trees", "channel": int(t["channel"]),
                              "rank": int(t["rank"]), "up": int(t["up"]), "down": t["down"]})
        tables["nccl_rings"] = rings

        # --- WARN lines
        warn = m[m["level"] == "WARN"]
        m.loc[warn.index, "kind"] = "warn"
        if len(warn):
            w = warn[base].copy()
            w["src_file"], w["src_line"], w["func"], w["message"] = warn["src"], \
                pd.to_numeric(warn["srcline"], errors="coerce"), warn["func"], warn["msg"]
            w["peer"] = warn["msg"].str.extract(PEER_RE)["peer"]
            w["ib_status"] = pd.to_numeric(warn["msg"].str.extract(IB_STATUS_RE)["st"], errors="coerce")
            tables["nccl_warnings"] = w

        # --- Per-process facts from the remaining INFO lines (few; a loop is clearest)
        procs: dict = facts["processes"]

        def proc(ln):
            key = f"{m.at[ln, 'host']}:{m.at[ln, 'pid']}"
            if key not in procs:
                procs[key] = {"host": m.at[ln, "host"], "pid": int(m.at[ln, "pid"]), "version": None,
                              "transport": None, "ib_devices": [], "oob_interface": None,
                              "oob_address": None, "socket_interfaces": [], "interfaces": [],
                              "gdr": None, "nchannels": None, "env": {}, "ranks": {}, "comm_ids": []}
            return procs[key]

        for ln in m.index:
            proc(ln)
        other = m[info & (m["kind"] == "other")]
        for ln, text in other["msg"].items():
            p = proc(ln)
            if (g := INFO_VERSION_RE.match(text)):
                m.at[ln, "kind"] = "version"
                p["version"] = p["version"] or g["version"]
                _add_version(facts, g["version"])
            elif (g := NET_IB_RE.match(text)):
                m.at[ln, "kind"] = "net"
                p["ib_devices"] = [{"index": int(d["index"]), "name": d["name"], "port": int(d["port"]),
                                    "link_layer": d["ll"]} for d in IB_DEV_RE.finditer(g["devs"])]
                if not p["ib_devices"]:
                    log.add(ln, f"NET/IB line lists no device: {text[:120]!r}")
                oob_if, _, oob_addr = g["oob"].partition(":")
                p["oob_interface"], p["oob_address"] = oob_if, re.sub(r"<\d+>$", "", oob_addr) or None
                p["transport"] = p["transport"] or "IB"
            elif (g := NET_SOCKET_RE.match(text)):
                m.at[ln, "kind"] = "net"
                p["socket_interfaces"] = [{"index": int(d["index"]), "name": d["name"], "address": d["addr"]}
                                          for d in SOCK_DEV_RE.finditer(g["devs"])]
                if not p["socket_interfaces"]:
                    log.add(ln, f"NET/Socket line lists no interface: {text[:120]!r}")
                p["transport"] = p["transport"] or "Socket"
            elif (g := USING_NET_RE.match(text)):
                m.at[ln, "kind"] = "net"
                p["transport"] = g["net"]
                p["_using_network"] = True
            elif (g := GDR_RE.search(text)):
                m.at[ln, "kind"] = "gdr"
                p["gdr"] = True if g["state"] == "Enabled" or p["gdr"] else False
            elif (g := ENV_RE.match(text)):
                m.at[ln, "kind"] = "env"
                val = g["val"][:-1] if g["val"].endswith(".") else g["val"]
                p["env"][g["var"]] = val
            elif (g := NCHANNELS_RE.match(text)):
                m.at[ln, "kind"] = "nchannels"
                p["nchannels"] = int(g["n"])
            elif (g := TOPO_RE.match(text)):
                m.at[ln, "kind"] = "topology"
            elif ERROR_RETURN_RE.match(text):
                m.at[ln, "kind"] = "error_return"
        for ln, v in bare_versions.dropna().items():
            _add_version(facts, v)
        if bare_versions.notna().any() and len(procs) == 1:
            only = next(iter(procs.values()))
            only["version"] = only["version"] or bare_versions.dropna().iloc[0]

        # Channels and comms refine the per-process view.
        if "nccl_channels" in tables:
            for (host, pid), grp in tables["nccl_channels"].groupby(["host", "pid"]):
                p = procs[f"{host}:{pid}"]
                if grp["gdrdma"].any():
                    p["gdr"] = True
                nets = grp["net"].dropna()
                if p["transport"] is None and len(nets):
                    p["transport"] = "IB" if nets.str.startswith("IB").any() else nets.iloc[0]
        if "nccl_comms" in tables:
            for r in tables["nccl_comms"].itertuples():
                p = procs[f"{r.host}:{r.pid}"]
                p["ranks"][r.comm] = None if pd.isna(r.rank) else int(r.rank)
                if isinstance(r.comm_id, str) and r.comm_id not in p["comm_ids"]:
                    p["comm_ids"].append(r.comm_id)
        # Without a "N coll channels" line, "Channel 00/NN : ranks" gives nChannels.
        ring_orders: dict = {}
        for r in rings:
            if r["kind"] == "ring_order" and r.get("nchannels") is not None:
                key = f"{r['host']}:{r['pid']}"
                ring_orders[key] = max(ring_orders.get(key, 0), r["nchannels"])
        for key, p in procs.items():
            if p["nchannels"] is None and key in ring_orders:
                p["nchannels"] = ring_orders[key]
            p.pop("_using_network", None)
            p["interfaces"] = sorted({d["name"] for d in p["ib_devices"]} | {d["name"] for d in p["socket_interfaces"]}
                                     | ({p["oob_interface"]} if p["oob_interface"] else set()))

        if not len(m) and not bare_versions.notna().any():
            log.add(None, "no NCCL_DEBUG lines found")
        lines_tab = m[base].copy()
        lines_tab["level"], lines_tab["kind"], lines_tab["message"] = m["level"], m["kind"], m["msg"]
        if bare_versions.notna().any():
            bv = pd.DataFrame({"line": bare_versions.dropna().index, "level": "VERSION", "kind": "version",
                               "message": ["NCCL version " + v for v in bare_versions.dropna()]})
            lines_tab = pd.concat([lines_tab, bv]).sort_values("line") if len(lines_tab) else bv
        tables["nccl_log_lines"] = lines_tab
        return cls.result(label, tables, facts, log)


def _section(m: pd.DataFrame, like: pd.Series, rx, key: str, kind: str, what: str,
             log: WarningLog) -> pd.DataFrame:
    """The fields of ``rx`` in the messages of the lines ``like`` selects, those whose ``key``
    field matched (a one-line warning for each that did not), marked ``kind`` in ``m``. No
    extract at all when nothing is selected: one over no lines still costs a millisecond."""
    if not like.any():
        return pd.DataFrame()
    msg = m["msg"]
    got = msg[like].str.extract(rx)
    bad = got[key].isna()
    for ln in got.index[bad]:
        log.add(ln, f"malformed {what} line: {msg[ln][:120]!r}")
    got = got[~bad]
    m.loc[got.index, "kind"] = kind
    return got


def _add_version(facts: dict, version: str) -> None:
    if facts["nccl_version"] is None:
        facts["nccl_version"] = version
    if version not in facts["versions"]:
        facts["versions"].append(version)


register(NcclDebugParser)
