"""What a rank that never enqueued the collective its peers wait in was doing instead: the host
side of a hang (issue 44's ``host-stuck``: a rank stuck in its own code before its next collective).

A ``hang_mismatch`` (some rank never entered collective #n while its peers wait inside it) says
where that rank is *not*. A capture can also say where it *is*, from its process's main thread
(the one that enqueues the collectives: the thread whose id is the pid, or py-spy's MainThread):

- its stack (``stacks``: eu-stack, gdb or py-spy, taken when the job looked hung) and the
  thread's state when the tool attached;
- ``/proc`` at the end of the capture (``threads``): its state, the syscall it sits in, that
  syscall's fd and whether that fd is a socket;
- the scheduler samples (``offcpu``): how much of its last interval it ran or waited for a CPU.

:func:`host_activity` reads them into one of two answers:

- ``spin``: the thread is on a CPU (``/proc`` state R outside any syscall, the stack tool found
  it running, or it ran or waited to run most of its last sampled interval): a busy loop, a
  livelock, in the frame its stack names;
- ``block``: the thread sleeps in a syscall of its own: a read of a pipe or file, a poll, a
  sleep; a socket only when its peer is no rank of the job (NCCL's own waits are on sockets
  to peer ranks); a futex only where a stack shows the application's frame (a lock or a
  condition wait that never returns).

and None when the evidence does not say it, so that the finding stays the plainer
``hang_mismatch``: nothing sampled after the hang began (stacks taken at a capture's start
are used only when that capture began after the hang); a stack inside NCCL or a CUDA wait (the
rank is inside another collective); a thread parked waiting for a signal (``pause``,
``sigsuspend``: it left the training loop by another code path, the mismatch's own case); a
futex with no stack (a lock, or a CUDA or NCCL wait: the syscall alone cannot tell). This
module registers no detector: :mod:`.hang` owns the ``hang_host`` kind it serves.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from .sql import model_table
from .comm_state import NCCL_FILE_RE, NCCL_FRAME_RE

# a thread waiting for a signal, nothing else: the rank parked itself (another code path), no stall
PARKED_SYSCALLS = {"pause", "rt_sigsuspend", "sigsuspend", "rt_sigtimedwait", "sigtimedwait", "sigwaitinfo"}
SPIN_SHARE = 0.5              # ran or waited for a CPU this share of its last sampled interval: spinning
FRAMES_SHOWN = 3
# frames of the C library and the loader (their source under glibc's tree, or the library's own file)
SYSTEM_FILE_RE = re.compile(r"(?:^|/)(?:sysdeps|nptl|csu|misc|io|posix|signal|libio|stdlib|time)/|"
                            r"(?:^|/)(?:libc|libpthread|libm|libdl|librt|ld-linux[^/]*)(?:[.-][^/]*)?$|linux-vdso")
SYSTEM_FUNCTION_RE = re.compile(r"^(?:\?\?|_start|__libc_start_\w+|start_thread|clone3?|__clone\w*)$")
# libc's internal spellings of a syscall wrapper ("__GI___libc_read", "__libc_pause") -> the call
_LIBC_PREFIX = re.compile(r"^(?:__GI_)?_*(?:libc_)?")


@dataclass(frozen=True)
class HostActivity:
    """``mode``: spin | block; ``tid``/``thread``: the main thread; ``syscall``/``fd``/``fd_kind``:
    where it blocks (block); ``frames``: its innermost application frames, innermost first
    (empty without a usable stack); ``cpu_share``: the share of its last sampled interval it ran
    or waited for a CPU (None without scheduler samples); ``sources``: the evidence read."""

    rank: int
    mode: str
    tid: int | None
    thread: str | None
    syscall: str | None = None
    fd: int | None = None
    fd_kind: str | None = None
    frames: list[str] = field(default_factory=list)
    cpu_share: float | None = None
    sources: list[str] = field(default_factory=list)

    @property
    def frame(self) -> str | None:
        return self.frames[0] if self.frames else None

    def where(self) -> str:
        """"host_busy_loop <- train <- main", or "" without a stack."""
        return " <- ".join(self.frames[:FRAMES_SHOWN])

    def doing(self) -> str:
        """"on a CPU in host_busy_loop", "blocked in read(2) in host_blocked_read" (headline size)."""
        if self.mode == "spin":
            return "on a CPU in " + self.frame if self.frame else "on a CPU"
        return f"blocked in {self.syscall}(2)" + (f" in {self.frame}" if self.frame else "")

    def text(self) -> str:
        """One chain step: what the rank's main thread was doing, and from which evidence."""
        who = f"its main thread ({self.thread + ', ' if self.thread else ''}tid {self.tid})" if self.tid is not None \
            else "its main thread"
        if self.mode == "spin":
            what = f"{who} was on a CPU, spinning" + (f" in {self.where()}" if self.frames else
                                                     " (no stack of it: the function is not known)")
            if self.cpu_share is not None:
                what += f"; it ran or waited for a CPU {self.cpu_share:.0%} of its last sampled interval"
        else:
            fd = f" (fd {self.fd}, {self.fd_kind})" if self.fd is not None and self.fd_kind else \
                f" (fd {self.fd})" if self.fd is not None else ""
            what = f"{who} was blocked in the {self.syscall} syscall{fd}" + (
                f" in {self.where()}" if self.frames else " (no stack of it: the function is not known)")
        return what + f" [{', '.join(self.sources)}]"


