"""``tcp_events``, ``packets`` and ``flows``, attributed to processes and ranks.

Attribution (DESIGN: ``tcp_retransmit_skb`` fires in softirq context, so the current pid
is not the owner):

1. An *endpoint table* ``(addr, port) -> owning pid`` is gathered from every source the
   bundle has: ``ss -tinp`` snapshots, the manifest's per-process sockets (alive at the
   end), and the tracer's ``sock_state`` transitions made in process context
   (CLOSE->SYN_SENT from connect(), CLOSE->LISTEN from listen()) whose socket (``sk``
   within its network namespace) later shows its bound address. Accepted connections
   share the listener's local (addr, port), so they are covered by the LISTEN row; a
   wildcard listener (0.0.0.0) is expanded to the addresses seen in its namespace.
   Keys claimed by two different processes are dropped as ambiguous.
2. An event's owner is the endpoint ``(saddr, sport)`` (for pcap verdicts: the packet's
   sender); failing that, for tracer events, the only traced rank in the event's network
   namespace. Its peer rank is the owner of ``(daddr, dport)``, failing that the only
   rank with an endpoint on ``daddr``.
3. The collective in flight: an as-of join of the event time on the owning rank's
   ``nccl_events`` (the last collective entered at or before it, and whether it had
   completed by then).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..parsers.ss import SsParser
from ..tcp.classes import RESEND_EVENTS
from .events import events_frame, utc_of
from .schema import conform, empty

BPF_TCP_EVENTS = ("tcp_retransmit_skb", "tcp_send_reset", "tcp_receive_reset")
# pcap verdicts that become tcp_events rows (window_update, keep_alive... are noise here)
PCAP_EVENTS = ("retransmission", "fast_retransmission", "spurious_retransmission", "out_of_order", "lost_segment",
               "ack_lost_segment", "duplicate_ack", "zero_window", "zero_window_probe", "window_full", "rst")
PACKET_VERDICTS = ("retransmission", "fast_retransmission", "spurious_retransmission", "out_of_order",
                   "lost_segment", "ack_lost_segment", "duplicate_ack", "zero_window", "zero_window_probe",
                   "zero_window_probe_ack", "window_full", "window_update", "keep_alive", "keep_alive_ack",
                   "reused_ports", "rst")
WILDCARD = ("0.0.0.0", "::", "*", "")


# --------------------------------------------------------------------------- endpoints

def endpoint_table(bundle, events: list[dict]) -> pd.DataFrame:
    """Columns host, netns, addr, port, pid, source; one row per (addr, port) owner claim."""
    parts = [_endpoints_from_sock_state(events), _endpoints_from_manifest(bundle), _endpoints_from_ss(bundle)]
    ep = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else \
        pd.DataFrame(columns=["netns", "addr", "port", "pid", "source"])
    ep["host"] = bundle.host
    if ep.empty:
        return ep
    ep["port"] = pd.to_numeric(ep["port"], errors="coerce")
    ep["pid"] = pd.to_numeric(ep["pid"], errors="coerce")
    ep = ep.dropna(subset=["port", "pid"])
    ep = ep[ep["port"] > 0]
    # wildcard listeners: one row per address seen in their namespace
    wild = ep["addr"].isin(WILDCARD)
    if wild.any():
        seen = _netns_addresses(events, ep[~wild])
        w = ep[wild].drop(columns="addr").merge(seen, on="netns", how="inner")
        ep = pd.concat([ep[~wild], w], ignore_index=True)
    ep["port"] = ep["port"].astype("int64")
    ep["pid"] = ep["pid"].astype("int64")
    return ep.drop_duplicates(["addr", "port", "pid"]).reset_index(drop=True)


def _endpoints_from_sock_state(events: list[dict]) -> pd.DataFrame:
    ss = events_frame(events, "sock_state")
    need = {"sk", "netns", "saddr", "sport", "oldstate", "newstate", "pid", "t"}
    if ss.empty or not need <= set(ss.columns):
        return pd.DataFrame()
    ss = ss.sort_values(["netns", "sk", "t"], kind="stable")
    # one socket life per CLOSE->x transition (kernel socket addresses are reused)
    ss["life"] = (ss["oldstate"] == "CLOSE").astype(int).groupby([ss["netns"], ss["sk"]]).cumsum()
    key = ["netns", "sk", "life"]
    owner = ss[(ss["oldstate"] == "CLOSE") & ss["newstate"].isin(["SYN_SENT", "LISTEN"]) & (ss["pid"] > 0)]
    owner = owner.drop_duplicates(key)[key + ["pid"]]
    bound = ss[ss["sport"] > 0].drop_duplicates(key)[key + ["saddr", "sport"]]
    m = owner.merge(bound, on=key, how="inner")
    return pd.DataFrame({"netns": m["netns"], "addr": m["saddr"], "port": m["sport"], "pid": m["pid"],
                         "source": "bpf"})


def _endpoints_from_manifest(bundle) -> pd.DataFrame:
    rows = [{"netns": p.netns_inode, "addr": s.saddr, "port": s.sport, "pid": p.pid, "source": "manifest"}
            for p in bundle.manifest.processes for s in p.sockets]
    return pd.DataFrame(rows)


def _endpoints_from_ss(bundle) -> pd.DataFrame:
    labels = {n.label: n.inode for n in bundle.manifest.netns}
    frames = []
    for rel, path in bundle.files("sys/**/ss*"):
        if path.stat().st_size == 0:
            continue
        res = SsParser.parse(path)
        bundle.problems.extend(w for w in res.warnings[:3])
        df = res.tables.get("sockets")
        if df is None or df.empty:
            continue
        df = df.dropna(subset=["pid", "local_port"])
        label = rel.split("/")[1] if rel.count("/") >= 2 else None
        frames.append(pd.DataFrame({"netns": labels.get(label), "addr": df["local_addr"].astype(str),
                                    "port": df["local_port"].astype("int64"), "pid": df["pid"].astype("int64"),
                                    "source": "ss"}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _netns_addresses(events: list[dict], ep: pd.DataFrame) -> pd.DataFrame:
    """netns -> local addresses seen in it (tracer socket events, concrete endpoints)."""
    parts = [ep[["netns", "addr"]]]
    for kind in ("sock_state",) + BPF_TCP_EVENTS:
        f = events_frame(events, kind)
        if len(f) and {"netns", "saddr"} <= set(f.columns):
            parts.append(f[["netns", "saddr"]].rename(columns={"saddr": "addr"}))
    a = pd.concat(parts, ignore_index=True).dropna()
    a = a[~a["addr"].isin(WILDCARD)]
    return a.drop_duplicates().reset_index(drop=True)


class Attribution:
    """Lookups built once from all bundles' endpoint tables and pid -> rank maps."""

    def __init__(self, endpoints: pd.DataFrame, ranks: pd.DataFrame, netns_pids: pd.DataFrame):
        # endpoints: host, addr, port, pid; ranks: host, pid, rank; netns_pids: host, netns, pid
        ep = endpoints.merge(ranks, on=["host", "pid"], how="left") if len(endpoints) else \
            pd.DataFrame(columns=["host", "addr", "port", "pid", "rank"])
        claims = ep.groupby(["addr", "port"])["pid"].transform("nunique") if len(ep) else pd.Series(dtype=int)
        self.endpoints = ep[claims == 1].drop_duplicates(["addr", "port"])[["addr", "port", "host", "pid", "rank"]] \
            if len(ep) else ep
        r = ep.dropna(subset=["rank"]).drop_duplicates(["addr", "rank"])
        nr = r.groupby("addr")["rank"].transform("nunique") if len(r) else pd.Series(dtype=int)
        self.addr_rank = r[nr == 1].drop_duplicates("addr")[["addr", "rank"]] if len(r) else \
            pd.DataFrame(columns=["addr", "rank"])
        npids = netns_pids.merge(ranks, on=["host", "pid"], how="inner") if len(netns_pids) else netns_pids
        if len(npids):
            n = npids.groupby(["host", "netns"])["pid"].transform("nunique")
            self.netns_owner = npids[n == 1].drop_duplicates(["host", "netns"])[["host", "netns", "pid", "rank"]]
        else:
            self.netns_owner = pd.DataFrame(columns=["host", "netns", "pid", "rank"])
        # the lookup tables as the queries below read them (built here once, not per query)
        e = self.endpoints.astype({"addr": str})
        self._endpoints = _Table(e.assign(port=pd.to_numeric(e["port"])), ("pid", "rank"), by_port=True)
        self._addr_rank = _Table(self.addr_rank.astype({"addr": str}), ("rank",), by_port=False)

    def owner(self, addr, port: pd.Series) -> pd.DataFrame:
        """(pid, rank) owning each (addr, port); NA where unknown. ``addr``: a column, or its
        :class:`Addresses` when several lookups read it."""
        return self._endpoints.find(Addresses.of(addr), port)

    def rank_of_addr(self, addr) -> pd.Series:
        return self._addr_rank.find(Addresses.of(addr))["rank"]

    def peer_rank(self, addr, port: pd.Series) -> pd.Series:
        addr = Addresses.of(addr)
        exact = self.owner(addr, port)["rank"]
        if not len(exact):
            return exact
        by_addr = self.rank_of_addr(addr)
        if by_addr.dtype == object:     # no address known: NaN, not objects, beside float64 NaN
            by_addr = pd.to_numeric(by_addr, errors="coerce")
        return exact.fillna(by_addr)

    def netns_fallback(self, host, netns: pd.Series) -> pd.DataFrame:
        """(pid, rank) of the only traced rank in each event's (host, netns); ``host``: one
        name or a column of them."""
        host = host.to_numpy() if isinstance(host, pd.Series) else host
        q = pd.DataFrame({"host": host, "netns": pd.to_numeric(netns, errors="coerce").to_numpy()})
        o = self.netns_owner.assign(netns=pd.to_numeric(self.netns_owner["netns"], errors="coerce"))
        return q.merge(o, on=["host", "netns"], how="left")[["pid", "rank"]]


