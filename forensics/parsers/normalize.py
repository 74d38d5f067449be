"""Text as it arrives: one normalizer, run on every text log before any text parser reads it.

Users paste logs into tickets, chats and bug reports, and the paste damages them: a terminal
or a renderer hard-wraps long lines, a form joins the whole log onto one line, Markdown adds
``> `` quotes, code fences and backticks, HTML escapes ``<`` and ``&``, an editor adds line
numbers, and log shippers wrap every line in JSON (docker, containerd/CRI) or export it as a
CSV/TSV table (CloudWatch, Loki, Kibana). Each such damage is undone by one *repair*: a small
declared class below (a subclass of :class:`Repair` with ``NAME`` and a docstring stating its
contract: what it recognises and what it rewrites), registered in :data:`PIPELINE`, applied in
that order. Adding a repair is adding one class and one entry there.

Contract of :func:`normalize`:

* Clean text costs a look, not a copy: a cheap sniff of the head and a few sampled windows
  (:func:`sample`) asks each repair whether it is needed; when none is, the very same buffer
  (``bytes`` or the file's ``mmap``) comes back and the parsers keep their memmem fast path.
  Damage that stands only outside the sampled windows of a big file is not seen.
* Only when a repair is needed is the text rebuilt (CRLF made LF first), each repair working
  over the whole buffer with regular expressions and numpy, not a per-line Python loop (the
  shipper formats decode their records one by one: exports are small).
* Binary data, and a file that starts like JSON but is not a container log, are left as they are.
* Line numbers: a repair that joins or splits lines changes the numbering; the line numbers
  parsers report (``line`` columns, warnings' ``file:line``) then count the lines of the
  normalized text, not those of the pasted file. :attr:`Normalized.repairs` names what was done.

The markers the glued-line split looks for are the parsers' own where they are whole line
heads, kept in :mod:`.heads` so both sides read one table (``NCCL_DEBUG_MARKERS``,
``NCCL_TESTS_MARKERS``, ``TORCH_ELASTIC_MARKERS``, ``CODE_MARKERS``, ``IBSTAT_KEYS``; and
ib_status' line patterns), plus the line heads of PyTorch's watchdog, c10 logger, tracebacks and
torchrun (:func:`_heads`).
"""
from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass

import numpy as np

from .heads import CODE_MARKERS, IBSTAT_KEYS, NCCL_DEBUG_MARKERS, NCCL_TESTS_MARKERS, TORCH_ELASTIC_MARKERS
from .lines import strip_tags
from .registry import looks_binary

SMALL_BYTES = 256 << 10        # texts up to this size are sniffed whole
HEAD_BYTES = 64 << 10          # else: the head, and WINDOWS windows of WINDOW_BYTES further in
WINDOW_BYTES = 16 << 10
WINDOWS = 4
LINE_NUMBER_BYTES = 8 << 10     # line numbers are looked for in each window's first lines
MIN_WIDTH, MAX_WIDTH = 60, 200  # the hard-wrap widths recognised


@dataclass(frozen=True)
class Normalized:
    """The text to parse (``data``: the input itself when nothing was repaired) and the
    names of the repairs applied, in order."""

    data: object
    repairs: tuple[str, ...] = ()


def sample(data) -> list[bytes]:
    """What the sniff looks at: the whole text when small, else the head and a few windows
    (each cut to whole lines); the first segment is always the text's start."""
    n = len(data)
    if n <= SMALL_BYTES:
        return [bytes(data)]
    segs = [_whole_lines(bytes(data[:HEAD_BYTES]), head=True)]
    for i in range(1, WINDOWS + 1):
        at = (n - WINDOW_BYTES) * i // WINDOWS
        segs.append(_whole_lines(bytes(data[at:at + WINDOW_BYTES])))
    return [s for s in segs if s]


def _whole_lines(b: bytes, head: bool = False) -> bytes:
    if not head:
        i = b.find(b"\n")
        b = b[i + 1:] if i >= 0 else b""
    j = b.rfind(b"\n")
    return b[:j + 1] if j >= 0 else b


# --------------------------------------------------------------------------- the steps

class Repair:
    """One named repair. ``needed(segments)``: whether any sampled segment shows the damage
    (cheap: the segments are small); ``apply(data)``: the whole text repaired (``bytes`` in,
    ``bytes`` out, LF line ends). ``apply`` must leave text without that damage unchanged."""

    NAME = ""

    @classmethod
    def needed(cls, segments: list[bytes]) -> bool:
        return any(cls.seen(s) for s in segments)

    @classmethod
    def seen(cls, seg: bytes) -> bool:   # pragma: no cover - each repair's own
        raise NotImplementedError

    @classmethod
    def apply(cls, data: bytes) -> bytes:   # pragma: no cover - each repair's own
        raise NotImplementedError


_DOCKER_RE = re.compile(rb'(?m)^[ \t]*\{"log":"((?:[^"\\\n]|\\.)*)","stream":"(?:stdout|stderr)"'
                        rb'(?:,"time":"[^"\n]*")?(?:,"attrs":\{[^\n]*?\})?\}[ \t]*(?:\n|$)')
_CRI_TS = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)"
_CRI_RE = re.compile(rb"(?m)^" + _CRI_TS + rb" (?:stdout|stderr) ([FP]) ")
_CRI_F_RE = re.compile(rb"(?m)^" + _CRI_TS + rb" (?:stdout|stderr) F ")
_CRI_P_RE = re.compile(rb"(?m)^" + _CRI_TS + rb" (?:stdout|stderr) P ([^\n]*)\n")


