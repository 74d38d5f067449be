"""Kernel log lines (forensics/parsers/kernel_log.py): Xid, NIC link loss, OOM kills."""
from __future__ import annotations

import pandas as pd

from forensics.parsers.kernel_log import KernelLogParser, xid_meaning

LINES = (
    b"[Mon Oct 14 10:11:12 2024] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    b"[12345.678901] NVRM: Xid (PCI:0000:5e:00): 31, pid='<unknown>', name=<unknown>, Ch 00000008, intr 00000000.\n"
    b"Oct 14 10:11:13 node7 kernel: mlx5_core 0000:5e:00.0: mlx5_port_module_event:1134:(pid 0): Port module "
    b"event: module 0, Cable unplugged\n"
    b"Oct 14 10:11:13 node7 kernel: mlx5_core 0000:5e:00.0 ib0: Link down\n"
    b"2024-10-14T10:11:14.123+0000 node8 kernel: Out of memory: Killed process 4242 (python) total-vm:1kB\n"
    b"[12346.000000] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=python3,pid=777,uid=0\n"
    b"[12347.000000] some other kernel line\n"
)


def test_kernel_events():
    res = KernelLogParser.parse_bytes(LINES, "dmesg.txt")
    rows = [{k: (None if not isinstance(v, str) and pd.isna(v) else v) for k, v in r.items()}
            for r in res.tables["kernel_events"].to_dict("records")]
    assert [r["kind"] for r in rows] == ["xid", "xid", "nic_link", "nic_link", "oom_kill", "oom_kill"]
    x = rows[0]
    assert (x["xid"], x["pci"], x["pid"], x["time"], x["line"]) == (79, "0000:3b:00", 1234, "Mon Oct 14 10:11:12 2024", 1)
    assert rows[1]["pid"] is None and rows[1]["time"] == "12345.678901"
    assert rows[2]["host"] == "node7" and rows[2]["pci"] == "0000:5e:00.0"
    assert rows[4]["pid"] == 4242 and rows[4]["process"] == "python" and rows[4]["host"] == "node8"
    assert rows[5]["pid"] == 777 and rows[5]["process"] == "python3"
    assert xid_meaning(79) and xid_meaning(999) is None


def test_nothing_read_is_a_warning_not_an_error():
    res = KernelLogParser.parse_bytes(b"[1.0] usb 1-1: new device\n", "dmesg.txt")
    t = res.tables.get("kernel_events")
    assert (t is None or len(t) == 0) and res.warnings
