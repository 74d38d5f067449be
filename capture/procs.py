"""The processes of the job, from /proc: libraries, ranks, environment, namespaces, sockets.

A process belongs to the job (``ProcInfo.job_reasons`` says why) when it

- maps a libnccl (``libnccl*.so*``, e.g. pip's ``nvidia/nccl/lib/libnccl.so.2`` inside a
  virtual environment, or an NGC container's ``/usr/lib/x86_64-linux-gnu/libnccl.so.2``),
  whether or not the file exports the entry point the tracer probes (``TRACE_PROBE``): one
  that does is *traceable* (``ProcInfo.nccl_libs``, the tracer's targets), one that does not
  (hidden symbols, an unsupported build) is kept apart (``ProcInfo.untraced_nccl_libs``), so
  the job is still seen and a trigger that needs no tracer can watch it;
- maps a library that exports NCCL's API (``libtorch_cuda.so`` with NCCL linked in
  statically and exported), found with the ELF reader;
- maps one of NCCL's plugins (``libnccl-net*``, ``-tuner``, ``-profiler``, ``-env``): they
  are loaded by NCCL only, but are no NCCL to trace;
- carries ``NCCL_*`` environment variables (NCCL linked statically with hidden symbols
  leaves nothing else to see), when the caller asks (``by_env``: it must then
  :func:`refresh` the jobs it knows, see :func:`discover`). The capture's own descendants are not jobs by their
  environment alone (its tcpdump, nsenter or gdb inherit whatever the operator exported).

Paths are resolved through ``/proc/PID/root`` when the process lives in another mount
namespace, so the tracer attaches to the file the process really maps. A library file is
identified by the (device, inode) that ``/proc/PID/maps`` names: the file the kernel maps
(and the one a uprobe is attached to), the same whichever mount namespace sees it and
whichever path it is mapped under; :func:`libraries` and :func:`libraries_in_use` list the
distinct files so that a watcher notices one it does not cover yet. Each NCCL library's
version is read from the file (:mod:`.libversion`).
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field

from . import manifest as schema
from .elf import ElfError, exported_functions_cached
from .libversion import nccl_version

NCCL_LIB_GLOBS = ("libnccl*.so*",)
# NCCL's plugins (network, tuner, profiler, environment): loaded by NCCL only, no NCCL inside
NCCL_PLUGIN_GLOBS = ("libnccl-net*.so*", "libnccl-tuner*.so*", "libnccl-profiler*.so*", "libnccl-env*.so*")
TRACE_PROBE = "ncclAllReduce"   # a library exporting it is one whose NCCL calls the tracer can probe
# libraries that may carry a statically linked, exported NCCL; checked with the ELF reader
NCCL_HOST_GLOBS = ("libtorch_cuda*.so*", "libtorch*.so*", "libcaffe2_nvrtc*.so*", "*nccl*.so*")
CUDART_GLOBS = ("libcudart.so*", "libcudart-*.so*")
CUDA_GLOBS = ("libcuda.so*",)
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NODE_RANK",
             "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD_RANK",
             "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
             "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "HOSTNAME")
# why a process is a job (ProcInfo.job_reasons), each with what it means
JOB_REASONS = {
    "libnccl": "maps a libnccl (traceable or not)",
    "nccl-api": "maps a library that exports NCCL's API",
    "nccl-plugin": "maps one of NCCL's plugins",
    "nccl-env": "carries NCCL_* environment variables",
    "nccl-lib": "maps a file given with --nccl-lib",
    "pid": "named with --pid (or below one)",
}
ENV_PREFIXES = ("NCCL_", "TORCH_", "TORCHELASTIC_", "PYTORCH_", "CUDA_", "UCX_", "GLOO_")


LibKey = tuple[int, int]    # (device, inode) of a mapped file as /proc/PID/maps names it


@dataclass
class MappedLib:
    """One library file a process maps. ``symbols``: for NCCL, the probed entry points it
    exports (empty for an untraceable one); for the CUDA runtime and driver, every exported
    function. ``traceable``: the tracer can attach to it (NCCL: it exports ``TRACE_PROBE``)."""
    path: str            # as the process sees it
    host_path: str       # a path this process (capture) can open for the same file
    inode: int
    symbols: set[str] = field(default_factory=set)
    dev: int = 0         # the device /proc/PID/maps names; with inode: the file, in any mount namespace
    kind: str = ""       # nccl | nccl-plugin | cudart | cuda
    traceable: bool = True
    version: str | None = None     # NCCL's own version string in the file (nccl only)

    @property
    def key(self) -> LibKey:
        return (self.dev, self.inode)


@dataclass
class ProcInfo:
    pid: int
    comm: str = ""
    exe: str = ""
    cmdline: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)   # NCCL_*/TORCH_*/rank variables only
    nccl_libs: list[MappedLib] = field(default_factory=list)        # traceable: the tracer's targets
    untraced_nccl_libs: list[MappedLib] = field(default_factory=list)   # libnccl* without TRACE_PROBE
    cudart_libs: list[MappedLib] = field(default_factory=list)
    cuda_libs: list[MappedLib] = field(default_factory=list)
    netns_inode: int | None = None
    start_ticks: int | None = None
    python: bool = False
    hostname: str | None = None          # as the process sees it (uts_hostname)
    job_reasons: list[str] = field(default_factory=list)   # JOB_REASONS that made it a job
    ident: tuple[int, int] | None = None     # (start time, virtual size) when its maps were read

    @property
    def nccl_version(self) -> str | None:
        """The NCCL version of the first NCCL library it maps that states one (traceable first)."""
        return next((l.version for l in self.nccl_libs + self.untraced_nccl_libs if l.version), None)

    @property
    def traceable(self) -> bool:
        """Whether the tracer can see its NCCL calls (it maps a library exporting TRACE_PROBE)."""
        return bool(self.nccl_libs)

    def rank_facts(self) -> dict:
        e = self.env

        def num(*names):
            for n in names:
                try:
                    return int(e[n])
                except (KeyError, ValueError):
                    continue
            return None
        return {
            "rank": num("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"),
            "local_rank": num("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"),
            "world_size": num("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"),
            "master_addr": e.get("MASTER_ADDR"),
            "master_port": num("MASTER_PORT"),
        }

    def to_manifest(self) -> dict:
        """The manifest's process entry (``capture.manifest.PROCESS``; ``Jobs.process_facts`` adds
        the keys of a finished capture)."""
        return schema.PROCESS.make(
            pid=self.pid, **self.rank_facts(), comm=self.comm, exe=self.exe, cmdline=self.cmdline, env=self.env,
            libnccl=[l.path for l in self.nccl_libs + self.untraced_nccl_libs],
            libnccl_untraced=[l.path for l in self.untraced_nccl_libs], nccl_version=self.nccl_version,
            job_reasons=list(self.job_reasons), libcudart=[l.path for l in self.cudart_libs],
            libcuda=[l.path for l in self.cuda_libs], netns_inode=self.netns_inode, start_ticks=self.start_ticks,
            python=self.python, hostname=self.hostname)


def _read(path: str, mode: str = "r") -> str | bytes | None:
    try:
        with open(path, mode) as fh:
            return fh.read()
    except (OSError, ValueError):
        return None


def mappings(pid: int) -> list[tuple[str, int, int]]:
    """(path, device, inode) of every file-backed mapping of pid, each once; the path as the
    process sees it, the device and inode those of the file the kernel maps (``major:minor``
    in hex in /proc/PID/maps)."""
    text = _read(f"/proc/{pid}/maps")
    if not text:
        return []
    seen, out = set(), []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5]
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        try:
            inode = int(parts[4])
            major, _, minor = parts[3].partition(":")
            dev = os.makedev(int(major, 16), int(minor, 16))
        except ValueError:
            continue
        if (path, dev, inode) not in seen:
            seen.add((path, dev, inode))
            out.append((path, dev, inode))
    return out


def mapped_files(pid: int) -> list[tuple[str, int]]:
    """(path, inode) of every file-backed mapping of pid, each once."""
    return list(dict.fromkeys((path, inode) for path, _dev, inode in mappings(pid)))


def host_path(pid: int, path: str, inode: int) -> str:
    """A path capture can open for the file pid maps: the same path if it is the
    same inode here, else through the process's root (another mount namespace)."""
    try:
        if os.stat(path).st_ino == inode:
            return path
    except OSError:
        pass
    alt = f"/proc/{pid}/root{path}"
    try:
        if os.stat(alt).st_ino == inode:
            return alt
    except OSError:
        pass
    return path


