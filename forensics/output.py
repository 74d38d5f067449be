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
    if os.path.exists(path) and not force:
        raise InputError(f"{path}: already exists (use --force to overwrite)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError(f"{path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".stallscope-", dir=directory)
    try:
        # mkstemp makes the file 0600: give it the mode a plain open() would (0666 & ~umask)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, mode, newline="" if "b" not in mode else None) as fh:
            yield fh
        if force:
            os.replace(tmp, path)
        else:   # a file created meanwhile is not overwritten either: link() fails on it
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise InputError(f"{path}: already exists (use --force to overwrite)") from None
            except OSError:   # a file system without hard links
                os.replace(tmp, path)
            else:
                os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
