"""``nccl_tests_bandwidth``: nccl-tests bus bandwidth below expectation or below the other hosts.

Over ``nccl_tests`` (every result row) and ``nccl_tests_runs`` (one row per file and test):

- **below peers**: runs of the same test are compared at the largest message size they
  all measured (bus bandwidth is size-dependent, and ``# Avg bus bandwidth`` averages
  over whatever sizes a run chose, so it is shown but not compared). A run below
  :data:`PEER_RATIO` of the median of the *other* runs is flagged; with only two runs the
  slower one is named at lower confidence.
- **below expectation**: a multi-node run (its devices on more than one host) whose
  transport and link speed are known: NCCL's bus bandwidth for large messages is
  bounded by the node's network bandwidth (``nics x line rate``; busbw is normalised
  so that a ring's per-link traffic equals it, see nccl-tests' PERFORMANCE.md).
  :data:`EXPECTED_EFFICIENCY` is the fraction of that bound a healthy fabric reaches
  at >= 64 MiB messages; below it the run is flagged, the ratio stated. The link rate is
  the fastest active IB/RoCE port of the host (``host_facts.ib_rate_gbps``, sysfs ``rate``),
  else of the ports ``ibstat`` / ``ibv_devinfo`` list for the run's hosts (``ib_ports``: the
  logs an engineer has, without a capture); the transport is NCCL's own (its init lines),
  else the ports' link layer. For NET/Socket no NIC speed is known, so only the peer
  comparison applies. Single-node runs (NVLink/PCIe bound, unknown here) are compared with
  peers only.
- **wrong results**: ``#wrong`` > 0 or an out-of-bounds/failed footer: an error.

| transport | link | bound (GB/s) | expected >= |
|---|---|---|---|
| IB (NET/IB, InfiniBand) | port rate R Gb/s, n active ports | n x R / 8 | 80 % |
| RoCE (NET/IB over Ethernet) | same | n x R / 8 | 70 % (PFC/ECN tuning costs more) |
| Socket (NET/Socket) | unknown speed | - | peers only |
"""
from __future__ import annotations

import json

import pandas as pd

from ..model.nccl_errors import CLASS_BY_NAME, classify
from .base import Context, Finding, detector
from .ib import active_ports
from .sql import sql_int, sql_str

PEER_RATIO = 0.7
LARGE_BYTES = 64 << 20
EXPECTED_EFFICIENCY = {"IB": 0.80, "RoCE": 0.70}

RUNS_SQL = ("SELECT host, artifact, test, ranks, nodes, test_hosts, max_size_bytes, busbw_at_max_size_gbps, "
            "max_busbw_gbps, avg_busbw_gbps FROM nccl_tests_runs ")


def _records(df: pd.DataFrame, n: int = 20) -> list[dict]:
    return json.loads(df.head(n).to_json(orient="records"))


@detector("nccl_tests_bandwidth", kinds=("nccl_tests_bandwidth",))
def detect(ctx: Context) -> list[Finding]:
    runs = ctx.model.tables.get("nccl_tests_runs")
    rows = ctx.model.tables.get("nccl_tests")
    if runs is None or runs.empty:
        return []
    out = _wrong_results(runs)
    if rows is None or rows.empty:
        return out
    out = _below_peers(runs, rows) + _below_expectation(ctx, runs, rows) + out
    return out


def _at_common_size(rows: pd.DataFrame, keys: pd.DataFrame) -> tuple[int | None, pd.DataFrame]:
    """The largest size every run of ``keys`` measured, and each run's best busbw there."""
    r = rows.merge(keys, on=["host", "artifact", "test"], how="inner")
    per = r.groupby(["host", "artifact", "test", "size_bytes"])["busbw_gbps"].max().reset_index()
    n = len(keys)
    sizes = per.groupby("size_bytes")["artifact"].size()
    common = sizes[sizes == n].index
    if not len(common):
        return None, per.iloc[0:0]
    size = int(max(common))
    return size, per[per["size_bytes"] == size]


