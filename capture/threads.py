"""What every thread of a process is doing, from /proc alone (no ptrace stop).

Per thread: its name, scheduler state, wchan, CPU time and the syscall it sits in
(``/proc/PID/task/TID/syscall``: number, six arguments, stack and program counter). For
the calls that wait on file descriptors the fds are resolved to what they are (a socket's
inode joins ``ss -e``'s ``ino:``), so a hang's analysis can tell who waits on whom:

- fd calls (read, recvfrom, recvmsg, sendto, write, accept, connect, ...): argument 0;
- poll/ppoll: the ``struct pollfd`` array (argument 0, argument 1 entries), read from
  ``/proc/PID/mem`` (a read of the process's memory, not a stop; root, or the same user
  where the kernel's ptrace policy allows);
- select/pselect6: the read and write fd_set bitmaps (arguments 1 and 2, argument 0 bits);
- epoll_wait/epoll_pwait/epoll_pwait2: the epoll fd's ``/proc/PID/fdinfo`` ``tfd:`` list.

A call with a timeout that a stop interrupted (a debugger, eu-stack or py-spy attaching: the
watcher takes native stacks at a hang's trigger) goes on as ``restart_syscall``, whose number
says nothing of the call; its registers still hold the call's arguments. Where the thread sleeps
says which it was (``wchan``: ``poll_schedule_timeout`` for poll and select, by their arguments;
``hrtimer_nanosleep``; ``futex_*``), and the thread is read as in that call, with a ``note``.

Stdlib only; bounded (MAX_THREADS threads, MAX_FDS fds per call); an unreadable item is a
``note`` on its thread, never an exception.
"""
from __future__ import annotations

import os
import platform
import re
import time

MAX_THREADS = 4096
MAX_FDS = 256
POLLIN, POLLPRI, POLLOUT = 0x1, 0x2, 0x4
EPOLLIN, EPOLLOUT = 0x1, 0x4

# the blocking calls a hang's threads sit in, by architecture
SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 16: "ioctl", 19: "readv", 20: "writev", 23: "select",
               24: "sched_yield", 34: "pause", 35: "nanosleep", 42: "connect", 43: "accept", 44: "sendto",
               45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 128: "rt_sigtimedwait",
               130: "rt_sigsuspend", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 270: "pselect6",
               271: "ppoll", 281: "epoll_pwait", 288: "accept4", 299: "recvmmsg", 441: "epoll_pwait2"},
    "aarch64": {22: "epoll_pwait", 29: "ioctl", 63: "read", 64: "write", 65: "readv", 66: "writev", 72: "pselect6",
                73: "ppoll", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep", 124: "sched_yield",
                133: "rt_sigsuspend", 137: "rt_sigtimedwait", 202: "accept", 203: "connect", 206: "sendto",
                207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 242: "accept4", 243: "recvmmsg", 260: "wait4",
                441: "epoll_pwait2"},
}
# restart_syscall, by architecture: a timed call resumed after a stop
RESTART_SYSCALL = {"x86_64": 219, "aarch64": 128}
FD_ARG0 = {"read": "in", "readv": "in", "recvfrom": "in", "recvmsg": "in", "recvmmsg": "in", "accept": "in",
           "accept4": "in", "write": "out", "writev": "out", "sendto": "out", "sendmsg": "out", "connect": "out",
           "ioctl": None}
SOCKET_RE = re.compile(r"^socket:\[(\d+)\]$")
TFD_RE = re.compile(r"^tfd:\s*(\d+)\s+events:\s*([0-9a-fA-F]+)")


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _events(inp: bool, out: bool) -> str | None:
    return ",".join(x for x, on in (("in", inp), ("out", out)) if on) or None


