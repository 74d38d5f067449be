"""Findings: typed records and the detector registry (DESIGN.md "Findings").

A detector is a function ``detect(ctx: Context) -> list[Finding]`` declared with
``@detector("name", kinds=(...))`` in the module of the kinds it emits (``network.py``:
network_loss and slow_link, ``hang.py``: the hangs, ``connection_reset.py``, ...): every
kind has one owner module, which the registry enforces (:func:`detector`, :func:`owners`),
and a detector that returns a kind it did not declare fails. Where several bodies of
evidence can see the same event, the owner consults them through the declared precedence
of :mod:`forensics.findings.precedence`. ``forensics/findings/_registered.py`` only imports
the detector modules, so adding a kind of finding is adding one file.
:mod:`forensics.findings.runner` runs every registered detector on a model, isolates a detector
that fails (its failure becomes a problem line, the others still run), and orders the findings
most important first. This module imports no other module of the package: every one of them
may import it.

Severity from impact, not counts: a finding about slowness (network_loss, slow_link,
straggler) carries ``impact_share``, the share of the job's collective time its slow
collectives explain (:func:`forensics.findings.impact.impact`), and takes its severity
from it (:func:`impact_severity`): a handful of retransmissions on a busy host that cost
nothing measurable is no warning, however many there are.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import pandas as pd

from ..model import memo

SCHEMA_VERSION = 1
SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

# impact_share -> severity (impact_severity)
IMPACT_INFO_SHARE = 0.02        # the slow collectives explain less than this of the collective time: info
IMPACT_FEW_SHARE = 0.05         # ... or less than this with fewer than IMPACT_FEW_COLLECTIVES of them: info
IMPACT_FEW_COLLECTIVES = 5
IMPACT_ERROR_SHARE = 0.25       # a quarter of the job's collective time or more: error
HEADLINE_CHARS = 200
LAYERS = ("host", "peer", "transport")   # Finding.layer: never enqueued / waiting on a peer / transport stalled
STOPS_JOB_SCORE = 1e6           # hangs score 1e6 + seconds, a reset that broke collectives 2e6: first


def impact_severity(share: float, slow_collectives: int, ceiling: str = "error") -> str:
    """The severity a finding's impact earns: ``info`` below IMPACT_INFO_SHARE (or below
    IMPACT_FEW_SHARE with fewer than IMPACT_FEW_COLLECTIVES slow collectives), ``error``
    from IMPACT_ERROR_SHARE, else ``warning``; never above ``ceiling`` (what the
    detector's evidence allows)."""
    if share < IMPACT_INFO_SHARE or (share < IMPACT_FEW_SHARE and slow_collectives < IMPACT_FEW_COLLECTIVES):
        earned = "info"
    elif share >= IMPACT_ERROR_SHARE:
        earned = "error"
    else:
        earned = "warning"
    return max(earned, ceiling, key=SEVERITY_RANK.__getitem__)


@dataclass
class Finding:
    """One ranked verdict with its evidence (the ``--json`` contract of DESIGN.md)."""

    kind: str                      # network_loss, slow_link, straggler, hang_mismatch, hang_stuck, ...
    severity: str                  # error | warning | info
    confidence: float              # 0..1: how sure the evidence makes us
    summary: str                   # one sentence, numbers included, readable on its own
    ranks: list[int] = field(default_factory=list)        # global ranks the finding blames
    hosts: list[str] = field(default_factory=list)
    peer_ranks: list[int] = field(default_factory=list)   # the other ends of blamed links
    links: list[dict[str, Any]] = field(default_factory=list)   # {"rank", "peer_rank", "saddr", "daddr", ...}
    evidence: list[dict[str, Any]] = field(default_factory=list)  # rows (JSON-able) that back the verdict
    sql: str = ""                  # runs with `stallscope query BUNDLE "..."` and returns the evidence
    action: str = ""               # what to do next
    score: float = 0.0             # ordering within a severity (impact), detector-defined
    details: dict[str, Any] = field(default_factory=dict)   # key numbers for the report (p50/p99, counts...)
    # slowness findings: the share of the job's collective time their slow collectives explain
    # (impact.impact); the severity follows it (impact_severity) and so does the order
    impact_share: float | None = None
    # hangs and failures: the collective as NCCL counts it (opCount) and as PyTorch does (SeqNum,
    # Flight Recorder's collective_seq_id), and since when (UTC ns), from which evidence (a hang
    # known from the logs alone has a SeqNum and no opCount); None where the evidence does not say
    op_count: int | None = None
    seq: int | None = None
    since_ns: int | None = None
    since_source: str | None = None
    since_precision_ns: int | None = None    # how well since_ns is known (forensics.findings.onset)
    # the verdict in one line of at most HEADLINE_CHARS: what happened, to which rank on which
    # host, since when (the report's first screen; the summary keeps every number)
    headline: str = ""
    # the capture nodes of the blamed ranks, where they differ from the ranks' own host names
    nodes: list[str] = field(default_factory=list)
    # what raised or lowered the confidence, in one line
    confidence_note: str = ""
    # which of the three questions of a stall the finding answers (LAYERS): ``host`` (the
    # collective was never enqueued, or late: which rank, which frame), ``peer`` (enqueued and
    # waiting on a peer: which peer, which link), ``transport`` (the transport stalled:
    # retransmits, RTO backoff, resets, link state); ``chain``: its evidence in order, one
    # step a line. Optional: kinds that do not set them leave them out of --json (to_json)
    layer: str | None = None
    chain: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"unknown severity {self.severity!r}")
        self.confidence = float(min(1.0, max(0.0, self.confidence)))
        if self.impact_share is not None:
            self.impact_share = float(min(1.0, max(0.0, self.impact_share)))
        if self.layer is not None and self.layer not in LAYERS:
            raise ValueError(f"unknown layer {self.layer!r}")

    def to_json(self) -> dict[str, Any]:
        """The finding as --json prints it; ``layer`` and ``chain`` only where the detector set
        a layer (additive: the findings of kinds that do not set one are unchanged)."""
        d = asdict(self)
        if self.layer is None:
            d.pop("layer")
            d.pop("chain")
        return json.loads(json.dumps(d, default=_jsonable))


