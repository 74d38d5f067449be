"""The bpftrace tracer: render ``bpf/nccl.bt`` for this host, spool its output, build events.jsonl.

Rendering is data-driven: the ABI position of every argument the tracer reads
is a row of the tables below, the template (``bpf/nccl.bt``) holds the probe
code once, and a block is kept only when what it needs exists here (an exported
symbol in a traced library, a tracepoint field of this kernel, kernel BTF, the
--no-call-returns option).

The output side is split in two so that nothing competes with the job for the
CPU while it runs. During the capture, :class:`Spool` copies bpftrace's stdout
(short positional lines for the hot path, JSON for rare events) into raw
segment files, reading the pipe in big chunks a few times a second and parsing
nothing; when the raw data outgrow the tracer's byte share the oldest segment
goes, its rare lines kept. At the end, :func:`postprocess` turns the raw lines
into ``bpf/events.jsonl``: entry and return merged per thread and kind, the
communicator's rank, nranks and id joined from its init by the comm pointer,
TCP states named, the off-CPU samples merged in, the oldest hot-path events
dropped if the result would exceed the byte share.
"""
from __future__ import annotations

import array
import errno
import fcntl
import heapq
import itertools
import ipaddress
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BPF_DIR = Path(__file__).resolve().parent.parent / "bpf"
TEMPLATE = BPF_DIR / "nccl.bt"
TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")

# x86-64 System V: 7th and later integer arguments are on the stack above the return address.
STACK7 = '*(uint64 *)((uint64)reg("sp") + 8)'
STACK8 = '*(uint64 *)((uint64)reg("sp") + 16)'

# One row per collective entry point: where each field of the "coll" event comes from.
COLLECTIVES = [
    # ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)
    dict(FN="ncclAllReduce", OP="ALL_REDUCE", COUNT="arg2", DTYPE="arg3", REDOP="arg4", ROOT="-1",
         COMM="arg5", STREAM=STACK7),
    # ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream)
    dict(FN="ncclAllGather", OP="ALL_GATHER", COUNT="arg2", DTYPE="arg3", REDOP="-1", ROOT="-1",
         COMM="arg4", STREAM="arg5"),
    # ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)
    dict(FN="ncclReduceScatter", OP="REDUCE_SCATTER", COUNT="arg2", DTYPE="arg3", REDOP="arg4", ROOT="-1",
         COMM="arg5", STREAM=STACK7),
    # ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream)
    dict(FN="ncclBroadcast", OP="BROADCAST", COUNT="arg2", DTYPE="arg3", REDOP="-1", ROOT="arg4",
         COMM="arg5", STREAM=STACK7),
    # ncclBcast(buff, count, datatype, root, comm, stream)
    dict(FN="ncclBcast", OP="BROADCAST", COUNT="arg1", DTYPE="arg2", REDOP="-1", ROOT="arg3",
         COMM="arg4", STREAM="arg5"),
    # ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream)
    dict(FN="ncclReduce", OP="REDUCE", COUNT="arg2", DTYPE="arg3", REDOP="arg4", ROOT="arg5",
         COMM=STACK7, STREAM=STACK8),
    # ncclSend(sendbuff, count, datatype, peer, comm, stream)
    dict(FN="ncclSend", OP="SEND", COUNT="arg1", DTYPE="arg2", REDOP="-1", ROOT="arg3",
         COMM="arg4", STREAM="arg5"),
    # ncclRecv(recvbuff, count, datatype, peer, comm, stream)
    dict(FN="ncclRecv", OP="RECV", COUNT="arg1", DTYPE="arg2", REDOP="-1", ROOT="arg3",
         COMM="arg4", STREAM="arg5"),
]
INIT_RANK = [dict(FN="ncclCommInitRank"), dict(FN="ncclCommInitRankConfig")]
DESTROY = [dict(FN="ncclCommDestroy"), dict(FN="ncclCommAbort")]
GROUP = [dict(FN="ncclGroupStart"), dict(FN="ncclGroupEnd")]
HOST_WAITS = [
    dict(LIB="CUDART", FN="cudaStreamSynchronize", OBJ="stream", OBJARG="arg0"),
    dict(LIB="CUDART", FN="cudaEventSynchronize", OBJ="event", OBJARG="arg0"),
    dict(LIB="CUDART", FN="cudaDeviceSynchronize", OBJ="device", OBJARG="0"),
    dict(LIB="CUDA", FN="cuStreamSynchronize", OBJ="stream", OBJARG="arg0"),
    dict(LIB="CUDA", FN="cuEventSynchronize", OBJ="event", OBJARG="arg0"),
    dict(LIB="CUDA", FN="cuCtxSynchronize", OBJ="device", OBJARG="0"),
]
# record kinds (bpf/nccl.bt): collective 0-7, group call 16+i, host wait 32+i
for _base, _table in ((0, COLLECTIVES), (16, GROUP), (32, HOST_WAITS)):
    for _i, _row in enumerate(_table):
        _row["IDX"] = _i
        _row["KIND"] = _base + _i
# NCCL's ncclBcast calls ncclBroadcast: it keeps a nesting guard (and its uretprobe) even
# when collective returns are not traced, so that one call is one event.
for _row in COLLECTIVES:
    _row["NEST"] = _row["FN"] == "ncclBcast"
TABLES = {"COLLECTIVES": COLLECTIVES, "INIT_RANK": INIT_RANK, "DESTROY": DESTROY, "GROUP": GROUP,
          "HOST_WAITS": HOST_WAITS}

NCCL_SYMBOLS = sorted({r["FN"] for t in (COLLECTIVES, INIT_RANK, DESTROY, GROUP) for r in t}
                      | {"ncclCommInitAll", "ncclCommSplit", "ncclGetUniqueId"})
CUDART_SYMBOLS = [r["FN"] for r in HOST_WAITS if r["LIB"] == "CUDART"]
CUDA_SYMBOLS = [r["FN"] for r in HOST_WAITS if r["LIB"] == "CUDA"]
HOT_SYMBOLS = {r["FN"] for t in (COLLECTIVES, GROUP, HOST_WAITS) for r in t}
FLUSH_MS = 500          # the hot-path record maps are printed this often
MAP_KEYS_MAX = 16384    # BPFTRACE_MAP_KEYS_MAX: records per flush interval (x2 buffers), open calls, ...
_REC0 = "((int32)0, (int32)0, (uint64)0, (uint64)0, (uint64)0, (int32)0, (int32)0, (int32)0, (uint64)0, (uint64)0, (int32)0)"

