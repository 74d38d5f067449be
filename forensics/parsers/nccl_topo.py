"""The ``Channel`` lines of NCCL's init in NCCL_DEBUG logs: each rank's ring order
(``Channel 00/16 :  0 1 2 ...``) and connections (``Channel 00/0 : 3[3] -> 4[4] via P2P/IPC``),
two lines per channel per rank per communicator: most of the INFO lines of a job that
creates many communicators.

They are read by ``logscan.c`` (``logscan_topo``) into columns, with their NCCL prefix, and
turned here into the rows :mod:`.nccl_debug` makes of them (``nccl_channels``, the
``ring_order`` rows of ``nccl_rings``, their ``nccl_log_lines`` rows) with numpy and pandas:
no Python object per line. The C reader takes a line only where the prefix it reads is the one
``LINE_RE`` finds first and the message matches ``CHANNEL_RE`` or ``RING_ORDER_RE`` whole; every
other line goes through :mod:`.nccl_debug`'s regular expressions, so the tables are the same
either way (``tests/forensics/parsers/test_parsers_nccl_topo.py`` compares the two on every
fixture log).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import lines as lines_mod
from ..native import TOPO_CONNECTION, TOPO_DTYPES, TOPO_ITEM_DTYPES, TOPO_PREFIX, TOPO_RING_ORDER, topo_chunks
from .text import LogText

# the transport a connection's ``via`` names (``NET/IB/0/GDRDMA``, ``P2P/IPC/read``, ``SHM/direct/direct``)
VIA_RE = re.compile(r"(?P<transport>[A-Z0-9]+)(?:/(?P<net>[^/\s]+)/(?P<net_dev>\d+))?")

_CHANNEL_COLS = ("line", "host", "pid", "tid", "dev", "channel", "conn_index", "src_rank", "src_dev", "dst_rank",
                 "dst_dev", "direction", "via", "transport", "net", "net_dev", "gdrdma")
# the C columns the connection and ring order lines fill
_CONNECTION_COLS = ("start", "channel", "sub", "src_rank", "src_dev_off", "src_dev_len", "src_dev_hash", "dst_rank",
                    "dst_dev_off", "dst_dev_len", "dst_dev_hash", "direction", "via_off", "via_len", "via_hash")
_RING_ORDER_COLS = ("start", "channel", "sub", "order_off", "order_len", "order_hash")
_RING_COLS = ("line", "host", "pid", "dev", "kind", "channel", "rank", "prev", "next", "up", "down", "order",
              "nchannels")


def via_fields(via: str) -> tuple[str | None, str | None, int | None]:
    """(transport, net, net_dev) a connection's ``via`` names (net and net_dev: NET only)."""
    v = VIA_RE.match(via)
    if v is None:
        return None, None, None
    if v["transport"] != "NET":
        return v["transport"], None, None
    return "NET", v["net"], None if v["net_dev"] is None else int(v["net_dev"])


@dataclass
class TopoLines:
    """What the C reader read of a log's Channel lines. ``channels`` and ``rings``: typed
    frames of ``nccl_channels`` and ``nccl_rings`` rows (their schemas' columns);
    ``log_lines``: the ``nccl_log_lines`` rows of every line C read, the other INFO lines
    (at the rows ``info_rows``) of kind ``other`` until :meth:`lines_with_kinds`; ``info``:
    those lines' prefix fields (arrays; ``code``: the index of each one's message in
    ``info_msgs``); ``first_seen``: (line, host, pid) of each process's first line C read;
    ``vias``: (line, host, pid, via) of each process's first connection by each ``via``, by
    line; ``nchannels``: (host, pid, the largest ``Channel NN/CC`` count of its ring order
    lines)."""

    starts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    n_topo: int = 0
    info: dict[str, np.ndarray] = field(default_factory=dict)
    channels: pd.DataFrame | None = None
    rings: pd.DataFrame | None = None
    log_lines: pd.DataFrame | None = None
    first_seen: list[tuple[int, str, int]] = field(default_factory=list)
    vias: list[tuple[int, str, int, str]] = field(default_factory=list)
    nchannels: list[tuple[str, int, int]] = field(default_factory=list)
    info_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    info_msgs: list[str] = field(default_factory=list)

    def lines_with_kinds(self, kinds: np.ndarray, coll_apart: bool) -> pd.DataFrame | None:
        """``log_lines`` with the kinds the parser gave the ``info`` lines (``kinds``, in their
        order); ``coll_apart``: the lines of kind ``coll`` left out (their rows are the
        ``nccl_coll`` table's)."""
        if self.log_lines is None or not len(self.info_rows):
            return self.log_lines
        kind = self.log_lines["kind"].to_numpy(dtype=object, copy=True)
        kind[self.info_rows] = kinds
        out = self.log_lines.assign(kind=pd.array(kind, dtype="string"))
        if coll_apart and (kind == "coll").any():
            out = out[kind != "coll"].reset_index(drop=True)
        return out

    def __len__(self) -> int:
        """The Channel lines read (not the ``info`` lines: those become the parser's rows)."""
        return self.n_topo