def _matches(name: str, globs) -> bool:
    return any(fnmatch.fnmatch(name, g) for g in globs)


def lib_kind(path: str) -> str | None:
    """What a mapped file may be, from its name: nccl-plugin, nccl (a libnccl or a library
    that may export NCCL), cudart, cuda; None for anything else."""
    base = os.path.basename(path)
    if _matches(base, NCCL_PLUGIN_GLOBS):
        return "nccl-plugin"
    if _matches(base, NCCL_LIB_GLOBS) or _matches(base, NCCL_HOST_GLOBS):
        return "nccl"
    if _matches(base, CUDART_GLOBS):
        return "cudart"
    if _matches(base, CUDA_GLOBS):
        return "cuda"
    return None


def classify_lib(pid: int, path: str, inode: int, nccl_symbols, dev: int = 0) -> tuple[str | None, MappedLib | None]:
    """(kind, library) of a file pid maps, or (None, None) when it is none of NCCL's, the CUDA
    runtime's or the driver's. A libnccl that does not export ``TRACE_PROBE`` is still an
    NCCL library, with ``traceable`` False and no symbols; another library (``libtorch*``)
    is one only when it exports it. An NCCL library's version is read from the file."""
    kind = lib_kind(path)
    if kind is None:
        return None, None
    hp = host_path(pid, path, inode)
    lib = MappedLib(path=path, host_path=hp, inode=inode, dev=dev, kind=kind)
    if kind == "nccl-plugin":
        lib.traceable = False
        return kind, lib
    try:
        syms = set(exported_functions_cached(hp))
    except (OSError, ElfError):
        syms = set()
    lib.symbols = syms
    if kind == "nccl":
        lib.traceable = TRACE_PROBE in syms
        if not lib.traceable and not _matches(os.path.basename(path), NCCL_LIB_GLOBS):
            return None, None       # a libtorch without exported NCCL
        lib.symbols = syms & set(nccl_symbols) if lib.traceable else set()
        lib.version = nccl_version(hp)
    return kind, lib