# Every map the template may read, with a typed first assignment: bpftrace
# needs a map's type before its first read, and a block that would assign it
# may have been dropped. BEGIN assigns and deletes a dummy key.
MAP_DECLS = {
    "comm": "@comm[(uint64)0] = ((int32)0, (int32)0, (uint64)0, (int32)0);",
    "opc": "@opc[(uint64)0] = (uint64)0;",
    "cd": "@cd[tid] = 0;",
    "ini": "@ini[tid] = ((uint64)0, (int32)0, (int32)0, (uint64)0);",
    "gu": "@gu[tid] = (uint64)0;",
    "lastuid": "@lastuid[tid] = (uint64)0;",
    "iall": "@iall[tid] = ((uint64)0, (int32)0, nsecs);",
    "spl": "@spl[tid] = ((uint64)0, (int32)0, (int32)0, (uint64)0, nsecs);",
    "dd": "@dd[tid] = 0;",
    "hw": "@hw[tid] = 0;",
    "traced": "@traced[(uint64)0] = 0;",
    "e0": f"@e0[(int32)0, (uint64)0] = {_REC0};",
    "e1": f"@e1[(int32)0, (uint64)0] = {_REC0};",
    "op": "@op[(int32)0, (int32)0] = ((uint64)0, 0);",
    "ep": "@ep[0] = 0;",
    "want": "@want[(uint64)0] = 0;",
    # ring mode (capture --watch): the record ring, its count, the call state, the thread-exit queue
    "r": f"@r[(uint64)0] = ((uint64)0, (int32)0, {_REC0[1:]};",
    "rg": "@rg[0] = (uint64)0;",
    "xq": "@xq[(uint64)0] = (int32)0;",
    "xw": "@xw[(uint64)0] = (uint64)0;",
    "xr": "@xr[(uint64)0] = (uint64)0;",
    "xc": "@xc[0] = (uint64)0;",
}
# @op in ring mode: (t0 of the open call or 0, its slot, pid, t0 and t1 of the last returned
# call, the second of that return (t1 / 1e9), the longest host wait after a collective in that
# second, and for a collective whose return is not traced the stack pointer at its entry and the
# return address there: capture.watch asks whether the thread is still inside it)
RING_OP_DECL = ("@op[(int32)0, (int32)0] = ((uint64)0, (uint64)0, (int32)0, (uint64)0, (uint64)0, (uint64)0, "
                "(uint64)0, (uint64)0, (uint64)0);")
MAP_DECL_KEYS = {"comm": "(uint64)0", "opc": "(uint64)0", "traced": "(uint64)0", "want": "(uint64)0",
                 "e0": "(int32)0, (uint64)0", "e1": "(int32)0, (uint64)0", "op": "(int32)0, (int32)0", "ep": "0",
                 "r": "(uint64)0", "rg": "0", "xq": "(uint64)0", "xw": "(uint64)0", "xr": "(uint64)0",
                 "xc": "0"}
MAP_KEEP = {"ep"}   # declared and kept (the current buffer's index), not deleted after the declaration

TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
              7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV"}
NETNS_BTF = "((struct sock *)args->skaddr)->__sk_common.skc_net.net->ns.inum"


# --------------------------------------------------------------------------- host features
def ensure_tracefs() -> str | None:
    """The tracefs mount point, mounting it when needed (root); None if unavailable."""
    for path in TRACEFS:
        if os.path.isdir(os.path.join(path, "events")):
            return path
    try:
        import subprocess
        os.makedirs(TRACEFS[0], exist_ok=True)
        subprocess.run(["mount", "-t", "tracefs", "tracefs", TRACEFS[0]], capture_output=True, timeout=10)
    except (OSError, ValueError, Exception):  # noqa: BLE001 - best effort
        pass
    return TRACEFS[0] if os.path.isdir(os.path.join(TRACEFS[0], "events")) else None


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """How many CPU numbers the kernel may give (bpftrace's cpu is below it): the highest in
    the possible list ("0-3,8-11") plus one, which counts CPUs offline or not yet plugged."""
    try:
        text = Path(path).read_text()
        return max(int(part.split("-")[-1]) for part in text.strip().split(",")) + 1
    except (OSError, ValueError):
        return os.cpu_count() or 1


@dataclass
class KernelFeatures:
    """What the running kernel offers the tracer: tracepoints with their fields, BTF."""

    tracepoints: dict[str, str] = field(default_factory=dict)  # "tcp/tcp_send_reset" -> format text
    btf: bool = False
    cpus: int = field(default_factory=possible_cpus)   # CPU numbers run 0 .. cpus-1

    @classmethod
    def probe(cls, names=("tcp/tcp_retransmit_skb", "tcp/tcp_send_reset", "tcp/tcp_receive_reset",
                          "sock/inet_sock_set_state", "sched/sched_switch",
                          "sched/sched_process_fork", "sched/sched_process_exit")) -> "KernelFeatures":
        feats = cls(btf=os.path.exists("/sys/kernel/btf/vmlinux"))
        root = ensure_tracefs()
        for name in names:
            if root is None:
                break
            try:
                feats.tracepoints[name] = Path(root, "events", name, "format").read_text()
            except OSError:
                continue
        return feats

    def has_field(self, tp: str, decl: str) -> bool:
        fmt = self.tracepoints.get(tp)
        if fmt is None:
            return False
        # "field:__u8 saddr[28];" -> match the declared name (with array size when given)
        return re.search(r"field:[^;]*[\s*]" + re.escape(decl) + r";", fmt) is not None


# --------------------------------------------------------------------------- rendering
@dataclass
class TraceTargets:
    """What to attach to: library path -> the probed symbols it exports."""

    nccl: dict[str, set[str]] = field(default_factory=dict)
    cudart: dict[str, set[str]] = field(default_factory=dict)
    cuda: dict[str, set[str]] = field(default_factory=dict)
    want_pids: list[int] = field(default_factory=list)     # --pid: only these processes
    traced_pids: list[int] = field(default_factory=list)   # known NCCL processes (host waits)
    stop_lib: str | None = None     # the libc capture maps: its sched_get_priority_max is the stop trigger
    capture_pid: int | None = None
    # library path -> symbol -> its address (ELF virtual address): attach points by address.
    # bpftrace 0.17 attaches a uprobe given by name also to C++ functions whose demangled name
    # starts with it (NCCL 2.28: ncclCommInitRank also hits ncclCommInitRankDev(...) and
    # ncclCommInitRankFunc(ncclAsyncJob*), ncclGroupEnd hits ncclGroupEndInternal(...)).
    addrs: dict[str, dict[str, int]] = field(default_factory=dict)

    def fill_addresses(self) -> None:
        """The address of every symbol to attach to, from the libraries' .dynsym."""
        from .elf import ElfError, exported_functions_cached
        wanted: dict[str, set[str]] = {}
        for kind in ("NCCL", "CUDART", "CUDA"):
            for path, syms in self.libs(kind).items():
                wanted.setdefault(path, set()).update(syms)
        if self.stop_lib:
            wanted.setdefault(self.stop_lib, set()).update(("sched_get_priority_max", "sched_get_priority_min"))
        for path in wanted:
            try:
                syms = exported_functions_cached(path)
            except (OSError, ElfError):
                continue
            got = {n: syms[n].value for n in wanted.get(path, ()) if n in syms and syms[n].value}
            self.addrs.setdefault(path, {}).update(got)

    def point(self, ptype: str, path: str, sym: str) -> str:
        addr = self.addrs.get(path, {}).get(sym)
        return f"{ptype}:{_quote_path(path)}:" + (f"0x{addr:x}" if addr else sym)

    def libs(self, kind: str) -> dict[str, set[str]]:
        return {"NCCL": self.nccl, "CUDART": self.cudart, "CUDA": self.cuda}[kind]


_BLOCK_RE = re.compile(r"^// @block (\S+)(.*)$", re.M)
_ATTACH_RE = re.compile(r"^(uprobe|uretprobe):(NCCL|CUDART|CUDA):(\w+),?\s*$")
_PLACEHOLDER_RE = re.compile(r"\{([A-Z_]+)\}")


