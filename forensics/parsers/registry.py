"""The parser registry: one place that knows every artefact format stallscope reads.

Each parser module declares a subclass of :class:`Parser` (``NAME``, ``DESCRIPTION``,
``GLOBS`` naming where the artefact lives inside a bundle, a content ``sniff`` and
``parse``) and ends with ``register(ThatParser)``. ``forensics/parsers/__init__.py``
only imports the modules, so adding a format is adding one file.

Every parser returns a :class:`ParseResult`: typed ``tables`` (pandas DataFrames whose
column schema is fixed by the parser's ``SCHEMAS`` and documented in its module
docstring), ``facts`` (small JSON-able values: versions, configuration) and
``warnings`` (one line each, ``file:line: what was wrong``). Malformed content never
raises: the bad line or record is skipped with a warning. Only input that cannot be
read at all (missing file, permission denied) raises :class:`forensics.errors.InputError`.
"""
from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Union

import numpy as np
import pandas as pd

from ..coerce import INT64_END, INT64_MIN, bounded_int, is_missing
from ..errors import InputError

Source = Union[str, os.PathLike, bytes, bytearray, memoryview]

SNIFF_BYTES = 8192          # how much of a file the content sniffers see
MAX_WARNINGS = 50           # per file; the rest are counted in one closing line


@dataclass
class ParseResult:
    """What one parser made of one input."""

    parser: str
    source: str
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def table(self, name: str) -> pd.DataFrame:
        return self.tables[name]


class WarningLog:
    """Collects one-line warnings for one input, capped so a garbage file stays readable."""

    def __init__(self, source: str, limit: int = MAX_WARNINGS):
        self.source = source
        self.limit = limit
        self.lines: list[tuple[int, str]] = []
        self.suppressed = 0

    def add(self, lineno: int | None, what: str) -> None:
        if len(self.lines) >= self.limit:
            self.suppressed += 1
            return
        where = f"{self.source}:{lineno}" if lineno else self.source
        what = " ".join(str(what).split())          # one line, whatever the input held
        self.lines.append((lineno or 0, f"{where}: {what}"))

    def result(self) -> list[str]:
        """The warnings in file order (whole-file ones first)."""
        out = [w for _, w in sorted(self.lines, key=lambda x: x[0])]
        if self.suppressed:
            out.append(f"{self.source}: {self.suppressed} more warnings suppressed")
        return out


# ---------------------------------------------------------------------------------------
# Typed tables

_DTYPES = {
    "str": "string",
    "int": "Int64",
    "uint": "UInt64",       # 64-bit hardware counters
    "float": "float64",
    "bool": "boolean",
    "time": "datetime64[ns]",
}


_EMPTY: dict[tuple, pd.DataFrame] = {}


def empty_frame(schema: dict[str, str]) -> pd.DataFrame:
    key = tuple(schema.items())
    if key not in _EMPTY:      # building a wide empty frame costs milliseconds; copying it does not
        _EMPTY[key] = pd.DataFrame({c: pd.Series(dtype=_DTYPES[t]) for c, t in schema.items()})
    return _EMPTY[key].copy()


def frame(rows: Iterable[dict] | dict[str, list], schema: dict[str, str], share: bool = False) -> pd.DataFrame:
    """A DataFrame with exactly the schema's columns, in order, with its dtypes.

    ``rows`` is a list of dicts (missing keys become NA) or a dict of columns.
    Values are converted column by column from the Python objects, so 64-bit
    integers (nanosecond times, counters) never pass through float. Values that do
    not convert become NA rather than raising: parsers validate what matters and
    warn; this is the last line of defence. ``share``: an array of ``rows`` already of its
    column's dtype becomes the column itself, not a copy (the caller hands the arrays over;
    one array given for two columns is still copied for the second).
    """
    if isinstance(rows, dict):
        cols = {k: v if isinstance(v, _ARRAYS) else list(v) for k, v in rows.items()}
        n = max((len(v) for v in cols.values()), default=0)
    else:
        rows = list(rows)
        n = len(rows)
        cols = {c: [r.get(c) for r in rows] for c in schema}
    if n == 0:
        return empty_frame(schema)
    # every column is a new array (_column copies what it is given as it is, unless shared): no second copy
    seen: set[int] = set()

    def column(values, kind):
        own = share and isinstance(values, _ARRAYS) and id(values) not in seen
        seen.add(id(values))
        return _column(values, kind, own)
    return pd.DataFrame({c: column(cols.get(c, [None] * n), kind) for c, kind in schema.items()},
                        index=pd.RangeIndex(n), copy=False)