def scan_topology(text: LogText, hits: np.ndarray, schemas: dict,
                  lines: bool = True) -> tuple[TopoLines, np.ndarray]:
    """(the Channel and Trees lines among the "NCCL INFO " offsets ``hits`` that C read, and
    the prefixes of the other INFO lines it read; the offsets left to the regular
    expressions). ``schemas``: the parser's table schemas; ``lines``: whether to make their
    ``nccl_log_lines`` rows (``log_lines``; None without)."""
    every, (conn, ring, other), items, rest = _gather(text, hits, lines)
    if not len(every["start"]):
        return TopoLines(), rest
    _, _, line = text.line_numbers_and_ends(every["start"])
    hosts, host_code = _distinct(text, every["host_off"], every["host_len"], every["host_hash"])
    pid = every["pid"]
    proc = _pair(host_code, pd.factorize(pid)[0])          # each line's process: (host, pid)
    out = TopoLines(starts=every["start"])
    # every line's nccl_log_lines row (the other INFO lines' kinds are the parser's: lines_with_kinds)
    base = {"line": line, "host": host_code, "pid": pid, "tid": every["tid"], "dev": every["dev"]}
    if lines:
        msgs, code = _distinct(text, every["msg_off"], every["msg_len"], every["msg_hash"])
        out.log_lines = _log_lines(text, every, {**base, "host": _sa(hosts, host_code)},
                                   _sa(["", "channel", "ring", "other", "tree"], every["kind"]), _sa(msgs, code),
                                   schemas["nccl_log_lines"])
    out.info_rows = other["row"]
    out.first_seen = [(int(line[i]), hosts[host_code[i]], int(pid[i])) for i in _firsts(proc)[1].tolist()]
    if len(out.info_rows):
        at = out.info_rows
        msgs, code = _distinct(text, other["msg_off"], other["msg_len"], other["msg_hash"])
        out.info = _info(text, other, line[at], _objects(hosts)[host_code[at]], _objects(msgs)[code])
        out.info["code"], out.info_msgs = code, msgs
    out.n_topo = len(line) - len(out.info_rows)      # the tables below: the rows of their kinds
    if not out.n_topo:
        return out, rest
    at = conn["row"]
    out.channels = _channels(text, conn, {k: v[at] for k, v in base.items()}, hosts, schemas["nccl_channels"])
    raw = {k: base[k] for k in ("line", "host", "pid", "dev")}
    out.rings = _rings(text, ring, {k: v[ring["row"]] for k, v in raw.items()}, items,
                       {k: v[items["item_row"]] for k, v in raw.items()}, hosts, schemas["nccl_rings"])
    # each process's first connection by each via
    for j in _firsts(_pair(proc[at], pd.factorize(conn["via_hash"])[0]))[1].tolist():
        i, o = int(at[j]), int(conn["via_off"][j])
        out.vias.append((int(line[i]), hosts[host_code[i]], int(pid[i]),
                         bytes(text.data[o:o + int(conn["via_len"][j])]).decode("ascii")))
    ro = ring["sub"] >= 0           # each process's largest "Channel NN/CC" count, in order of its first one
    if ro.any():
        rows = ring["row"][ro]
        g, first = _firsts(proc[rows])
        most = np.full(len(first), np.iinfo(np.int64).min)
        np.maximum.at(most, g, ring["sub"][ro])
        out.nchannels = [(hosts[host_code[i]], int(pid[i]), int(n))
                         for i, n in zip(rows[first].tolist(), most.tolist())]
    return out, rest