class _Mem:
    """Reads of another process's memory through /proc/PID/mem, opened once."""

    def __init__(self, pid: int):
        self.pid, self.fh, self.error = pid, None, None

    def read(self, addr: int, n: int) -> bytes | None:
        if self.error:
            return None
        try:
            if self.fh is None:
                self.fh = open(f"/proc/{self.pid}/mem", "rb", buffering=0)
            self.fh.seek(addr)
            return self.fh.read(n)
        except (OSError, OverflowError, ValueError) as e:
            self.error = f"/proc/{self.pid}/mem: {getattr(e, 'strerror', None) or e}"
            return None

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def _waits(pid: int, name: str, args: list[int], mem: _Mem) -> tuple[list[tuple[int, str | None]], str | None]:
    """(fd, events) the call waits on, and a note when they could not be read."""
    if name in FD_ARG0:
        return [(args[0], FD_ARG0[name])], None
    if name in ("poll", "ppoll"):
        n = min(args[1], MAX_FDS)
        raw = mem.read(args[0], 8 * n) if n else b""
        if raw is None:
            return [], mem.error
        out = []
        for i in range(len(raw) // 8):
            fd = int.from_bytes(raw[8 * i:8 * i + 4], "little", signed=True)
            ev = int.from_bytes(raw[8 * i + 4:8 * i + 6], "little")
            if fd >= 0:
                out.append((fd, _events(bool(ev & (POLLIN | POLLPRI)), bool(ev & POLLOUT))))
        return out, None
    if name in ("select", "pselect6"):
        nfds = min(args[0], 1 << 16)
        size = (nfds + 7) // 8
        found: dict[int, list[bool]] = {}
        for k, ptr in ((0, args[1]), (1, args[2])):
            if not ptr or not size:
                continue
            bits = mem.read(ptr, size)
            if bits is None:
                return [], mem.error
            for fd in range(min(nfds, len(bits) * 8)):
                if bits[fd // 8] >> (fd % 8) & 1:
                    found.setdefault(fd, [False, False])[k] = True
        return [(fd, _events(*io)) for fd, io in sorted(found.items())[:MAX_FDS]], None
    if name.startswith("epoll_"):
        info = _read(f"/proc/{pid}/fdinfo/{args[0]}")
        if info is None:
            return [], f"/proc/{pid}/fdinfo/{args[0]} unreadable"
        out = []
        for line in info.splitlines():
            m = TFD_RE.match(line)
            if m:
                ev = int(m[2], 16)
                out.append((int(m[1]), _events(bool(ev & EPOLLIN), bool(ev & EPOLLOUT))))
        return out[:MAX_FDS], None
    return [], None


def restarted_call(wchan: str | None, args: list[int]) -> str | None:
    """The call a thread in ``restart_syscall`` resumed, from where it sleeps (``wchan``) and
    its arguments: poll (``args``: pollfd array, count, timeout) or select (count, fd_set
    pointers) in ``poll_schedule_timeout``, clock_nanosleep, futex; None when it cannot tell."""
    w = wchan or ""
    if w.startswith("poll_schedule_timeout") and len(args) >= 2:
        return "poll" if args[1] <= MAX_FDS else "select"
    if w.startswith("hrtimer_nanosleep") or w.startswith("do_nanosleep"):
        return "clock_nanosleep"
    if w.startswith("futex"):
        return "futex"
    return None


def thread_states(pid: int, phase: str) -> dict:
    """The JSON-able sample of every thread of ``pid`` (see the module docstring)."""
    arch = platform.machine()
    names = SYSCALLS.get(arch, {})
    sample = {"pid": pid, "phase": phase, "sample_ns": time.time_ns(), "monotonic_ns": time.monotonic_ns(),
              "arch": arch, "clk_tck": os.sysconf("SC_CLK_TCK"), "threads": [], "notes": []}
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError as e:
        raise LookupError(f"process {pid}: {e.strerror}") from None
    if len(tids) > MAX_THREADS:
        sample["notes"].append(f"{len(tids)} threads: the first {MAX_THREADS} are kept")
        tids = tids[:MAX_THREADS]
    mem = _Mem(pid)
    fd_kind: dict[int, str | None] = {}

    def socket_of(fd: int) -> int | None:
        if fd not in fd_kind:
            try:
                fd_kind[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                fd_kind[fd] = None
        m = SOCKET_RE.match(fd_kind[fd] or "")
        return int(m[1]) if m else None
    try:
        for tid in tids:
            base = f"/proc/{pid}/task/{tid}"
            t: dict = {"tid": tid, "name": (_read(f"{base}/comm") or "").strip() or None, "state": None,
                       "wchan": (_read(f"{base}/wchan") or "").strip() or None, "syscall_nr": None,
                       "syscall_name": None, "args": [], "utime_ticks": None, "stime_ticks": None, "waits": []}
            stat = _read(f"{base}/stat")
            if stat and ")" in stat:
                f = stat.rsplit(")", 1)[1].split()
                if len(f) > 13:
                    t["state"], t["utime_ticks"], t["stime_ticks"] = f[0], int(f[11]), int(f[12])
            if t["wchan"] == "0":
                t["wchan"] = None
            sc = _read(f"{base}/syscall")
            if sc is None:
                t["note"] = "syscall unreadable (needs root or the same user)"
            else:
                parts = sc.split()
                if parts and parts[0].lstrip("-").isdigit() and int(parts[0]) >= 0 and len(parts) >= 7:
                    nr = int(parts[0])
                    args = [int(a, 16) for a in parts[1:7]]
                    t["syscall_nr"], t["args"] = nr, [hex(a) for a in args]
                    t["syscall_name"] = names.get(nr)
                    if t["syscall_name"] is None and nr == RESTART_SYSCALL.get(arch):
                        t["syscall_name"] = restarted_call(t["wchan"], args)
                        if t["syscall_name"]:
                            t["note"] = f"restart_syscall: a timed {t['syscall_name']} resumed after a stop"
                    if t["syscall_name"]:
                        waits, note = _waits(pid, t["syscall_name"], args, mem)
                        t["waits"] = [{"fd": fd, "events": ev, "socket_inode": socket_of(fd)} for fd, ev in waits]
                        if note:
                            t["note"] = note
                elif parts and parts[0] == "running":
                    t["syscall_name"] = None
            sample["threads"].append(t)
    finally:
        mem.close()
    return sample