_ARRAYS = (np.ndarray, pd.api.extensions.ExtensionArray)
_NONE = type(None)
# the exact dtype each kind's column gets (what the value-by-value conversion gives)
_TYPED = {"str": pd.array([], dtype="string").dtype, "int": pd.Int64Dtype(), "uint": pd.UInt64Dtype(),
          "bool": pd.BooleanDtype()}
_PLAIN = {"str": {str, _NONE}, "int": {int, _NONE}, "uint": {int, _NONE}, "bool": {bool, _NONE}}


def _fast_column(values, kind: str, own: bool = False):
    """The column of ``values`` without a Python call per value where they already have the
    kind's type (an array of its dtype (a copy, or ``values`` itself where ``own``), numpy
    integers for ints, or Python values of the one type, with None); else None: the
    value-by-value conversion decides."""
    if isinstance(values, _ARRAYS):
        if values.dtype == _TYPED.get(kind, None):
            return values if own else values.copy()
        if _numpy_int64(values, kind):
            return pd.array(values.astype(np.int64), dtype="Int64")
        return None
    plain = _PLAIN.get(kind)
    if plain is None or not set(map(type, values)) <= plain:
        return None
    try:
        with np.errstate(all="ignore"):     # an int past int64 goes through float, then is refused
            out = pd.array(values, dtype=_TYPED[kind])
    except (TypeError, ValueError, OverflowError):      # out of range: NA, value by value
        return None
    return out


def _no_times(n: int) -> np.ndarray:
    """A time column of ``n`` NaT, of the dtype the value-by-value conversion gives None."""
    dtype = pd.to_datetime(pd.Series([None], dtype="object"), errors="coerce", format="mixed").dtype
    return np.full(n, np.datetime64("NaT"), dtype=dtype)


def _numpy_int64(values, kind: str) -> bool:
    """``values`` are numpy integers that int64 holds, for an int column."""
    return kind == "int" and isinstance(values, np.ndarray) and values.dtype.kind in "iu" \
        and values.dtype.itemsize <= (8 if values.dtype.kind == "i" else 4)


def _column(values: list, kind: str, own: bool = False):
    fast = _fast_column(values, kind, own)
    if fast is not None:
        return fast
    if isinstance(values, _ARRAYS):
        values = list(values)           # as a dict of columns always was
    if kind == "str":
        return pd.array([None if is_missing(v) else (v if isinstance(v, str) else str(v)) for v in values],
                        dtype="string")
    if kind == "int":
        return _int_array(values)
    if kind == "uint":
        return _int_array(values, lo=0, hi=1 << 64, dtype="UInt64")
    if kind == "float":
        out = []
        for v in values:
            try:
                out.append(float("nan") if is_missing(v) or isinstance(v, bool) else float(v))
            except (TypeError, ValueError):
                out.append(float("nan"))
        return np.array(out, dtype="float64")
    if kind == "bool":
        return pd.array([v if isinstance(v, (bool, np.bool_)) else None for v in values], dtype="boolean")
    if kind == "time":
        if values.count(None) == len(values):        # no time at all (most logs)
            return _no_times(len(values))
        return pd.to_datetime(pd.Series(values, dtype="object"), errors="coerce", format="mixed").to_numpy()
    raise ValueError(f"unknown column kind {kind!r}")  # pragma: no cover - schema typo


def _int_array(values, lo: int = INT64_MIN, hi: int = INT64_END, dtype: str = "Int64"):
    return pd.array([bounded_int(v, lo, hi) for v in values], dtype=dtype)


# ---------------------------------------------------------------------------------------
# Reading inputs

def read_source(source: Source) -> tuple[bytes, str]:
    """The bytes of ``source`` and a label for warnings; InputError if unreadable."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), "<bytes>"
    path = Path(source)
    try:
        # O_NONBLOCK: a FIFO or device in an unpacked bundle must not block the reader
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise InputError(f"{path}: not a regular file (FIFO, device or socket); not read")
            return fh.read(), str(path)
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None


def decode_text(data: bytes) -> str:
    """Text of a log; undecodable bytes become U+FFFD (the lines they spoil get warned about)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return data.decode("utf-8", errors="replace")


