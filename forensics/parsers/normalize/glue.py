"""Log lines glued together, split again before the line heads the parsers know (:class:`GluedLines`)."""
from __future__ import annotations

import re

import numpy as np

from ..heads import IBSTAT_KEYS
from ..lines import strip_tags
from .lineheads import DTYPES, GLOG, TAGS, VERSION_HEAD, all_heads, nccl_markers, tests_markers
from .repair import Repair


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
            rb"|\w[\w./-]*:\d+ (?:\(\w+\) )?)NCCL (?:" + nccl_markers() + rb")\b"
            rb"|(?<![\w.:/<>-])(?<!INFO )\w[\w./-]*\.(?:cc|cu|cpp|h):\d+ -> -?\d+\b")


def _splits() -> re.Pattern:
    global _SPLITS
    if _SPLITS is None:
        _SPLITS = re.compile(rb"(?P<chain>" + TAGS + rb")(?:(?P<ib>" + _ib_fields() + rb")|(?P<exc>(?:[A-Za-z_]\w*\.)*"
                             rb"[A-Z]\w*(?:Error|Exception|Interrupt): )|(?P<last>Last error:[ \t]+)(?=\S)|"
                             + all_heads() + b"|" + _hostless_heads() + rb")")
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
_TEST_ROW_AT = re.compile(rb"\d+[ \t]+\d+[ \t]+" + DTYPES)


_GLUE_CANDIDATES: tuple[re.Pattern, ...] | None = None


def _glue_candidates() -> tuple[re.Pattern, ...]:
    """Cheap stand-ins for the line heads of :func:`_splits`, most led by a literal (searched at memchr
    speed): every head the split takes holds the end of one of their matches, so a line that the split cuts
    holds two of these hits (the sniff runs the full split only on such lines). ``[rankN]:`` before a c10
    head is one head with it (a tag of the head)."""
    global _GLUE_CANDIDATES
    if _GLUE_CANDIDATES is None:
        _GLUE_CANDIDATES = tuple(re.compile(x) for x in (
            rb"NCCL (?:" + nccl_markers() + rb")\b", rb"NCCL version \d",     # [1]: filtered by VERSION_HEAD
            rb"\[rank\d+\]:(?!\[" + GLOG[:13] + rb")", GLOG[:-len(rb"(?:\.\d+)?")],
            rb"\[[EWIF] ProcessGroupNCCL\.cpp:\d+\]", rb":torch\.distributed", rb"ChildFailedError",
            rb"Traceback \(most recent call last\):", rb"terminate called after throwing", rb"Exception raised from ",
            rb"frame #\d+: ", b"=" * 20, rb"Root Cause \(first observed failure\):", rb"Failures:", rb"\[\d+\]:",
            rb"\s\s(?:time|host|rank|exitcode|error_file|traceback)\s*: ", tests_markers(), rb"(?:Out of bounds values|Avg bus bandwidth)[ \t]*: ",
            rb"[ \t]" + DTYPES + rb"[ \t]+(?:(?:sum|prod|max|min|avg|none|mulsum)[ \t]|-?\d)",
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
                if rx is not _glue_candidates()[1] or VERSION_HEAD.match(seg, m.start())]
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