class ContainerLog(Repair):
    """Container runtimes' log files. docker's json-file driver: one JSON object per line,
    ``{"log":"<the line, JSON-escaped, with its \\n>","stream":"stderr","time":"..."}``, a line
    over 16 KiB split into objects whose ``log`` lacks the ``\\n``: each object becomes its
    ``log`` text, unescaped (partial objects joined). CRI (containerd, CRI-O, ``kubectl`` on the
    node): ``<RFC 3339 time> <stream> <F|P> <text>``: the text alone, ``P`` (partial) lines
    joined with the next. Lines of any other form are kept. The runtime's time is dropped (the
    program's own line carries its time, as it printed it)."""

    NAME = "container_log"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        return b'{"log":"' in seg and bool(_DOCKER_RE.search(seg)) or len(_CRI_RE.findall(seg[:8192])) >= 2

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        if _DOCKER_RE.search(data):
            def one(m: re.Match) -> bytes:
                try:
                    return json.loads(b'"' + m[1] + b'"').encode("utf-8", "surrogatepass")
                except (ValueError, UnicodeError):
                    return m[0]
            data = _DOCKER_RE.sub(one, data)
        if _CRI_RE.search(data):
            data = _CRI_F_RE.sub(b"", data)
            data = _CRI_P_RE.sub(rb"\1", data)     # F prefixes gone: a partial line joins the next
        return data


_TIME_COLS = ("@timestamp", "timestamp", "time", "_time", "date", "datetime", "ts", "eventtime", "ingestiontime")
_MSG_COLS = ("@message", "message", "line", "log", "msg", "_raw", "_source.message", "log.message", "event")


class ExportColumns(Repair):
    """A log exported as a table by a log store: CloudWatch Logs Insights (``@timestamp,@message``)
    and the console's CSV (``timestamp,message``), Kibana/OpenSearch Discover CSV
    (``"@timestamp","message"``), Grafana/Loki TSV or CSV (``timestamp<TAB>line``, ``Time,Line``).
    Recognised by its first line: a CSV or TSV header naming a time column and a message column.
    Becomes the message column's values, one per line (a value with newlines keeps them), in time
    order (stores export newest first: rows whose times run backwards are reversed)."""

    NAME = "export_columns"

    @classmethod
    def needed(cls, segments: list[bytes]) -> bool:
        return bool(segments) and cls._header(segments[0]) is not None

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        return cls._header(seg) is not None

    @staticmethod
    def _header(head: bytes):
        first = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", "replace")
        if len(first) > 400:
            return None
        delim = "\t" if "\t" in first else ","
        try:
            cols = [c.strip().lower() for c in next(csv.reader([first], delimiter=delim))]
        except (csv.Error, StopIteration):
            return None
        if len(cols) < 2:
            return None
        t = next((i for i, c in enumerate(cols) if c in _TIME_COLS), None)
        m = next((i for i, c in enumerate(cols) if c in _MSG_COLS), None)
        return None if t is None or m is None or t == m else (delim, t, m)

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        spec = cls._header(data[:4096])
        if spec is None:
            return data
        delim, t, m = spec
        text = data.decode("utf-8", "surrogateescape").lstrip("\ufeff")
        try:
            rows = list(csv.reader(io.StringIO(text, newline=""), delimiter=delim))[1:]
        except csv.Error:
            return data
        rows = [r for r in rows if len(r) > m]
        if not rows:
            return data
        times = [r[t] if len(r) > t else "" for r in rows]
        if len(rows) > 1 and len(times[0]) == len(times[-1]) and times[0] > times[-1]:
            rows.reverse()
        out = "\n".join(r[m].rstrip("\r\n") for r in rows) + "\n"
        return out.encode("utf-8", "surrogateescape")


_ENTITY_RE = re.compile(rb"&(?:lt|gt|amp|quot|apos|#39|#x27|#34|#x22|#60|#62|nbsp);")
_ENTITIES = ((b"&lt;", b"<"), (b"&gt;", b">"), (b"&quot;", b'"'), (b"&#34;", b'"'), (b"&#x22;", b'"'),
             (b"&apos;", b"'"), (b"&#39;", b"'"), (b"&#x27;", b"'"), (b"&#60;", b"<"), (b"&#62;", b">"),
             (b"&nbsp;", b" "), (b"&amp;", b"&"))


class HtmlEntities(Repair):
    """Text copied out of an HTML page's source, or escaped twice by a tracker: the entities
    ``&lt; &gt; &amp; &quot; &apos; &#39; &#x27; &#34; &nbsp;`` become their characters
    (``&amp;`` last, so ``&amp;lt;`` reads ``&lt;``, as the page showed it)."""

    NAME = "html_entities"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        return len(_ENTITY_RE.findall(seg[:65536])) >= 2

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        for a, b in _ENTITIES:
            data = data.replace(a, b)
        return data


# GitHub links what looks like a file or an address in a comment; copied back as Markdown it
# reads "transport/[net_ib.cc:101](http://net_ib.cc:101/)": the link whose target is its own text
_AUTOLINK_RE = re.compile(rb"\[([^\]\n]{1,200})\]\((?:https?://)?\1/?\)")


class AutoLinks(Repair):
    """Links a tracker made of a log's own words (a file name, an address) and Markdown kept:
    ``[net_ib.cc:101](http://net_ib.cc:101/)`` becomes ``net_ib.cc:101``. A link to anything
    else is the reporter's and stays."""

    NAME = "auto_links"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        return b"](http" in seg and _AUTOLINK_RE.search(seg) is not None

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        return _AUTOLINK_RE.sub(rb"\1", data)


# Markdown's escapes, kept when a rendered comment is copied as source: "frame \#0:", "NCCL\_DEBUG"
_MD_ESCAPE_RE = re.compile(rb"(?<!\\)\\([#*_`<>\[\]])")


class MarkdownEscapes(Repair):
    """A paste copied out of a Markdown source keeps the editor's escapes: ``frame \\#0:``,
    ``NCCL\\_DEBUG``; they go (a backslash before one of ``# * _ ` < > [ ]``), where a text shows
    at least two (a log's own backslashes are Windows paths and escapes of other characters).
    A line's length is then the terminal's again, so a wrap is told by its width."""

    NAME = "markdown_escapes"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        return b"\\" in seg and len(_MD_ESCAPE_RE.findall(seg[:65536])) >= 2

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        return _MD_ESCAPE_RE.sub(rb"\1", data)


_QUOTE_LINE_RE = re.compile(rb"(?m)^[ \t]{0,3}>(?:[ \t]|$)")
_QUOTE_RE = re.compile(rb"(?m)^[ \t]{0,3}(?:>[ \t]?)+")
_NONBLANK_RE = re.compile(rb"(?m)^[ \t]*\S")


