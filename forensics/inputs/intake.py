"""What the user gave ``stallscope analyze``: bundles, loose files, folders and archives, sorted out.

An incident often leaves no bundle at all: the job's logs (a Slurm ``slurm-1234.out``, a
torchrun log folder, every rank's output merged by the launcher), an nccl-tests run, ``ibstat``.
:func:`gather` takes any mix of paths and returns an :class:`Intake`: the bundles, read as
before (:class:`forensics.inputs.bundle.Bundle`), and the rest as one :class:`LooseSet`, read as a
pseudo-bundle whose files are typed by content (:mod:`forensics.inputs.loose`).

- A folder holding a bundle's ``manifest.json`` (one stallscope wrote: not another tool's of
  that name), or, given directly, a ``bpf/`` or ``pcap/``, is a bundle; any other folder is walked, links followed and their loops ended.
- An archive named like a bundle, or whose first members show a bundle's layout, is a bundle;
  any other archive (tar, tar.gz/bz2/xz, zip) or compressed file (gz, bz2, xz) is unpacked
  under the lenient rules of :func:`forensics.inputs.archive.unpack_loose`, into a folder this intake
  owns and removes (:meth:`Intake.close`), and its members are walked in turn.
- A FIFO, device or socket is never opened for reading: given directly it is refused with one
  line (:class:`InputError`), met inside a folder it is listed as not read.

Nothing the user gave is modified. Every file that is not read, and why, is kept
(``LooseSet.not_read``) for the report's capture section.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import InputError
from . import archive
from .layout import bundle_name, find_root

MAX_LOOSE_FILES = 20_000       # files looked at in the folders given (a home folder given by mistake)
MAX_NESTING = 3                # archives inside archives
LOOSE_LABEL = "loose evidence"
SPLIT_MIN_BYTES = 32 << 20     # loose evidence smaller than this is read by one process


@dataclass(frozen=True)
class LooseFile:
    """A loose file: how the report names it, where it can be read, its size."""

    rel: str
    path: str
    size: int
    order: int = 0        # its place in the walk (the order one process reads the files in)


@dataclass(frozen=True)
class NotRead:
    rel: str
    reason: str


@dataclass(frozen=True)
class LooseSet:
    """Loose evidence, read as one pseudo-bundle (:class:`forensics.inputs.loose.LooseBundle`).
    ``part``/``parts``: one of the shares :meth:`Intake.sources` splits it into for ``--jobs``
    (each read by one process, merged again by the model)."""

    label: str
    files: tuple[LooseFile, ...]
    not_read: tuple[NotRead, ...] = ()
    part: int = 1
    parts: int = 1
    given: tuple[str, ...] = ()      # the paths the user gave that hold it (what `query` takes again)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def name(self) -> str:
        return self.label if self.parts == 1 else f"{self.label} ({self.part}/{self.parts})"


@dataclass
class Intake:
    """The sources of one analysis, in the order given: bundle paths, then the loose set."""

    bundles: list[str] = field(default_factory=list)
    loose: LooseSet | None = None
    workdir: Path | None = None

    def sources(self, jobs: int = 1) -> list:
        """What the per-host stage reads (:func:`forensics.model.hosts.read_host`): each bundle
        path, and the loose set split into up to ``jobs`` shares of about equal bytes when it is
        large enough to pay for it (each file whole; the model merges them back)."""
        out: list = list(self.bundles)
        if self.loose is None:
            return out
        if jobs <= 1 or len(self.loose.files) < 2 or self.loose.size < SPLIT_MIN_BYTES:
            return out + [self.loose]
        k = min(jobs, len(self.loose.files))
        shares: list[list[LooseFile]] = [[] for _ in range(k)]
        sizes = [0] * k
        for f in sorted(self.loose.files, key=lambda f: -f.size):     # largest first, to the lightest share
            i = sizes.index(min(sizes))
            shares[i].append(f)
            sizes[i] += f.size
        shares = [s for s in shares if s]
        return out + [replace(self.loose, files=tuple(s), not_read=self.loose.not_read if i == 0 else (),
                              part=i + 1, parts=len(shares)) for i, s in enumerate(shares)]

    def describe(self) -> str:
        """What will be read, for a progress line: "4 bundle(s)", "12 loose file(s)", both."""
        parts = [f"{len(self.bundles)} bundle(s)"] if self.bundles else []
        if self.loose is not None:
            parts.append(f"{len(self.loose.files)} loose file(s)")
        return " and ".join(parts) or "nothing"

    def close(self) -> None:
        """Remove what was unpacked (the user's own files are never touched)."""
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> "Intake":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def gather(paths: list[str | os.PathLike], *, budget: archive.Budget | None = None,
           workdir: str | os.PathLike | None = None, exclude: list[str | os.PathLike] = ()) -> Intake:
    """Sort ``paths`` into bundles and loose evidence (module docstring). Raises InputError
    (one line) for a path that does not exist or is a special file; archives are unpacked
    below ``workdir`` (default: the system's temporary folder). ``exclude``: files that are
    not evidence wherever they are met (this run's own outputs, written into a folder given)."""
    if not paths:
        raise InputError("nothing to analyze: give bundles, log files or folders")
    walk = _Walk(budget or archive.Budget.of(_budget_from_env()), workdir)
    for x in exclude:
        try:
            st = os.stat(x)
            walk.seen[(st.st_dev, st.st_ino)] = "this run's own output"
        except OSError:
            pass
    try:
        for p in paths:
            walk.top(Path(p))
    except BaseException:
        walk.close()
        raise
    loose = None
    if walk.files or walk.not_read:
        given = tuple(str(p) for p in paths if str(p) not in walk.bundles)
        loose = LooseSet(LOOSE_LABEL, tuple(walk.files), tuple(walk.not_read), given=given)
    return Intake(bundles=walk.bundles, loose=loose, workdir=walk.tmp)


def _budget_from_env() -> int:
    """``STALLSCOPE_UNPACK_BYTES`` (a size as capture's --max-bytes takes it: 2G, 500M, bytes),
    else archive.LOOSE_BUDGET."""
    from capture.bundle_files import parse_size       # stdlib only, as the capture side must be
    v = os.environ.get("STALLSCOPE_UNPACK_BYTES", "").strip()
    if not v:
        return archive.LOOSE_BUDGET
    try:
        return parse_size(v)
    except ValueError:
        raise InputError(f"STALLSCOPE_UNPACK_BYTES={v!r} is not a size (e.g. 2G)") from None


def _special(mode: int) -> str | None:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def _our_manifest(folder: Path) -> bool:
    """A ``manifest.json`` that is a stallscope bundle's (other tools write files of that name)."""
    try:
        with open(folder / "manifest.json", "rb") as fh:
            head = fh.read(8192)
    except OSError:
        return False
    return any(k in head for k in (b'"collectors"', b'"clock_samples"', b'"schema_version"'))


class _Walk:
    """The state of one :func:`gather`: what was found, the real paths seen (links and their
    loops), the unpacking budget and folder."""

    def __init__(self, budget: archive.Budget, workdir) -> None:
        self.budget = budget
        self.workdir = workdir
        self.tmp: Path | None = None
        self.bundles: list[str] = []
        self.files: list[LooseFile] = []
        self.not_read: list[NotRead] = []
        self.seen: dict[tuple[int, int], str] = {}     # (dev, inode) of every file and folder met
        self.looked = 0

    def close(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    # ---- a path the user gave
    def top(self, path: Path) -> None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise InputError(f"{path}: no such file or folder") from None
        except OSError as e:
            raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
        what = _special(st.st_mode)
        if what:
            raise InputError(f"{path}: {what}, not a file or folder; not read")
        if stat.S_ISDIR(st.st_mode):
            root = find_root(path)
            # another tool's manifest.json (a run's metadata) does not make a folder a bundle:
            # it would be read as one with no capture in it, and the logs beside it lost
            if root is not None and (_our_manifest(root) or (root / "bpf").is_dir() or (root / "pcap").is_dir()):
                self.bundles.append(str(path))
                return
            self.folder(path, str(path), 0)
        elif stat.S_ISREG(st.st_mode):
            self.file(path, str(path), st, 0, given=True)
        else:
            raise InputError(f"{path}: not a regular file or folder; not read")

    # ---- inside a folder or archive
    def entry(self, path: Path, rel: str, depth: int) -> None:
        self.looked += 1
        if self.looked > MAX_LOOSE_FILES:
            if self.looked == MAX_LOOSE_FILES + 1:
                self.not_read.append(NotRead(rel, f"and the files after it: more than {MAX_LOOSE_FILES} files "
                                                  "in the folders given"))
            return
        try:
            lst = os.lstat(path)
            st = os.stat(path) if stat.S_ISLNK(lst.st_mode) else lst
        except OSError as e:
            why = "a symbolic link to nothing" if isinstance(e, FileNotFoundError) else f"cannot read: {e.strerror}"
            self.not_read.append(NotRead(rel, why))
            return
        what = _special(st.st_mode)
        if what:
            self.not_read.append(NotRead(rel, f"{what}: never opened for reading"))
        elif stat.S_ISDIR(st.st_mode):
            if _our_manifest(path) or (path / "bpf" / "events.jsonl").is_file():
                if self._first(st, rel):
                    self.bundles.append(str(path))
            else:
                self.folder(path, rel, depth, st)
        elif stat.S_ISREG(st.st_mode):
            self.file(path, rel, st, depth)

    def _first(self, st: os.stat_result, rel: str) -> bool:
        key = (st.st_dev, st.st_ino)
        if key in self.seen:
            return False
        self.seen[key] = rel
        return True

    def folder(self, path: Path, rel: str, depth: int, st: os.stat_result | None = None) -> None:
        st = st or os.stat(path)
        key = (st.st_dev, st.st_ino)
        if key in self.seen:
            self.not_read.append(NotRead(rel, f"a link back to {self.seen[key]} (a loop): not walked again"))
            return
        self.seen[key] = rel
        try:
            names = sorted(os.listdir(path))
        except OSError as e:
            self.not_read.append(NotRead(rel, f"folder not readable: {e.strerror}"))
            return
        for name in names:
            self.entry(path / name, f"{rel.rstrip('/')}/{name}", depth)

    def file(self, path: Path, rel: str, st: os.stat_result, depth: int, given: bool = False) -> None:
        key = (st.st_dev, st.st_ino)
        if key in self.seen:
            if self.seen[key] == "this run's own output":
                return
            if not given:
                self.not_read.append(NotRead(rel, f"the same file as {self.seen[key]} (a link): read once"))
            return
        self.seen[key] = rel
        if st.st_size == 0:
            self.not_read.append(NotRead(rel, "empty file"))
            return
        kind = archive.container_kind(path)
        if kind is None:
            self.files.append(LooseFile(rel, str(path), st.st_size, len(self.files)))
            return
        # named like a bundle (its reader says what is wrong with it, if anything), or laid out like one
        if bundle_name(path.name) or (kind == "tar" and archive.tar_looks_like_bundle(path)):
            self.bundles.append(str(path))
            return
        if depth >= MAX_NESTING:
            self.not_read.append(NotRead(rel, f"an archive nested {depth} deep: not unpacked"))
            return
        self.unpack(path, rel, kind, depth, given)

    def unpack(self, path: Path, rel: str, kind: str, depth: int, given: bool = False) -> None:
        if self.tmp is None:
            self.tmp = Path(tempfile.mkdtemp(prefix="stallscope-loose-", dir=self.workdir))
        dest = Path(tempfile.mkdtemp(dir=self.tmp))
        got = archive.unpack_loose(path, dest, self.budget, kind)
        if given and not got.files and got.notes:
            # an archive the user named that yields nothing at all: bad input, said at once
            raise InputError(f"{path}: {got.notes[0][1]}")
        for member, note in got.notes:
            self.not_read.append(NotRead(f"{rel}:{member}" if member else rel, note))
        if not got.files and not got.notes:
            self.not_read.append(NotRead(rel, "an empty archive"))
        for name in sorted(os.listdir(dest)):
            self.entry(dest / name, f"{rel}:{name}", depth + 1)


__all__ = ["Intake", "LooseFile", "LooseSet", "NotRead", "gather", "LOOSE_LABEL"]