def split_lines(text: str) -> list[str]:
    """Lines without terminators; ``\\r\\n`` and lone ``\\r`` line ends both count."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


_CONTROL_BYTES = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13))


def looks_binary(data: bytes) -> bool:
    """True for data that is clearly not a text log: over a tenth of its first bytes are
    control bytes. A few NULs (a log cut short by a crash) do not make a log binary."""
    head = data[:SNIFF_BYTES]
    if not head:
        return False
    ctrl = len(head) - len(head.translate(None, _CONTROL_BYTES))
    return ctrl > len(head) // 10


# ---------------------------------------------------------------------------------------
# The registry

class Parser:
    """Base of every parser. Subclasses set the class attributes and implement ``parse_bytes``."""

    NAME: str = ""
    DESCRIPTION: str = ""
    GLOBS: tuple[str, ...] = ()          # paths inside a bundle, e.g. "logs/*.log"
    SCHEMAS: dict[str, dict[str, str]] = {}
    # a structured format (JSON, a pickle) is a whole file; a text format's lines can stand
    # anywhere in a job's log, among other formats' lines
    STRUCTURED: bool = False

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        """Whether the first bytes of a file look like this format."""
        return False

    @classmethod
    def claims(cls, text) -> bool:
        """Whether this parser has something to read in a text log (a :class:`.text.LogText`):
        by default its first bytes decide (:meth:`sniff`); a text format whose lines may stand
        anywhere in a job's output looks for its markers in the whole file."""
        return cls.sniff(text.head())

    @classmethod
    def parse(cls, source: Source) -> ParseResult:
        data, label = read_source(source)
        return cls.parse_bytes(data, label)

    @classmethod
    def parse_bytes(cls, data: bytes, label: str) -> ParseResult:  # pragma: no cover
        raise NotImplementedError

    @classmethod
    def result(cls, label: str, tables: dict[str, Any], facts: dict, log: WarningLog) -> ParseResult:
        """Assemble a ParseResult, forcing every table onto its declared schema."""
        typed = {name: typed_frame(tables.get(name), schema, share=True) for name, schema in cls.SCHEMAS.items()}
        return ParseResult(parser=cls.NAME, source=label, tables=typed, facts=facts,
                           warnings=log.result())


def typed_frame(rows, schema: dict[str, str], share: bool = False) -> pd.DataFrame:
    """:func:`frame` of a table as a parser hands it over: a DataFrame (column by column;
    ``tolist`` gives Python objects, as the rows' dicts would: no dict per row; a column the
    frame lacks is NA in every row), a dict of columns, a list of row dicts, or None (empty).
    ``share``: a DataFrame's columns already of their kind's dtype are taken as they are, not
    copied (the parser hands its frame over: :meth:`Parser.result`)."""
    if isinstance(rows, pd.DataFrame):
        df = rows
        rows = {c: _values(df[c], kind) for c, kind in schema.items() if c in df.columns}
        if len(df) and not rows:
            rows = {next(iter(schema)): [None] * len(df)}
        return frame(rows, schema, share)
    return frame(rows if rows is not None else [], schema)


def _values(col: pd.Series, kind: str):
    """A frame's column for :func:`frame` as a ``kind`` column: its array where that is taken
    as it is (the column's dtype, or numpy int64 for an int column), else its Python objects
    (converted value by value, as rows' dicts would be)."""
    arr = col.array
    if arr.dtype == _TYPED.get(kind, None):
        return arr
    if isinstance(arr, pd.arrays.NumpyExtensionArray) and _numpy_int64(arr.to_numpy(), kind):
        return arr.to_numpy()
    return col.tolist()


_REGISTRY: dict[str, type[Parser]] = {}


def register(parser: type[Parser]) -> type[Parser]:
    if not parser.NAME:
        raise ValueError(f"{parser.__name__} has no NAME")
    if parser.NAME in _REGISTRY and _REGISTRY[parser.NAME] is not parser:
        raise ValueError(f"parser name {parser.NAME!r} registered twice")
    _REGISTRY[parser.NAME] = parser
    return parser


def known(name: str) -> bool:
    """A parser of that name is registered."""
    return name in _REGISTRY


