"""Where the NCCL libraries of a host are before any job maps them (standard library only).

A uprobe belongs to a file (its inode), not to a process: once the tracer probes a libnccl,
every process that maps that file is traced from its first call. The watcher therefore
traces the libnccl files it can find *before* a job starts (:func:`scan`, at start and every
``SCAN_EVERY_S``), in the places jobs take them from:

- the dynamic linker's cache (``/etc/ld.so.cache``: every path in it named ``libnccl*``) and
  the usual library folders (``/usr/lib*``, ``/usr/local/cuda*/lib*``, ``/opt/*/lib*``);
- Python environments: ``site-packages/nvidia/nccl/lib`` of the system's interpreters, of
  virtual environments under ``/opt``, ``/home/*``, ``/root``, ``/workspace`` (two levels,
  hidden ones such as a project's ``.venv`` included), of conda
  (``*conda*/envs/*``), and torch's own ``site-packages/torch/lib``;
- the container runtime: the image layers on disk (containerd's overlayfs snapshots,
  docker's ``overlay2`` diff folders) and the root of every running container
  (``/proc/PID/root`` of a process whose mount namespace is not ours), the same folders
  inside.

Each file found is a :class:`FoundLib`, kept once per (device, inode): a file reached through
a container's root or through the image layer it lives in is one file (the kernel puts a
uprobe on the real inode below an overlay, so probing an image layer's copy covers every
container started from that image). A file is kept when it exports the tracer's probe
(``procs.TRACE_PROBE``). The scan is bounded: at most ``MAX_FILES`` candidate paths are
looked at; :func:`choose` bounds how many files are traced (each costs its ~41 probes in
the program and its compile time): the files processes map first, then one per GNU build
id (copies of one build in several layers: the first of them), newest first, then the
other copies, up to the limit; the rest are listed as not traced ahead of time (a process
that maps one is traced when it maps it, ``capture.collectors.tracer``).
"""
from __future__ import annotations

import glob
import os
import struct
from dataclasses import dataclass, field

from ..elf import ElfError, exported_functions_cached, sections

SCAN_EVERY_S = 60.0          # the watcher scans again this often
MAX_FILES = 2000             # candidate paths looked at per scan
NCCL_NAMES = ("libnccl.so*", "libnccl-*.so*", "librccl.so*")
LD_CACHE = "/etc/ld.so.cache"
# folders below a root ("/" or a container's root) that may hold a libnccl
LIB_DIRS = ("usr/lib", "usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/local/lib",
            "usr/local/lib64", "usr/local/cuda*/lib*", "usr/local/cuda*/targets/*/lib", "opt/*/lib*",
            "opt/*/lib/*", "usr/local/nccl*/lib*")
SITE_DIRS = ("usr/lib/python3*/*-packages", "usr/local/lib/python3*/*-packages",
             "opt/*/lib/python3*/site-packages", "opt/*/*/lib/python3*/site-packages",
             "root/*/lib/python3*/site-packages", "root/.*/lib/python3*/site-packages",
             "home/*/*/lib/python3*/site-packages", "home/*/.*/lib/python3*/site-packages",
             "opt/*conda*/lib/python3*/site-packages", "opt/*conda*/envs/*/lib/python3*/site-packages",
             "root/*conda*/envs/*/lib/python3*/site-packages", "home/*/*conda*/envs/*/lib/python3*/site-packages",
             "workspace/*/lib/python3*/site-packages",
             # a project's hidden virtual environment (glob's * skips dot names): /opt/torch/.venv on a GPU host
             "opt/.*/lib/python3*/site-packages", "opt/*/.*/lib/python3*/site-packages",
             "root/*/.*/lib/python3*/site-packages", "home/*/*/.*/lib/python3*/site-packages",
             "workspace/.*/lib/python3*/site-packages", "workspace/*/.*/lib/python3*/site-packages")
IN_SITE = ("nvidia/nccl/lib", "torch/lib")
# the container runtime's image layers on the host
LAYER_ROOTS = ("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/*/fs",
               "/var/lib/docker/overlay2/*/diff", "/var/lib/docker/overlay2/*/merged")


@dataclass
class FoundLib:
    """One libnccl file: ``path`` a path this process can open, ``key`` (device, inode) as
    os.stat gives it, ``build_id`` its GNU build id (hex) when it has one, ``where`` how it was
    found (ld-cache, host, python, layer, container PID), ``symbols`` the tracer's entry
    points it exports."""
    path: str
    key: tuple[int, int]
    build_id: str | None = None
    where: str = "host"
    symbols: set[str] = field(default_factory=set)
    mtime_ns: int = 0


