"""forensics.model on the shipped lab bundles, checked against each scenario.json.

The bundles come from real lab runs under ``stallscope capture``
(tests/lab/make_bundles.sh); the ground truth is the lab's own record.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.execution.host_reading import read_model
from forensics.model.nccl import _host_sync_end
from forensics.model.schema import NCCL_EVENTS_DESIGN, SCHEMAS, TCP_EVENTS_DESIGN
from forensics.model.skew import estimate_skew
from shipped import BUNDLES, SCENARIOS, shipped

needs_bundles = pytest.mark.skipif(not SCENARIOS, reason="no shipped bundles (tests/lab/make_bundles.sh)")


@lru_cache(maxsize=None)
def model(scenario: str):
    m = read_model([shipped(scenario)])
    con = m.connect()
    return m, con


def truth(scenario: str) -> dict:
    return json.loads((BUNDLES / scenario / "scenario.json").read_text())


def q(con, sql: str) -> pd.DataFrame:
    return con.execute(sql).df()


# --------------------------------------------------------------------------- schema

@needs_bundles
def test_tables_have_designs_columns_first_and_declared_types():
    _, con = model("loss")
    for table, schema in SCHEMAS.items():
        desc = con.execute(f'DESCRIBE "{table}"').fetchall()
        assert [(r[0], r[1]) for r in desc] == list(schema.items()), table
    assert list(SCHEMAS["nccl_events"])[:len(NCCL_EVENTS_DESIGN)] == NCCL_EVENTS_DESIGN
    assert list(SCHEMAS["tcp_events"])[:len(TCP_EVENTS_DESIGN)] == TCP_EVENTS_DESIGN
    # DESIGN's column lists, spelled out once more so a rename in schema.py fails here
    assert NCCL_EVENTS_DESIGN == ("timestamp_ns duration_ns duration_source end_ns op rank nranks comm_id_hash "
                                  "comm_ptr op_count count bytes datatype reduce_op root_or_peer stream host pid "
                                  "tid").split()
    assert TCP_EVENTS_DESIGN == "timestamp_ns event source saddr daddr sport dport state host pid rank peer_rank".split()


# --------------------------------------------------------------------------- nccl_events vs the lab

@needs_bundles
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_nccl_events_match_the_labs_record(scenario):
    m, con = model(scenario)
    t = truth(scenario)
    n = m["nccl_events"]
    world = n[n["comm_id_hash"] == t["comm_id_hash"]]
    # every rank launched, with its pid, and nothing else on the world communicator
    assert sorted(world.groupby("rank")["pid"].first().items()) == sorted((r["rank"], r["pid"]) for r in t["ranks"])
    assert set(world["nranks"]) == {t["world_size"]}
    for r in t["ranks"]:
        mine = world[world["rank"] == r["rank"]].sort_values("op_count")
        assert len(mine) == t["ops_issued"][r["rank"]], r
        assert mine["op_count"].tolist() == list(range(len(mine)))
        assert mine.iloc[0]["op"] == "BROADCAST" and mine.iloc[0]["root_or_peer"] == 0
        assert mine["comm_ptr"].nunique() == 1 and mine.iloc[0]["comm_ptr"] == r["comm"]
    # times: UTC, inside the lab's run, durations from host waits on the stream
    assert (world["timestamp_ns"] >= t["started_ns"] - 10**9).all() and (world["timestamp_ns"] <= t["ended_ns"]).all()
    done = world[world["completed"].astype(bool)]
    assert len(done) and (done["duration_source"] == "host_sync").all()
    assert (done["end_ns"] >= done["call_return_ns"]).all() and (done["duration_ns"] > 0).all()
    ar = world[world["op"] == "ALL_REDUCE"]
    assert set(ar["datatype"]) == {"float32"} and set(ar["reduce_op"]) == {"sum"}
    assert (ar["bytes"] == ar["count"] * 4).all()
    # completion is observed through host waits, one per step: never claimed for an op the
    # lab did not complete (hangs, aborts after a reset), and missed at most for the last
    # step's ops whose wait never returned
    got = done.groupby("rank").size().reindex(range(t["world_size"]), fill_value=0).tolist()
    per_step = len(t["config"]["buckets"].split(",")) + 1
    for r in range(t["world_size"]):
        assert t["ops_completed"][r] - per_step < got[r] <= t["ops_completed"][r], (r, got, t["ops_completed"])
    if t["scenario"] in ("clean", "loss", "slow-link", "straggler"):
        assert got == t["ops_completed"] == t["ops_issued"]


@needs_bundles
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_collectives_table(scenario):
    m, con = model(scenario)
    t = truth(scenario)
    c = q(con, f"SELECT * FROM collectives WHERE comm_id_hash = '{t['comm_id_hash']}' ORDER BY op_count")
    assert len(c) == max(t["ops_issued"])
    assert (c["nranks"] == t["world_size"]).all() and not c["ops_differ"].any()
    entered = c.set_index("op_count")["ranks_entered"]
    for n_op in range(len(c)):      # how many ranks issued op n
        assert entered[n_op] == sum(1 for k in t["ops_issued"] if k > n_op)
    row = c.iloc[1]
    assert row["lateness_ns"].tolist() == [e - row["first_entry_ns"] for e in row["entry_ns"]]
    assert min(row["lateness_ns"]) == 0 and max(row["lateness_ns"]) == row["max_lateness_ns"]
    if t["scenario"] == "mismatch-hang":   # the skipping rank never entered op #at_op; the others wait in it
        at = t["fault"]["op_index"]
        hung = c[c["op_count"] == at].iloc[0]
        assert hung["missing_ranks"].tolist() == t["fault"]["ranks"]
        assert hung["ranks_completed"] == 0 and hung["ranks_entered"] == t["world_size"] - 1
    else:
        assert all(len(x) == 0 for x in c["missing_ranks"][:min(t["ops_issued"])])


# --------------------------------------------------------------------------- tcp attribution

@needs_bundles
def test_loss_retransmissions_attributed_to_the_lossy_ranks_links():
    m, con = model("loss")
    t = truth("loss")
    bad = t["fault"]["ranks"][0]
    addr = {r["rank"]: r["addr"] for r in t["ranks"]}
    pid = {r["rank"]: r["pid"] for r in t["ranks"]}
    retx = q(con, "SELECT * FROM tcp_events WHERE event = 'tcp_retransmit_skb'")
    lab = retx[retx["saddr"].isin(addr.values())]
    assert len(lab) >= 10
    # owner by socket, not the softirq's pid: most tracepoints ran with another pid
    assert (lab["event_pid"] != lab["pid"]).mean() > 0.5
    assert lab["rank"].notna().all() and lab["peer_rank"].notna().all()
    for r in lab.itertuples():      # owner and peer agree with the lab's address plan
        assert addr[r.rank] == r.saddr and addr[r.peer_rank] == r.daddr and pid[r.rank] == r.pid
    # every retransmission is on a link of the lossy rank
    assert ((lab["rank"] == bad) | (lab["peer_rank"] == bad)).all()
    # pcap verdicts agree: retransmissions seen on the wire involve the lossy rank too
    wire = q(con, "SELECT rank, peer_rank FROM tcp_events WHERE source = 'pcap' AND event = 'retransmission'")
    assert len(wire) and ((wire["rank"] == bad) | (wire["peer_rank"] == bad)).all()
    # the collective in flight on the owning rank
    inflight = lab[lab["coll_op"].notna()]
    assert len(inflight) > 0.8 * len(lab) and set(inflight["coll_comm_id_hash"]) == {t["comm_id_hash"]}


@needs_bundles
def test_clean_has_no_retransmissions_and_flows_are_owned():
    m, con = model("clean")
    t = truth("clean")
    assert q(con, "SELECT count(*) AS n FROM tcp_events WHERE event IN "
                  "('tcp_retransmit_skb', 'retransmission', 'fast_retransmission')")["n"][0] == 0
    f = m["flows"]
    addr = {r["addr"]: r["rank"] for r in t["ranks"]}
    lab = f[f["orig_addr"].isin(addr) & f["resp_addr"].isin(addr)]
    assert len(lab) and lab["rank"].notna().all() and lab["peer_rank"].notna().all()
    assert (lab["orig_addr"].map(addr) == lab["rank"]).all() and (lab["resp_addr"].map(addr) == lab["peer_rank"]).all()


# --------------------------------------------------------------------------- durations and skew (synthetic)

def test_host_sync_bounds_and_fallbacks():
    coll = pd.DataFrame({
        "pid": [1, 1, 1, 2, 3], "stream": ["s", "s", "s", "x", "s"],
        "t0": [100, 200, 900, 100, 100], "t1": [110, 210, 910, 120, None],
    })
    waits = pd.DataFrame({"pid": [1, 1, 1, 2], "stream": ["s", "s", "s", None], "fn": [
        "cudaStreamSynchronize", "cudaStreamSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize"],
        "t0": [105, 300, 950, 130], "t1": [150, 400, None, 170]})
    end, src, done = _host_sync_end(coll, waits)
    # call 0 returned at 110: the wait that started at 105 does not cover it; the one at 300 does
    assert end.tolist()[:2] == [400, 400] and src.tolist()[:2] == ["host_sync", "host_sync"]
    # call 2: its wait never returned -> still in flight
    assert pd.isna(end[2]) and src[2] == "host_sync" and not done[2]
    # device-wide wait covers any stream; pid 3 never waits and never returned
    assert end[3] == 170 and src[3] == "host_sync"
    assert src[4] == "call" and pd.isna(end[4]) and not done[4]
    # a process that never waits: entry -> return
    end2, src2, _ = _host_sync_end(coll.iloc[[0]], pd.DataFrame())
    assert end2.tolist() == [110] and src2.tolist() == ["call"]


def test_skew_from_common_segments():
    rng = np.random.default_rng(1)
    n = 400
    src = np.where(np.arange(n) % 2 == 0, "10.0.0.1", "10.0.0.2")
    dst = np.where(src == "10.0.0.1", "10.0.0.2", "10.0.0.1")
    a = pd.DataFrame({"src": src, "sport": 1000, "dst": dst, "dport": 2000, "seq_raw": np.arange(n), "len": 100,
                      "tcp_flags": 24, "t": 10**18 + np.arange(n) * 1000})
    skew, delay = 3_000_000, 40_000
    b = a.copy()
    jitter = rng.integers(0, 2000, n)
    # a -> b: leaves a at t, reaches b at t + delay (b's clock is +skew); b -> a the other way
    b["t"] = np.where(src == "10.0.0.1", a["t"] + delay + skew + jitter, a["t"] - delay + skew - jitter)
    est = estimate_skew(a, b, {"10.0.0.1"}, "A", "B")
    assert est.status == "ok" and est.matched_segments == n
    assert abs(est.skew_ns - skew) < 2000 and abs(est.one_way_delay_ns - delay) < 2000
    none = estimate_skew(a, b.assign(seq_raw=b["seq_raw"] + 10**6), {"10.0.0.1"})
    assert none.skew_ns is None and none.status == "no common segments"


@needs_bundles
def test_single_bundle_skew_is_na():
    m, con = model("loss")
    assert m.skew_report() == "clock skew between hosts: n/a (one bundle)"
    assert q(con, "SELECT count(*) AS n FROM clock_skew")["n"][0] == 0


def _shift_pcap(path: Path, shift_ns: int) -> None:
    """Rewrite a classic pcap's record times (+shift_ns): another host's clock."""
    import struct
    data = bytearray(path.read_bytes())
    magic = data[:4]
    bo = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    unit = 1 if nano else 1000
    off = 24
    while off + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack_from(bo + "IIII", data, off)
        t = sec * 10**9 + frac * unit + shift_ns
        struct.pack_into(bo + "II", data, off, t // 10**9, (t % 10**9) // unit)
        off += 16 + incl
    path.write_bytes(bytes(data))


@needs_bundles
def test_two_hosts_skew_estimated_from_common_segments(tmp_path):
    """The loss bundle split into two 'hosts' (ranks 0-1 / 2-3), the second's pcaps 3 ms ahead."""
    import shutil
    from forensics.inputs.bundle import Bundle
    with Bundle.open(shipped("loss"), workdir=tmp_path) as b:
        a, c = tmp_path / "stallscope-hosta-20260101T000000Z", tmp_path / "stallscope-hostb-20260101T000000Z"
        shutil.copytree(b.root, a)
        shutil.copytree(b.root, c)
    shift = 3_000_000
    for folder, host, keep in ((a, "hosta", ("-r0-", "-r1-")), (c, "hostb", ("-r2-", "-r3-"))):
        for p in (folder / "pcap").iterdir():
            if not any(k in p.name for k in keep):
                p.unlink()
            elif host == "hostb":
                _shift_pcap(p, shift)
        for d in (folder / "sys").glob("netns-*"):   # the other host's namespaces' snapshots
            if not any(d.name.endswith(k.rstrip("-")) for k in keep):
                shutil.rmtree(d)
        man = json.loads((folder / "manifest.json").read_text())
        man["host"] = host
        # this host's processes and tracer events only
        ranks = [r for r in truth("loss")["ranks"] if f"-r{r['rank']}-" in keep]
        gone_pids = {r["pid"] for r in truth("loss")["ranks"]} - {r["pid"] for r in ranks}
        gone_ns = {p["netns_inode"] for p in man["processes"] if p["pid"] in gone_pids}
        man["processes"] = [p for p in man["processes"] if p["pid"] not in gone_pids]
        ev = folder / "bpf" / "events.jsonl"
        lines = [ln for ln in ev.read_text().splitlines()
                 if json.loads(ln).get("pid") not in gone_pids and json.loads(ln).get("netns") not in gone_ns]
        ev.write_text("\n".join(lines) + "\n")
        man["files"] = [f for f in man["files"] if f["path"] != "bpf/events.jsonl"]
        man["files"] = [f for f in man["files"] if not f["path"].startswith("pcap/") or any(k in f["path"] for k in keep)]
        man["files"] = [f for f in man["files"] if (folder / f["path"]).exists()]
        (folder / "manifest.json").write_text(json.dumps(man))
    m = read_model([a, c])
    assert m.hosts == ["hosta", "hostb"]
    (s,) = m.skew
    assert s.status == "ok" and s.matched_segments > 100
    assert abs(s.skew_ns - shift) < 200_000, s          # within 0.2 ms of the injected skew
    assert 0 <= s.one_way_delay_ns < 1_000_000
    assert "hostb - hosta: +3.0" in m.skew_report()
    row = m.connect().execute("SELECT host_a, host_b, skew_ns FROM clock_skew").fetchall()
    assert row == [("hosta", "hostb", s.skew_ns)]


