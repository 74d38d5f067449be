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
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from .beside import Ahead, Detect, Workspace, child_values, share_out
from .findings import NO_DATABASE, SCHEMA_VERSION, Context, Finding, Options, detectors, gather, queries, run_detectors
from .findings.base import prefetch
from .findings.contract import complete
from .model import Model, build_model
from .workers import Forked, Reading

__all__ = ["Ahead", "Analysis", "analyze"]

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
    # what the renderers compute from the model alone, by name, made once (report.data.memo);
    # ``analyze(ahead=..., jobs>1)`` fills it, this process and a forked one sharing the steps
    # with the detectors (forensics.beside)
    prepared: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def top(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def verdict(self) -> str:
        """One line of at most HEADLINE_CHARS: the most important finding's headline, or what
        was (not) seen."""
        from .findings.contract import shorten
        return shorten(self._verdict())

    def _verdict(self) -> str:
        serious = [f for f in self.findings if f.severity in ("error", "warning")]
        if serious:
            return serious[0].headline or serious[0].summary
        failed = [p for p in self.problems if p.startswith("detector ")]
        if failed:   # never a clean bill of health over a check that did not run
            return (f"No finding, but {len(failed)} detector(s) failed: this analysis is incomplete (see the "
                    f"capture section): {failed[0]}")
        n = len(self.model["nccl_events"])
        caps = self.model.captures
        if n == 0 and caps and all(c.get("kind") == "loose" for c in caps):
            return _logs_verdict(self.model)
        if n == 0:
            from .findings.base import Context
            from .findings.state import state_verdict
            said = state_verdict(Context(self.model, self.con, self.options))
            return said or "No NCCL collectives were captured: no verdict on the job (see the capture section)."
        if any(f.kind == "transport" and f.details.get("rule") == "rdma_invisible_to_tcp" for f in self.findings):
            # no retransmission means nothing when NCCL's traffic never touched the TCP stack
            return (f"No problem found in {n} NCCL calls; their traffic went over RDMA, invisible to TCP: the "
                    "IB counters are the network evidence, and they show no error.")
        return f"No problem found in {n} NCCL calls and their TCP traffic."

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


def _logs_verdict(model: Model) -> str:
    """One sentence when the logs alone hold no problem: what they cover."""
    t = model.tables
    read = sum(len(c.get("files_read") or []) for c in model.captures)
    coll = t.get("coll_log_ops")
    ranks = int(coll["rank"].nunique()) if coll is not None and len(coll) else 0
    what = (f"; COLL lines place all {ranks} ranks" if ranks else "")
    return (f"No failure in {read} log file(s): no NCCL WARN, watchdog timeout or failed process{what}. A slow "
            "link or a straggler needs a capture (stallscope capture).")


def _model_only(model: Model, options: Options) -> Analysis:
    """An analysis of the model alone (no findings, no database): what the report's
    :class:`Ahead` steps run on, in the child and here alike."""
    return Analysis(model=model, con=None, findings=[], options=options)


def analyze(paths, *, options: Options | None = None, db: str | os.PathLike | None = None,
            progress: Callable[[str], None] | None = None, jobs: int = 1, dask: str | None = None,
            while_reading: Callable[[], None] | None = None,
            ahead: list[Ahead] | None = None,
            reading: Reading | None = None) -> Analysis:
    """Model the inputs, run every detector, and store the findings next to the events.
    ``paths``: what the user gave (bundles, log files, folders, archives: :mod:`forensics.intake`)
    or an :class:`~forensics.intake.Intake` made of it already. ``jobs``: processes for the per-host stage (1: this process alone); ``reading``: that
    stage already started on ``paths`` by the caller (:class:`forensics.workers.Reading`);
    ``dask``: the address of a Dask scheduler to run it on instead
    (:mod:`forensics.model.parallel`); ``while_reading``: the caller's own preparation, done
    here while the workers read; ``ahead``:
    the steps of what the caller will compute from the model alone (the report's per-rank
    tables, :class:`Ahead`). With ``jobs`` > 1 the detectors and those steps are shared
    between this process and a forked copy of it (:mod:`forensics.beside`), the steps' values
    in ``Analysis.prepared``; with one job the caller computes them when needed.
    The in-memory database loads its event tables only if a query needs them; with ``jobs`` > 1
    and a database file (``db``), the detectors' shared tables are made while DuckDB loads
    them on another thread (:func:`_connect`)."""
    options = options or Options()
    say = progress or (lambda _msg: None)
    from .intake import Intake, gather
    intake = paths if isinstance(paths, Intake) else gather(list(paths))
    try:
        return _analyze(intake, options, db, say, jobs, dask, while_reading, ahead, reading)
    finally:
        if intake is not paths:
            intake.close()


def _analyze(intake, options: Options, db, say, jobs: int, dask, while_reading, ahead, reading) -> Analysis:
    say("reading " + intake.describe())

    opening: list[_OnThread] = []

    def meanwhile() -> None:
        import duckdb  # noqa: F401 - 0.05 s of import that Model.connect would do after the reading
        opening.append(_opening(db))          # made on a thread during the merge
        if while_reading is not None:
            while_reading()

    # the second core's share after the reading: the database opened while this thread merges
    # the hosts (with workers only), the detectors' shared tables made while DuckDB loads a
    # database file (it leaves the GIL), then the detectors and the report's model-only
    # tables shared with a forked copy of this process (_beside)
    beside_ok = jobs > 1 and not dask
    try:
        model = build_model(intake, jobs=jobs, dask=dask, progress=say, while_reading=meanwhile,
                            reading=reading)
        say("building the event tables")
        con, made = _connect(model, db, options, beside=beside_ok, opened=_opened(opening.pop()) if opening else None)
    except BaseException:
        for o in opening:
            o.discard()
        raise
    try:
        say("looking for findings")
        if beside_ok:
            (findings, det_problems), prepared = _beside(model, con, options, made, ahead or [])
            findings = complete(Context(model=model, con=con, options=options, made=made), findings)
        else:
            findings, det_problems = run_detectors(Context(model=model, con=con, options=options, made=made))
            prepared = {}
        stored = _storable(findings, det_problems)
        _store_findings(con, stored)
    except BaseException:
        con.close()
        raise
    return Analysis(model=model, con=con, findings=[f for f, _ in stored],
                    problems=list(model.problems) + det_problems, options=options, prepared=prepared)


def _beside(model: Model, con, options: Options, made: dict, ahead: list[Ahead]):
    """((findings, problems), the report steps' ``prepared`` values), made by this process
    and a forked copy of it (:mod:`forensics.beside`): the child the detectors that need no
    database, then the report steps, from the front; this process the detectors that query,
    then the rest from the end. Forked after the connection is made (``collectives`` is made
    there), never with a Dask client's threads about; the child touches only the model's
    frames."""
    steps = [Detect(name) for name in detectors() if not queries(name)] + list(ahead)
    here = [Detect(name) for name in detectors() if queries(name)]
    child = Workspace(_model_only(model, options), Context(model=model, con=NO_DATABASE, options=options,
                                                           made=dict(made)))
    beside = Forked(child_values, child, steps, stream=True)
    ws = Workspace(_model_only(model, options), Context(model=model, con=con, options=options, made=made))
    try:
        values = share_out(beside, steps, ws, first=here)
    except BaseException:
        beside.cancel()
        raise
    return gather({name: values[name] for name in detectors()}), ws.analysis.prepared


class _OnThread:
    """``fn(*args, **kwargs)`` computed on a thread while this one goes on (DuckDB's work: it
    leaves the GIL, so the second core does it). :meth:`result` is its value, or its error
    raised here; :meth:`discard` drops a connection it made, for a caller that failed."""

    def __init__(self, name: str, fn: Callable[..., Any], *args, **kwargs):
        self._box: dict[str, Any] = {}

        def run() -> None:
            try:
                self._box["value"] = fn(*args, **kwargs)
            except BaseException as exc:   # noqa: BLE001 - raised again on the caller's thread
                self._box["error"] = exc

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if "error" in self._box:
            raise self._box.pop("error")
        return self._box.pop("value")

    def discard(self) -> None:
        self._thread.join()
        con = self._box.pop("value", None)
        if con is not None:
            con.close()


def _opening(db) -> _OnThread:
    """The database of ``db`` opened and its tables created empty
    (:func:`.model.database.open_database`) on a thread, while this one merges the hosts."""
    from .model.database import open_database
    return _OnThread("stallscope-open", open_database, str(db) if db else None)


def _opened(opening: _OnThread):
    """The connection :func:`_opening` made (now the caller's), or None where it failed: it is
    opened again where it is used, which says why."""
    try:
        return opening.result()
    except Exception:   # noqa: BLE001 - see above
        return None


def _connect(model: Model, db, options: Options, beside: bool, opened=None) -> tuple[Any, dict]:
    """(the DuckDB connection over the model, the detectors' shared tables made so far). An
    in-memory database loads its event tables only when queried (:mod:`.model.database`).
    A database file is loaded whole now: with ``beside``, on a thread while this one makes
    the shared tables (:func:`forensics.findings.base.prefetch`; the load runs in DuckDB,
    outside the GIL). ``opened``: the database opened already (:func:`_opening`)."""
    if not beside or db is None:
        return model.connect(db, opened=opened), {}
    view = model.without_database_tables()   # taken before the loader may set them
    loader = _OnThread("stallscope-connect", model.connect, db, opened=opened)
    try:
        made = prefetch(view, options)
    except BaseException:
        loader.discard()
        raise
    return loader.result(), made


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
