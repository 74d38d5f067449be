"""Lines hard-wrapped by a terminal, a renderer or a mail client, joined again (:class:`HardWrap`)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..lines import strip_tags
from .lineheads import LOG_START_RE, NCCL_HEAD, SEPARATOR_RE, TAGS, all_heads, nccl_markers
from .repair import Repair

MIN_WIDTH, MAX_WIDTH = 60, 200  # the hard-wrap widths recognised


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
_HEAD_IN_RE: re.Pattern | None = None
_NAME_COLON_RE = re.compile(rb"[\w.-]+: ")     # ``srun: error``, ``ncclInvalidUsage: ...``
# a line of its own after a lone long one: a traceback's source line (an assignment, a call, a
# return), or any line after a whole frame header (its source line, whatever it holds)
_SOURCE_RE = re.compile(rb"(?:return|raise|await|yield|del|assert) |[A-Za-z_][\w.]*(?:\[[^\]\n]*\])?(?: ?[-+*/|&]?= |\()")
_FRAME_END_RE = re.compile(rb'[ \t]*File "[^"\n]+", line \d+, in [\w<>.]+[ \t]*$')
_EXCEPTION_RE = re.compile(rb"[ \t]*[\w.]*(?:Error|Exception)\b")     # an exception's message line
_DIGITS_AS_0 = bytes.maketrans(b"123456789", b"000000000")
_INDENT_RE = re.compile(rb"[ \t]{0,8}")
# an NCCL line head with its launcher tags (``host:pid:tid [dev]`` or the pidless ``host [dev]``, a
# source, the level); ``head``: where it starts after the tags
_CUT_HEAD_RE = re.compile(rb"[ \t]*" + TAGS + rb"(?P<head>(?:" + NCCL_HEAD + rb"|(?:[A-Za-z](?=[\w.-]*\d)[\w.-]*\w )?"
                          rb"\[-?\d+\] )(?:\w[\w./-]*:\d+ (?:\(\w+\) )?)?NCCL (?:" + nccl_markers() + rb")\b)")
_LEVEL_LINE_RE = re.compile(rb"\n[ \t]*NCCL (?:" + nccl_markers() + rb")\b")    # a line that begins with the level


def _begins_like_log(data: bytes, at: int) -> bool:
    """Whether the line starting at offset ``at`` begins like a log line: a line head of
    :data:`LOG_START_RE`, a separator, or (after blanks and launcher tags) any line head the
    glued-line split knows (:func:`all_heads`)."""
    return bool(LOG_START_RE.match(data, at) or SEPARATOR_RE.match(data, at) or _head_at().match(data, at))


def _head_at() -> re.Pattern:
    """A line head of :class:`GluedLines` (with its launcher tags) at a line's start."""
    global _HEAD_AT_RE
    if _HEAD_AT_RE is None:
        _HEAD_AT_RE = re.compile(rb"[ \t]*(?P<chain>" + TAGS + rb")(?:" + all_heads() + rb")")
    return _HEAD_AT_RE


def _head_in() -> re.Pattern:
    """Any line head of :class:`GluedLines`, wherever it stands in a line (after tags a parser
    skips as a line's context: ``trainer/0 [0]:E0927 ...``)."""
    global _HEAD_IN_RE
    if _HEAD_IN_RE is None:
        _HEAD_IN_RE = re.compile(all_heads())
    return _HEAD_IN_RE


def _continues(data: bytes, starts: np.ndarray, i: int, heads: bool = True, alike: bool = True) -> bool:
    """Whether line ``i + 1`` reads as the continuation of line ``i``: it does not begin like a
    log line, and the two do not begin alike, digits aside (a list of like lines: paths,
    counters, numbered devices, table rows; not asked when ``alike`` is False). A separator line
    (``-----``) goes on only as a line of its own character alone (the rest of a separator wider
    than the width)."""
    s, t = int(starts[i]), int(starts[i + 1])
    if (m := SEPARATOR_RE.match(data, s)):      # a separator goes on only as more of its character
        c = data[m.start():m.end()].strip()[-1:]
        return bool(re.match(rb"[ \t]*(?:" + re.escape(c) + rb")+[ \t]*(?:\n|$)", data[t:t + 256]))
    if LOG_START_RE.match(data, t) or SEPARATOR_RE.match(data, t) or heads and _begins_like_log(data, t):
        return False
    a = data[s:s + 6].translate(_DIGITS_AS_0)
    return not (alike and len(a) == 6 and data[t:t + 6].translate(_DIGITS_AS_0) == a)