def read_env(pid: int) -> dict[str, str]:
    raw = _read(f"/proc/{pid}/environ", "rb")
    env = {}
    if not raw:
        return env
    for item in raw.split(b"\0"):
        if b"=" not in item:
            continue
        k, _, v = item.partition(b"=")
        key = k.decode("utf-8", "replace")
        if key in RANK_VARS or key.startswith(ENV_PREFIXES):
            env[key] = v.decode("utf-8", "replace")
    return env


_UTS_NAMES: dict[int, str | None] = {}     # UTS namespace inode -> its host name (asked once)


def uts_hostname(pid: int | str) -> str | None:
    """The host name the process itself sees: gethostname() in its UTS namespace, which is
    what NCCL prints in its log prefix (a container's or a pod's own name, not the node's).
    Our own namespace: os.uname(); another one: ``nsenter --uts`` running ``uname -n``
    there (util-linux and coreutils), asked once per namespace. None when unknown."""
    try:
        ino = os.stat(f"/proc/{pid}/ns/uts").st_ino
        if ino == os.stat("/proc/self/ns/uts").st_ino:
            return os.uname().nodename
    except OSError:
        return None
    if ino not in _UTS_NAMES:
        name = None
        nsenter = shutil.which("nsenter")
        if nsenter:
            try:
                p = subprocess.run([nsenter, f"--uts=/proc/{pid}/ns/uts", "uname", "-n"], capture_output=True,
                                   text=True, timeout=2)
                name = p.stdout.strip() or None if p.returncode == 0 else None
            except (OSError, subprocess.SubprocessError):
                name = None
        _UTS_NAMES[ino] = name
    return _UTS_NAMES[ino]


