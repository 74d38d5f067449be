"""The Flight Recorder analyzer's report (fr_trace / torchfrtrace): every release's block
headers, its other reports, TorchComms' table, pasted and prefixed text, and text that is not it."""
from __future__ import annotations

import pandas as pd
import pytest

from conftest import FIXTURES
from forensics.parsers.fr_analyzer import FrAnalyzerParser
from forensics.parsers.text import LogText

COLS = ["kind", "pg", "seq", "record_id", "op", "state", "missing_ranks", "culprit_ranks", "error_type"]


def _rows(text: str) -> list[list]:
    r = FrAnalyzerParser.parse_bytes(text.encode(), "fr.txt")
    t = r.tables["fr_report"]
    return [[None if pd.isna(v) else v for v in row] for row in t[COLS].astype(object).values.tolist()]


def test_2_4_print_one_line():
    text = ("Not all ranks joining collective for group 0:default_pg collective nccl:all_reduce  "
            "Missing ranks are {2, 3}  [[1024]] [[1024]] 4 scheduled \nCollective stack traces: \n"
            "  all_reduce at /x/distributed_c10d.py:2288\n")
    assert _rows(text) == [["not_joined", "0:default_pg", None, None, "nccl:all_reduce", None, "2,3", None, None]]


def test_2_5_logger_blocks():
    text = """Not all ranks joining collective 5 at entry 4
group info: 0:default_pg
collective: nccl:all_reduce
missing ranks: {1}
input sizes: [[3, 4]]
output sizes: [[3, 4]]
expected ranks: 2
collective state: scheduled
collective stack trace:
  all_reduce at /p/torch/distributed/distributed_c10d.py:2696
  <module> at /p/crash.py:44
Collective 7 at entry 6 errors
group info: 0:default_pg
collective: nccl:broadcast
input sizes: [[3]]
output sizes: [[3]]
expected ranks: 4
collective state: scheduled
error message: Culprit rank 2; MatchState.SIZE_OR_SYNTAX_MISMATCH, Culprit rank 3; MatchState.SIZE_OR_SYNTAX_MISMATCH
collective stack trace:
Input/output mismatch in the collective 9 at entry 8
group info: 0:default_pg
collective: nccl:all_to_all
"""
    assert _rows(text) == [
        ["not_joined", "0:default_pg", 5, 4, "nccl:all_reduce", "scheduled", "1", None, None],
        ["errors", "0:default_pg", 7, 6, "nccl:broadcast", "scheduled", None, "2,3", "SIZE_OR_SYNTAX_MISMATCH"],
        ["io_mismatch", "0:default_pg", 9, 8, "nccl:all_to_all", None, None, None, None]]


def test_current_blocks_with_logging_prefixes_and_quotes():
    text = """INFO:torch.distributed.flight_recorder:Not all ranks joining collective, sequence number: 4
INFO:torch.distributed.flight_recorder:internal record id: 4
INFO:torch.distributed.flight_recorder:group info: main_comm:gloo
INFO:torch.distributed.flight_recorder:collective: nccl:all_reduce
INFO:torch.distributed.flight_recorder:missing ranks: {1}
INFO:torch.distributed.flight_recorder:world size: 2
INFO:torch.distributed.flight_recorder:expected ranks: {0, 1}
INFO:torch.distributed.flight_recorder:collective state: scheduled
> Collective sequence number: 1487 has errors
> internal record id: 1486
> group info: 0:default_pg
> collective: nccl:all_reduce
> collective state: scheduled
> error msg: Culprit rank 1; Error type: COLLECTIVE_STATE_MISMATCH, Expected state: 'scheduled' does not match found
> Input/output mismatch in the collective sequence number: 12
"""
    rows = _rows(text)
    assert rows == [
        ["not_joined", "main_comm:gloo", 4, 4, "nccl:all_reduce", "scheduled", "1", None, None],
        ["errors", "0:default_pg", 1487, 1486, "nccl:all_reduce", "scheduled", None, "1", "COLLECTIVE_STATE_MISMATCH"],
        ["io_mismatch", None, 12, None, None, None, None, None, None]]
    t = FrAnalyzerParser.parse_bytes(text.encode(), "fr.txt").tables["fr_report"]
    assert t["expected_ranks"].iloc[0] == "0,1" and t["expected_ranks"].isna().iloc[1] and t["world_size"].iloc[0] == 2
    assert t["line"].tolist() == [1, 9, 15]


def test_missing_dumps_and_aborts():
    text = """We cannot decide what's wrong with this collective entry because we missed FR dumps from ranks ({3}) so \
we don't have enough information. If you want to debug further use -j to dump all raw trace
AssertionError: Missing dump files from ranks {5, 6}
ValueError: Missing dump files for 1 ranks: [7]
Too many mismatches for process_group 0: default_pg, aborting
"""
    assert [r[0] for r in _rows(text)] == ["undecided", "missing_dumps", "missing_dumps", "too_many_mismatches"]
    assert [r[6] for r in _rows(text)] == ["3", "5,6", "7", None]
    assert _rows(text)[3][1] == "0: default_pg"


def test_loose_lines_without_their_header():
    text = "... cut ...\nmissing ranks: {3}\ncollective state: scheduled\nerror msg: Culprit rank 6; Error type: " \
           "SIZE_OR_SYNTAX_MISMATCH\n"
    assert [(r[0], r[6], r[7]) for r in _rows(text)] == [("not_joined", "3", None), ("errors", None, "6")]


def test_torchcomms_collectives_table():
    text = """--- Collectives ---
  id  group_id    pass_check  collective_seq_id  collective_name    collective_state  missing_ranks
   3  main_comm   True        3                  nccl:broadcast     scheduled
   4  main_comm   True        4                  nccl:all_reduce    scheduled         {1, 2}    <- MISMATCH

--- NCCL Calls ---
"""
    assert _rows(text) == [["not_joined", "main_comm", 4, None, "nccl:all_reduce", "scheduled", "1,2", None, None]]


@pytest.mark.parametrize("text", ["", "NCCL INFO Bootstrap : Using eth0\n", "\x00\x01\x02binary" * 40,
                                  "the collective: was fine, at entry 3 we saw nothing\n"])
def test_not_a_report(text):
    r = FrAnalyzerParser.parse_bytes(text.encode(), "x.txt")
    assert r.tables.get("fr_report") is None or r.tables["fr_report"].empty
    assert r.warnings


def test_claims_only_reports():
    assert FrAnalyzerParser.claims(LogText(b"x\nNot all ranks joining collective, sequence number: 4\n", "a"))
    assert not FrAnalyzerParser.claims(LogText(b"NCCL WARN Call to connect returned Connection refused\n", "a"))


def test_fixture_files():
    r = FrAnalyzerParser.parse(FIXTURES / "parsers" / "fr_analyzer" / "fr_trace_2_7.txt")
    t = r.tables["fr_report"]
    assert r.warnings == [] and t["kind"].tolist() == ["not_joined", "errors", "undecided", "too_many_mismatches"]
    assert t["missing_ranks"].fillna("").tolist() == ["3", "", "5", ""] and t["culprit_ranks"].iloc[1] == "2"
    r = FrAnalyzerParser.parse(FIXTURES / "parsers" / "fr_analyzer" / "fr_trace_2_5.txt")
    t = r.tables["fr_report"]
    assert t[["seq", "record_id", "state"]].values.tolist() == [[12, 11, "started"], [13, 12, "scheduled"]]
    assert t["missing_ranks"].iloc[0] == "1,6" and t["error_type"].iloc[1] == "COLLECTIVE_TYPE_MISMATCH"
