"""Repairs of what a page, an editor or Markdown put around and into a log's lines: HTML
entities, autolinks, Markdown escapes, block quotes, code fences and backticks, line numbers."""
from __future__ import annotations

import re

import numpy as np

from .repair import LINE_NUMBER_BYTES, Repair, sample, whole_lines

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
    BUFFERS = True          # apply: a sample and one substitution, both read any buffer

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
        return cls._style(whole_lines(seg[:LINE_NUMBER_BYTES], head=True)) is not None

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        rx = cls._style(sample(data)[0])
        return rx.sub(b"", data) if rx is not None else data
