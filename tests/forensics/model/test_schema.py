"""model/schema.py: an artefact table's columns are the parser's, typed once (by the parser's kind)."""
from __future__ import annotations

import pytest

from forensics.model import schema
from forensics.parsers import registry


def test_a_bare_name_takes_the_parser_kind_and_a_typed_one_is_the_models():
    cols = schema.shown("kernel_log", "kernel_events", "host xid xid_narrow:INTEGER pid:INTEGER" + schema.LOG_ORIGIN)
    kinds = registry.get("kernel_log").SCHEMAS["kernel_events"]
    assert cols["host"] == schema.KIND_TYPES[kinds["host"]] == "VARCHAR"
    assert cols["xid"] == "BIGINT" and cols["pid"] == "INTEGER" and cols["xid_narrow"] == "INTEGER"
    assert list(cols)[-3:] == ["node", "artifact", "log_line"]


def test_a_column_the_parser_lost_fails_at_declaration():
    with pytest.raises(ValueError, match="no column 'no_such_column'"):
        schema.shown("kernel_log", "kernel_events", "host no_such_column")


def test_a_restated_type_fails_unless_the_model_fills_the_name_itself():
    with pytest.raises(ValueError, match="restates"):
        schema.shown("kernel_log", "kernel_events", "host:VARCHAR")
    assert schema.shown("kernel_log", "kernel_events", "host:VARCHAR", own=("host",)) == {"host": "VARCHAR"}


def test_every_artefact_table_keeps_the_parser_types_it_shows():
    """Each column a model table shares by name with the parser table it shows has the parser's
    type, or INTEGER for an int (checked over the declared tables, so a re-typed parser column shows)."""
    shows = {"nccl_warnings": ("nccl_debug", "nccl_warnings"), "sockets": ("ss", "sockets"),
             "process_exits": ("torch_elastic", "process_exits"), "watchdog_events": ("torch_watchdog", "watchdog"),
             "threads": ("proc_threads", "threads"), "fr_entries": ("flight_recorder", "fr_entries")}
    for table, (parser, ptable) in shows.items():
        kinds = registry.get(parser).SCHEMAS[ptable]
        for col, t in schema.SCHEMAS[table].items():
            if col in kinds and col not in ("node", "artifact", "log_line", "host"):
                assert t in (schema.KIND_TYPES[kinds[col]], "INTEGER"), (table, col, t, kinds[col])
