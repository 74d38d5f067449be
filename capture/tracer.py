"""The bpftrace tracer: render ``bpf/nccl.bt`` for this host, turn its output into JSONL.

Rendering is data-driven: the ABI position of every argument the tracer reads
is a row of the tables below, the template (``bpf/nccl.bt``) holds the probe
code once, and a block is kept only when what it needs exists here (an exported
symbol in a traced library, a tracepoint field of this kernel, kernel BTF).

The output side (:class:`EventWriter`) reads bpftrace's stdout line by line and
writes one JSON object a line: entry and return events of one call are merged
(per thread and kind) into one object with ``t0``, ``t1`` and ``rc``; map dumps
become ``offcpu`` events; raw numbers get their names (TCP states); the byte
share of the budget is never exceeded.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import threading
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
TABLES = {"COLLECTIVES": COLLECTIVES, "INIT_RANK": INIT_RANK, "DESTROY": DESTROY, "GROUP": GROUP,
          "HOST_WAITS": HOST_WAITS}

NCCL_SYMBOLS = sorted({r["FN"] for t in (COLLECTIVES, INIT_RANK, DESTROY, GROUP) for r in t}
                      | {"ncclCommInitAll", "ncclCommSplit", "ncclGetUniqueId"})
CUDART_SYMBOLS = [r["FN"] for r in HOST_WAITS if r["LIB"] == "CUDART"]
CUDA_SYMBOLS = [r["FN"] for r in HOST_WAITS if r["LIB"] == "CUDA"]

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
    "want": "@want[(uint64)0] = 0;",
    "offs": "@offs[tid] = (nsecs, (uint64)0);",
}
MAP_DECL_KEYS = {"comm": "(uint64)0", "opc": "(uint64)0", "traced": "(uint64)0", "want": "(uint64)0"}

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


@dataclass
class KernelFeatures:
    """What the running kernel offers the tracer: tracepoints with their fields, BTF."""

    tracepoints: dict[str, str] = field(default_factory=dict)  # "tcp/tcp_send_reset" -> format text
    btf: bool = False

    @classmethod
    def probe(cls, names=("tcp/tcp_retransmit_skb", "tcp/tcp_send_reset", "tcp/tcp_receive_reset",
                          "sock/inet_sock_set_state", "sched/sched_switch",
                          "sched/sched_process_fork")) -> "KernelFeatures":
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
    traced_pids: list[int] = field(default_factory=list)   # known NCCL processes (host waits, off-CPU)

    def libs(self, kind: str) -> dict[str, set[str]]:
        return {"NCCL": self.nccl, "CUDART": self.cudart, "CUDA": self.cuda}[kind]


_BLOCK_RE = re.compile(r"^// @block (\S+)(.*)$", re.M)
_ATTACH_RE = re.compile(r"^(uprobe|uretprobe):(NCCL|CUDART|CUDA):(\w+),?\s*$")
_PLACEHOLDER_RE = re.compile(r"\{([A-Z_]+)\}")


def _quote_path(path: str) -> str:
    if re.fullmatch(r"[\w./+-]+", path):
        return path
    return '"' + path.replace('"', '\\"') + '"'


def _requirement_ok(req: str, targets: TraceTargets, feats: KernelFeatures) -> bool:
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
                    points.append(f"{ptype}:{_quote_path(path)}:{sym}")
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


def render_script(targets: TraceTargets, feats: KernelFeatures, offcpu_every_s: int = 2,
                  template: str | None = None) -> tuple[str, list[str]]:
    """The bpftrace program for this host, and the names of the blocks kept."""
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
        if not all(_requirement_ok(r, targets, feats) for r in reqs):
            continue
        rows = TABLES[table] if table else [{}]
        for row in rows:
            inst = _PLACEHOLDER_RE.sub(lambda mm: str(row[mm.group(1)]) if mm.group(1) in row else mm.group(0), body)
            inst = _expand_attach_points(inst, targets)
            if inst is None:
                continue
            inst = _apply_pid_filter(inst, bool(targets.want_pids))
            blocks.append(inst)
            kept_names.append(name + (f":{row['FN']}" if "FN" in row else ""))
    script = "\n".join(blocks)
    has_offcpu = "@offcpu[" in script
    used = sorted(set(re.findall(r"@(\w+)\[", script)))
    decls = []
    for name in used:
        if name in MAP_DECLS:
            key = MAP_DECL_KEYS.get(name, "tid")
            decls.append(f"{MAP_DECLS[name]} delete(@{name}[{key}]);")
    fill = {
        "MAP_DECLS": "\n  ".join(decls),
        "WANT_PIDS": " ".join(f"@want[(uint64){p}] = 1;" for p in targets.want_pids),
        "TRACED_PIDS": " ".join(f"@traced[(uint64){p}] = 1;" for p in targets.traced_pids),
        "NETNS": NETNS_BTF if feats.btf else "0",
        "OFFCPU_EVERY": str(max(1, int(offcpu_every_s))),
        "OFFCPU_FINAL": ('printf("{\\"ev\\":\\"offcpu_dump\\",\\"t\\":%lu}\\n", nsecs); print(@offcpu); '
                         'printf("{\\"ev\\":\\"offcpu_dump_end\\",\\"t\\":%lu}\\n", nsecs);') if has_offcpu else "",
        "CLEAR_MAPS": " ".join(f"clear(@{n});" for n in used),
    }
    script = _PLACEHOLDER_RE.sub(lambda mm: fill.get(mm.group(1), mm.group(0)), script)
    header = ("// generated by stallscope capture from bpf/nccl.bt; blocks: " + ", ".join(kept_names) + "\n")
    return header + script, kept_names


def probes_expected(targets: TraceTargets) -> int:
    return sum(len(s) for s in targets.nccl.values())


# --------------------------------------------------------------------------- output
_MAP_LINE_RE = re.compile(r"^@offcpu\[(\d+),\s*(\d+)\]:\s*(\d+)\s*$")


def _ipv6_from_hex(h: str) -> str:
    try:
        return str(ipaddress.IPv6Address(bytes.fromhex(h)))
    except ValueError:
        return h


class EventWriter:
    """bpftrace stdout -> ``bpf/events.jsonl``: merge entry/return, name states, cap bytes.

    Thread-safe counters for the progress line. ``feed(line)`` per stdout line,
    ``close()`` at the end writes calls still open (``t1`` null: never returned).
    """

    OPEN_KINDS = {"coll": "coll", "comm_init": "init", "comm_destroy": "destroy", "group": "group",
                  "host_wait": "host_wait"}

    def __init__(self, path: Path, max_bytes: int, tail_reserve: float = 0.1):
        self.path = Path(path)
        self.fh = open(self.path, "w", encoding="utf-8")
        self.max_bytes = max(0, int(max_bytes))
        self.stream_cap = int(self.max_bytes * (1 - tail_reserve))
        self.bytes = 0
        self.events = 0
        self.dropped = 0
        self.bad_lines = 0
        self.other_lines: list[str] = []   # bpftrace's own messages (Attaching N probes, Lost events)
        self.ready = threading.Event()
        self.ended = False
        self.lost_events = 0
        self.attached_probes: int | None = None
        self.counts: dict[str, int] = {}
        self._pending: dict[tuple, list[dict]] = {}   # (tid, kind) -> entry events awaiting "ret"
        self._orphans: dict[tuple, list[dict]] = {}   # "ret" seen before its entry (per-CPU buffers)
        self._offcpu_t: int | None = None
        self._lock = threading.Lock()

    # -- writing
    def _write(self, ev: dict, final: bool = False) -> None:
        line = json.dumps(ev, separators=(",", ":")) + "\n"
        cap = self.max_bytes if final else self.stream_cap
        n = len(line.encode())
        with self._lock:
            if self.bytes + n > cap:
                self.dropped += 1
                return
            self.fh.write(line)
            self.bytes += n
            self.events += 1
            self.counts[ev.get("ev", "?")] = self.counts.get(ev.get("ev", "?"), 0) + 1

    # -- normalisation
    @staticmethod
    def _normalize(ev: dict) -> dict:
        known = ev.pop("known", None)
        if known is not None:
            if known == 0:  # communicator created before the tracer attached
                ev["rank"] = ev["nranks"] = None
                ev["comm_id_hash"] = None
            elif known == 2:  # ncclCommSplit child: rank known only across ranks
                ev["rank"] = ev["nranks"] = None
                ev["comm_id_source"] = "split"
        for key in ("state", "oldstate", "newstate"):
            if isinstance(ev.get(key), int) and ev["ev"] != "coll":
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

    # -- merging
    def _merge(self, entry: dict, ret: dict) -> dict:
        entry["t1"] = ret["t1"]
        entry["rc"] = ret.get("rc")
        if ret.get("comm") and ret["comm"] != "0x0":
            entry["comm"] = ret["comm"]
        return entry

    def feed(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        if line.startswith("{"):
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                self.bad_lines += 1
                return
            self._handle(ev)
            return
        m = _MAP_LINE_RE.match(line)
        if m:
            pid, tid, ns = map(int, m.groups())
            self._write({"ev": "offcpu", "t": self._offcpu_t, "pid": pid, "tid": tid, "ns": ns},
                        final=self.ended)
            return
        if line.startswith("Attaching "):
            mm = re.match(r"Attaching (\d+) probe", line)
            if mm:
                self.attached_probes = int(mm.group(1))
        mm = re.search(r"Lost (\d+) events", line)
        if mm:
            self.lost_events += int(mm.group(1))
        if len(self.other_lines) < 200:
            self.other_lines.append(line)

    def _handle(self, ev: dict) -> None:
        kind = ev.get("ev")
        if kind == "tracer_start":
            self.ready.set()
            self._write(ev)
            return
        if kind == "tracer_end":
            self.ended = True
            self._write(ev, final=True)
            return
        if kind == "offcpu_dump":
            self._offcpu_t = ev.get("t")
            if self.ended or ev.get("t") is None:
                pass
            return
        if kind == "offcpu_dump_end":
            return
        if kind == "ret":
            key = (ev.get("tid"), ev.get("k"))
            stack = self._pending.get(key)
            if stack:
                entry = stack.pop()
                if not stack:
                    del self._pending[key]
                self._write(self._normalize(self._merge(entry, ev)))
            else:
                self._orphans.setdefault(key, []).append(ev)
            return
        open_kind = self.OPEN_KINDS.get(kind)
        if open_kind and "t1" not in ev:
            key = (ev.get("tid"), open_kind)
            orphans = self._orphans.get(key)
            if orphans:
                # a return that overtook its entry (another CPU's buffer): the earliest one after t0
                cands = [r for r in orphans if r.get("t1", 0) >= ev.get("t0", 0)]
                if cands:
                    ret = min(cands, key=lambda r: r["t1"])
                    orphans.remove(ret)
                    if not orphans:
                        del self._orphans[key]
                    self._write(self._normalize(self._merge(ev, ret)))
                    return
            self._pending.setdefault(key, []).append(ev)
            return
        self._write(self._normalize(ev))

    def close(self) -> None:
        """Write calls that never returned (t1 null) and close the file."""
        for stack in self._pending.values():
            for entry in stack:
                entry["t1"] = None
                entry["rc"] = None
                entry["returned"] = False
                self._write(self._normalize(entry), final=True)
        self._pending.clear()
        with self._lock:
            self.fh.close()

    def summary(self) -> dict:
        return {"events": self.events, "bytes": self.bytes, "dropped_for_budget": self.dropped,
                "unparsable_lines": self.bad_lines, "lost_events": self.lost_events,
                "attached_probes": self.attached_probes, "by_type": dict(sorted(self.counts.items()))}
