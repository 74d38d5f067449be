"""``nccl_config`` (one row per NCCL process), ``nccl_warnings`` and ``host_facts``.

``nccl_config`` merges two views of each process:

- the manifest (what the capture saw in /proc): pid, RANK/LOCAL_RANK/WORLD_SIZE, the
  libnccl it mapped, its NCCL_*/TORCH_* environment;
- its NCCL_DEBUG log (``logs/``): version (else the one its libnccl file carries, which the
  manifest records: a process whose init failed before logging it still has one), transport
  (``Using network IB|Socket`` or the ``NET/IB``/``NET/Socket`` lines), IB devices and socket
  interfaces, GPU Direct RDMA, channels, rings and trees, the ``NCCL_* set by environment``
  lines, WARN count.

A log process is matched to a manifest process by pid, else by the pid that the
attachment record names for the file (``NCCL_DEBUG_FILE of pid N``), else by rank. A
process that only one side knows still gets its row (``source`` says which). Manifest
processes with no rank, no libnccl and no NCCL_* variable (a launcher shell) are not
NCCL processes and get none.

``host_facts``: one row per bundle: IB/RoCE devices (``ib/`` counter files and their
port attributes, the ``ib-counters`` collector's "no devices" verdict, NCCL's NET/IB
lines), network interfaces (``ip -j link`` snapshots), ``nvidia_peermem`` in
``lsmod``, GPUs in ``nvidia-smi -q``, NVIDIA XID lines in the dmesg tail.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from ..coerce import is_missing
from .nccl_errors import classify
from .schema import conform, empty

ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "TORCH_DISTRIBUTED_", "CUDA_VISIBLE_DEVICES")
WHY_PID_RE = re.compile(r"\bof pid (\d+)")
XID_RE = re.compile(r"NVRM: Xid")
RATE_RE = re.compile(r"([\d.]+)\s*Gb/sec")
LOOPBACK = {"lo"}


def _env_of(p) -> dict[str, str]:
    return {k: v for k, v in p.env.items() if k.startswith(ENV_PREFIXES)}


def _is_nccl_process(p) -> bool:
    return p.rank is not None or bool(p.libnccl) or any(k.startswith("NCCL_") for k in p.env)


def _attachment_pids(bundle) -> dict[str, int]:
    """bundle path of an attached log -> the pid whose NCCL_DEBUG_FILE it was."""
    out = {}
    for _, sources in bundle.manifest.record_values("sources"):
        for s in sources or ():
            if isinstance(s, dict) and isinstance(s.get("path"), str) and (m := WHY_PID_RE.search(str(s.get("why")))):
                out[s["path"]] = int(m[1])
    return out


def config_tables(bundle, arts, ranks: dict[int, int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(``nccl_config``, ``nccl_warnings``) of one bundle or loose set.

    A log process is keyed by the host its own lines name and its pid (a log merged from many
    hosts reuses pids). It is the manifest's process of that pid when the file is that
    process's alone (its lines name one host), or its host is the capture's, or its rank agrees
    with the manifest's; then its row is the capture's (``host``: the capture's name, the one
    the tracer, the stacks and the sockets use; ``log_host``: its own). Otherwise it is a
    process the capture did not see: ``host`` is its own (NA when its lines name none: the model
    joins it across files, :mod:`.logs`). ``node``: the capture that holds the evidence (NA for
    loose evidence)."""
    node = bundle.node
    by_pid = {p.pid: p for p in bundle.manifest.processes}
    by_rank = {p.rank: p for p in bundle.manifest.processes if p.rank is not None}
    attach = _attachment_pids(bundle)
    rings = arts.table("nccl_debug", "nccl_rings")
    chans = arts.table("nccl_debug", "nccl_channels")
    warns = arts.table("nccl_debug", "nccl_warnings")
    world = _log_world_ranks(arts.table("nccl_debug", "nccl_comms"))
    rows: dict[tuple, dict] = {}
    pmap: dict[tuple[str, str, int], tuple] = {}    # (artifact, log host, log pid) -> row key
    for rel, res in arts.of("nccl_debug"):
        procs = res.facts.get("processes") or {}
        if not procs and res.facts.get("nccl_version"):
            # a log whose only NCCL line is the bare version line (rank 0's stdout before 2.22):
            # the version is still the job's
            rows.setdefault(("version", rel), {"pid": None, "host": None, "node": node, "artifacts": [rel],
                                               "nccl_version": res.facts["nccl_version"]})
            continue
        one_host = len({lp.get("host") for lp in procs.values()}) <= 1
        for lp in procs.values():
            lpid, lhost = lp.get("pid"), lp.get("host") or ""
            log_rank = world.get((lhost, lpid))
            m = by_pid.get(lpid)
            if m is not None and not (one_host or lhost in ("", node) or m.rank is None
                                      or (log_rank is not None and m.rank == log_rank)):
                m = None                     # the same pid on another host of a merged log
            if m is None and rel in attach:
                m = by_pid.get(attach[rel])
            if m is None and log_rank is not None and one_host:
                m = by_rank.get(log_rank)
            key = (node, m.pid) if m is not None else (lhost or None, lpid)
            pmap[(rel, lhost, lpid)] = key
            row = rows.setdefault(key, {"pid": key[1], "host": key[0], "node": node})
            row.setdefault("artifacts", []).append(rel)
            row["log_host"] = row.get("log_host") or (lhost or None)
            row["log_pid"] = lpid
            row["nccl_version"] = row.get("nccl_version") or lp.get("version") or res.facts.get("nccl_version")
            row["transport"] = row.get("transport") or lp.get("transport")
            ib = lp.get("ib_devices") or []
            if ib:
                row["ib_devices"] = ",".join(f"{d['name']}:{d['port']}/{d['link_layer']}" for d in ib)
                row["link_layers"] = ",".join(sorted({d["link_layer"] for d in ib}))
            socks = lp.get("socket_interfaces") or []
            if socks:
                row["socket_ifaces"] = ",".join(d["name"] for d in socks)
                row["socket_addrs"] = ",".join(d["address"] for d in socks)
            row["oob_iface"] = row.get("oob_iface") or lp.get("oob_interface")
            if lp.get("oob_address"):
                row["oob_addr"] = row.get("oob_addr") or lp.get("oob_address")
            if lp.get("bootstrap_address"):
                row["bootstrap_addr"] = row.get("bootstrap_addr") or lp.get("bootstrap_address")
            row["interfaces"] = ",".join(lp.get("interfaces") or []) or row.get("interfaces")
            if lp.get("gdr") is not None:
                row["gdr"] = bool(lp["gdr"]) or bool(row.get("gdr"))
            if lp.get("nchannels") is not None:
                row["nchannels"] = max(lp["nchannels"], row.get("nchannels") or 0)
            row.setdefault("log_env", {}).update(lp.get("env") or {})
            ids = (row.get("comm_ids") or "").split(",") + list(lp.get("comm_ids") or [])
            row["comm_ids"] = ",".join(i for i in dict.fromkeys(ids) if i) or None
            row["comms"] = len(lp.get("ranks") or {}) + (row.get("comms") or 0)
            if log_rank is not None:
                row["log_rank"] = log_rank
    for p in bundle.manifest.processes:
        key = (node, p.pid)
        if key in rows or _is_nccl_process(p):
            row = rows.setdefault(key, {"pid": p.pid, "host": node, "node": node})
            row["in_manifest"] = True
            row["local_rank"], row["world_size"] = p.local_rank, p.world_size
            row["libnccl"] = ",".join(p.libnccl) or None
            row["nccl_version"] = row.get("nccl_version") or p.nccl_version
            row["netns"] = p.netns
            row["manifest_env"] = _env_of(p)
    if not rows:
        return empty("nccl_config"), _warnings(bundle, warns, pmap, rows, ranks, node)

    ch = _channel_summary(chans, pmap)
    rg = _ring_summary(rings, pmap)
    wn = _warn_counts(warns, pmap)
    out = []
    for key, r in rows.items():
        env = dict(r.get("log_env") or {})
        env.update(r.get("manifest_env") or {})        # the process's own environment wins
        logged = bool(r.get("artifacts"))
        in_capture = key[0] == node and node is not None and r.get("in_manifest")
        r["rank"] = ranks.get(r["pid"], r.get("log_rank")) if in_capture or key[0] == node else r.get("log_rank")
        r["env"] = json.dumps(env, sort_keys=True)
        r["artifact"] = ",".join(r.pop("artifacts", [])) or None
        r["source"] = "log+manifest" if logged and r.get("in_manifest") else ("log" if logged else "manifest")
        r.update(ch.get(key, {}))
        r.update(rg.get(key, {}))
        r["warnings"] = wn.get(key, 0)
        if r.get("transport") is None and r.get("channel_transports"):
            nets = [t for t in r["channel_transports"].split(",") if t.startswith("NET/")]
            if nets:
                r["transport"] = "IB" if any(t.startswith("NET/IB") for t in nets) else nets[0][4:]
        out.append(r)
    cfg = conform(pd.DataFrame(out), "nccl_config").sort_values(["host", "rank", "pid"], na_position="last")
    return cfg.reset_index(drop=True), _warnings(bundle, warns, pmap, rows, ranks, node)