@needs_bundles
def test_ib_counter_deltas_when_the_bundle_has_ib(tmp_path):
    import shutil
    from forensics.inputs.bundle import Bundle
    with Bundle.open(shipped("clean"), workdir=tmp_path) as b:
        folder = tmp_path / "stallscope-ibhost-20260101T000000Z"
        shutil.copytree(b.root, folder)
    for phase, v in (("start", 5), ("end", 9)):
        d = folder / "ib" / phase / "mlx5_0" / "ports" / "1" / "counters"
        d.mkdir(parents=True)
        (d / "symbol_error").write_text(f"{v}\n")
        (d / "port_xmit_data").write_text(f"{v * 1000}\n")
    m = read_model([folder])
    rows = m.connect().execute("SELECT device, port, counter, delta, problem FROM ib_counters ORDER BY counter").fetchall()
    assert rows == [("mlx5_0", 1, "port_xmit_data", 4000, False), ("mlx5_0", 1, "symbol_error", 4, True)]


def test_an_empty_pcap_is_a_problem_not_silence(tmp_path):
    """tcpdump that started but captured nothing (a namespace found late, an idle NIC):
    the model says that rank's packet evidence is missing instead of implying a clean link."""
    import shutil
    import struct
    from forensics.inputs.bundle import Bundle
    with Bundle.open(shipped("loss"), workdir=tmp_path) as b:
        folder = tmp_path / "stallscope-vm-20260101T000000Z"
        shutil.copytree(b.root, folder)
    victim = sorted((folder / "pcap").glob("*.pcap"))[0]
    victim.write_bytes(struct.pack("<IHHiIII", 0xa1b23c4d, 2, 4, 0, 0, 128, 1))   # header only
    man = json.loads((folder / "manifest.json").read_text())
    man["files"] = [f for f in man["files"] if f["path"] != f"pcap/{victim.name}"]
    (folder / "manifest.json").write_text(json.dumps(man))
    m = read_model([folder])
    assert any(f"pcap/{victim.name}: no packets" in p for p in m.problems), m.problems


