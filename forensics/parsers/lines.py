"""What a log line's prefixes say about it: the launcher's tags, the rank, the host, the time.

A job's output reaches the log through one or more launchers, each putting its own tag in
front of the line: ``srun --label`` (``12: ``), Open MPI ``--tag-output`` (``[1,12]<stdout>:``,
after ``--timestamp-output``'s ``Fri Aug 11 12:31:45 2023``; horovodrun's ``[12]<stdout>:``), torchrun ``--tee``
(``[default3]:``, ``[trainer3]:`` with a role: a *local* rank; torchx ``[trainer0|3]:``),
PyTorch's own c10 logger (``[rank12]:``), Ray (``(RayTrainWorker pid=4711, ip=10.0.0.3)``), pdsh (``node07: ``), ``kubectl logs --prefix``
(``[pod/trainer-3/main]``), log shippers and syslog (a time and a host), Python logging
(``[2024-01-02 03:04:05,678]``), and a copy pasted into a bug report adds its own (line
numbers, indents, ANSI colours, a progress bar glued in front). The parsers anchor on their
own format's text and hand whatever stands before it to :func:`context`, which reads every
known tag in it: each tag is one row of :data:`PREFIXES`, a name and a pattern (adding a
launcher is one row).

Ranks: the tag nearest the message wins (``srun --label`` names the task, which is the global
rank only when there is one task per GPU; a ``[rankN]:`` inside it is the process's own
rank), and torchrun's number is a local rank, kept apart.

Times (:func:`clock`): what each format prints, as a naive local time unless the text carries
a zone; formats without a year (c10's ``E0321 02:07:08.408``, syslog's ``Aug 12 09:37:03``)
take the year given (the model's: another line's, else the capture's). c10 prints the month
without a leading zero (``E321`` is March 21) and, after the seconds, the nanoseconds of the
monotonic clock (not a fraction of the wall clock's second): its times are good to the second.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable
from operator import itemgetter

import numpy as np
import pandas as pd

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                      "Dec"), 1)}


@dataclass(frozen=True)
class Prefix:
    """One kind of tag a launcher or logger puts before a line; its groups name what it tells
    (``rank``, ``task``, ``local_rank``, ``host``, ``ip``, ``pid``, ``time``)."""

    name: str
    pattern: re.Pattern


def _p(name: str, rx: str) -> Prefix:
    return Prefix(name, re.compile(rx))


_ISO = r"\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d|\s?UTC)?"
_CTIME = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d \d{4}"
_SYSLOG = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d"
_HOSTNAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"

# Searched in the text before a parser's anchor; order does not matter (each is looked for),
# the position of each match decides which rank is nearest the message.
PREFIXES: tuple[Prefix, ...] = (
    _p("open_mpi", r"\[(?P<job>\d+),(?P<rank>\d+)\]<std(?:out|err|diag)>:"),
    _p("horovodrun", r"\[(?P<rank>\d+)\]<std(?:out|err)>:"),            # horovodrun (Gloo): ``[1]<stderr>:``
    _p("torchrun", r"\[default(?P<local_rank>\d+)\]:"),
    # torchrun with a role of its own (torchx names it: ``[trainer3]:``, the local rank), and
    # torchx's ``[role<replica>|<local rank>]:``
    _p("torchrun_role", r"\[(?!rank\d|default\d)[A-Za-z_][A-Za-z_-]*(?P<local_rank>\d+)\]:"),
    _p("torchx", r"\[(?!rank\d)[A-Za-z_][A-Za-z_-]*\d+\|(?P<local_rank>\d+)\]:"),
    _p("c10_rank", r"\[rank(?P<rank>\d+)\]:"),
    _p("ray", r"\((?:[A-Za-z_][\w.:-]* )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9A-Fa-f.:]+))?\)"),
    _p("kubectl", r"\[pod/(?P<host>" + _HOSTNAME + r")/[^\]\s]+\]"),
    _p("srun_label", r"^\s*(?P<task>\d{1,6}): "),
    _p("pdsh", r"^(?P<host>[A-Za-z][A-Za-z0-9._-]*[A-Za-z0-9]): (?!\s)"),
    _p("syslog", r"^(?P<time>" + _SYSLOG + r") (?P<host>" + _HOSTNAME + r") [\w./-]+(?:\[(?P<pid>\d+)\])?: "),
    _p("shipper", r"(?P<time>" + _ISO + r") (?P<host>" + _HOSTNAME + r") >> "),
    _p("iso_time", r"(?P<time>" + _ISO + r")"),
    _p("ctime", r"(?P<time>" + _CTIME + r")"),
    _p("rank_word", r"(?<![\w/])[Rr]ank[ =:]?(?P<rank>\d{1,6})\b(?![./])"),
)


@dataclass(frozen=True)
class Context:
    """What a line's prefixes say. ``rank``: the global rank named nearest the message;
    ``task``: a launcher's task number further out; ``local_rank``: torchrun's; ``clock``:
    the launcher's or shipper's time as printed (``clock_kind``: which format)."""

    rank: int | None = None
    task: int | None = None
    local_rank: int | None = None
    host: str | None = None
    ip: str | None = None
    pid: int | None = None
    clock: str | None = None
    tags: tuple[str, ...] = field(default=())

    def as_row(self) -> dict:
        # a launcher's task number is not a rank (srun runs one torchrun per node as often as
        # one task per GPU): only the tags that name a rank give ctx_rank
        return {"ctx_rank": self.rank, "ctx_local_rank": self.local_rank,
                "ctx_host": self.host or self.ip, "ctx_pid": self.pid, "ctx_clock": self.clock}


NO_CONTEXT = Context()
# the parser-table types of :meth:`Context.as_row`'s columns
CONTEXT_COLUMNS = {"ctx_rank": "int", "ctx_local_rank": "int", "ctx_host": "str", "ctx_pid": "int", "ctx_clock": "str"}


@functools.lru_cache(maxsize=1 << 16)
def context(prefix: str) -> Context:
    """The :class:`Context` of the text before a line's message (see the module docstring);
    remembered for the last 65536 distinct texts (a log repeats few prefixes: a launcher's tags)."""
    if not prefix or not prefix.strip():
        return NO_CONTEXT
    prefix = ANSI_RE.sub("", prefix)
    found: list[tuple[int, str, dict]] = []
    for p in PREFIXES:
        for m in p.pattern.finditer(prefix):
            found.append((m.start(), p.name, {k: v for k, v in m.groupdict().items() if v is not None}))
    if not found:
        return NO_CONTEXT
    found.sort(key=lambda f: f[0])
    out: dict = {}
    tags = []
    for _, name, g in found:
        tags.append(name)
        if name == "srun_label":
            out["task"] = int(g["task"])
            continue
        if name == "rank_word" and "rank" in out:
            continue                      # a "rank 3" in free text never overrides a launcher's tag
        for k, v in g.items():
            if k in ("rank", "local_rank", "pid"):
                out[k] = int(v)
            elif k in ("host", "ip"):
                out[k] = v
            elif k == "time" and "clock" not in out:
                out["clock"] = v          # the outermost time: the launcher's or shipper's clock
    return Context(rank=out.get("rank"), task=out.get("task"), local_rank=out.get("local_rank"),
                   host=out.get("host"), ip=out.get("ip"), pid=out.get("pid"), clock=out.get("clock"),
                   tags=tuple(tags))



_CONTEXT_CACHE: dict[str, dict] = {}


def context_columns(prefixes: Iterable[str]) -> dict[str, list]:
    """:meth:`Context.as_row` of each prefix text (the text before a line's message), as columns
    keyed like :data:`CONTEXT_COLUMNS`; the same text is read once (a log repeats few prefixes)."""
    codes, distinct = pd.factorize(np.fromiter(prefixes, dtype=object), use_na_sentinel=False)
    rows = []
    for pre in distinct.tolist():
        ctx = _CONTEXT_CACHE.get(pre)
        if ctx is None:
            ctx = context(pre).as_row()
            if len(_CONTEXT_CACHE) > 50_000:
                _CONTEXT_CACHE.clear()
            _CONTEXT_CACHE[pre] = ctx
        rows.append(ctx)
    out = {}
    for k in NO_CONTEXT.as_row():
        vals = np.empty(len(rows), dtype=object)
        vals[:] = list(map(itemgetter(k), rows))
        out[k] = vals[codes].tolist()
    return out

# the tags a line may start with, in any number and order (strip_tags)
_LEADING_TAG = re.compile(
    r"\s*(?:\[pod/[^\]\s]+\]|\[[A-Za-z_][A-Za-z_-]*\d+(?:\|\d+)?\]:|\[rank\d+\]:|\[\d+(?:,\d+)?\]<std(?:out|err|diag)>:|\[\d{1,7}\]"
    r"|\((?:[A-Za-z_][\w.:-]* )?pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\)|\d{1,6}:(?=\s)|" + _ISO + r"|" + _CTIME
    + r"|" + _HOSTNAME + r" >>|\[[^\]]{0,40}\d{2}:\d{2}:\d{2}[^\]]{0,20}\])\s*")


def strip_tags(text: str) -> tuple[str, str]:
    """(the launcher tags a line starts with, the rest): what another tool quoted after its own
    tags (NCCL's last error after ``Last error:``), read as the quoted text alone."""
    text = ANSI_RE.sub("", text)
    end = 0
    while (m := _LEADING_TAG.match(text, end)) and m.end() > end:
        end = m.end()
    return text[:end], text[end:]


# --------------------------------------------------------------------------- times

_ISO_RE = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[T _](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?\s?(Z|UTC|[+-]\d\d:?\d\d)?$")
_CTIME_RE = re.compile(r"^(?:\w{3}) (\w{3}) +(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})$")
_SYSLOG_RE = re.compile(r"^(\w{3}) +(\d{1,2}) (\d\d):(\d\d):(\d\d)$")
_GLOG_RE = re.compile(r"^(\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?$")


def clock(text: str | None, year: int | None = None) -> datetime | None:
    """The time a prefix printed: aware (UTC) when it names a zone, else naive local time;
    None when unreadable, or when it has no year and none is given."""
    if not text:
        return None
    t = text.strip().strip("[]")
    try:
        if (m := _ISO_RE.match(t)):
            y, mo, d, h, mi, s, frac, zone = m.groups()
            dt = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), _micro(frac))
            return _zoned(dt, zone)
        if (m := _CTIME_RE.match(t)):
            mon, d, h, mi, s, y = m.groups()
            return datetime(int(y), MONTHS[mon], int(d), int(h), int(mi), int(s))
        if (m := _SYSLOG_RE.match(t)) and year is not None:
            mon, d, h, mi, s = m.groups()
            return datetime(year, MONTHS[mon], int(d), int(h), int(mi), int(s))
        if (m := _GLOG_RE.match(t)) and year is not None:
            # c10's 9 digits after the seconds are CLOCK_MONOTONIC's nanoseconds, not the wall
            # clock's fraction: the time is good to the second
            mo, d, h, mi, s, _ = m.groups()
            return datetime(year, int(mo), int(d), int(h), int(mi), int(s))
    except (ValueError, KeyError):
        return None
    return None


def has_year(text: str | None) -> bool:
    t = (text or "").strip().strip("[]")
    return bool(_ISO_RE.match(t) or _CTIME_RE.match(t))


def _micro(frac: str | None) -> int:
    return int((frac or "0")[:6].ljust(6, "0"))


def _zoned(dt: datetime, zone: str | None) -> datetime:
    if not zone:
        return dt
    if zone in ("Z", "UTC"):
        return dt.replace(tzinfo=timezone.utc)
    sign = -1 if zone[0] == "-" else 1
    hh, mm = int(zone[1:3]), int(zone[-2:])
    return dt.replace(tzinfo=timezone(sign * timedelta(hours=hh, minutes=mm)))


__all__ = ["CONTEXT_COLUMNS", "Context", "NO_CONTEXT", "PREFIXES", "Prefix", "clock", "context", "has_year",
           "strip_tags", "ANSI_RE"]
