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
# what a writer can get ready before the analysis exists (see prepare)
PREPARE = {"html": html.prepare}


def _rank_totals(a) -> None:
    ranks = data.rank_table(a)
    if len(ranks) > html.TOP_ROWS:
        data.rank_totals(a, ranks)


def _heatmap(a) -> None:
    html.heatmap(a, data.rank_table(a))


def ahead() -> list:
    """The steps of what the renderers compute from the model alone, before there are
    findings (the per-rank table and its totals, the collectives' intervals and lanes, each
    communicator's progress, the heatmap: ~1.5 s at 512 ranks); ``analyze(ahead=ahead())``
    makes them in a second process while the detectors run, the last ones in this process
    once the detectors are done, and hands the values to the renderers through
    ``Analysis.prepared`` (:func:`.data.memo`). The long ones first (at 512 ranks: the rank
    table 0.8 s, its totals 0.35 s; intervals, progress and heatmap 0.07-0.17 s each), so that
    the steps left at the end are short."""
    from ..analysis import Ahead
    return [Ahead("rank_table", data.rank_table), Ahead("rank_totals", _rank_totals, ("rank_table",)),
            Ahead("intervals", data.intervals), Ahead("progress", data.progress_of),
            Ahead("heatmap", _heatmap, ("rank_table",))]


def prepare(kinds) -> None:
    """Get the writers of ``kinds`` ready (templates compiled): done while worker processes
    read the bundles, so that this process's own serial part after them is shorter."""
    for kind in kinds:
        if kind in PREPARE:
            PREPARE[kind]()
