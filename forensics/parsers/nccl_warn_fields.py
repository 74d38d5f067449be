"""The fields of an NCCL WARN message the ``nccl_warnings`` table keeps beside it: the peer a
socket or IB error names (``peer``, ``peer_addr``, ``peer_port``) and an IB completion error's
fields in every wording (``ib_status``, ``ib_opcode``, ``ib_len``, ``vendor_err``, ``ib_side``,
``local_gid``, ``remote_gid``, ``ib_device``), as :mod:`.nccl_debug` documents them; also read by
:mod:`forensics.model.logs` for WARN rows of other sources."""
from __future__ import annotations

import re
from ..coerce import group_int

PEER_RE = re.compile(r"\b(?:peer|from|to) (?P<peer>[^\s,]*<\d+>)|\bpeer (?P<peer2>[^\s,]+)")
IB_STATUS_RE = re.compile(r"\bwith (?:error |status=)(?:[A-Za-z_ ]+\()?(?P<st>\d+)")
# an IB completion error in every wording (NCCL 2.3 to 2.30, the HPC-X IB plugin): "with error 12,
# opcode 0, len 0, vendor err 129 (Send)", "with status=12 opcode=0 len=0 vendor err 129 (Recv)",
# "status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=N vendor_err=129 req_type=Send",
# then RoCE GIDs ("remoteGids" has no space from 2.20) and the HCA ("hca mlx5_2", 2.22+)
IB_COMPLETION_RE = re.compile(
    r"with (?:error (?P<st_a>\d+),? opcode (?P<op_a>-?\d+),? len (?P<len_a>-?\d+),? vendor err (?P<ve_a>\d+)"
    r"|status=(?:(?P<stname>[A-Z_]+)\()?(?P<st_b>\d+)\)?,? opcode=(?:(?P<opname>[A-Z_]+)\()?(?P<op_b>-?\d+)\)?,?"
    r"(?: len=(?P<len_b>-?\d+)| reqSize=(?P<rs>-?\d+))?,? vendor[ _]err[ =](?P<ve_b>\d+))"
    r"(?: \((?P<req_a>\w+)\)| req_type=(?P<req_b>\w+))?(?:\s+localGid (?P<lgid>\S+))?(?: remoteGids? ?(?P<rgid>\S+))?"
    r"(?:\s+hca (?P<hca>\S+))?")
# an IB async event names its device and port: "NET/IB : mlx5_0:1 Got async event : port error"
IB_DEV_PORT_RE = re.compile(r"NET/IB ?: (?P<dev>[A-Za-z][\w-]*):(?P<port>\d+) ")
PEER_ADDR_RE = re.compile(r"^\[?(?P<addr>[^\s<>\[\]]+?)\]?(?:<(?P<port>\d+)>|:(?P<port2>\d+))?[,.;:]?$")


def peer_fields(msgs: list[str]) -> dict[str, list]:
    """``peer`` (as printed), ``peer_addr`` and ``peer_port`` of each WARN message."""
    peers = [((m["peer"] or m["peer2"]) if (m := PEER_RE.search(x)) else None) for x in msgs]
    return {"peer": peers, **_peer_parts(peers)}


def _peer_parts(peers: list) -> dict[str, list]:
    addrs, ports = [], []
    for p in peers:
        m = PEER_ADDR_RE.match(p) if isinstance(p, str) else None
        addrs.append(m["addr"] if m else None)
        port = (m["port"] or m["port2"]) if m else None
        ports.append(int(port) if port else None)
    return {"peer_addr": addrs, "peer_port": ports}


def ib_fields(msgs: list[str]) -> dict[str, list]:
    """The fields of IB completion errors in every wording, and the device an async event
    names (None where a line has none)."""
    keys = ("ib_status", "ib_opcode", "ib_len", "vendor_err", "ib_side", "local_gid", "remote_gid", "ib_device")
    out: dict[str, list] = {k: [] for k in keys}
    for msg in msgs:
        row = dict.fromkeys(keys)
        if "completion" in msg and (m := IB_COMPLETION_RE.search(msg)):
            row.update(ib_status=group_int(m["st_a"] or m["st_b"]), ib_opcode=group_int(m["op_a"] or m["op_b"]),
                       ib_len=group_int(m["len_a"] or m["len_b"] or m["rs"]), vendor_err=group_int(m["ve_a"] or m["ve_b"]),
                       ib_side=m["req_a"] or m["req_b"], local_gid=m["lgid"], remote_gid=m["rgid"],
                       ib_device=m["hca"])
        elif (m := IB_STATUS_RE.search(msg)):
            row["ib_status"] = group_int(m["st"])
        if row["ib_device"] is None and (d := IB_DEV_PORT_RE.search(msg)):
            row["ib_device"] = d["dev"]
        for k in keys:
            out[k].append(row[k])
    return out


__all__ = ["IB_COMPLETION_RE", "PEER_RE", "ib_fields", "peer_fields"]
