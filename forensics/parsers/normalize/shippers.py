"""Repairs of what log shippers and stores wrap a log in: container runtimes' JSON and CRI
lines (:class:`ContainerLog`), a log store's exported table (:class:`ExportColumns`)."""
from __future__ import annotations

import csv
import io
import json
import re

from .repair import Repair

DOCKER_RE = re.compile(rb'(?m)^[ \t]*\{"log":"((?:[^"\\\n]|\\.)*)","stream":"(?:stdout|stderr)"'
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
        return b'{"log":"' in seg and bool(DOCKER_RE.search(seg)) or len(_CRI_RE.findall(seg[:8192])) >= 2

    @classmethod
    def apply(cls, data: bytes) -> bytes:
        if DOCKER_RE.search(data):
            def one(m: re.Match) -> bytes:
                try:
                    return json.loads(b'"' + m[1] + b'"').encode("utf-8", "surrogatepass")
                except (ValueError, UnicodeError):
                    return m[0]
            data = DOCKER_RE.sub(one, data)
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
