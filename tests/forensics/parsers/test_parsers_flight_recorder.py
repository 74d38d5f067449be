"""Flight Recorder dumps: pickles (protocols 2, 4, 5), JSON, and pickles that must be refused."""
from __future__ import annotations

import json
import os
import pickle

import pandas as pd
import pytest

from conftest import FIXTURES
from forensics.parsers.flight_recorder import FlightRecorderParser, RefusedGlobal, op_from_profiling_name, safe_loads

D = FIXTURES / "parsers" / "flight_recorder"


@pytest.mark.parametrize("name, rank, n", [("nccl_trace_rank_0", 0, 3), ("proto4_nccl_trace_rank_0", 0, 3),
                                           ("nccl_trace_rank_1", 1, 2), ("proto5_nccl_trace_rank_1", 1, 2)])
def test_pickled_dumps(name, rank, n):
    r = FlightRecorderParser.parse(D / name)
    assert r.warnings == []
    assert r.facts["format"] == "pickle" and r.facts["version"] == "2.5" and r.facts["rank"] == rank
    e = r.tables["fr_entries"]
    assert len(e) == n and e["rank"].tolist() == [rank] * n
    first = e.iloc[0]
    assert (first["record_id"], first["pg_id"], first["pg_name"], first["pg_desc"]) == (0, 0, "0", "default_pg")
    assert (first["collective_seq_id"], first["p2p_seq_id"], first["op_id"]) == (1, 0, 1)
    assert (first["profiling_name"], first["op"], first["state"]) == ("nccl:all_reduce", "ALL_REDUCE", "completed")
    assert first["input_sizes"] == "[[3, 4]]" and first["input_numel"] == 12 and first["input_dtypes"] == "Float"
    assert bool(first["retired"]) and not bool(first["is_p2p"]) and first["timeout_ms"] == 600000
    assert pd.isna(first["time_discovered_started_ns"])
    assert first["top_frame"] == "test_short_pickle (pytorch/test/distributed/test_c10d_nccl.py:3647)"
    assert first["frames"].count("\n") == 2


def test_exact_nanosecond_times_and_the_hang_signature():
    e0 = FlightRecorderParser.parse(D / "nccl_trace_rank_0").tables["fr_entries"]
    e1 = FlightRecorderParser.parse(D / "nccl_trace_rank_1").tables["fr_entries"]
    assert e0.iloc[0]["time_created_ns"] == 1724779239936775119
    assert e0.iloc[0]["time_discovered_completed_ns"] == 1724779239975811724     # no float rounding
    assert e0["state"].tolist() == ["completed", "completed", "scheduled"]
    assert e0["collective_seq_id"].max() == 3 and e1["collective_seq_id"].max() == 2
    st = FlightRecorderParser.parse(D / "nccl_trace_rank_0").tables["fr_pg_status"].iloc[0]
    assert (st["pg_id"], st["last_enqueued_collective"], st["last_started_collective"],
            st["last_completed_collective"]) == ("0", 3, -1, 2)
    cfg = FlightRecorderParser.parse(D / "nccl_trace_rank_1").tables["fr_pg_config"].iloc[0]
    assert (cfg["pg_name"], cfg["desc"], cfg["ranks"], cfg["size"]) == ("0", "default_pg", "[0, 1]", 2)


def test_json_variant_zero_times_are_missing():
    r = FlightRecorderParser.parse(D / "json_nccl_trace_rank_1.json")
    assert r.warnings == [] and r.facts["format"] == "json" and r.facts["rank"] == 1
    e = r.tables["fr_entries"]
    assert len(e) == 2 and e["time_discovered_started_ns"].isna().all() and e["frames"].isna().all()
    assert e.iloc[1]["time_discovered_completed_ns"] == 1724779239936775119 + 90_001_000


def test_torchscript_typed_list_is_built_without_torch():
    r = FlightRecorderParser.parse(D / "typed_list_nccl_trace_rank_2")
    assert r.warnings == [] and r.facts["rank"] == 2
    assert r.tables["fr_entries"].iloc[0]["input_sizes"] == "[[3, 4]]"