class MarkdownQuote(Repair):
    """A Markdown block quote (``> `` before each line, ``> > `` when nested, a bare ``>`` on a
    blank line). Recognised when at least a third of the non-blank lines (and two) are quoted;
    then every line's leading ``>`` marks (and one blank after each) are removed."""

    NAME = "markdown_quote"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        q = len(_QUOTE_LINE_RE.findall(seg))
        return q >= 2 and 3 * q >= len(_NONBLANK_RE.findall(seg))

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        return _QUOTE_RE.sub(b"", data)


_FENCE_SEEN_RE = re.compile(rb"(?m)^[ \t]*(?:```|~~~)|```[ \t]*$")
_FENCE_LINE_RE = re.compile(rb"(?m)^[ \t]*(?:`{3,}|~{3,})[\w+.-]*[ \t]*$")
_FENCE_OPEN_RE = re.compile(rb"(?m)^([ \t]*)(?:`{3,}|~{3,})")
_FENCE_CLOSE_RE = re.compile(rb"(?m)`{3,}[ \t]*$")


class CodeFences(Repair):
    """Markdown code fences: a line of three or more backticks or tildes (with an info string
    such as ``text`` or ``shell``) is emptied (kept as a blank line: the lines keep their
    numbers); a fence glued to a log line's start or end is cut off the line."""

    NAME = "code_fences"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        return (b"```" in seg or b"~~~" in seg) and bool(_FENCE_SEEN_RE.search(seg))

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        data = _FENCE_LINE_RE.sub(b"", data)
        data = _FENCE_OPEN_RE.sub(rb"\1", data)
        return _FENCE_CLOSE_RE.sub(b"", data)


_TICK_SEEN_RE = re.compile(rb"(?m)^[ \t]*`(?!``)[^`\n]|`[\w.-]*:\d+:\d+ \[\d+\]|`\[rank\d+\]:")


class Backticks(Repair):
    """Markdown inline code around or inside log lines (```node1:123:456 [0] NCCL WARN ...```, a
    host name that begins with a backtick). Recognised by a line that starts with a single
    backtick, or a backtick before an NCCL line head or a ``[rankN]:`` tag; then every backtick is removed (no
    format stallscope reads needs one)."""

    NAME = "backticks"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        return b"`" in seg and bool(_TICK_SEEN_RE.search(seg))

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        return data.replace(b"`", b"")


_NUMBER_STYLES = (
    re.compile(rb"(?m)^\[(\d{1,7})\] ?"),           # [00123]
    re.compile(rb"(?m)^L(\d{1,7})(?::? |\t)"),      # L123
    re.compile(rb"(?m)^ {0,6}(\d{1,7})(?::? |\t)"),  # 123 , 123: , cat -n
)


class LineNumbers(Repair):
    """Line numbers an editor or a paste tool put before each line (``123 ``, ``123: ``,
    ``   123\\t``, ``[00123] ``, ``L123 ``). Recognised when, in a sample, at least five lines
    carry one style of number, they cover half the non-blank lines, and every number is the one
    before plus one (a hard-wrapped continuation line may carry none; ``srun --label``'s task
    numbers repeat, so they are never taken for line numbers). The numbers are then removed
    from every line that carries them."""

    NAME = "line_numbers"

    @classmethod
    def _style(cls, seg: bytes):
        nonblank = len(_NONBLANK_RE.findall(seg))
        for rx in _NUMBER_STYLES:
            nums = [int(x) for x in rx.findall(seg)]
            if len(nums) < 5 or 2 * len(nums) < nonblank:
                continue
            d = np.diff(np.asarray(nums, np.int64))
            if (d == 1).all():
                return rx
        return None

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        # numbers mark every line: the window's first lines show them
        return cls._style(_whole_lines(seg[:LINE_NUMBER_BYTES], head=True)) is not None

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        rx = cls._style(sample(data)[0])
        return rx.sub(b"", data) if rx is not None else data


# a line that begins like a log line (never joined onto the one before): launcher tags
# (lines.PREFIXES), NCCL's host:pid:tid [dev], c10/glog, timestamps, tracebacks, nccl-tests rows
_MON = rb"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_ISO = rb"\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d|\s?UTC)?"
_CTIME = rb"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MON + rb" [ \d]\d \d\d:\d\d:\d\d \d{4}"
_NCCL_HEAD = rb"(?:<[\w.-]+>|[\w.][\w.-]*)?:\d+:\d+ \[\d+\] "   # <name>, ...: redacted hosts
_GLOG = rb"[EWIFD]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?"
_DTYPES = rb"(?:float|double|half|bfloat16|int8|uint8|int32|uint32|int64|uint64|fp8_e4m3|fp8_e5m2|f8e4m3|f8e5m2)"
_TEST_ROW = rb"[ \t]+\d+[ \t]+\d+[ \t]+" + _DTYPES + rb"[ \t]+(?:sum|prod|max|min|avg|none|mulsum)[ \t]"
_LOG_START_RE = re.compile(
    rb"(?m)^(?:[ \t]*\d{1,6}: |\[\d+,\d+\]<std|\[default\d+\]:|\[rank\d+\]:|\[pod/|\((?:[\w.:-]+ )?pid=\d+"
    rb"|\[?" + _ISO + rb"|\[?" + _CTIME + rb"|" + _MON + rb" [ \d]\d \d\d:\d\d:\d\d"
    rb"|" + _NCCL_HEAD + rb"|\[?" + _GLOG + rb"|\[[EWIF] \w+\.(?:cpp|hpp|py):\d+\]|\[\d{1,7}\] |L\d{1,7}[: \t]"
    rb"|Traceback \(most recent call last\)|[ \t]*File \"|During handling|The above exception"
    rb"|[\w.]*(?:Error|Exception|Interrupt|Warning)(?::|[ \t]*$)|frame #\d+:|Exception raised from|terminate called"
    rb"|[ \t]*what\(\):|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\b|\[(?:INFO|WARNING|ERROR|DEBUG)"
    rb"|#|" + _TEST_ROW + rb"|[A-Za-z][\w.-]*\d[\w.-]*: |NCCL (?:[A-Z]{4,5}|version)\b|[ \t]*(?:time|host|rank|exitcode|error_file"
    rb"|traceback)\s*:|[ \t]*\[\d+\]:|Root Cause|Failures:|Other Failures|[=-]{5,}|[ \t]*at |\S+@\S+:)")
