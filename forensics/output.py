"""Output files: never overwrite what exists unless asked, never leave half a file."""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from typing import Iterator, TextIO

from .errors import InputError


@contextlib.contextmanager
def open_output(path: str, force: bool = False, mode: str = "w") -> Iterator[TextIO]:
    """Open ``path`` for writing through a temporary file renamed into place.

    ``-`` is standard output. An existing file is an error unless ``force``.
    """
    if path == "-":
        yield sys.stdout.buffer if "b" in mode else sys.stdout
        return
    fd, tmp = tempfile.mkstemp(prefix=".stallscope-", dir=check_output(path, force))
    try:
        os.fchmod(fd, _plain_mode())   # mkstemp makes the file 0600
        with os.fdopen(fd, mode, newline="" if "b" not in mode else None) as fh:
            yield fh
        commit(tmp, path, force)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_output(path: str, force: bool) -> str:
    """Refuse an output path that exists (unless ``force``), is not a regular file, or
    whose folder is missing; return that folder."""
    if os.path.isdir(path) or (os.path.exists(path) and not os.path.isfile(path)):
        raise InputError(f"{path}: is not a regular file")
    if os.path.exists(path) and not force:
        raise InputError(f"{path}: already exists (use --force to overwrite)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError(f"{path}: directory {directory} does not exist")
    return directory


def _plain_mode() -> int:
    """The mode a plain ``open()`` gives a new file: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def commit(tmp: str, path: str, force: bool) -> None:
    """Move a finished temporary file into place: replacing with ``force``; otherwise only
    if nothing appeared at ``path`` meanwhile (``link`` fails on an existing name)."""
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise InputError(f"{path}: already exists (use --force to overwrite)") from None
    except OSError:   # a file system without hard links
        os.replace(tmp, path)
    else:
        os.unlink(tmp)


@contextlib.contextmanager
def staged_path(path: str | None, force: bool = False, suffix: str = "") -> Iterator[str | None]:
    """A temporary path next to ``path`` for a tool that writes the file itself (DuckDB):
    moved into place when the block succeeds, removed (with its side files) when it fails.
    The existing file stays untouched until the new one is complete."""
    if path is None:
        yield None
        return
    fd, tmp = tempfile.mkstemp(prefix=".stallscope-", suffix=suffix, dir=check_output(path, force))
    os.close(fd)
    os.unlink(tmp)   # the tool creates it (DuckDB refuses an empty file)
    try:
        yield tmp
        os.chmod(tmp, _plain_mode())
        commit(tmp, path, force)
    finally:
        for leftover in (tmp, tmp + ".wal"):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
