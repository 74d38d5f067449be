"""The per-packet CSV of ``stallscope tcp --csv``: one row per TCP packet."""
from __future__ import annotations

from typing import BinaryIO, Iterable

import numpy as np

from ..native import csv_rows
from .engine import PACKET_COLUMNS, PacketBatch
from .conversations import ConversationTable
from .verdicts import VERDICT_BITS


def write_packets_csv(fh: BinaryIO, batches: Iterable[PacketBatch],
                      conversations: ConversationTable) -> int:
    """Stream every batch as CSV rows (header first); returns the rows written."""
    fh.write((",".join(PACKET_COLUMNS) + "\n").encode())
    rows = 0
    for batch in batches:
        cols = batch.columns(conversations)
        cols["rst"] = ((cols["tcp_flags"] >> 2) & 1).astype(np.uint8)
        spec = []
        for name in PACKET_COLUMNS:
            if name in VERDICT_BITS:
                spec.append((cols["verdicts"], "bit", VERDICT_BITS[name]))
            elif name in ("src", "dst"):
                spec.append((cols[name], "category", 0))
            else:
                spec.append((cols[name], "int", 0))
        for chunk in csv_rows(spec, conversations.addresses):
            fh.write(chunk)
        rows += len(batch)
    return rows