def netns_inode(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _reason(lib: MappedLib) -> str:
    if lib.kind == "nccl-plugin":
        return "nccl-plugin"
    return "libnccl" if _matches(os.path.basename(lib.path), NCCL_LIB_GLOBS) else "nccl-api"


def mapped_libs(pid: int, nccl_symbols, nccl_lib_override: list[str] | None = None) -> tuple[dict, bool]:
    """({kind: [MappedLib]}, maps libpython) of pid; kinds as :func:`lib_kind`, untraceable
    NCCL libraries under ``nccl-untraced``; a ``--nccl-lib`` file (by inode) is a traceable
    NCCL library whatever its name and exports (no symbols: the tracer decides what to probe)."""
    out: dict[str, list[MappedLib]] = {}
    python = False
    override_inodes = set()
    for p in nccl_lib_override or []:
        try:
            override_inodes.add(os.stat(p).st_ino)
        except OSError:
            pass
    for path, dev, inode in mappings(pid):
        kind, lib = classify_lib(pid, path, inode, nccl_symbols, dev=dev)
        if inode in override_inodes and (kind is None or (kind == "nccl" and not lib.traceable)):
            kind = "nccl"
            lib = MappedLib(path=path, host_path=host_path(pid, path, inode), inode=inode, dev=dev, kind="nccl",
                            version=nccl_version(host_path(pid, path, inode)))
        if kind == "nccl" and not lib.traceable:
            kind = "nccl-untraced"
        if kind is not None:
            out.setdefault(kind, []).append(lib)
        if re.match(r"libpython\d", os.path.basename(path)):
            python = True
    return out, python


def _read_libs(info: ProcInfo, nccl_symbols, nccl_lib_override: list[str] | None) -> None:
    """(Re)read info's libraries from its maps: the lists, ``python``, the library reasons
    (``nccl-env`` and ``pid`` kept) and ``ident``."""
    info.ident = _identity(info.pid)
    libs, python = mapped_libs(info.pid, nccl_symbols, nccl_lib_override)
    info.nccl_libs, info.untraced_nccl_libs = libs.get("nccl", []), libs.get("nccl-untraced", [])
    info.cudart_libs, info.cuda_libs = libs.get("cudart", []), libs.get("cuda", [])
    info.python = info.python or python
    reasons = []
    for lib in info.nccl_libs + info.untraced_nccl_libs + libs.get("nccl-plugin", []):
        why = "nccl-lib" if lib_kind(lib.path) is None else _reason(lib)
        if why not in reasons:
            reasons.append(why)
    info.job_reasons = reasons + [r for r in info.job_reasons if r in ("nccl-env", "pid")]


def refresh(info: ProcInfo, nccl_symbols, nccl_lib_override: list[str] | None = None) -> bool:
    """Read a known job's libraries again when it changed since (its virtual size: a library
    loaded, ``import torch`` seconds after a process found by its NCCL_* variables started);
    True when its NCCL, CUDA runtime or driver libraries are not the ones it had. One stat
    read when nothing changed: a watcher calls it on every rescan for its jobs, at least for
    those found before they mapped a traceable libnccl."""
    ident = _identity(info.pid)
    if ident is None or ident == info.ident or ident[1] == 0:
        # gone, unchanged, or exiting (virtual size 0: its memory is released, a zombie): an
        # exiting process's maps are empty, not changed; what it mapped stays its record
        # (the manifest's libnccl and version of a job that ended during the capture)
        return False
    before = [l.key for l in info.nccl_libs + info.untraced_nccl_libs + info.cudart_libs + info.cuda_libs]
    kept = (info.ident, info.nccl_libs, info.untraced_nccl_libs, info.cudart_libs, info.cuda_libs, info.python,
            list(info.job_reasons))
    _read_libs(info, nccl_symbols, nccl_lib_override)
    if info.ident is None or (info.ident[1] == 0 and not info.nccl_libs + info.untraced_nccl_libs):
        # it exited between the two reads
        (info.ident, info.nccl_libs, info.untraced_nccl_libs, info.cudart_libs, info.cuda_libs, info.python,
         info.job_reasons) = kept
        return False
    return before != [l.key for l in info.nccl_libs + info.untraced_nccl_libs + info.cudart_libs + info.cuda_libs]


def inspect(pid: int, nccl_symbols, nccl_lib_override: list[str] | None = None,
            by_env: bool = False) -> ProcInfo | None:
    """Facts about pid, or None if it is no job (module docstring: it maps no NCCL library, no
    NCCL plugin and no --nccl-lib file, and, with ``by_env``, carries no NCCL_* variable)."""
    if not os.path.exists(f"/proc/{pid}/maps"):
        return None
    info = ProcInfo(pid=pid)
    _read_libs(info, nccl_symbols, nccl_lib_override)
    info.env = read_env(pid)
    if by_env and any(k.startswith("NCCL_") for k in info.env):
        info.job_reasons.append("nccl-env")
    if not info.job_reasons:
        return None
    info.comm = (_read(f"/proc/{pid}/comm") or "").strip()
    try:
        info.exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        info.exe = ""
    if os.path.basename(info.exe).startswith("python"):
        info.python = True
    raw = _read(f"/proc/{pid}/cmdline", "rb") or b""
    info.cmdline = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    info.netns_inode = netns_inode(pid)
    info.hostname = uts_hostname(pid)
    stat = _read(f"/proc/{pid}/stat") or ""
    try:
        info.start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        info.start_ticks = None
    return info


def all_pids() -> list[int]:
    return sorted(int(d) for d in os.listdir("/proc") if d.isdigit())


def parent_map() -> dict[int, int]:
    out = {}
    for pid in all_pids():
        stat = _read(f"/proc/{pid}/stat")
        if stat:
            try:
                out[pid] = int(stat.rsplit(")", 1)[1].split()[1])
            except (IndexError, ValueError):
                pass
    return out


def _children_files(pid: int) -> list[int]:
    """The children of pid from /proc/PID/task/*/children (one small file a thread)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []          # gone
    out: list[int] = []
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children", "rb") as fh:
                out += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue       # the thread ended
    return out


def _have_children_files() -> bool:
    """Whether this kernel has /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from one pass over every process's stat."""
    table: dict[int, list[int]] = {}
    for pid, ppid in parent_map().items():
        table.setdefault(ppid, []).append(pid)
    return table


def children(pid: int) -> list[int]:
    """The live children of pid."""
    return _children_files(pid) if _have_children_files() else _children_by_parent().get(pid, [])


def descendants(roots) -> set[int]:
    """Every live process below roots (children, grandchildren, ...). Walks the roots'
    children files (a few reads, whatever the number of processes on the host); where the
    kernel has none, one pass over every process's stat. A process forked during the walk
    may be missed: the next rescan finds it (and the tracer follows forks in the kernel)."""
    if _have_children_files():
        return _walk(roots, _children_files)
    return _descendants_by_parent(roots)


def _descendants_by_parent(roots) -> set[int]:
    table = _children_by_parent()
    return _walk(roots, lambda p: table.get(p, []))


def _walk(roots, children_of) -> set[int]:
    out, todo = set(), list(roots)
    while todo:
        for c in children_of(todo.pop()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _identity(pid: int) -> tuple[int, int] | None:
    """(start time, virtual size) of pid from its stat: the same process with the same
    mappings, as far as a rescan needs to know (loading a library grows the size)."""
    stat = _read(f"/proc/{pid}/stat")
    try:
        f = stat.rsplit(")", 1)[1].split()
        return int(f[19]), int(f[20])
    except (AttributeError, IndexError, ValueError):
        return None


def descends_from(pid: int, ancestor: int, depth: int = 64) -> bool:
    """Whether ``ancestor`` is pid's parent, grandparent, ... (its stat's ppid chain, at most
    ``depth`` steps; False once the chain ends or cannot be read)."""
    for _ in range(depth):
        stat = _read(f"/proc/{pid}/stat")
        try:
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (AttributeError, IndexError, ValueError):
            return False
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def discover(nccl_symbols, pids: list[int] | None = None, nccl_lib_override: list[str] | None = None,
             skip: set[int] | None = None, not_nccl: dict | None = None, by_env: bool = False) -> list[ProcInfo]:
    """The job processes (module docstring; with ``by_env``, also those known by their NCCL_*
    variables alone), except ``skip`` and the capture itself; the capture's descendants only
    by what they map. With ``pids``: those processes (jobs or not) and the jobs among their
    descendants (``--pid`` of torchrun or a launcher).

    ``by_env`` finds a job before it maps anything (a Python job imports torch seconds after
    it starts): a caller that passes it and then ``skip``s the jobs it knows must
    :func:`refresh` them on each rescan, or a job found early never shows its libnccl.

    ``not_nccl`` (kept by the caller between rescans): the processes found to be no job,
    each with its start time and virtual size; such a process is inspected again (its maps
    read) only once its size changed (a library loaded: ``import torch`` after start-up) or
    its pid was reused, so an always-on watcher does not read every process's maps every
    few seconds. (Its environment cannot change: /proc/PID/environ is the one it started with.)"""
    own = os.getpid()
    out = []
    roots = set(pids or [])
    candidates = sorted(roots | descendants(roots)) if pids else all_pids()
    if not_nccl is not None:
        for gone in set(not_nccl) - set(candidates):
            del not_nccl[gone]
    for pid in candidates:
        if pid == own or (skip and pid in skip):
            continue
        ident = None
        if not_nccl is not None and pid not in roots:
            ident = _identity(pid)
            if ident is not None and not_nccl.get(pid) == ident:
                continue
        info = inspect(pid, nccl_symbols, nccl_lib_override, by_env=by_env)
        if info is not None and info.job_reasons == ["nccl-env"] and descends_from(pid, own):
            info = None                      # the capture's own helper, with the operator's environment
        if info is not None:
            if not_nccl is not None:
                not_nccl.pop(pid, None)
            if pid in roots:
                info.job_reasons.append("pid")
            out.append(info)
            continue
        if ident is not None:
            not_nccl[pid] = ident
        if pid in roots:  # an explicit --pid that maps no NCCL is still a target
            info = ProcInfo(pid=pid, job_reasons=["pid"])
            if os.path.isdir(f"/proc/{pid}"):
                info.comm = (_read(f"/proc/{pid}/comm") or "").strip()
                raw = _read(f"/proc/{pid}/cmdline", "rb") or b""
                info.cmdline = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
                info.env = read_env(pid)
                info.netns_inode = netns_inode(pid)
                info.hostname = uts_hostname(pid)
                out.append(info)
    return out


# ---------------------------------------------------------------- the library files in use
@dataclass
class SharedLib:
    """One library file (``key``: the (device, inode) /proc/PID/maps names) and the processes
    that map it, each with a path capture can open for it (through that process's root when
    it lives in another mount namespace). ``kind``, ``traceable``, ``symbols`` and
    ``version`` as :class:`MappedLib` (from the first process found mapping it)."""
    key: LibKey
    kind: str
    traceable: bool
    symbols: set[str] = field(default_factory=set)
    version: str | None = None
    users: dict[int, str] = field(default_factory=dict)       # pid -> host path
    paths: set[str] = field(default_factory=set)              # as the processes see it

    def host_path(self) -> str | None:
        """A path to the file through a process still alive (its own root), else None.
        Prefers a path that needs no process (the same file in capture's own namespace)."""
        live = [(p, hp) for p, hp in sorted(self.users.items()) if os.path.isdir(f"/proc/{p}")]
        for _p, hp in live:
            if not hp.startswith("/proc/"):
                return hp
        return live[0][1] if live else None


def libraries(infos) -> dict[LibKey, SharedLib]:
    """The distinct NCCL (traceable or not), CUDA runtime and driver library files the given
    process records (:class:`ProcInfo`) map, by (device, inode). Reads nothing from /proc
    (records made before this version have ``dev`` 0: keyed by inode alone, in effect)."""
    out: dict[LibKey, SharedLib] = {}
    for info in infos:
        for lib in info.nccl_libs + info.untraced_nccl_libs + info.cudart_libs + info.cuda_libs:
            shared = out.get(lib.key)
            if shared is None:
                shared = out[lib.key] = SharedLib(key=lib.key, kind=lib.kind or "nccl", traceable=lib.traceable,
                                                  symbols=set(lib.symbols), version=lib.version)
            shared.users[info.pid] = lib.host_path
            shared.paths.add(lib.path)
    return out


def libraries_in_use(nccl_symbols, pids=None, skip: set[int] | None = None) -> dict[LibKey, SharedLib]:
    """:func:`libraries` of the job processes alive now (of ``pids`` when given), from their
    maps: what a watcher compares with the files its tracer covers, to notice a job that
    brought a library it has not seen (another venv, a container's copy, another version),
    and the files whose last process has ended. Reads every process's maps: a watcher that
    keeps its :class:`ProcInfo` records calls :func:`libraries` on them instead."""
    own = os.getpid()
    infos = []
    for pid in pids if pids is not None else all_pids():
        if pid == own or (skip and pid in skip):
            continue
        libs, _python = mapped_libs(pid, nccl_symbols)
        if libs.get("nccl") or libs.get("nccl-untraced") or libs.get("nccl-plugin"):
            infos.append(ProcInfo(pid=pid, nccl_libs=libs.get("nccl", []),
                                  untraced_nccl_libs=libs.get("nccl-untraced", []),
                                  cudart_libs=libs.get("cudart", []), cuda_libs=libs.get("cuda", [])))
    return libraries(infos)


# ---------------------------------------------------------------- sockets
TCP_STATE_NAMES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
                   6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING"}


def blocked_sp(pid: int, tid: int, samples: int = 5, gap_s: float = 0.02) -> int | None:
    """The user stack pointer of a thread blocked in the kernel (``/proc/PID/task/TID/syscall``:
    "nr args... sp pc", or "-1 sp pc"), sampled a few times while it reads "running"; None when
    it kept running, is gone or may not be read (ptrace access)."""
    for i in range(samples):
        text = _read(f"/proc/{pid}/task/{tid}/syscall")
        if not text:
            return None
        f = text.split()
        if f[0] != "running" and len(f) >= 3:
            try:
                return int(f[-2], 16)
            except ValueError:
                return None
        if i + 1 < samples:
            time.sleep(gap_s)
    return None


def inside_call(pid: int, tid: int, entry_sp: int, ret_addr: int) -> bool | None:
    """Whether a thread is still inside the call it entered with the stack pointer ``entry_sp``
    (where the call's return address ``ret_addr`` was): blocked deeper than that and the return
    address still in its slot. False when it is back above it or the slot holds something else
    (it returned and called elsewhere); None when it cannot be told (running, gone, no access)."""
    sp = blocked_sp(pid, tid)
    if sp is None or not entry_sp:
        return None
    if sp >= entry_sp:
        return False
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        word = os.pread(fd, 8, entry_sp)
    except OSError:
        return None
    finally:
        os.close(fd)
    return len(word) == 8 and int.from_bytes(word, "little") == ret_addr


def socket_fds(pid: int) -> list[tuple[int, int]]:
    """(socket inode, fd number) of each of pid's descriptors that is a socket (a socket
    held by two descriptors: twice)."""
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.append((int(target[8:-1]), int(fd)))
    return out


def socket_inodes(pid: int) -> dict[int, int]:
    """socket inode -> fd number of pid's open sockets."""
    return dict(socket_fds(pid))


def _addr(hexaddr: str) -> tuple[str, int]:
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four native-endian (little) 32-bit words
        words = struct.unpack("<4I", raw)
        ip = socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))
        if ip.startswith("::ffff:") and "." in ip:
            ip = ip[7:]
    return ip, int(port, 16)


