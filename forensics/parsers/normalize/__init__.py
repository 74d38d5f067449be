"""Text as it arrives: one normalizer, run on every text log before any text parser reads it.

Users paste logs into tickets, chats and bug reports, and the paste damages them: a terminal
or a renderer hard-wraps long lines, a form joins the whole log onto one line, Markdown adds
``> `` quotes, code fences and backticks, HTML escapes ``<`` and ``&``, an editor adds line
numbers, and log shippers wrap every line in JSON (docker, containerd/CRI) or export it as a
CSV/TSV table (CloudWatch, Loki, Kibana). Each such damage is undone by one *repair*: a small
declared class (a subclass of :class:`Repair` with ``NAME`` and a docstring stating its
contract: what it recognises and what it rewrites), registered in :data:`PIPELINE`, applied in
that order. Adding a repair is adding one class and one entry there. The repairs live by concern:

* :mod:`.repair`: the :class:`Repair` contract and what the sniff samples (:func:`sample`);
* :mod:`.shippers`: container runtimes' JSON and CRI lines, log stores' exported tables;
* :mod:`.markup`: what a page, an editor or Markdown adds (entities, links, escapes, quotes,
  fences, backticks, line numbers);
* :mod:`.unwrap`: hard-wrapped lines joined; :mod:`.glue`: glued lines split;
* :mod:`.lineheads`: how a log line begins, read by both of those.

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
heads, kept in :mod:`forensics.parsers.heads` so both sides read one table (``NCCL_DEBUG_MARKERS``,
``NCCL_TESTS_MARKERS``, ``TORCH_ELASTIC_MARKERS``, ``CODE_MARKERS``, ``IBSTAT_KEYS``; and
ib_status' line patterns), plus the line heads of PyTorch's watchdog, c10 logger, tracebacks and
torchrun (:func:`all_heads`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..registry import looks_binary
from .glue import GluedLines
from .markup import AutoLinks, Backticks, CodeFences, HtmlEntities, LineNumbers, MarkdownEscapes, MarkdownQuote
from .repair import Repair, sample
from .shippers import DOCKER_RE, ContainerLog, ExportColumns
from .unwrap import HardWrap


@dataclass(frozen=True)
class Normalized:
    """The text to parse (``data``: the input itself when nothing was repaired) and the
    names of the repairs applied, in order."""

    data: object
    repairs: tuple[str, ...] = ()


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
    if looks_binary(head) or b"\x00" in head or _JSON_RE.match(head) and not DOCKER_RE.match(head) \
            or head.decode("utf-8", "replace").count("\ufffd") > len(head) // 100:
        return Normalized(data)        # binary, compressed, or a structured JSON document
    segs = sample(data)
    if not any(r.needed(segs) for r in dict.fromkeys(PIPELINE)):
        return Normalized(data)
    # the text is copied (BOM dropped, CRLF made LF) when that changes it or when a repair is
    # to be applied that reads only bytes: a repair that the sample calls for and that then
    # changes nothing (its apply reads a longer sample) costs no copy of a clean text
    out = _lf_text(data) if head.startswith(b"\xef\xbb\xbf") or _holds_crlf(data) else data
    done: list[str] = []
    for r in PIPELINE:
        segs = sample(out)
        if not r.needed(segs):
            continue
        if out is data and not r.BUFFERS:
            out = bytes(data)
        new = r.apply(out)
        if new != out:
            done.append(r.NAME)
            out = new
    if not done:
        return Normalized(data)
    return Normalized(out, tuple(done))


def _holds_crlf(data) -> bool:
    find = getattr(data, "find", None) or bytes(data).find       # bytes, bytearray, mmap
    first = find(b"\r")           # one byte: a memchr (a two-byte needle is searched byte by byte)
    return first >= 0 and find(b"\r\n", first) >= 0


def _lf_text(data) -> bytes:
    """A copy of ``data`` without its UTF-8 BOM, its CRLF line ends made LF."""
    out = bytes(data)
    if out.startswith(b"\xef\xbb\xbf"):
        out = out[3:]
    return out.replace(b"\r\n", b"\n")


__all__ = ["Normalized", "PIPELINE", "REPAIRS", "Repair", "normalize", "sample"]