# the C columns kept of every line read (with ``lines``: also ``_LINE_COLS``, for its
# nccl_log_lines row), and of the other INFO lines (their prefixes and messages)
_EVERY_COLS = ("start", "host_off", "host_len", "host_hash", "pid", "tid", "dev", "kind")
_LINE_COLS = ("pre", "pre_hash", "ts_len", "msg_off", "msg_len", "msg_hash")
_MESSAGE_COLS = ("start", "pre", "pre_hash", "ts_len", "pid", "tid", "dev", "msg_off", "msg_len", "msg_hash")
STRETCH = 1 << 17           # hits read by one call of C (its buffers: ~250 bytes a hit)


def _gather(text: LogText, hits: np.ndarray, lines: bool):
    """C's columns of the lines among ``hits``, kept by kind a stretch at a time (a column of
    C's is kept only for the lines of the kinds that fill it: no column of every line for each
    field of each kind): ``(every, (connections, ring orders, others), items, rest)``.
    ``every``: each line's ``_EVERY_COLS`` (and ``_LINE_COLS`` with ``lines``); the three
    kinds: their ``_CONNECTION_COLS``, ``_RING_ORDER_COLS``, ``_MESSAGE_COLS``, with ``row``,
    each line's index in ``every``; ``items``: the Trees lines' items (``item_row`` likewise);
    ``rest``: the offsets left to the regular expressions, in order."""
    every_cols = _EVERY_COLS + (_LINE_COLS if lines else ())
    kinds = ((TOPO_CONNECTION, _CONNECTION_COLS), (TOPO_RING_ORDER, _RING_ORDER_COLS), (TOPO_PREFIX, _MESSAGE_COLS))
    dtypes = {**TOPO_DTYPES, **TOPO_ITEM_DTYPES, "row": np.int64}
    every = {k: np.empty(len(hits), dtypes[k]) for k in every_cols}      # C writes these in place
    parts: list[dict[str, list]] = [{k: [] for k in (*cols, "row")} for _, cols in kinds]
    items: dict[str, list] = {k: [] for k in TOPO_ITEM_DTYPES}
    rest: list[np.ndarray] = []
    base = 0
    for c, it, left in topo_chunks(text.data, text.size, hits, any_message=True, chunk=STRETCH, into=every):
        for (kind, cols), part in zip(kinds, parts):
            at = np.flatnonzero(c["kind"] == kind)
            for k in cols:
                part[k].append(c[k][at])
            part["row"].append(at + base)
        for k, v in it.items():
            items[k].append(v + base if k == "item_row" else v.copy())
        rest.append(left.copy())
        base += len(c["kind"])

    def joined(d: dict[str, list]) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v) if v else np.empty(0, dtypes[k]) for k, v in d.items()}

    return ({k: v[:base] for k, v in every.items()}, tuple(joined(p) for p in parts), joined(items),
            np.concatenate(rest) if rest else np.empty(0, np.int64))


def _pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A key per row for the pair of codes (``a``, ``b``: non-negative integers, as
    ``pd.factorize`` gives them), equal where the pairs are."""
    return a.astype(np.int64) * (int(b.max(initial=0)) + 1) + b


def _firsts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each row's code, the row of each code's first occurrence): the distinct keys numbered
    in order of first appearance (a hash table, ``pd.factorize``: no sort), so the first rows
    come out in row order."""
    codes, uniq = pd.factorize(keys)
    first = np.empty(len(uniq), np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)      # the last write wins: the first row
    return codes, first