class Addresses:
    """An address column as codes into its distinct values (as text, as the lookup tables
    hold them): made once, then each lookup matches the few distinct addresses, not every
    row (10^5-10^6 flagged packets at fleet scale, a few hundred addresses)."""

    __slots__ = ("codes", "uniques")

    def __init__(self, addr):
        self.codes, self.uniques = pd.factorize(pd.Series(addr).astype(str), use_na_sentinel=False)

    @classmethod
    def of(cls, addr) -> "Addresses":
        return addr if isinstance(addr, cls) else cls(addr)

    def ids(self, vocabulary: pd.Index) -> np.ndarray:
        """Each row's position in ``vocabulary`` (-1: not there)."""
        return vocabulary.get_indexer(self.uniques)[self.codes]


_PORTS = 65537     # port keys: 0-65535, and one for an unknown port (NA matches NA, as in a join)


def _keys(address_ids: np.ndarray, port) -> np.ndarray:
    """One integer a (address, port) key; -1 (no match) for an address not in the table or a
    port that is no port number."""
    p = pd.to_numeric(pd.Series(port), errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    valid = (p >= 0) & (p < _PORTS - 1) & (p == np.floor(p))
    p = np.where(np.isnan(p), _PORTS - 1, np.where(valid, p, -1)).astype("int64")
    return np.where((address_ids >= 0) & (p >= 0), address_ids * _PORTS + p, -1)


class _Table:
    """A one-to-one lookup on ``addr`` (and ``port``) of a frame with unique keys: what a left
    join on those keys gives for the ``values`` columns, NA where a key is not there."""

    def __init__(self, frame: pd.DataFrame, values: tuple[str, ...], by_port: bool):
        self.by_port = by_port
        self.vocabulary = pd.Index(pd.unique(frame["addr"]))
        key = self.vocabulary.get_indexer(frame["addr"]).astype("int64")
        if by_port:
            key = _keys(key, frame["port"])
        # one row a key (a join would repeat the rows); none for a key no query can have
        first = ~pd.Index(key).duplicated() & (key >= 0)
        self.keys = pd.Index(key[first])
        self.values = {c: frame[c].array[first] for c in values}

    def find(self, addr: Addresses, port=None) -> pd.DataFrame:
        key = addr.ids(self.vocabulary).astype("int64")
        if self.by_port:
            key = _keys(key, port)
        at = self.keys.get_indexer(key)
        return pd.DataFrame({c: pd.api.extensions.take(v, at, allow_fill=True) for c, v in self.values.items()})


def rank_table(pid_ranks: dict[str, dict[int, int]]) -> pd.DataFrame:
    """(host, pid, rank) of every host's :func:`.nccl.process_ranks`, in one frame (one per
    host and a concat cost ~2 ms a host: 0.1 s at 64 hosts)."""
    return pd.DataFrame([(h, pid, rank) for h, r in pid_ranks.items() for pid, rank in r.items()],
                        columns=["host", "pid", "rank"])


def netns_pid_table(bundle) -> pd.DataFrame:
    rows = [{"host": bundle.host, "netns": p.netns_inode, "pid": p.pid} for p in bundle.manifest.processes
            if p.netns_inode is not None]
    return pd.DataFrame(rows, columns=["host", "netns", "pid"])


# --------------------------------------------------------------------------- tracer events

def bpf_tcp_frame(bundle, events: list[dict]) -> pd.DataFrame | None:
    """The tracer's kernel TCP events of one bundle (the per-host half of :func:`bpf_tcp_events`):
    those of the job's network namespaces, in UTC, with host and capture label, not yet
    attributed; None when there are none."""
    frames = [events_frame(events, k) for k in BPF_TCP_EVENTS]
    frames = [f for f in frames if len(f)]
    if not frames:
        return None
    ev = pd.concat(frames, ignore_index=True)
    for c in ("saddr", "daddr", "sport", "dport", "state", "netns", "pid"):
        if c not in ev.columns:
            ev[c] = None
    ev = ev.dropna(subset=["t"])
    # tracepoints fire for every namespace of the machine: leave out those of namespaces
    # the capture did not attribute to the job (other containers, other labs)
    known = {n.inode for n in bundle.manifest.netns}
    if known:
        ns = pd.to_numeric(ev["netns"], errors="coerce").fillna(0)
        foreign = (ns != 0) & ~ns.isin(known)
        if foreign.any():
            bundle.problems.append(f"bpf: {int(foreign.sum())} kernel TCP event(s) from network namespaces "
                                   "outside the job left out")
            ev = ev[~foreign.to_numpy()]
    if ev.empty:
        return None
    labels = {n.inode: n.label for n in bundle.manifest.netns}
    state = ev["state"].where(ev.get("sk", pd.Series(None, index=ev.index)).astype(str) != "0x0")
    return pd.DataFrame({
        "timestamp_ns": utc_of(bundle.clock, ev["t"]).to_numpy(), "event": ev["ev"].to_numpy(), "source": "bpf",
        "saddr": ev["saddr"].to_numpy(), "daddr": ev["daddr"].to_numpy(), "sport": ev["sport"].to_numpy(),
        "dport": ev["dport"].to_numpy(), "state": state.to_numpy(), "host": bundle.host,
        "capture": ev["netns"].map(labels).to_numpy(), "event_pid": ev["pid"].to_numpy(),
        "netns": ev["netns"].to_numpy()})


def bpf_tcp_events(ev: pd.DataFrame, attr: Attribution) -> pd.DataFrame:
    """``tcp_events`` rows of the hosts' :func:`bpf_tcp_frame` rows, attributed to processes and ranks."""
    if ev is None or ev.empty:
        return empty("tcp_events")
    ev = ev.reset_index(drop=True)
    own = attr.owner(ev["saddr"], ev["sport"])
    fb = attr.netns_fallback(ev["host"], ev["netns"])
    ev["pid"] = own["pid"].fillna(fb["pid"]).to_numpy()
    ev["rank"] = own["rank"].where(own["pid"].notna(), fb["rank"]).to_numpy()
    ev["peer_rank"] = attr.peer_rank(ev["daddr"], ev["dport"]).to_numpy()
    return conform(ev, "tcp_events")


# --------------------------------------------------------------------------- pcaps

def verdict_rows(p: pd.DataFrame | None, host: str, rel: str) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(packets rows, one (packet, verdict) row per PCAP_EVENTS verdict) of one capture's
    flagged packets (the engine's output), not yet attributed to processes or ranks."""
    if p is None or not len(p):
        return None, None
    pk = pd.DataFrame({"timestamp_ns": p["time_epoch_ns"].to_numpy(), "capture": rel, "host": host,
                       "frame": p["frame"].to_numpy(), "stream": p["stream"].to_numpy(),
                       "src": p["src"].astype(str).to_numpy(), "sport": p["sport"].to_numpy(),
                       "dst": p["dst"].astype(str).to_numpy(), "dport": p["dport"].to_numpy(),
                       "seq_rel": p["seq_rel"].to_numpy(), "ack_rel": p["ack_rel"].to_numpy(),
                       "len": p["len"].to_numpy(), "seq_raw": p["seq_raw"].to_numpy(),
                       "tcp_flags": p["tcp_flags"].to_numpy(), "window": p["window"].to_numpy(),
                       "duplicate_ack_num": p["duplicate_ack_num"].to_numpy(),
                       "rto_ns": p["rto_ns"].to_numpy()})
    flags = np.stack([p[v].to_numpy(dtype=np.uint8) for v in PACKET_VERDICTS], axis=1).astype(bool)
    names = np.array(PACKET_VERDICTS, dtype=object)
    pk["verdicts"] = [",".join(names[row]) for row in flags]   # flagged rows only: small
    sel = [PACKET_VERDICTS.index(v) for v in PCAP_EVENTS]
    rows, cols = np.nonzero(flags[:, sel])
    if not len(rows):
        return pk, None
    e = pk.iloc[rows].reset_index(drop=True)
    e["event"] = np.array(PCAP_EVENTS, dtype=object)[cols]
    return pk, e


def attribute_pcaps(parts: list, attr: Attribution) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(tcp_events rows from pcap verdicts, packets, flows) of the hosts'
    :class:`~forensics.model.hosts.PcapPart` (each row with its host), attributed to
    processes and ranks: one lookup per table for every host together."""
    packets_parts = [f for p in parts for f in p.packets]
    event_parts = [f for p in parts for f in p.events]
    flow_parts = [f for p in parts for f in p.flows]
    # packets
    if packets_parts:
        pk = pd.concat(packets_parts, ignore_index=True)
        src = Addresses(pk["src"])
        pk["src_rank"] = attr.owner(src, pk["sport"])["rank"].to_numpy()
        pk["dst_rank"] = attr.peer_rank(pk["dst"], pk["dport"]).to_numpy()
        pk["src_rank"] = pk["src_rank"].fillna(pd.Series(attr.rank_of_addr(src).to_numpy()))
        packets = conform(pk, "packets")
    else:
        packets = empty("packets")
    # tcp events from verdicts: the packet's sender owns the event
    if event_parts:
        e = pd.concat(event_parts, ignore_index=True)
        src = Addresses(e["src"])
        own = attr.owner(src, e["sport"])
        ev = pd.DataFrame({"timestamp_ns": e["timestamp_ns"], "event": e["event"], "source": "pcap",
                           "saddr": e["src"], "daddr": e["dst"], "sport": e["sport"], "dport": e["dport"],
                           "state": None, "host": e["host"], "pid": own["pid"].to_numpy(),
                           "rank": own["rank"].fillna(pd.Series(attr.rank_of_addr(src).to_numpy())).to_numpy(),
                           "peer_rank": attr.peer_rank(e["dst"], e["dport"]).to_numpy(),
                           "capture": e["capture"], "stream": e["stream"], "frame": e["frame"]})
        pcap_events = conform(ev, "tcp_events")
    else:
        pcap_events = empty("tcp_events")
    # flows
    if flow_parts:
        fl = pd.concat(flow_parts, ignore_index=True)
        orig, resp = Addresses(fl["orig_addr"]), Addresses(fl["resp_addr"])
        o = attr.owner(orig, fl["orig_port"])
        r = attr.owner(resp, fl["resp_port"])
        fl["pid"], fl["peer_pid"] = o["pid"].to_numpy(), r["pid"].to_numpy()
        fl["rank"] = o["rank"].fillna(pd.Series(attr.rank_of_addr(orig).to_numpy())).to_numpy()
        fl["peer_rank"] = r["rank"].fillna(pd.Series(attr.rank_of_addr(resp).to_numpy())).to_numpy()
        flows = conform(fl, "flows")
    else:
        flows = empty("flows")
    return pcap_events, packets, flows


# --------------------------------------------------------------------------- collective in flight

def collective_in_flight(tcp: pd.DataFrame, nccl: pd.DataFrame) -> pd.DataFrame:
    """Fill coll_* columns: as-of join of each event on its owning rank's collectives."""
    if tcp.empty or nccl.empty:
        return tcp
    tcp = tcp.copy()
    ok = tcp["rank"].notna() & tcp["timestamp_ns"].notna()
    left = pd.DataFrame({"row": np.flatnonzero(ok.to_numpy()),
                         "rank": tcp.loc[ok, "rank"].astype("int64").to_numpy(),
                         "t": tcp.loc[ok, "timestamp_ns"].astype("int64").to_numpy()}).sort_values("t", kind="stable")
    n = nccl.dropna(subset=["rank", "timestamp_ns"])
    right = pd.DataFrame({"rank": n["rank"].astype("int64").to_numpy(),
                          "t": n["timestamp_ns"].astype("int64").to_numpy(),
                          "coll_comm_id_hash": n["comm_id_hash"].to_numpy(),
                          "coll_op_count": n["op_count"].to_numpy(), "coll_op": n["op"].to_numpy(),
                          "end": pd.array(n["end_ns"], dtype="Int64")}).sort_values("t", kind="stable")
    m = pd.merge_asof(left, right, on="t", by="rank", direction="backward").sort_values("row")
    rows = m["row"].to_numpy()
    idx = tcp.index[rows]
    tcp.loc[idx, "coll_comm_id_hash"] = m["coll_comm_id_hash"].to_numpy()
    tcp.loc[idx, "coll_op_count"] = pd.array(m["coll_op_count"].to_numpy(), dtype="Int64")
    tcp.loc[idx, "coll_op"] = m["coll_op"].to_numpy()
    has = m["coll_op"].notna().to_numpy()
    # integer epoch ns (a float64 rounds them to 256 ns): no end yet, or the end not before t
    in_flight = has & (m["end"].isna() | (m["end"] >= m["t"])).fillna(False).to_numpy(dtype=bool)
    tcp.loc[idx, "coll_in_flight"] = pd.array(np.where(has, in_flight, None), dtype="boolean")
    return tcp


# --------------------------------------------------------------------------- D-SACKed resends

# a connection's resends are spurious when its peer D-SACKed at least this share of them: a
# D-SACK is the receiver saying "I had this already". One D-SACK block can cover several
# resent segments, so all-spurious connections count fewer D-SACKs than resends; a lossy
# link's D-SACKs are its tail-loss probes that found the data there, a few percent of its resends
DSACK_SHARE = 0.5


def dsacked_connections(sockets: pd.DataFrame | None) -> pd.DataFrame:
    """Per sending endpoint pair seen in ``ss`` (columns saddr, sport, daddr, dport: the
    socket's local and peer endpoints), ``resent`` and ``dsacks``: what its counters grew by
    while the capture watched (the last sample less the start snapshot's; a connection the
    start snapshot did not hold counts from its open), and ``spurious``: its peer D-SACKed
    at least :data:`DSACK_SHARE` of its resends, so the data it resent had arrived (a late
    ACK: the receiver's host was slow to answer, or the sender's timer fired early)."""
    cols = ["saddr", "sport", "daddr", "dport", "resent", "dsacks", "spurious"]
    need = {"local_addr", "local_port", "peer_addr", "peer_port", "phase", "retrans_total", "dsack_dups"}
    if sockets is None or sockets.empty or not need <= set(sockets.columns):
        return pd.DataFrame(columns=cols)
    s = pd.DataFrame({"saddr": sockets["local_addr"].astype("string"), "daddr": sockets["peer_addr"].astype("string"),
                      "sport": pd.to_numeric(sockets["local_port"], errors="coerce"),
                      "dport": pd.to_numeric(sockets["peer_port"], errors="coerce"),
                      "start": (sockets["phase"] == "start").fillna(False).to_numpy(dtype=bool),
                      "resent": pd.to_numeric(sockets["retrans_total"], errors="coerce").fillna(0),
                      "dsacks": pd.to_numeric(sockets["dsack_dups"], errors="coerce").fillna(0)})
    s = s.dropna(subset=["saddr", "daddr", "sport", "dport"])
    if s.empty:
        return pd.DataFrame(columns=cols)
    key = ["saddr", "sport", "daddr", "dport"]
    last = s.groupby(key)[["resent", "dsacks"]].max()
    first = s[s["start"]].groupby(key)[["resent", "dsacks"]].min().reindex(last.index).fillna(0)
    grew = (last - first).clip(lower=0).reset_index()
    grew["spurious"] = (grew["resent"] > 0) & (grew["dsacks"] >= DSACK_SHARE * grew["resent"])
    grew["sport"] = grew["sport"].astype("int64")
    grew["dport"] = grew["dport"].astype("int64")
    return grew[cols]


def mark_dsacked(tcp: pd.DataFrame, sockets: pd.DataFrame | None) -> pd.DataFrame:
    """``tcp_events`` with ``dsacked`` filled on the resends (the tracer's retransmits, a
    pcap's retransmission verdicts) of the connections :func:`dsacked_connections` calls
    spurious, False on the other resends of connections ss saw, NULL where ss did not see
    the sender's socket. The event keeps its name (what its source said); its class
    (:func:`forensics.tcp.classes.classify`) becomes ``spurious``."""
    if tcp.empty:
        return tcp
    conns = dsacked_connections(sockets)
    resend = tcp["event"].isin(RESEND_EVENTS).to_numpy()
    if conns.empty or not resend.any():
        return tcp
    sub = tcp.loc[resend]
    hit = _endpoints(sub).merge(_endpoints(conns).assign(spurious=conns["spurious"].to_numpy(dtype=bool)),
                                on=["saddr", "sport", "daddr", "dport"], how="left")["spurious"]
    tcp = tcp.copy()
    tcp.loc[sub.index, "dsacked"] = pd.array(hit.to_numpy(dtype=object), dtype="boolean")
    return tcp


def _endpoints(df: pd.DataFrame) -> pd.DataFrame:
    """saddr, sport, daddr, dport of ``df``'s rows, typed alike for a join (text, Int64)."""
    return pd.DataFrame({"saddr": df["saddr"].astype("string").to_numpy(),
                         "sport": pd.to_numeric(df["sport"], errors="coerce").astype("Int64").to_numpy(),
                         "daddr": df["daddr"].astype("string").to_numpy(),
                         "dport": pd.to_numeric(df["dport"], errors="coerce").astype("Int64").to_numpy()})
