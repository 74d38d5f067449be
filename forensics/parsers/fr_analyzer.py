"""The PyTorch Flight Recorder analyzer's own report (``python -m
torch.distributed.flight_recorder.fr_trace``, ``torchfrtrace``, older
``tools/flight_recorder/fr_trace.py``), as users paste it.

The analyzer reads every rank's dump, matches their entries collective by collective and
prints, for each collective where the ranks disagree, a block (``components/builder.py`` and
``types.py: EntryState.log``). The header changed with the releases:

- 2.4 (``print``): ``Not all ranks joining collective for group {pg}:{desc} collective {name}
  Missing ranks are {1} [sizes, state ...]`` on one line;
- 2.5/2.6 (``logger.info``): ``Not all ranks joining collective N at entry M``, ``Collective
  N at entry M errors`` (with ``error message: Culprit rank R; MatchState.X``),
  ``Input/output mismatch in the collective N at entry M``;
- 2.7 and later: ``Not all ranks joining collective, sequence number: N``, ``Collective
  sequence number: N has errors``, ``Input/output mismatch in the collective sequence number:
  N``.

A block's fields follow its header, one a line: ``internal record id``, ``group info``
(``pg:desc``), ``collective`` (``nccl:all_reduce``), ``missing ranks: {1}``, ``input sizes``,
``output sizes``, ``world size``, ``expected ranks`` (a count in 2.5/2.6, the set later),
``collective state``, ``error msg: Culprit rank R; Error type: X, ...`` (several culprits joined by
``, ``), ``collective stack trace`` (frames below). Other reports: ``We cannot decide what's wrong
with this collective entry because we missed FR dumps from ranks ({2})``, ``Missing dump files
from ranks {2}`` (and ``Missing dump files for N ranks: [2]``), ``Too many mismatches for
process_group P: D, aborting``. TorchComms' debug server writes the matched collectives as a table
(``id group_id pass_check collective_seq_id ... missing_ranks``): a row with a rank set in it is
a collective those ranks never joined.

The ranks a report names are the analyzer's verdict: the *missing* ranks did not join the
collective the others wait in; a *culprit* rank's entry disagrees (type, size, state) with the
others'. The ranks that waited are never named.

Table ``fr_report`` (one row per block, table row or loose ``missing ranks:`` / ``Culprit
rank`` line): line (int), kind (not_joined|errors|io_mismatch|undecided|missing_dumps|
too_many_mismatches), pg (str: the process group, ``pg:desc`` as printed), seq (int: collective sequence
number), record_id (int), op (str: ``nccl:all_reduce``), state (str: scheduled|started|
completed), world_size (int), expected_ranks (str: ``0,1`` or the count), missing_ranks (str:
``1,3``), culprit_ranks (str), error_type (str: COLLECTIVE_STATE_MISMATCH, SIZE_OR_SYNTAX_MISMATCH,
... comma-joined), message (str: the error message or the line).
"""
from __future__ import annotations

import re

from . import lines as lines_mod
from ..coerce import first_int
from .registry import WarningLog, register
from .text import LogText, TextParser

SET = r"(?P<ranks>\{[\d,\s]*\}|set\(\)|\[[\d,\s]*\])"
HEADERS = (
    ("not_joined", re.compile(r"Not all ranks joining collective for group (?P<group>\S+) collective "
                              r"(?P<op>\S+)(?:\s+Missing ranks are " + SET + r")?")),
    ("not_joined", re.compile(r"Not all ranks joining collective (?P<seq>\d+) at entry (?P<rec>\d+)")),
    ("not_joined", re.compile(r"Not all ranks joining collective, sequence number: (?P<seq>\d+)")),
    ("errors", re.compile(r"Collective (?P<seq>\d+) at entry (?P<rec>\d+) errors")),
    ("errors", re.compile(r"Collective sequence number: (?P<seq>\d+) has errors")),
    ("io_mismatch", re.compile(r"Input/output mismatch in the collective (?P<seq>\d+) at entry (?P<rec>\d+)")),
    ("io_mismatch", re.compile(r"Input/output mismatch in the collective sequence number: (?P<seq>\d+)")),
    ("undecided", re.compile(r"missed FR dumps from ranks \(?" + SET)),
    ("missing_dumps", re.compile(r"(?i)Missing (?:dump|trace) files (?:from|for) (?:\d+ )?ranks:? " + SET)),
    ("too_many_mismatches", re.compile(r"Too many mismatches for process_group (?P<group>[^,]+?),? aborting")),
)
FIELD_RE = re.compile(r"(?<![\w/])(?P<key>internal record id|group info|collective stack trace|collective state|"
                      r"collective|missing ranks|input sizes|output sizes|world size|expected ranks|error msg|"
                      r"error message)\s*:\s*(?P<value>.*?)\s*$")