def test_collectives_do_not_expand_an_absurd_communicator_size():
    """missing_ranks lists range(nranks) minus the ranks seen: a bundle claiming a million
    ranks for two seen must not make every collective a million-element list."""
    import duckdb
    from forensics.model.nccl import COLLECTIVES_SQL
    from forensics.model.schema import conform
    rows = [{"timestamp_ns": 10 + r, "op": "ALL_REDUCE", "rank": r, "nranks": n, "comm_id_hash": h, "op_count": 0,
             "completed": True, "end_ns": 20, "bytes": 4}
            for h, n in (("0x1", 1_000_000), ("0x2", 4)) for r in (0, 1)]
    con = duckdb.connect()
    for table in ("nccl_events", "capture_windows"):       # COLLECTIVES_SQL's inputs
        cols = ", ".join(f'"{c}" {t}' for c, t in SCHEMAS[table].items())
        con.execute(f"CREATE TABLE {table} ({cols})")
    con.register("_df", conform(pd.DataFrame(rows), "nccl_events"))
    con.execute("INSERT INTO nccl_events SELECT * FROM _df")
    got = dict(con.execute(f"SELECT comm_id_hash, missing_ranks FROM ({COLLECTIVES_SQL})").fetchall())
    assert got == {"0x1": None, "0x2": [2, 3]}