_SEPARATOR_RE = re.compile(rb"(?m)^[ \t]*[=*#~_-]{20,}[ \t]*$")


def _lines(data: bytes):
    """(start, end, char length, trailing blanks) of every line, from numpy over the bytes."""
    arr = np.frombuffer(data, np.uint8)
    nl = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(arr)]))
    if len(data) and data.endswith(b"\n"):
        starts, ends = starts[:-1], ends[:-1]
    cont = np.concatenate(([0], np.cumsum((arr & 0xC0) == 0x80, dtype=np.int64)))
    chars = (ends - starts) - (cont[ends] - cont[starts])
    # trailing blanks: the last non-blank byte of each line, found from a cumulative index
    nb = np.where((arr != 32) & (arr != 9), np.arange(len(arr)), -1)
    last_nb = np.maximum.accumulate(nb) if len(nb) else nb
    lastc = (np.where(ends > starts, last_nb[np.maximum(ends - 1, 0)], -1) if len(arr)
             else np.full(len(ends), -1, dtype=np.int64))       # no bytes: one empty line
    trail = np.where(lastc >= starts, ends - 1 - lastc, ends - starts)
    return starts, ends, chars, trail


@dataclass(frozen=True)
class _Wrap:
    width: int
    joins: np.ndarray        # line indexes joined onto the next one
    space: np.ndarray        # of those, the ones whose padding stood for one blank
    indent: int              # blanks the continuation lines start with (removed)
    padded: bool             # lines padded with blanks to the width (removed)
    words: bool = False      # a word wrap (:func:`_word_wrap`): each join a blank, every indent removed


_HEAD_AT_RE: re.Pattern | None = None
_NAME_COLON_RE = re.compile(rb"[\w.-]+: ")     # ``srun: error``, ``ncclInvalidUsage: ...``
# a line of its own after a lone long one: a traceback's source line (an assignment, a call, a
# return), or any line after a whole frame header (its source line, whatever it holds)
_SOURCE_RE = re.compile(rb"(?:return|raise|await|yield|del|assert) |[A-Za-z_][\w.]*(?:\[[^\]\n]*\])?(?: ?[-+*/|&]?= |\()")
_FRAME_END_RE = re.compile(rb'[ \t]*File "[^"\n]+", line \d+, in [\w<>.]+[ \t]*$')
_EXCEPTION_RE = re.compile(rb"[ \t]*[\w.]*(?:Error|Exception)\b")     # an exception's message line
_DIGITS_AS_0 = bytes.maketrans(b"123456789", b"000000000")


def _begins_like_log(data: bytes, at: int) -> bool:
    """Whether the line starting at offset ``at`` begins like a log line: a line head of
    :data:`_LOG_START_RE`, a separator, or (after blanks and launcher tags) any line head the
    glued-line split knows (:func:`_heads`)."""
    return bool(_LOG_START_RE.match(data, at) or _SEPARATOR_RE.match(data, at) or _head_at().match(data, at))


def _head_at() -> re.Pattern:
    """A line head of :class:`GluedLines` (with its launcher tags) at a line's start."""
    global _HEAD_AT_RE
    if _HEAD_AT_RE is None:
        _HEAD_AT_RE = re.compile(rb"[ \t]*(?P<chain>" + _TAGS + rb")(?:" + _heads() + rb")")
    return _HEAD_AT_RE


def _continues(data: bytes, starts: np.ndarray, i: int, heads: bool = True) -> bool:
    """Whether line ``i + 1`` reads as the continuation of line ``i``: it does not begin like a
    log line, and the two do not begin alike, digits aside (a list of like lines: paths,
    counters, numbered devices, table rows)."""
    s, t = int(starts[i]), int(starts[i + 1])
    if _SEPARATOR_RE.match(data, s) or _LOG_START_RE.match(data, t) or _SEPARATOR_RE.match(data, t) \
            or heads and _begins_like_log(data, t):
        return False
    a = data[s:s + 6].translate(_DIGITS_AS_0)
    return not (len(a) == 6 and data[t:t + 6].translate(_DIGITS_AS_0) == a)