def _quote_path(path: str) -> str:
    if re.fullmatch(r"[\w./+-]+", path):
        return path
    return '"' + path.replace('"', '\\"') + '"'


def _requirement_ok(req: str, targets: TraceTargets, feats: KernelFeatures, call_returns: bool = False,
                    ring: int = 0) -> bool:
    if req.startswith("!"):
        return not _requirement_ok(req[1:], targets, feats, call_returns, ring)
    if req == "returns":
        return call_returns
    if req == "ring":
        return bool(ring)
    if req == "stop":
        return bool(targets.stop_lib and targets.capture_pid)
    if req == "hot":
        return any(HOT_SYMBOLS & syms for kind in ("NCCL", "CUDART", "CUDA") for syms in targets.libs(kind).values())
    kind, _, rest = req.partition(":")
    if kind == "tp":
        return rest in feats.tracepoints
    if kind == "field":
        tp, _, decl = rest.rpartition(":")
        return feats.has_field(tp, decl)
    if kind == "sym":
        lib, _, sym = rest.partition(":")
        return any(sym in syms for syms in targets.libs(lib).values())
    if kind == "btf":
        return feats.btf
    if kind == "want":
        return bool(targets.want_pids)
    raise ValueError(f"unknown requirement {req!r} in {TEMPLATE}")


def _expand_attach_points(body: str, targets: TraceTargets) -> str | None:
    """Replace symbolic attach lines; None when no attach point is left."""
    lines = body.splitlines()
    out, points, in_header = [], [], True
    for line in lines:
        m = _ATTACH_RE.match(line.strip()) if in_header else None
        if m:
            ptype, lib, sym = m.groups()
            for path, syms in sorted(targets.libs(lib).items()):
                if sym in syms:
                    points.append(targets.point(ptype, path, sym))
            continue
        if in_header and line.strip() and not line.lstrip().startswith("//") and points is not None:
            if any(_ATTACH_RE.match(l.strip()) for l in lines):
                if not points:
                    return None
                out.append(",\n".join(points))
            in_header = False
        out.append(line)
    return "\n".join(out)


def _apply_pid_filter(block: str, active: bool) -> str:
    """``PIDFILTER`` (a line before the body) -> the body runs only for --pid processes.

    Written as an ``if`` around the body (the same as a predicate), so that a
    block may also keep a predicate of its own."""
    lines = block.split("\n")
    if "PIDFILTER" not in (l.strip() for l in lines):
        return block
    lines = [l for l in lines if l.strip() != "PIDFILTER"]
    if not active:
        return "\n".join(lines)
    first = next(i for i, l in enumerate(lines) if l.rstrip() == "{")
    last = max(i for i, l in enumerate(lines) if l.rstrip() == "}")
    body = ["  " + l if l.strip() else l for l in lines[first + 1:last]]
    return "\n".join(lines[:first + 1] + ["  if (@want[(uint64)pid]) {"] + body + ["  }"] + lines[last:])


# --- the hot path's record keeping, one text per mode: flush (capture) or ring (capture --watch).
# Classes of open calls in @op: 0 collective, 1 host wait, 2 ncclGroupEnd.
HOT_CLASSES = {"COLL": 0, "WAIT": 1, "GROUP": 2}
EXIT_QUEUE = 4096            # ring mode: threads that ended on a CPU, waiting to be forgotten (block state)
_X9 = ", ".join(f"$x.{i}" for i in range(9))

_FLUSH_STORE = """$e = @ep[0];
if ($e == 0) { @e0[(int32)tid, $t] = $r; @ne = count(); }
else if ($e == 1) { @e1[(int32)tid, $t] = $r; @ne = count(); }"""

_FLUSH_RETURN = """$o = @op[(int32)tid, (int32)CLS];
if ($o.0 != 0) {
  $t1 = nsecs;
  $rc = (int32)retval;
  $e = @ep[0];
  $done = 0;
  /* the entry's record still in the current buffer: complete it in place (an update; printing
     a map that is only inserted into and updated is safe) */
  if ($e == $o.1 && $e == 0) {
    $x = @e0[(int32)tid, $o.0];
    if ($x.1 != 0) {
      @e0[(int32)tid, $o.0] = (X9, (uint64)$t1, $rc);
      $done = 1;
    }
  }
  if ($e == $o.1 && $e == 1) {
    $x = @e1[(int32)tid, $o.0];
    if ($x.1 != 0) {
      @e1[(int32)tid, $o.0] = (X9, (uint64)$t1, $rc);
      $done = 1;
    }
  }
  if ($done == 0) {
    /* the buffers switched since the entry: a return record, key (tid, t1), t0 in slot a */
    $r = ((int32)255, (int32)pid, $o.0, (uint64)0, (uint64)0, (int32)0, (int32)0, (int32)0, (uint64)0,
          (uint64)$t1, $rc);
    if ($e == 0) { @e0[(int32)tid, $t1] = $r; @ne = count(); }
    else if ($e == 1) { @e1[(int32)tid, $t1] = $r; @ne = count(); }
  }
  delete(@op[(int32)tid, (int32)CLS]);
}""".replace("X9", _X9)

# ring mode: a record goes into the next of RING slots (the oldest record is overwritten); its
# key is the slot, t0 and tid lead the value. @rg counts the records ever made (a race between
# two CPUs may give both the same slot: one record lost, never a wrong one)
_RING_STORE = """$s = @rg[0];
@rg[0] = $s + 1;
$s = $s % RING;
@r[$s] = ((uint64)$t, (int32)tid, """ + ", ".join(f"$r.{i}" for i in range(11)) + ");"

_RING_RETURN = """$o = @op[(int32)tid, (int32)CLS];
if ($o.0 != 0) {
  $t1 = nsecs;
  $rc = (int32)retval;
  $x = @r[$o.1];
  if ($x.0 == $o.0 && $x.1 == (int32)tid) {
    /* the entry's record still in its slot: complete it in place */
    @r[$o.1] = ($x.0, $x.1, """ + ", ".join(f"$x.{i}" for i in range(2, 11)) + """, (uint64)$t1, $rc);
  } else {
    /* the ring went round during the call: a return record, t0 in slot a */
    $t = $t1;
    $r = ((int32)255, (int32)pid, $o.0, (uint64)0, (uint64)0, (int32)0, (int32)0, (int32)0, (uint64)0,
          (uint64)$t1, $rc);
    STORE
  }
  $q = $t1 / 1000000000;
  $m = $o.5 == $q ? $o.6 : (uint64)0;
  LONGEST
  @op[(int32)tid, (int32)CLS] = ((uint64)0, (uint64)0, (int32)pid, $o.0, (uint64)$t1, $q, $m, $o.7, $o.8);
}"""

# a host wait that began after this thread's last collective, itself entered after the wait
# before: the slowest collective of the second (capture.watch: --hang-after's default)
_RING_LONGEST = """$c = @op[(int32)tid, (int32)0];
$lc = $c.0 > $c.3 ? $c.0 : $c.3;
if ($lc > $o.3 && $lc < $o.0 && $t1 - $o.0 > $m) {
  $m = $t1 - $o.0;
}"""


