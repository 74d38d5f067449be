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

The markers the glued-line split looks for come from the parsers themselves where they are
whole line heads (``NcclDebugParser.MARKERS``, ``NcclTestsParser.MARKERS``), plus the line
heads of PyTorch's watchdog, c10 logger and torchrun (:data:`HEADS`).
"""
from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass

import numpy as np

from .registry import looks_binary

SMALL_BYTES = 256 << 10        # texts up to this size are sniffed whole
HEAD_BYTES = 64 << 10          # else: the head, and WINDOWS windows of WINDOW_BYTES further in
WINDOW_BYTES = 16 << 10
WINDOWS = 4
MIN_WIDTH, MAX_WIDTH = 60, 200  # the hard-wrap widths recognised
GLUE_MIN_CHARS = 120           # a line holding two log lines is at least this long


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
        return bool(_DOCKER_RE.search(seg)) or len(_CRI_RE.findall(seg[:8192])) >= 2

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
_FENCE_LINE_RE = re.compile(rb"(?m)^[ \t]*(?:`{3,}|~{3,})[\w+.-]*[ \t]*(?:\n|$)")
_FENCE_OPEN_RE = re.compile(rb"(?m)^([ \t]*)(?:`{3,}|~{3,})")
_FENCE_CLOSE_RE = re.compile(rb"(?m)`{3,}[ \t]*$")


class CodeFences(Repair):
    """Markdown code fences: a line of three or more backticks or tildes (with an info string
    such as ``text`` or ``shell``) is removed; a fence glued to a log line's start or end is cut
    off the line."""

    NAME = "code_fences"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        return bool(_FENCE_SEEN_RE.search(seg))

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
        return bool(_TICK_SEEN_RE.search(seg))

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
        return cls._style(seg) is not None

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        rx = cls._style(sample(data)[0])
        return rx.sub(b"", data) if rx is not None else data


# a line that begins like a log line (never joined onto the one before): launcher tags
# (lines.PREFIXES), NCCL's host:pid:tid [dev], c10/glog, timestamps, tracebacks, nccl-tests rows
_MON = rb"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_ISO = rb"\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d|\s?UTC)?"
_CTIME = rb"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MON + rb" [ \d]\d \d\d:\d\d:\d\d \d{4}"
_NCCL_HEAD = rb"[\w.-]*:\d+:\d+ \[\d+\] "
_GLOG = rb"[EWIFD]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?"
_DTYPES = rb"(?:float|double|half|bfloat16|int8|uint8|int32|uint32|int64|uint64|fp8_e4m3|fp8_e5m2|f8e4m3|f8e5m2)"
_TEST_ROW = rb"[ \t]+\d+[ \t]+\d+[ \t]+" + _DTYPES + rb"[ \t]+(?:sum|prod|max|min|avg|none|mulsum)[ \t]"
_LOG_START_RE = re.compile(
    rb"(?m)^(?:[ \t]*\d{1,6}: |\[\d+,\d+\]<std|\[default\d+\]:|\[rank\d+\]:|\[pod/|\((?:[\w.:-]+ )?pid=\d+"
    rb"|\[?" + _ISO + rb"|\[?" + _CTIME + rb"|" + _MON + rb" [ \d]\d \d\d:\d\d:\d\d"
    rb"|" + _NCCL_HEAD + rb"|\[?" + _GLOG + rb"|\[[EWIF] \w+\.(?:cpp|hpp|py):\d+\]|\[\d{1,7}\] |L\d{1,7}[: \t]"
    rb"|Traceback \(most recent call last\)|[ \t]*File \"|During handling|The above exception"
    rb"|[\w.]*(?:Error|Exception|Interrupt|Warning)\b|frame #\d+:|Exception raised from|terminate called"
    rb"|[ \t]*what\(\):|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\b|\[(?:INFO|WARNING|ERROR|DEBUG)"
    rb"|#|" + _TEST_ROW + rb"|[A-Za-z][\w.-]*\d[\w.-]*: |NCCL |[ \t]*(?:time|host|rank|exitcode|error_file"
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
    lastc = np.where(ends > starts, last_nb[np.maximum(ends - 1, 0)], -1)
    trail = np.where(lastc >= starts, ends - 1 - lastc, ends - starts)
    return starts, ends, chars, trail


def _flag(data: bytes, rx: re.Pattern, starts: np.ndarray) -> np.ndarray:
    """Lines (by start offset) at whose start ``rx`` matches."""
    out = np.zeros(len(starts), bool)
    offs = np.fromiter((m.start() for m in rx.finditer(data)), np.int64)
    if len(offs):
        idx = np.searchsorted(starts, offs)
        ok = idx < len(starts)
        idx, offs = idx[ok], offs[ok]
        out[idx[starts[idx] == offs]] = True
    return out


@dataclass(frozen=True)
class _Wrap:
    width: int
    joins: np.ndarray        # line indexes joined onto the next one
    space: np.ndarray        # of those, the ones whose padding stood for one blank
    indent: int              # blanks the continuation lines start with (removed)
    padded: bool             # lines padded with blanks to the width (removed)


def _wrap(data: bytes) -> _Wrap | None:
    if not data:
        return None
    starts, ends, chars, trail = _lines(data)
    n = len(starts)
    if n < 3:
        return None
    blank = trail == (ends - starts)
    start = _flag(data, _LOG_START_RE, starts)
    sep = _flag(data, _SEPARATOR_RE, starts)
    nxt_ok = np.zeros(n, bool)
    nxt_ok[:-1] = ~blank[1:] & ~start[1:] & ~sep[1:]
    nonblank = ~blank
    if nonblank.sum() < 3:
        return None
    W = int(chars[nonblank].max())
    if not MIN_WIDTH <= W <= MAX_WIDTH:
        return None
    padded = bool((chars[nonblank] == W).mean() > 0.6 and (trail[nonblank] > 0).mean() > 0.3)
    # a list of like lines (paths, counters) is not a wrap: a continuation starts unlike its line
    like = np.zeros(n, bool)
    cand = np.flatnonzero(nxt_ok & (chars >= W - 24))
    for i in cand[:400].tolist():
        a = data[starts[i]:starts[i] + 6]
        like[i] = len(a) == 6 and data[starts[i + 1]:starts[i + 1] + 6] == a
    nxt_ok &= ~like
    full = (chars == W) & nxt_ok & ~sep
    if padded:
        hard = full & (trail == 0)
        space = full & (trail == 1)
        joins = hard | space
    else:
        hard = full
        space = np.zeros(n, bool)
        # wrapped at a blank (``fold -s``): the line keeps its blank, nearly the width long
        soft = nxt_ok & ~sep & (trail > 0) & (chars >= W - 24) & (chars < W)
        joins = hard | soft
    if hard.sum() + space.sum() < 2 and not (joins.sum() >= 3 and hard.sum() >= 1):
        # one wrap alone: taken when it fell mid-word (no blank on either side, the
        # continuation not starting like a sentence)
        one = np.flatnonzero(hard)
        if len(one) != 1:
            return None
        i = int(one[0])
        last, first = data[ends[i] - 1:ends[i]], data[starts[i + 1]:starts[i + 1] + 1]
        if last.isspace() or first.isspace() or first.isupper():
            return None
        joins = hard
    # indented continuations: the indent most of them share
    ji = np.flatnonzero(joins) + 1
    ind = np.array([len(data[s:e]) - len(data[s:e].lstrip(b" \t")) for s, e in
                    zip(starts[ji[:200]].tolist(), ends[ji[:200]].tolist())])
    indent = 0
    if len(ind):
        vals, counts = np.unique(ind, return_counts=True)
        k = int(vals[counts.argmax()])
        if k > 0 and counts.max() >= 0.7 * len(ind):
            indent = k
    return _Wrap(W, np.flatnonzero(joins), np.flatnonzero(space), indent, padded)


class HardWrap(Repair):
    """Lines hard-wrapped at a fixed width (60 to 200 columns) by a terminal, a renderer or a
    mail client, mid-word or at a blank, the continuation indented or not, every line padded
    with blanks to the width or not (a GitHub-rendered terminal paste). The width is the
    longest line's (no line of a wrapped text is longer), taken only when at least two lines
    of exactly that width (or one and more lines ending in a blank just short of it, or a
    single one cut mid-word) are each followed by a line that does not begin like a log line (:data:`_LOG_START_RE`: launcher
    tags, NCCL's ``host:pid:tid [dev]``, ``[rankN]:``, c10's ``[E1112 ...]``, timestamps,
    Python tracebacks, nccl-tests rows, torchrun's summary). Such a line is joined with the
    next: mid-word with nothing between, at a blank keeping it; a line that begins like a log
    line is never joined onto the one before. Padding is removed from every line."""

    NAME = "hard_wrap"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        return _wrap(seg.replace(b"\r\n", b"\n")) is not None

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        w = _wrap(data)
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
        if w.indent:
            for k in range(w.indent):
                pos = ends[j] + 1 + k
                ok = (pos < len(arr))
                pos = pos[ok]
                keep[pos[(arr[pos] == 32) | (arr[pos] == 9)]] = False
        return arr[keep].tobytes()


# glued lines: the heads a line of each format starts with; the split goes before them, and
# before the launcher tags that stand in front of them
_TAGS = (rb"(?:(?:\[?" + _ISO + rb"\]?[ \t]+(?:[\w.-]+ >> )?|" + _CTIME + rb"|\d{1,6}: |\[rank\d+\]:[ \t]?"
         rb"|\[default\d+\]:[ \t]?|\[\d+,\d+\]<std\w+>:[ \t]?|\[pod/[^\]\s]+\][ \t]|\((?:[\w.:-]+ )?pid=\d+"
         rb"(?:, ip=[\d.:a-fA-F]+)?\)[ \t]|(?<![\w.-])[A-Za-z](?=[\w.-]*\d)[\w.-]*: )*)")


def _nccl_markers() -> bytes:
    from .nccl_debug import NcclDebugParser
    words = sorted({m[len(b"NCCL "):] for m in NcclDebugParser.MARKERS if m.startswith(b"NCCL ")
                    and m != b"NCCL version"} | {b"CALL"})
    return b"|".join(re.escape(w) for w in words)


def _tests_markers() -> bytes:
    from .nccl_tests import NcclTestsParser
    hashed = [re.escape(m[1:].lstrip()) for m in NcclTestsParser.MARKERS if m.startswith(b"# ")]
    return b"#[ \t]*(?:" + b"|".join(hashed + [rb"Using devices", rb"Rank +\d", rb"[ \t]*size[ \t]",
                                                rb"[ \t]*\(B\)", rb"[ \t]+out-of-place", rb"nccl-tests"]) + b")"


def _heads() -> bytes:
    return b"|".join((
        rb"(?<![\w.-])" + _NCCL_HEAD + rb"(?:[\w./-]+:\d+ (?:\(\w+\) )?)?NCCL (?:" + _nccl_markers() + rb")\b",
        rb"(?<!INFO )(?<!, )(?<!\w)NCCL version \d",
        rb"\[rank\d+\]:",                                   # PyTorch >= 2.2 stderr
        rb"\[" + _GLOG + rb" +\d+ [\w/.-]+:\d+\]",          # c10 logger, bracketed
        _GLOG + rb" +\d+ [\w/.-]+:\d+\]",                   # c10 / torchrun glog
        rb"\[[EWIF] ProcessGroupNCCL\.cpp:\d+\]",           # PyTorch 1.x watchdog
        rb"(?:ERROR|WARNING|INFO):torch\.distributed",       # torchrun 1.x / 2.0
        rb"torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError",
        rb"Traceback \(most recent call last\):",
        rb"terminate called after throwing",
        rb"Exception raised from ",
        rb"frame #\d+: ",
        rb"(?<=\s)={20,}", rb"Root Cause \(first observed failure\):", rb"Other Failures:",
        rb"Failures:(?=\s+(?:<NO_OTHER_FAILURES>|\[\d+\]))",
        rb"\[\d+\]:(?=\s+time\s*:)", rb"(?<=\s\s)(?:time|host|rank|exitcode|error_file|traceback)\s*: ",
        _tests_markers(),
        _TEST_ROW[len(rb"[ \t]+"):],
        rb"\S+: Test (?:NCCL|CUDA) failure", rb"\.\. \S+ pid \d+: Test failure",
        rb"CA '\w+'", rb"hca_id:\s", rb"Infiniband device '", rb"(?<= )\t+",
    ))


_SPLIT_RE: re.Pattern | None = None


def _split_re() -> re.Pattern:
    global _SPLIT_RE
    if _SPLIT_RE is None:
        _SPLIT_RE = re.compile(rb"(?P<chain>" + _TAGS + rb")(?:" + _heads() + rb")")
    return _SPLIT_RE


def _glue_points(data: bytes) -> list[int]:
    """The offsets where a line head (with its tags) stands mid-line, on a line that holds
    two heads or more (one head after other text is a launcher's or a paste's own prefix,
    which the parsers read as the line's context)."""
    from .lines import strip_tags
    by_line: dict[int, list[int]] = {}
    for m in _split_re().finditer(data):
        at = m.start()
        ls = max(data.rfind(b"\n", 0, at), data.rfind(b"\r", 0, at)) + 1
        by_line.setdefault(ls, []).append(at)
    out = []
    for ls, ats in by_line.items():
        if len(ats) < 2:
            continue
        for at in ats:
            if at == ls or not strip_tags(data[ls:at].decode("utf-8", "replace"))[1].strip():
                continue             # only blanks and launcher tags before it: the line's start
            if _TEST_ROW_AT.match(data, at):
                # a nccl-tests row starts with blanks: the split goes before them
                while at > ls and data[at - 1] in b" \t":
                    at -= 1
                if at == ls:
                    continue
            out.append(at)
    return sorted(out)


_TEST_ROW_AT = re.compile(rb"\d+[ \t]+\d+[ \t]+" + _DTYPES)


class GluedLines(Repair):
    """Log lines glued together: a whole log joined onto one line (newlines become blanks in a
    form field or a chat), or a line run into the next (a progress bar without its newline).
    A line head a parser knows (NCCL's ``host:pid:tid [dev] NCCL WARN|INFO|...`` from
    ``NcclDebugParser.MARKERS``, ``[rankN]:``, c10's ``[E1112 ...]``, PyTorch 1.x's
    ``[E ProcessGroupNCCL.cpp:N]``, torchrun's ``ERROR:torch.distributed...`` and its
    failure summary's fields, nccl-tests' ``#`` lines from ``NcclTestsParser.MARKERS`` and its
    table rows, ibstat/ibv_devinfo blocks, tracebacks), with the launcher tags before it
    (``12: ``, ``[1,0]<stdout>:``, a timestamp...), standing mid-line starts a new line there;
    one blank before it, the join's, is dropped."""

    NAME = "glued_lines"

    @classmethod
    def seen(cls, seg: bytes) -> bool:
        # two line heads on one line make it long: only long lines are searched
        starts, ends, _, _ = _lines(seg)
        long = np.flatnonzero(ends - starts > GLUE_MIN_CHARS)
        return any(_glue_points(seg[s:e]) for s, e in zip(starts[long].tolist(), ends[long].tolist()))

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
PIPELINE: tuple[type[Repair], ...] = (ContainerLog, ExportColumns, HtmlEntities, MarkdownQuote, CodeFences, Backticks,
                                      HardWrap, LineNumbers, HardWrap, GluedLines)
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
    if not any(r.needed(segs) for r in PIPELINE):
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