def _wrap(data: bytes, limit: int | None = None) -> _Wrap | None:
    """The hard wrap of ``data``, or None: see :class:`HardWrap`. ``limit``: at most that many
    candidate lines are looked at (the sniff: its cost stays bounded)."""
    if not data:
        return None
    nl = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    if len(nl) < 2 or int(np.diff(nl, prepend=-1).max()) - 1 < MIN_WIDTH and len(data) - 1 - int(nl[-1]) < MIN_WIDTH:
        return None              # no line as long as the narrowest width (bytes >= characters)
    starts, ends, chars, trail = _lines(data)
    n = len(starts)
    if n < 3:
        return None
    blank = trail == (ends - starts)
    nonblank = ~blank
    if nonblank.sum() < 3:
        return None
    W = int(chars[nonblank].max())
    if not MIN_WIDTH <= W <= MAX_WIDTH:
        return None
    padded = bool((chars[nonblank] == W).mean() > 0.6 and (trail[nonblank] > 0).mean() > 0.3)
    followed = np.zeros(n, bool)
    followed[:-1] = nonblank[1:]
    edge = nonblank & followed & (chars == W)        # reaching the width: cut there, or not
    if padded:
        edge &= trail <= 1                           # the text itself reaches the edge
        soft = np.zeros(n, bool)
    else:
        # wrapped at a blank (``fold -s``): the line keeps its blank, nearly the width long
        soft = nonblank & followed & (trail > 0) & (chars >= W - 24) & (chars < W)
    cand = np.flatnonzero(edge | soft)
    if limit is not None:
        cand = cand[:limit]
    if not len(cand):
        return None

    def verdict(ok):
        e, s = edge[cand], soft[cand]
        he, hc, se, sc = int(e.sum()), int((e & ok).sum()), int(s.sum()), int((s & ok).sum())
        # most lines reaching the width go on in the next line: the lines of a log that merely
        # share the longest length (one format, many lines) are followed by log lines as often
        hard_ok = hc >= 2 and hc >= 0.75 * he
        soft_ok = (hc >= 1 or sc >= 4) and hc + sc >= 3 and hc + sc >= 0.75 * (he + se)
        lone = he == hc == 1 and sc == 0
        return e, s, hard_ok, soft_ok, lone

    # the cheap test first (the line heads of _LOG_START_RE): the full one only tells fewer
    # lines apart as continuations, so when the cheap one finds no wrap there is none
    quick = np.fromiter((_continues(data, starts, i, heads=False) for i in cand.tolist()), bool, len(cand))
    if not any(verdict(quick)[2:]):
        return None
    ok = quick.copy()
    ok[quick] = [_continues(data, starts, i) for i in cand[quick].tolist()]
    e, s, hard_ok, soft_ok, lone = verdict(ok)
    joins = cand[(e | s) & ok] if soft_ok else cand[e & ok]
    if not (hard_ok or soft_ok):
        if not lone:
            return None
        # one wrap alone: taken only when it cut a line a parser reads mid-word: the line
        # begins with a line head of GluedLines or an exception's message, no blank on either
        # side of the cut, and the next line begins like no line a program prints (not a
        # capital, not ``name: ``, no source line) and follows no whole frame header
        i = int(cand[e & ok][0])
        last, nxt = data[ends[i] - 1:ends[i]], data[starts[i + 1]:starts[i + 1] + 1]
        if not (last.isalnum() and nxt.isalnum() and not nxt.isupper()) \
                or _NAME_COLON_RE.match(data, int(starts[i + 1])) or _SOURCE_RE.match(data, int(starts[i + 1])) \
                or _FRAME_END_RE.match(data, int(starts[i]), int(ends[i])) \
                or not (_head_at().match(data, int(starts[i])) or _EXCEPTION_RE.match(data, int(starts[i]))):
            return None
        joins = np.array([i])
    space = joins[trail[joins] == 1] if padded else np.zeros(0, np.int64)
    # indented continuations: the indent 7 in 10 of them have at least (a cut at a blank adds it)
    ji = joins + 1
    ind = np.array([len(data[s:e]) - len(data[s:e].lstrip(b" \t")) for s, e in
                    zip(starts[ji[:200]].tolist(), ends[ji[:200]].tolist())])
    indent = int(np.percentile(ind, 30, method="lower")) if len(ind) else 0
    return _Wrap(W, joins, space, indent, padded)


def _word_wrap(data: bytes, limit: int | None = None) -> _Wrap | None:
    """A greedy word wrap at blanks whose blank a renderer dropped (no line reaches a fixed width, none
    ends in a blank): W is the longest line; a line followed by its continuation (:func:`_continues`) was
    cut when that line, a blank and the next line's first word (20 characters at most: no path, no table
    cell) exceed W. Declared when three cuts or more make three in four of the lines at least half as long
    as W followed by a continuation, half of them fall short of W (one format's lines reaching W are no
    wrap), half the words after them differ (not one format's), and two begin like a log line (no prose)."""
    starts, ends, chars, trail = _lines(data)
    nonblank = trail != (ends - starts)
    W = int(chars[nonblank].max()) if nonblank.sum() >= 3 else 0
    if not MIN_WIDTH <= W <= MAX_WIDTH or (trail[nonblank] > 0).any():
        return None
    pairs = np.flatnonzero(nonblank[:-1] & nonblank[1:] & (chars[:-1] * 2 >= W))[:limit]
    pairs = [i for i in pairs.tolist() if _continues(data, starts, i)]
    fw = {i: (data[starts[i + 1]:ends[i + 1]].split() or [b""])[0] for i in pairs}
    cut = [i for i in pairs if chars[i] + 1 + len(fw[i]) > W and len(fw[i]) <= 20]
    if len(cut) < 3 or len(cut) < 0.75 * len(pairs) or 2 * (chars[cut] < W).sum() < len(cut) \
            or 2 * len({fw[i] for i in cut}) < len(cut) or sum(_begins_like_log(data, int(starts[i])) for i in cut) < 2:
        return None
    return _Wrap(W, np.asarray(cut, np.int64), np.zeros(0, np.int64), 0, False, True)


class HardWrap(Repair):
    """Lines hard-wrapped at a fixed width (60 to 200 columns) by a terminal, a renderer or a
    mail client, mid-word or at a blank, the continuation indented or not, every line padded
    with blanks to the width or not (a GitHub-rendered terminal paste). The width W is the
    longest line's (no line of a wrapped text is longer). A wrap is declared only when it is
    plain: at least two lines reach W and three in four of those that do are followed by a
    line that reads as their continuation: one that does not begin like a log line
    (:data:`_LOG_START_RE`: launcher tags, NCCL's ``host:pid:tid [dev]``, ``[rankN]:``, c10's
    ``[E1112 ...]``, timestamps, Python tracebacks, nccl-tests rows, torchrun's summary; or
    any line head of :class:`GluedLines`) and does not begin like the line itself (a list of
    like lines). A log whose lines merely share the longest length (one format: the lines
    after them are log lines as often as not) is not wrapped; nor is one long line before a
    short one, unless the cut fell mid-word in a line that begins with a line head a parser
    reads (:class:`GluedLines`'s) or with an exception's name, and the next begins with a
    lower-case word that is no ``name: `` nor a source line (an assignment, a call, a
    ``return``) and the long line is no whole traceback frame header. ``fold -s`` wraps (lines ending in a blank just
    short of W) count with those reaching W; four of them make a wrap without any line
    reaching W (a log's lines seldom end in a blank). A word wrap whose blank went (no fixed
    width) is told by its cuts instead (:func:`_word_wrap`). Such a line is joined with the next: mid-word
    with nothing between, at a blank keeping it; a line that begins like a log line is never
    joined onto the one before. Padding is removed from every line. The sniff
    looks at no more than 400 candidate lines per sampled window."""

    NAME = "hard_wrap"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        seg = seg.replace(b"\r\n", b"\n")
        return _wrap(seg, limit=400) is not None or _word_wrap(seg, limit=400) is not None

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        w = _wrap(data) or _word_wrap(data)
        if w is None:
            return data
        starts, ends, chars, trail = _lines(data)
        keep = np.ones(len(data), bool)
        arr = np.frombuffer(data, np.uint8)
        if w.padded:   # the padding of every line
            nb = np.flatnonzero(trail > 0)
            for s, e in zip((ends[nb] - trail[nb]).tolist(), ends[nb].tolist()):
                keep[s:e] = False
            # one blank stands for the space the wrap fell on
            keep[ends[w.space] - 1] = True
        j = w.joins
        keep[ends[j]] = False       # the newline
        if w.words:                 # a blank for it, the continuation's indent gone
            arr = arr.copy()
            arr[ends[j]], keep[ends[j]] = 32, True
            for p in (ends[j] + 1).tolist():
                while p < len(arr) and arr[p] in (32, 9):
                    keep[p], p = False, p + 1
        if w.indent:
            for k in range(w.indent):
                pos = ends[j] + 1 + k
                ok = (pos < len(arr))
                pos = pos[ok]
                keep[pos[(arr[pos] == 32) | (arr[pos] == 9)]] = False
        return arr[keep].tobytes()


