"""Never an internal error (issue 42): missing values of every kind in the tables, and any mix
of real and junk files, end in a report.

- ``test_parser_tables_with_missing_values_end_in_a_report``: the loose fixture logs analysed
  with every parser's tables (the seam :func:`forensics.model.artifacts._parse`, what the
  model build reads) given missing values (None, NaN, pandas NA) in random cells of every
  column, an all-missing row per table, and facts whose values are None; the model build, every
  registered detector and the four renderers must run (no detector may fail).
- ``test_model_tables_with_missing_values_end_in_a_report``: the same on the model's artefact
  tables (``forensics.model.artifacts.ARTIFACT_TABLES``, conformed to their
  ``forensics.model.schema.SCHEMAS``) of a shipped bundle and of loose logs, and on the tracer's
  ``nccl_events`` and ``tcp_events`` but their keys (a traced call always has its time, process
  and op), for the detectors and the renderers alone.
- ``test_any_mix_of_files_ends_in_a_report_or_a_one_line_error``: random mixes of the
  repository's fixtures and junk files (random JSON, binaries, empty files, one huge line,
  invalid UTF-8) through ``main(["analyze", ...])`` in-process: rc 0/1 and a report, or rc 2
  and one line, never ``internal error``.

Bounded: about 40 s for the three together (``max_examples`` below; STALLSCOPE_PROPERTY_SCALE=N
runs N times as many, not derandomized, for a longer hunt by hand).
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import FIXTURES
from forensics.analysis import Analysis, analyze
from forensics.cli import Env, main
from forensics.findings import Context, run_detectors
from forensics.model import artifacts as artifacts_mod
from forensics.model.artifacts import ARTIFACT_TABLES
from forensics.model.schema import SCHEMAS, conform
from forensics.parsers import registry
from forensics.report import WRITERS
from tests.shipped import shipped_bundle

MISSING = (None, float("nan"), pd.NA)
# STALLSCOPE_PROPERTY_SCALE=N: N times the examples, not derandomized (a longer hunt by hand)
SCALE = int(os.environ.get("STALLSCOPE_PROPERTY_SCALE", "1"))
SETTINGS = dict(deadline=None, derandomize=SCALE == 1, suppress_health_check=list(HealthCheck))

# the loose logs whose parse results are damaged: one of each parser that reads loose files
LOOSE = [FIXTURES / "logs" / "10-mpirun-tag-timestamp-ib-warn",
         FIXTURES / "parsers" / "nccl_debug" / "nccl_debug_info_init.log",
         FIXTURES / "parsers" / "nccl_debug" / "nccl_debug_coll.log",
         FIXTURES / "parsers" / "nccl_debug" / "nccl_2.18.1_no_gpu.log",
         FIXTURES / "parsers" / "nccl_tests" / "nccl_tests_output_mixed.txt",
         FIXTURES / "parsers" / "nccl_inspector" / "example-hostname-pid1639453.log",
         FIXTURES / "parsers" / "nccl_profiler_trace" / "example_readme_trace.json",
         FIXTURES / "parsers" / "flight_recorder" / "json_nccl_trace_rank_1.json",
         FIXTURES / "parsers" / "ib_status" / "ibstat_one_down.txt",
         FIXTURES / "parsers" / "ncclras",
         FIXTURES / "parsers" / "torch_watchdog",
         FIXTURES / "parsers" / "torch_elastic",
         FIXTURES / "parsers" / "pyspy"]


def _rendered(a: Analysis) -> None:
    """Every renderer of the analysis, into memory."""
    for kind, write in WRITERS.items():
        write(a, io.StringIO())


def _failed(problems: list[str]) -> list[str]:
    return [p for p in problems if p.startswith("detector ")]


# --------------------------------------------------------------------------- parser tables

def _damage_rows(df: pd.DataFrame, rnd: random.Random) -> list[dict]:
    """The rows of ``df`` as Python values, a random share of each column's cells missing
    (a random kind each), and one row missing everywhere."""
    rows = [{c: (None if v is pd.NA or v is pd.NaT else v) for c, v in r.items()}
            for r in df.astype(object).to_dict("records")]
    cols = list(df.columns)
    for c in cols:
        share = rnd.choice((0.0, 0.3, 1.0))
        for r in rows:
            if rnd.random() < share:
                r[c] = rnd.choice(MISSING)
    rows.append({c: rnd.choice(MISSING) for c in cols})
    return rows


def _damage_facts(v, rnd: random.Random):
    """The facts with random scalar values of their objects, at any depth, None (what a parser
    says of a value it did not see; lists and the records in them stay as the parser makes them)."""
    if isinstance(v, dict):
        return {k: _damage_facts(x, rnd) if isinstance(x, dict) else
                (None if not isinstance(x, list) and rnd.random() < 0.3 else x) for k, x in v.items()}
    return v


def _damaging_parse(seed: int):
    real = artifacts_mod._parse

    def parse(parser, text, rel, bundle):
        res = real(parser, text, rel, bundle)
        rnd = random.Random(f"{seed}:{rel}:{parser.NAME}")
        tables = {name: registry.frame(_damage_rows(df, rnd), parser.SCHEMAS[name]) if name in parser.SCHEMAS
                  else df for name, df in res.tables.items()}
        return dataclasses.replace(res, tables=tables, facts=_damage_facts(res.facts, rnd))
    return parse


@settings(max_examples=12 * SCALE, **SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, len(LOOSE)))
def test_parser_tables_with_missing_values_end_in_a_report(seed, n):
    inputs = random.Random(seed).sample(LOOSE, n)
    with mock.patch.object(artifacts_mod, "_parse", _damaging_parse(seed)):
        a = analyze([str(p) for p in inputs])
    try:
        assert not _failed(a.problems), _failed(a.problems)
        _rendered(a)
    finally:
        a.close()


# --------------------------------------------------------------------------- model tables

_MODELS: dict[str, object] = {}


def _base_models():
    """The models of a shipped bundle (tracer, packets, logs) and of loose logs, made once."""
    if not _MODELS:
        b = shipped_bundle("mismatch-hang")
        for name, inputs in (("bundle", [b] if b else []), ("loose", LOOSE[:6])):
            if inputs:
                a = analyze([str(p) for p in inputs])
                _MODELS[name] = a.model
                a.close()
    return _MODELS


# the tracer's tables: what a traced call or a TCP event always has (the rest may be missing: a
# communicator created before the tracer attached has no hash, rank or size)
TRACER_KEYS = {"nccl_events": {"timestamp_ns", "pid", "host", "op"}, "tcp_events": {"timestamp_ns", "event", "host"}}


def _damaged(df: pd.DataFrame, table: str, rnd: random.Random) -> pd.DataFrame:
    """``df`` with missing values in random cells of every column (but a tracer table's keys) and,
    for an artefact table, an all-missing row; conformed to its table's schema (as the model's
    tables are)."""
    d = df.astype(object).copy()
    for c in d.columns:
        if c in TRACER_KEYS.get(table, ()):
            continue
        share = rnd.choice((0.0, 0.3, 1.0))
        mask = np.array([rnd.random() < share for _ in range(len(d))], dtype=bool)
        if mask.any():
            d.loc[mask, c] = rnd.choice(MISSING)
    if table not in TRACER_KEYS:
        d = pd.concat([d, pd.DataFrame([{c: rnd.choice(MISSING) for c in d.columns}], dtype=object)],
                      ignore_index=True)
    return conform(d, table) if table in SCHEMAS else d


@settings(max_examples=10 * SCALE, **SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), which=st.sampled_from(["bundle", "loose"]))
def test_model_tables_with_missing_values_end_in_a_report(seed, which):
    models = _base_models()
    if which not in models:
        pytest.skip("no shipped mismatch-hang bundle (tests/lab/make_bundles.sh)")
    base = models[which]
    rnd = random.Random(seed)
    tables = {name: _damaged(df, name, rnd) if name in ARTIFACT_TABLES or name in TRACER_KEYS else df
              for name, df in base.tables.items()}
    model = dataclasses.replace(base, tables=tables)
    con = model.connect()
    findings, problems = run_detectors(Context(model=model, con=con))
    a = Analysis(model=model, con=con, findings=findings, problems=list(model.problems) + problems)
    try:
        assert not _failed(problems), problems
        _rendered(a)
    finally:
        a.close()


# --------------------------------------------------------------------------- any mix of files

FIXTURE_FILES = sorted(p for d in ("logs", "parsers", "realworld") for p in (FIXTURES / d).rglob("*")
                       if p.is_file() and p.stat().st_size < 2_000_000 and p.name != "expect.json")


def _json_values():
    scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.sampled_from(["run", "config", "version", "entries", "pg_config",
                                                           "results", "nccl_version", "threads", "tid", "pid",
                                                           "host", "rank", "ranks", "traceEvents", "cat", "ph",
                                                           "collectors", "processes", "header", "coll_perf",
                                                           "frames", "owns_gil", "log_history"]) | st.text(max_size=8),
                                          inner, max_size=5), max_leaves=20)


def _junk():
    return st.one_of(
        _json_values().map(lambda v: ("random.json", json.dumps(v).encode())),
        st.binary(min_size=1, max_size=2000).map(lambda b: ("random.bin", b)),
        st.just(("empty.log", b"")),
        st.integers(100_000, 3_000_000).map(lambda n: ("one-line.log", b"NCCL INFO " + b"x" * n)),
        st.binary(min_size=1, max_size=200).map(lambda b: ("bad-utf8.log",
                                                           b"host:1:2 [0] NCCL WARN \xff\xfe" + b + b"\n")),
        st.just(("config.json", json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
                                            "rope_scaling": None, "torch_dtype": "bfloat16"}).encode())),
        st.just(("trainer_state.json", json.dumps({"best_metric": None, "global_step": 10, "log_history": [
            {"epoch": 0.1, "loss": 2.3, "step": 10}], "total_flos": 1.2e15}).encode())),
        st.just(("manifest.json", json.dumps({"run": 1, "config": {"lr": 0.1}}).encode())),
    )


@settings(max_examples=25 * SCALE, **SETTINGS)
@given(picks=st.lists(st.sampled_from(FIXTURE_FILES), max_size=6, unique=True), junk=st.lists(_junk(), max_size=4),
       as_folder=st.booleans())
def test_any_mix_of_files_ends_in_a_report_or_a_one_line_error(picks, junk, as_folder):
    if not picks and not junk:
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "in"
        d.mkdir()
        for i, p in enumerate(picks):
            shutil.copyfile(p, d / f"{i}-{p.name}")
        for i, (name, data) in enumerate(junk):
            (d / (name if name == "manifest.json" else f"j{i}-{name}")).write_bytes(data)
        inputs = [str(d)] if as_folder else sorted(str(p) for p in d.iterdir())
        out = Path(tmp) / "out"
        out.mkdir()
        so, se = io.StringIO(), io.StringIO()
        rc = main(["analyze", *inputs, "-o", str(out / "r.html"), "--json", str(out / "f.json"),
                   "--markdown", str(out / "s.md"), "--perfetto", str(out / "t.json")], Env(stdout=so, stderr=se))
        err = se.getvalue()
        assert "internal error" not in err, err
        if rc == 2:
            errors = [ln for ln in err.splitlines() if ln.startswith("stallscope: error:")]
            assert len(errors) == 1 and "\n" not in errors[0], err
        else:
            assert rc in (0, 1), (rc, err)
            doc = json.loads((out / "f.json").read_text())
            assert doc["verdict"] and not _failed(doc["capture"]["problems"]), doc["capture"]["problems"]
            assert (out / "r.html").stat().st_size > 0
