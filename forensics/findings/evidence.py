"""Evidence shared by the detectors: collective windows, TCP trouble per link, who is who.

Everything here is a DataFrame operation over the model's tables (no per-event Python
loops): the detectors in ``network.py``, ``straggler.py`` and ``hang.py`` combine these
pieces and phrase the verdict.

Counting rule for TCP trouble: one lost segment shows up several times in
``tcp_events`` (the kernel tracepoint on the sender, the sender's pcap, the receiver's
pcap when the retransmission got through). Per directed connection and class of
event, the count is the largest count any *one* source saw (one pcap, or the tracer),
not the sum, so a link is not blamed twice for being captured on both ends.

Scores (``Finding.score``, the order within a severity): these detectors use the
estimated seconds of collective time the problem cost (slow collectives' excess over
the clean baseline, a straggler's total lateness); a hang scores 1e6 plus the seconds
it lasted, and a reset that broke collectives 2e6 (it is the cause of the hang that
follows it, so it goes first).

Runnable SQL (``Finding.sql``): it computes the finding's evidence rows (same rows, order
and column names; :func:`trouble_sql`, :func:`dedup_sql` and ``WORLD_RANK_SQL`` mirror the
DataFrame code here), and every value taken from a bundle (comm ids, hosts, devices, test
names) enters it only through :func:`sql_str` / :func:`sql_int` / :func:`sql_list`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..model.nccl import world_ranks
from ..model.schema import empty
# tcp_events.event -> class of trouble: the one table (forensics/tcp/classes.py) the report uses too
from ..tcp.classes import (DATA_LOSS_CLASSES, EVENT_CLASS, LOSS_CLASSES, classify, dense_codes,  # noqa: F401
                           subsumed_sql)
from .ranks import rank_hosts

COUNT_COLUMNS = {"retransmission": "retransmissions", "duplicate_ack": "duplicate_acks",
                 "lost_segment": "lost_segments", "reset": "resets"}


def sql_str(v) -> str:
    """A value as a SQL literal for the runnable SQL a finding carries: numbers (ints,
    numpy integers) via ``int()``, anything else as a single-quoted string with every
    ``'`` doubled (bundle text such as ``0x58cf' OR '1'='1`` stays one literal). A NUL
    byte, which DuckDB cannot take inside a literal, is spliced in with ``chr(0)``."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return str(int(v))
    text = "'" + str(v).replace("'", "''") + "'"
    return text.replace("\x00", "' || chr(0) || '")


def sql_int(v) -> str:
    """An integer for SQL (raises on anything that is not one)."""
    return str(int(v))


def sql_list(values) -> str:
    """Values as a comma-separated list of SQL literals (see :func:`sql_str`)."""
    return ", ".join(sql_str(v) for v in values)


# --------------------------------------------------------------------------- who is who

@dataclass
class RankInfo:
    host: str | None
    addr: str | None

    def label(self, rank: int) -> str:
        parts = [p for p in (self.host, self.addr) if p]
        return f"rank {rank} ({', '.join(parts)})" if parts else f"rank {rank}"


def rank_directory(ctx) -> dict[int, RankInfo]:
    """Global rank -> host (its own name where the logs say it, else its capture's) and the
    address its TCP connections use (the most frequent one)."""
    return ctx.memo("rank_directory", lambda: _rank_directory(ctx))


