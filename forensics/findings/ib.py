"""``ib_errors``: InfiniBand / RoCE port counters that moved during the capture.

NCCL over IB/RoCE bypasses the kernel TCP stack, so the port counters are the network
evidence there. The ``ib_counters`` table already carries each counter's delta (start ->
end snapshot), its kind (error / congestion / retransmission / traffic) and what it
means and suggests; this detector turns the ones that moved into one finding per port,
ranked by how bad the worst counter is. Link-down and physical-error counters are errors
(the link flapped or corrupts packets); congestion and fabric-loss counters are warnings.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .base import Context, Finding, detector
from .evidence import sql_int, sql_str

# counters whose any increase is an error (the link failed or corrupts data)
ERROR_COUNTERS = {"link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors", "local_ack_timeout_err"}
MAX_EVIDENCE = 20


@detector("ib_errors")
def ib_errors(ctx: Context) -> list[Finding]:
    ib = ctx.table("ib_counters")
    if ib.empty:
        return []
    bad = ib[ib["problem"].fillna(False).astype(bool) & (ib["delta"].fillna(0).astype("float64") > 0)]
    if bad.empty:
        return []
    n = ctx.table("nccl_events")
    host_ranks = n.dropna(subset=["rank"]).groupby("host")["rank"].agg(lambda s: sorted({int(x) for x in s})) \
        if len(n) else pd.Series(dtype=object)
    out = []
    for (host, dev, port), g in bad.groupby(["host", "device", "port"], dropna=False, sort=True):
        g = g.assign(is_err=g["counter"].isin(ERROR_COUNTERS)).sort_values(["is_err", "delta"],
                                                                            ascending=[False, False])
        severity = "error" if g["is_err"].any() else "warning"
        top = g.iloc[0]
        moved = ", ".join(f"{r.counter} +{int(r.delta)}" for r in g.head(6).itertuples(index=False))
        port_txt = f"{dev} port {int(port)}" if pd.notna(port) else f"{dev}"
        summary = (f"{host} {port_txt}: {moved} during the capture; worst: {top['counter']} "
                   f"({top['meaning']}).")
        actions = [f"{r.counter}: {r.action}" for r in g.drop_duplicates("counter").itertuples(index=False)
                   if isinstance(r.action, str) and r.action]
        ranks = list(host_ranks.get(host, [])) if len(host_ranks) else []
        evidence = [{"host": host, "device": dev, "port": None if pd.isna(port) else int(port),
                     "counter": r.counter, "start": None if pd.isna(r.start) else int(r.start),
                     "end": None if pd.isna(r.end) else int(r.end), "delta": int(r.delta), "kind": r.kind,
                     "meaning": r.meaning, "action": r.action}
                    for r in g.head(MAX_EVIDENCE).itertuples(index=False)]
        port_sql = f"port = {sql_int(port)}" if pd.notna(port) else "port IS NULL"
        sql = (f"SELECT host, device, port, counter, start, \"end\", delta, kind, meaning, action FROM ib_counters "
               f"WHERE host = {sql_str(host)} AND device = {sql_str(dev)} AND {port_sql} AND problem AND delta > 0 "
               f"ORDER BY delta DESC")
        total = float(g["delta"].astype("float64").sum())
        out.append(Finding(
            kind="ib_errors", severity=severity, confidence=0.9 if severity == "error" else 0.7, summary=summary,
            ranks=ranks, hosts=[host] if host else [], evidence=evidence, sql=sql,
            action="; ".join(actions[:4]) or "Check the port's cable, transceiver and switch port.",
            score=float(np.log10(1 + total)) + (5.0 if severity == "error" else 0.0),
            details={"device": dev, "port": None if pd.isna(port) else int(port),
                     "counters": {r.counter: int(r.delta) for r in g.itertuples(index=False)}}))
    return out
