"""InfiniBand / RoCE port counters: perfquery (plain and ``-x``) and sysfs, start and end.

NCCL over IB/RoCE bypasses the kernel TCP stack, so these counters are the network
evidence there. Accepted forms, in one file or mixed in a folder:

- ``perfquery`` / ``perfquery -x`` output: ``# Port counters: Lid L port P (CapMask: …)``
  or ``# Port extended counters: …`` (the header may be wrapped onto two lines)
  followed by ``Name:.....value`` lines, current or very old field names.
- ``grep -H . /sys/class/infiniband/*/ports/*/{counters,hw_counters}/*`` listings:
  ``<…>/<device>/ports/<port>/<group>/<name>:<value>``, plus the port attributes
  ``state``, ``phys_state``, ``rate``, ``link_layer``.
- flat ``name: value`` listings; device and port come from a ``# <device> port <n>``
  line or from the file's path (``…/mlx5_0/1/counters.txt``).
- a folder (``ib/`` of a bundle) holding any of the above and/or copies of the sysfs
  tree: ``<phase>/<device>/<port>/counters/<name>`` or ``…/<device>/ports/<port>/
  hw_counters/<name>`` files of one value each.

The phase (start|end) comes from the path (a component or file name part ``start``,
``begin``, ``before``, ``pre`` / ``end``, ``after``, ``post``); NA when it says none.
Counter names are normalised to the kernel's sysfs names (``SymbolErrorCounter`` ->
``symbol_error``, ``PortXmitPkts`` -> ``port_xmit_packets``, old ``XmtDiscards`` ->
``port_xmit_discards``; ``QP1Dropped`` -> ``qp1_dropped``).

Table ``ib_counters``: line (int, NA for one-value files), file (str), phase (str),
device (str: the HCA, or ``lid<L>`` for perfquery output that names no device), port
(int), counter (str, sysfs name), value (uint; NA for ``N/A (no PMA)``), width_bits
(int: counter width, 64 for extended counters; legacy PMA counters are 4..32 bits and
saturate), source (perfquery|perfquery_ext|sysfs|hw_counters).

Facts: ports ({"<device>/<port>": {state, phys_state, rate, link_layer, lid, cap_mask}}),
phases (list), devices (list).

:func:`ib_deltas` turns start and end snapshots into per-counter deltas with wrap,
reset and saturation handling, and joins :data:`COUNTER_INFO` (what a counter means
and what to do when it moved).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd

from ..errors import InputError
from .registry import (Parser, ParseResult, WarningLog, decode_text, frame, looks_binary, read_source,
                       register, split_lines)

# perfquery field name -> sysfs name (current rdma-core names and the pre-rename ones)
PERFQUERY_NAMES = {
    "SymbolErrorCounter": "symbol_error", "SymbolErrors": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery", "LinkRecovers": "link_error_recovery",
    "LinkDownedCounter": "link_downed", "LinkDowned": "link_downed",
    "PortRcvErrors": "port_rcv_errors", "RcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "RcvRemotePhysErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors", "RcvSwRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards", "XmtDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors", "XmtConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors", "RcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors", "LinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "ExcBufOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped", "QP1Dropped": "qp1_dropped",
    "PortXmitData": "port_xmit_data", "XmtData": "port_xmit_data",
    "PortRcvData": "port_rcv_data", "RcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets", "XmtPkts": "port_xmit_packets",
    "PortRcvPkts": "port_rcv_packets", "RcvPkts": "port_rcv_packets",
    "PortXmitWait": "port_xmit_wait", "XmtWait": "port_xmit_wait",
    "PortUnicastXmitPkts": "unicast_xmit_packets", "PortUnicastRcvPkts": "unicast_rcv_packets",
    "PortMulticastXmitPkts": "multicast_xmit_packets", "PortMulticastRcvPkts": "multicast_rcv_packets",
}
NOT_COUNTERS = {"PortSelect", "CounterSelect", "CounterSelect2"}
PORT_ATTRS = {"state", "phys_state", "rate", "link_layer", "lid", "sm_lid", "cap_mask", "gids", "lifespan"}

# Widths of the legacy PMA PortCounters (IBA spec); they saturate at their maximum.
LEGACY_WIDTHS = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16, "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16, "qp1_dropped": 16, "port_xmit_data": 32,
    "port_rcv_data": 32, "port_xmit_packets": 32, "port_rcv_packets": 32, "port_xmit_wait": 32,
}
DATA_COUNTERS = {"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"}
HW_COUNTER_WIDTH = 32   # mlx5 Q and congestion counters are 32-bit firmware fields

# counter -> (kind, meaning, action when it moved during the incident)
COUNTER_INFO: dict[str, tuple[str, str, str]] = {
    "symbol_error": ("error", "bad symbols on the physical lanes",
                     "cable or transceiver degrading; reseat/replace it (check with mlxlink); precedes link flaps"),
    "link_error_recovery": ("error", "the link retrained after errors",
                            "marginal cable/port; in-flight packets were lost during retraining"),
    "link_downed": ("error", "the link went down (failed to recover)",
                    "link flap: RDMA transfers on it timed out (NCCL IB status 12); check cable, switch port, dmesg"),
    "port_rcv_errors": ("error", "received packets dropped as malformed (CRC, length)",
                        "physical errors on this port's receive side; check the cable and the sending port"),
    "port_rcv_remote_physical_errors": ("error", "received packets marked bad (EBP) by an upstream switch",
                                        "the fault is upstream; find the switch port with symbol/receive errors"),
    "port_rcv_switch_relay_errors": ("error", "packets a switch could not relay (routing)",
                                     "check the subnet manager's routing and LIDs"),
    "port_xmit_discards": ("congestion", "outbound packets discarded (port down, or head-of-queue timeout)",
                           "congestion or a stuck peer; compare port_xmit_wait and the peer's receive counters"),
    "port_xmit_constraint_errors": ("error", "outbound packets dropped by partition enforcement",
                                    "check P_Key partition configuration"),
    "port_rcv_constraint_errors": ("error", "inbound packets dropped by partition enforcement",
                                   "check P_Key partition configuration"),
    "local_link_integrity_errors": ("error", "local physical errors exceeded the link's threshold",
                                    "bad cable or port; replace"),
    "excessive_buffer_overrun_errors": ("error", "receive buffer overruns (flow-control failure)",
                                        "credit/VL buffer problem with the link partner"),
    "VL15_dropped": ("info", "subnet-management packets dropped", "usually benign"),
    "qp1_dropped": ("info", "QP1 (GSI) management packets dropped", "usually benign"),
    "port_xmit_data": ("traffic", "data sent, in 4-octet units", "x4 = bytes; no change during a hang = no RDMA sent"),
    "port_rcv_data": ("traffic", "data received, in 4-octet units",
                      "x4 = bytes; no change during a hang = nothing arrived"),
    "port_xmit_packets": ("traffic", "packets sent", ""),
    "port_rcv_packets": ("traffic", "packets received", ""),
    "unicast_xmit_packets": ("traffic", "unicast packets sent", ""),
    "unicast_rcv_packets": ("traffic", "unicast packets received", ""),
    "multicast_xmit_packets": ("traffic", "multicast packets sent", ""),
    "multicast_rcv_packets": ("traffic", "multicast packets received", ""),
    "port_xmit_wait": ("congestion", "ticks with data queued but no credits to send",
                       "back-pressure: congestion or a slow receiver downstream of this port"),
    "out_of_sequence": ("retransmission", "packets received out of sequence (a packet before them was lost)",
                        "loss in the fabric; check switch counters and, on RoCE, PFC/ECN configuration"),
    "packet_seq_err": ("retransmission", "NAK-sequence errors received (the responder saw a gap)",
                       "loss in the fabric"),
    "implied_nak_seq_err": ("retransmission", "implied NAKs: responses lost", "loss in the fabric"),
    "local_ack_timeout_err": ("retransmission", "the QP retry timer expired waiting for an ACK",
                              "peer unreachable or heavy loss; retries exhausted give NCCL IB status 12"),
    "rnr_nak_retry_err": ("retransmission", "receiver-not-ready NAK retries exhausted",
                          "the peer process did not post receive buffers in time: stuck or slow peer"),
    "duplicate_request": ("retransmission", "duplicate requests received (the sender retransmitted)",
                          "requests or ACKs lost in the fabric"),
    "out_of_buffer": ("congestion", "packets dropped because no receive buffer was posted",
                      "the receiving process is too slow to post buffers"),
    "np_cnp_sent": ("congestion", "congestion notifications sent (ECN-marked packets arrived here)",
                    "RoCE congestion on the path towards this host"),
    "np_ecn_marked_roce_packets": ("congestion", "RoCE packets received with ECN marks",
                                   "RoCE congestion on the path towards this host"),
    "rp_cnp_handled": ("congestion", "congestion notifications handled: this host's send rate was cut",
                       "RoCE congestion (DCQCN throttled this sender)"),
    "rp_cnp_ignored": ("congestion", "congestion notifications ignored", "check the DCQCN configuration"),
    "roce_adp_retrans": ("retransmission", "adaptive retransmissions", "loss in the RoCE fabric"),
    "roce_adp_retrans_to": ("retransmission", "adaptive retransmissions after timeouts", "loss in the RoCE fabric"),
    "roce_slow_restart": ("retransmission", "slow restarts after loss", "loss in the RoCE fabric"),
    "roce_slow_restart_cnps": ("congestion", "CNPs sent on slow restart", "loss/congestion in the RoCE fabric"),
    "roce_slow_restart_trans": ("retransmission", "transitions to slow restart", "loss in the RoCE fabric"),
    "req_cqe_error": ("error", "requester completions with error",
                      "see NCCL WARN 'Got completion … status'; follows link loss or a peer abort"),
    "resp_cqe_error": ("error", "responder completions with error", "follows link loss or a peer abort"),
    "req_cqe_flush_error": ("info", "requests flushed after the QP entered the error state",
                            "a consequence; look for the first error"),
    "resp_cqe_flush_error": ("info", "responses flushed after the QP entered the error state",
                             "a consequence; look for the first error"),
    "req_remote_access_errors": ("error", "remote access errors (requester)", "memory registration/rkey mismatch"),
    "resp_remote_access_errors": ("error", "remote access errors (responder)", "memory registration/rkey mismatch"),
    "req_remote_invalid_request": ("error", "remote invalid request errors", "protocol/QP state mismatch"),
    "resp_local_length_error": ("error", "receive buffer too small for an incoming message", "application bug"),
    "rx_write_requests": ("traffic", "RDMA write requests received", ""),
    "rx_read_requests": ("traffic", "RDMA read requests received", ""),
    "rx_atomic_requests": ("traffic", "RDMA atomic requests received", ""),
    "rx_dct_connect": ("traffic", "DCT connect requests received", ""),
}

PERFQ_HEADER_RE = re.compile(r"^#\s*Port (?P<ext>extended )?counters:\s*(?:Lid (?P<lid>\d+)\s+)?port (?P<port>\d+)"
                             r"(?:.*?CapMask:\s*(?P<cap>0x[0-9a-fA-F]+))?")
PERFQ_FIELD_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9]*):\.+\s*(?P<value>.*?)\s*$")
SYSFS_LINE_RE = re.compile(r"^(?:.*?/)?(?P<dev>[^/\s:]+)/ports/(?P<port>\d+)/(?:(?P<grp>counters(?:_ext)?|hw_counters)/)?"
                           r"(?P<name>[^/:\s]+):(?P<value>.*)$")
FLAT_RE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_]*)\s*[:=]\s*(?P<value>\S.*?)\s*$")
FLAT_HEADER_RE = re.compile(r"^#\s*(?:device\s+)?(?P<dev>[A-Za-z][\w.-]*?)\s+port\s+(?P<port>\d+)\s*$")
DEVICE_NAME_RE = re.compile(r"^(?:mlx\d+_\d+|hfi\d+_\d+|qib\d+|bnxt_re\d+|irdma\d*|rxe\w*|siw\w*|efa_\d+|"
                            r"ionic_\d+|erdma_\d+|[a-z]+\d*_\d+)$")
# a pasted command line: ``[root@gpu-d02 ~]# perfquery -x -C mlx5_1 -P 1`` names the block's HCA and port
PERFQ_CMD_RE = re.compile(r"\bperfquery\b(?P<args>[^#]*)$")
PHASES = {"start": "start", "begin": "start", "before": "start", "pre": "start",
          "end": "end", "after": "end", "post": "end", "stop": "end"}
PHASE_RE = re.compile(r"(?:^|[/_.\-])(start|begin|before|pre|end|after|post|stop)(?=$|[/_.\-])", re.I)


def phase_of(path: str) -> str | None:
    m = PHASE_RE.findall(str(path))
    return PHASES[m[-1].lower()] if m else None


def _device_from_path(path: str) -> tuple[str | None, int | None]:
    parts = Path(path).parts
    dev = port = None
    for i, p in enumerate(parts):
        stem = Path(p).stem if i == len(parts) - 1 else p
        if DEVICE_NAME_RE.match(p):
            dev = p
            if i + 1 < len(parts) and parts[i + 1].isdigit():
                port = int(parts[i + 1])
            elif i + 2 < len(parts) and parts[i + 1] == "ports" and parts[i + 2].isdigit():
                port = int(parts[i + 2])
        elif (m := re.search(r"((?:mlx\d+|hfi\d+|bnxt_re|[a-z]+\d*)_\d+)(?:[_.-](?:port)?(\d+))?", stem)) and dev is None \
                and i == len(parts) - 1:
            dev = m[1]
            port = int(m[2]) if m[2] else port
    return dev, port


def _value(text: str) -> tuple[int | None, bool]:
    """(value, ok): decimal or hex counter text; ``N/A …`` is a valid missing value."""
    t = text.strip()
    if t.upper().startswith("N/A"):
        return None, True
    try:
        return (int(t, 16) if t.lower().startswith("0x") else int(t)), True
    except ValueError:
        return None, False


class IbCountersParser(Parser):
    STRUCTURED = True     # a whole file of its own format
    NAME = "ib_counters"
    DESCRIPTION = "InfiniBand/RoCE port counters: perfquery (-x) text, sysfs listings or a sysfs tree copy"
    GLOBS = ("ib/*", "ib/**/*", "*perfquery*", "*ib_counters*")
    SCHEMAS = {
        "ib_counters": {"line": "int", "file": "str", "phase": "str", "device": "str", "port": "int",
                        "counter": "str", "value": "uint", "width_bits": "int", "source": "str"},
    }

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        return bool(re.search(r"(?m)^#\s*Port (?:extended )?counters:|^PortSelect:\.+|^PortXmitData:\.+"
                              r"|/ports/\d+/(?:hw_)?counters(?:_ext)?/\w+:", t))

    @classmethod
    def parse(cls, source) -> ParseResult:
        if not isinstance(source, (bytes, bytearray, memoryview)) and Path(source).is_dir():
            return cls.parse_dir(Path(source))
        data, label = read_source(source)
        return cls.parse_bytes(data, label)

    @classmethod
    def parse_bytes(cls, data: bytes, label: str, rel: str | None = None, log: WarningLog | None = None,
                    collect: tuple | None = None):
        own = log is None
        log = log or WarningLog(label)
        rows, ports = collect if collect is not None else ([], {})
        pathish = rel if rel is not None else label
        if not data.strip():
            log.add(None, "empty file")
        elif looks_binary(data):
            log.add(None, "binary data, not an IB counter listing")
        else:
            _parse_text(decode_text(data), label, pathish, rows, ports, log)
        if not own:
            return None
        return cls._finish(label, rows, ports, log)

    @classmethod
    def parse_dir(cls, root: Path) -> ParseResult:
        label = str(root)
        log = WarningLog(label)
        rows: list = []
        ports: dict = {}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for fn in sorted(filenames):
                path = Path(dirpath) / fn
                rel = path.relative_to(root).as_posix()
                try:
                    data, flabel = read_source(path)
                except InputError as e:
                    log.add(None, str(e))
                    continue
                parent = path.parent.name
                if parent in ("counters", "counters_ext", "hw_counters") or fn in PORT_ATTRS:
                    _one_value_file(data, flabel, rel, parent, fn, rows, ports, log)
                else:
                    cls.parse_bytes(data, flabel, rel=rel, log=log, collect=(rows, ports))
        if not rows and not ports:
            log.add(None, "no IB counters found in this folder")
        return cls._finish(label, rows, ports, log)

    @classmethod
    def _finish(cls, label, rows, ports, log):
        # sysfs data/packet counters are 64-bit when the port has extended counters,
        # which shows as unicast/multicast counters or any data counter past 32 bits.
        def key(r):   # one snapshot of one port: a listing file, or the one-value files of a phase
            return r["phase"], r["device"], r["port"], r["file"] if r["line"] is not None else None
        wide = {key(r) for r in rows
                if r["counter"].startswith(("unicast_", "multicast_"))
                or (r["source"] == "sysfs" and r["counter"] in DATA_COUNTERS
                    and r["value"] is not None and r["value"] >= (1 << 32))}
        for r in rows:
            if r["source"] == "sysfs" and r["counter"] in DATA_COUNTERS and key(r) in wide:
                r["width_bits"] = 64
        facts = {"ports": ports, "phases": sorted({r["phase"] for r in rows if r["phase"]}),
                 "devices": sorted({r["device"] for r in rows if r["device"]})}
        return cls.result(label, {"ib_counters": rows}, facts, log)


def _row(rows, line, file, phase, dev, port, counter, value, source):
    if source in ("perfquery_ext",):
        width = 64
    elif source == "hw_counters":
        width = HW_COUNTER_WIDTH
    else:
        width = LEGACY_WIDTHS.get(counter, 64)
    rows.append({"line": line, "file": file, "phase": phase, "device": dev, "port": port, "counter": counter,
                 "value": value, "width_bits": width, "source": source})


def _port_attr(ports, dev, port, name, value):
    ports.setdefault(f"{dev}/{port}", {})[name] = value.strip()


def _one_value_file(data, label, rel, group, name, rows, ports, log):
    text = decode_text(data).strip()
    parts = Path(rel).parts
    dev, port = None, None
    if "ports" in parts:
        i = parts.index("ports")
        if i >= 1 and i + 1 < len(parts) and parts[i + 1].isdigit():
            dev, port = parts[i - 1], int(parts[i + 1])
    elif group in ("counters", "counters_ext", "hw_counters") and len(parts) >= 4 and parts[-3].isdigit():
        dev, port = parts[-4], int(parts[-3])
    elif group not in ("counters", "counters_ext", "hw_counters") and len(parts) >= 3 and parts[-2].isdigit():
        dev, port = parts[-3], int(parts[-2])
    if dev is None:
        log.add(None, f"{rel}: cannot tell device and port from the path")
        return
    if name in PORT_ATTRS and group not in ("counters", "counters_ext", "hw_counters"):
        _port_attr(ports, dev, port, name, text)
        return
    if name == "lifespan":
        return
    value, ok = _value(text.splitlines()[0] if text else "")
    if not ok:
        log.add(None, f"{rel}: counter value is not a number: {text[:60]!r}")
        return
    counter = re.sub(r"_64$", "", name)
    _row(rows, None, label, phase_of(rel), dev, port, counter, value,
         "hw_counters" if group == "hw_counters" else "sysfs")


def _perfquery_ca(args: str) -> str | None:
    """The HCA of ``perfquery``'s ``-C mlx5_1`` / ``--Ca=mlx5_1`` option, if given."""
    m = re.search(r"(?:-C|--Ca)(?:\s+|=)(?P<ca>\S+)", args)
    return m["ca"] if m else None


