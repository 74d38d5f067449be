"""One owner per finding kind, and the declared precedence between overlapping evidence.

The registry (forensics.findings.base) knows which kinds each detector emits and which module
owns each kind; forensics.findings.precedence says which body of evidence judges a hang or a
reset that several saw. These tests hold the registry to its declarations, the table to its
shape, and :func:`consult` to the rule it documents (on toy sources, so each case shows one
clause).
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import forensics.findings  # noqa: F401  (registers every detector)
from forensics.findings import Context, Finding, base, precedence, runner
from forensics.findings import connection_reset, hang

FINDINGS = Path(forensics.findings.__file__).parent


def finding(kind: str, summary: str = "x") -> Finding:
    return Finding(kind=kind, severity="info", confidence=1.0, summary=summary)


def toy_context() -> Context:
    return Context(model=None, con=None)


# --------------------------------------------------------------------------- the registry

def test_every_kind_has_one_owner_module_and_every_detector_declares_its_kinds():
    owners = base.owners()
    for name, fn in base.detectors().items():
        kinds = base.kinds_of(name)
        assert kinds, name
        assert all(owners[k] == fn.__module__ for k in kinds), (name, kinds)
    # the hangs and the resets, whatever evidence saw them, each from the module named after them
    assert owners["hang_mismatch"] == owners["hang_stuck"] == "forensics.findings.hang"
    assert owners["connection_reset"] == "forensics.findings.connection_reset"
    assert {"network_loss", "slow_link"} == {k for k, m in owners.items() if m == "forensics.findings.network"}


def test_a_detector_module_builds_only_the_kinds_it_owns():
    """Read from the source: every kind a module with detectors builds a Finding of is one of
    its own kinds (the evidence modules it consults register nothing and are checked through the
    precedence table below)."""
    owners = base.owners()
    detector_modules = {fn.__module__.rsplit(".", 1)[1] for fn in base.detectors().values()}
    for stem in sorted(detector_modules):
        tree = ast.parse((FINDINGS / f"{stem}.py").read_text())
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
        built = {kw.value.value for node in calls if isinstance(node.func, ast.Name) and node.func.id == "Finding"
                 for kw in node.keywords if kw.arg == "kind" and isinstance(kw.value, ast.Constant)}
        # warns.class_finding(ctx, kind, ...): the kind is its second argument
        built |= {node.args[1].value for node in calls
                  if isinstance(node.func, ast.Attribute) and node.func.attr == "class_finding"
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)}
        assert built, stem
        assert all(owners.get(k) == f"forensics.findings.{stem}" for k in built), (stem, built)
    for stem in ("late_state", "timeouts", "socket_errors"):
        text = (FINDINGS / f"{stem}.py").read_text()
        assert "@detector(" not in text, stem


def test_a_second_module_cannot_emit_an_owned_kind():
    def intruder(ctx):
        return []
    intruder.__module__ = "forensics.findings.somewhere_else"
    with pytest.raises(ValueError, match="hang_stuck.*forensics.findings.hang owns"):
        base.detector("intruder", kinds=("hang_stuck",))(intruder)
    assert "intruder" not in base.detectors()
    with pytest.raises(ValueError, match="declares no finding kind"):
        base.detector("nothing", kinds=())


def test_a_detector_that_returns_an_undeclared_kind_fails_like_one_that_raised(monkeypatch):
    monkeypatch.setitem(base._DETECTORS, "stray", lambda ctx: [finding("gpu_error"), finding("hang_stuck")])
    monkeypatch.setitem(base._KINDS, "stray", ("gpu_error",))
    found, problems = runner.run_detector("stray", toy_context())
    assert found == [] and problems == ["detector stray failed: ValueError: emitted hang_stuck, not among its "
                                        "declared kinds"]
    # the twin: the same detector within its declaration
    monkeypatch.setitem(base._KINDS, "stray", ("gpu_error", "hang_stuck"))
    found, problems = runner.run_detector("stray", toy_context())
    assert [f.kind for f in found] == ["gpu_error", "hang_stuck"] and problems == []


# --------------------------------------------------------------------------- the table

def test_the_table_names_only_known_evidence_and_has_no_cycle():
    known = set(precedence.WITNESSES) | set(precedence.PRECEDENCE)
    for name, src in precedence.PRECEDENCE.items():
        assert set(src.yields_to) <= known - {name}, name

    def stronger(name, seen=()):
        assert name not in seen, f"cycle through {name}"
        src = precedence.PRECEDENCE.get(name)
        for s in (src.yields_to if src else ()):
            stronger(s, seen + (name,))
    for name in precedence.PRECEDENCE:
        stronger(name)


def test_every_witness_and_source_has_its_function_registered_by_the_evidence_owner():
    """The table names the evidence; the modules that read it register its functions (the
    table imports none of them): once the package is imported, every name has one."""
    assert set(precedence.SEES) == set(precedence.WITNESSES)
    assert set(precedence.FINDS) == set(precedence.PRECEDENCE)
    assert precedence.SEES[precedence.TRACER].__module__ == "forensics.findings.hang"
    assert precedence.SEES[precedence.PACKETS].__module__ == "forensics.findings.connection_reset"
    with pytest.raises(ValueError, match="registered twice"):
        precedence.finds(precedence.WATCHDOG)(lambda ctx: [])
    with pytest.raises(ValueError, match="not in the precedence table"):
        precedence.sees("no such evidence")


def test_every_source_is_consulted_by_the_owner_of_its_kinds():
    consulted = {s: hang for s in hang.LATE_SOURCES} | {s: connection_reset for s in connection_reset.LATE_SOURCES}
    assert set(consulted) == set(precedence.PRECEDENCE)
    for name, module in consulted.items():
        assert set(precedence.PRECEDENCE[name].kinds) <= set(module.KINDS), name
        assert all(base.owners()[k] == module.__name__ for k in precedence.PRECEDENCE[name].kinds)


# --------------------------------------------------------------------------- consult

def toy_table(monkeypatch, calls: list, *, witness_saw: bool, strong: list, costly: bool = False):
    """A witness W, a source STRONG (finds ``strong``), and WEAK that yields to both."""
    def find(name, out):
        def f(ctx):
            calls.append(name)
            return list(out)
        return f

    def saw(ctx):
        calls.append("W?")
        return witness_saw
    monkeypatch.setattr(precedence, "WITNESSES", {"W": precedence.Witness(costly=costly)})
    monkeypatch.setattr(precedence, "PRECEDENCE", {
        "STRONG": precedence.Source(("k",)),
        "WEAK": precedence.Source(("k",), yields_to=("STRONG", "W")),
    })
    monkeypatch.setattr(precedence, "SEES", {"W": saw})
    monkeypatch.setattr(precedence, "FINDS", {"STRONG": find("STRONG", strong),
                                              "WEAK": find("WEAK", [finding("k", "weak")])})


def test_a_source_yields_to_a_witness_that_saw_the_event(monkeypatch):
    calls: list = []
    toy_table(monkeypatch, calls, witness_saw=True, strong=[])
    assert precedence.consult(toy_context(), "WEAK") == []
    assert calls == ["STRONG", "W?"]            # the weaker source was never consulted
    calls.clear()
    toy_table(monkeypatch, calls, witness_saw=False, strong=[])
    assert [f.summary for f in precedence.consult(toy_context(), "WEAK")] == ["weak"]


def test_a_source_yields_to_a_stronger_source_only_when_that_gave_a_finding(monkeypatch):
    calls: list = []
    toy_table(monkeypatch, calls, witness_saw=False, strong=[finding("k", "strong")])
    ctx = toy_context()
    assert precedence.consult(ctx, "WEAK") == []
    assert [f.summary for f in precedence.consult(ctx, "STRONG")] == ["strong"]
    assert calls == ["STRONG"]                  # made once per analysis, the witness not even asked


def test_a_costly_witness_is_asked_only_when_the_weaker_source_has_something_to_drop(monkeypatch):
    calls: list = []
    toy_table(monkeypatch, calls, witness_saw=True, strong=[], costly=True)
    assert precedence.consult(toy_context(), "WEAK") == []
    assert calls == ["STRONG", "WEAK", "W?"]
    # nothing to drop: the costly witness is not asked, and the verdict is the same
    calls.clear()
    monkeypatch.setitem(precedence.FINDS, "WEAK", lambda ctx: calls.append("WEAK") or [])
    assert precedence.consult(toy_context(), "WEAK") == []
    assert calls == ["STRONG", "WEAK"]


# --------------------------------------------------------------------------- on real evidence

def test_a_reset_the_packets_saw_is_not_judged_again_from_the_warn_lines_by_address():
    """The shipped reset bundle without the tracer's calls: with its packets, the reset is the
    packets' (the WARN lines by address yield); without them, the WARN lines name it."""
    from forensics.execution.host_reading import read_model
    from forensics.model.schema import empty
    from shipped import shipped

    bundle = shipped("reset")
    truth = json.loads((bundle.parent / "scenario.json").read_text())["fault"]
    m = read_model([bundle])
    m.tables["nccl_events"] = empty("nccl_events")
    ctx = Context(model=m, con=m.connect())
    assert precedence.saw(ctx, precedence.PACKETS)
    assert precedence.consult(ctx, precedence.WARN_RESETS) == []
    for t in ("tcp_events", "flows", "packets"):
        m.tables[t] = empty(t)
    ctx = Context(model=m, con=m.connect())
    assert not precedence.saw(ctx, precedence.PACKETS)
    f = precedence.consult(ctx, precedence.WARN_RESETS)
    assert [(x.kind, x.ranks, x.peer_ranks) for x in f] == [("connection_reset", truth["ranks"],
                                                               [truth["reset_sent_to_rank"]])]
