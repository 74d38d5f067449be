"""Kernel log lines that explain a dead rank: NVIDIA Xid, NIC link loss, the OOM killer.

``dmesg`` (``[12345.678901] ...``, ``dmesg -T``'s ``[Mon Oct 14 10:11:12 2024] ...``) or the
journal (``Oct 14 10:11:12 node7 kernel: ...``, ISO ``2024-10-14T10:11:12.123+0000 node7
kernel: ...``). Lines read:

- ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.``: a GPU
  fault; the Xid number, the PCI address of the GPU, the pid where the driver names one;
- ``mlx5_core 0000:5e:00.0: mlx5_port_module_event:...: Port module event: module 0, Cable
  unplugged`` and ``mlx5_core 0000:5e:00.0 ib0: Link down``: a NIC port or its module lost;
- ``Out of memory: Killed process 4242 (python) ...``, ``Memory cgroup out of memory: Killed
  process ...``, ``oom-kill:...,task=python,pid=4242,...``: the OOM killer.

Table ``kernel_events``: line (int), host (str: the journal's host field, NA in dmesg), time
(str as printed), kind (xid|nic_link|oom_kill), xid (int), pci (str), pid (int), process (str),
message (str: from the event's own text on).
"""
from __future__ import annotations

import re

from .registry import WarningLog, register
from .text import LogText, TextParser

XID_RE = re.compile(r"NVRM: Xid \((?P<pci>PCI:[0-9a-fA-F:.]+)\): (?P<xid>\d+)(?:, pid=(?P<pid>\d+|'<unknown>'))?"
                    r"(?:, name=(?P<name>[^,]*))?")
NIC_RE = re.compile(r"(?P<drv>mlx5_core|mlx4_core|bnxt_en|ice|efa)\s+(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
                    r"\.\d)(?: (?P<ifname>[\w.-]+))?:? .*?(?P<what>Link down|[Cc]able unplugged|module \d+, "
                    r"(?:Cable unplugged|Power budget exceeded|Long Range for non MLNX cable|Bus stuck|"
                    r"Bad or shorted cable|High Temperature|Cable error)|PCI (?:error|channel failure)|"
                    r"health compromised|Fatal error|device's health|firmware (?:error|fatal))")
OOM_RE = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)"
                    r"|oom-kill:.*?task=(?P<name2>[^,]+),pid=(?P<pid2>\d+)")
# the time and host a line starts with (dmesg, dmesg -T, journal, ISO journal)
STAMP_RE = re.compile(r"^\s*(?:\[\s*(?P<mono>\d+\.\d+)\]|\[(?P<human>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d "
                      r"[\d:]{8} \d{4})\]|(?P<syslog>[A-Z][a-z]{2} [ \d]\d [\d:]{8}) (?P<host>[\w.-]+) kernel:"
                      r"|(?P<iso>\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d{2}:?\d{2}|Z)?) (?P<host2>[\w.-]+) kernel:)")
NEEDLES = (b"NVRM: Xid", b"Link down", b"able unplugged", b"Killed process", b"oom-kill:", b"health compromised",
           b"mlx5_port_module_event", b"Fatal error", b"PCI error")
IMPORTANT_XIDS = {13: "graphics engine exception (an application fault, often an illegal memory access)",
                  31: "GPU memory page fault (an application fault, or a driver bug)",
                  43: "GPU stopped processing (a hung or faulted kernel)",
                  48: "double-bit ECC error (uncorrectable memory error)",
                  61: "internal micro-controller breakpoint/warning (the GPU may be hung)",
                  62: "internal micro-controller halt (the GPU is hung)",
                  63: "ECC page retirement or row remap recorded",
                  64: "ECC page retirement or row remap failed",
                  74: "NVLink error",
                  79: "the GPU has fallen off the bus",
                  92: "high single-bit ECC error rate",
                  94: "contained ECC error (the application was killed)",
                  95: "uncontained ECC error (the GPU must be reset)",
                  119: "GSP RPC timeout (the GPU's firmware stopped answering)",
                  120: "GSP error (the GPU's firmware failed)"}
# the Xids of a hardware fault (drain the GPU) against those an application causes
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})


def xid_meaning(xid) -> str | None:
    try:
        return IMPORTANT_XIDS.get(int(xid))
    except (TypeError, ValueError):
        return None


class KernelLogParser(TextParser):
    NEEDLES = NEEDLES
    NAME = "kernel_log"
    DESCRIPTION = "dmesg / journal lines: NVIDIA Xid, NIC link loss, the OOM killer"
    GLOBS = ("logs/dmesg*", "logs/**/dmesg*", "logs/*", "logs/**/*", "dmesg*", "*kern*.log", "journal*")
    MARKERS = (b"NVRM: Xid", b"Killed process", b"oom-kill:", b"mlx5_core", b"mlx5_port_module_event")
    SCHEMAS = {"kernel_events": {"line": "int", "host": "str", "time": "str", "kind": "str", "xid": "int",
                                 "pci": "str", "pid": "int", "process": "str", "message": "str"}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return b"NVRM: Xid" in head or b"Killed process" in head

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        log = WarningLog(label)
        if cls.unreadable(text, log, "a kernel log"):
            return cls.result(label, {}, {}, log)
        rows = []
        for ln, line, _ in text.iter(text.lines_with(NEEDLES)):
            row = event_row(ln, line)
            if row is not None:
                rows.append(row)
        if not rows:
            log.add(None, "no Xid, NIC link or OOM kill line found")
        return cls.result(label, {"kernel_events": rows}, {}, log)


def event_row(ln: int, line: str) -> dict | None:
    """The ``kernel_events`` row of one line, or None when it is none of the events read."""
    if (m := XID_RE.search(line)):
        pid = m["pid"]
        row = {"kind": "xid", "xid": int(m["xid"]), "pci": m["pci"].removeprefix("PCI:"),
               "pid": int(pid) if pid and pid.isdigit() else None, "process": m["name"]}
    elif (m := OOM_RE.search(line)):
        row = {"kind": "oom_kill", "pid": int(m["pid"] or m["pid2"]), "process": m["name"] or m["name2"]}
    elif (m := NIC_RE.search(line)):
        row = {"kind": "nic_link", "pci": m["pci"], "process": m["ifname"]}
    else:
        return None
    s = STAMP_RE.search(line)
    if s is not None:
        row["time"] = s["human"] or s["syslog"] or s["iso"] or s["mono"]
        row["host"] = s["host"] or s["host2"]
    row["line"] = ln
    row["message"] = line[m.start():].strip()[:300]
    return row


register(KernelLogParser)