def tcp_sockets(pid: int) -> list[dict]:
    """pid's TCP sockets as /proc/PID/net/tcp{,6} (its own network namespace) lists them, as the
    manifest's socket entries (``capture.manifest.SOCKET``)."""
    inodes = socket_inodes(pid)
    out = []
    for fam in ("tcp", "tcp6"):
        text = _read(f"/proc/{pid}/net/{fam}")
        if not text:
            continue
        for line in text.splitlines()[1:]:
            f = line.split()
            if len(f) < 10:
                continue
            try:
                inode = int(f[9])
            except ValueError:
                continue
            if inode not in inodes:
                continue
            (lip, lport), (rip, rport) = _addr(f[1]), _addr(f[2])
            st = int(f[3], 16)
            out.append(schema.SOCKET.make(
                fd=inodes[inode], inode=inode, family=6 if fam == "tcp6" else 4, saddr=lip, sport=lport, daddr=rip,
                dport=rport, state=TCP_STATE_NAMES.get(st, str(st)),
                retransmits=int(f[6], 16) if len(f) > 6 and re.fullmatch(r"[0-9A-Fa-f]+", f[6]) else None))
    return out


def netns_established(pid: int | str) -> dict[int, str]:
    """socket inode -> local address of every ESTABLISHED TCP socket of pid's network
    namespace (/proc/PID/net/tcp{,6}: one read each, no fd scan; whoever owns them)."""
    out = {}
    for fam in ("tcp", "tcp6"):
        text = _read(f"/proc/{pid}/net/{fam}")
        for line in (text or "").splitlines()[1:]:
            f = line.split()
            if len(f) < 10 or f[3] != "01":      # 01: TCP_ESTABLISHED
                continue
            try:
                out[int(f[9])] = _addr(f[1])[0]
            except (ValueError, OSError):
                continue
    return out