def test_malicious_pickle_is_refused_without_side_effect(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for proto in (2, 4, 5):
        path = tmp_path / f"nccl_trace_rank_{proto}"
        path.write_bytes(pickle.dumps({"version": "2.5", "entries": [Evil()]}, protocol=proto))
        r = FlightRecorderParser.parse(path)
        assert not marker.exists()
        assert len(r.warnings) == 1 and "refused pickle" in r.warnings[0] and "system" in r.warnings[0]
        assert all(len(t) == 0 for t in r.tables.values())
    # the committed fixture would run `touch /tmp/stallscope-fr-pwned`
    fixed = "/tmp/stallscope-fr-pwned"
    if os.path.exists(fixed):
        os.unlink(fixed)
    r = FlightRecorderParser.parse(D / "malicious_os_system.pkl")
    assert not os.path.exists(fixed) and "refused pickle" in r.warnings[0]
    with pytest.raises(RefusedGlobal):
        safe_loads(pickle.dumps(pd.Timestamp(0)))


def test_torch_objects_refused_and_damaged_dumps_warn(tmp_path):
    r = FlightRecorderParser.parse(D / "torch_tensor_global.pkl")
    assert "torch._utils._rebuild_tensor_v2" in r.warnings[0]
    r = FlightRecorderParser.parse(D / "truncated_nccl_trace_rank_0")
    assert len(r.warnings) == 1 and "unreadable pickle" in r.warnings[0]
    p = tmp_path / "nccl_trace_rank_4"
    p.write_bytes(pickle.dumps({"version": "2.5", "pg_config": [1], "pg_status": {"0": 5},
                                "entries": [7, {"record_id": "x", "collective_seq_id": 3, "state": "scheduled",
                                                "process_group": "pg"},
                                            {"profiling_name": "nccl:send 0->1"}]}, protocol=2))
    r = FlightRecorderParser.parse(p)
    e = r.tables["fr_entries"]
    assert len(e) == 1 and e.iloc[0]["collective_seq_id"] == 3 and pd.isna(e.iloc[0]["record_id"])
    assert len(r.warnings) == 6
    assert FlightRecorderParser.parse(pickle.dumps([1, 2])).warnings == ["<bytes>: dump is a list, expected a dict"]


@pytest.mark.parametrize("name, op", [("nccl:all_reduce", "ALL_REDUCE"), ("nccl:_reduce_scatter_base", "REDUCE_SCATTER"),
                                      ("nccl:send 1->2", "SEND"), ("nccl:recv 3<-0", "RECV"),
                                      ("nccl:coalesced", "COALESCED"), ("nccl:ALLGATHER_coalesced", "ALL_GATHER"),
                                      ("xccl:broadcast", "BROADCAST"), (None, None)])
def test_op_names(name, op):
    assert op_from_profiling_name(name) == op


def _entry(**kw):
    e = {"record_id": 0, "pg_id": 0, "process_group": ("0", "default_pg"), "profiling_name": "nccl:all_reduce",
         "time_created_ns": 1_700_000_000_000_000_000, "input_sizes": [[4]], "output_sizes": [[4]],
         "state": "scheduled", "frames": [{"name": "f", "filename": "t.py", "line": 3}]}
    e.update(kw)
    return e


@pytest.mark.parametrize("layout", ["seq_id", "collective_seq_id", "entries_only"])
def test_dump_layouts(layout):
    """Dumps that number a collective ``seq_id`` (before ``collective_seq_id`` and
    ``p2p_seq_id``, 2.3's keys) and a bare list of entries are read as the dict form."""
    if layout == "seq_id":
        doc = {"version": "1.1", "entries": [_entry(seq_id=7)]}
    elif layout == "collective_seq_id":
        doc = {"version": "2.3", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
               "pg_status": {"0": {"last_enqueued_collective": 7, "last_started_collective": 6,
                                   "last_completed_collective": 6}},
               "entries": [_entry(collective_seq_id=7, p2p_seq_id=0, op_id=7, is_p2p=False,
                                  time_discovered_started_ns=None, time_discovered_completed_ns=None)]}
    else:
        doc = [_entry(seq_id=7)]
    r = FlightRecorderParser.parse_bytes(pickle.dumps(doc, protocol=2), "nccl_trace_rank_1")
    e = r.tables["fr_entries"]
    assert e[["rank", "collective_seq_id", "op", "state"]].values.tolist() == [[1, 7, "ALL_REDUCE", "scheduled"]]


# --------------------------------------------------------------------------- every dump format
# shapes/<version>/: the same hang (rank 1 never issues all_reduce #3) as each format writes
# it (README.md, "Dump formats", gives each format's source). What each format carries:
SHAPES = D / "shapes"
FORMATS = {  # version: (pg_config as read, pg_status, desc, dtypes, timeout_ms, lib version, thread ids)
    "1.1": (False, False, None, None, None, None, False),
    "1.4": (True, False, None, None, None, None, False),
    "2.0": (True, False, "default_pg", "float", None, None, False),
    "2.3": (True, True, "default_pg", "Float", 600000, None, False),
    "2.4": (True, True, "default_pg", "Float", 600000, None, False),
    "2.7": (True, True, "default_pg", "Float", 600000, "2.21.5", False),
    "2.9": (True, True, "default_pg", "Float", 600000, "2.21.5", True),
    "2.10": (True, True, "default_pg", "Float", 600000, "2.21.5", True),
}
SHAPE_FILES = [(v, r, js) for v in FORMATS for r in (0, 1) for js in (False, True)
               if not js or (SHAPES / v / f"nccl_trace_rank_{r}.json").exists()]


def test_every_format_has_its_fixtures():
    assert sorted(p.name for p in SHAPES.iterdir()) == sorted(FORMATS)
    assert {v for v, _, js in SHAPE_FILES if js} == {"2.4", "2.7", "2.9", "2.10"}


@pytest.mark.parametrize("version, rank, as_json", SHAPE_FILES)
def test_each_dump_format_reads_the_same_hang(version, rank, as_json):
    has_cfg, has_status, desc, dtype, timeout, lib, threads = FORMATS[version]
    path = SHAPES / version / (f"nccl_trace_rank_{rank}" + (".json" if as_json else ""))
    r = FlightRecorderParser.parse(path)
    assert r.warnings == []
    assert r.facts["format"] == ("json" if as_json else "pickle")
    assert (r.facts["version"], r.facts["rank"], r.facts["comm_lib_version"]) == (version, rank, lib)
    e = r.tables["fr_entries"]
    n = 3 if rank == 0 else 2
    assert r.facts["entries"] == n and e["rank"].tolist() == [rank] * n
    assert e["collective_seq_id"].tolist() == list(range(1, n + 1))      # seq_id in 1.x
    assert e["state"].tolist() == ["completed", "completed", "scheduled"][:n]
    assert e["op"].tolist() == ["ALL_REDUCE"] * n and e["input_numel"].tolist() == [12] * n
    assert e["pg_name"].tolist() == ["0"] * n                            # str(pg_id) before process_group
    assert e["pg_desc"].tolist() == [desc] * n if desc else e["pg_desc"].isna().all()
    assert e["input_dtypes"].tolist() == [dtype] * n if dtype else e["input_dtypes"].isna().all()
    assert e["timeout_ms"].tolist() == [timeout] * n if timeout else e["timeout_ms"].isna().all()
    assert e["thread_id"].notna().all() == threads and e["thread_name"].notna().all() == threads
    assert e["time_discovered_started_ns"].isna().all()                  # None (pickle) and 0 (JSON) alike
    done = e["time_discovered_completed_ns"]
    assert done.notna().tolist() == [True, True, False][:n] and int(done.iloc[0]) > 1e18
    if version == "1.1":
        assert e["record_id"].isna().all()                               # 1.1 has no record_id
    else:
        assert e["record_id"].tolist() == list(range(n))
    assert e["frames"].notna().all() != as_json                          # the JSON dump has no frames
    cfg = r.tables["fr_pg_config"]
    if has_cfg:
        assert cfg[["pg_name", "ranks", "size"]].values.tolist() == [["0", "[0, 1]", 2]]
        assert cfg["desc"].tolist() == [desc] if desc else cfg["desc"].isna().all()
    else:
        assert cfg.empty and r.facts["process_groups"] == 0
    st = r.tables["fr_pg_status"]
    if has_status:      # ints in the pickle, decimal strings in the JSON dump: the same numbers
        assert st[["pg_id", "last_enqueued_collective", "last_started_collective",
                   "last_completed_collective"]].values.tolist() == [["0", n, -1, 2]]
    else:
        assert st.empty


@pytest.mark.parametrize("version", ["2.4", "2.7", "2.9", "2.10"])
def test_json_and_pickle_of_a_format_give_the_same_rows(version):
    for rank in (0, 1):
        p = FlightRecorderParser.parse(SHAPES / version / f"nccl_trace_rank_{rank}")
        j = FlightRecorderParser.parse(SHAPES / version / f"nccl_trace_rank_{rank}.json")
        for t in ("fr_pg_config", "fr_pg_status"):
            pd.testing.assert_frame_equal(p.tables[t], j.tables[t])
        cols = [c for c in p.tables["fr_entries"].columns if c not in ("frames", "top_frame")]
        pd.testing.assert_frame_equal(p.tables["fr_entries"][cols], j.tables["fr_entries"][cols])


def test_json_pg_status_counters_that_are_not_numbers_stay_missing():
    doc = {"version": "2.10", "pg_status": {"0": {"last_enqueued_collective": "x7",
                                                  "last_started_collective": " -1 ",
                                                  "last_completed_collective": True}}, "entries": []}
    st = FlightRecorderParser.parse_bytes(json.dumps(doc).encode(), "nccl_trace_rank_0.json").tables["fr_pg_status"]
    assert pd.isna(st.iloc[0]["last_enqueued_collective"]) and st.iloc[0]["last_started_collective"] == -1
    assert pd.isna(st.iloc[0]["last_completed_collective"])


@pytest.mark.parametrize("version, as_json", [(v, js) for v in FORMATS for js in (False, True)
                                              if not js or v in ("2.4", "2.7", "2.9", "2.10")])
def test_analysis_of_each_pair_names_the_rank_that_never_issued_collective_3(version, as_json):
    from forensics.analysis import analyze
    ext = ".json" if as_json else ""
    a = analyze([SHAPES / version / f"nccl_trace_rank_{r}{ext}" for r in (0, 1)])
    try:
        blamed = [f for f in a.findings if f.severity == "error" and f.ranks == [1]]
        assert blamed and blamed[0].seq == 3, [(f.kind, f.severity, f.ranks, f.summary) for f in a.findings]
    finally:
        a.close()