def hot_macros(ring: int = 0) -> dict[str, str]:
    """The texts of the template's RECORD* and RETURN_* placeholders: flush mode (``ring`` 0,
    the double-buffered maps printed every flush) or ring mode (``ring`` slots, see
    bpf/README.md)."""
    out: dict[str, str] = {}
    if not ring:
        out["RECORD"] = out["RECORD_LAUNCH"] = _FLUSH_STORE
        for name, cls in HOT_CLASSES.items():
            out[f"RECORD_OPEN_{name}"] = (_FLUSH_STORE + f"\n@op[(int32)tid, (int32){cls}] = ((uint64)$t, $e);"
                                          "   /* in progress */")
            out[f"RETURN_{name}"] = _FLUSH_RETURN.replace("CLS", str(cls))
        return out
    store = _RING_STORE.replace("RING", str(int(ring)))
    keep = ("$p = @op[(int32)tid, (int32){cls}];\n"
            "@op[(int32)tid, (int32){cls}] = ({first}, (int32)pid, $p.3, $p.4, $p.5, $p.6, $p.7, $p.8);")
    out["RECORD"] = store
    # a collective whose return is not traced: a launch, its t0 the last collective's, with the
    # stack pointer at its entry and the return address it points to (still there while the
    # thread is inside the call: capture.watch checks that for a hang)
    out["RECORD_LAUNCH"] = store + "\n" + keep.format(cls=0, first="(uint64)0, (uint64)0").replace(
        "$p.3, $p.4", "(uint64)$t, $p.4").replace("$p.7, $p.8", "$sp, *(uint64 *)$sp")
    out["RECORD_LAUNCH"] = "$sp = (uint64)reg(\"sp\");\n" + out["RECORD_LAUNCH"]
    for name, cls in HOT_CLASSES.items():
        out[f"RECORD_OPEN_{name}"] = store + "\n" + keep.format(cls=cls, first="(uint64)$t, $s")
        ret = _RING_RETURN.replace("STORE", store.replace("\n", "\n    ")).replace("CLS", str(cls))
        out[f"RETURN_{name}"] = ret.replace("  LONGEST\n", ("  " + _RING_LONGEST.replace("\n", "\n  ") + "\n")
                                            if name == "WAIT" else "")
    return out


_MACRO_LINE_RE = re.compile(r"^([ \t]*)\{(RECORD\w*|RETURN_\w+)\}[ \t]*$", re.M)


def _expand_macros(text: str, macros: dict[str, str]) -> str:
    """A placeholder alone on its line -> its text, every line indented as the placeholder."""
    return _MACRO_LINE_RE.sub(lambda m: "\n".join(m.group(1) + l if l else l
                                                  for l in macros[m.group(2)].split("\n")), text)


def render_script(targets: TraceTargets, feats: KernelFeatures, call_returns: bool = True,
                  template: str | None = None, flush_ms: int = FLUSH_MS, ring: int = 0) -> tuple[str, list[str]]:
    """The bpftrace program for this host, and the names of the blocks kept.

    ``call_returns``: uretprobes on the collectives too (t1 and rc of every collective
    call, completed in place in the call's record: cheap; --no-call-returns leaves them out).
    ``flush_ms``: how often the hot-path records are printed (ring mode: the calls' state).
    ``ring``: ring mode (capture --watch) with this many record slots: the records stay in the
    kernel until the watcher asks for them (:func:`trigger_dump`), see bpf/README.md."""
    macros = hot_macros(ring)
    text = template if template is not None else TEMPLATE.read_text()
    matches = list(_BLOCK_RE.finditer(text))
    kept_names: list[str] = []
    blocks: list[str] = []
    for i, m in enumerate(matches):
        name, spec = m.group(1), m.group(2).split()
        body = text[m.end():matches[i + 1].start() if i + 1 < len(matches) else len(text)]
        opts = [s.split("=", 1) for s in spec]
        reqs = [v for k, v in opts if k == "requires"]
        table = next((v for k, v in opts if k == "foreach"), None)
        if not all(_requirement_ok(r, targets, feats, call_returns, ring) for r in reqs):
            continue
        tables = dict(TABLES, GROUP_RET=[r for r in GROUP if call_returns or r["FN"] == "ncclGroupEnd"],
                      GROUP_NORET=[r for r in GROUP if not (call_returns or r["FN"] == "ncclGroupEnd")])
        rows = tables[table] if table else [{}]
        for row in rows:
            row = dict(row)
            if "NEST" in row:   # a collective: counted once however nested
                row["NEST_ENTER"] = "@cd[tid]++;" if row["NEST"] else ""
                row["NEST_TEST"] = "== 1" if row["NEST"] else "== 0"
            inst = _PLACEHOLDER_RE.sub(lambda mm: str(row[mm.group(1)]) if mm.group(1) in row else mm.group(0), body)
            inst = _expand_macros(inst, macros)
            inst = _expand_attach_points(inst, targets)
            if inst is None:
                continue
            inst = _apply_pid_filter(inst, bool(targets.want_pids))
            blocks.append(inst)
            kept_names.append(name + (f":{row['FN']}" if "FN" in row else ""))
    script = "\n".join(blocks)
    used = sorted(set(re.findall(r"@(\w+)\[", script)))
    decls = []
    for name in used:
        if name in MAP_DECLS:
            key = MAP_DECL_KEYS.get(name, "tid")
            decl = RING_OP_DECL if ring and name == "op" else MAP_DECLS[name]
            decls.append(decl + ("" if name in MAP_KEEP else f" delete(@{name}[{key}]);"))
    hot = "@e0[" in script
    clear = [f"clear(@{n});" for n in used] + (["clear(@ne);"] if "@ne = count()" in script else [])
    fill = {
        "MAP_DECLS": "\n  ".join(decls),
        "WANT_PIDS": " ".join(f"@want[(uint64){p}] = 1;" for p in targets.want_pids),
        "TRACED_PIDS": " ".join(f"@traced[(uint64){p}] = 1;" for p in targets.traced_pids),
        "NETNS": NETNS_BTF if feats.btf else "0",
        "CLEAR_MAPS": " ".join(clear),
        "FLUSH_MS": str(int(flush_ms)),
        "FLUSH_FINAL": ('if (@ep[0] != 2) { print(@e0); print(@e1);'
                        + (' print(@ne);' if "@ne = count()" in script else "") + " }") if hot else "",
        "STOP_POINT": targets.point("uprobe", targets.stop_lib or "", STOP_SYMBOL),
        "DUMP_POINT": targets.point("uprobe", targets.stop_lib or "", DUMP_SYMBOL),
        "RING": str(int(ring)),
        "EXIT_QUEUE": str(EXIT_QUEUE),
        "NCPU": str(max(1, feats.cpus)),
        "CAPTURE_PID": str(targets.capture_pid or 0),
    }
    script = _PLACEHOLDER_RE.sub(lambda mm: fill.get(mm.group(1), mm.group(0)), script)
    header = ("// generated by stallscope capture from bpf/nccl.bt"
              + ("" if call_returns else " (--no-call-returns)") + (f" (ring mode, {ring} records)" if ring else "")
              + "; blocks: " + ", ".join(kept_names) + "\n")
    for path, syms in sorted(targets.addrs.items()):   # what the addresses of the attach points are
        header += "".join(f"// {path}: {name} = 0x{addr:x}\n" for name, addr in sorted(syms.items()))
    return header + script, kept_names


STOP_SYMBOL = "sched_get_priority_max"
DUMP_SYMBOL = "sched_get_priority_min"     # ring mode: the watcher asks for the ring (block dump)