def _below_peers(runs: pd.DataFrame, rows: pd.DataFrame) -> list[Finding]:
    out = []
    for test, g in runs.dropna(subset=["test"]).groupby("test"):
        keys = g[["host", "artifact", "test"]].drop_duplicates()
        if len(keys) < 2:
            continue
        size, at = _at_common_size(rows, keys)
        if size is None or at["busbw_gbps"].isna().all():
            continue
        at = at.dropna(subset=["busbw_gbps"]).reset_index(drop=True)
        for i, r in at.iterrows():
            others = at.drop(index=i)["busbw_gbps"]
            med = float(others.median())
            if med <= 0 or r["busbw_gbps"] >= PEER_RATIO * med:
                continue
            ratio = r["busbw_gbps"] / med
            hosts = g.loc[g["artifact"] == r["artifact"], "test_hosts"].dropna()
            test_hosts = [h for h in (hosts.iloc[0].split(",") if len(hosts) else []) if h]
            out.append(Finding(
                kind="nccl_tests_bandwidth", severity="warning", confidence=0.5 if len(at) == 2 else 0.8,
                summary=(f"{test} on {r['host']} reached {r['busbw_gbps']:.2f} GB/s bus bandwidth at "
                         f"{_size(size)}, {ratio:.0%} of the other runs' median {med:.2f} GB/s."),
                hosts=sorted({r["host"], *test_hosts}), evidence=_records(at),
                sql=(f"SELECT host, artifact, test, placement, busbw_gbps, algbw_gbps, time_us FROM nccl_tests "
                     f"WHERE test = {sql_str(test)} AND size_bytes = {sql_int(size)} ORDER BY busbw_gbps"),
                action="rerun nccl-tests on the slow host alone and against a good one; check its NICs (IB counters, "
                       "link rate), PCIe/NUMA placement and NCCL init lines (transport, GDR, channels)",
                score=float(1 - ratio) * 3,
                details={"rule": "below_peers", "size_bytes": size, "busbw_gbps": float(r["busbw_gbps"]),
                         "peer_median_gbps": med, "ratio": float(ratio), "artifact": r["artifact"]}))
    return out


def _transport_of(ctx: Context, host: str, artifact: str) -> str | None:
    cfg = ctx.model.tables.get("nccl_config")
    if cfg is None or cfg.empty:
        return None
    c = cfg[cfg["host"] == host]
    # the run's own NCCL lines first (they name the hosts the benchmark ran on, which may
    # not be the capture's name for its own host), then the host's processes
    own = cfg[cfg["artifact"].fillna("").str.split(",").map(lambda a: artifact in a)]
    for df in (own, c):
        t = df["transport"].dropna()
        if len(t):
            if (t == "IB").any():
                ll = df["link_layers"].dropna()
                return "RoCE" if len(ll) and (ll == "RoCE").all() else "IB"
            return str(t.iloc[0])
    return None


def _link_rate(ctx: Context, host: str, test_hosts) -> tuple[float, int, str | None] | None:
    """(fastest active port's rate in Gb/s, active ports, their link layer) of the run's host:
    the capture's sysfs facts, else the ports ibstat / ibv_devinfo listed for its hosts."""
    hf = ctx.model.tables.get("host_facts")
    h = hf[hf["host"] == host] if hf is not None and len(hf) else pd.DataFrame()
    if len(h) and pd.notna(h["ib_rate_gbps"].iloc[0]):
        nics = h["ib_ports_active"].iloc[0]
        return float(h["ib_rate_gbps"].iloc[0]), int(nics) if pd.notna(nics) and nics > 0 else 1, None
    ports = ctx.model.tables.get("ib_ports")
    if ports is None or ports.empty:
        return None
    hosts = {host, *[x for x in (test_hosts if isinstance(test_hosts, str) else "").split(",") if x]}   # NA: none
    act = active_ports(ports)
    mine = act[act["host"].isin(hosts)]
    act = mine if len(mine) else act
    if act.empty:
        return None
    first = act[act["host"] == act["host"].iloc[0]].drop_duplicates(["device", "port"])
    ll = first["link_layer"].dropna().astype(str)
    return float(first["rate_gbps"].max()), len(first), ("RoCE" if len(ll) and (ll == "Ethernet").all() else "IB")