# glued lines: the heads a line of each format starts with; the split goes before them, and
# before the launcher tags that stand in front of them
_TAGS = (rb"(?:(?:\[?" + _ISO + rb"\]?:?[ \t]+(?:[\w.-]+ >> )?|" + _CTIME + rb"|\d{1,6}: |\[rank\d+\]:[ \t]?"
         rb"|\[[A-Za-z_][A-Za-z_-]*\d+(?:\|\d+)?\]:[ \t]?|\[\d+,\d+\]<std\w+>:[ \t]?|\[pod/[^\]\s]+\][ \t]|\((?:[\w.:-]+ )?pid=\d+"
         rb"(?:, ip=[\d.:a-fA-F]+)?\)[ \t]|(?<![\w.-])[A-Za-z](?=[\w.-]*\d)[\w.-]*: )*)")


def _nccl_markers() -> bytes:
    words = sorted({m[len(b"NCCL "):] for m in NCCL_DEBUG_MARKERS if m.startswith(b"NCCL ")
                    and m != b"NCCL version"} | {b"CALL"})
    return b"|".join(re.escape(w) for w in words)


def _other_nccl_heads() -> bytes:
    """``heads.NCCL_DEBUG_MARKERS``' heads other than NCCL's own: ``libfabric:<pid>:<time>:``."""
    return b"|".join(rb"(?<![\w.-])" + re.escape(m) + rb"\d+:\d+:" for m in NCCL_DEBUG_MARKERS
                     if not m.startswith(b"NCCL "))


def _tests_markers() -> bytes:
    hashed = [re.escape(m[1:].lstrip()) for m in NCCL_TESTS_MARKERS if m.startswith(b"# ")]
    return b"#[ \t]*(?:" + b"|".join(hashed + [rb"Using devices", rb"Rank +\d", rb"[ \t]*size[ \t]",
                                                rb"[ \t]*\(B\)", rb"[ \t]+out-of-place", rb"nccl-tests"]) + b")"


def _exit_heads() -> bytes:
    """Lines of the programs ``heads.TORCH_ELASTIC_MARKERS`` names (``srun:``, ``slurmstepd[-host]:``), torchrun's logger."""
    progs = [rb"(?<![\w./-])" + re.escape(m[:-len(b": error:")]) + rb"(?:-[\w.-]+)?: " for m in TORCH_ELASTIC_MARKERS
             if m.endswith(b": error:")]
    return b"|".join(progs + [rb"torch\.distributed\.elastic\.[\w.]+: \[?(?:WARNING|ERROR|INFO)\]?"])


def _code_heads() -> bytes:
    """NCCL's result codes as PyTorch prints them alone on a line: ``heads.CODE_MARKERS``."""
    return rb"(?<![\w.])(?:" + b"|".join(re.escape(m) for m in CODE_MARKERS) + b")"


def _ib_heads() -> bytes:
    """Port lines of ibdev2netdev and iblinkinfo: the heads of ``ib_status``' IBDEV2NETDEV_RE, LINK_PORT_RE."""
    return (rb"(?<![\w.-])(?:mlx\w+|[a-z]\w*_\d+) +port +\d+ +(?:\([A-Z_]+ *\) +)?==> +\S"
            rb"|(?<![\w.-])(?:0x[0-9a-fA-F]+ +)?\d+ +\d+\[[ \d]*\] ==\(")


def _heads() -> bytes:
    return b"|".join((
        rb"(?<![\w.<>-])" + _NCCL_HEAD + rb"(?:[\w./-]+:\d+ (?:\(\w+\) )?)?NCCL (?:" + _nccl_markers() + rb")\b",
        _VERSION_HEAD.pattern,
        rb"\[rank\d+\]:",                                   # PyTorch >= 2.2 stderr
        rb"\[" + _GLOG + rb" +\d+ [\w/.-]+:\d+\]",          # c10 logger, bracketed
        _GLOG + rb" +\d+ [\w/.-]+:\d+\]",                   # c10 / torchrun glog
        rb"\[[EWIF] ProcessGroupNCCL\.cpp:\d+\]",           # PyTorch 1.x watchdog
        rb"(?:ERROR|WARNING|INFO): ?torch\.distributed",     # torchrun 1.x / 2.0
        _exit_heads(), _code_heads(), _ib_heads(), _other_nccl_heads(),
        rb"\[[\w.-]+@[\w-]+[^\]\n]*\][#$] ",                # a shell prompt (as ib_status' PROMPT_RE)
        rb"(?<=\s)File \"[^\"\n]+\", line \d+",              # a traceback's frame
        rb"torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError",
        rb"Traceback \(most recent call last\):",
        rb"terminate called after throwing", rb"(?<=\s)what\(\): ",      # and the C++ runtime's next line
        rb"Exception raised from ",
        rb"frame #\d+: ",
        rb"(?<=\s)={20,}", rb"Root Cause \(first observed failure\):", rb"Other Failures:",
        rb"Failures:(?=\s+(?:<NO_OTHER_FAILURES>|\[\d+\]))",
        rb"\[\d+\]:(?=\s+time\s*:)", rb"(?<=\s\s)(?:time|host|rank|exitcode|error_file|traceback)\s*: ",
        _tests_markers(),
        _TEST_ROW[len(rb"[ \t]+"):],
        rb"\S+: Test (?:NCCL|CUDA) failure", rb"\.\. \S+ pid \d+: Test failure",
        rb"CA '\w+'", rb"hca_id:\s", rb"Infiniband device '", rb"(?<![\w.-])(?:Switch|CA|Router): (?:0x[0-9a-fA-F]+ )?\S",
        rb"(?<= )\t+",
    ))