def refine_processes(procs: dict, chans: list[tuple], comms: list[tuple],
                      rings: list[dict], topo: TopoLines) -> None:
    """Complete the processes' facts (``procs``: :mod:`.nccl_debug`'s ``processes`` fact) from
    their channels (GDR, the transport when no line named it; ``chans``: (row, match) of the
    Channel lines the regular expressions read, and C's ``topo``), comms (ranks, comm ids;
    ``comms``: (row, match) of the Init lines) and ring order (nChannels without a "N coll
    channels" line; ``rings``: the ``nccl_rings`` rows read by the regular expressions), then
    list their interfaces."""
    nets: dict[str, list[str]] = {}
    vias: dict[str, str | None] = {}          # via -> the net it names (NET channels), read once each
    conns = [(r.line, r.host, r.pid, c["via"]) for r, c in chans]
    if topo.vias:
        conns = sorted(conns + topo.vias, key=lambda x: x[0])
    for _, host, pid, via in conns:
        key = f"{host}:{pid}"
        if key not in procs:          # a line of no pid (the process's facts are keyed by it)
            continue
        if "/GDRDMA" in via:
            procs[key]["gdr"] = True
        if via not in vias:
            v = VIA_RE.match(via)
            vias[via] = v["net"] if v and v["transport"] == "NET" else None
        if vias[via] is not None:
            nets.setdefault(key, []).append(vias[via])
    for key, used in nets.items():       # IB when any NET channel is, else the first one's
        if procs[key]["transport"] is None:
            procs[key]["transport"] = "IB" if any(n.startswith("IB") for n in used) else used[0]
    ids: dict[str, dict] = {}                 # each process's comm ids, in order (a dict: no list search)
    for r, c in comms:
        key = f"{r.host}:{r.pid}"
        if (p := procs.get(key)) is None:
            continue
        p["ranks"][c["comm"]] = None if c["rank"] is None else int(c["rank"])
        if c["comm_id"] is not None:
            if (seen := ids.get(key)) is None:
                seen = ids[key] = dict.fromkeys(p["comm_ids"])
            seen[c["comm_id"]] = None
    for key, seen in ids.items():
        procs[key]["comm_ids"][:] = seen
    # Without a "N coll channels" line, "Channel 00/NN : ranks" gives nChannels.
    ring_orders: dict = {}
    for row in rings:
        if row["kind"] == "ring_order" and row.get("nchannels") is not None:
            key = f"{row['host']}:{row['pid']}"
            ring_orders[key] = max(ring_orders.get(key, 0), row["nchannels"])
    for host, pid, n in topo.nchannels:
        key = f"{host}:{pid}"
        ring_orders[key] = max(ring_orders.get(key, 0), n)
    for key, p in procs.items():
        if p["nchannels"] is None and key in ring_orders:
            p["nchannels"] = ring_orders[key]
        p["interfaces"] = sorted({d["name"] for d in p["ib_devices"]} | {d["name"] for d in p["socket_interfaces"]}
                                 | ({p["oob_interface"]} if p["oob_interface"] else set()))


def _info(text: LogText, c: dict, line: np.ndarray, host: np.ndarray, msg: np.ndarray) -> dict[str, np.ndarray]:
    """The prefix fields of the other INFO lines C read, as arrays (a line the parser reads
    becomes its row): line, pre (the text before the prefix), ts, host, pid, tid, dev, msg."""
    data = text.data
    ts = np.full(len(line), None, dtype=object)
    for i in np.flatnonzero(c["ts_len"] > 0).tolist():
        a = int(c["pre"][i])
        ts[i] = bytes(data[a + 1:a + int(c["ts_len"][i]) - 1]).decode("ascii")
    return {"line": line, "pre": _strings(text, c["start"], c["pre"] - c["start"], c["pre_hash"]), "ts": ts,
            "host": np.asarray(host, dtype=object), "pid": c["pid"], "tid": c["tid"], "dev": c["dev"], "msg": msg}


