"""The command specs of the collectors, as a table: one row per thing a capture runs or reads.

A row names it, what runs (an argv template or a function of this
module), where its output goes in the bundle, when it runs (``start``/``end``
snapshots or ``continuous``), its scope (once for the host, once per network
namespace of the job, once per interface NCCL uses, once per job process), and
what it needs (root, a tool on PATH). The snapshot collector
(``capture.collectors.snapshots``) runs every ``start``/``end`` row; a ``continuous`` row is the
spec of its own collector class (``capture.collectors``: the tracer, tcpdump, the ss series ...),
which reads its command, output path, tool and limits from here. A new snapshot is one row here.

Templates may use {pid} (a process of the scope, or "self"), {iface}, {phase}
and {ns} (the namespace's label: "host" or "netns-<inode>"). A command of a
namespace other than capture's own runs under ``nsenter --net=/proc/{pid}/ns/net``.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..children import run
from ..ncclras import collect
from ..threads import thread_states


@dataclass(frozen=True)
class Spec:
    name: str
    argv: tuple[str, ...] | None = None     # command template (None: ``func``)
    func: str | None = None                 # name of a function below: (ctx) -> bytes | dict[str, bytes]
    out: str = ""                           # bundle path template
    when: tuple[str, ...] = ("start", "end")
    scope: str = "host"                     # host | netns | iface | process
    needs_root: bool = False
    tool: str | None = None
    ok_rc: tuple[int, ...] = (0,)
    per_file_max: int = 8 << 20             # snapshot outputs are cut to this (their tail)
    python_only: bool = False               # process scope: only Python processes
    optional: str = ""                      # why it may legitimately not apply (turns failure into skip)
    timeout_s: float = 60.0                 # a snapshot command still running then is killed
    doc: str = ""


SPECS: tuple[Spec, ...] = (
    # ---- continuous
    Spec("tracer", func="tracer", out="bpf/events.jsonl", when=("continuous",), needs_root=True,
         tool="bpftrace", doc="bpftrace: NCCL API, CUDA host waits, TCP tracepoints, off-CPU time"),
    # --immediate-mode: each packet is handed over and written (-U) as it arrives. Without it
    # libpcap's TPACKET_V3 ring holds packets in a block until the block fills or its 1 s
    # timer fires, and a stop (SIGINT) or a kill loses that block: the last packets before
    # the end, the ones a hang investigation needs most. -B: an 8 MiB kernel ring absorbs
    # bursts while tcpdump waits for the CPU. The watcher (capture.watch), which runs for days,
    # leaves both out (capture.policy.TCPDUMP_PER_PACKET): a wake-up and a write per packet take about five
    # times the CPU of a buffered tcpdump (capture/README.md); it flushes tcpdump
    # (capture.collectors.tcpdump) before it cuts a bundle.
    Spec("tcpdump", argv=("tcpdump", "-i", "{iface}", "-s", "{snaplen}", "--time-stamp-precision", "nano",
                          "--immediate-mode", "-B", "8192", "-n", "-U", "-Z", "root"),
         out="pcap/{ns}-{iface}.pcap", when=("continuous",), scope="iface", needs_root=True,
         tool="tcpdump", doc="headers of the packets on the interfaces NCCL uses (ring files)"),
    Spec("nccl-tests", func="nccl_tests", out="nccl-tests/output.txt", when=("continuous",),
         doc="--nccl-tests CMD, its output kept"),
    # ---- snapshots per network namespace
    Spec("ss", argv=("ss", "-tinpeH"), out="sys/{ns}/ss-tinp-{phase}.txt", scope="netns", tool="ss",
         doc="TCP sockets with owners and counters (retransmits)"),
    # sampled every --ss-every seconds (capture.collectors.ss_series), in the snapshot pool,
    # one sample at a time; each block headed "# stallscope-sample realtime_ns=.. monotonic_ns=..".
    # Read on a netlink socket per namespace in ss's format (capture.sockdiag), ss itself only
    # where that socket cannot be opened
    Spec("ss-series", argv=("ss", "-tinpeH"), out="sys/{ns}/ss-series.txt", when=("continuous",),
         scope="netns", tool="ss", timeout_s=5.0, per_file_max=16 << 20,
         doc="ss -tinpe of every namespace of the job every --ss-every s: bytes moving per connection"),
    Spec("ip-link", argv=("ip", "-s", "-s", "-j", "link"), out="sys/{ns}/ip-link-{phase}.json", scope="netns",
         tool="ip", doc="interfaces, state and counters; -s -s adds carrier_changes (a link that went down and "
                        "up) and the error details"),
    Spec("ip-addr", argv=("ip", "-j", "addr"), out="sys/{ns}/ip-addr-{phase}.json", scope="netns", tool="ip"),
    Spec("snmp", func="proc_net_snmp", out="sys/{ns}/snmp-{phase}.txt", scope="netns",
         doc="/proc/net/snmp of the namespace"),
    Spec("netstat", func="proc_net_netstat", out="sys/{ns}/netstat-{phase}.txt", scope="netns",
         doc="/proc/net/netstat (TcpExt) of the namespace"),
    Spec("sysctl-net", argv=("sysctl", "net"), out="sys/{ns}/sysctl-net-{phase}.txt", scope="netns",
         tool="sysctl", when=("start",), ok_rc=(0, 255), per_file_max=2 << 20),
    Spec("ethtool", argv=("ethtool", "-S", "{iface}"), out="sys/{ns}/ethtool-S-{iface}-{phase}.txt",
         scope="iface", tool="ethtool", optional="driver without statistics (veth, lo, virtual NICs)"),
    # ---- host snapshots
    Spec("lsmod", argv=("lsmod",), out="sys/lsmod.txt", when=("start",), tool="lsmod",
         doc="kernel modules (nvidia_peermem, ib_*)"),
    Spec("nvidia-smi", argv=("nvidia-smi", "-q"), out="sys/nvidia-smi-{phase}.txt", tool="nvidia-smi"),
    Spec("dmesg", func="dmesg", out="logs/dmesg-{phase}.txt", when=("end",), needs_root=True, tool="dmesg",
         doc="kernel log tail and NVIDIA XID lines"),
    Spec("ib-counters", func="ib_counters", out="ib/{phase}", doc="perfquery or sysfs InfiniBand counters",
         optional="no InfiniBand/RoCE devices"),
    # the ports' state and rate as the operator reads them (a port Down or Polling, a link at a
    # lower rate): beside the counters, outside ib/ (that folder is the counters' tree)
    Spec("ibstat", argv=("ibstat",), out="sys/ibstat-{phase}.txt", tool="ibstat", timeout_s=20.0,
         optional="no InfiniBand/RoCE devices", doc="ibstat: each IB/RoCE port's state, physical state, rate"),
    # NCCL >= 2.24: skipped (with the reason) when the job's libnccl has no RAS or nothing
    # answers on NCCL_RAS_ADDR (default localhost:28028) in the job's network namespace
    Spec("ncclras", func="ncclras", out="sys/host/ncclras-{phase}.txt", tool="ncclras", timeout_s=30.0,
         doc="ncclras -v: NCCL RAS job summary, communicators, missing/dead ranks, mismatched op counts"),
    # ---- per process
    # --nonblocking: py-spy reads the stacks without stopping the job (no ptrace stop);
    # bounded: a py-spy stuck on a wedged process must not hold the capture up
    Spec("py-spy", argv=("py-spy", "dump", "--nonblocking", "--pid", "{pid}"),
         out="stacks/py-spy-{pid}-{phase}.txt", scope="process", when=("start", "end"), needs_root=True,
         tool="py-spy", python_only=True, timeout_s=10.0,
         doc="Python stacks of the job's processes, read without pausing them"),
    # /proc/PID/task/*: each thread's state and the syscall it sits in, the fds it waits on
    # resolved to sockets (poll arrays read from /proc/PID/mem): free, no ptrace stop
    Spec("threads", func="proc_threads", out="proc/{pid}-threads-{phase}.json", scope="process",
         when=("start", "end"), timeout_s=10.0,
         doc="per-thread state, wchan, syscall and the sockets it waits on (who waits on whom)"),
    Spec("attachments", func="attachments", out="logs", when=("end",),
         doc="--attach files and logs named by the processes' environment"),
    # ptrace stops every thread while its stack is read: only when the job is hung (--stacks
    # auto decides after a grace period, capture.stacks), once, each run bounded (then killed)
    Spec("native-stacks", func="native_stacks", out="stacks/native-{pid}-{phase}.txt", when=("continuous",),
         scope="process", needs_root=True, timeout_s=10.0,
         doc="eu-stack / gdb / py-spy --native stacks of every thread, when no collective completes"),
    # its own collector (capture.collectors.flight_recorder_trigger), before the attachments take the dumps
    Spec("flight-recorder-trigger", func="flight_recorder_trigger", out="flight-recorder", when=("end",),
         scope="process",
         doc="one byte into TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe: torch dumps its Flight Recorder"),
)



def by_name() -> dict[str, Spec]:
    return {c.name: c for c in SPECS}


# ---------------------------------------------------------------- function collectors
def ncclras(ctx) -> bytes:
    return collect(ctx)


def native_stacks(ctx) -> bytes:
    """Not run by the snapshot loop: its own collector (capture.collectors.native_stacks) is."""
    raise LookupError("native stacks are taken by their own collector (--stacks)")


def flight_recorder_trigger(ctx) -> bytes:
    """Not run by the snapshot loop: its own collector (capture.collectors.flight_recorder_trigger) is."""
    raise LookupError("Flight Recorder triggers are sent by their own collector")


def proc_threads(ctx) -> bytes:
    return (json.dumps(thread_states(int(ctx["pid"]), ctx["phase"]), separators=(",", ":")) + "\n").encode()


def proc_net_snmp(ctx) -> bytes:
    return Path(f"/proc/{ctx['pid']}/net/snmp").read_bytes()


def proc_net_netstat(ctx) -> bytes:
    return Path(f"/proc/{ctx['pid']}/net/netstat").read_bytes()


XID_RE = re.compile(rb"NVRM: Xid|NVRM: GPU at|nvidia-peermem|mlx5_core.*(error|fail)", re.I)


def dmesg(ctx) -> dict[str, bytes]:
    rc, out, err = run(["dmesg", "--time-format", "iso"], timeout=20)
    if rc != 0:
        rc, out, err = run(["dmesg"], timeout=20)
    if rc != 0:
        raise RuntimeError(f"dmesg exited {rc}: {err.decode(errors='replace').strip()[-300:]}")
    lines = out.splitlines()
    xid = [l for l in lines if XID_RE.search(l)]
    return {"": b"\n".join(lines[-500:]) + b"\n", "-xid": b"\n".join(xid) + (b"\n" if xid else b"")}


def ib_counters(ctx) -> dict[str, bytes]:
    """perfquery (plain and extended) when present, else sysfs counters and hw_counters."""
    devices = sorted(glob.glob("/sys/class/infiniband/*/ports/*"))
    if not devices:
        raise LookupError("no InfiniBand/RoCE devices (/sys/class/infiniband is empty)")
    out: dict[str, bytes] = {}
    if shutil.which("perfquery"):
        for port_dir in devices:
            dev, port = port_dir.split("/")[4], port_dir.split("/")[-1]
            for flag, tag in (([], "perfquery"), (["-x"], "perfquery-x")):
                rc, so, se = run(["perfquery", *flag, "-C", dev, "-P", port], timeout=15)
                out[f"/{tag}-{dev}-{port}.txt"] = so + (b"" if rc == 0 else b"\n# rc=%d %s\n" % (rc or -1, se[-300:]))
    for port_dir in devices:
        dev, port = port_dir.split("/")[4], port_dir.split("/")[-1]
        lines = []
        for sub in ("counters", "hw_counters"):
            for f in sorted(glob.glob(f"{port_dir}/{sub}/*")):
                try:
                    val = Path(f).read_text().strip()
                except OSError as e:
                    val = f"ERROR {e.strerror}"
                lines.append(f"{sub}/{os.path.basename(f)} {val}")
        for f in ("state", "phys_state", "rate", "link_layer"):
            try:
                lines.append(f"{f} {Path(port_dir, f).read_text().strip()}")
            except OSError:
                pass
        out[f"/sysfs-{dev}-{port}.txt"] = ("\n".join(lines) + "\n").encode()
    return out