CULPRIT_RE = re.compile(r"Culprit rank (?P<rank>\d+);\s*(?:Error type:\s*)?(?:MatchState\.)?(?P<type>[A-Z][A-Z_]+)?")
TABLE_HEAD_RE = re.compile(r"\bcollective_seq_id\b.*\bmissing_ranks\b|\bmissing_ranks\b.*\bcollective_seq_id\b")
TABLE_SET_RE = re.compile(r"\{(?P<ranks>\d+(?:\s*,\s*\d+)*)\}")
BLOCK_LINES = 40            # a block's fields and stack frames, at most
NEEDLES = (b"Not all ranks joining collective", b"Collective sequence number:", b" at entry ",
           b"Input/output mismatch in the collective", b"missed FR dumps from ranks", b"dump files f",
           b"trace files f", b"Too many mismatches for process_group", b"missing ranks:", b"Culprit rank",
           b"missing_ranks")
MARKERS = (b"Not all ranks joining collective", b"Collective sequence number:", b"Input/output mismatch in the "
           b"collective", b"missed FR dumps from ranks", b"Missing dump files f", b"Too many mismatches for "
           b"process_group", b"missing ranks: {", b"Culprit rank")


def ranks_of(text: str | None) -> list[int]:
    """The ranks of a printed set or list (``{1, 3}``, ``[1, 3]``, ``set()``), sorted."""
    return sorted({int(x) for x in re.findall(r"\d+", text or "")})


def _join(ranks) -> str | None:
    return ",".join(map(str, ranks)) if ranks else None


def header(line: str) -> tuple[str, re.Match] | None:
    """(kind, match) of the analyzer's block header on ``line``, or None."""
    for kind, rx in HEADERS:
        if (m := rx.search(line)):
            return kind, m
    return None


