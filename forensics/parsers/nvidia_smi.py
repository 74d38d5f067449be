"""A GPU lost, as ``nvidia-smi`` and the NVIDIA driver say it outside an Xid line.

- ``nvidia-smi``: ``Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error``
  (or ``: GPU is lost.  Reboot the system to recover this GPU``), ``NVIDIA-SMI has failed
  because it couldn't communicate with the NVIDIA driver``, ``Failed to initialize NVML:
  Driver/library version mismatch``, ``No devices were found``, and a row of its table that
  shows ``ERR!``;
- the driver's own kernel messages that carry no Xid, one message often printed over several
  ``NVRM:`` lines: ``NVRM: The NVIDIA GPU 0000:b3:00.0`` / ``NVRM: (PCI ID: 10de:26b5)
  installed in this system has`` / ``NVRM: fallen off the bus and is not responding to
  commands.``, ``NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x65:1486)``, and a GSP
  call refused until the GPU is reset (``NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset
  required [NV_ERR_RESET_REQUIRED] ...``).

``NVRM: Xid`` lines are not read here (the kernel log's parser reads them), even one that says
the GPU fell off the bus.

Host: a launcher's, pdsh's or syslog's tag in front of the line (:mod:`.lines`), else the
shell prompt the command was typed at (``[root@bh174 ~]# nvidia-smi``, ``user@node7:~$
nvidia-smi``) for the lines after it; NA without either (the model gives the file's host).

Table ``gpu_events`` (one row per message): line (int: the message's last line), host (str or
NA), bus_id (str: the GPU's PCI id, lower case with a 4-digit domain, ``0000:9d:00.0``, as
nvidia-smi's ``00000000:9D:00.0`` and the kernel's ``0000:9d:00.0`` both name it; NA when the
message names none), kind
(device_handle|fallen_off_bus|init_failed|reset_required|driver_unreachable|nvml_init|no_devices|
err_field),
tool (nvidia-smi|kernel), message (str: the message, its lines joined).
"""
from __future__ import annotations

import re

from . import lines as lines_mod
from .registry import WarningLog, register
from .text import LogText, TextParser

BUS = r"(?P<bus>(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?)"
# (kind, tool, pattern): the pattern's match starts the message (its prefix is the line's tags)
MESSAGES = (
    ("device_handle", "nvidia-smi", re.compile(r"Unable to determine the device handle for GPU\s*" + BUS + r"?:?\s*.*")),
    ("fallen_off_bus", "kernel", re.compile(r"(?:NVRM: )?(?:The NVIDIA GPU |GPU )?" + BUS + r"?.*?fallen off the bus.*")),
    ("init_failed", "kernel", re.compile(r"NVRM: (?:GPU )?" + BUS + r"?:?\s*RmInitAdapter failed!.*")),
    # the driver (its GSP firmware) refusing work until the GPU is reset: no Xid, no PCI id
    ("reset_required", "kernel", re.compile(r"NVRM: (?:GPU )?" + BUS + r"?:?\s*.*\bNV_ERR_RESET_REQUIRED\b.*")),
    ("driver_unreachable", "nvidia-smi", re.compile(r"NVIDIA-SMI has failed because it couldn't communicate with the "
                                                    r"NVIDIA driver.*")),
    ("nvml_init", "nvidia-smi", re.compile(r"Failed to initialize NVML: .*")),
    ("no_devices", "nvidia-smi", re.compile(r"No devices were found\s*$")),
    ("err_field", "nvidia-smi", re.compile(r"\|.*\bERR!.*\|")),
)
# the first line of the driver's GPU message split over lines ("NVRM: The NVIDIA GPU 0000:b3:00.0")
GPU_NAMED_RE = re.compile(r"NVRM: The NVIDIA GPU " + BUS)
# a shell prompt: bash ``[u@h d]# ``, ``u@h:d$ ``, zsh ``u@h d % ``, tcsh/SUSE ``u@h:d> ``
PROMPT_RE = re.compile(r"^\s*\[?[\w.-]+@(?P<host>[A-Za-z0-9][\w.-]*)[\s:\]].*?[#$%>]\s*\S*nvidia-smi\b")
NEEDLES = (b"Unable to determine the device handle", b"fallen off the bus", b"RmInitAdapter failed", b"NV_ERR_RESET_REQUIRED",
           b"NVIDIA-SMI has failed", b"Failed to initialize NVML", b"No devices were found", b"ERR!",
           b"NVRM: The NVIDIA GPU ", b"nvidia-smi")
SPLIT_LINES = 3          # how far back the GPU's id may stand of a message split over NVRM: lines


class NvidiaSmiParser(TextParser):
    NAME = "nvidia_smi"
    DESCRIPTION = "GPU failures nvidia-smi and the NVIDIA driver print without an Xid (device handle, fell off the bus)"
    GLOBS = ("nvidia-smi*", "*/nvidia-smi*")
    # not "fallen off the bus" alone: Xid 79 says it too, and Xid lines are the kernel log's
    MARKERS = (b"Unable to determine the device handle for GPU", b"NVRM: The NVIDIA GPU ", b"RmInitAdapter failed",
               b"NVIDIA-SMI has failed", b"Failed to initialize NVML", b"NV_ERR_RESET_REQUIRED")
    NEEDLES = NEEDLES
    SCHEMAS = {"gpu_events": {"line": "int", "host": "str", "bus_id": "str", "kind": "str", "tool": "str",
                              "message": "str"}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return any(m in head for m in cls.MARKERS)

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        log = WarningLog(label)
        if cls.unreadable(text, log, "nvidia-smi output"):
            return cls.result(label, {}, {}, log)
        hits = text.lines_with(NEEDLES)
        rows = []
        prompt_host = None
        named: tuple[int, str, str] | None = None     # (line, bus id, text) of "NVRM: The NVIDIA GPU <id>"
        for ln, raw, _ in text.iter(hits):
            raw = lines_mod.ANSI_RE.sub("", raw).rstrip()
            if (m := PROMPT_RE.match(raw)):
                prompt_host = m["host"]
                continue
            if "Xid" in raw:
                continue
            if (m := GPU_NAMED_RE.search(raw)) and "fallen off the bus" not in raw:
                named = (int(ln), _bus(m["bus"]), raw[m.start():].strip())
                continue
            row = _message(raw, int(ln), named)
            if row is None:
                continue
            row["host"] = row["host"] or prompt_host
            rows.append(row)
        return cls.result(label, {"gpu_events": rows}, {}, log)


def _bus(text: str | None) -> str | None:
    """A PCI id as one spelling: lower case, a 4-digit domain (``00000000:9D:00.0`` -> ``0000:9d:00.0``)."""
    if not text:
        return None
    parts = text.lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    else:
        parts.insert(0, "0000")
    return ":".join(parts)


def _message(raw: str, ln: int, named: tuple[int, str, str] | None) -> dict | None:
    for kind, tool, rx in MESSAGES:
        m = rx.search(raw)
        if m is None:
            continue
        bus, message = _bus(m["bus"]) if "bus" in rx.groupindex else None, m.group(0).strip()
        if kind == "fallen_off_bus" and bus is None and named is not None and ln - named[0] <= SPLIT_LINES:
            bus = named[1]
            message = named[2] + " ... " + re.sub(r"^NVRM:\s*", "", message)
        return {"line": ln, "host": lines_mod.context(raw[:m.start()]).host, "bus_id": bus, "kind": kind,
                "tool": tool, "message": message}
    return None


register(NvidiaSmiParser)