def _readmit(data: bytes, starts: np.ndarray, cand: np.ndarray, ok: np.ndarray, heads: bool) -> None:
    """A candidate that itself continues the line before (``cand[k] - 1`` goes on in it) begins
    mid-text: its start's likeness to the next line's is chance (``last completed `` before ``NCCL
    work: 5179.``, the line before ``NCCL work: 5180, ...``). Such candidates refused, asked again
    without the likeness test, in order (a chain of cuts); ``ok`` updated in place."""
    where = {c: k for k, c in enumerate(cand.tolist())}
    for k, c in enumerate(cand.tolist()):
        if not ok[k] and ok[where.get(c - 1, k)] and c - 1 in where:
            ok[k] = _continues(data, starts, c, heads=heads, alike=False)


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
        # wrapped at a blank (``fold -s``): the line keeps its blank, and is nearly the width
        # long or the next line's first word would not have fit after it
        soft = nonblank & followed & (trail > 0) & (chars < W) & ((chars >= W - 24) | (chars + _first_words(
            data, starts, ends) > W))
    cand = np.flatnonzero(edge | soft)
    if limit is not None:
        cand = cand[:limit]
    stray = _stray_heads(data, starts, limit)
    if not len(cand) and not len(stray):
        return None
    e, s = edge[cand], soft[cand]

    def verdict(ok):
        he, hc, se, sc = int(e.sum()), int((e & ok).sum()), int(s.sum()), int((s & ok).sum())
        # most lines reaching the width go on in the next line: the lines of a log that merely
        # share the longest length (one format, many lines) are followed by log lines as often
        hard_ok = hc >= 2 and hc >= 0.75 * he
        soft_ok = (hc >= 1 or sc >= 4) and hc + sc >= 3 and hc + sc >= 0.75 * (he + se) \
            or not padded and sc >= 4 and sc >= 0.9 * se     # fold -s: the longest lines may be whole ones
        # too few for a count, no line reaching W that goes on as a log line: each cut proven alone
        alone = he == hc and bool(ok.any())
        return hard_ok, soft_ok, alone

    # the cheap test first (the line heads of LOG_START_RE): the full one only tells fewer
    # lines apart as continuations, so when the cheap one finds no wrap there is none
    cut = np.fromiter((_head_cut(data, starts, i) for i in cand.tolist()), bool, len(cand))
    quick = cut | np.fromiter((_continues(data, starts, i, heads=False) for i in cand.tolist()), bool, len(cand))
    _readmit(data, starts, cand, quick, heads=False)
    if not any(verdict(quick)) and not len(stray):
        return None
    ok = quick.copy()
    ok[quick & ~cut] = [_continues(data, starts, i) for i in cand[quick & ~cut].tolist()]
    _readmit(data, starts, cand, ok, heads=True)
    hard_ok, soft_ok, alone = verdict(ok)
    text_blank: set[int] = set()
    if soft_ok:
        joins = cand[(e | s) & ok]
    elif hard_ok or alone:
        # the lines reaching W when they make a wrap, and any other cut that shows on its own
        # (the rest of a line joined already holds the head of that line)
        joins = []
        for i, c, x in zip(cand[ok].tolist(), cut[ok].tolist(), (e & ok)[ok].tolist()):
            if x and hard_ok or c:
                joins.append(i)
            elif _proven(data, starts, ends, chars, trail, i, W, padded, bool(joins) and joins[-1] == i - 1):
                joins.append(i)
                if _INDENT_RE.match(data, int(starts[i + 1])).end() == starts[i + 1] + 1:
                    text_blank.add(i)     # a hard cut just before a blank: the blank is the text's
        joins = np.asarray(joins, np.int64)
    else:
        joins = np.zeros(0, np.int64)
    joins = np.union1d(joins, stray).astype(np.int64)
    if not len(joins):
        return None
    space = joins[trail[joins] == 1] if padded else np.zeros(0, np.int64)
    # indented continuations: the indent 7 in 10 of them have at least (a cut at a blank adds it)
    ji = np.asarray([j for j in joins.tolist() if j not in text_blank], np.int64) + 1
    ind = np.array([len(data[s:e]) - len(data[s:e].lstrip(b" \t")) for s, e in
                    zip(starts[ji[:200]].tolist(), ends[ji[:200]].tolist())])
    indent = int(np.percentile(ind, 30, method="lower")) if len(ind) else 0
    return _Wrap(W, joins, space, indent, padded)