def _below_expectation(ctx: Context, runs: pd.DataFrame, rows: pd.DataFrame) -> list[Finding]:
    out = []
    for r in runs[runs["nodes"].fillna(0) > 1].itertuples(index=False):
        link = _link_rate(ctx, r.host, r.test_hosts)
        if link is None:
            continue
        rate, nics, layer = link
        transport = _transport_of(ctx, r.host, r.artifact) or layer
        eff = EXPECTED_EFFICIENCY.get(transport or "")
        if eff is None:
            continue
        bound = nics * rate / 8
        big = rows[(rows["host"] == r.host) & (rows["artifact"] == r.artifact) & (rows["test"] == r.test)
                   & (rows["size_bytes"] >= LARGE_BYTES)]
        if big.empty or big["busbw_gbps"].isna().all():
            continue
        best = float(big["busbw_gbps"].max())
        if best >= eff * bound:
            continue
        out.append(Finding(
            kind="nccl_tests_bandwidth", severity="warning", confidence=0.7,
            summary=(f"{r.test} across {int(r.nodes)} nodes peaked at {best:.2f} GB/s bus bandwidth for messages "
                     f">= 64 MiB, {best / bound:.0%} of the {bound:.0f} GB/s that {nics} x {rate:.0f} Gb/s {transport} "
                     f"port(s) allow (expected >= {eff:.0%})."),
            hosts=sorted({r.host, *[x for x in str(r.test_hosts or '').split(',') if x]}),
            evidence=_records(big.sort_values("size_bytes", ascending=False)[
                ["host", "artifact", "test", "size_bytes", "placement", "busbw_gbps", "algbw_gbps"]]),
            sql=(f"SELECT t.host, t.test, t.size_bytes, t.placement, t.busbw_gbps, h.ib_rate_gbps, h.ib_ports_active "
                 f"FROM nccl_tests t JOIN host_facts h USING (host) WHERE t.test = {sql_str(r.test)} "
                 f"AND t.host = {sql_str(r.host)} "
                 f"AND t.size_bytes >= {LARGE_BYTES} ORDER BY t.size_bytes DESC") if layer is None else
                (f"SELECT t.host, t.test, t.size_bytes, t.placement, t.busbw_gbps, "
                 f"(SELECT max(rate_gbps) FROM ib_ports WHERE upper(state) = 'ACTIVE') AS port_rate_gbps "
                 f"FROM nccl_tests t WHERE t.test = {sql_str(r.test)} AND t.host = {sql_str(r.host)} "
                 f"AND t.size_bytes >= {LARGE_BYTES} ORDER BY t.size_bytes DESC"),
            action="check GDR and channel count in the NCCL init lines, the IB counters of every port, the link "
                   "rate/width of each HCA and the switch; compare hosts pairwise to find the slow node",
            score=float(1 - best / bound) * 3,
            details={"rule": "below_expectation", "busbw_gbps": best, "bound_gbps": bound, "transport": transport,
                     "ports": nics, "rate_gbps": rate, "efficiency_expected": eff, "ratio": best / bound,
                     "rate_source": "sysfs" if layer is None else "ibstat"}))
    return out


def _wrong_results(runs: pd.DataFrame) -> list[Finding]:
    bad = runs[(runs["wrong_total"].fillna(0) > 0) | (runs["out_of_bounds"].fillna(0) > 0)
               | (runs["failures"].fillna(0) > 0)]
    if bad.empty:
        return []
    text = next((t for t in bad["failure_text"] if isinstance(t, str) and t), None)
    why = ""
    if text:
        cls = classify(pd.Series([text])).iloc[0]
        why = f": \"{text[:200]}\"" + (f" ({CLASS_BY_NAME[cls].meaning})" if cls in CLASS_BY_NAME else "")
    failed = _failed_hosts(bad)
    hosts = sorted(set(bad["host"].dropna().astype(str)) | set(failed))
    wrong, lines = int(bad["wrong_total"].fillna(0).sum()), int(bad["failures"].fillna(0).sum())
    if len(failed) > 1 and not wrong and not bad["out_of_bounds"].fillna(0).gt(0).any():
        # every process prints its own failure: several hosts failing alike is no one host's fault
        shown = ", ".join(failed[:HOSTS_SHOWN]) + (f" and {len(failed) - HOSTS_SHOWN} more"
                                                   if len(failed) > HOSTS_SHOWN else "")
        summary = (f"nccl-tests failed alike on {len(failed)} hosts ({shown}), no single culprit{why}; "
                   f"{lines} failure line(s) in {len(bad)} run(s).")
    else:
        oob = int(bad["out_of_bounds"].fillna(0).sum())
        counts = [c for n, c in ((wrong, f"{wrong} wrong values"), (oob, f"{oob} out-of-bounds values"),
                                 (lines, f"{lines} failure line(s)")) if n] or ["no count given"]
        summary = (f"nccl-tests reported wrong results or failures in {len(bad)} run(s) "
                   f"({', '.join(hosts)}): {', '.join(counts)}{why}.")
    return [Finding(
        kind="nccl_tests_bandwidth", severity="error", confidence=0.9, summary=summary,
        hosts=hosts, evidence=_records(bad),
        sql=RUNS_SQL.replace("avg_busbw_gbps", "avg_busbw_gbps, wrong_total, out_of_bounds, failures, failure_text, "
                                               "failure_hosts")
        + "WHERE wrong_total > 0 OR out_of_bounds > 0 OR failures > 0",
        action="treat the node as faulty until a rerun is clean: data corruption or a failing GPU/NIC",
        score=3.0, details={"rule": "wrong_results", "failed_hosts": failed})]


HOSTS_SHOWN = 8


def _failed_hosts(bad: pd.DataFrame) -> list[str]:
    """The hosts the runs' failure lines name, in the order they failed."""
    col = bad["failure_hosts"] if "failure_hosts" in bad else pd.Series(dtype=object)
    return list(dict.fromkeys(h for v in col.dropna().astype(str) for h in v.split(",") if h))


def _size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"