_SS_HEAD = re.compile(r"^(?P<state>\S+)\s+(?P<recv_q>\d+)\s+(?P<send_q>\d+)\s+(?P<local>\S+)\s+(?P<peer>\S+)"
                      r"(?P<rest>.*)$")


def parse_ss_tinp(text: str) -> list[dict]:
    """``ss -tinpH`` (or without -H) -> one dict per socket: tuple, queues, pids, counters."""
    out: list[dict] = []
    cur = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("State"):
            continue
        m = _SS_HEAD.match(line) if not line[:1].isspace() else None
        if m:
            local, peer = m.group("local"), m.group("peer")
            cur = {"state": m.group("state"), "local": local, "peer": peer,
                   "recv_q": int(m.group("recv_q")), "send_q": int(m.group("send_q")),
                   "pids": [int(p) for p in re.findall(r"pid=(\d+)", m.group("rest"))]}
            out.append(cur)
            continue
        if cur is None:
            continue
        info = line.strip()
        mm = re.search(r"\bretrans:(\d+)/(\d+)", info)
        if mm:
            cur["retrans_now"], cur["retrans_total"] = int(mm.group(1)), int(mm.group(2))
        for key in ("bytes_sent", "bytes_retrans", "bytes_acked", "bytes_received", "segs_out", "segs_in",
                    "data_segs_out", "lost", "reord_seen", "unacked", "sacked"):
            mm = re.search(rf"\b{key}:(\d+)", info)
            if mm:
                cur[key] = int(mm.group(1))
        mm = re.search(r"\brtt:([\d.]+)/([\d.]+)", info)
        if mm:
            cur["rtt_ms"], cur["rttvar_ms"] = float(mm.group(1)), float(mm.group(2))
        mm = re.search(r"\bcwnd:(\d+)", info)
        if mm:
            cur["cwnd"] = int(mm.group(1))
        if "pids" in cur and not cur["pids"]:
            cur["pids"] = [int(p) for p in re.findall(r"pid=(\d+)", info)]
    return out