def test_collective_in_flight_compares_integer_nanoseconds():
    """A TCP event 1 ns after a collective's end is after it: epoch ns near 1.8e18 are 256 ns
    apart as float64, so a float comparison would put it inside."""
    from forensics.model.tcp_ranks import collective_in_flight
    t0 = 1_800_000_000_000_000_000
    end = t0 + 5_000_077          # not a multiple of 256: float64(end) rounds up past end + 1
    assert float(end) > end + 1
    nccl = pd.DataFrame({"rank": pd.array([0, 0], dtype="Int64"),
                         "timestamp_ns": pd.array([t0, t0 + 10**9], dtype="Int64"),
                         "end_ns": pd.array([end, None], dtype="Int64"), "comm_id_hash": ["0xa", "0xa"],
                         "op_count": pd.array([0, 1], dtype="Int64"), "op": ["ALL_REDUCE", "ALL_REDUCE"]})
    tcp = pd.DataFrame({"rank": pd.array([0, 0, 0, 0], dtype="Int64"),
                        "timestamp_ns": pd.array([end, end + 1, t0 + 10**9 + 5, t0 - 1], dtype="Int64"),
                        "coll_comm_id_hash": pd.array([None] * 4, dtype="string"),
                        "coll_op_count": pd.array([None] * 4, dtype="Int64"),
                        "coll_op": pd.array([None] * 4, dtype="string"),
                        "coll_in_flight": pd.array([None] * 4, dtype="boolean")})
    out = collective_in_flight(tcp, nccl)
    assert out["coll_op_count"].tolist()[:3] == [0, 0, 1] and pd.isna(out["coll_op_count"].iat[3])
    # at the end: still in flight; 1 ns later: not; a collective without an end: in flight; before any: unknown
    assert out["coll_in_flight"].tolist()[:3] == [True, False, True] and pd.isna(out["coll_in_flight"].iat[3])


