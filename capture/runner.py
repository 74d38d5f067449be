"""``run_capture``: one host's bundle, from discovery to the tar.gz.

Phases: discover the job's processes → start snapshots (concurrently) and the
continuous collectors (tracer, tcpdump per interface, nccl-tests) → capture
until ``--duration`` or SIGINT/SIGTERM, rescanning for new processes and
sampling the clocks → stop every child (SIGINT first, so they flush) → end
snapshots, attachments, process facts → manifest → tar.gz within the budget.
"""
from __future__ import annotations

import concurrent.futures as cf
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from . import bundle as bd
from . import children, procs, tracer
from .collectors import COLLECTORS, Collector
from . import collectors as colmod

STDERR_TAIL = 2000
LOG_CAP = 256 * 1024


class CaptureUsageError(ValueError):
    """Bad options (exit code 2)."""


@dataclass
class CaptureOptions:
    output: str | None = None
    duration_s: float = 120.0
    pids: list[int] = field(default_factory=list)
    ifaces: list[str] = field(default_factory=list)
    max_bytes: int = 2 << 30
    nccl_libs: list[str] = field(default_factory=list)
    nccl_tests: str | None = None
    attach: list[str] = field(default_factory=list)
    bpf: bool = True
    pcap: bool = True
    snaplen: int = 128
    rescan_s: float | None = None   # default: 0.5 s with --pid (descendants only), 2 s for a full /proc scan
    clock_every_s: float = 5.0
    progress: str = "auto"          # auto | tty | lines | off
    ready_timeout_s: float = 90.0
    pcap_slots: int = 4             # interfaces the pcap share is split into (at least)


@dataclass
class CaptureResult:
    path: Path
    exit_code: int
    manifest: dict


@dataclass
class NetNs:
    inode: int
    label: str
    pid: int | str                  # a process inside it ("self" for capture's own)
    own: bool
    name: str | None = None
    ifaces: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)