def _first_words(data: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each line, the length in bytes of the next line's first word (0 when that line begins
    with a blank, and for the last line)."""
    arr = np.frombuffer(data, np.uint8)
    bl = np.flatnonzero((arr == 32) | (arr == 9) | (arr == 10))
    nxt = np.append(starts[1:], len(data))
    at = np.searchsorted(bl, nxt)
    stop = np.where(at < len(bl), bl[np.minimum(at, len(bl) - 1)], len(data))
    nend = np.append(ends[1:], len(data))
    out = np.minimum(stop, nend) - nxt
    out[-1] = 0
    return out


def _proven(data: bytes, starts, ends, chars, trail, i: int, W: int, padded: bool, headed: bool) -> bool:
    """Whether the cut after line ``i`` shows on its own (a wrap too short to count): the line it
    ends (``headed``: the rest of a line whose cut showed, so holding its head) holds a line head a
    parser reads (:func:`all_heads`, an NCCL head with or without its pid) or begins with an
    exception's name (maybe after launcher tags of ``lines.PREFIXES``) and is no whole frame header;
    the next line, after an indent of up to eight blanks (one: the cut fell before a blank), is no
    ``name: ``; and the cut fell mid-word or before a blank (line ``i`` reaches W, a letter or digit
    on each side, or in a padded paste any character before it, the next no capital and no source line: an assignment, a call, a ``return``) or
    at a blank the way ``fold -s`` cuts (line ``i`` ends in one blank, and the next line's first
    word would not have fit after it: ``Timeout(ms)=...`` too)."""
    s, e, t = int(starts[i]), int(ends[i]), int(starts[i + 1])
    h = s + len(strip_tags(data[s:e].decode("utf-8", "surrogateescape"))[0].encode("utf-8", "surrogateescape"))
    if _FRAME_END_RE.match(data, s, e) or not (headed or _EXCEPTION_RE.match(data, s) or _EXCEPTION_RE.match(data, h)
                                                or _CUT_HEAD_RE.search(data, s, e) or _head_in().search(data, s, e)):
        return False
    u = _INDENT_RE.match(data, t).end()
    if _NAME_COLON_RE.match(data, u):
        return False
    last, nxt = data[e - 1:e], data[u:u + 1]
    if trail[i] == 0:
        # padded, a line that fills the width unpadded was cut inside a token whatever its last
        # character (``10.10.23.`` | ``6<58683>``); unpadded, only between letters or digits
        # (or after a token's inner punctuation, a letter or digit before it: ``0e+`` | ``00``)
        inside = last.isalnum() or padded and last not in (b"", b" ", b"\t") \
            or last in (b"+", b"-", b".", b"/", b":", b"_") and data[e - 2:e - 1].isalnum()
        # the next piece begins with a letter or digit, or a number's sign (``0e`` | ``+00``)
        goes_on = nxt.isalnum() or nxt in (b"+", b"-") and last.isalnum() and data[u + 1:u + 2].isdigit()
        return chars[i] == W and inside and goes_on and not nxt.isupper() and not _SOURCE_RE.match(data, u)
    word = (data[u:int(ends[i + 1])].split(None, 1) or [b""])[0]
    return not padded and trail[i] == 1 and u == t and int(chars[i]) + len(word) > W


def _head_cut(data: bytes, starts, i: int) -> bool:
    """Whether the cut after line ``i`` fell inside an NCCL line head (:data:`_CUT_HEAD_RE`): line ``i``
    holds none, but with the next line joined to it (mid-word or at a blank) one starts in line
    ``i`` and ends in the next; or line ``i`` ends with a head's level (``... NCCL WARN``, no message).
    The next line then begins like a log line (``flow:123:456 [0]``, ``[5] socket.cc:46 NCCL WARN``,
    ``NCCL WARN``, ``Error: failed to extend``) and is still the rest of the one cut."""
    s, t = int(starts[i]), int(starts[i + 1])
    line = data[s:t - 1].rstrip(b" \t")
    rest = data[t:t + 400].split(b"\n", 1)[0].lstrip(b" \t")
    if not line or not rest:
        return False
    if b"NCCL " in line and (m := _CUT_HEAD_RE.match(line)):
        return m.end() == len(line)     # a head and nothing after its level: its message is the next line
    for j in (line + rest, line + b" " + rest):
        m = b"NCCL " in j and _CUT_HEAD_RE.match(j)     # the literal first: most lines hold no head
        if m and m.start("head") < len(line) < m.end():
            return True
    return False


def _stray_heads(data: bytes, starts: np.ndarray, limit: int | None) -> np.ndarray:
    """Lines that are an NCCL line head cut before its level (``host:pid:tid [dev] source:line``,
    nothing after) followed by a line that begins with the level (``NCCL WARN``): NCCL prints no
    such line, whatever its length (a wrap one short of the width, its line's opening backtick
    gone). Their indexes."""
    hits = [m.start() for m in _LEVEL_LINE_RE.finditer(data)][:limit]
    i = np.searchsorted(starts, np.asarray(hits, np.int64), side="right") - 1
    return np.asarray([k for k in i.tolist() if k >= 0 and _head_cut(data, starts, k)], np.int64)


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
    (:data:`LOG_START_RE`: launcher tags, NCCL's ``host:pid:tid [dev]``, ``[rankN]:``, c10's
    ``[E1112 ...]``, timestamps, Python tracebacks, nccl-tests rows, torchrun's summary; or
    any line head of :class:`GluedLines`) and does not begin like the line itself (a list of
    like lines). A log whose lines merely share the longest length (one format: the lines
    after them are log lines as often as not) is not wrapped. ``fold -s`` wraps (lines ending
    in a blank just short of W, or before a word that would not have fit) count with those
    reaching W; four of them make a wrap without any line reaching W (a log's lines seldom end
    in a blank). A wrap too short to count (one line, two) is taken cut by cut when no line
    reaching W goes on as a log line, each cut proven on its own (:func:`_proven`): in a line
    that holds a line head a parser reads or an exception's message, mid-word (the rest no
    capital, maybe indented) or at a blank before a word that would not have fit, the next
    line no ``name: `` nor a source line (an assignment, a call, a ``return``), the line no
    whole traceback frame header. A cut inside an NCCL line head (:func:`_head_cut`: the next
    line, ``flow:123:456 [0] ...`` or ``NCCL WARN ...``, begins like a log line but is the
    rest of the head) is a continuation too, and a head cut before its level is joined
    whatever its line's length (:func:`_stray_heads`). A word wrap whose blank went (no fixed
    width) is told by its cuts instead (:func:`_word_wrap`). Such a line is joined with the
    next: mid-word with nothing between, at a blank keeping it; the continuations' indent is
    removed. Padding is removed from every line. The sniff looks at no more than 400
    candidate lines per sampled window."""

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
