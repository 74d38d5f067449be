"""The watcher's init-hang trigger: ranks stuck in a communicator's init, before any collective.

A job that never finishes initialization makes no collective, so the hang trigger (a
collective in flight, ``capture.watch.monitors``) never sees it. Two signs, each for ``--hang-after``
(its floor, ``HANG_AFTER_FLOOR_S``, by default: a large job's init takes that long legitimately):

- **traced**: an ``ncclCommInitRank``/``ncclCommInitRankConfig`` entered and not returned, or an
  ``ncclCommSplit`` entered (``split_enter``) and not returned (bpf/nccl.bt; the spool hands the
  lines over, ``Spool.inits``);
- **not traced** (a library the tracer does not cover): a process the watcher follows as an NCCL
  job, with no collective ever seen, with a thread blocked in ``connect`` on a socket sample after
  sample (a bootstrap connection that never opens: its SYNs dropped). Threads in accept or recv
  are left alone: a store server, a data loader do that while a job loads its model.

Each stuck init is reported once (one trigger per process and init). Standard library only.
"""
from __future__ import annotations

import os
import time

from .triggers import Trigger

# x86-64 syscall numbers of the calls the bootstrap blocks in (first argument: the fd)
SOCKET_CALLS = {42: "connect", 43: "accept", 288: "accept4", 45: "recvfrom", 0: "read", 47: "recvmsg"}
# those that alone say "stuck in the bootstrap" for a process whose NCCL calls are not traced: a
# connection that never opens (a SYN dropped). A thread in accept or recv is what every store
# server and data loader does while a job loads its model: no trigger on those
UNTRACED_CALLS = ("connect",)
INIT_FNS = ("ncclCommInitRank", "ncclCommInitRankConfig")


class InitWatch:
    """Open inits by (pid, tid) from the tracer's lines, and the untraced processes blocked in
    sockets; :meth:`check` fires the watcher's trigger."""

    def __init__(self):
        self.open: dict[tuple[int, int], dict] = {}
        self.reported: set[tuple] = set()
        self.blocked_since: dict[int, tuple[float, str]] = {}    # pid -> (monotonic s, what)

    def feed(self, events: list[dict]) -> None:
        for ev in events:
            try:
                key = (int(ev["pid"]), int(ev["tid"]))
            except (KeyError, TypeError, ValueError):
                continue
            kind, fn = ev.get("ev"), ev.get("fn")
            if kind == "comm_init" and fn in INIT_FNS and ev.get("t1") is None:
                self.open.setdefault(key, ev)
            elif kind == "split_enter":
                self.open.setdefault(key, dict(ev, fn="ncclCommSplit"))
            elif (kind == "ret" and ev.get("k") == "init") or (kind == "comm_init" and fn == "ncclCommSplit"):
                self.open.pop(key, None)

    def stuck(self, now_ns: int, after_ns: int) -> list[dict]:
        """Open inits older than ``after_ns`` of live processes (the gone ones forgotten)."""
        out = []
        for key, ev in list(self.open.items()):
            if not os.path.isdir(f"/proc/{key[0]}"):
                del self.open[key]
                continue
            t0 = int(ev.get("t0") or 0)
            if t0 and now_ns - t0 >= after_ns and (key, t0) not in self.reported:
                out.append(dict(ev, pid=key[0], tid=key[1], quiet_ns=now_ns - t0))
        return out

    def check(self, watcher, after_s: float) -> None:
        """Feed the spool's init lines, then fire one trigger for the stuck inits (traced) or the
        processes blocked in bootstrap sockets (not traced)."""
        tr = watcher.tracing
        spool = getattr(tr, "spool", None)
        if spool is not None and spool.inits:
            events, spool.inits[:] = list(spool.inits), []
            self.feed(events)
        now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        stuck = self.stuck(now_ns, int(after_s * 1e9))
        if stuck:
            for st in stuck:
                self.reported.add(((st["pid"], st["tid"]), int(st["t0"])))
            what = []
            for st in stuck:
                r = st.get("rank")
                what.append(f"pid {st['pid']}" + (f" (rank {r} of {st.get('nranks')})" if r is not None else ""))
            quiet = max(st["quiet_ns"] for st in stuck) / 1e9
            fns = sorted({st.get("fn") or "init" for st in stuck})
            watcher.fire(Trigger("hang", f"stuck in communicator init ({', '.join(fns)}) for {quiet:.0f}s with no "
                                 f"collective (hang after {after_s:g}s) in {', '.join(what)}", time.time_ns(), now_ns,
                                 pids=sorted({st["pid"] for st in stuck}), source="tracer (init)"))
            return
        self.check_untraced(watcher, after_s)

    def check_untraced(self, watcher, after_s: float) -> None:
        """The processes the tracer does not see (``Watcher.untraced``) with no collective seen,
        blocked in a bootstrap socket since at least ``after_s``."""
        mon = watcher.monitor
        seen = set(mon.last_coll) if mon is not None else set()
        now = time.monotonic()
        pids = [p for p in watcher.untraced() if p not in seen]
        for pid in list(self.blocked_since):
            if pid not in pids:
                del self.blocked_since[pid]
        fire = []
        for pid in pids:
            what = blocked_in_socket(pid)
            if what is None or not what.startswith(UNTRACED_CALLS):
                self.blocked_since.pop(pid, None)
                continue
            since, _ = self.blocked_since.setdefault(pid, (now, what))
            if now - since >= after_s and ("untraced", pid, since) not in self.reported:
                self.reported.add(("untraced", pid, since))
                fire.append((pid, what, now - since))
        if fire:
            parts = []
            for pid, what, _ in fire:
                info = watcher.s.procs.get(pid)
                r = info.rank_facts().get("rank") if info else None
                parts.append(f"pid {pid}" + (f" (rank {r})" if r is not None else "") + f" in {what}")
            quiet = max(q for _, _, q in fire)
            watcher.fire(Trigger("hang", f"blocked in the bootstrap's sockets for {quiet:.0f}s with no collective, "
                                 f"its NCCL calls not traced (init hang; hang after {after_s:g}s): {', '.join(parts)}",
                                 time.time_ns(), time.clock_gettime_ns(time.CLOCK_MONOTONIC),
                                 pids=[p for p, _, _ in fire], source="tracer-free (init)"))


def blocked_in_socket(pid: int) -> str | None:
    """``accept() on fd N`` when a thread of ``pid`` waits in one of SOCKET_CALLS on a socket
    (a thread in connect first, else the first one), else None."""
    found = None
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as fh:
                parts = fh.read().split()
        except OSError:
            continue
        if not parts or parts[0] in ("running", "-1"):
            continue
        try:
            nr, fd = int(parts[0]), int(parts[1], 16)
        except (ValueError, IndexError):
            continue
        name = SOCKET_CALLS.get(nr)
        if name is None:
            continue
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                if found is None or (name in UNTRACED_CALLS and not found.startswith(UNTRACED_CALLS)):
                    found = f"{name}() on fd {fd}"
        except OSError:
            continue
    return found