def clock_sample() -> dict:
    """CLOCK_MONOTONIC and CLOCK_REALTIME read together: the tightest of three brackets."""
    best = None
    for _ in range(3):
        m0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r = time.time_ns()
        m1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if best is None or m1 - m0 < best[2]:
            best = ((m0 + m1) // 2, r, m1 - m0)
    return {"monotonic_ns": best[0], "realtime_ns": best[1], "uncertainty_ns": best[2]}


def _tail(data: bytes | str, n: int = STDERR_TAIL) -> str:
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    data = data.strip()
    lines = [l for l in data.splitlines() if "RLIMIT_MEMLOCK" not in l]  # bpftrace's harmless warning
    data = "\n".join(lines)
    return data[-n:]


def _netns_names() -> dict[int, str]:
    out = {}
    for p in glob.glob("/run/netns/*"):
        try:
            out[os.stat(p).st_ino] = os.path.basename(p)
        except OSError:
            pass
    return out


class Capture:
    def __init__(self, opts: CaptureOptions, stderr=None):
        self.o = opts
        self.err = stderr or sys.stderr
        self.is_root = os.geteuid() == 0
        self.stop_evt = threading.Event()
        self.started_ns = time.time_ns()
        self.host = bd.short_host()
        self.collectors: dict[str, dict] = {}
        self.clock: list[dict] = []
        self.notes: list[str] = []
        self.procs: dict[int, procs.ProcInfo] = {}
        self.netns: dict[int, NetNs] = {}
        self.own_ns = procs.netns_inode("self")
        self.ns_names = _netns_names()
        self.pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="snapshot")
        self.futures: list[cf.Future] = []
        self.lock = threading.Lock()
        self.tracer_proc: subprocess.Popen | None = None
        self.tracer_writer: tracer.EventWriter | None = None
        self.tracer_thread: threading.Thread | None = None
        self.tracer_libs: set[str] = set()
        self.tcpdumps: dict[tuple[int, str], dict] = {}
        self.nccl_tests: dict | None = None
        self.pcap_slot_bytes = 0
        self.last_progress = 0.0

    # ------------------------------------------------------------------ helpers
    def log(self, msg: str) -> None:
        if self.o.progress != "off":
            print(f"stallscope capture: {msg}", file=self.err, flush=True)

    def record(self, key: str, **kw) -> dict:
        with self.lock:
            rec = self.collectors.setdefault(key, {"status": None, "reason": None, "command": None, "rc": None,
                                                   "files": [], "stderr_tail": "", "started_ns": None,
                                                   "ended_ns": None})
            rec.update(kw)
            return rec

    def skip_reason(self, c: Collector) -> str | None:
        if c.needs_root and not self.is_root:
            return "needs root"
        if c.tool and shutil.which(c.tool) is None:
            return f"{c.tool} not found on PATH"
        return None

    def ns_prefix(self, ns: NetNs) -> list[str]:
        return [] if ns.own else ["nsenter", f"--net=/proc/{self.live_pid(ns) or ns.pid}/ns/net"]

    def live_pid(self, ns: NetNs) -> int | str | None:
        """A process still inside ns (namespaces of finished jobs go away with them)."""
        if ns.own:
            return "self"
        for pid in [ns.pid] + ns.pids:
            if procs.netns_inode(pid) == ns.inode:
                return pid
        return None

    def rel(self, p: Path) -> str:
        return p.relative_to(self.staging).as_posix()

    # ------------------------------------------------------------------ discovery
    def ensure_netns(self, inode: int | None, pid: int | str) -> NetNs:
        if inode is None or inode == self.own_ns:
            inode = self.own_ns or 0
        ns = self.netns.get(inode)
        if ns is None:
            if inode not in self.ns_names:
                self.ns_names = _netns_names()
            own = inode == self.own_ns
            name = None if own else self.ns_names.get(inode)
            label = "host" if own else f"netns-{name}" if name and re.fullmatch(r"[\w.-]+", name) else f"netns-{inode}"
            ns = NetNs(inode=inode, label=label, pid="self" if own else pid, own=own, name=name)
            self.netns[inode] = ns
        return ns

    def ifaces_for(self, ns: NetNs) -> list[str]:
        avail = procs.netns_interfaces(ns.pid)
        if self.o.ifaces:
            return [i for i in self.o.ifaces if i in avail]
        chosen: list[str] = []
        for pid in ns.pids:
            spec = self.procs[pid].env.get("NCCL_SOCKET_IFNAME")
            for i in procs.select_ifaces(spec, avail):
                if i not in chosen:
                    chosen.append(i)
        if not chosen:
            addrs = set()
            for pid in ns.pids:
                for s in procs.tcp_sockets(pid):
                    if s["state"] == "ESTABLISHED" and not s["saddr"].startswith("127.") and s["saddr"] != "::1":
                        addrs.add(s["saddr"])
            chosen = procs.ifaces_of_addresses(ns.pid, addrs)
        return chosen

    def discover(self, initial: bool) -> list[procs.ProcInfo]:
        found = procs.discover(tracer.NCCL_SYMBOLS, pids=self.o.pids or None,
                               nccl_lib_override=self.o.nccl_libs, skip=set(self.procs))
        fresh = []
        for info in found:
            self.procs[info.pid] = info
            ns = self.ensure_netns(info.netns_inode, info.pid)
            ns.pids.append(info.pid)
            fresh.append(info)
            new_libs = {l.host_path for l in info.nccl_libs} - self.tracer_libs
            if not initial and new_libs and self.tracer_proc is not None:
                self.notes.append(f"pid {info.pid} maps {sorted(new_libs)} that appeared after the tracer "
                                  "started: its NCCL calls are not traced (use --nccl-lib)")
        return fresh

    # ------------------------------------------------------------------ snapshots
    def snapshot_jobs(self, phase: str, nss=None, ifaces=None, pids=None):
        """(collector, context) pairs of a phase; limited to given scopes when set."""
        jobs = []
        for c in COLLECTORS:
            if phase not in c.when:
                continue
            if c.scope == "host" and nss is None and ifaces is None and pids is None:
                jobs.append((c, {"pid": "self", "ns": self.ensure_netns(self.own_ns, "self"), "phase": phase}))
            elif c.scope == "netns":
                for ns in (nss if nss is not None else self.netns.values()):
                    jobs.append((c, {"pid": ns.pid, "ns": ns, "phase": phase}))
            elif c.scope == "iface":
                for ns, iface in (ifaces if ifaces is not None else
                                  [(ns, i) for ns in self.netns.values() for i in ns.ifaces]):
                    jobs.append((c, {"pid": ns.pid, "ns": ns, "iface": iface, "phase": phase}))
            elif c.scope == "process":
                for pid in (pids if pids is not None else list(self.procs)):
                    info = self.procs[pid]
                    if c.python_only and not info.python:
                        continue
                    jobs.append((c, {"pid": pid, "ns": self.ensure_netns(info.netns_inode, pid), "phase": phase}))
        return jobs

    def submit_snapshots(self, jobs) -> None:
        for c, ctx in jobs:
            if c.when == ("continuous",) or c.name == "attachments":
                continue
            self.futures.append(self.pool.submit(self.run_snapshot, c, ctx))

    def wait_snapshots(self, timeout: float = 120) -> None:
        futures, self.futures = self.futures, []
        cf.wait(futures, timeout=timeout)

    def instance_key(self, c: Collector, ctx: dict) -> str:
        key = c.name
        if c.scope in ("netns", "iface"):
            key += f"@{ctx['ns'].label}"
        if c.scope == "iface":
            key += f"/{ctx['iface']}"
        if c.scope == "process":
            key += f"@pid{ctx['pid']}"
        return f"{key}:{ctx['phase']}"

    def fill(self, template: str, ctx: dict) -> str:
        return template.format(pid=ctx.get("pid", "self"), iface=ctx.get("iface", ""), phase=ctx["phase"],
                               ns=ctx["ns"].label if ctx.get("ns") else "host", snaplen=self.o.snaplen)

    def run_snapshot(self, c: Collector, ctx: dict) -> None:
        key = self.instance_key(c, ctx)
        t0 = time.time_ns()
        reason = self.skip_reason(c)
        ns = ctx.get("ns")
        if reason is None and ns is not None and not ns.own and c.argv and not self.is_root:
            reason = "entering another network namespace needs root"
        if reason is None and c.scope in ("netns", "iface") and ns is not None:
            live = self.live_pid(ns)
            if live is None:
                reason = "network namespace gone (its processes exited)"
            else:
                ctx = dict(ctx, pid=live)
        if reason is None and c.scope == "process" and not os.path.isdir(f"/proc/{ctx['pid']}"):
            reason = "process exited"
        if reason:
            self.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=time.time_ns())
            return
        out = self.staging / self.fill(c.out, ctx)
        try:
            if c.argv:
                argv = self.ns_prefix(ns) + [self.fill(a, ctx) for a in c.argv]
                self.record(key, command=shlex.join(argv), started_ns=t0)
                rc, so, se = children.run(argv, timeout=60)
                n, trunc = bd.write_capped(out, so, self.budget, c.per_file_max)
                status = "ok" if rc in c.ok_rc else ("skipped" if c.optional else "failed")
                reason = None
                if status != "ok":
                    reason = (f"{c.optional}: " if c.optional else "") + f"exit code {rc}"
                    if ns is not None and not ns.own and self.live_pid(ns) is None:
                        status, reason = "skipped", "network namespace gone (its processes exited)"
                if trunc:
                    reason = ((reason + "; ") if reason else "") + "output truncated to the byte budget"
                self.record(key, status=status, reason=reason, rc=rc, files=[self.rel(out)] if n or out.exists() else [],
                            stderr_tail=_tail(se), ended_ns=time.time_ns())
                return
            fn = getattr(colmod, c.func)
            self.record(key, command=f"stallscope:{c.func}({ctx.get('pid', '')})", started_ns=t0)
            try:
                data = fn(ctx)
            except FileNotFoundError:
                if c.scope in ("netns", "iface") and ns is not None and self.live_pid(ns) is None:
                    raise LookupError("network namespace gone (its processes exited)") from None
                raise
            if isinstance(data, bytes):
                data = {"": data}
            files, truncated = [], False
            for suffix, blob in data.items():
                if c.out.endswith(("/{phase}",)) or suffix.startswith("/"):
                    path = Path(str(out) + suffix)
                else:
                    stem, dot, ext = str(out).rpartition(".")
                    path = Path(f"{stem}{suffix}.{ext}") if dot else Path(str(out) + suffix)
                _, t = bd.write_capped(path, blob, self.budget, c.per_file_max)
                truncated |= t
                files.append(self.rel(path))
            self.record(key, status="ok", rc=0, files=files, ended_ns=time.time_ns(),
                        reason="output truncated to the byte budget" if truncated else None)
        except LookupError as e:   # does not apply here (no IB devices, ...)
            self.record(key, status="skipped", reason=str(e).strip("'\""), ended_ns=time.time_ns())
        except Exception as e:  # noqa: BLE001 - a collector failing must not stop the capture
            self.record(key, status="failed", reason=f"{type(e).__name__}: {e}", ended_ns=time.time_ns())

    # ------------------------------------------------------------------ tracer
    def start_tracer(self) -> None:
        c = colmod.by_name()["tracer"]
        key = "tracer"
        t0 = time.time_ns()
        reason = "--no-bpf" if not self.o.bpf else self.skip_reason(c)
        if reason:
            self.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=t0)
            return
        # --pid roots and their descendants alive now; later forks are followed in the kernel
        want = sorted(set(self.o.pids) | procs.descendants(self.o.pids)) if self.o.pids else []
        targets = tracer.TraceTargets(want_pids=want)
        for info in self.procs.values():
            for lib in info.nccl_libs:
                targets.nccl.setdefault(lib.host_path, set()).update(lib.symbols or set(tracer.NCCL_SYMBOLS))
            for lib in info.cudart_libs:
                targets.cudart.setdefault(lib.host_path, set()).update(lib.symbols & set(tracer.CUDART_SYMBOLS))
            for lib in info.cuda_libs:
                targets.cuda.setdefault(lib.host_path, set()).update(lib.symbols & set(tracer.CUDA_SYMBOLS))
            targets.traced_pids.append(info.pid)
        from .elf import ElfError, exported_functions_cached
        for path in self.o.nccl_libs:
            try:
                syms = set(exported_functions_cached(path)) & set(tracer.NCCL_SYMBOLS)
            except (OSError, ElfError) as e:
                self.record(key, status="failed", reason=f"--nccl-lib {path}: {e}", started_ns=t0, ended_ns=t0)
                return
            targets.nccl.setdefault(str(Path(path).resolve()), set()).update(syms)
            # processes not started yet: look for the CUDA runtime next to the given libnccl
            for sib in sorted(glob.glob(str(Path(path).resolve().parent / "libcudart.so*"))):
                try:
                    cs = set(exported_functions_cached(sib)) & set(tracer.CUDART_SYMBOLS)
                except (OSError, ElfError):
                    continue
                real = str(Path(sib).resolve())
                if cs and not any(os.path.samefile(real, k) for k in targets.cudart):
                    targets.cudart[real] = cs
        self.tracer_libs = set(targets.nccl)
        feats = tracer.KernelFeatures.probe()
        script, blocks = tracer.render_script(targets, feats)
        bpf_dir = self.staging / "bpf"
        bpf_dir.mkdir(parents=True, exist_ok=True)
        script_path = bpf_dir / "nccl.generated.bt"
        script_path.write_text(script)
        self.budget.take(len(script) + 1024)
        argv = ["bpftrace", "-B", "line", str(script_path)]
        self.tracer_stderr = open(bpf_dir / "tracer.stderr.txt", "wb")
        self.tracer_writer = tracer.EventWriter(bpf_dir / "events.jsonl", self.budget.tracer)
        env = dict(os.environ, BPFTRACE_PERF_RB_PAGES=os.environ.get("BPFTRACE_PERF_RB_PAGES", "256"))
        self.tracer_proc = children.spawn(argv, stdout=subprocess.PIPE, stderr=self.tracer_stderr, env=env)
        proc, writer = self.tracer_proc, self.tracer_writer

        def pump():
            for raw in proc.stdout:
                writer.feed(raw.decode("utf-8", "replace"))
        self.tracer_thread = threading.Thread(target=pump, name="tracer-output", daemon=True)
        self.tracer_thread.start()
        self.record(key, status="running", command=shlex.join(["bpftrace", "-B", "line", "bpf/nccl.generated.bt"]),
                    started_ns=t0, files=["bpf/events.jsonl", "bpf/nccl.generated.bt", "bpf/tracer.stderr.txt"],
                    libraries=sorted(targets.nccl), cuda_libraries=sorted(set(targets.cudart) | set(targets.cuda)),
                    blocks=blocks, kernel_tracepoints=sorted(feats.tracepoints), btf=feats.btf)

    def wait_tracer_ready(self) -> bool:
        if self.tracer_proc is None:
            return False
        deadline = time.monotonic() + self.o.ready_timeout_s
        while time.monotonic() < deadline and not self.stop_evt.is_set():
            if self.tracer_writer.ready.wait(0.1):
                return True
            if self.tracer_proc.poll() is not None:
                break
        return self.tracer_writer.ready.is_set()

    def stop_tracer(self) -> None:
        if self.tracer_proc is None:
            return
        proc = self.tracer_proc
        alive = proc.poll() is None
        rc = children.stop(proc, signal.SIGINT, grace_s=10)
        self.tracer_thread.join(timeout=15)
        self.tracer_writer.close()
        self.tracer_stderr.close()
        err = (self.staging / "bpf/tracer.stderr.txt").read_bytes()
        bd.truncate_file(self.staging / "bpf/tracer.stderr.txt", LOG_CAP)
        summ = self.tracer_writer.summary()
        ok = self.tracer_writer.ready.is_set() and alive
        reason = None
        if not self.tracer_writer.ready.is_set():
            reason = "bpftrace did not start: " + _tail(err, 600)
        elif not alive:
            reason = f"bpftrace exited early (code {proc.returncode})"
        elif summ["dropped_for_budget"]:
            reason = f"{summ['dropped_for_budget']} events dropped: tracer byte share used"
        if summ["lost_events"]:
            reason = ((reason + "; ") if reason else "") + f"bpftrace lost {summ['lost_events']} events"
        self.record("tracer", status="ok" if ok else "failed", reason=reason, rc=rc, stderr_tail=_tail(err),
                    ended_ns=time.time_ns(), summary=summ, tracer_messages=self.tracer_writer.other_lines[:20])

    # ------------------------------------------------------------------ tcpdump
    def ring_plan(self) -> list[str]:
        """tcpdump options keeping one interface's files within its slot of the pcap share."""
        share = self.pcap_slot_bytes
        rec = 16 + self.o.snaplen
        if share >= 2_000_000 + 4 * rec:
            c_mb = max(1, share // 4_000_000)
            w = share // (c_mb * 1_000_000 + rec + 24 + 2 * bd.TAR_BLOCK)
            if w >= 2:
                return ["-C", str(c_mb), "-W", str(min(w, 1000))]
        count = max(1, (share - 24 - 2 * bd.TAR_BLOCK) // rec)
        return ["-c", str(count)]

    def start_tcpdump(self, ns: NetNs, iface: str) -> None:
        c = colmod.by_name()["tcpdump"]
        key = f"tcpdump@{ns.label}/{iface}"
        if (ns.inode, iface) in self.tcpdumps:
            return
        t0 = time.time_ns()
        reason = "--no-pcap" if not self.o.pcap else self.skip_reason(c)
        if reason is None and len(self.tcpdumps) >= self.n_slots:
            reason = f"pcap share already split over {self.n_slots} interfaces (raise --max-bytes)"
        if reason:
            self.record(key, status="skipped", reason=reason, started_ns=t0, ended_ns=t0)
            self.tcpdumps[(ns.inode, iface)] = {"proc": None, "key": key}
            return
        ctx = {"ns": ns, "iface": iface, "phase": "continuous", "pid": ns.pid}
        out = self.staging / self.fill(c.out, ctx)
        out.parent.mkdir(parents=True, exist_ok=True)
        errf = self.staging / "logs" / f"tcpdump-{ns.label}-{iface}.stderr.txt"
        errf.parent.mkdir(parents=True, exist_ok=True)
        argv = self.ns_prefix(ns) + [self.fill(a, ctx) for a in c.argv] + self.ring_plan() + ["-w", str(out)]
        fh = open(errf, "wb")
        proc = children.spawn(argv, stdout=subprocess.DEVNULL, stderr=fh)
        self.tcpdumps[(ns.inode, iface)] = {"proc": proc, "key": key, "out": out, "err": errf, "fh": fh,
                                            "packets": 0, "ns": ns, "iface": iface}
        shown = [a if a != str(out) else self.rel(out) for a in argv]
        self.record(key, status="running", command=shlex.join(shown), started_ns=t0)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and proc.poll() is None:
            if b"listening on" in errf.read_bytes():
                break
            time.sleep(0.05)

    def tcpdump_packets(self) -> int:
        """Packets written so far, counted from the pcap record headers (ring files included)."""
        total = 0
        for t in self.tcpdumps.values():
            if not t.get("proc"):
                continue
            n = 0
            for f in t["out"].parent.glob(t["out"].name + "*"):
                n += bd.pcap_records(f)
            t["packets"] = max(t.get("packets", 0), n)
            total += t["packets"]
        return total

    def stop_tcpdumps(self) -> None:
        live = [t for t in self.tcpdumps.values() if t.get("proc") is not None]
        for t in live:
            if t["proc"].poll() is None:
                children.kill_group(t["proc"], signal.SIGINT)
        for t in live:
            p = t["proc"]
            was_alive_rc = p.poll()
            rc = children.stop(p, signal.SIGINT, grace_s=5)
            t["fh"].close()
            err = t["err"].read_bytes()
            bd.truncate_file(t["err"], LOG_CAP)
            files = self.finish_ring(t["out"])
            m = re.findall(rb"(\d+) packets? captured", err)
            drop = re.findall(rb"(\d+) packets? dropped by kernel", err)
            packets = sum(bd.pcap_records(self.staging / f) for f in files)
            if m:
                packets = int(m[-1])
            t["packets"] = packets
            started = b"listening on" in err
            ok = started and (rc == 0 or rc is None or rc < 0)
            reason = None
            if not ok:
                reason = f"tcpdump failed: {_tail(err, 400)}"
            elif rc is not None and rc < 0 and rc != -signal.SIGINT:
                reason = f"tcpdump ended by signal {-rc}"
                if self.live_pid(t["ns"]) is None:
                    reason += " when its network namespace was torn down; the file holds what it had written"
            elif was_alive_rc is not None and rc == 0 and "-c" in self.ring_plan():
                reason = "packet count limit of the byte budget reached (first packets kept)"
            self.record(t["key"], status="ok" if ok else "failed", rc=rc, reason=reason,
                        files=files + [self.rel(t["err"])], stderr_tail=_tail(err), ended_ns=time.time_ns(),
                        packets=packets, dropped_by_kernel=int(drop[-1]) if drop else None,
                        netns=t["ns"].label, iface=t["iface"])

    def finish_ring(self, out: Path) -> list[str]:
        """tcpdump -W names files x.pcap0, x.pcap1...; rename oldest-first to x-000.pcap."""
        ring = sorted((p for p in out.parent.glob(out.name + "*") if re.fullmatch(re.escape(out.name) + r"\d+", p.name)),
                      key=lambda p: p.stat().st_mtime_ns)
        if not ring:
            return [self.rel(out)] if out.exists() else []
        files = []
        stem = out.name[:-5] if out.name.endswith(".pcap") else out.name
        for i, p in enumerate(ring):
            dst = out.parent / f"{stem}-{i:03d}.pcap"
            p.rename(dst)
            files.append(self.rel(dst))
        return files

    # ------------------------------------------------------------------ nccl-tests
    def start_nccl_tests(self) -> None:
        if not self.o.nccl_tests:
            return
        key = "nccl-tests"
        out = self.staging / "nccl-tests" / "output.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        limit = self.budget.take(16 << 20)
        argv = ["sh", "-c", self.o.nccl_tests]
        proc = children.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        result = {"proc": proc, "out": out, "bytes": 0, "truncated": False}

        def pump():
            result["bytes"], result["truncated"] = bd.stream_copy(proc.stdout, out, limit)
        th = threading.Thread(target=pump, daemon=True)
        th.start()
        result["thread"] = th
        self.nccl_tests = result
        self.record(key, status="running", command=shlex.join(argv), started_ns=time.time_ns(),
                    files=[self.rel(out)])

    def stop_nccl_tests(self) -> None:
        t = self.nccl_tests
        if not t:
            return
        finished = t["proc"].poll() is not None
        rc = children.stop(t["proc"], signal.SIGINT, grace_s=3)
        t["thread"].join(timeout=5)
        reason = None if finished else "still running at the end of the capture: stopped"
        if t["truncated"]:
            reason = ((reason + "; ") if reason else "") + "output truncated to the byte budget"
        status = "ok" if (rc == 0 or not finished) else "failed"
        if finished and rc != 0:
            reason = f"exit code {rc}"
        self.record("nccl-tests", status=status, rc=rc, reason=reason, ended_ns=time.time_ns())

    # ------------------------------------------------------------------ attachments
    def attachment_sources(self) -> tuple[list[tuple[str, str]], list[str]]:
        """(path, why) of files to attach, and patterns that matched nothing."""
        found, missing = [], []
        for pat in self.o.attach:
            hits = sorted(glob.glob(pat)) or ([pat] if os.path.isfile(pat) else [])
            if not hits:
                missing.append(pat)
            found += [(h, "--attach") for h in hits if os.path.isfile(h)]
        for pid, info in self.procs.items():
            e = info.env
            root = f"/proc/{pid}/root"
            cwd = f"/proc/{pid}/cwd"

            def resolve(p):
                base = p if p.startswith("/") else os.path.join(cwd, p)
                return base if os.path.exists(os.path.dirname(base) or "/") else root + p
            dbg = e.get("NCCL_DEBUG_FILE")
            if dbg:
                pat = resolve(dbg.replace("%h", "*").replace("%p", str(pid)))
                found += [(h, f"NCCL_DEBUG_FILE of pid {pid}") for h in sorted(glob.glob(pat))]
            if e.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0") not in ("", "0") or e.get("TORCH_NCCL_DUMP_ON_TIMEOUT"):
                prefix = e.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/tmp/nccl_trace_rank_")
                found += [(h, f"Flight Recorder dump of pid {pid}") for h in sorted(glob.glob(resolve(prefix) + "*"))]
        seen, out = set(), []
        for path, why in found:
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                out.append((path, why))
        return out, missing

    def collect_attachments(self) -> None:
        key = "attachments:end"
        t0 = time.time_ns()
        sources, missing = self.attachment_sources()
        if not sources and not missing:
            self.record(key, status="skipped", reason="nothing to attach (no --attach, no NCCL_DEBUG_FILE or "
                        "Flight Recorder dumps in the processes' environment)", started_ns=t0, ended_ns=t0)
            return
        files, notes = [], []
        for path, why in sources:
            try:
                with open(path, "rb") as fh:
                    head = fh.read(4096)
                name = os.path.basename(path)
                if head[:1] == b"\x80" or "nccl_trace_rank" in name:
                    folder = "flight-recorder"
                elif b"nccl-tests" in head or b"Avg bus bandwidth" in head or b"# nThread" in head:
                    folder = "nccl-tests"
                else:
                    folder = "logs"
                dst = self.staging / folder / name
                i = 1
                while dst.exists():
                    dst = self.staging / folder / f"{i}-{name}"
                    i += 1
                data = Path(path).read_bytes()
                if folder == "flight-recorder":
                    grant = self.budget.take(len(data) + 1024)
                    if grant < len(data) + 1024:
                        self.budget.give_back(grant)
                        notes.append(f"{path}: not attached ({len(data)} bytes exceed the byte budget)")
                        continue
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_bytes(data)
                else:
                    _, trunc = bd.write_capped(dst, data, self.budget, 64 << 20)
                    if trunc:
                        notes.append(f"{path}: truncated to its tail (byte budget)")
                files.append({"source": path, "path": self.rel(dst), "why": why})
            except OSError as e:
                notes.append(f"{path}: {e.strerror}")
        status = "failed" if missing else "ok"
        reason = "; ".join(([f"no file matches {m!r}" for m in missing]) + notes) or None
        self.record(key, status=status, reason=reason, command="copy " + " ".join(shlex.quote(s) for s, _ in sources),
                    rc=0, files=[f["path"] for f in files], sources=files, started_ns=t0, ended_ns=time.time_ns())

    # ------------------------------------------------------------------ process facts
    def process_facts(self) -> list[dict]:
        ss_by_ns: dict[int, list[dict]] = {}
        for ns in self.netns.values():
            f = self.staging / "sys" / ns.label / "ss-tinp-end.txt"
            if f.exists():
                ss_by_ns[ns.inode] = procs.parse_ss_tinp(f.read_text(errors="replace"))
        out = []
        for pid, info in sorted(self.procs.items()):
            d = info.to_manifest()
            ns = self.ensure_netns(info.netns_inode, pid)
            d["netns"] = ns.label
            d["alive_at_end"] = os.path.isdir(f"/proc/{pid}")
            socks = procs.tcp_sockets(pid) if d["alive_at_end"] else []
            ss = ss_by_ns.get(ns.inode, [])
            for s in socks:
                loc = f"{s['saddr']}:{s['sport']}"
                peer = f"{s['daddr']}:{s['dport']}"
                for row in ss:
                    if row["local"].replace("[", "").replace("]", "").endswith(loc) and \
                            row["peer"].replace("[", "").replace("]", "").endswith(peer):
                        for k in ("retrans_now", "retrans_total", "bytes_retrans", "bytes_sent", "bytes_received",
                                  "lost", "rtt_ms", "cwnd", "segs_out"):
                            if k in row:
                                s[k] = row[k]
                        break
            d["sockets"] = socks
            out.append(d)
        return out

    # ------------------------------------------------------------------ progress
    def staged_bytes(self) -> int:
        total = 0
        for p in self.staging.rglob("*"):
            try:
                if p.is_file():
                    total += p.stat().st_size
            except OSError:
                pass
        return total

    def progress(self, t_capture0: float, force: bool = False) -> None:
        mode = self.o.progress
        if mode == "off":
            return
        tty = mode == "tty" or (mode == "auto" and hasattr(self.err, "isatty") and self.err.isatty())
        now = time.monotonic()
        if not force and now - self.last_progress < (1.0 if tty else 5.0):
            return
        self.last_progress = now
        events = self.tracer_writer.events if self.tracer_writer else 0
        line = (f"{now - t_capture0:6.1f}s/{self.o.duration_s:g}s  events {events}  packets {self.tcpdump_packets()}"
                f"  bytes {self.staged_bytes() / 1048576:.1f}/{self.o.max_bytes / 1048576:.0f} MiB"
                f"  processes {len(self.procs)}")
        if tty:
            print(f"\rstallscope capture: {line}\033[K", end="", file=self.err, flush=True)
        else:
            print(f"stallscope capture: {line}", file=self.err, flush=True)

    # ------------------------------------------------------------------ main
    def on_signal(self, signum, frame) -> None:
        if self.stop_evt.is_set():
            print("\nstallscope capture: finishing the bundle, please wait", file=self.err, flush=True)
        self.stop_evt.set()

    def run(self) -> CaptureResult:
        o = self.o
        if o.duration_s <= 0:
            raise CaptureUsageError("--duration must be positive")
        if o.max_bytes < bd.MIN_BUDGET:
            raise CaptureUsageError(f"--max-bytes must be at least {bd.MIN_BUDGET // 1024}k")
        for p in o.pids:
            if not os.path.isdir(f"/proc/{p}"):
                raise CaptureUsageError(f"--pid {p}: no such process")
        for lib in o.nccl_libs:
            if not os.path.isfile(lib):
                raise CaptureUsageError(f"--nccl-lib {lib}: no such file")
        try:
            self.out_path = bd.choose_output(o.output, self.host, self.started_ns)
        except (FileExistsError, FileNotFoundError) as e:
            raise CaptureUsageError(str(e)) from None
        self.arcroot = self.out_path.name[: -len(".tar.gz")] if self.out_path.name.endswith(".tar.gz") \
            else self.out_path.stem
        self.staging = self.out_path.parent / f".{self.arcroot}.staging-{os.getpid()}"
        self.staging.mkdir(parents=True)
        self.budget = bd.Budget.plan(o.max_bytes, pcap=o.pcap, tracer=o.bpf)
        old = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            self.capture()
            return self.finalize()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.pool.shutdown(wait=False, cancel_futures=True)
            shutil.rmtree(self.staging, ignore_errors=True)

    def capture(self) -> None:
        o = self.o
        self.clock.append(clock_sample())
        self.ensure_netns(self.own_ns, "self")
        self.discover(initial=True)
        if o.pids:
            missing = [p for p in o.pids if p not in self.procs]
            if missing:
                self.notes.append(f"--pid {missing}: not running at start")
        for ns in list(self.netns.values()):
            if ns.own and not ns.pids and o.ifaces:
                ns.ifaces = [i for i in o.ifaces if i in procs.netns_interfaces("self")]
            elif ns.pids:
                ns.ifaces = self.ifaces_for(ns)
        n_if = sum(len(ns.ifaces) for ns in self.netns.values())
        self.n_slots = max(o.pcap_slots, n_if)
        self.pcap_slot_bytes = self.budget.pcap // self.n_slots if self.n_slots else 0
        self.log(f"{len(self.procs)} NCCL process(es) found"
                 + (f" (pids {', '.join(map(str, sorted(self.procs)))})" if self.procs else
                    "; new ones are picked up while capturing"))
        self.submit_snapshots(self.snapshot_jobs("start"))
        self.start_tracer()
        for ns in list(self.netns.values()):
            for iface in ns.ifaces:
                self.start_tcpdump(ns, iface)
        if not any(ns.ifaces for ns in self.netns.values()):
            self.record("tcpdump", status="skipped" if o.pcap else "skipped",
                        reason="--no-pcap" if not o.pcap else "no interface yet: no NCCL process and no --iface "
                        "(interfaces of processes found later are captured then)")
        self.start_nccl_tests()
        if self.tracer_proc is not None:
            if self.wait_tracer_ready():
                self.record("tracer", status="running")
            else:
                self.log("tracer did not start; see the manifest")
        summary = []
        if self.tracer_writer is not None and self.tracer_writer.ready.is_set():
            summary.append(f"tracer attached ({self.tracer_writer.attached_probes} probes)")
        else:
            summary.append("no tracer")
        summary.append(f"tcpdump on {sum(1 for t in self.tcpdumps.values() if t.get('proc'))} interface(s)")
        self.log("capturing: " + "; ".join(summary) + f"; {o.duration_s:g}s or Ctrl-C")
        rescan_s = o.rescan_s or (0.5 if o.pids else 2.0)
        t0 = time.monotonic()
        last_clock = last_scan = t0
        while not self.stop_evt.is_set():
            now = time.monotonic()
            if now - t0 >= o.duration_s:
                break
            if now - last_clock >= o.clock_every_s:
                self.clock.append(clock_sample())
                last_clock = now
            if now - last_scan >= rescan_s:
                last_scan = now
                self.rescan()
            if self.tracer_proc is not None and self.tracer_proc.poll() is not None and \
                    self.collectors["tracer"]["status"] == "running":
                self.record("tracer", status="failed")
                self.log("tracer exited early")
            self.progress(t0)
            self.stop_evt.wait(min(0.2, max(0.0, o.duration_s - (time.monotonic() - t0))))
        self.progress(t0, force=True)
        if self.o.progress != "off" and self.err.isatty() if hasattr(self.err, "isatty") else False:
            print(file=self.err)
        self.log("stopping collectors")

    def rescan(self) -> None:
        fresh = self.discover(initial=False)
        if not fresh:
            return
        self.log(f"new NCCL process(es): {', '.join(str(i.pid) for i in fresh)}")
        new_ns = []
        for info in fresh:
            ns = self.ensure_netns(info.netns_inode, info.pid)
            ifaces = self.ifaces_for(ns)
            added = [i for i in ifaces if i not in ns.ifaces]
            if ns not in new_ns and not any(k[0] == ns.inode for k in self.tcpdumps) and not ns.own:
                new_ns.append(ns)
            ns.ifaces += added
            for iface in added:
                self.start_tcpdump(ns, iface)
                self.submit_snapshots(self.snapshot_jobs("start", ifaces=[(ns, iface)]))
        if new_ns:
            self.submit_snapshots(self.snapshot_jobs("start", nss=new_ns))
        self.submit_snapshots(self.snapshot_jobs("start", pids=[i.pid for i in fresh]))

    def finalize(self) -> CaptureResult:
        # stop the continuous collectors first (they flush on SIGINT), all at once
        self.stop_nccl_tests()
        tracer_stopper = threading.Thread(target=self.stop_tracer)
        tracer_stopper.start()   # bpftrace exits on SIGINT; its threads join here (not a spawner)
        self.stop_tcpdumps()
        tracer_stopper.join()
        self.wait_snapshots(timeout=60)
        self.submit_snapshots(self.snapshot_jobs("end"))
        self.collect_attachments()
        self.wait_snapshots(timeout=120)
        self.clock.append(clock_sample())
        ended_ns = time.time_ns()
        for key, rec in self.collectors.items():
            if rec["status"] == "running":
                rec["status"] = "ok"
        processes = self.process_facts()
        manifest = {
            "schema_version": bd.SCHEMA_VERSION,
            "tool": "stallscope", "tool_version": __version__,
            "host": self.host, "hostname": os.uname().nodename, "boot_id": bd.boot_id(),
            "kernel": os.uname().release, "machine": os.uname().machine,
            "started_ns": self.started_ns, "ended_ns": ended_ns,
            "clock": "bpf nsecs and *_ns of events are CLOCK_MONOTONIC; convert with clock_samples",
            "clock_samples": self.clock,
            "options": {"duration_s": self.o.duration_s, "pids": self.o.pids, "ifaces": self.o.ifaces,
                        "max_bytes": self.o.max_bytes, "nccl_libs": self.o.nccl_libs,
                        "nccl_tests": self.o.nccl_tests, "attach": self.o.attach, "bpf": self.o.bpf,
                        "pcap": self.o.pcap, "snaplen": self.o.snaplen},
            "root": self.is_root,
            "budget": self.budget.to_manifest(),
            "collectors": dict(sorted(self.collectors.items())),
            "netns": [{"inode": ns.inode, "label": ns.label, "name": ns.name, "own": ns.own, "pids": ns.pids,
                       "ifaces": ns.ifaces} for ns in self.netns.values()],
            "processes": processes,
            "notes": self.notes,
            "files": [],
        }
        manifest = self.fit_budget(manifest)
        failed = sorted(k for k, r in self.collectors.items() if r["status"] == "failed")
        code = 3 if failed else 0
        if failed:
            self.log(f"finished with failed collectors: {', '.join(failed)}")
        self.log(f"bundle {self.out_path} ({self.out_path.stat().st_size} bytes)")
        return CaptureResult(path=self.out_path, exit_code=code, manifest=manifest)

    def fit_budget(self, manifest: dict) -> dict:
        """Write manifest and archive, trimming the biggest capped files until within --max-bytes."""
        limit = self.o.max_bytes
        mpath = self.staging / "manifest.json"
        for attempt in range(8):
            manifest["files"] = bd.file_entries(self.staging)
            blob = bd.dumps_manifest(manifest)
            mpath.write_bytes(blob)
            sizes = [f["bytes"] for f in manifest["files"]] + [len(blob)]
            dirs = len({str(Path(f["path"]).parent) for f in manifest["files"]}) + 2
            bound = bd.archive_bound(sizes, dirs)
            if bound > limit:
                self.trim(bound - limit, manifest)
                continue
            size = bd.write_archive(self.staging, self.out_path, self.arcroot)
            if size <= limit:
                bd.commit_archive(self.out_path)
                return manifest
            os.unlink(str(self.out_path) + ".partial")
            self.trim(size - limit + 4096, manifest)
        raise RuntimeError("could not fit the bundle into --max-bytes")

    def trim(self, excess: int, manifest: dict) -> None:
        """Drop the oldest pcap ring files, then cut the largest files, until excess bytes are freed."""
        excess += 64 * 1024
        notes = manifest.setdefault("notes", [])
        ring = sorted(self.staging.glob("pcap/*-[0-9][0-9][0-9].pcap"), key=lambda p: p.name)
        for p in ring:
            if excess <= 0:
                break
            excess -= p.stat().st_size + bd.TAR_BLOCK
            notes.append(f"dropped {self.rel(p)} to stay within --max-bytes")
            p.unlink()
        while excess > 0:
            files = sorted((p for p in bd.list_files(self.staging) if p.name != "manifest.json"),
                           key=lambda p: p.stat().st_size, reverse=True)
            if not files or files[0].stat().st_size == 0:
                break
            big = files[0]
            size = big.stat().st_size
            keep = max(0, size - excess)
            if big.suffix == ".pcap" or keep == 0:
                notes.append(f"dropped {self.rel(big)} ({size} bytes) to stay within --max-bytes")
                big.unlink()
                excess -= size + bd.TAR_BLOCK
                continue
            if big.suffix == ".jsonl":  # keep whole lines from the start
                with open(big, "rb") as fh:
                    head = fh.read(keep)
                keep = head.rfind(b"\n") + 1
                bd.truncate_file(big, keep, from_end=False)
            else:
                bd.truncate_file(big, keep, from_end=True)
            notes.append(f"cut {self.rel(big)} from {size} to {keep} bytes to stay within --max-bytes")
            excess -= size - keep


def run_capture(opts: CaptureOptions, stderr=None) -> CaptureResult:
    """Capture one host's bundle; raises CaptureUsageError for bad options."""
    return Capture(opts, stderr=stderr).run()