# --------------------------------------------------------------------------- the database

def _rows(con, table: str) -> int:
    return con.store(f'SELECT count(*) FROM "{table}"').fetchone()[0]


@needs_bundles
def test_an_in_memory_database_loads_its_event_tables_at_the_first_query_only():
    """connect() loads nccl_events (collectives is made from it) and leaves the other event
    tables to the first statement that could read them; store() writes beside them unloaded;
    what a query then reads is every row of the model's frames."""
    m = read_model([shipped("loss")])
    con = m.connect()
    try:
        assert not con.loaded
        assert _rows(con, "nccl_events") == len(m["nccl_events"]) > 0
        assert _rows(con, "collectives") == len(m["collectives"]) > 0          # made at connect, in SQL
        assert _rows(con, "tcp_events") == 0 < len(m["tcp_events"])            # not loaded yet
        con.store("CREATE TABLE findings_like (x INTEGER)")
        con.store("INSERT INTO findings_like VALUES (?)", [1])
        assert not con.loaded
        got = con.execute("SELECT count(*), count(DISTINCT rank) FROM tcp_events").fetchone()
        assert con.loaded
        assert got == (len(m["tcp_events"]), m["tcp_events"]["rank"].nunique())
        for table, df in m.tables.items():
            assert _rows(con, table) == len(df), table
        assert con.execute("SELECT x FROM findings_like").fetchall() == [(1,)]
    finally:
        con.close()


