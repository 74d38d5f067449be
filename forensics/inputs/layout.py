"""A bundle's layout on disk, as the analyzer recognises it (standard library only: the command
line sorts its inputs with it before it imports anything heavy, :mod:`forensics.inputs.intake`).

A bundle is ``stallscope-<host>-<YYYYmmddTHHMMSSZ>[.tar.gz]``: a folder (or that folder
archived) holding ``manifest.json`` and the collectors' folders (``bpf/``, ``pcap/``, ``logs/``,
``ib/``, ``sys/``, ...; ``docs/DESIGN.md``).
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

BUNDLE_NAME_RE = re.compile(r"^stallscope-(?P<host>.+?)-(?P<stamp>\d{8}T\d{6}Z)(?:-\d+)?(?:\.tar\.gz|\.tgz|\.tar)?$")


def bundle_name(name: str) -> bool:
    """Whether a file or folder name is a capture's bundle name (``stallscope-<host>-<UTC>``)."""
    return BUNDLE_NAME_RE.match(name) is not None


def regular(p: Path) -> bool:
    """A regular file (not through a link)."""
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def find_root(folder: Path) -> Path | None:
    """The bundle's top folder: ``folder`` itself or its single sub-folder (one holding
    ``manifest.json``, ``bpf/`` or ``pcap/``), else None."""
    def looks(d: Path) -> bool:
        return regular(d / "manifest.json") or (d / "bpf").is_dir() or (d / "pcap").is_dir()
    if looks(folder):
        return folder
    try:
        subs = [d for d in folder.iterdir() if d.is_dir() and not d.is_symlink()]
    except OSError:
        return None
    if len(subs) == 1 and looks(subs[0]):
        return subs[0]
    return None


__all__ = ["BUNDLE_NAME_RE", "bundle_name", "find_root", "regular"]