def own_libc() -> str | None:
    """The C library this process maps (the stop trigger's attach point)."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) == 6 else ""
                if re.search(r"/libc[.-][\w.]*so", path) and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def trigger_stop() -> None:
    """Fire the stop probe (see bpf/nccl.bt, block stop): a libc call from this process."""
    os.sched_get_priority_max(os.SCHED_OTHER)


def trigger_dump() -> None:
    """Ring mode: fire the dump probe (bpf/nccl.bt, block dump), which prints the record ring
    and a ``ring_dump`` mark after it."""
    os.sched_get_priority_min(os.SCHED_OTHER)


def probes_expected(targets: TraceTargets) -> int:
    return sum(len(s) for s in targets.nccl.values())


# --------------------------------------------------------------------------- output, during the capture
# map-dump lines of the hot path, the ones that may be dropped: a flush's records; ring mode's
# records, their count and the calls' state (which the watcher reads as they come)
HOT_TAGS = (b"@e0[", b"@e1[", b"@op[", b"@rg[")
RING_DUMP_TAG = b'{"ev":"ring_dump"'    # a dump's end: goes with its records
KEEP_FILE = "keep.txt"                     # rare lines of dropped segments
PIPE_BYTES = 1 << 20                       # bpftrace's stdout pipe, enlarged so that rare reads suffice


def _is_hot(line: bytes) -> bool:
    return line[:4] in HOT_TAGS or line[:3] == b"@r[" or line.startswith(RING_DUMP_TAG)


class Spool:
    """bpftrace's stdout -> raw segment files, at a low rate and without parsing.

    The reader thread drains the pipe (non-blocking, 1 MiB reads) every
    ``poll_s`` seconds and goes back to sleep, so bpftrace's writes wake nobody
    and capture takes no CPU per event. Lines are written whole to
    ``raw_dir/seg-NNNNNN.txt``; when the segments outgrow ``max_bytes`` the
    oldest goes, its rare (non hot-path) lines appended to ``keep.txt`` first.
    ``ready`` is set when the program's BEGIN line arrives; ``lines`` counts
    lines for the progress display.
    """

    def __init__(self, stream, raw_dir: Path, max_bytes: int, poll_s: float = 0.1,
                 segment_bytes: int | None = None, max_age_s: float | None = None):
        self.stream = stream
        self.fd = stream.fileno()
        self.raw_dir = Path(raw_dir)
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max(0, int(max_bytes))
        self.poll_s = poll_s
        self.segment_bytes = segment_bytes or min(64 << 20, max(256 << 10, self.max_bytes // 8))
        # ring mode (capture.watch): segments also end every max_age_s / 8 and go once all their
        # lines are older than max_age_s; the rare lines kept of them are compacted (see _compact)
        self.max_age_s = max_age_s
        self._seg_opened = 0.0
        self.ready = threading.Event()
        self.ended = threading.Event()    # the END probe's last line arrived: all records are out
        self.stopped = threading.Event()  # the stop trigger's flush arrived: recording is off
        self.done = threading.Event()
        self.lines = 0
        self.bytes = 0            # raw bytes kept now (segments + keep file)
        self.dropped_lines = 0    # hot-path records of dropped segments
        self.dropped_segments = 0
        self.attached_probes: int | None = None
        self._segments: list[Path] = []
        self._seg_fh = None
        self._seg_size = 0
        self._carry = b""
        self._seq = 0
        self._thread: threading.Thread | None = None
        try:
            os.set_blocking(self.fd, False)
            fcntl.fcntl(self.fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
        except OSError:
            pass

    # -- the reader
    def start(self) -> "Spool":
        self._thread = threading.Thread(target=self._run, name="tracer-spool", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while True:
                got, eof = self._drain()
                if eof:
                    break
                if got < PIPE_BYTES // 4:
                    time.sleep(self.poll_s)
        finally:
            if self._carry:
                self._append(self._carry + b"\n")
                self._carry = b""
            if self._seg_fh:
                self._seg_fh.close()
                self._seg_fh = None
            self.done.set()

    def _drain(self) -> tuple[int, bool]:
        got = 0
        while True:
            try:
                data = os.read(self.fd, PIPE_BYTES)
            except BlockingIOError:
                return got, False
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                return got, True
            if not data:
                return got, True
            got += len(data)
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        data = self._carry + data
        cut = data.rfind(b"\n") + 1
        self._carry = data[cut:]
        if not cut:
            return
        whole = data[:cut]
        self.lines += whole.count(b"\n")
        if not self.ready.is_set():
            m = _ATTACHING_RE.search(whole)
            if m:
                self.attached_probes = int(m.group(1))
            if b'"tracer_start"' in whole:
                self.ready.set()
        if b'"tracer_end"' in whole:
            self.ended.set()
        if b'"tracer_stopped"' in whole:
            self.stopped.set()
        self._append(whole)

    def _append(self, whole: bytes) -> None:
        """Whole lines into segments of about segment_bytes (a big chunk is split at lines)."""
        while whole:
            now = time.monotonic()
            if self._seg_fh is None or self._seg_size >= self.segment_bytes or (
                    self.max_age_s and now - self._seg_opened > self.max_age_s / 8):
                if self._seg_fh:
                    self._seg_fh.close()
                path = self.raw_dir / f"seg-{self._seq:06d}.txt"
                self._seq += 1
                self._segments.append(path)
                self._seg_fh = open(path, "ab")
                self._seg_size = 0
                self._seg_opened = now
            room = self.segment_bytes - self._seg_size
            cut = len(whole) if len(whole) <= room else (whole.rfind(b"\n", 0, room) + 1 or
                                                         whole.find(b"\n", room) + 1 or len(whole))
            part, whole = whole[:cut], whole[cut:]
            self._seg_fh.write(part)
            self._seg_fh.flush()   # the data survive a killed capture
            self._seg_size += len(part)
            self.bytes += len(part)
            if whole:
                self._seg_size = self.segment_bytes   # full: the rest goes to a new segment
            while self.bytes > self.max_bytes and len(self._segments) > 1:
                self._drop_oldest()
            if self.max_age_s:
                self._drop_aged()

    def _drop_aged(self) -> None:
        """Ring mode: the segments whose last line is older than max_age_s (the current one stays)."""
        limit = time.time() - self.max_age_s
        while len(self._segments) > 1:
            try:
                if self._segments[0].stat().st_mtime >= limit:
                    break
            except OSError:
                self._segments.pop(0)
                continue
            self._drop_oldest()
        keep = self.raw_dir / KEEP_FILE
        try:
            if keep.stat().st_size > max(64 << 10, self.max_bytes // 8):
                self._compact(keep)
        except OSError:
            pass

    def _compact(self, keep: Path) -> None:
        """The kept rare lines of a long ring: what joins later events stays (communicator inits,
        ids, destroys, tracer marks); old TCP and socket events, long out of the window, go."""
        before = keep.stat().st_size
        tmp = keep.with_name(keep.name + ".tmp")
        with open(keep, "rb") as src, open(tmp, "wb") as dst:
            for line in src:
                if not line.startswith((b'{"ev":"tcp_', b'{"ev":"sock_state')):
                    dst.write(line)
        os.replace(tmp, keep)
        self.bytes += keep.stat().st_size - before

    def _drop_oldest(self) -> None:
        old = self._segments.pop(0)
        size = old.stat().st_size
        keep, hot = [], 0
        with open(old, "rb") as fh:
            for line in fh:
                if _is_hot(line):
                    hot += 1
                elif line.strip():            # (a map's print ends with an empty line)
                    keep.append(line)
        kept = b"".join(keep)
        with open(self.raw_dir / KEEP_FILE, "ab") as fh:
            fh.write(kept)
        old.unlink()
        self.bytes += len(kept) - size
        self.dropped_lines += hot
        self.dropped_segments += 1

    def join(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


def raw_files(raw_dir: Path) -> list[Path]:
    """The spooled files in stream order: the kept rare lines of dropped segments first."""
    raw_dir = Path(raw_dir)
    keep = raw_dir / KEEP_FILE
    return ([keep] if keep.exists() else []) + sorted(raw_dir.glob("seg-*.txt"))


# --------------------------------------------------------------------------- output, at the end
_ATTACHING_RE = re.compile(rb"Attaching (\d+) probe")
_LOST_RE = re.compile(rb"Lost (\d+) events")
_REC_RE = re.compile(rb"^@(e0|e1)\[(\d+), (\d+)\]: \(([-\d, ]+)\)\s*$")
# the same records, for capture.watch's progress monitor (all of a chunk's in one pass): tid,
# key, and kind, pid, a, t1 of the tuple (kind, pid, a, b, c, d, e, f, g, t1, rc)
PROGRESS_RE = re.compile(rb"^@e[01]\[(\d+), (\d+)\]: \((\d+), (\d+), (\d+), -?\d+, -?\d+, -?\d+, -?\d+, "
                         rb"-?\d+, -?\d+, (\d+), -?\d+\)[ \t\r]*$", re.M)


def parse_record(line: bytes) -> tuple[int, int, list[int]] | None:
    """One hot-path record line (``@e0[tid, key]: (11 fields)``) -> (tid, key, fields); None
    for anything else. key is t0 of an entry, t1 of a return record (fields[0] == RET_KIND)."""
    if line[:2] != b"@e":
        return None
    m = _REC_RE.match(line)
    if not m:
        return None
    try:
        f = [int(x) for x in m.group(4).split(b",")]
    except ValueError:
        return None
    return (int(m.group(2)), int(m.group(3)), f) if len(f) == 11 else None
RET_KIND = 255   # the return record of a call (bpf/nccl.bt)
_NE_RE = re.compile(rb"^@ne: (\d+)")
# ring mode (capture --watch): a dump's records, (t0 or a return's t1, tid, then the 11 fields of a
# flush's record) keyed by their slot; the count of records ever made; the calls' state (the
# watcher's, nothing for the events)
_RING_RE = re.compile(rb"^@r\[\d+\]: \(([-\d, ]+)\)\s*$")
_RG_RE = re.compile(rb"^@rg\[0\]: (\d+)")
STATE_TAG = b"@op["
COLL_BY_KIND = {r["KIND"]: (r["OP"], r["FN"]) for r in COLLECTIVES}
GROUP_BY_KIND = {r["KIND"]: r["FN"] for r in GROUP}
WAIT_BY_KIND = {r["KIND"]: (r["FN"], r["OBJ"]) for r in HOST_WAITS}
OPEN_KINDS = {"comm_init": "init", "comm_destroy": "destroy"}   # JSON entry events merged with a JSON "ret"
HOT_KINDS = ("coll", "host_wait", "group", "offcpu")   # events of the hot path (already normal, droppable)
DROPPABLE = tuple(f'{{"ev":"{k}"'.encode() for k in HOT_KINDS)
REORDER_WINDOW = 40000   # > the records of one flush (the maps print unsorted)


def _ipv6_from_hex(h: str) -> str:
    try:
        return str(ipaddress.IPv6Address(bytes.fromhex(h)))
    except ValueError:
        return h


def _normalize(ev: dict) -> dict:
    """Rare (JSON) events: names for numbers, nulls for what the tracer could not know."""
    known = ev.pop("known", None)
    if known is not None:
        if known == 0:  # communicator created before the tracer attached
            ev["rank"] = ev["nranks"] = None
            ev["comm_id_hash"] = None
        elif known == 2:  # ncclCommSplit child: rank known only across ranks
            ev["rank"] = ev["nranks"] = None
            ev["comm_id_source"] = "split"
    for key in ("state", "oldstate", "newstate"):
        if isinstance(ev.get(key), int):
            ev[key] = TCP_STATES.get(ev[key], str(ev[key]))
    for key in ("saddr6", "daddr6"):
        if key in ev:
            ev[key[:5]] = _ipv6_from_hex(ev.pop(key))
    for key in ("saddr", "daddr"):  # IPv4-mapped IPv6 -> the IPv4 address
        v = ev.get(key)
        if isinstance(v, str) and v.startswith("::ffff:") and "." in v:
            ev[key] = v[7:]
    if ev.get("ev") == "comm_init" and ev.get("fn") == "ncclCommSplit":
        ev["comm_id_source"] = "split"
        if not ev.get("parent_known"):
            ev["parent_rank"] = ev["parent_nranks"] = ev["parent_comm_id_hash"] = None
            ev["comm_id_hash"] = None
        ev.pop("parent_known", None)
        ev["rank"] = ev["nranks"] = None
    return ev


def _time_of(ev: dict) -> int:
    t = ev.get("t0")
    if t is None:
        t = ev.get("t")
    return t if isinstance(t, int) else 0


def _take(store: dict, key, fits, order, pick):
    """Remove and return from ``store[key]`` the fitting item ``pick`` (min or max) chooses
    by ``order``; drop the key once its list is empty. None when nothing fits."""
    items = store.get(key)
    cands = [x for x in items if fits(x)] if items else []
    if not cands:
        return None
    item = pick(cands, key=order)
    items.remove(item)
    if not items:
        del store[key]
    return item

class _Builder:
    """Raw lines -> complete events, in stream order (see postprocess)."""

    def __init__(self, call_returns: bool = True):
        self.call_returns = call_returns
        self.pending: dict[tuple, list[dict]] = {}   # (tid, kind) -> JSON entries awaiting their "ret"
        self.orphans: dict[tuple, list[dict]] = {}   # returns that overtook their entry (per-CPU buffers)
        self.open: dict[tuple, dict] = {}            # (tid, t0) -> hot-path entry awaiting its return record
        self.early: dict[tuple, tuple] = {}          # (tid, t0) -> (t1, rc): a return record before its entry
        self.orphan_returns = 0
        self.records = 0
        self.records_made: int | None = None         # @ne: records the probes made
        self.bad_lines = 0
        self.lost_events = 0
        self.attached_probes: int | None = None
        self.other_lines: list[str] = []
        # ring mode: (tid, key) -> (fields, the dump it was last seen in); its dumps; @rg
        self.ring: dict[tuple[int, int], tuple[list[int], int]] = {}
        self.dumps = 0
        self.ring_slots: int | None = None
        self.ring_made: int | None = None
        self.ring_oldest: list[int] = []              # per dump: its oldest record's time
        self._dump_oldest: int | None = None

    def returned(self, kind: int) -> bool | None:
        """What a record's t1/rc mean: True (the return was traced) or None (not traced)."""
        if kind >= 32 or GROUP_BY_KIND.get(kind) == "ncclGroupEnd":
            return True
        return True if self.call_returns else None

    def record(self, tid: int, t0: int, f: list[int], returned: bool | None) -> dict:
        kind, pid, a, b, c, d, e, g_root, stream, t1, rc = f
        done = returned is True
        if kind < 16:   # returned False: awaiting its return record (t1/rc filled in then)
            op, fn = COLL_BY_KIND[kind]
            return {"ev": "coll", "op": op, "fn": fn, "t0": t0, "t1": t1 if done else None, "pid": pid, "tid": tid,
                    "comm": f"0x{a:x}", "rank": None, "nranks": None, "comm_id_hash": None, "op_count": b,
                    "count": c, "datatype": d, "red_op": e, "root": g_root, "stream": f"0x{stream:x}",
                    "rc": rc if done else None, "returned": returned}
        if kind < 32:
            return {"ev": "group", "fn": GROUP_BY_KIND[kind], "t0": t0, "t1": t1 if done else None, "pid": pid,
                    "tid": tid, "rc": rc if done else None, "returned": returned}
        fn, obj = WAIT_BY_KIND[kind]
        return {"ev": "host_wait", "fn": fn, "t0": t0, "t1": t1 if done else None, "pid": pid, "tid": tid,
                obj: f"0x{a:x}", "rc": rc if done else None, "returned": returned}

    def parse(self, line: bytes):
        """One raw line -> (what, kind, event) or None; what: None (complete), 'entry' or 'ret'."""
        if line[:1] == b"@":
            m = _REC_RE.match(line)
            if m is None:
                if line[:3] == b"@r[":
                    self.ring_record(line)
                elif line[:4] == STATE_TAG:
                    pass
                elif (m := _NE_RE.match(line)):
                    self.records_made = max(self.records_made or 0, int(m.group(1)))
                elif (m := _RG_RE.match(line)):
                    self.ring_made = max(self.ring_made or 0, int(m.group(1)))
                elif line.strip():
                    self.bad_lines += 1
                return None
            try:
                tid, key2 = int(m.group(2)), int(m.group(3))
                f = [int(x) for x in m.group(4).split(b",")]
                if len(f) != 11:
                    raise ValueError
                self.records += 1
                if f[0] == RET_KIND:       # a return: key (tid, t1), t0 in slot a
                    t0, t1, rc = f[2], key2, f[10]
                    entry = self.open.pop((tid, t0), None)
                    if entry is None:
                        self.early[(tid, t0)] = (t1, rc)
                        return None
                    entry.update(t1=t1, rc=rc, returned=True)
                    return None, "hot", entry
                returned = self.returned(f[0])
                if returned is None:       # no return traced: complete now
                    return None, "hot", self.record(tid, key2, f, None)
                ev = self.record(tid, key2, f, False)
                if f[9]:                   # completed in place: t1, rc in the record
                    self.open.pop((tid, key2), None)
                    ev.update(t1=f[9], rc=f[10], returned=True)
                    return None, "hot", ev
                early = self.early.pop((tid, key2), None)
                if early is not None:
                    ev.update(t1=early[0], rc=early[1], returned=True)
                    return None, "hot", ev
                self.open[(tid, key2)] = ev
                return None
            except (ValueError, KeyError):
                self.bad_lines += 1
                return None
        if line[:1] == b"{":
            try:
                ev = json.loads(line)
            except ValueError:
                self.bad_lines += 1
                return None
            kind = ev.get("ev")
            if kind == "ret":
                return "ret", ev.get("k"), ev
            if kind == "ring_dump":           # the end of a dump: its records are those read since the last
                self.dumps += 1
                self.ring_slots = ev.get("slots")
                if self._dump_oldest is not None:
                    self.ring_oldest.append(self._dump_oldest)
                self._dump_oldest = None
            open_kind = OPEN_KINDS.get(kind)
            if open_kind and "t1" not in ev:
                return "entry", open_kind, ev
            return None, kind, ev
        text = line.decode("utf-8", "replace").strip()
        if not text:
            return None
        m = _ATTACHING_RE.search(line)
        if m:
            self.attached_probes = int(m.group(1))
        m = _LOST_RE.search(line)
        if m:
            self.lost_events += int(m.group(1))
        if len(self.other_lines) < 200:
            self.other_lines.append(text)
        return None

    @staticmethod
    def merge(entry: dict, ret: dict) -> dict:
        entry["t1"] = ret["t1"]
        entry["rc"] = ret.get("rc")
        entry["returned"] = True
        if ret.get("comm") and ret["comm"] != "0x0":
            entry["comm"] = ret["comm"]
        return entry

    def feed(self, line: bytes):
        """Complete events made by this line (0, 1 or more)."""
        parsed = self.parse(line)
        if parsed is None:
            return ()
        what, kind, ev = parsed
        if what is None:
            return (ev,)
        key = (ev.get("tid"), kind)
        if what == "ret":
            # calls of one thread and kind do not overlap: the latest entry before the return
            entry = _take(self.pending, key, lambda e: e.get("t0", 0) <= ev["t1"], lambda e: e.get("t0", 0), max)
            if entry is not None:
                return (self.merge(entry, ev),)
            self.orphans.setdefault(key, []).append(ev)
            return ()
        # a return that was read before its entry
        ret = _take(self.orphans, key, lambda r: r.get("t1", 0) >= ev.get("t0", 0), lambda r: r["t1"], min)
        if ret is not None:
            return (self.merge(ev, ret),)
        self.pending.setdefault(key, []).append(ev)
        return ()

    def ring_record(self, line: bytes) -> None:
        """A ring dump's record: the newest dump's copy of a record wins (it may have been completed
        since); a record is the same in every dump it is in, or overwritten by another one."""
        m = _RING_RE.match(line)
        try:
            f = [int(x) for x in m.group(1).split(b",")] if m else []
        except ValueError:
            f = []
        if len(f) != 13 or f[0] <= 0:
            if not (len(f) == 13 and f[0] == 0):   # an empty slot (the declaration's): nothing
                self.bad_lines += 1
            return
        if (f[1], f[0]) not in self.ring:
            self.records += 1
        self.ring[(f[1], f[0])] = (f[2:], self.dumps)
        if self._dump_oldest is None or f[0] < self._dump_oldest:
            self._dump_oldest = f[0]

    def ring_events(self):
        """The ring's records as events, once the last dump was read. A call with no return in
        the last dump that holds it was still inside then if that dump is the last one (the
        hang); a call seen open only in an earlier dump had its return overwritten since:
        unknown (t1 null, ``returned`` null), never a hang."""
        ring, self.ring = self.ring, {}
        last = self.dumps - 1
        done: dict[tuple[int, int], tuple[int, int]] = {}
        for (tid, key), (f, _) in ring.items():
            if f[0] == RET_KIND:
                done[(tid, f[2])] = (key, f[10])
        for (tid, key), (f, seen) in sorted(ring.items(), key=lambda kv: kv[0][1]):
            if f[0] == RET_KIND:
                if (tid, f[2]) not in ring:
                    self.orphan_returns += 1
                continue
            returned = self.returned(f[0])
            if returned is None:
                yield self.record(tid, key, f, None)
                continue
            ev = self.record(tid, key, f, False)
            ret = (f[9], f[10]) if f[9] else done.get((tid, key))
            if ret is not None:
                ev.update(t1=ret[0], rc=ret[1], returned=True)
            elif seen != last:
                ev.update(returned=None)
            yield ev

    def unfinished(self):
        """Calls still inside at the end (t1 null, returned false): entries without a return."""
        for stack in self.pending.values():
            for entry in stack:
                entry["t1"] = None
                entry["rc"] = None
                entry["returned"] = False
                yield entry
        self.pending.clear()
        yield from self.open.values()
        self.open = {}
        self.orphan_returns += len(self.early)
        self.early = {}