def _log_world_ranks(comms: pd.DataFrame) -> dict[tuple[str, int], int]:
    """(log host, log pid) -> the process's rank on its largest communicator (its world rank,
    as :func:`.nccl.process_ranks` has it), from its Init lines."""
    if comms is None or comms.empty:
        return {}
    c = comms.assign(_n=pd.to_numeric(comms["nranks"], errors="coerce").fillna(-1),
                     _r=pd.to_numeric(comms["rank"], errors="coerce"), _p=pd.to_numeric(comms["pid"], errors="coerce"),
                     _h=comms["host"].astype("string").fillna("")).dropna(subset=["_r", "_p"])
    c = c.sort_values(["_h", "_p", "_n"], kind="stable").drop_duplicates(["_h", "_p"], keep="last")
    return {(h, int(p)): int(r) for h, p, r in zip(c["_h"], c["_p"], c["_r"])}


def _keys(df: pd.DataFrame, pmap: dict) -> pd.Series:
    """The ``nccl_config`` row key of each log row (artifact, host, pid)."""
    codes, keys = _per_key(df, pmap)
    out = np.empty(len(keys), dtype=object)
    out[:] = keys
    return pd.Series(out[codes], index=df.index, dtype=object)


def _per_key(df: pd.DataFrame, pmap: dict) -> tuple[np.ndarray, list]:
    """(the index of each row's key in the keys, the keys in order of first appearance), each
    key looked up once per distinct (artifact, host, pid): a log has a few processes and up to
    millions of rows."""
    art = df["artifact"].to_numpy()
    host = df["host"].array
    pid = pd.to_numeric(df["pid"], errors="coerce")
    group = np.zeros(len(df), np.int64)
    for col in (art, host, pid.array):       # (artifact, host, pid) numbered by first appearance
        if col is art and len(art) and (art == art[0]).all():
            continue                               # one artifact (a table of one log): no hashing of its name
        codes = pd.factorize(col, use_na_sentinel=False)[0].astype(np.int64)     # NA: a code of its own
        group = pd.factorize(group * (int(codes.max(initial=0)) + 1) + codes)[0].astype(np.int64)
    first = np.flatnonzero(~pd.Series(group).duplicated().to_numpy())      # group g's first row: first[g]
    keys = []
    for a, h, p in zip(art[first].tolist(), host[first].tolist(), pid.iloc[first].tolist()):
        h = "" if is_missing(h) else str(h)        # no host: "" (NA and "" are one key)
        p = np.int64(p) if isinstance(p, int) and -(1 << 63) <= p < (1 << 63) else p   # as iterating gives it
        keys.append(pmap.get((a, h, int(p)) if pd.notna(p) else None, (h or None, p)))
    kcodes, uniq = pd.factorize(pd.Series(keys, dtype=object), sort=False)
    return kcodes[group], list(uniq)


