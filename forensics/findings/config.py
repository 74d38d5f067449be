"""``misconfiguration``: NCCL set up in a way that costs bandwidth or hides the network.

Reads ``nccl_config`` (per process: transport, interfaces, GDR, channels, NCCL_* env)
and ``host_facts`` (IB devices, interfaces, nvidia_peermem). Rules:

- ``socket_with_ib``: NCCL used NET/Socket on a host that has IB/RoCE devices (often
  ``NCCL_IB_DISABLE=1`` or a missing IB plugin): TCP through the kernel instead of RDMA.
- ``suspicious_interface``: NCCL's socket interface is loopback or a container/virtual
  bridge (``lo``, ``docker*``, ``virbr*``, ``veth*``, ``br-*``, ``cni*``, ``flannel*``),
  a classic mistake of interface auto-selection; ``multiple_interfaces``: a rank spreads
  its sockets over several interfaces (fine for identical NICs, slow when they differ);
  ``interfaces_differ``: ranks of one host use different interfaces.
- ``gdr_disabled``: on IB, GPU Direct RDMA off (every buffer bounces through host memory),
  with whether nvidia_peermem was loaded.
- ``few_channels``: one NCCL channel, or NCCL_MAX_NCHANNELS/NCCL_MAX_NRINGS <= 2, on a
  job that uses the network (each channel is one ring/tree with its own connections).
- ``nccl_version_differs``: ranks run different NCCL versions (a known cause of hangs).
- ``env``: NCCL_* settings that NCCL's documentation lists as debugging knobs, not for
  production (:data:`ENV_RULES`).

Besides, one ``transport`` finding (info) states how NCCL's traffic travelled: over
IB/RoCE it bypasses the kernel's TCP stack, so pcaps and retransmission counters do not
see it and the evidence is ``ib_counters``; over NET/Socket the TCP evidence is NCCL's
own traffic. Lab jobs (NET/Socket, no IB device) get that info line and nothing louder.
Without an NCCL init log, ``NCCL_IB_DISABLE=1`` (and no net plugin) in a process's
environment implies NET/Socket; findings built on that say "inferred".
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from . import warns
from ..coerce import literal_int
from .base import Context, Finding, detector
from .sql import sql_str

VIRTUAL_IFACES = ("lo", "docker", "virbr", "veth", "br-", "cni", "flannel", "cali", "tun", "tap", "kube")
KIB = 1024


def _truthy(v: str) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "y", "on")


@dataclass(frozen=True)
class EnvRule:
    var: str
    severity: str                       # when it fires
    applies: Callable[[str, dict], str | None]   # (value, env) -> why (None: fine)
    action: str
    confidence: float = 0.7


def _proto(v, env):
    protos = {p.strip().lower() for p in v.lstrip("^").split(",") if p.strip()}
    if v.startswith("^"):
        return f"excludes protocol(s) {v[1:]}: small and medium messages lose LL/LL128" \
            if protos & {"ll", "ll128"} else None
    if protos == {"simple"}:
        return "forces the Simple protocol: small messages lose the low-latency LL/LL128 protocols"
    return None


def _proto_info(v, env):
    return None if _proto(v, env) else f"restricts protocols to {v} (NCCL's tuner no longer chooses)"


def _nthreads(v, env):
    n = literal_int(v)
    socks = literal_int(env.get("NCCL_NSOCKS_PERTHREAD", "1")) or 1
    if n is None:
        return None
    if n > 16:
        return f"is {n}, above NCCL's range 1..16"
    if n * socks > 64:
        return f"x NCCL_NSOCKS_PERTHREAD = {n * socks} sockets, above NCCL's limit of 64"
    return None


def _nsocks(v, env):
    n = literal_int(v)
    threads = literal_int(env.get("NCCL_SOCKET_NTHREADS", "1")) or 1
    if n is not None and "NCCL_SOCKET_NTHREADS" not in env and n * threads > 64:
        return f"x NCCL_SOCKET_NTHREADS = {n * threads} sockets, above NCCL's limit of 64"
    return None


def _buffsize(v, env, lo=1 << 20):
    n = literal_int(v)
    return f"is {n} bytes ({n / KIB:.0f} KiB), below {lo >> 10} KiB (default 4 MiB): more, smaller chunks " \
        "and less pipelining" if n is not None and n < lo else None


def _buffsize_info(v, env):
    n = literal_int(v)
    return f"is {n} bytes, below the 4 MiB default" if n is not None and (1 << 20) <= n < (4 << 20) else None


def _max_channels(v, env):
    n = literal_int(v)
    return f"caps NCCL at {n} channel(s): fewer parallel rings/connections, less bandwidth" \
        if n is not None and n <= 2 else None


ENV_RULES: tuple[EnvRule, ...] = (
    EnvRule("NCCL_P2P_DISABLE", "warning", lambda v, e: "disables NVLink/PCIe peer-to-peer between GPUs of a node "
            "(traffic goes through host memory)" if _truthy(v) else None,
            "unset NCCL_P2P_DISABLE (a debugging knob); if P2P was unstable, fix the ACS/IOMMU setup instead"),
    EnvRule("NCCL_SHM_DISABLE", "info", lambda v, e: "disables the shared-memory transport between GPUs of a node"
            if _truthy(v) else None, "unset NCCL_SHM_DISABLE unless it works around a known problem"),
    EnvRule("NCCL_PROTO", "warning", _proto, "unset NCCL_PROTO (a debugging knob) and let NCCL's tuner choose"),
    EnvRule("NCCL_PROTO", "info", _proto_info, "unset NCCL_PROTO unless it works around a known problem", 0.5),
    EnvRule("NCCL_ALGO", "warning", lambda v, e: f"forces the algorithm ({v}): NCCL's tuner cannot pick ring/tree/"
            "NVLS per message size", "unset NCCL_ALGO (a debugging knob) and let NCCL's tuner choose", 0.6),
    EnvRule("NCCL_SOCKET_NTHREADS", "warning", _nthreads, "use NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD <= 64"),
    EnvRule("NCCL_NSOCKS_PERTHREAD", "warning", _nsocks, "use NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD <= 64"),
    EnvRule("NCCL_BUFFSIZE", "warning", _buffsize, "unset NCCL_BUFFSIZE (default 4 MiB) unless memory is short"),
    EnvRule("NCCL_BUFFSIZE", "info", _buffsize_info, "unset NCCL_BUFFSIZE unless memory is short", 0.5),
    EnvRule("NCCL_MAX_NCHANNELS", "warning", _max_channels, "unset NCCL_MAX_NCHANNELS or raise it"),
    EnvRule("NCCL_MAX_NRINGS", "warning", _max_channels, "unset NCCL_MAX_NRINGS (old name of NCCL_MAX_NCHANNELS)"),
    EnvRule("NCCL_NET_GDR_LEVEL", "warning", lambda v, e: "disables GPU Direct RDMA (LOC/0)"
            if str(v).strip().upper() in ("0", "LOC") else None, "unset NCCL_NET_GDR_LEVEL or set it to PHB/SYS"),
    EnvRule("NCCL_DEBUG", "warning", lambda v, e: "TRACE logging on every call (heavy overhead)"
            if str(v).strip().upper() == "TRACE" else None,
            "use NCCL_DEBUG=WARN (or INFO for init only) in production"),
    # NCCL_DEBUG_SUBSYS=COLL is never advised against: its lines place and date hangs (findings/late_state.py)
    EnvRule("TORCH_NCCL_BLOCKING_WAIT", "info", lambda v, e: "makes the host block (and spin) in every wait"
            if _truthy(v) else None, "unset TORCH_NCCL_BLOCKING_WAIT; the watchdog handles timeouts", 0.5),
)

CONFIG_SQL = ("SELECT host, rank, pid, transport, socket_ifaces, ib_devices, gdr, nchannels, nccl_version, env "
              "FROM nccl_config ")


def _ranks(df: pd.DataFrame) -> list[int]:
    return sorted({int(r) for r in df["rank"].dropna()})


def _hosts(df: pd.DataFrame) -> list[str]:
    return sorted({str(h) for h in df["host"].dropna()})


def _rank_text(ranks: list[int]) -> str:
    if not ranks:
        return "processes"
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _evidence(df: pd.DataFrame, cols: list[str]) -> list[dict]:
    cols = [c for c in cols if c in df.columns]
    return json.loads(df[cols].head(20).to_json(orient="records"))


def _env(row) -> dict:
    try:
        v = json.loads(row["env"]) if isinstance(row["env"], str) else {}
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


@detector("misconfiguration", kinds=("misconfiguration", "transport"))
def detect(ctx: Context) -> list[Finding]:
    cfg = ctx.model.tables.get("nccl_config")
    hf = ctx.model.tables.get("host_facts")
    logged = logged_failures(ctx)
    if cfg is None or cfg.empty:
        return logged
    hf = hf if hf is not None else pd.DataFrame(columns=["host", "ib_present", "ib_devices", "nvidia_peermem"])
    c = cfg.merge(hf[["host", "ib_present", "ib_devices", "nvidia_peermem"]].rename(
        columns={"ib_devices": "host_ib_devices"}), on="host", how="left")
    c["envd"] = [_env(r) for _, r in c.iterrows()]
    # no log line says: NCCL_IB_DISABLE=1 without a net plugin leaves NCCL nothing but sockets
    ib_off = c["envd"].map(lambda e: _truthy(e.get("NCCL_IB_DISABLE", "0")) and not e.get("NCCL_NET")
                           and not e.get("NCCL_NET_PLUGIN"))
    c["inferred"] = c["transport"].isna() & ib_off
    c["transport"] = c["transport"].astype("object").where(~c["inferred"], "Socket")
    out: list[Finding] = []
    out += _socket_with_ib(c)
    out += _interfaces(c)
    out += _gdr(c)
    out += _channels(c)
    out += _versions(c)
    out += _env_rules(c)
    out += _transport_statement(c)
    return logged + out


def logged_failures(ctx: Context) -> list[Finding]:
    """NCCL's WARN lines about the setup (:mod:`forensics.model.nccl_errors`): memory it could
    not register (memlock), IB devices it could not open, shared memory, foreign connections,
    a bootstrap or topology the ranks disagree on; one finding per class, naming the hosts and
    the check to run there."""
    rows = warns.rows_of(ctx, warns.classes_of("misconfiguration"))
    return [warns.class_finding(ctx, "misconfiguration", cls, g, confidence=0.8, severity="error")
            for cls, g in rows.groupby("class", sort=False)]


def _socket_with_ib(c: pd.DataFrame) -> list[Finding]:
    bad = c[(c["transport"] == "Socket") & (c["ib_present"] == True)]  # noqa: E712
    if bad.empty:
        return []
    disabled = bad[bad["envd"].map(lambda e: _truthy(e.get("NCCL_IB_DISABLE", "0")))]
    devs = ",".join(sorted(set(",".join(bad["host_ib_devices"].dropna()).split(",")) - {""}))
    why = " with NCCL_IB_DISABLE=1" if len(disabled) else ""
    if bad["inferred"].all():       # from the environment alone: no NCCL_DEBUG init line in the bundle
        why = " (NCCL_IB_DISABLE=1 in their environment; no NCCL init log in the bundle)"
    return [Finding(
        kind="misconfiguration", severity="warning", confidence=0.9,
        summary=(f"NCCL used TCP sockets (NET/Socket){why} on {len(bad)} process(es) ({_rank_text(_ranks(bad))}) "
                 f"although host(s) {','.join(_hosts(bad))} have IB/RoCE devices ({devs})."),
        ranks=_ranks(bad), hosts=_hosts(bad), evidence=_evidence(bad, ["host", "rank", "pid", "transport",
                                                                      "socket_ifaces", "host_ib_devices", "env"]),
        sql=("SELECT c.host, c.rank, c.pid, c.transport, c.socket_ifaces, h.ib_devices, "
             "json_extract_string(c.env, '$.NCCL_IB_DISABLE') AS nccl_ib_disable "
             "FROM nccl_config c JOIN host_facts h USING (host) WHERE h.ib_present AND (c.transport = 'Socket' "
             "OR (c.transport IS NULL AND json_extract_string(c.env, '$.NCCL_IB_DISABLE') = '1')) "
             "ORDER BY c.host, c.rank"),
        action=("unset NCCL_IB_DISABLE and check that NCCL finds the HCAs (NCCL_IB_HCA, rdma-core/libibverbs in "
                "the container, the IB net plugin); NET/IB should appear in the NCCL_DEBUG=INFO init lines"),
        score=3.0, details={"rule": "socket_with_ib", "processes": len(bad), "ib_devices": devs,
                            "ib_disable_set": int(len(disabled)), "inferred_from_env": bool(bad["inferred"].all())})]


def _virtual(name: str) -> bool:
    return name == "lo" or any(name.startswith(p) for p in VIRTUAL_IFACES if p != "lo")


def _interfaces(c: pd.DataFrame) -> list[Finding]:
    out = []
    s = c[c["socket_ifaces"].notna()].copy()
    if s.empty:
        return out
    s["iface_list"] = s["socket_ifaces"].map(lambda v: [x for x in str(v).split(",") if x])
    per_host = c.groupby("host")["pid"].transform("size")
    multi_host = c["host"].nunique() > 1 or (c["world_size"].fillna(0) > per_host).any()
    virt = s[s["iface_list"].map(lambda l: any(_virtual(x) for x in l))]
    if len(virt):
        names = sorted({x for l in virt["iface_list"] for x in l if _virtual(x)})
        loop_only = names == ["lo"] and not multi_host
        out.append(Finding(
            kind="misconfiguration", severity="info" if loop_only else "warning",
            confidence=0.5 if loop_only else 0.8,
            summary=(f"NCCL's socket interface on {_rank_text(_ranks(virt))} is {', '.join(names)} (loopback or a "
                     "container/virtual bridge), not the data network."),
            ranks=_ranks(virt), hosts=_hosts(virt), evidence=_evidence(virt, ["host", "rank", "pid", "socket_ifaces",
                                                                              "socket_addrs", "env"]),
            sql=CONFIG_SQL + "WHERE socket_ifaces IS NOT NULL ORDER BY host, rank",
            action="set NCCL_SOCKET_IFNAME to the data-network interface (e.g. =eth0 or ^docker,lo)",
            score=2.0, details={"rule": "suspicious_interface", "interfaces": names}))
    multi = s[s["iface_list"].map(len) > 1]
    if len(multi):
        out.append(Finding(
            kind="misconfiguration", severity="info", confidence=0.5,
            summary=(f"NCCL spreads its sockets over several interfaces on {_rank_text(_ranks(multi))} "
                     f"({'; '.join(sorted(set(multi['socket_ifaces'])))}); fine for identical NICs, slow when they "
                     "differ in speed."),
            ranks=_ranks(multi), hosts=_hosts(multi), evidence=_evidence(multi, ["host", "rank", "socket_ifaces",
                                                                                 "socket_addrs"]),
            sql=CONFIG_SQL + "WHERE socket_ifaces LIKE '%,%' ORDER BY host, rank",
            action="pin NCCL_SOCKET_IFNAME to interfaces of the same speed", score=1.0,
            details={"rule": "multiple_interfaces"}))
    differ = s.groupby("host")["socket_ifaces"].nunique()
    for host in differ[differ > 1].index:
        g = s[s["host"] == host]
        out.append(Finding(
            kind="misconfiguration", severity="warning", confidence=0.7,
            summary=(f"Ranks on host {host} use different NCCL socket interfaces: "
                     + "; ".join(f"rank {r.rank}: {r.socket_ifaces}" for r in g.itertuples()) + "."),
            ranks=_ranks(g), hosts=[host], evidence=_evidence(g, ["host", "rank", "socket_ifaces", "socket_addrs"]),
            sql=CONFIG_SQL + f"WHERE host = {sql_str(host)} ORDER BY rank",
            action="set one NCCL_SOCKET_IFNAME for every rank of the job", score=1.5,
            details={"rule": "interfaces_differ"}))
    return out


def _gdr(c: pd.DataFrame) -> list[Finding]:
    off = c[(c["transport"] == "IB") & (c["gdr"] == False)]  # noqa: E712
    if off.empty:
        return []
    peermem = off["nvidia_peermem"].astype("boolean")
    if (peermem == False).fillna(False).any():  # noqa: E712
        why, conf = "nvidia_peermem is not loaded", 0.85
    elif peermem.notna().all() and peermem.all():
        why, conf = "although nvidia_peermem is loaded: check NCCL_NET_GDR_LEVEL, PCIe topology, ACS", 0.7
    else:
        why, conf = "nvidia_peermem state unknown: no lsmod in the bundle", 0.6
    return [Finding(
        kind="misconfiguration", severity="warning", confidence=conf,
        summary=(f"GPU Direct RDMA is disabled on {_rank_text(_ranks(off))} over IB ({why}): every transfer "
                 "bounces through host memory."),
        ranks=_ranks(off), hosts=_hosts(off), evidence=_evidence(off, ["host", "rank", "pid", "transport", "ib_devices",
                                                                      "gdr", "gdr_channels", "nvidia_peermem"]),
        sql=("SELECT c.host, c.rank, c.pid, c.ib_devices, c.gdr, c.gdr_channels, h.nvidia_peermem "
             "FROM nccl_config c LEFT JOIN host_facts h USING (host) WHERE c.transport = 'IB' AND NOT c.gdr "
             "ORDER BY c.host, c.rank"),
        action="load nvidia_peermem (or use DMA-BUF with a recent driver/NCCL), then check the NCCL init lines say "
               "'GPU Direct RDMA Enabled'",
        score=2.5, details={"rule": "gdr_disabled"})]


def _channels(c: pd.DataFrame) -> list[Finding]:
    net = c["transport"].notna() | c["net_channels"].fillna(0).gt(0)
    few = c[net & (c["nchannels"] == 1)]
    if few.empty:
        return []
    return [Finding(
        kind="misconfiguration", severity="warning", confidence=0.6,
        summary=f"NCCL runs a single channel on {_rank_text(_ranks(few))}: one ring and one connection per peer "
                "carry all traffic, well below what the network can take.",
        ranks=_ranks(few), hosts=_hosts(few),
        evidence=_evidence(few, ["host", "rank", "nchannels", "transport", "env"]),
        sql=CONFIG_SQL + "WHERE nchannels = 1 ORDER BY host, rank",
        action="check NCCL_MAX_NCHANNELS/NCCL_MIN_NCHANNELS and NCCL_NSOCKS_PERTHREAD; on sockets raise "
               "NCCL_SOCKET_NTHREADS/NCCL_NSOCKS_PERTHREAD",
        score=1.5, details={"rule": "few_channels"})]


def versions_differ(versions) -> bool:
    """Whether NCCL version strings name different builds: different releases ("2.18.3",
    "2.21.5"), or one release built twice ("+cuda11.8", "+cuda12.4"). A version without the
    build suffix (the library's own, read from its file) is the same as one with it (its log's
    "NCCL version 2.21.5+cuda12.4")."""
    builds: dict[str, set[str]] = {}
    for v in {str(x) for x in versions}:
        release, _, build = v.partition("+")
        builds.setdefault(release, set()).update({build} if build else set())
    return len(builds) > 1 or any(len(b) > 1 for b in builds.values())


def _versions(c: pd.DataFrame) -> list[Finding]:
    v = c.dropna(subset=["nccl_version"])
    if not versions_differ(v["nccl_version"]):
        return []
    groups = v.groupby("nccl_version")["rank"].apply(lambda s: sorted(int(x) for x in s.dropna()))
    return [Finding(
        kind="misconfiguration", severity="warning", confidence=0.8,
        summary="Ranks run different NCCL versions: " + "; ".join(f"{ver} on {_rank_text(r)}"
                                                                 for ver, r in groups.items()) + ".",
        ranks=_ranks(v), hosts=_hosts(v), evidence=_evidence(v, ["host", "rank", "nccl_version", "libnccl"]),
        sql=CONFIG_SQL + "WHERE nccl_version IS NOT NULL ORDER BY nccl_version, rank",
        action="run the same NCCL build on every rank (one container image)", score=2.0,
        details={"rule": "nccl_version_differs", "versions": list(groups.index)})]


def _env_rules(c: pd.DataFrame) -> list[Finding]:
    out = []
    ib = (c["transport"] == "IB").any()
    rows = c[["host", "rank", "pid", "envd"]].to_dict("records")     # once, not once per rule
    for rule in ENV_RULES:
        if rule.var == "NCCL_NET_GDR_LEVEL" and not ib:
            continue
        hits = []
        for row in rows:
            env = row["envd"]
            if rule.var in env:
                why = rule.applies(str(env[rule.var]), env)
                if why:
                    hits.append((row, env[rule.var], why))
        if not hits:
            continue
        df = pd.DataFrame([{"host": r["host"], "rank": r["rank"], "pid": r["pid"], "value": v} for r, v, _ in hits])
        value = hits[0][1]
        out.append(Finding(
            kind="misconfiguration", severity=rule.severity, confidence=rule.confidence,
            summary=f"{rule.var}={value} on {_rank_text(_ranks(df))}: {hits[0][2]}.",
            ranks=_ranks(df), hosts=_hosts(df), evidence=json.loads(df.head(20).to_json(orient="records")),
            sql=(f"SELECT host, rank, pid, json_extract_string(env, {sql_str('$.' + rule.var)}) AS value "
                 f"FROM nccl_config WHERE json_extract_string(env, {sql_str('$.' + rule.var)}) IS NOT NULL "
                 "ORDER BY host, rank"),
            action=rule.action, score=1.0, details={"rule": "env", "variable": rule.var, "value": value}))
    return out


def _transport_statement(c: pd.DataFrame) -> list[Finding]:
    known = c.dropna(subset=["transport"])
    out = []
    rdma = known[known["transport"] == "IB"]
    if len(rdma):
        ll = ",".join(sorted(set(",".join(rdma["link_layers"].dropna()).split(",")) - {""})) or "IB"
        out.append(Finding(
            kind="transport", severity="info", confidence=0.9,
            summary=(f"NCCL traffic of {_rank_text(_ranks(rdma))} went over RDMA ({ll}), which bypasses the kernel "
                     "TCP stack: pcaps and TCP retransmissions do not see it; the network evidence is the IB "
                     "counters."),
            ranks=_ranks(rdma), hosts=_hosts(rdma), evidence=_evidence(rdma, ["host", "rank", "transport",
                                                                              "ib_devices", "gdr"]),
            sql=CONFIG_SQL + "WHERE transport = 'IB' ORDER BY host, rank",
            action="read the ib_counters table (symbol/receive errors, discards, link downs) for this job's HCAs",
            details={"rule": "rdma_invisible_to_tcp", "link_layers": ll}))
    sock = known[known["transport"] == "Socket"]
    if len(sock):
        ifs = ",".join(sorted(set(",".join(sock["socket_ifaces"].dropna()).split(",")) - {""}))
        no_ib = bool((sock["ib_present"].astype("boolean") == False).fillna(False).all())  # noqa: E712
        how = f"NET/Socket on {ifs}" if ifs else "NET/Socket"
        if sock["inferred"].all():
            how += ", inferred from NCCL_IB_DISABLE=1: no NCCL init log in the bundle"
        out.append(Finding(
            kind="transport", severity="info", confidence=0.7 if sock["inferred"].all() else 0.9,
            summary=(f"NCCL traffic of {_rank_text(_ranks(sock))} went over TCP sockets ({how})"
                     + (", and the host(s) have no IB/RoCE device" if no_ib else "")
                     + ": the pcaps and TCP counters see NCCL's own traffic."),
            ranks=_ranks(sock), hosts=_hosts(sock), evidence=_evidence(sock, ["host", "rank", "transport",
                                                                              "socket_ifaces", "socket_addrs"]),
            sql=CONFIG_SQL + "WHERE transport = 'Socket' OR (transport IS NULL AND "
                             "json_extract_string(env, '$.NCCL_IB_DISABLE') = '1') ORDER BY host, rank",
            action="none needed",
            details={"rule": "tcp_transport", "inferred_from_env": bool(sock["inferred"].all())}))
    return out