class _Comms:
    """Communicator facts by (pid, comm pointer), applied in time order."""

    def __init__(self):
        self.by_ptr: dict[tuple[int, str], tuple] = {}

    def apply(self, ev: dict) -> dict:
        kind = ev.get("ev")
        if kind == "coll":
            info = self.by_ptr.get((ev["pid"], ev["comm"]))
            if info is not None:
                ev["rank"], ev["nranks"], ev["comm_id_hash"], source = info
                if source:
                    ev["comm_id_source"] = source
        elif kind == "comm_init":
            comm = ev.get("comm")
            if comm and comm != "0x0" and ev.get("rc") in (0, 7):
                self.by_ptr[(ev.get("pid"), comm)] = (ev.get("rank"), ev.get("nranks"), ev.get("comm_id_hash"),
                                                      ev.get("comm_id_source"))
        elif kind == "comm_destroy":
            self.by_ptr.pop((ev.get("pid"), ev.get("comm")), None)
        return ev


def _ordered(builder: _Builder, paths, window: int = REORDER_WINDOW):
    """Complete events in time order (a window of ``window`` events evens out the per-CPU
    buffers' disorder; a call merged late, e.g. a long host wait, comes out when complete)."""
    heap: list = []
    seq = 0
    for path in paths:
        with open(path, "rb") as fh:
            for line in fh:
                for ev in builder.feed(line):
                    if ev.get("ev") not in HOT_KINDS:
                        ev = _normalize(ev)
                    heapq.heappush(heap, (_time_of(ev), seq, ev))
                    seq += 1
                    if len(heap) > window:
                        yield heapq.heappop(heap)[2]
    for ev in itertools.chain(builder.ring_events(), builder.unfinished()):
        heapq.heappush(heap, (_time_of(ev), seq, ev))
        seq += 1
    while heap:
        yield heapq.heappop(heap)[2]


