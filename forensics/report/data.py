"""What every renderer shows, computed once from an :class:`~forensics.analysis.Analysis`.

The HTML report, the Markdown summary and the Perfetto trace present the same numbers;
they are computed as DataFrames (vectorised over the event tables) and small dataclasses
in :mod:`forensics.report.sections`, one module a section of the report, so each renderer
only lays them out. This module gathers them under one name for the renderers
(``data.rank_table``, ``data.first_screen``): it computes nothing itself. Tables that other
parts of stallscope add over time (``offcpu``, ``nccl_config``, ``nccl_tests``, ``stacks``,
``fr_entries``) are read through :func:`optional_table`: a section whose table is absent or
empty is simply not shown.

Where each piece is computed:

- the first screen (*Where*, *Since*, *Stuck at*): :mod:`.sections.verdict`;
- how far each rank got and where a communicator hung: :mod:`.sections.progress`;
- the timeline's calls in lanes: :mod:`.sections.timeline`;
- the per-rank table, its totals and which ranks to show: :mod:`.sections.ranks`;
- TCP event classes, links, flows, InfiniBand, the store: :mod:`.sections.network`;
- off-CPU threads, stacks, Flight Recorder: :mod:`.sections.processes`;
- bundles, windows, clock skew: :mod:`.sections.captures`;
- the capture's gaps and problems: :mod:`.sections.problems`;
- what they all use (tables, times, global ranks, memos, JSON): :mod:`.sections.common`.
"""
from __future__ import annotations

from .sections.common import (TOP_ROWS, TimeSpan, evidence_columns, finite, highlight_rows, memo,
                              optional_table, time_span, utc, with_global_rank)
from .sections.verdict import Field, HANG_KINDS, first_screen, since_field
from .sections.progress import (Progress, collective_ranks, late_global, lateness_long, never_entered,
                                progress, progress_of)
from .sections.timeline import intervals, lanes
from .sections.ranks import (DURATION_SOURCES, RANK_TABLES, known_ranks, outlier_ranks, rank_ranges,
                             rank_table, rank_totals, trouble_order)
from .sections.network import (DEFAULT_STORE_PORT, DUPACK_EVENTS, FLOW_COLUMNS, FLOW_SUMS, MARKER_CLASSES,
                               RESET_EVENTS, RETRANSMIT_EVENTS, flow_table, ib_table, link_matrix,
                               marker_labels, store_ports, store_traffic)
from .sections.processes import fr_tail, offcpu_by_rank, offcpu_threads, stacks_text
from .sections.captures import calls_text, capture_view, common_window_s, skew_rows, span_text
from .sections.problems import REASON_CHARS, capture_gaps, gap_lines, grouped_problems, reason_key

__all__ = [
    "TOP_ROWS", "TimeSpan", "evidence_columns", "finite", "highlight_rows", "memo", "optional_table",
    "time_span", "utc", "with_global_rank", "Field", "HANG_KINDS", "first_screen", "since_field",
    "Progress", "collective_ranks", "late_global", "lateness_long", "never_entered", "progress",
    "progress_of", "intervals", "lanes", "DURATION_SOURCES", "RANK_TABLES", "known_ranks",
    "outlier_ranks", "rank_ranges", "rank_table", "rank_totals", "trouble_order", "DEFAULT_STORE_PORT",
    "DUPACK_EVENTS", "FLOW_COLUMNS", "FLOW_SUMS", "MARKER_CLASSES", "RESET_EVENTS", "RETRANSMIT_EVENTS",
    "flow_table", "ib_table", "link_matrix", "marker_labels", "store_ports", "store_traffic", "fr_tail",
    "offcpu_by_rank", "offcpu_threads", "stacks_text", "calls_text", "capture_view", "common_window_s",
    "skew_rows", "span_text", "REASON_CHARS", "capture_gaps", "gap_lines", "grouped_problems",
    "reason_key"
]
