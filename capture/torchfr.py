"""PyTorch Flight Recorder: trigger a rank's dump through its debug pipe, find dumps.

What PyTorch does (``torch/csrc/distributed/c10d/ProcessGroupNCCL.{hpp,cpp}``,
``NCCLUtils.cpp`` / ``FlightRecorder.cpp``; details and versions in capture/README.md):

- ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>``: the process group with uid 0 (the
  default group, so the rank is the global rank) unlinks ``<stem><rank>.pipe``,
  creates it with ``mkfifo(0666)`` and opens it ``O_RDONLY|O_NONBLOCK``
  (``DumpPipe``), only when the trace buffer size is > 0. A thread of the process
  group polls it (``DumpPipe::shouldDump``: a read of more than 0 bytes) and then
  writes a dump. The name is the only one the NCCL backend reads
  (``TORCH_FR_DEBUG_INFO_PIPE_FILE`` belongs to the XCCL backend).
- The dump goes to ``<prefix><rank>``: prefix ``TORCH_FR_DUMP_TEMP_FILE`` (newer
  releases), else ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else a default:
  ``/tmp/nccl_trace_rank_`` (older releases), ``$HOME/.cache/torch/comm_lib_trace_rank_``
  (newer), ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`` (newest). Torch writes the
  file in place: a reader waits until its size stops changing.

Paths are those of the process's mount namespace: opened through ``/proc/PID/root``
(absolute) or ``/proc/PID/cwd`` (relative). Standard library only.
"""
from __future__ import annotations

import errno
import glob
import os
import re
import stat
import time
from dataclasses import dataclass, field

PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")   # the first set wins in torch
OLD_DEFAULT = "/tmp/nccl_trace_rank_"
CACHE_NAME = "torch/comm_lib_trace_rank_"


def in_process(pid: int, path: str) -> str:
    """path as pid sees it, openable from here (its mount namespace, its working directory);
    once the process is gone, the path as it is here (a dump written at its exit)."""
    root = f"/proc/{pid}/root"
    if path.startswith("/"):
        return root + path if os.path.exists(root) else path
    return os.path.join(f"/proc/{pid}/cwd", path)


def process_vars(pid: int, names=("HOME", "XDG_CACHE_HOME")) -> dict[str, str]:
    """A few variables of pid's environment that procs.read_env leaves out."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k.decode("utf-8", "replace") in names:
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def dump_prefixes(pid: int, env: dict[str, str]) -> list[str]:
    """Every prefix the process's torch may write its dump to (its own paths)."""
    explicit = [env[v] for v in PREFIX_VARS if env.get(v)]
    if explicit:
        return list(dict.fromkeys(explicit))
    extra = process_vars(pid)
    out = [OLD_DEFAULT]
    if extra.get("XDG_CACHE_HOME"):
        out.append(os.path.join(extra["XDG_CACHE_HOME"], CACHE_NAME))
    out.append(os.path.join(extra.get("HOME") or "/tmp", ".cache", CACHE_NAME))
    return list(dict.fromkeys(out))


def dump_files(pid: int, env: dict[str, str], rank: int | None) -> list[str]:
    """Existing dumps of pid's rank (all ranks' when the rank is unknown): host-side paths of
    regular files ``<prefix><rank>`` (never the pipe, never a FIFO)."""
    found = []
    for prefix in dump_prefixes(pid, env):
        host = in_process(pid, prefix)
        if rank is not None:
            cands = [host + str(rank)]
        else:
            cands = [p for p in glob.glob(glob.escape(host) + "*") if re.fullmatch(r"\d+", p[len(host):])]
        found += [p for p in sorted(cands) if os.path.isfile(p)]
    return found


def pipe_paths(pid: int, env: dict[str, str], rank: int | None) -> tuple[str, list[str]]:
    """(the pipe as the process names it, host-side paths of existing pipes)."""
    stem = env.get(PIPE_VAR, "")
    if rank is not None:
        shown = f"{stem}{rank}.pipe"
        host = in_process(pid, shown)
        return shown, [host] if os.path.exists(host) else []
    shown = f"{stem}<rank>.pipe"
    host_stem = in_process(pid, stem)
    hits = [p for p in glob.glob(glob.escape(host_stem) + "*.pipe") if re.fullmatch(r"\d+\.pipe", p[len(host_stem):])]
    return shown, sorted(hits)


def trigger(path: str) -> tuple[bool, str]:
    """Write one byte to a dump pipe without ever blocking: (written, what happened)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return False, f"{e.strerror}"
    if not stat.S_ISFIFO(st.st_mode):
        return False, "not a FIFO"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return False, "nobody has the pipe open for reading (no torch thread polls it): no dump triggered"
        return False, f"open: {e.strerror}"
    try:
        os.write(fd, b"1")
    except OSError as e:
        if e.errno == errno.EAGAIN:
            return False, "the pipe is full (earlier triggers not read yet): no dump triggered"
        return False, f"write: {e.strerror}"
    finally:
        os.close(fd)
    return True, "1 byte written"


@dataclass
class Pending:
    key: str
    pid: int
    rank: int | None
    shown: str
    triggered_ns: int
    started_ns: int
    before: dict[str, tuple[int, int]] = field(default_factory=dict)   # dump path -> (mtime_ns, size)
    env: dict[str, str] = field(default_factory=dict)


def file_sig(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size) if stat.S_ISREG(st.st_mode) else None


def wait_dumps(pending: list[Pending], deadline_monotonic: float, poll_s: float = 0.1) -> dict[str, str | None]:
    """Wait (until the deadline) for each pending trigger's dump to appear or change and its
    size to stay the same for two polls; key -> the dump's host path (None: none came). Two
    polls at least, however late this is called: a dump written in time is taken even when
    the caller comes back after the deadline (stopping the tracer can take longer)."""
    result: dict[str, str | None] = {p.key: None for p in pending}
    last: dict[tuple[str, str], tuple[int, int]] = {}
    polls = 0
    while True:
        polls += 1
        for p in pending:
            if result[p.key] is not None:
                continue
            for f in dump_files(p.pid, p.env, p.rank):
                sig = file_sig(f)
                if sig is None or sig[1] == 0 or p.before.get(f) == sig:
                    continue
                if last.get((p.key, f)) == sig:      # unchanged since the last poll: complete
                    result[p.key] = f
                    break
                last[(p.key, f)] = sig
        if all(v is not None for v in result.values()) or (time.monotonic() >= deadline_monotonic and polls >= 2):
            return result
        time.sleep(poll_s)
