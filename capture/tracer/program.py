"""The bpftrace tracer's program: render ``bpf/nccl.bt`` for this host.

Rendering is data-driven: the ABI position of every argument the tracer reads
is a row of the tables below, the template (``bpf/nccl.bt``) holds the probe
code once, and a block is kept only when what it needs exists here (an exported
symbol in a traced library, a tracepoint field of this kernel, kernel BTF, the
--no-call-returns option). The hot path's record keeping comes in two modes
(:func:`hot_macros`): flush (capture) and ring (capture --watch).

The program's output is handled by two other modules, so that nothing competes
with the job for the CPU while it runs: :mod:`capture.tracer.spool` copies
bpftrace's stdout into raw segment files during the capture, and
:mod:`capture.tracer.events` turns the raw lines into ``bpf/events.jsonl`` at
the end.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..elf import ElfError, exported_functions_cached

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"     # capture/tracer/program.py -> the repository's bpf/
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
MAX_NCCL_LIBS = 8       # NCCL library files one program traces (~41 probes each; a restart compiles them all)
HOLD_MAX_S = 120.0      # the longest a process held at its libnccl's mapping waits for the tracer (block lib_map);
                        # STALLSCOPE_HOLD_MAX_S overrides it (a test on a machine whose uprobes many tracers share)
FLUSH_MS = 500          # the hot-path record maps are printed this often
MAP_KEYS_MAX = 16384    # BPFTRACE_MAP_KEYS_MAX: records per flush interval (x2 buffers), open calls, ...
_REC0 = ("((int32)0, (int32)0, (uint64)0, (uint64)0, (uint64)0, (int32)0, (int32)0, (int32)0, (uint64)0, "
         "(uint64)0, (int32)0)")

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
    "known": "@known[(uint64)0] = 0;",
    "seen": "@seen[(uint64)0, (uint64)0] = 0;",
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
                 "known": "(uint64)0", "seen": "(uint64)0, (uint64)0",
                 "e0": "(int32)0, (uint64)0", "e1": "(int32)0, (uint64)0", "op": "(int32)0, (int32)0", "ep": "0",
                 "r": "(uint64)0", "rg": "0", "xq": "(uint64)0", "xw": "(uint64)0", "xr": "(uint64)0",
                 "xc": "0"}
MAP_KEEP = {"ep"}   # declared and kept (the current buffer's index), not deleted after the declaration

NETNS_BTF = "((struct sock *)args->skaddr)->__sk_common.skc_net.net->ns.inum"


# --------------------------------------------------------------------------- host features
def ensure_tracefs() -> str | None:
    """The tracefs mount point, mounting it when needed (root); None if unavailable."""
    for path in TRACEFS:
        if os.path.isdir(os.path.join(path, "events")):
            return path
    try:
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
                          "sched/sched_process_fork", "sched/sched_process_exit", "syscalls/sys_enter_mmap")) -> "KernelFeatures":
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
    known_inodes: set[int] = field(default_factory=set)    # ring mode: libnccl inodes already traced (block lib_map)
    hold: bool = False      # block lib_map stops a process that maps an untraced libnccl (bpftrace --unsafe)
    hold_cgroup: str | None = None     # ... only a process of this cgroup v2 folder (a test's)

    def fill_addresses(self) -> None:
        """The address of every symbol to attach to, from the libraries' .dynsym."""
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
        "KNOWN_INODES": (" ".join(f"@known[(uint64){i}] = 1;" for i in sorted(targets.known_inodes))
                         if "@known[" in script else ""),
        "HOLD": (f'(cgroup == cgroupid("{targets.hold_cgroup}") ? 1 : 0)' if targets.hold and targets.hold_cgroup
                 else "1" if targets.hold else "0"),
        # signal() is refused by bpftrace without --unsafe, even where never reached: in the program only with the hold
        "HOLD_STOP": 'if ($h) { signal("SIGSTOP"); }' if targets.hold else "",
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


def hold_setting(env=None) -> tuple[bool, str | None]:
    """``STALLSCOPE_HOLD`` (the watcher's block lib_map): ``on`` stops a process that maps a
    libnccl the tracer does not cover until the tracer covers it (at most HOLD_MAX_S), ``off``
    (the default) never stops one (its first seconds are then untraced), a cgroup v2 folder
    holds only that cgroup's processes (a test on a shared machine)."""
    v = (os.environ if env is None else env).get("STALLSCOPE_HOLD", "off").strip()
    if v in ("", "off", "0", "no"):
        return False, None
    if v.startswith("/"):
        return True, v
    return True, None


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