def host_activity(ctx, rank: int, since_ns: int | None = None) -> HostActivity | None:
    """What global ``rank``'s main thread was doing after ``since_ns`` (the hang's start, None
    when unknown) per the capture (module docstring): a :class:`HostActivity`, or None when the
    evidence does not positively show it spinning or blocked in host code."""
    th = _main_threads(ctx, rank, since_ns)
    stack, status = _main_stack(ctx, rank, since_ns)
    if any(NCCL_FRAME_RE.search(f) or (fl and NCCL_FILE_RE.search(fl)) for f, fl in stack):
        return None           # inside a collective or a CUDA wait: not host code
    frames = _app_frames(stack)
    share = _cpu_share(ctx, rank, since_ns)
    sources = []
    row = th.iloc[-1] if len(th) else None
    state = str(row["state"])[:1] if row is not None and isinstance(row["state"], str) else None
    syscall = row["syscall_name"] if row is not None and isinstance(row["syscall_name"], str) else None
    tid = int(row["tid"]) if row is not None and pd.notna(row["tid"]) else None
    name = row["name"] if row is not None and isinstance(row["name"], str) else None
    if row is not None:
        sources.append("/proc at the end of the capture")
    if stack:
        sources.append("its stack")
    if row is not None and syscall is None and state == "R" or row is None and status == "running" or \
            (share is not None and share >= SPIN_SHARE and (row is None or state == "R")):
        if share is not None:
            sources.append("scheduler samples")
        return HostActivity(rank, "spin", tid, name, frames=frames, cpu_share=share, sources=sources)
    if syscall is None and row is None and stack:
        syscall = _syscall_of(stack)
    if syscall is None or syscall in PARKED_SYSCALLS or state == "R":
        return None
    fd = int(row["fd"]) if row is not None and pd.notna(row["fd"]) else None
    fd_kind = None
    if row is not None and pd.notna(row["socket_inode"]):
        if _socket_peer_is_rank(ctx, int(row["socket_inode"])):
            return None       # waiting on a socket to a peer rank: NCCL's wait, not the host's
        fd_kind = "a socket to no rank of the job"
    elif fd is not None:
        fd_kind = "not a socket"
    if syscall == "futex" and not frames:
        return None           # a lock, or a CUDA/NCCL wait: the syscall alone cannot tell
    return HostActivity(rank, "block", tid, name, syscall=syscall, fd=fd, fd_kind=fd_kind, frames=frames,
                        cpu_share=share, sources=sources)


def _main_threads(ctx, rank: int, since_ns: int | None) -> pd.DataFrame:
    """The rank's main thread's rows of the threads table sampled at the end of a capture (after
    ``since_ns`` when known), oldest first."""
    th = model_table(ctx, "threads")
    if th.empty:
        return th
    th = th[(pd.to_numeric(th["rank"], errors="coerce") == rank).fillna(False).to_numpy()]
    th = th[(th["phase"].astype("string") == "end").fillna(False).to_numpy()]
    th = th[(pd.to_numeric(th["tid"], errors="coerce") == pd.to_numeric(th["pid"], errors="coerce")).fillna(False)
            .to_numpy()]
    t = pd.to_numeric(th["sample_ns"], errors="coerce")
    if since_ns is not None:
        th = th[(t.isna() | (t >= since_ns)).to_numpy()]
        t = pd.to_numeric(th["sample_ns"], errors="coerce")
    return th.assign(_t=t.fillna(0).to_numpy()).sort_values("_t", kind="stable")


