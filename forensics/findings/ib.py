"""``ib_errors``: InfiniBand / RoCE failures: NCCL's IB errors, ports down, counters that moved.

Three sources, one kind:

- NCCL's own WARN lines (:mod:`.warns`): completion errors with their ``ibv_wc_status`` decoded
  (transport retries exceeded: the link or the peer went away; local protection: GPUDirect
  RDMA; a flush: a consequence of an earlier error), async events (port error, a fatal HCA
  error), libfabric (EFA) completion errors; how many hosts report them, the peer they point at,
  and the first in time against the cascade after it;
- port state (``ib_ports``: ibstat, ibstatus, ibv_devinfo): a port down, or slower than its
  host's other ports;
- the port counters during a capture (below).

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

from ..model.nccl_errors import IB_STATUS, IB_STATUS_ACTION
from . import warns
from .base import Context, Finding, detector
from .sql import sql_int, sql_str

# counters whose any increase is an error (the link failed or corrupts data)
ERROR_COUNTERS = {"link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors", "local_ack_timeout_err"}
MAX_EVIDENCE = 20


@detector("ib_errors", kinds=("ib_errors",))
def ib_errors(ctx: Context) -> list[Finding]:
    return logged_ib_errors(ctx) + port_state(ctx) + counter_errors(ctx) + kernel_nic_events(ctx)


def kernel_nic_events(ctx: Context) -> list[Finding]:
    """One finding per host whose kernel log says a NIC lost its link or module (``kernel_events``
    of kind ``nic_link``: mlx5_core's "Link down", a cable unplugged, a PCI or health error)."""
    k = ctx.model.tables.get("kernel_events")
    if k is None or k.empty:
        return []
    out = []
    for host, g in k[k["kind"] == "nic_link"].groupby("host", sort=True):
        pcis = list(dict.fromkeys(g["pci"].dropna().astype(str)))
        t = pd.to_numeric(g["time_ns"], errors="coerce")
        out.append(Finding(
            kind="ib_errors", severity="error", confidence=0.75,
            headline=f"NIC link lost on {host}: {', '.join(pcis[:2]) or 'a NIC'}" + " ({since})",
            summary=(f"{host}'s kernel log: {len(g)} NIC link or module event(s) on {', '.join(pcis[:3]) or 'a NIC'}; "
                     f"first: \"{str(g.iloc[0]['message'])[:160]}\". The ranks on that host lose their peers."),
            ranks=warns.ranks_of_hosts(ctx, [host]), hosts=[host],
            evidence=warns.evidence(g, ["host", "time_ns", "pci", "process", "message", "artifact", "log_line"]),
            sql=("SELECT host, time_ns, pci, process, message, artifact, log_line FROM kernel_events "
                 "WHERE kind = 'nic_link' ORDER BY host, time_ns NULLS LAST, log_line"),
            action=(f"On {host}: ibstat / ip link for that port, the cable and transceiver, the switch port's log; "
                    "drain the node if the link flaps"),
            score=warns.LOG_FINDING_SCORE, since_ns=int(t.min()) if t.notna().any() else None,
            since_source="kernel log time" if t.notna().any() else None,
            details={"rule": "kernel_nic_link", "pci": pcis, "lines": int(len(g))}))
    return out


def logged_ib_errors(ctx: Context) -> list[Finding]:
    """One finding per IB failure the logs report: completion errors grouped by status (causes
    before flushes), async events, libfabric (EFA) completion errors and its own error lines."""
    rows = warns.rows_of(ctx, warns.classes_of("ib_errors"))
    if rows.empty:
        return []
    out = []
    total = len(warns.job_hosts(ctx))
    comp = rows[rows["class"] == "ib_completion"]
    for st, g in comp.groupby(pd.to_numeric(comp["ib_status"], errors="coerce").fillna(-1), sort=False):
        out.append(_completion_finding(ctx, int(st), g, total))
    for cls in ("ib_async", "ofi_completion", "libfabric", "ib_fatal_followup"):
        g = rows[rows["class"] == cls]
        if len(g):
            out.append(warns.class_finding(ctx, "ib_errors", cls, g, confidence=0.8))
    return out


def _completion_finding(ctx, st: int, g: pd.DataFrame, total: int) -> Finding:
    name, meaning, follows = IB_STATUS.get(st, ("unknown status", "an IB completion status this table does not know",
                                                False))
    b = warns.blame(g)
    sides = g["ib_side"].dropna().value_counts()
    side_txt = f" ({', '.join(f'{k} {v}' for k, v in sides.items())})" if len(sides) else ""
    where = ""
    if b.shared and b.side == "peer":
        where = f", all to peers on {b.shared}"
    elif b.shared and b.side == "reporter" and b.peer_hosts:
        where = f", all from {b.shared} (to {warns.hosts_text(b.peer_hosts)})"
    devices = sorted(set(g["ib_device"].dropna().astype(str)))
    dev_txt = f" on {', '.join(devices[:3])}" if devices else ""
    first = bool(g["first"].fillna(False).any())
    status = f"status {st} ({name}: {meaning})" if st >= 0 else "an error"
    summary = (f"IB completion errors, {status}, on {warns.hosts_text(b.hosts, total)}{where}{side_txt}{dev_txt}: "
               f"{len(g)} line(s), first on {warns.first_text(g)}"
               + (" - the first failure in the logs" if first else "") + warns.cascade_text(ctx, g) + ".")
    blamed = [b.shared] if b.shared else b.hosts
    since_ns, src = warns.since(g)
    at = (f"all to peers on {b.shared}" if b.shared and b.side == "peer" else
          f"from {b.shared}" if b.shared else f"on {warns.hosts_text(b.hosts, total)}")
    return Finding(
        headline=(f"IB completion errors ({name if st >= 0 else 'an error'}){dev_txt}, {at}" + " ({since})"),
        kind="ib_errors", severity="warning" if follows and not first else "error",
        confidence=0.85 if not follows else 0.6, summary=summary, ranks=warns.ranks_of_hosts(ctx, blamed),
        hosts=blamed, links=warns.links(g),
        evidence=warns.evidence(g), sql=warns.sql(["ib_completion"], f" AND ib_status = {int(st)}" if st >= 0 else ""),
        action=IB_STATUS_ACTION.get(st, "check the ports of both ends (ibstat, the port counters) and dmesg")
        + (f"; on {b.shared} first" if b.shared else ""),
        score=warns.FIRST_FAILURE_SCORE if first else (warns.LOG_FINDING_SCORE if not follows else 1e5),
        since_ns=since_ns, since_source=src,
        details={"ib_status": st, "ib_status_name": name, "lines": int(len(g)), "hosts": b.hosts,
                 "peer_hosts": b.peer_hosts, "first_failure": first, "consequence": follows})


def port_state(ctx: Context) -> list[Finding]:
    """A port that is down, or slower than its host's other ports (``ib_ports``).

    A switch port iblinkinfo lists down with no node at its other end is an unused port (a
    fabric's switches have many), not a failure. A port down is an error where NCCL uses it, or
    where the port's state says so; a RoCE netdev ``ibdev2netdev`` shows Down is a warning
    unless NCCL uses the device (a dual-port Ethernet NIC's second port is often unwired)."""
    p = ctx.model.tables.get("ib_ports")
    if p is None or p.empty:
        return []
    p = p.drop_duplicates(["host", "device", "port"], keep="last")
    for col in ("node_type", "peer"):
        if col not in p.columns:
            p = p.assign(**{col: pd.NA})
    out = []
    used = _nccl_devices(ctx)
    state = p["state"].astype("string").str.upper().fillna("")
    idle = (p["tool"].eq("iblinkinfo") & p["node_type"].eq("Switch") & p["peer"].isna()).fillna(False).to_numpy()
    down = p[(state.isin(["DOWN", "INIT", "ARMED", "NOP", "MISSING"]) | p["phys_state"].astype("string").isin(
        ["Disabled", "Polling", "Sleep", "LinkErrorRecovery", "PortConfigurationTraining"]).fillna(False))
        .to_numpy() & ~idle]
    for (host, ), g in down.groupby(["host"], sort=True):
        ports = [f"{r.device} gone (the tool could not open the device)" if str(r.state) == "MISSING" else
                 f"{r.device} port {int(r.port) if pd.notna(r.port) else '?'} {r.state}"
                 + (f" ({r.phys_state})" if isinstance(r.phys_state, str) else "") for r in g.itertuples(index=False)]
        in_use = [r.device for r in g.itertuples(index=False) if (host, r.device) in used or (None, r.device) in used]
        tools = ", ".join(sorted(set(g["tool"].dropna().astype(str)))) or "ibstat"
        summary = (f"{host}: InfiniBand {'port' if len(ports) == 1 else 'ports'} not active: {'; '.join(ports)}"
                   + (f"; NCCL uses {', '.join(sorted(set(in_use)))}" if in_use else "") + f" ({tools}).")
        out.append(Finding(
            kind="ib_errors", severity="error" if in_use or (state[g.index].isin(["DOWN", "MISSING"])
                                                            & ~(g["tool"].eq("ibdev2netdev")
                                                                & g["link_layer"].eq("Ethernet")).fillna(False)
                                                            ).any() else "warning",
            confidence=0.9, summary=summary, ranks=warns.ranks_of_hosts(ctx, [host]), hosts=[host],
            evidence=warns.evidence(g, ["host", "device", "port", "state", "phys_state", "rate_gbps", "link_layer",
                                        "tool", "artifact", "log_line"]),
            sql=(f"SELECT host, device, port, state, phys_state, rate_gbps, link_layer, tool, artifact FROM ib_ports "
                 f"WHERE host = {sql_str(host)} AND (upper(state) <> 'ACTIVE' OR phys_state <> 'LinkUp')"),
            action=(f"On {host}: the cable and transceiver of the port, the switch port (its logs, its counters), "
                    "`ibstat` again (a port stuck in Polling sees no peer; Disabled was turned off); drain the host "
                    "until the port is Active/LinkUp"),
            score=warns.LOG_FINDING_SCORE, details={"ports": ports}))
    # degraded: a port well below the fastest port of its host (or of the job)
    # a switch's SHARP Aggregation Node (a CA inside the switch) runs at the switch's own rate
    act = active_ports(p)
    act = act[~act["device"].astype("string").str.contains("Aggregation Node", regex=False).fillna(False).to_numpy()]
    if len(act) > 1:
        best = float(act["rate_gbps"].max())
        slow = act[act["rate_gbps"] < best / 1.9]
        for r in slow.itertuples(index=False):
            out.append(Finding(
                kind="ib_errors", severity="warning", confidence=0.8,
                summary=(f"{r.host}: {r.device} port {r.port} is up at {r.rate_gbps:g} Gb/s, under half the "
                         f"{best:g} Gb/s of the other ports: a degraded link (fewer lanes or a lower speed "
                         "negotiated)."),
                ranks=warns.ranks_of_hosts(ctx, [r.host]), hosts=[r.host],
                evidence=warns.evidence(pd.DataFrame([r._asdict()]), ["host", "device", "port", "state", "rate_gbps",
                                                                      "width", "speed", "artifact"]),
                sql="SELECT host, device, port, state, rate_gbps, width, speed FROM ib_ports ORDER BY rate_gbps",
                action=f"On {r.host}: reseat or replace the cable/transceiver of {r.device}; check the switch port's "
                       "negotiated width and speed", score=1e5, details={"rate_gbps": r.rate_gbps, "best_gbps": best}))
    return out


def active_ports(ports: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``ib_ports`` that are ACTIVE with a known rate."""
    active = ports["state"].astype("string").str.upper().eq("ACTIVE").fillna(False).to_numpy()
    return ports[active & ports["rate_gbps"].notna().to_numpy()]


def _nccl_devices(ctx) -> set:
    cfg = ctx.model.tables.get("nccl_config")
    out = set()
    if cfg is None or cfg.empty:
        return out
    for h, devs in zip(cfg["host"], cfg["ib_devices"]):
        for d in str(devs).split(",") if isinstance(devs, str) else []:
            out.add((h if isinstance(h, str) else None, d.split(":")[0]))
    return out


def counter_errors(ctx: Context) -> list[Finding]:
    """One finding per port whose problem counters moved during the capture."""
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
        when = ("since the counters were last cleared (one snapshot)" if g["start"].isna().all()
                else "during the capture")
        summary = (f"{host} {port_txt}: {moved} {when}; worst: {top['counter']} "
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