def get(name: str) -> type[Parser]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InputError(f"no parser named {name!r} (known: {', '.join(sorted(_REGISTRY))})") from None


def parsers() -> list[type[Parser]]:
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


def glob_matches(path: str | os.PathLike, pattern: str) -> bool:
    """Whether the last components of ``path`` match ``pattern`` (``logs/*.log`` matches
    ``/x/bundle/logs/rank0.log``); ``**`` in a pattern spans any number of folders."""
    parts = PurePosixPath(Path(path).as_posix()).parts
    pat = PurePosixPath(pattern).parts
    if "**" in pat:
        i = pat.index("**")
        head, tail = pat[:i], pat[i + 1:]
        for start in range(len(parts)):
            if _match_parts(parts[start:start + len(head)], head):
                rest = parts[start + len(head):]
                if len(rest) >= len(tail) and _match_parts(rest[len(rest) - len(tail):], tail):
                    return True
        return False
    return len(parts) >= len(pat) and _match_parts(parts[len(parts) - len(pat):], pat)


def _match_parts(parts: Iterable[str], pat: Iterable[str]) -> bool:
    parts, pat = list(parts), list(pat)
    return len(parts) == len(pat) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pat))


def select(path: str | os.PathLike | None, head: bytes) -> list[type[Parser]]:
    """Parsers that fit, best first: glob and sniff agree, then sniff alone, then glob alone."""
    by_glob = [p for p in parsers() if path is not None and any(glob_matches(path, g) for g in p.GLOBS)]
    by_sniff = [p for p in parsers() if _safe_sniff(p, head)]
    ranked = [p for p in by_glob if p in by_sniff]
    ranked += [p for p in by_sniff if p not in ranked]
    ranked += [p for p in by_glob if p not in ranked]
    return ranked


def _safe_sniff(p: type[Parser], head: bytes) -> bool:
    try:
        return bool(p.sniff(head))
    except Exception:  # a sniffer bug must not stop selection of the others
        return False


def parse_file(path: str | os.PathLike, name: str | None = None) -> ParseResult:
    """Parse one file with the named parser, or the one its path and content select.

    A file no parser recognises gives an empty result (``parser == ""``) with a warning.
    """
    if name is not None:
        return get(name).parse(path)
    p = Path(path)
    if p.is_dir():
        ib = _REGISTRY.get("ib_counters")
        if ib is not None:
            return ib.parse(p)
        raise InputError(f"{p}: is a directory, not a file")
    data, label = read_source(p)
    chosen = select(p, data[:SNIFF_BYTES])
    if not chosen:
        log = WarningLog(label)
        log.add(None, "no parser recognises this file; skipped")
        return ParseResult(parser="", source=label, warnings=log.result())
    return chosen[0].parse_bytes(data, label)


def parse_tree(root: str | os.PathLike) -> list[ParseResult]:
    """Parse every recognised artefact below an unpacked bundle folder.

    The ``ib/`` folder is one artefact (counter files of all phases, devices and ports
    together). A file is parsed when a parser's sniffer recognises it, or when its path
    matches the globs of exactly one parser; other files (manifest, dmesg, …) are left
    out silently.
    """
    root = Path(root)
    results = []
    ib_dir = root / "ib"
    if ib_dir.is_dir() and "ib_counters" in _REGISTRY:
        results.append(_REGISTRY["ib_counters"].parse(ib_dir))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if Path(dirpath) == ib_dir or ib_dir in Path(dirpath).parents:
            continue
        for fn in sorted(filenames):
            path = Path(dirpath) / fn
            rel = path.relative_to(root)
            if path.is_symlink():      # an unpacked folder is untrusted: never read through links
                results.append(ParseResult(parser="", source=str(path), warnings=[f"{path}: symbolic link, skipped"]))
                continue
            try:
                data, label = read_source(path)
            except InputError as e:
                results.append(ParseResult(parser="", source=str(path), warnings=[str(e)]))
                continue
            head = data[:SNIFF_BYTES]
            chosen = select(rel, head)
            # the content must agree, unless the path names exactly one format
            # (logs/ holds NCCL logs, watchdog logs and dmesg alike)
            if chosen and (_safe_sniff(chosen[0], head)
                           or sum(any(glob_matches(rel, g) for g in p.GLOBS) for p in parsers()) == 1):
                results.append(chosen[0].parse_bytes(data, label))
    return results
