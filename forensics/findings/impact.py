"""What slow collectives cost the job: the share of its collective time a finding explains.

Scores (``Finding.score``, the order within a severity): the detectors of slow collectives
use the estimated seconds of collective time the problem cost (slow collectives' excess over
the clean baseline of their op/size class, :func:`impact`; a straggler's total lateness); a
hang scores 1e6 plus the seconds it lasted, and a reset that broke collectives 2e6 (it is the
cause of the hang that follows it, so it goes first).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..wording import pct

MIN_CLASS_BASELINE = 3    # clean collectives of an op/size class for a median of its own


@dataclass
class Impact:
    """What a finding's slow collectives cost the job (:func:`impact`)."""
    share: float          # excess / total: the share of the job's collective time they explain
    excess_ns: float      # sum over the slow collectives of (duration - their class's clean median)
    total_ns: float       # sum of every completed collective's duration in the analysed window
    slow: int             # slow collectives counted

    def text(self) -> str:
        return f"{pct(self.share)} of the job's collective time"


def size_classes(w: pd.DataFrame) -> pd.Series:
    """A collective's op/size class: its op and the power of two below its bytes."""
    b = pd.to_numeric(w["bytes"], errors="coerce") if "bytes" in w.columns else pd.Series(np.nan, index=w.index)
    bucket = np.floor(np.log2(b.where(b > 0).astype("float64"))).fillna(-1).astype("int64").astype(str)
    return w["op"].astype(str).fillna("?") + "/" + bucket


def clean_baselines(w: pd.DataFrame, clean) -> np.ndarray:
    """Per collective of ``w`` (completed ones): the median duration of the clean collectives
    of its op/size class (MIN_CLASS_BASELINE of them), else of every clean collective, else,
    with no clean collective at all, the fastest decile of its class (the fastest stand in
    for clean ones). NaN where nothing completed."""
    dur = pd.to_numeric(w["duration_ns"], errors="coerce").astype("float64")
    cls = size_classes(w)
    clean = np.asarray(clean, dtype=bool) & dur.notna().to_numpy()
    per = dur[clean].groupby(cls[clean]).agg(["median", "size"])
    per = per[per["size"] >= MIN_CLASS_BASELINE]["median"]
    base = cls.map(per).astype("float64")
    if clean.any():
        base = base.fillna(float(np.median(dur[clean])))
    else:
        base = base.fillna(dur.groupby(cls).transform(lambda s: s.quantile(0.1)))
    return base.to_numpy(dtype=np.float64)


def impact(w: pd.DataFrame, slow, clean, cap_ns=None, base_ns=None) -> Impact:
    """The share of the job's collective time the ``slow`` collectives of ``w`` explain: the
    sum over them of (duration - the clean median of their op/size class, :func:`clean_baselines`
    from the ``clean`` ones), over the sum of every completed collective's duration.
    ``cap_ns`` (per row of ``w``, NaN: none): the most of a collective's excess the finding's
    cause can explain (a late rank: how long the others waited for it). ``base_ns`` (per row
    of ``w``): the baseline to use instead of :func:`clean_baselines`, where the caller knows
    a better one (no clean collective at all, but what the slow ones would have taken)."""
    dur = pd.to_numeric(w["duration_ns"], errors="coerce").astype("float64").to_numpy()
    ok = ~np.isnan(dur)
    slow = np.asarray(slow, dtype=bool) & ok
    total = float(dur[ok].sum())
    if not slow.any() or total <= 0:
        return Impact(0.0, 0.0, max(total, 0.0), int(slow.sum()))
    base = clean_baselines(w, clean) if base_ns is None else np.asarray(base_ns, dtype=np.float64)
    over = np.clip(dur[slow] - np.nan_to_num(base[slow], nan=0.0), 0, None)
    if cap_ns is not None:
        cap = np.asarray(cap_ns, dtype=np.float64)[slow]
        over = np.where(np.isnan(cap), over, np.minimum(over, np.clip(cap, 0, None)))
    excess = float(over.sum())
    return Impact(min(1.0, excess / total), excess, total, int(slow.sum()))


__all__ = ["Impact", "MIN_CLASS_BASELINE", "clean_baselines", "impact", "size_classes"]
