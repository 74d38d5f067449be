"""The tracer's event records of one bundle as frames: one kind at a time
(:func:`events_frame`), their monotonic stamps on the capture's UTC clock (:func:`utc_of`)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..inputs.bundle import EventLog


def events_frame(events: list[dict], kind: str) -> pd.DataFrame:
    rows = EventLog.of(events).kind(kind)
    return pd.DataFrame.from_records(rows) if rows else pd.DataFrame()


def utc_of(clock, mono: pd.Series) -> pd.Series:
    """Monotonic ns (nullable) -> UTC ns (nullable Int64)."""
    m = pd.to_numeric(mono, errors="coerce").astype("Int64")
    out = pd.Series(pd.NA, index=m.index, dtype="Int64")
    if clock is None:
        return out
    ok = m.notna().to_numpy()
    if ok.any():
        out[ok] = clock.to_utc(m[ok].to_numpy(dtype=np.int64))
    return out


__all__ = ["events_frame", "utc_of"]