def _rank_directory(ctx) -> dict[int, RankInfo]:
    n = ctx.table("nccl_events")
    hosts: dict[int, str] = {}
    if len(n):
        # per rank its most frequent host (the first by name of equals, as Series.mode): counted,
        # not a Python function per rank (512 ranks: half a second)
        h = n.dropna(subset=["rank", "host"])[["rank", "host"]].astype({"rank": "int64", "host": str})
        h = h.groupby(["rank", "host"]).size().reset_index(name="n")
        h = h.sort_values(["rank", "n", "host"], ascending=[True, False, True]).drop_duplicates("rank")
        hosts = dict.fromkeys(n["rank"].dropna().astype("int64").unique().tolist())
        hosts.update(zip(h["rank"].tolist(), h["host"].tolist()))
    addr_parts = []
    f = ctx.table("flows")
    if len(f):
        addr_parts.append(pd.DataFrame({"rank": f["rank"], "addr": f["orig_addr"]}))
        addr_parts.append(pd.DataFrame({"rank": f["peer_rank"], "addr": f["resp_addr"]}))
    t = ctx.table("tcp_events")
    if len(t):
        addr_parts.append(pd.DataFrame({"rank": t["rank"], "addr": t["saddr"]}))
    addrs: dict[int, str] = {}
    if addr_parts:
        a = pd.concat(addr_parts, ignore_index=True).dropna()
        if len(a):
            a = a.astype({"rank": "int64", "addr": str})
            top = a.groupby(["rank", "addr"]).size().reset_index(name="n").sort_values(["rank", "n"],
                                                                                      ascending=[True, False])
            addrs = dict(zip(top.drop_duplicates("rank")["rank"], top.drop_duplicates("rank")["addr"]))
    # a rank's own host name (NCCL's log prefix) over the capture's: several ranks' pods or
    # namespaces captured on one node keep their names (findings.ranks.rank_hosts)
    own = {r: h for r, (h, _) in rank_hosts(ctx).items() if h}
    return {r: RankInfo(own.get(r) or hosts.get(r), addrs.get(r)) for r in sorted(set(hosts) | set(addrs) | set(own))}


def label(directory: dict[int, RankInfo], rank) -> str:
    r = int(rank)
    return directory.get(r, RankInfo(None, None)).label(r)


def hosts_of(directory: dict[int, RankInfo], ranks) -> list[str]:
    """The hosts of ``ranks`` the directory knows, sorted, once each."""
    return sorted({directory[r].host for r in ranks if r in directory and directory[r].host})


LISTED_RANKS = 12      # a longer rank list is written compactly (a job of hundreds of ranks)