# heads that split only where the line shows the block they belong to: a port's fields after
# its device (ibstat, ibstatus, ibv_devinfo), an exception's message after a traceback's frame,
# PyTorch's "Last error:" (a line of its own) and NCCL's quoted last WARN after it, beside an NCCL error
_IB_BLOCK_RE = re.compile(rb"CA '[^'\n]+'|hca_id:|Infiniband device '[^'\n]+' port \d+ status:")
_FRAME_RE = re.compile(rb'File "[^"\n]+", line \d+')
_NCCL_ERROR_RE = re.compile(rb"NCCL error|nccl[A-Z]\w*Error: ")
_SPLITS: re.Pattern | None = None


def _ib_fields() -> bytes:
    """A port block's fields: ``heads.IBSTAT_KEYS``, ibstatus' and ibv_devinfo's (any case, longest first)."""
    keys = set(IBSTAT_KEYS) | {"default gid", "phys state", "link_layer", "transport", "fw_ver", "node_guid",
                               "sys_image_guid", "vendor_id", "vendor_part_id", "hw_ver", "board_id",
                               "phys_port_cnt", "port", "max_mtu", "active_mtu", "sm_lid", "port_lid", "port_lmc"}
    words = sorted((re.escape(k.encode()).replace(b"\\ ", b" +") for k in keys), key=len, reverse=True)
    return rb"(?<![\w.-])(?i:Port \d+|" + b"|".join(words) + rb"):(?=[ \t])"


def _hostless_heads() -> bytes:
    """NCCL's line head pasted without host:pid:tid (as ``nccl_debug``'s HOSTLESS_WARN_RE and PIDLESS_RE
    read it: [dev] or a source before ``NCCL``, before [dev] a host: a word with a digit), and NCCL's error trace
    with its level cut off (``init.cc:1138 -> 1``). Glue heads only: as line heads a wrap cut in a path stays cut."""
    return (rb"(?<![\w.:/<>-])(?:(?:(?<!\S)[A-Za-z](?=[\w.-]*\d)[\w.-]*\w )?\[-?\d+\] (?:\w[\w./-]*:\d+ (?:\(\w+\) )?)?"
            rb"|\w[\w./-]*:\d+ (?:\(\w+\) )?)NCCL (?:" + _nccl_markers() + rb")\b"
            rb"|(?<![\w.:/<>-])(?<!INFO )\w[\w./-]*\.(?:cc|cu|cpp|h):\d+ -> -?\d+\b")


def _splits() -> re.Pattern:
    global _SPLITS
    if _SPLITS is None:
        _SPLITS = re.compile(rb"(?P<chain>" + _TAGS + rb")(?:(?P<ib>" + _ib_fields() + rb")|(?P<exc>(?:[A-Za-z_]\w*\.)*"
                             rb"[A-Z]\w*(?:Error|Exception|Interrupt): )|(?P<last>Last error:[ \t]+)(?=\S)|"
                             + _heads() + b"|" + _hostless_heads() + rb")")
    return _SPLITS


def _glue_points(data: bytes) -> list[int]:
    """The offsets where a line head (with its tags) stands mid-line, on a line that holds
    two heads or more (one head after other text is a launcher's or a paste's own prefix,
    which the parsers read as the line's context). The heads of :func:`_splits` that belong
    to a block count only after that block's head on the line (a port field after its device,
    an exception's message after a frame, ``Last error:`` and its text on a line with an NCCL error)."""
    by_line: dict[int, list[int]] = {}
    prev = 0
    for m in _splits().finditer(data):
        at, end, prev = m.start(), prev, m.end()
        ls = max(data.rfind(b"\n", 0, at), data.rfind(b"\r", 0, at)) + 1
        if m["ib"] and not _IB_BLOCK_RE.search(data, ls, at) or m["exc"] and not _FRAME_RE.search(data, ls, at) \
                or m["last"] and not _NCCL_ERROR_RE.search(data, ls, max(data.find(b"\n", at) % (len(data) + 1), at)):
            continue
        if m["last"]:     # "Last error:" stands alone on its line
            by_line.setdefault(ls, []).append(at)
            at = m.end()
        elif m["ib"] or _TEST_ROW_AT.match(data, at) or _LINK_ROW_AT.match(data, at):
            # a table row or a port's field starts with blanks: the split goes before them
            while at > ls and data[at - 1] in b" \t":
                at -= 1
            if at < end:
                continue     # its blanks are the head before (pdsh's "node7: \t")
        by_line.setdefault(ls, []).append(at)
    out = []
    for ls, ats in by_line.items():
        if len(ats) < 2:
            continue
        # a head after another with only blanks and tags between is one head with it (``[rank1]:
        # File "..."``); one at the line's start is no split point
        heads, last = [], ls
        for at in sorted(ats):
            if at == last or not strip_tags(data[last:at].decode("utf-8", "replace"))[1].strip():
                if at == ls or last == ls and not heads:
                    heads.append(None)
                continue
            heads.append(at)
            last = at
        if len(heads) >= 2:
            out += [at for at in heads if at is not None]
    return sorted(out)


_LINK_ROW_AT = re.compile(rb"(?:0x[0-9a-fA-F]+ +)?\d+ +\d+\[[ \d]*\] ==\(")
_TEST_ROW_AT = re.compile(rb"\d+[ \t]+\d+[ \t]+" + _DTYPES)


_GLUE_CANDIDATES: tuple[re.Pattern, ...] | None = None
_VERSION_HEAD = re.compile(rb"(?<!INFO )(?<!, )(?<!\w)NCCL version \d")    # as in _heads()