def stacks_after(ctx, st: pd.DataFrame, since_ns: int | None) -> pd.DataFrame:
    """The rows of ``st`` (stacks) taken after the hang began at ``since_ns``: an end-of-capture
    dump, or one taken at the start of a capture that began after it (every row, when the hang's
    start is unknown). A stack from before (a capture attached before the job takes its stacks
    when it starts, if the job looks idle then) says nothing of where the rank is in the hang."""
    if since_ns is None or st.empty:
        return st
    started = {c.get("host"): c.get("started_ns") for c in (getattr(ctx.model, "captures", None) or [])
               if isinstance(c, dict)}
    late = st["host"].map(lambda h: isinstance(started.get(h), int) and started[h] >= since_ns).astype(bool)
    return st[((st["phase"].astype("string") == "end").fillna(False) | late).to_numpy()]


def _main_stack(ctx, rank: int, since_ns: int | None) -> tuple[list[tuple[str, str | None]], str | None]:
    """Innermost-first (function, file) of the rank's main thread in its latest usable dump, and
    the thread's state when the tool attached (running, sleeping, ...; None unknown)."""
    st = model_table(ctx, "stacks")
    if st.empty:
        return [], None
    st = st[(pd.to_numeric(st["rank"], errors="coerce") == rank).fillna(False).to_numpy()]
    st = stacks_after(ctx, st, since_ns)
    if st.empty:
        return [], None
    order = {"start": 0, "hung": 1, "end": 2}
    last = max(st["phase"].dropna().unique(), key=lambda p: order.get(p, 1), default=None)
    if last is not None:
        st = st[(st["phase"] == last).to_numpy()]
    tid, pid = pd.to_numeric(st["os_tid"], errors="coerce"), pd.to_numeric(st["pid"], errors="coerce")
    main = st[((tid == pid) | (st["thread_name"].astype("string") == "MainThread")).fillna(False).to_numpy()]
    if main.empty:
        return [], None
    main = main[main["thread_id"] == main["thread_id"].iloc[0]].sort_values("depth", kind="stable")
    status = main["status"].dropna()
    frames = [(str(f), None if pd.isna(fl) else str(fl)) for f, fl in zip(main["function"], main["code_file"])
              if isinstance(f, str) and f]
    return frames, (str(status.iloc[0]) if len(status) else None)


def _app_frames(stack: list[tuple[str, str | None]]) -> list[str]:
    """The stack's frames outside the C library and the loader, innermost first, once each."""
    out: list[str] = []
    for f, fl in stack:
        name = f.split("(")[0].strip()
        if SYSTEM_FUNCTION_RE.match(name) or (fl and SYSTEM_FILE_RE.search(fl)) or name.startswith("__"):
            continue
        if not out or out[-1] != name:
            out.append(name)
    return out


def _syscall_of(stack: list[tuple[str, str | None]]) -> str | None:
    """The syscall a stack ends in, from its innermost C library frame ("__GI___libc_read" -> read)."""
    for f, fl in stack[:2]:
        if fl and SYSTEM_FILE_RE.search(fl):
            name = _LIBC_PREFIX.sub("", f.split("(")[0].strip())
            return name or None
    return None


def _cpu_share(ctx, rank: int, since_ns: int | None) -> float | None:
    """The share of the main thread's last sampled interval it ran or waited for a CPU (offcpu)."""
    oc = model_table(ctx, "offcpu")
    if oc.empty:
        return None
    oc = oc[((pd.to_numeric(oc["rank"], errors="coerce") == rank)
             & (pd.to_numeric(oc["tid"], errors="coerce") == pd.to_numeric(oc["pid"], errors="coerce")))
            .fillna(False).to_numpy()]
    oc = oc.dropna(subset=["timestamp_ns", "oncpu_delta_ns"]).sort_values("timestamp_ns", kind="stable")
    if len(oc) < 2:
        return None
    a, b = oc.iloc[-2], oc.iloc[-1]
    if since_ns is not None and int(a["timestamp_ns"]) < since_ns:
        return None
    dt = int(b["timestamp_ns"]) - int(a["timestamp_ns"])
    if dt <= 0:
        return None
    wanted = float(b["oncpu_delta_ns"]) + (float(b["runq_delta_ns"]) if pd.notna(b["runq_delta_ns"]) else 0.0)
    return max(0.0, min(1.0, wanted / dt))


def _socket_peer_is_rank(ctx, inode: int) -> bool:
    """Whether the socket ``inode`` (sockets table) has a rank of the job at its other end."""
    s = model_table(ctx, "sockets")
    if s.empty or "inode" not in s:
        return False
    hit = s[(pd.to_numeric(s["inode"], errors="coerce") == inode).fillna(False).to_numpy()]
    return bool(pd.to_numeric(hit["peer_rank"], errors="coerce").notna().any())


__all__ = ["HostActivity", "PARKED_SYSCALLS", "host_activity", "stacks_after"]