def ranks_text(ranks) -> str:
    """"rank 3", "ranks 1, 2, 5", "ranks 0-7"; a list longer than LISTED_RANKS as runs
    ("ranks 0-63, 128-191 (128 ranks)"), a regular stride ("ranks 2-254, every 4th (64
    ranks)"), or its first ones and the count."""
    rs = sorted({int(r) for r in ranks})
    if not rs:
        return "no rank"
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    if len(rs) <= LISTED_RANKS:
        return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))
    steps = {b - a for a, b in zip(rs, rs[1:])}
    if len(steps) == 1:
        k = steps.pop()
        nth = {2: "2nd", 3: "3rd"}.get(k, f"{k}th")
        return f"ranks {rs[0]}-{rs[-1]}, every {nth} ({len(rs)} ranks)"
    runs, start = [], rs[0]
    for a, b in zip(rs, rs[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a > start else str(start))
            start = b
    if len(runs) <= LISTED_RANKS:
        return f"ranks {', '.join(runs)} ({len(rs)} ranks)"
    return f"ranks {', '.join(runs[:LISTED_RANKS - 2])}, … ({len(rs)} ranks)"


def who_text(directory: dict[int, RankInfo], ranks, limit: int = 3) -> str:
    """The blamed ranks with host and address ("rank 2 (node1, 10.0.0.2) or rank 5 (...)"),
    or, beyond ``limit`` of them, the first ones labelled and the rest as :func:`ranks_text`."""
    given = list(dict.fromkeys(int(r) for r in ranks))
    if len(given) <= limit:
        return " or ".join(label(directory, r) for r in given)
    rs = sorted(given)
    return (f"one of {len(rs)} ranks, {', '.join(label(directory, r) for r in rs[:2])}, … "
            f"({ranks_text(rs)})")


def ms(ns) -> str:
    """A duration in ns as a short human number of milliseconds."""
    if ns is None or (isinstance(ns, float) and np.isnan(ns)):
        return "n/a"
    v = float(ns) / 1e6
    if v >= 1000:
        return f"{v / 1e3:.2f} s" if v < 10_000 else f"{v / 1e3:.1f} s"
    return f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms" if v >= 1 else f"{v:.2f} ms"


# --------------------------------------------------------------------------- collectives

def collective_windows(ctx) -> pd.DataFrame:
    """One row per (communicator, op_count): t0 = first rank's entry, t1 = last rank's
    end (NA unless every rank that should take part completed), duration, complete. The
    ranks that should take part are those a capture watched then (:func:`all_watched_entered`)."""
    c = ctx.table("collectives")
    if c.empty:
        return pd.DataFrame(columns=["comm_id_hash", "op_count", "op", "bytes", "nranks", "t0", "t1", "duration_ns",
                                     "complete", "ranks_entered", "ranks_completed"])
    nranks = c["nranks"].fillna(c["ranks_entered"])
    # a communicator created before the tracer attached has no id: its rows are one process's
    # calls (key host:pid:comm), complete when that process completed them
    complete = (c["ranks_completed"] == c["ranks_entered"]) & (all_watched_entered(c)
                                                              | is_per_process(c["comm_id_hash"]))
    w = pd.DataFrame({"comm_id_hash": c["comm_id_hash"], "op_count": c["op_count"], "op": c["op"],
                      "bytes": c["bytes"] if "bytes" in c.columns else pd.NA, "nranks": nranks, "t0": c["first_entry_ns"].astype("Int64"),
                      "t1": c["last_end_ns"].astype("Int64").where(complete.fillna(False).astype(bool)),
                      "ranks_entered": c["ranks_entered"], "ranks_completed": c["ranks_completed"]})
    w["complete"] = w["t1"].notna()
    w["duration_ns"] = (w["t1"] - w["t0"]).astype("Float64")
    return w.reset_index(drop=True)


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


def pct(share: float) -> str:
    """A share as a short percentage (below 1% with one decimal, so 0.4% does not read 0%)."""
    return f"{100 * share:.1f}%" if share < 0.01 else f"{share:.0%}"


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


def impact(w: pd.DataFrame, slow, clean, cap_ns=None) -> Impact:
    """The share of the job's collective time the ``slow`` collectives of ``w`` explain: the
    sum over them of (duration - the clean median of their op/size class, :func:`clean_baselines`
    from the ``clean`` ones), over the sum of every completed collective's duration.
    ``cap_ns`` (per row of ``w``, NaN: none): the most of a collective's excess the finding's
    cause can explain (a late rank: how long the others waited for it)."""
    dur = pd.to_numeric(w["duration_ns"], errors="coerce").astype("float64").to_numpy()
    ok = ~np.isnan(dur)
    slow = np.asarray(slow, dtype=bool) & ok
    total = float(dur[ok].sum())
    if not slow.any() or total <= 0:
        return Impact(0.0, 0.0, max(total, 0.0), int(slow.sum()))
    base = clean_baselines(w, clean)
    over = np.clip(dur[slow] - np.nan_to_num(base[slow], nan=0.0), 0, None)
    if cap_ns is not None:
        cap = np.asarray(cap_ns, dtype=np.float64)[slow]
        over = np.where(np.isnan(cap), over, np.minimum(over, np.clip(cap, 0, None)))
    excess = float(over.sum())
    return Impact(min(1.0, excess / total), excess, total, int(slow.sum()))


def all_watched_entered(c: pd.DataFrame) -> pd.Series:
    """Per ``collectives`` row: every rank of its communicator entered it, less those absent
    because no capture watched them then (``ranks_unwatched``: per-host captures that start
    and stop apart see each collective on the hosts watching at the time, and what those
    ranks did is the whole of what there is to judge). A rank never seen, or on a host with
    no capture window, still counts as absent. :data:`ALL_WATCHED_ENTERED_SQL` in SQL."""
    unwatched = c["ranks_unwatched"].fillna(0) if "ranks_unwatched" in c else 0
    return (c["ranks_entered"] + unwatched >= c["nranks"].fillna(c["ranks_entered"])).fillna(False).astype(bool)


ALL_WATCHED_ENTERED_SQL = "ranks_entered + coalesce(ranks_unwatched, 0) >= coalesce(nranks, ranks_entered)"


def is_per_process(comm_id_hash: pd.Series) -> pd.Series:
    """Collectives keyed by one process (``host:pid:comm_ptr``, COLLECTIVES_SQL's fallback when
    the communicator's id is unknown): they cannot be matched across ranks."""
    return comm_id_hash.astype("string").str.contains(":", regex=False).fillna(False).astype(bool)


def in_windows(t: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """For each time in ``t``: inside the union of the closed intervals [t0, t1]?"""
    t = np.asarray(t, dtype=np.int64)
    if len(t0) == 0 or len(t) == 0:
        return np.zeros(len(t), dtype=bool)
    order = np.argsort(t0, kind="stable")
    s, e = np.asarray(t0, dtype=np.int64)[order], np.asarray(t1, dtype=np.int64)[order]
    e = np.maximum.accumulate(e)   # running end: an interval nested in an earlier one adds nothing
    i = np.searchsorted(s, t, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(t), dtype=bool)
    out[ok] = t[ok] <= e[i[ok]]
    return out


def capture_end_ns(ctx) -> int | None:
    """When the capture stopped looking (latest manifest end), else the last event seen."""
    ends = [c.get("ended_ns") for c in getattr(ctx.model, "captures", []) or [] if c.get("ended_ns")]
    last = []
    for name, col in (("nccl_events", "timestamp_ns"), ("nccl_events", "end_ns"), ("tcp_events", "timestamp_ns")):
        s = ctx.table(name)[col].dropna() if len(ctx.table(name)) else []
        if len(s):
            last.append(int(s.max()))
    if ends:
        return max(int(e) for e in ends + last)
    return max(last) if last else None


def world_rank_map(ctx) -> pd.DataFrame:
    """(comm_id_hash, comm rank) -> global rank: a process's rank on the largest
    communicator it belongs to (the world, :func:`forensics.model.nccl.world_ranks`), so
    sub-communicators' ranks map back."""
    return ctx.memo("world_rank_map", lambda: _world_rank_map(ctx))


def _world_rank_map(ctx) -> pd.DataFrame:
    n = ctx.table("nccl_events").dropna(subset=["rank", "pid"])
    if n.empty:
        return pd.DataFrame(columns=["comm_id_hash", "rank", "global_rank"])
    k = n[["comm_id_hash", "rank", "host", "pid"]].drop_duplicates()
    m = k.merge(world_ranks(n), on=["host", "pid"], how="left")
    return m[["comm_id_hash", "rank", "global_rank"]].drop_duplicates(["comm_id_hash", "rank"])


# world_rank_map as SQL: CTE ``w`` (host, pid, global_rank) for the findings' runnable SQL
WORLD_RANK_SQL = """seen AS (
  SELECT comm_id_hash, count(DISTINCT rank) AS seen FROM nccl_events WHERE rank IS NOT NULL GROUP BY comm_id_hash
), w AS (
  SELECT host, pid, arg_max(rank, coalesce(nranks, seen)) AS global_rank
  FROM nccl_events LEFT JOIN seen USING (comm_id_hash)
  WHERE rank IS NOT NULL AND pid IS NOT NULL GROUP BY host, pid
)"""


# --------------------------------------------------------------------------- TCP trouble per link

def trouble_events(ctx, classes=LOSS_CLASSES + ("reset",)) -> pd.DataFrame:
    """tcp_events of the given classes between two known ranks, with columns
    cls, sender, receiver (ranks: who sent the retransmission / the RST), a, b (the
    unordered link), key (directed connection), src (which source saw it). A memo of the
    analysis per classes (several detectors read it)."""
    every = tuple(dict.fromkeys(LOSS_CLASSES + DATA_LOSS_CLASSES + ("reset",) + tuple(classes)))
    t = ctx.memo(("trouble_events", every), lambda: _trouble_events(ctx, every))
    return t[t["cls"].isin(classes).to_numpy()].reset_index(drop=True)


def _trouble_events(ctx, classes: tuple[str, ...]) -> pd.DataFrame:
    t = ctx.table("tcp_events")
    if t.empty:
        return _empty_trouble()
    cls = classify(t)   # one class per packet: a spurious retransmission is not also a retransmission
    t = t.assign(cls=cls)[cls.isin(classes).to_numpy()]
    t = t.dropna(subset=["rank", "peer_rank", "timestamp_ns"])
    t = t[t["rank"] != t["peer_rank"]]
    if t.empty:
        return _empty_trouble()
    # tcp_receive_reset is reported by the socket that got the RST: the sender is its peer
    recv = (t["event"] == "tcp_receive_reset").to_numpy()
    r, p = t["rank"].astype("int64").to_numpy(), t["peer_rank"].astype("int64").to_numpy()
    sender, receiver = np.where(recv, p, r), np.where(recv, r, p)
    # text: each column as codes into its distinct values ("<NA>" when unknown), addresses and
    # ports each on one shared table so that the flip of a received reset is a swap of codes;
    # the joined keys are made once per distinct combination (a few thousand connections),
    # not once per event (10^5-10^6 at fleet scale)
    addr, addr_txt = _codes(t["saddr"], t["daddr"])
    port, port_txt = _codes(t["sport"], t["dport"])
    n = len(t)
    sa, da, sp, dp = addr[:n], addr[n:], port[:n], port[n:]
    src_a, dst_a = np.where(recv, da, sa), np.where(recv, sa, da)
    src_p, dst_p = np.where(recv, dp, sp), np.where(recv, sp, dp)
    key = _joined([(src_a, addr_txt), (src_p, port_txt), (dst_a, addr_txt), (dst_p, port_txt)], (":", ">", ":"))
    seen_by = _joined([_codes(t[c]) for c in ("source", "host", "capture")], (":", ":"))
    out = pd.DataFrame({
        "timestamp_ns": t["timestamp_ns"].astype("int64").to_numpy(), "cls": t["cls"].to_numpy(),
        "event": t["event"].to_numpy(), "sender": sender, "receiver": receiver,
        "a": np.minimum(sender, receiver), "b": np.maximum(sender, receiver),
        "key": key, "src": seen_by,
        "saddr": addr_txt[src_a], "daddr": addr_txt[dst_a], "sport": port_txt[src_p], "dport": port_txt[dst_p],
    })
    return out.sort_values("timestamp_ns", kind="stable").reset_index(drop=True)


TCP_SOURCE_NAMES = {"pcap": "packets (tcpdump)", "bpf": "kernel TCP tracepoints (tracer)"}


def tcp_sources(ev: pd.DataFrame) -> str:
    """What saw ``ev``'s events (trouble_events rows), in words: "packets (tcpdump) on 4
    hosts, kernel TCP tracepoints (tracer) on 4 hosts"."""
    if ev.empty:
        return ""
    parts = ev["src"].astype(str).str.split(":", n=2, expand=True)
    out = []
    for source, g in parts.groupby(0, sort=True):
        hosts = g[1].nunique()
        out.append(f"{TCP_SOURCE_NAMES.get(source, source)} on {hosts} host{'' if hosts == 1 else 's'}")
    return ", ".join(out)


def model_table(ctx, name: str) -> pd.DataFrame:
    """A model table, empty when this model has none (an older database, a synthetic model)."""
    t = ctx.model.tables.get(name)
    return empty(name) if t is None else t


def sql_evidence(ctx, sql: str, limit: int) -> list[dict]:
    """A finding's evidence rows as its SQL returns them (one source for both): the first
    ``limit``, missing values as None; none when a table is missing (an old database)."""
    try:
        df = ctx.sql(sql)
    except Exception:   # noqa: BLE001  a table missing in an old database: no rows rather than no finding
        return []
    rows = df.head(limit).to_dict("records")
    for r in rows:
        for k, v in r.items():
            if v is pd.NA or (isinstance(v, float) and np.isnan(v)):
                r[k] = None
            elif isinstance(v, np.integer):
                r[k] = int(v)
    return rows


def _codes(*cols: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The columns, one after the other, as codes into one table of their distinct values as
    text (objects; the last one "<NA>", the code of a missing value): (codes, table)."""
    both = pd.concat(cols, ignore_index=True) if len(cols) > 1 else cols[0]
    codes, values = pd.factorize(both, use_na_sentinel=True)
    table = np.array([str(v) for v in values] + ["<NA>"], dtype=object)
    return np.where(codes < 0, len(values), codes), table


def _joined(parts: list[tuple[np.ndarray, np.ndarray]], seps: tuple[str, ...]) -> np.ndarray:
    """Per row, the parts' texts (codes into their tables) joined with seps; each distinct
    combination is joined once."""
    combo = dense_codes([(codes, len(table)) for codes, table in parts], len(parts[0][0]))
    _, first = np.unique(combo, return_index=True)
    texts = []
    for row in first:
        txt = parts[0][1][parts[0][0][row]]
        for (codes, table), sep in zip(parts[1:], seps):
            txt += sep + table[codes[row]]
        texts.append(txt)
    return np.array(texts, dtype=object)[combo]


def trouble_sql(classes=LOSS_CLASSES + ("reset",)) -> str:
    """:func:`trouble_events` as SQL over ``tcp_events`` (a subquery: the same rows, flip of
    tcp_receive_reset included), for the runnable SQL of the findings. Columns:
    timestamp_ns, event, cls, sender_rank, receiver_rank, saddr, sport, daddr, dport (text,
    '<NA>' when unknown, as the evidence writes them), "from", "to", src."""
    cases = " ".join(f"WHEN {sql_str(e)} THEN {sql_str(c)}" for e, c in EVENT_CLASS.items() if c in classes)
    events = sql_list(e for e, c in EVENT_CLASS.items() if c in classes)
    return f"""(
  SELECT timestamp_ns, event, cls, sender_rank, receiver_rank, saddr, sport, daddr, dport,
         saddr || ':' || sport AS "from", daddr || ':' || dport AS "to", src
  FROM (
    SELECT timestamp_ns, event, CASE event {cases} END AS cls,
           CASE WHEN recv THEN peer_rank ELSE rank END AS sender_rank,
           CASE WHEN recv THEN rank ELSE peer_rank END AS receiver_rank,
           CASE WHEN recv THEN da ELSE sa END AS saddr, CASE WHEN recv THEN dp ELSE sp END AS sport,
           CASE WHEN recv THEN sa ELSE da END AS daddr, CASE WHEN recv THEN sp ELSE dp END AS dport,
           coalesce(source, '<NA>') || ':' || coalesce(host, '<NA>') || ':' || coalesce(capture, '<NA>') AS src
    FROM (
      SELECT *, event = 'tcp_receive_reset' AS recv, coalesce(saddr, '<NA>') AS sa, coalesce(daddr, '<NA>') AS da,
             coalesce(CAST(sport AS VARCHAR), '<NA>') AS sp, coalesce(CAST(dport AS VARCHAR), '<NA>') AS dp
      FROM tcp_events t
      WHERE event IN ({events}) AND rank IS NOT NULL AND peer_rank IS NOT NULL AND timestamp_ns IS NOT NULL
        AND rank <> peer_rank AND NOT {subsumed_sql("t")}
    )
  )
)"""


def dedup_sql(trouble: str) -> str:
    """:func:`dedup_counts` as SQL over a :func:`trouble_sql` subquery (optionally filtered):
    per directed connection and class, the largest count one source saw. Columns:
    sender_rank, receiver_rank, saddr, sport, daddr, dport, "from", "to", cls, n, first_ns."""
    return f"""(
  SELECT arg_min(sender_rank, first_ns) AS sender_rank, arg_min(receiver_rank, first_ns) AS receiver_rank,
         saddr, sport, daddr, dport, "from", "to", cls, max(n) AS n, min(first_ns) AS first_ns
  FROM (SELECT arg_min(sender_rank, timestamp_ns) AS sender_rank, arg_min(receiver_rank, timestamp_ns) AS receiver_rank,
               saddr, sport, daddr, dport, "from", "to", cls, src, count(*) AS n, min(timestamp_ns) AS first_ns
        FROM {trouble} GROUP BY saddr, sport, daddr, dport, "from", "to", cls, src)
  GROUP BY saddr, sport, daddr, dport, "from", "to", cls
)"""


def trouble_rows(e: pd.DataFrame, limit: int = 20) -> list[dict]:
    """Evidence rows of :func:`trouble_events` rows, earliest first (ties by event and
    endpoints), as :func:`trouble_rows_sql` returns them."""
    e = e.assign(from_=e["saddr"].astype(str) + ":" + e["sport"].astype(str),
                 to_=e["daddr"].astype(str) + ":" + e["dport"].astype(str))
    e = e.sort_values(["timestamp_ns", "event", "from_", "to_"], kind="stable").head(limit)
    return [{"timestamp_ns": int(x.timestamp_ns), "event": x.event, "sender_rank": int(x.sender),
             "receiver_rank": int(x.receiver), "from": x.from_, "to": x.to_} for x in e.itertuples(index=False)]


def trouble_rows_sql(where: str, classes=LOSS_CLASSES + ("reset",), limit: int = 20) -> str:
    """The SQL of :func:`trouble_rows` over the events of ``classes`` that match ``where``
    (SQL over :func:`trouble_sql`'s columns)."""
    return f"""SELECT timestamp_ns, event, sender_rank, receiver_rank, "from", "to"
FROM {trouble_sql(tuple(classes))}
WHERE {where}
ORDER BY timestamp_ns, event, "from", "to" LIMIT {sql_int(limit)}"""


def _empty_trouble() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=d) for c, d in (
        ("timestamp_ns", "int64"), ("cls", object), ("event", object), ("sender", "int64"), ("receiver", "int64"),
        ("a", "int64"), ("b", "int64"), ("key", object), ("src", object), ("saddr", object), ("daddr", object),
        ("sport", object), ("dport", object))})


def dedup_counts(ev: pd.DataFrame) -> pd.DataFrame:
    """Per directed connection and class: the count the best-placed single source saw,
    with first/last time. Columns: key, cls, sender, receiver, a, b, saddr, daddr, n,
    first_ns, last_ns."""
    if ev.empty:
        return pd.DataFrame(columns=["key", "cls", "sender", "receiver", "a", "b", "saddr", "daddr", "sport",
                                     "dport", "n", "first_ns", "last_ns"])
    per_src = ev.groupby(["key", "cls", "src"], sort=False).size().rename("n").reset_index()
    n = per_src.groupby(["key", "cls"], sort=False)["n"].max()
    meta = ev.groupby(["key", "cls"], sort=False).agg(
        sender=("sender", "first"), receiver=("receiver", "first"), a=("a", "first"), b=("b", "first"),
        saddr=("saddr", "first"), daddr=("daddr", "first"), sport=("sport", "first"), dport=("dport", "first"),
        first_ns=("timestamp_ns", "min"), last_ns=("timestamp_ns", "max"))
    return meta.join(n).reset_index()


@dataclass
class Blame:
    ranks: list[int]            # the endpoint(s) the trouble shares (two when it cannot tell them apart)
    coverage: dict[int, float]  # rank -> share of the trouble on links touching it
    separated: bool             # one endpoint stands out
    links: list[tuple[int, int]]


MIN_LINK_EVENTS = 3      # a link with this much trouble (and MIN_LINK_SHARE of the worst link's) ...
MIN_LINK_SHARE = 0.1     # ... is troubled in its own right, not noise


def shared_endpoint(counts: pd.DataFrame, weight: str = "n", tie_ratio: float = 0.8) -> Blame:
    """The endpoint the troubled links share.

    First rule: when two or more links are troubled in their own right (MIN_LINK_EVENTS
    and MIN_LINK_SHARE of the worst link) and have exactly one rank in common, that rank
    is blamed alone: one fault explains every one of them, and a rank absent from one of
    them cannot. Otherwise, by coverage: a rank's coverage is the share of the trouble on
    links touching it, and the blamed ranks are those within ``tie_ratio`` of the best.
    A single troubled link gives both its ends: the evidence cannot tell which NIC (or
    cable end) is at fault."""
    if counts.empty:
        return Blame([], {}, False, [])
    per_link = counts.groupby(["a", "b"])[weight].sum()
    total = float(per_link.sum())
    ends = pd.concat([per_link.rename_axis(["r", "o"]).reset_index(), per_link.rename_axis(["o", "r"]).reset_index()])
    cov = (ends.groupby("r")[weight].sum() / total).sort_values(ascending=False)
    coverage = {int(r): float(v) for r, v in cov.items()}
    links = [(int(a), int(b)) for (a, b), _ in per_link.sort_values(ascending=False).items()]
    own = per_link[(per_link >= MIN_LINK_EVENTS) & (per_link >= MIN_LINK_SHARE * float(per_link.max()))]
    if len(own) >= 2:
        common = set.intersection(*({int(a), int(b)} for a, b in own.index))
        if len(common) == 1:
            return Blame(sorted(common), coverage, True, links)
    best = float(cov.iloc[0])
    blamed = sorted(int(r) for r, v in cov.items() if v >= tie_ratio * best)
    return Blame(blamed, coverage, len(blamed) == 1, links)


def kernel_logged_reset(ctx, r) -> bool:
    """Did the RST sender's kernel log tcp_send_reset on that connection? A reset seen on the
    wire (or received) that its sender's kernel never sent was forged by a firewall or a
    middlebox. Without tracer TCP events there is nothing to compare with: assume it did."""
    t = ctx.table("tcp_events")
    bpf = t[t["source"] == "bpf"] if len(t) else t
    if bpf.empty:
        return True
    s = bpf[(bpf["event"] == "tcp_send_reset") & (bpf["saddr"].astype(str) == str(r["saddr"]))
            & (bpf["daddr"].astype(str) == str(r["daddr"]))]
    return bool((s["sport"].astype("Int64").astype(str) == str(r["sport"])).any())


def as_int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None