def _distinct(text: LogText, off: np.ndarray, ln: np.ndarray, key: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(the distinct (ASCII) texts at (offset, length) by ``key``, each row's index into them)."""
    inv, first = _firsts(key)
    if not len(first):
        return [], inv
    data = text.data        # each text within one ASCII line: decoded together, split at the joins
    joined = b"\n".join([data[o:o + n] for o, n in zip(off[first].tolist(), ln[first].tolist())])
    return joined.decode("ascii").split("\n"), inv


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _strings(text: LogText, off: np.ndarray, ln: np.ndarray, key: np.ndarray) -> np.ndarray:
    """The (ASCII) text at (offset, length) of each row, decoded once per distinct ``key``."""
    if not len(key):
        return np.empty(0, object)
    vals, inv = _distinct(text, off, ln, key)
    return _objects(vals)[inv]


def _int_column(a: np.ndarray, na: np.ndarray | None = None):
    """An Int64 column of ``a`` (a copy), NA where ``na``."""
    return pd.arrays.IntegerArray(a.astype(np.int64), np.zeros(len(a), bool) if na is None else na.copy())


def _int_column_at(distinct: list, inv: np.ndarray):
    """An Int64 column of the distinct values ``distinct`` (ints or None) at ``inv``; a value
    int64 does not hold is NA, as the registry's conversion makes it."""
    distinct = [None if v is None or not -(1 << 63) <= v < 1 << 63 else v for v in distinct]
    vals = np.array([0 if v is None else v for v in distinct], np.int64)
    na = np.array([v is None for v in distinct], bool)
    return pd.arrays.IntegerArray(vals[inv], na[inv])


def _sa(values: list, inv: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """A string column of the distinct values ``values`` (str or None: NA) at ``inv``."""
    return pd.array(_objects(values), dtype="string").take(inv)


def _str(values) -> pd.api.extensions.ExtensionArray:
    return pd.array(np.asarray(values, dtype=object), dtype="string")


def _frame(cols: dict, schema: dict) -> pd.DataFrame:
    n = len(cols["line"])
    na = {"str": lambda: _sa([None], np.zeros(n, np.intp)),
          "int": lambda: pd.arrays.IntegerArray(np.zeros(n, np.int64), np.ones(n, bool)),
          "bool": lambda: pd.arrays.BooleanArray(np.zeros(n, bool), np.ones(n, bool)),
          "time": lambda: np.full(n, None, dtype=object)}
    return pd.DataFrame({k: cols[k] if k in cols else na[kind]() for k, kind in schema.items()},
                        index=pd.RangeIndex(n), copy=False)


def _channels(text: LogText, c: dict, base: dict, hosts: list, schema: dict) -> pd.DataFrame | None:
    """``nccl_channels`` rows of the connection lines C read (``c``: their columns, ``base``:
    their line, host code (into ``hosts``), pid, tid and dev)."""
    if not len(c["start"]):
        return None
    vals, inv = _distinct(text, c["via_off"], c["via_len"], c["via_hash"])
    fields = [via_fields(v) for v in vals]
    return _frame({
        "line": _int_column(base["line"]), "host": _sa(hosts, base["host"]), "pid": _int_column(base["pid"]),
        "tid": _int_column(base["tid"]),
        "dev": _int_column(base["dev"]), "channel": _int_column(c["channel"]), "conn_index": _int_column(c["sub"], c["sub"] < 0),
        "src_rank": _int_column(c["src_rank"]), "src_dev": _sa(*_distinct(text, c["src_dev_off"], c["src_dev_len"],
                                                                     c["src_dev_hash"])),
        "dst_rank": _int_column(c["dst_rank"]), "dst_dev": _sa(*_distinct(text, c["dst_dev_off"], c["dst_dev_len"],
                                                                     c["dst_dev_hash"])),
        "direction": _sa([None, "send", "receive"], c["direction"]), "via": _sa(vals, inv),
        "transport": _sa([f[0] for f in fields], inv), "net": _sa([f[1] for f in fields], inv),
        "net_dev": _int_column_at([f[2] for f in fields], inv),
        "gdrdma": pd.array(np.array(["/GDRDMA" in v for v in vals], bool)[inv], dtype="boolean"),
    }, schema)


def _rings(text: LogText, c: dict, base: dict, items: dict, item_base: dict, hosts: list,
           schema: dict) -> pd.DataFrame | None:
    """``nccl_rings`` rows of the ring order lines C read (``c``: their columns, ``base``: their
    line, host code (into ``hosts``), pid and dev) and of the items of its Trees lines
    (``items``, ``item_base``), in line order (a line's items in theirs): each column is made
    once, its values put in place of both kinds (no concatenation and sort of two frames)."""
    n1, n2 = len(c["start"]), len(items["item_row"])
    if not n1 + n2:
        return None
    at1 = np.arange(n1) + np.searchsorted(item_base["line"], base["line"], "left")     # both sorted
    at2 = np.arange(n2) + np.searchsorted(base["line"], item_base["line"], "right")

    def both(a1, a2, dtype=np.int64) -> np.ndarray:
        out = np.empty(n1 + n2, dtype)
        out[at1], out[at2] = a1, a2
        return out

    def only(a, dtype=np.int64, first: bool = True) -> np.ndarray:     # one kind's values, NA in the other's
        return both(a, np.zeros(n2, dtype), dtype) if first else both(np.zeros(n1, dtype), a, dtype)

    orders, order_code = _distinct(text, c["order_off"], c["order_len"], c["order_hash"])
    downs, down_code = _distinct(text, items["item_down_off"], items["item_down_len"], items["item_down_hash"])
    nchannels_na = c["sub"] < 0
    return _frame({
        "line": _int_column(both(base["line"], item_base["line"])), "host": _sa(hosts, both(base["host"], item_base["host"])),
        "pid": _int_column(both(base["pid"], item_base["pid"])), "dev": _int_column(both(base["dev"], item_base["dev"])),
        "kind": _sa(["ring_order", "trees"], only(np.ones(n2, np.intp), np.intp, first=False)),
        "channel": _int_column(both(c["channel"], items["item_channel"])),
        "rank": _int_column(only(items["item_rank"], first=False), only(np.ones(n1, bool), bool)),
        "up": _int_column(only(items["item_up"], first=False), only(np.ones(n1, bool), bool)),
        "down": _sa(downs + [None], both(np.full(n1, len(downs), np.intp), down_code, np.intp)),
        "order": _sa([" ".join(o.split()) for o in orders] + [None],
                     both(order_code, np.full(n2, len(orders), np.intp), np.intp)),
        "nchannels": _int_column(only(c["sub"]), both(nchannels_na, np.ones(n2, bool), bool)),
    }, schema)


def _log_lines(text: LogText, c: dict, base: dict, kind, msg, schema: dict) -> pd.DataFrame:
    n = len(kind)
    ts = np.full(n, None, dtype=object)
    stamped = np.flatnonzero(c["ts_len"] > 0)
    data = text.data
    for i in stamped:
        a = int(c["pre"][i])
        ts[i] = bytes(data[a + 1:a + int(c["ts_len"][i]) - 1]).decode("ascii")
    # as nccl_debug's _stamp_local_times makes them: Timestamps (their unit as parsed) or None;
    # the table's time column is made of these objects with the other lines' (the unit of
    # the column follows its values)
    ts_local = np.full(n, None, dtype=object)
    if len(stamped):
        ts_local[stamped] = _objects(pd.to_datetime(pd.Series([ts[i].replace("_", " ") for i in stamped],
                                                              dtype="object"), errors="coerce", format="mixed").tolist())
    cols = {"line": _int_column(base["line"]), "ts": _str(ts) if len(stamped) else _sa([None], np.zeros(n, np.intp)),
            "ts_local": ts_local, "host": _str(base["host"]), "pid": _int_column(base["pid"]), "tid": _int_column(base["tid"]),
            "dev": _int_column(base["dev"]), "level": _sa(["INFO"], np.zeros(n, np.intp)), "kind": kind, "message": msg}
    pres, inv = _distinct(text, c["start"], c["pre"] - c["start"], c["pre_hash"])
    ctx = lines_mod.context_columns(pres)
    for k, kind_ in lines_mod.CONTEXT_COLUMNS.items():
        cols[k] = _sa(ctx[k], inv) if kind_ == "str" else _int_column_at(ctx[k], inv)
    return _frame(cols, schema)


__all__ = ["TopoLines", "VIA_RE", "refine_processes", "scan_topology", "via_fields"]
