"""Renderers of an :class:`~forensics.analysis.Analysis`, one module per format.

``html`` (the self-contained incident report), ``markdown`` (a ticket summary),
``perfetto`` (Chrome trace event JSON); the findings JSON is ``Analysis.to_json()``.
Each module has ``write(analysis, fh)``; :mod:`.data` computes what they share.
"""
from __future__ import annotations

import json

from . import data, html, markdown, perfetto


def findings_json(analysis) -> dict:
    """``Analysis.to_json()`` made strict JSON: NaN and infinities (not JSON) become null."""
    return data.finite(analysis.to_json())


def write_json(analysis, fh) -> None:
    json.dump(findings_json(analysis), fh, indent=1, allow_nan=False, default=str)
    fh.write("\n")


WRITERS = {"html": html.write, "json": write_json, "markdown": markdown.write, "perfetto": perfetto.write}
