"""``analyze(paths)``: bundles -> model -> findings, the library behind ``stallscope analyze``.

The command line and the report renderers are thin layers over :class:`Analysis`:
the event model (:mod:`forensics.model`), the DuckDB connection the findings' SQL
runs on (``findings`` included as a table), the ranked findings
(:mod:`forensics.findings`) and every problem met on the way (unreadable files,
missing collectors, a detector that failed), so a partly broken bundle still yields
an answer that says what it lacks.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .execution import Execution, memory
from .execution.host_reading import read_model
from .execution.shared_steps import Workspace, detect_with_child
from .execution.thread_call import ThreadCall, open_database_on_thread, opened_or_none
from .findings import NO_DATABASE, SCHEMA_VERSION, Context, Finding, Options, finish, run_detectors
from .findings.verdict import verdict
from .inputs.intake import Intake, gather
from .model import Model

__all__ = ["Analysis", "Execution", "analyze"]

FINDINGS_SCHEMA = {
    "position": "INTEGER", "kind": "VARCHAR", "severity": "VARCHAR", "confidence": "DOUBLE", "summary": "VARCHAR",
    "ranks": "INTEGER[]", "hosts": "VARCHAR[]", "peer_ranks": "INTEGER[]", "links": "JSON", "evidence": "JSON",
    "sql": "VARCHAR", "action": "VARCHAR",
}


@dataclass
class Analysis:
    model: Model
    con: Any                                   # model.database.EventDatabase: the event tables + findings
    findings: list[Finding]
    problems: list[str] = field(default_factory=list)
    options: Options = field(default_factory=Options)
    # what the renderers compute from the model alone, by name, computed once (report.data.memo);
    # an Execution that shares the work with a forked child fills it from its model steps
    # (forensics.execution.shared_steps)
    memos: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of_model(cls, model: Model, options: Options | None = None) -> Analysis:
        """An analysis of the model alone (no findings, no database): what the model steps
        (:class:`~forensics.execution.shared_steps.ModelStep`) run on."""
        return cls(model=model, con=None, findings=[], options=options or Options())

    @property
    def top(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def verdict(self) -> str:
        """One line of at most HEADLINE_CHARS: the most important finding's headline, or what
        was (not) seen (:func:`forensics.findings.verdict.verdict`)."""
        return verdict(self.model, self.findings, self.problems, self.con, self.options)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.verdict(),
            "findings": [f.to_json() for f in self.findings],
            "capture": {"hosts": self.model.captures, "clock_skew": [s.__dict__ for s in self.model.skew],
                        "problems": self.problems, "notes": list(getattr(self.model, "notes", []))},
        }

    def close(self) -> None:
        self.con.close()


def analyze(paths, *, options: Options | None = None, db: str | os.PathLike | None = None,
            progress: Callable[[str], None] | None = None, execution: Execution | None = None) -> Analysis:
    """Model the inputs, run every detector, and store the findings next to the events.
    ``paths``: what the user gave (bundles, log files, folders, archives: :mod:`forensics.inputs.intake`)
    or an :class:`~forensics.inputs.intake.Intake` made of it already. ``execution``: where the
    per-host stage runs and what overlaps what (:class:`~forensics.execution.Execution`; by
    default this process alone); the analysis is the same whatever it says. The in-memory
    database loads its event tables only if a query needs them (:mod:`.model.database`)."""
    options = options or Options()
    execution = execution or Execution()
    say = progress or (lambda _msg: None)
    intake = paths if isinstance(paths, Intake) else gather(list(paths))
    try:
        return _analyze(intake, options, db, say, execution)
    finally:
        if intake is not paths:
            intake.close()


def _analyze(intake, options: Options, db, say, execution: Execution) -> Analysis:
    say("reading " + intake.describe())
    opening: list[ThreadCall] = []

    def meanwhile() -> None:
        import duckdb  # noqa: F401 - an import that Model.connect would do after the reading
        opening.append(open_database_on_thread(db))   # opened on a thread during the merge
        if execution.meanwhile is not None:
            execution.meanwhile()

    try:
        model = read_model(intake, replace(execution, meanwhile=meanwhile), progress=say)
        memory.settle()       # the model lives as long as the analysis (forensics.execution.memory)
        say("building the event tables")
        con = model.connect(db, opened=opened_or_none(opening.pop()) if opening else None)
    except BaseException:
        for o in opening:
            o.discard()
        raise
    try:
        say("looking for findings")
        ctx = Context(model=model, con=con, options=options)
        if execution.shares_with_child:
            # the detectors and the report's model-only steps shared with a forked copy of
            # this process, after the connection is made (forensics.execution.shared_steps)
            child = Context(model=model, con=NO_DATABASE, options=options)
            (findings, det_problems), memos = detect_with_child(
                Workspace(Analysis.of_model(model, options), ctx), Workspace(Analysis.of_model(model, options), child),
                list(execution.model_steps))
            findings = finish(ctx, findings)
        else:
            findings, det_problems = run_detectors(ctx)
            memos = {}
        stored = _storable(findings, det_problems)
        _store_findings(con, stored)
    except BaseException:
        con.close()
        raise
    return Analysis(model=model, con=con, findings=[f for f, _ in stored],
                    problems=list(model.problems) + det_problems, options=options, memos=memos)


def _storable(findings: list[Finding], problems: list[str]) -> list[tuple[Finding, dict]]:
    """The findings that serialize, each with its JSON form; one that does not (a detector's
    odd evidence value) becomes a problem line instead of costing the whole analysis."""
    ok = []
    for f in findings:
        try:
            j = f.to_json()   # round-trips through json: what it returns serializes
        except (TypeError, ValueError) as exc:
            problems.append(f"finding {f.kind} left out: its evidence does not serialize ({exc})")
            continue
        ok.append((f, j))
    return ok


def _store_findings(con, stored: list[tuple[Finding, dict]]) -> None:
    cols = ", ".join(f'"{c}" {t}' for c, t in FINDINGS_SCHEMA.items())
    con.store(f"CREATE OR REPLACE TABLE findings ({cols})")   # the event tables stay unloaded
    for i, (f, j) in enumerate(stored):
        con.store("INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [i + 1, f.kind, f.severity, f.confidence, f.summary, j["ranks"], j["hosts"], j["peer_ranks"],
                     json.dumps(j["links"]), json.dumps(j["evidence"]), f.sql, f.action])