def _jsonl_events(path: Path):
    try:
        fh = open(path, "rb")
    except OSError:
        return
    with fh:
        for line in fh:
            try:
                yield json.loads(line)
            except ValueError:
                continue


def postprocess(raw_dir: Path | None, out: Path, max_bytes: int, extra: list[Path] = (),
                call_returns: bool = True, spool: Spool | None = None) -> dict:
    """Raw tracer lines (and extra JSONL events, e.g. off-CPU samples) -> ``out`` (JSONL).

    Events come out in time order (``t0``, else ``t``). Should the file exceed
    ``max_bytes``, the oldest hot-path events (coll, host_wait, group, offcpu)
    are left out until it fits; rare events (inits, ids, destroys, TCP, tracer
    start/end) are always kept. Returns the summary recorded in the manifest."""
    out = Path(out)
    builder = _Builder(call_returns)
    comms = _Comms()
    paths = raw_files(raw_dir) if raw_dir is not None and Path(raw_dir).is_dir() else []
    streams = [_ordered(builder, paths)] + [_jsonl_events(Path(p)) for p in extra]
    counts: dict[str, int] = {}
    hot_sizes = array.array("Q")
    total = 0
    span = _Span()
    with open(out, "wb") as fh:
        for ev in heapq.merge(*streams, key=_time_of):
            ev = comms.apply(ev)
            line = (json.dumps(ev, separators=(",", ":")) + "\n").encode()
            fh.write(line)
            total += len(line)
            kind = ev.get("ev", "?")
            counts[kind] = counts.get(kind, 0) + 1
            span.add(kind, ev)
            if line.startswith(DROPPABLE):
                hot_sizes.append(len(line))
    dropped = 0
    if total > max_bytes:
        excess, n = total - max_bytes, 0
        for size in hot_sizes:
            if excess <= 0:
                break
            excess -= size
            n += 1
        tmp = out.with_name(out.name + ".tmp")
        skip = n
        with open(out, "rb") as src, open(tmp, "wb") as dst:
            for line in src:
                if skip and line.startswith(DROPPABLE):
                    skip -= 1
                    counts[line[7:line.index(b'"', 7)].decode()] -= 1   # the kind: the prefix matched
                    continue
                dst.write(line)
        os.replace(tmp, out)
        dropped = n
        if out.stat().st_size > max_bytes:   # rare events alone exceed the share: keep whole lines from the start
            with open(out, "rb") as fh:
                head = fh.read(max_bytes)
            os.truncate(out, head.rfind(b"\n") + 1)
    spool_dropped = spool.dropped_lines if spool else 0
    lost_records = 0
    if builder.records_made is not None:   # records the probes made that never reached the output: map full
        lost_records = max(0, builder.records_made - builder.records - spool_dropped)
    summary = {"events": sum(counts.values()), "bytes": out.stat().st_size,
               "dropped_for_budget": dropped + spool_dropped,
               "unparsable_lines": builder.bad_lines, "lost_events": builder.lost_events + lost_records,
               "hot_records": builder.records, "hot_records_made": builder.records_made,
               "orphan_returns": builder.orphan_returns,
               "attached_probes": builder.attached_probes, "call_returns": call_returns,
               "by_type": dict(sorted((k, v) for k, v in counts.items() if v))}
    if spool is not None and spool.dropped_segments:
        summary["raw_segments_dropped"] = spool.dropped_segments
    if builder.dumps:
        # ring mode: the hot path is complete from the oldest record of the first dump on (the
        # records before it were overwritten), when the ring went round at all
        wrapped = bool(builder.ring_made and builder.ring_slots and builder.ring_made > builder.ring_slots)
        summary["ring"] = {"dumps": builder.dumps, "slots": builder.ring_slots, "records_made": builder.ring_made,
                           "oldest_monotonic_ns": builder.ring_oldest[0] if builder.ring_oldest else None,
                           "wrapped": wrapped}
        if wrapped and builder.ring_oldest and span.start is not None:
            span.start = max(span.start, builder.ring_oldest[0])
    summary["span_monotonic_ns"] = span.result()
    summary["messages"] = builder.other_lines[:20]
    return summary


class _Span:
    """CLOCK_MONOTONIC [first, last] the tracer covered: from its start mark (else its first
    event) to its stop or end mark (else its last event time, returns included). Off-CPU
    samples come from capture's /proc reads, not the tracer: left out."""

    def __init__(self):
        self.start = self.stop = self.lo = self.hi = None

    def add(self, kind: str, ev: dict) -> None:
        if kind == "offcpu":
            return
        t = ev.get("t")
        if kind == "tracer_start" and isinstance(t, int):
            self.start = t if self.start is None else min(self.start, t)
        elif kind in ("tracer_stopped", "tracer_end") and isinstance(t, int):
            self.stop = t if self.stop is None else min(self.stop, t)
        for k in ("t0", "t", "t1"):
            v = ev.get(k)
            if isinstance(v, int) and v > 0:
                self.lo = v if self.lo is None else min(self.lo, v)
                self.hi = v if self.hi is None else max(self.hi, v)

    def result(self) -> list[int] | None:
        first = self.start if self.start is not None else self.lo
        last = self.stop if self.stop is not None else self.hi
        return [first, last] if first is not None and last is not None and first <= last else None