def _parse_text(text, label, pathish, rows, ports, log):
    phase = phase_of(pathish)
    path_dev, path_port = _device_from_path(pathish)
    block = None          # (source, device, port) of the current perfquery block
    flat = (path_dev, path_port)
    cmd_dev = None        # the HCA a pasted perfquery command line names (-C)
    for ln, raw in enumerate(split_lines(text), 1):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("#") and (m := PERFQ_CMD_RE.search(line)):
            cmd_dev = _perfquery_ca(m["args"])
            block = None
            continue
        if (m := PERFQ_HEADER_RE.match(line)):
            dev = path_dev or cmd_dev or (f"lid{m['lid']}" if m["lid"] else None)
            block = ["perfquery_ext" if m["ext"] else "perfquery", dev, int(m["port"])]
            key = f"{dev}/{int(m['port'])}"
            if m["lid"]:
                ports.setdefault(key, {})["lid"] = m["lid"]
            if m["cap"]:
                ports.setdefault(key, {})["cap_mask"] = m["cap"]
            continue
        if (m := SYSFS_LINE_RE.match(line)):
            dev, port, grp, name = m["dev"], int(m["port"]), m["grp"], m["name"]
            if grp is None:
                if name in PORT_ATTRS:
                    _port_attr(ports, dev, port, name, m["value"])
                else:
                    log.add(ln, f"unknown sysfs port attribute {name!r}")
                continue
            if name == "lifespan":
                continue
            value, ok = _value(m["value"])
            if not ok:
                log.add(ln, f"counter value is not a number: {line[:120]!r}")
                continue
            _row(rows, ln, label, phase, dev, port, re.sub(r"_64$", "", name), value,
                 "hw_counters" if grp == "hw_counters" else "sysfs")
            continue
        if (m := PERFQ_FIELD_RE.match(line)):
            name = m["name"]
            if name in NOT_COUNTERS:
                if name == "PortSelect" and block is not None:
                    v, ok = _value(m["value"])
                    if ok and v is not None and block[2] is None:
                        block[2] = v
                continue
            if block is None:      # a paste without the "# Port counters" header
                block = ["perfquery", path_dev or cmd_dev or "unknown", path_port]
            value, ok = _value(m["value"])
            if not ok:
                log.add(ln, f"counter value is not a number: {line[:120]!r}")
                continue
            counter = PERFQUERY_NAMES.get(name) or re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
            _row(rows, ln, label, phase, block[1], block[2], counter, value, block[0])
            continue
        if line.startswith("#"):
            if (m := FLAT_HEADER_RE.match(line)):
                flat = (m["dev"], int(m["port"]))
            continue
        if re.fullmatch(r"0x[0-9a-fA-F]+\)?", line):     # the wrapped end of a perfquery header
            continue
        if (m := FLAT_RE.match(line)) and flat[0] is not None:
            name = m["name"]
            if name in PORT_ATTRS:
                _port_attr(ports, flat[0], flat[1], name, m["value"])
                continue
            value, ok = _value(m["value"])
            if not ok:
                log.add(ln, f"counter value is not a number: {line[:120]!r}")
                continue
            src = "hw_counters" if name in COUNTER_INFO and name not in LEGACY_WIDTHS \
                and not name.startswith(("unicast_", "multicast_")) else "sysfs"
            _row(rows, ln, label, phase, flat[0], flat[1], re.sub(r"_64$", "", name), value, src)
            continue
        log.add(ln, f"not an IB counter line: {line[:120]!r}")