def ld_cache_paths(path: str = LD_CACHE) -> list[str]:
    """The paths named libnccl* in the dynamic linker's cache (the strings of its table: both the
    old and the new format keep them NUL-terminated in one string area)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(16 << 20)
    except OSError:
        return []
    out = []
    for raw in data.split(b"\0"):
        if raw.startswith(b"/") and b"/lib" in raw:
            base = os.path.basename(raw)
            if base.startswith((b"libnccl", b"librccl")):
                out.append(raw.decode("utf-8", "replace"))
    return list(dict.fromkeys(out))


def build_id(path: str) -> str | None:
    """The GNU build id of an ELF file (its .note.gnu.build-id), or None."""
    try:
        note = next((s for s in sections(path) if s.name == ".note.gnu.build-id"), None)
        if note is None or note.size > 4096:
            return None
        with open(path, "rb") as fh:
            fh.seek(note.offset)
            data = fh.read(note.size)
        namesz, descsz, ntype = struct.unpack_from("<III", data)
        if ntype != 3:
            return None
        start = 12 + ((namesz + 3) & ~3)
        return data[start:start + descsz].hex() or None
    except (OSError, ElfError, struct.error):
        return None


def _candidates(root: str) -> list[str]:
    """The libnccl paths under one root ("/" or a container's root), by the folders above."""
    root = root.rstrip("/")
    found: list[str] = []
    for d in LIB_DIRS:
        for name in NCCL_NAMES:
            found += glob.glob(f"{root}/{d}/{name}")
    for d in SITE_DIRS:
        for sub in IN_SITE:
            for name in NCCL_NAMES:
                found += glob.glob(f"{root}/{d}/{sub}/{name}")
    return found


def container_roots(own_mnt: str | None = None) -> dict[int, str]:
    """One process per mount namespace other than ours: pid -> its root (``/proc/PID/root``),
    the running containers' file systems as the host reaches them."""
    own_mnt = own_mnt or _mntns("self")
    roots: dict[str, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        ns = _mntns(name)
        if ns and ns != own_mnt and ns not in roots:
            roots[ns] = int(name)
    return {pid: f"/proc/{pid}/root" for pid in sorted(roots.values())}


def _mntns(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def scan(roots: dict[str, str] | None = None, layers: tuple[str, ...] = LAYER_ROOTS, containers: bool = True,
         ld_cache: str = LD_CACHE, probe: str = "ncclAllReduce", wanted=()) -> list[FoundLib]:
    """The distinct traceable libnccl files of this host (see the module's text), newest first.

    ``roots``: where -> a root folder to look under (default ``{"host": "/"}``); ``layers``: globs
    of the image layers' roots; ``containers``: also the roots of the running containers;
    ``probe``: the symbol a file must export; ``wanted``: the symbols kept in ``symbols``."""
    places: list[tuple[str, str]] = []
    places += [("ld-cache", p) for p in ld_cache_paths(ld_cache)]
    for where, root in (roots or {"host": "/"}).items():
        places += [(where, p) for p in _candidates(root)]
    for pattern in layers:
        for root in sorted(glob.glob(pattern))[:500]:
            places += [("layer", p) for p in _candidates(root)]
    if containers:
        for pid, root in container_roots().items():
            places += [(f"container {pid}", p) for p in _candidates(root)]
    seen_keys: set[tuple[int, int]] = set()
    out: list[FoundLib] = []
    for where, path in places[:MAX_FILES]:
        try:
            real = os.path.realpath(path) if not path.startswith("/proc/") else path
            st = os.stat(real)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen_keys or not os.path.isfile(real):
            continue
        seen_keys.add(key)
        try:
            syms = exported_functions_cached(real)
        except (OSError, ElfError):
            continue
        if probe not in syms:
            continue
        out.append(FoundLib(path=real, key=key, build_id=build_id(real), where=where, mtime_ns=st.st_mtime_ns,
                            symbols={s for s in wanted if s in syms and syms[s].value}))
    out.sort(key=lambda f: -f.mtime_ns)
    return out


def choose(found: list[FoundLib], limit: int, mapped: set[tuple[int, int]] = frozenset()) -> tuple[list[FoundLib], list[FoundLib]]:
    """(traced, left out) of ``found`` under ``limit`` files: those whose key is in ``mapped``
    (a live process maps them) first, then one per build id newest first, then the other copies."""
    first = [f for f in found if f.key in mapped]
    rest = [f for f in found if f.key not in mapped]
    builds: set[str] = set()
    one, copies = [], []
    for f in rest:
        if f.build_id is None or f.build_id not in builds:
            one.append(f)
            if f.build_id:
                builds.add(f.build_id)
        else:
            copies.append(f)
    ordered = first + one + copies
    return ordered[:max(0, limit)], ordered[max(0, limit):]
