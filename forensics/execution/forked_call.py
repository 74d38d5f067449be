"""A call computed in a forked copy of this process while this process goes on with other
work on another core (:class:`ForkedCall`): the second core's share of the work after the
reading (:mod:`.shared_steps`)."""
from __future__ import annotations

import os
import pickle
import select
import signal
import tempfile
import time


class ForkedCall:
    """``fn(*args)`` computed now in a forked copy of this process (its memory shared
    copy-on-write, nothing to send it), while this process goes on with other work on another
    core; :meth:`result` is its value. With ``stream``, ``fn(*args)`` is an iterable whose
    items the child sends one by one as it makes them, for :meth:`received` to collect.

    The child pickles each item into an unlinked spool file and says where it lies down a pipe
    (16 bytes an item): it never waits for this process to read, however large the items (a
    pipe holds 64 kB; a child writing into a full one would stop computing until this process,
    busy with its own work, read it). Then it leaves with ``os._exit`` (no atexit handler, no
    buffered output of this process written twice). Best effort: where fork is missing, or the
    child fails or sends nothing for ``timeout`` seconds while waited for, :meth:`result` is
    None (:meth:`received` has what came before) and the caller computes the rest itself."""

    def __init__(self, fn, *args, timeout: float = 60.0, stream: bool = False):
        self.timeout = timeout
        self._pid: int | None = None
        self._fd: int | None = None
        self._spool = None
        self._buf = bytearray()
        self._status: int | None = None
        if not hasattr(os, "fork"):
            return
        try:
            spool = tempfile.TemporaryFile()
        except OSError:
            return
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            spool.close()
            return
        if pid == 0:                                  # the child
            status = 1
            try:
                os.close(r)
                at = 0
                for item in (fn(*args) if stream else [fn(*args)]):
                    data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
                    done = 0
                    while done < len(data):
                        done += os.pwrite(spool.fileno(), memoryview(data)[done:], at + done)
                    os.write(w, at.to_bytes(8, "little") + len(data).to_bytes(8, "little"))
                    at += len(data)
                status = 0
            except BaseException:                     # noqa: BLE001 - the parent computes it then
                pass
            finally:
                os._exit(status)
        os.close(w)
        self._pid, self._fd, self._spool = pid, r, spool

    @property
    def running(self) -> bool:
        """Whether the child may still send something (not yet ended, reaped or stopped)."""
        return self._pid is not None

    def result(self):
        """The value (without ``stream``); None where the child failed or was too slow."""
        items = []
        while self._pid is not None:
            items += self.received(wait=True)
        return items[0] if items and self._status == 0 else None

    def received(self, wait: bool = False) -> list:
        """The items the child has sent since the last call: those it has said are ready, or
        with ``wait`` at least one, unless the child ends (then what it sent before it ended;
        a child that sends nothing for ``timeout`` seconds is stopped)."""
        out: list = []
        deadline = time.monotonic() + self.timeout
        while self._pid is not None:
            left = deadline - time.monotonic() if wait and not out else 0
            if left < 0 or not select.select([self._fd], [], [], max(left, 0))[0]:
                if wait and not out:                  # stuck: give up on it
                    self.cancel()
                break
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:                             # the child is done
                self._reap()
                break
            self._buf += chunk
            out += self._items()
        return out

    def _items(self) -> list:
        out = []
        while len(self._buf) >= 16:
            at, n = int.from_bytes(self._buf[:8], "little"), int.from_bytes(self._buf[8:16], "little")
            del self._buf[:16]
            try:
                out.append(pickle.loads(_pread_all(self._spool.fileno(), n, at)))
            except Exception:                         # noqa: BLE001 - the caller makes it then
                pass
        return out

    def _reap(self) -> None:
        os.close(self._fd)
        self._spool.close()
        _, status = os.waitpid(self._pid, 0)
        self._status = os.waitstatus_to_exitcode(status)
        self._pid = None

    def cancel(self) -> None:
        """Nothing more is wanted (the caller failed, or made the rest itself): the child is
        stopped and reaped."""
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except OSError:
                pass
            self._reap()


def _pread_all(fd: int, n: int, at: int) -> bytes:
    """``n`` bytes of ``fd`` from offset ``at`` (``os.pread`` may return fewer)."""
    parts, got = [], 0
    while got < n:
        chunk = os.pread(fd, n - got, at + got)
        if not chunk:
            raise EOFError(f"spool ends {n - got} bytes short")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