def ib_deltas(start: pd.DataFrame, end: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-counter change between the start and the end snapshot.

    ``ib_deltas(df)`` splits one ``ib_counters`` table by ``phase``; ``ib_deltas(a, b)``
    compares two tables. Columns: device, port, counter, start, end, delta (uint; NA
    when a side is missing), width_bits, wrapped (end < start read as one wrap of a
    counter that was past half its range), reset (end < start otherwise: the counter
    was cleared, e.g. ``perfquery -r``; delta is then the end value, a lower bound),
    saturated (a legacy counter sits at its maximum: the true delta may be larger),
    bytes (data counters x 4), kind (error|congestion|retransmission|traffic|info|
    unknown), meaning, action, problem (kind is error/congestion/retransmission and
    delta > 0).
    """
    if end is None:
        df = start
        start, end = df[df["phase"] == "start"], df[df["phase"] == "end"]
    keys = ["device", "port", "counter"]
    a = start[keys + ["value", "width_bits"]].drop_duplicates(keys, keep="last")
    b = end[keys + ["value", "width_bits"]].drop_duplicates(keys, keep="last")
    m = a.merge(b, on=keys, how="outer", suffixes=("_start", "_end")).sort_values(keys, kind="stable")
    out = []
    for r in m.itertuples(index=False):
        s = None if pd.isna(r.value_start) else int(r.value_start)
        e = None if pd.isna(r.value_end) else int(r.value_end)
        width = r.width_bits_end if not pd.isna(r.width_bits_end) else r.width_bits_start
        width = None if pd.isna(width) else int(width)
        delta, wrapped, reset, saturated = None, False, False, False
        if s is not None and e is not None:
            if e >= s:
                delta = e - s
            elif width and width < 64 and s > (1 << (width - 1)):
                delta, wrapped = e + (1 << width) - s, True
            else:
                delta, reset = e, True
            saturated = bool(width and width < 64 and e == (1 << width) - 1)
        kind, meaning, action = COUNTER_INFO.get(r.counter, ("unknown", "", ""))
        out.append({"device": r.device, "port": r.port, "counter": r.counter, "start": s, "end": e,
                    "delta": delta, "width_bits": width, "wrapped": wrapped, "reset": reset,
                    "saturated": saturated,
                    "bytes": delta * 4 if delta is not None and r.counter in ("port_xmit_data", "port_rcv_data")
                    else None,
                    "kind": kind, "meaning": meaning, "action": action,
                    "problem": bool(kind in ("error", "congestion", "retransmission") and delta)})
    return frame(out, DELTA_SCHEMA)


def snapshot_values(df: pd.DataFrame) -> pd.DataFrame:
    """One snapshot (no start/end phase: a pasted ``perfquery``) read as what the counters
    gathered since they were last cleared: :func:`ib_deltas`' columns with ``start`` NA and
    ``delta`` the value itself (a problem counter above 0 is a problem)."""
    d = ib_deltas(df.iloc[0:0], df.assign(phase="end"))
    d["delta"] = d["end"]
    d["bytes"] = [v * 4 if c in ("port_xmit_data", "port_rcv_data") and not pd.isna(v) else None
                  for c, v in zip(d["counter"], d["end"])]
    d["problem"] = d["kind"].isin(["error", "congestion", "retransmission"]) & (d["end"].fillna(0) > 0)
    return d


DELTA_SCHEMA = {"device": "str", "port": "int", "counter": "str", "start": "uint", "end": "uint", "delta": "uint",
                "width_bits": "int", "wrapped": "bool", "reset": "bool", "saturated": "bool", "bytes": "uint",
                "kind": "str", "meaning": "str", "action": "str", "problem": "bool"}


register(IbCountersParser)