class FrAnalyzerParser(TextParser):
    NEEDLES = NEEDLES
    NAME = "fr_analyzer"
    DESCRIPTION = "PyTorch Flight Recorder analyzer report (fr_trace / torchfrtrace): missing and culprit ranks"
    GLOBS = ("logs/*", "logs/**/*")
    MARKERS = MARKERS
    SCHEMAS = {"fr_report": {
        "line": "int", "kind": "str", "pg": "str", "seq": "int", "record_id": "int", "op": "str",
        "state": "str", "world_size": "int", "expected_ranks": "str", "missing_ranks": "str",
        "culprit_ranks": "str", "error_type": "str", "message": "str"}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        return header(t) is not None or "Culprit rank" in t or bool(TABLE_HEAD_RE.search(t))

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        log = WarningLog(label)
        if cls.unreadable(text, log, "a text log"):
            return cls.result(label, {}, {}, log)
        rows: list[dict] = []
        done = 0                       # the last line a block read
        for ln, line, _, end in text.iter_spans(text.lines_with(NEEDLES)):
            if ln <= done:
                continue
            line = lines_mod.ANSI_RE.sub("", line)
            if (h := header(line)) is not None:
                row, used = _block(h[0], h[1], ln, text.following(end, BLOCK_LINES))
                rows.append(row)
                done = ln + used
            elif TABLE_HEAD_RE.search(line):
                got, used = _table(line, ln, text.following(end, 200))
                rows += got
                done = ln + used
            elif (f := FIELD_RE.search(line)) and f["key"] == "missing ranks" and ranks_of(f["value"]):
                rows.append(_row("not_joined", ln, line, missing=ranks_of(f["value"])))
            elif CULPRIT_RE.search(line):
                rows.append(_row("errors", ln, line, **_culprits(line)))
        if not rows:
            log.add(None, "no Flight Recorder analyzer report found")
        return cls.result(label, {"fr_report": rows}, {"reports": len(rows)}, log)


def _row(kind: str, ln: int, message: str | None, missing=(), culprits=(), error_type=None, **kw) -> dict:
    return {"line": ln, "kind": kind, "missing_ranks": _join(missing), "culprit_ranks": _join(culprits),
            "error_type": error_type, "message": (message or "").strip()[:500] or None, **kw}


def _culprits(text: str) -> dict:
    found = CULPRIT_RE.findall(text)
    types = list(dict.fromkeys(t for _, t in found if t))
    return {"culprits": sorted({int(r) for r, _ in found}), "error_type": ",".join(types) or None}


def _block(kind: str, m: re.Match, ln: int, below: list[str]) -> tuple[dict, int]:
    """One report block: its header's match and the field lines below it (up to the next
    header, a second value of a field, or two blank lines); (row, lines read)."""
    g = m.groupdict()
    fields: dict[str, str] = {}
    used = blanks = 0
    in_frames = False
    for i, nxt in enumerate(below, 1):
        nxt = lines_mod.ANSI_RE.sub("", nxt)
        if header(nxt) is not None or TABLE_HEAD_RE.search(nxt):
            break
        if not nxt.strip().strip("`>"):
            blanks += 1
            if blanks >= 2 or in_frames:
                break
            continue
        blanks = 0
        f = FIELD_RE.search(nxt)
        if f is None:
            if not in_frames:
                break                  # not the analyzer's: the block ended
            used = i
            continue
        if f["key"] in fields:
            break                      # a block whose header was lost
        fields[f["key"]] = f["value"]
        in_frames = f["key"] == "collective stack trace"
        used = i
    message = fields.get("error msg") or fields.get("error message") or m.string
    cul = _culprits(message) if kind == "errors" else {}
    missing = ranks_of(g.get("ranks") or fields.get("missing ranks"))
    exp = fields.get("expected ranks")
    row = _row(kind, ln, message, missing=missing, **cul,
               pg=g.get("group") or fields.get("group info") or None,
               seq=first_int(g.get("seq")), record_id=first_int(g.get("rec") or fields.get("internal record id")),
               op=g.get("op") or fields.get("collective") or None, state=fields.get("collective state") or None,
               world_size=first_int(fields.get("world size")),
               expected_ranks=(_join(ranks_of(exp)) if exp and ("{" in exp or "[" in exp) else exp or None))
    if kind == "too_many_mismatches":
        row["pg"] = g.get("group")
    return row, used


def _table(head: str, ln: int, below: list[str]) -> tuple[list[dict], int]:
    """TorchComms' table of collectives: the rows that name missing ranks; (rows, lines read)."""
    names = head.split()
    rows, used = [], 0
    for i, nxt in enumerate(below, 1):
        if not nxt.strip() or nxt.strip().startswith(("---", "===")):
            break
        used = i
        s = TABLE_SET_RE.search(nxt)
        if s is None:
            continue
        cells = dict(zip(names, nxt[:s.start()].split()))
        rows.append(_row("not_joined", ln + i, nxt, missing=ranks_of(s["ranks"]),
                         pg=cells.get("group_id"), seq=first_int(cells.get("collective_seq_id")),
                         record_id=first_int(cells.get("record_id")), op=cells.get("collective_name"),
                         state=cells.get("collective_state")))
    return rows, used


register(FrAnalyzerParser)