# ---------------------------------------------------------------- interfaces
def netns_interfaces(pid: int | str) -> list[str]:
    """Interface names in pid's network namespace (from its /proc/PID/net/dev)."""
    text = _read(f"/proc/{pid}/net/dev")
    if not text:
        return []
    return [line.split(":", 1)[0].strip() for line in text.splitlines()[2:] if ":" in line]


def select_ifaces(ifname_spec: str | None, available: list[str]) -> list[str]:
    """NCCL_SOCKET_IFNAME semantics: comma-separated prefixes, ``=`` exact, ``^`` exclude."""
    if not ifname_spec:
        return []
    spec = ifname_spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    pats = [p.strip() for p in spec.split(",") if p.strip()]

    def hit(name):
        return any(name == p if exact else name.startswith(p) for p in pats)
    if exclude:
        return [n for n in available if not hit(n) and n != "lo"]
    return [n for n in available if hit(n)]


def ifaces_of_addresses(pid: int | str, addrs: set[str]) -> list[str]:
    """Interfaces owning any of addrs in pid's namespace (via ``ip -j addr`` there)."""
    if not addrs:
        return []
    cmd = ["ip", "-j", "addr"]
    if str(pid) != "self":
        cmd = ["nsenter", f"--net=/proc/{pid}/ns/net"] + cmd
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        data = json.loads(p.stdout or "[]")
    except (OSError, ValueError, subprocess.SubprocessError):
        return []
    out = []
    for link in data:
        for a in link.get("addr_info", []):
            if a.get("local") in addrs and link.get("ifname") not in out:
                out.append(link["ifname"])
    return out