@needs_bundles
def test_a_database_file_is_written_whole_and_any_connection_attribute_loads_first(tmp_path):
    import duckdb
    m = read_model([shipped("loss")])
    path = tmp_path / "m.duckdb"
    con = m.connect(path)
    assert con.loaded
    con.close()
    with duckdb.connect(str(path), read_only=True) as disk:
        for table, df in m.tables.items():
            assert disk.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] == len(df), table
    lazy = m.connect()
    try:
        n = lazy.sql("SELECT count(*) FROM packets").fetchall()[0][0]   # the connection's own API
        assert lazy.loaded and n == len(m["packets"]) > 0
    finally:
        lazy.close()


def test_attribution_lookups_give_what_left_joins_on_the_text_keys_give():
    # the lookups match each address column's distinct values (model.tcp_ranks.Addresses), not its
    # rows: the same pid and rank as a left join of (addr, port) on the endpoint table, NA
    # where unknown: an unknown address or port, a missing port, a fractional port, a port out
    # of range, an ambiguous key
    from forensics.model.tcp_ranks import Addresses, Attribution
    endpoints = pd.DataFrame({"host": ["a", "a", "b", "b", "b", "c"],
                              "addr": ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2", "10.0.0.9", "10.0.0.3"],
                              "port": [5000, 5001, 6000, 6000, None, 7000],
                              "pid": [11, 12, 21, 22, 31, 41]})
    ranks = pd.DataFrame({"host": ["a", "a", "b", "b", "c"], "pid": [11, 12, 21, 31, 41], "rank": [0, 1, 2, 3, 4]})
    attr = Attribution(endpoints, ranks, pd.DataFrame(columns=["host", "netns", "pid"]))
    addr = pd.Series(["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.9", "10.0.0.3", "10.0.0.3", "10.0.0.7",
                      "10.0.0.1", "10.0.0.3"], dtype="str")
    # 72537 = 65537 + 7000: out of range, it would alias 10.0.0.3:7000 as a key
    port = pd.Series([5001.0, 5000.0, 6000.0, np.nan, 7000.0, 7001.0, 5000.0, 72537.0, 7000.5])
    q = pd.DataFrame({"addr": addr.astype(str).to_numpy(), "port": pd.to_numeric(port).to_numpy()})
    e = attr.endpoints.astype({"addr": str})
    joined = q.merge(e.assign(port=pd.to_numeric(e["port"])), on=["addr", "port"], how="left")
    got = attr.owner(addr, port)
    pd.testing.assert_frame_equal(got, joined[["pid", "rank"]])
    # 10.0.0.2:6000 is claimed by two processes and the endpoint without a port is left out
    # by the table itself; the rest of the misses: unknown port or address, not a port number
    assert got["rank"].fillna(-1).tolist() == [1, 0, -1, -1, 4, -1, -1, -1, -1]
    by_addr = q[["addr"]].merge(attr.addr_rank.astype({"addr": str}), on="addr", how="left")["rank"]
    pd.testing.assert_series_equal(attr.rank_of_addr(Addresses(addr)), by_addr)
    # one factorized column serves every lookup on it
    keys = Addresses(addr)
    pd.testing.assert_frame_equal(attr.owner(keys, port), got)
    pd.testing.assert_series_equal(attr.peer_rank(keys, port), attr.peer_rank(addr, port))


@pytest.mark.parametrize("captures, logs_only", [
    ([], False),                                          # nothing read: no claim either way
    ([{"kind": "loose", "files_read": []}], True),        # loose evidence alone
    ([{"kind": "loose"}, {"host": "node1"}], False),      # logs beside a capture's bundle
    ([{"host": "node0"}, {"host": "node1"}], False),
])
def test_a_model_of_loose_evidence_alone_says_it_was_made_from_logs_only(captures, logs_only):
    from forensics.model import Model
    assert Model(tables={}, hosts=[], captures=captures).logs_only is logs_only
