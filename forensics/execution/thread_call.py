"""Work done on a thread while this one goes on (:class:`ThreadCall`): DuckDB's, which leaves
the GIL, so the second core does it. With worker processes the database is opened and its
tables created this way while this thread merges the hosts (:func:`open_database_on_thread`).
"""
from __future__ import annotations

import threading
from typing import Any, Callable


class ThreadCall:
    """``fn(*args, **kwargs)`` computed on a thread while this one goes on. :meth:`result` is
    its value, or its error raised here; :meth:`discard` drops a connection it made, for a
    caller that failed."""

    def __init__(self, name: str, fn: Callable[..., Any], *args, **kwargs):
        self._box: dict[str, Any] = {}

        def run() -> None:
            try:
                self._box["value"] = fn(*args, **kwargs)
            except BaseException as exc:   # noqa: BLE001 - raised again on the caller's thread
                self._box["error"] = exc

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def result(self) -> Any:
        """The value, once the thread is done; its error raised here."""
        self._thread.join()
        if "error" in self._box:
            raise self._box.pop("error")
        return self._box.pop("value")

    def discard(self) -> None:
        """The thread joined and the connection it made, if any, closed."""
        self._thread.join()
        con = self._box.pop("value", None)
        if con is not None:
            con.close()


def open_database_on_thread(db) -> ThreadCall:
    """The database of ``db`` (a path, or None: in memory) opened and its tables created empty
    (:func:`forensics.model.database.open_database`) on a thread."""
    from ..model.database import open_database
    return ThreadCall("stallscope-open", open_database, str(db) if db else None)


def opened_or_none(call: ThreadCall):
    """The connection :func:`open_database_on_thread` made (now the caller's), or None where it
    failed: it is opened again where it is used, which says why."""
    try:
        return call.result()
    except Exception:   # noqa: BLE001 - see above
        return None