def _jsonable(v: Any) -> Any:
    """numpy / pandas scalars and other odd values in evidence rows -> JSON."""
    if hasattr(v, "item"):
        try:
            return v.item()
        except (ValueError, TypeError):
            pass
    if hasattr(v, "tolist"):
        return v.tolist()
    try:
        if v is None or v is pd.NA or v is pd.NaT or bool(pd.isna(v)):
            return None
    except (TypeError, ValueError):   # pd.isna of a container
        pass
    return str(v)


@dataclass
class Options:
    slow_ms: float = 50.0          # a collective slower than this is "slow" (the article's 50 ms)


@dataclass
class Context:
    """What a detector sees: the model's tables (DataFrames), a DuckDB connection over
    them (``con``; tables ``nccl_events``, ``tcp_events``, ``collectives``, ...), options."""

    model: Any
    con: Any
    options: Options = field(default_factory=Options)
    # the values computed once so far (:meth:`memo`), by key
    memos: dict = field(default_factory=dict, repr=False, compare=False)

    def table(self, name: str):
        return self.model.tables[name]

    def memo(self, key, make: Callable[[], Any]):
        """``make()``'s result, computed once per analysis for ``key`` and kept in
        :attr:`memos` (a table several detectors read, e.g. the TCP trouble per link): a
        DataFrame comes back as a copy, so no detector changes another's view of it."""
        return memo(self.memos, key, make)

    def sql(self, query: str, *params):
        return self.con.execute(query, list(params) if params else None).df()


Detector = Callable[[Context], list[Finding]]
_DETECTORS: dict[str, Detector] = {}
_QUERIES: set[str] = set()       # the detectors that may query the database (Context.sql)
_KINDS: dict[str, tuple[str, ...]] = {}   # detector -> the finding kinds it emits
_OWNERS: dict[str, str] = {}     # finding kind -> the module of the detectors that emit it


def detector(name: str, *, kinds: tuple[str, ...], queries: bool = False) -> Callable[[Detector], Detector]:
    """Register a detector that emits findings of ``kinds`` (and no other: :func:`run_detector`
    fails it otherwise). A kind has one owner: every detector that emits it is defined in the
    same module (ValueError at registration otherwise). ``queries``: it may run SQL
    (:meth:`Context.sql`), so it runs where the database is (not in a forked process beside
    the others, see :mod:`forensics.execution.shared_steps`)."""
    if not kinds:
        raise ValueError(f"detector {name!r} declares no finding kind")

    def register(fn: Detector) -> Detector:
        if name in _DETECTORS:
            raise ValueError(f"detector {name!r} registered twice")
        for kind in kinds:
            owner = _OWNERS.get(kind, fn.__module__)
            if owner != fn.__module__:
                raise ValueError(f"detector {name!r} of {fn.__module__} emits {kind!r}, which {owner} owns")
        _OWNERS.update({kind: fn.__module__ for kind in kinds})
        _DETECTORS[name] = fn
        _KINDS[name] = tuple(kinds)
        if queries:
            _QUERIES.add(name)
        return fn
    return register


def detectors() -> dict[str, Detector]:
    return dict(_DETECTORS)


def kinds_of(name: str) -> tuple[str, ...] | None:
    """The finding kinds the detector ``name`` declared (None: a detector put in the table by
    hand, in tests, declared none)."""
    return _KINDS.get(name)


def owners() -> dict[str, str]:
    """Finding kind -> the module whose detectors emit it (one per kind)."""
    return dict(_OWNERS)


def queries(name: str) -> bool:
    """Whether the detector ``name`` was declared to query the database."""
    return name in _QUERIES


class NeedsDatabase(Exception):
    """A detector read the database where there is none (:data:`NO_DATABASE`): it is run
    again where there is one, not reported as failed."""


class _NoDatabase:
    """``Context.con`` of a process without the database (a fork must not touch DuckDB's
    connection): any use raises :class:`NeedsDatabase`."""

    def __getattr__(self, name: str):
        raise NeedsDatabase(name)


NO_DATABASE = _NoDatabase()