def _distinct_channels(codes: np.ndarray, channel: pd.Series, pick, n: int) -> np.ndarray:
    """How many distinct non-NA channels of the rows ``pick`` each key has."""
    pick = np.asarray(pick, bool) & channel.notna().to_numpy(bool)
    c = pd.factorize(channel.array[pick])[0].astype(np.int64)
    span = int(c.max(initial=0)) + 1
    pairs = pd.unique(codes[pick].astype(np.int64) * span + c)        # (key, channel) once each: hashed, not sorted
    return np.bincount(pairs // span, minlength=n)


def _coded(col: pd.Series, missing: str | None = None) -> tuple[np.ndarray, list]:
    """(each row's code, the distinct values: NA as ``missing``, or None) of a string column,
    hashed once: the tests on its values are made on the distinct ones."""
    codes, uniq = pd.factorize(col.array, use_na_sentinel=False)
    return codes, [missing if is_missing(u) else str(u) for u in uniq]


def _channel_summary(chans: pd.DataFrame, pmap: dict) -> dict:
    if chans.empty:
        return {}
    codes, keys = _per_key(chans, pmap)
    t, tn = _coded(chans["transport"], "?")
    n, nn = _coded(chans["net"])
    g = pd.factorize(codes.astype(np.int64) * len(tn) + t)[0].astype(np.int64)
    g = pd.factorize(g * len(nn) + n)[0]
    first = np.flatnonzero(~pd.Series(g).duplicated().to_numpy())         # (key, transport, net) once each
    kinds: list[set] = [set() for _ in keys]
    for k, ti, ni in zip(codes[first].tolist(), t[first].tolist(), n[first].tolist()):
        kinds[k].add(tn[ti] + ("" if nn[ni] is None else "/" + nn[ni]))
    net = _distinct_channels(codes, chans["channel"], np.array([v == "NET" for v in tn], bool)[t], len(keys))
    gdr = np.bincount(codes, weights=chans["gdrdma"].to_numpy(np.float64, na_value=0.0), minlength=len(keys))
    out = {}
    for i, key in enumerate(keys):
        out[key] = {"channel_transports": ",".join(sorted(kinds[i])), "net_channels": int(net[i]),
                    "gdr_channels": int(gdr[i])}
        if gdr[i] > 0:
            out[key]["gdr"] = True
    return out


def _ring_summary(rings: pd.DataFrame, pmap: dict) -> dict:
    if rings.empty:
        return {}
    codes, keys = _per_key(rings, pmap)
    kc, kn = _coded(rings["kind"])
    is_ring = np.array([v == "ring" for v in kn], bool)[kc]
    nring = _distinct_channels(codes, rings["channel"], is_ring, len(keys))
    ntree = _distinct_channels(codes, rings["channel"], np.array([v in ("tree", "trees") for v in kn], bool)[kc],
                               len(keys))
    out = {key: {"ring_channels": int(nring[i]), "tree_channels": int(ntree[i]), "ring_prev": None,
                 "ring_next": None} for i, key in enumerate(keys)}
    if is_ring.any():             # each process's ring on its lowest channel
        ring = rings[is_ring].assign(_k=codes[is_ring])
        for k, g in ring.groupby("_k", sort=False):
            g = g.sort_values("channel")
            out[keys[k]].update(ring_prev=g["prev"].iloc[0], ring_next=g["next"].iloc[0])
    return out


def _warn_counts(warns: pd.DataFrame, pmap: dict) -> dict:
    if warns.empty:
        return {}
    return {k: int(v) for k, v in warns.assign(key=_keys(warns, pmap)).groupby("key", sort=False).size().items()}


def _warnings(bundle, warns: pd.DataFrame, pmap: dict, rows: dict, ranks: dict, node) -> pd.DataFrame:
    """``nccl_warnings`` of one bundle: each line's own host (the one its prefix names; NA where
    it names none: joined across files by the model), its process and rank where known, the
    capture that holds it (``node``), and its class (:mod:`.nccl_errors`)."""
    if warns.empty:
        return empty("nccl_warnings")
    w = warns.rename(columns={"line": "log_line"}).copy()
    keys = _keys(warns, pmap)
    w["log_pid"] = w["pid"]
    w["log_host"] = w["host"].astype("string").replace("", pd.NA)
    w["pid"] = [k[1] for k in keys]
    w["node"] = node
    # the capture's own processes keep the capture's name (their rows join the tracer's);
    # every other line keeps the host it names
    own = [k[0] == node and node is not None for k in keys]
    w["host"] = w["log_host"].fillna(pd.Series([node if o else (k[0] or None) for o, k in zip(own, keys)],
                                               index=w.index, dtype="string"))
    w["rank"] = [(ranks.get(k[1]) if o else None) for o, k in zip(own, keys)]
    w["rank"] = pd.to_numeric(w["rank"], errors="coerce").astype("Float64").fillna(
        pd.Series([rows.get(k, {}).get("log_rank") for k in keys], index=w.index, dtype="Float64"))
    w["class"] = classify(w["message"], w.get("src_file"))
    return conform(w, "nccl_warnings")


# --------------------------------------------------------------------------- host facts

def host_facts(bundle, arts) -> pd.DataFrame:
    row: dict = {"host": bundle.host, "kernel": bundle.manifest.kernel}
    ports = _ib_ports(arts)
    ib_names = sorted({p.split("/")[0] for p in ports})
    # NCCL saw IB devices even where the capture had no ib/ (e.g. the collector was not run)
    for _, res in arts.of("nccl_debug"):
        for lp in (res.facts.get("processes") or {}).values():
            ib_names += [d["name"] for d in lp.get("ib_devices") or [] if d["name"] not in ib_names]
    coll = bundle.manifest.collectors
    said_none = any(n.startswith("ib-counters") and c.status in ("skipped", "failed") and c.reason
                    and "no infiniband" in c.reason.lower() for n, c in coll.items())
    row["ib_present"] = True if ib_names else (False if said_none else None)
    row["ib_devices"] = ",".join(sorted(set(ib_names))) or None
    row["ib_ports"] = len(ports) or None
    active = [p for p, a in ports.items() if "ACTIVE" in str(a.get("state", "")).upper()]
    row["ib_ports_active"] = len(active) if ports else None
    row["ib_link_layers"] = ",".join(sorted({str(a["link_layer"]) for a in ports.values() if a.get("link_layer")})) \
        or None
    rates = [float(m[1]) for a in ports.values() if (m := RATE_RE.search(str(a.get("rate", ""))))]
    row["ib_rate_gbps"] = max(rates) if rates else None
    ifaces, types = _interfaces(bundle)
    row["interfaces"] = ",".join(ifaces) or None
    row["link_types"] = ",".join(types) or None
    row["nvidia_peermem"] = _peermem(bundle)
    row["gpus"] = _gpus(bundle)
    xid, alerts = _dmesg(bundle)
    row["xid_count"] = len(xid) if xid is not None else None
    row["xid_first"] = xid[0] if xid else None
    row["kernel_alerts"] = alerts
    return conform(pd.DataFrame([row]), "host_facts")


def _ib_ports(arts) -> dict[str, dict]:
    """device/port -> attributes, of the ib/ tree parsed with the bundle's artefacts."""
    ports: dict[str, dict] = {}
    for _, res in arts.of("ib_counters"):
        ports.update(res.facts.get("ports") or {})
        df = res.tables.get("ib_counters")
        if df is not None and len(df):      # ports known only from counter files (perfquery gives no attributes)
            for dev, port in df[["device", "port"]].drop_duplicates().itertuples(index=False):
                ports.setdefault(f"{dev}/{port}", {})
    return ports


def _interfaces(bundle) -> tuple[list[str], list[str]]:
    names, types = [], set()
    for rel, path in bundle.files("sys/**/ip-link*.json"):
        try:
            doc = json.loads(path.read_text(errors="replace") or "[]")
        except ValueError:
            bundle.problems.append(f"{rel}: not valid JSON (ip -j link)")
            continue
        for link in doc if isinstance(doc, list) else []:
            if isinstance(link, dict) and isinstance(link.get("ifname"), str) and link["ifname"] not in LOOPBACK:
                name = link["ifname"]
                if name not in names:
                    names.append(name)
                if isinstance(link.get("link_type"), str):
                    types.add(link["link_type"])
    return names, sorted(types)


def _peermem(bundle):
    p = bundle.path("sys/lsmod.txt")
    if p is None or p.stat().st_size == 0:
        return None
    mods = {ln.split()[0] for ln in p.read_text(errors="replace").splitlines() if ln.strip()}
    return bool({"nvidia_peermem", "nv_peer_mem"} & mods)


def _gpus(bundle):
    for _, path in bundle.files("sys/nvidia-smi*.txt"):
        m = re.search(r"(?m)^Attached GPUs\s*:\s*(\d+)", path.read_text(errors="replace"))
        if m:
            return int(m[1])
    return None


def _dmesg(bundle):
    files = list(bundle.files("logs/dmesg*.txt"))
    if not files:
        return None, None
    xid, alerts = [], 0
    for rel, path in files:
        lines = path.read_text(errors="replace").splitlines()
        xid += [ln.strip() for ln in lines if XID_RE.search(ln) and ln.strip() not in xid]
        if rel.endswith("-xid.txt"):
            alerts += sum(1 for ln in lines if ln.strip())
    return xid, alerts
