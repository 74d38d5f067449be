"""Renderers of an :class:`~forensics.analysis.Analysis`, one module per format.

``html`` (the self-contained incident report), ``markdown`` (a ticket summary),
``perfetto`` (Chrome trace event JSON); the findings JSON is ``Analysis.to_json()``.
Each module has ``write(analysis, fh)``; what they share is computed in :mod:`.sections`, one
module a section of the report, and gathered under one name in :mod:`.data`.
"""
from __future__ import annotations

import json

from . import data, html, markdown, perfetto
from ..execution.shared_steps import ModelStep


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


def model_steps() -> list:
    """The steps of what the renderers compute from the model alone, before there are
    findings (the per-rank table and its totals, the collectives' intervals and lanes, each
    communicator's progress, the heatmap), for an
    :class:`~forensics.execution.Execution`'s ``model_steps``: when the work after the reading
    is shared with a forked process, it makes them while the detectors run, this process the
    last ones once the detectors are done, and the values reach the renderers through
    ``Analysis.memos`` (:func:`.data.memo`). The long ones first (the rank table, then its
    totals), so that the steps left at the end are short."""
    return [ModelStep("rank_table", data.rank_table), ModelStep("rank_totals", _rank_totals, ("rank_table",)),
            ModelStep("intervals", data.intervals), ModelStep("progress", data.progress_of),
            ModelStep("heatmap", _heatmap, ("rank_table",))]


def prepare(kinds) -> None:
    """Get the writers of ``kinds`` ready (templates compiled): done while worker processes
    read the bundles, so that this process's own serial part after them is shorter."""
    for kind in kinds:
        if kind in PREPARE:
            PREPARE[kind]()