def _glue_candidates() -> tuple[re.Pattern, ...]:
    """Cheap stand-ins for the line heads of :func:`_splits`, most led by a literal (searched at memchr
    speed): every head the split takes holds the end of one of their matches, so a line that the split cuts
    holds two of these hits (the sniff runs the full split only on such lines). ``[rankN]:`` before a c10
    head is one head with it (a tag of the head)."""
    global _GLUE_CANDIDATES
    if _GLUE_CANDIDATES is None:
        _GLUE_CANDIDATES = tuple(re.compile(x) for x in (
            rb"NCCL (?:" + _nccl_markers() + rb")\b", rb"NCCL version \d",     # [1]: filtered by _VERSION_HEAD
            rb"\[rank\d+\]:(?!\[" + _GLOG[:13] + rb")", _GLOG[:-len(rb"(?:\.\d+)?")],
            rb"\[[EWIF] ProcessGroupNCCL\.cpp:\d+\]", rb":torch\.distributed", rb"ChildFailedError",
            rb"Traceback \(most recent call last\):", rb"terminate called after throwing", rb"Exception raised from ",
            rb"frame #\d+: ", b"=" * 20, rb"Root Cause \(first observed failure\):", rb"Failures:", rb"\[\d+\]:",
            rb"\s\s(?:time|host|rank|exitcode|error_file|traceback)\s*: ", _tests_markers(),
            rb"[ \t]" + _DTYPES + rb"[ \t]+(?:sum|prod|max|min|avg|none|mulsum)[ \t]",
            rb": Test (?:NCCL|CUDA) failure", rb"\.\. \S+ pid \d+: Test failure", rb"CA '\w+'", rb"hca_id:\s",
            rb"Infiniband device '", rb"Switch: ", rb"CA: ", rb"Router: ", rb" \t", rb"srun", rb"slurmstepd",
            rb"torch\.distributed\.elastic\.", rb"nccl[A-Z]\w*Error: ", rb"tate:",
            rb" ==[>(] ", rb'File "', rb"\.(?:cc|cu|cpp|h):\d+ -> ", rb" what\(\): ", rb"libfabric:\d", rb"\][#$] ", rb"Error: ", rb"Exception: ", rb"Interrupt: ", rb"Last error:"))
    return _GLUE_CANDIDATES


class GluedLines(Repair):
    """Log lines glued together: a whole log joined onto one line (newlines become blanks in a
    form field or a chat), or a line run into the next (a progress bar without its newline).
    A line head a parser knows (NCCL's ``host:pid:tid [dev] NCCL WARN|INFO|...`` from
    ``NcclDebugParser.MARKERS``, ``[rankN]:``, c10's ``[E1112 ...]``, PyTorch 1.x's
    ``[E ProcessGroupNCCL.cpp:N]``, torchrun's ``ERROR:torch.distributed...`` and its
    failure summary's fields, nccl-tests' ``#`` lines from ``NcclTestsParser.MARKERS`` and its
    table rows, ibstat/ibv_devinfo/iblinkinfo blocks, tracebacks), with the launcher tags before it
    (``12: ``, ``[1,0]<stdout>:``, a timestamp...), standing mid-line starts a new line there;
    one blank before it, the join's, is dropped. The sniff searches the sampled windows with
    cheap stand-ins of the heads (:func:`_glue_candidates`) and runs the full split only on
    the lines holding two hits or more."""

    NAME = "glued_lines"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        hits = [m.end() - 1 for rx in _glue_candidates() for m in rx.finditer(seg)
                if rx is not _glue_candidates()[1] or _VERSION_HEAD.match(seg, m.start())]
        if len(hits) < 2:
            return False
        nl = np.flatnonzero(np.frombuffer(seg, np.uint8) == 10)
        line, count = np.unique(np.searchsorted(nl, np.asarray(hits, np.int64)), return_counts=True)
        starts = np.concatenate(([0], nl + 1))
        ends = np.concatenate((nl, [len(seg)]))
        return any(_glue_points(seg[starts[i]:ends[i]]) for i in line[count >= 2].tolist())

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        pts = _glue_points(data)
        if not pts:
            return data
        parts, last = [], 0
        for p in pts:
            cut = p - 1 if data[p - 1:p] == b" " else p
            if cut < last:
                cut = p
            parts.append(data[last:cut])
            last = p
        parts.append(data[last:])
        return b"\n".join(parts)


# --------------------------------------------------------------------------- the pipeline

# the order matters: unwrap the shippers' containers first, then the Markdown around the text,
# then the lines themselves (a hard wrap is undone before line numbers are stripped, since a
# paste numbers its lines before wrapping them, and again after, for the other order)
PIPELINE: tuple[type[Repair], ...] = (ContainerLog, ExportColumns, HtmlEntities, AutoLinks, MarkdownEscapes,
                                      MarkdownQuote, CodeFences, Backticks, HardWrap, LineNumbers, HardWrap, GluedLines)
REPAIRS: dict[str, type[Repair]] = {r.NAME: r for r in PIPELINE}


_JSON_RE = re.compile(rb"\s*(?:\{|\[\s*[\[{\"\]])")


def normalize(data) -> Normalized:
    """``data`` (``bytes``, ``bytearray``, ``memoryview`` or a read-only ``mmap``) repaired as the
    module docstring says; the very same object back when it needs no repair."""
    n = len(data)
    if n == 0:
        return Normalized(data)
    head = bytes(data[:8192])
    if looks_binary(head) or b"\x00" in head or _JSON_RE.match(head) and not _DOCKER_RE.match(head) \
            or head.decode("utf-8", "replace").count("\ufffd") > len(head) // 100:
        return Normalized(data)        # binary, compressed, or a structured JSON document
    segs = sample(data)
    if not any(r.needed(segs) for r in dict.fromkeys(PIPELINE)):
        return Normalized(data)
    out = bytes(data)
    if out.startswith(b"\xef\xbb\xbf"):
        out = out[3:]
    out = out.replace(b"\r\n", b"\n")
    done: list[str] = []
    for r in PIPELINE:
        segs = sample(out)
        if not r.needed(segs):
            continue
        new = r.apply(out)
        if new != out:
            done.append(r.NAME)
            out = new
    if not done:
        return Normalized(data)
    return Normalized(out, tuple(done))


__all__ = ["Normalized", "PIPELINE", "REPAIRS", "Repair", "normalize", "sample"]
