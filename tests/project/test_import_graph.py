"""House rule: no import circle among the product's modules (docs/DESIGN.md, "House rules").

The graph is read from the source with :mod:`ast`: a node per module of ``forensics/`` and
``capture/`` (a package is its ``__init__``), an edge from a module to each module of the
project it imports, wherever the import statement stands: at the top, under ``if`` or
``try``, inside a function (an import put there only to dodge a circle is still one), under
``if TYPE_CHECKING:``. How a statement names its module:

- ``import a.b.c``: the module ``a.b.c``;
- ``from X import n`` (``X`` absolute or relative, resolved from the importing module's package):
  the module ``X.n`` when there is one, else ``X`` itself, so ``from . import __version__`` in a
  package's module imports that package, and ``from .base import Finding`` imports ``base``.

The packages a statement's module sits in are not edges: Python runs their ``__init__`` first,
but a package that imports its own modules would otherwise be a circle with each of them.
A circle is a strongly connected component of the graph with more than one module; the failure
names each, with one circle through it, statement by statement.
"""
from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from conftest import ROOT
from import_paths import from_module

PRODUCT = ("forensics", "capture")


def module_of(path: Path) -> str:
    """The dotted name of a file of the repository (``forensics/model/__init__.py``: ``forensics.model``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_sources() -> dict[str, str]:
    """Module name -> its source text, for every module of the product."""
    return {module_of(p): p.read_text() for r in PRODUCT for p in sorted((ROOT / r).rglob("*.py"))}


def imports_of(source: str, module: str, packages: set[str], known: set[str]) -> dict[str, list[str]]:
    """The modules of ``known`` that ``source`` (the text of ``module``; ``packages``: the known
    names that are packages) imports: target -> where, "line N" (", in a function" for a
    statement inside a def)."""
    tree = ast.parse(source)
    here = module if module in packages else module.rpartition(".")[0]
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    out: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source_mod = from_module(here, node)
            targets = [f"{source_mod}.{a.name}" if f"{source_mod}.{a.name}" in known else source_mod
                       for a in node.names]
        else:
            continue
        where = f"line {node.lineno}" + (", in a function" if id(node) in in_function else "")
        for t in targets:
            if t in known and t != module and where not in out.get(t, []):
                out.setdefault(t, []).append(where)
    return out


def import_graph(sources: dict[str, str], packages: set[str]) -> dict[str, dict[str, list[str]]]:
    """Module -> {module it imports -> where} over ``sources`` (module name -> text)."""
    known = set(sources)
    return {m: imports_of(text, m, packages, known) for m, text in sources.items()}


def circles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module, each sorted,
    in the order of their first module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next((w for w in edges if w in graph), None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def one_circle(graph: dict[str, dict[str, list[str]]], component: list[str]) -> list[str]:
    """A shortest circle through the first module of ``component``, one step a line:
    "a -> b (line 3, in a function)"."""
    start, members = component[0], set(component)
    came: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w not in members or w in came:
                continue
            came[w] = v
            if w == start:
                queue.clear()
                break
            queue.append(w)
    path, w = [start], start
    while True:
        w = came[w]
        path.append(w)
        if w == start:
            break
    path.reverse()
    return [f"{a} -> {b} ({'; '.join(graph[a][b])})" for a, b in zip(path, path[1:])]


def describe(graph: dict[str, dict[str, list[str]]], found: list[list[str]]) -> str:
    return "\n".join(f"circle of {len(c)} modules: {', '.join(c)}\n    " + "\n    ".join(one_circle(graph, c))
                     for c in found)


# ------------------------------------------------------------------ the check itself

def test_no_import_circle_among_the_products_modules():
    sources = product_sources()
    packages = {module_of(p) for r in PRODUCT for p in (ROOT / r).rglob("__init__.py")}
    graph = import_graph(sources, packages)
    assert len(graph) > 100 and any(graph.values())        # it read the tree
    found = circles(graph)
    assert found == [], ("import circles (move what both sides need into a module below them, or "
                         "register instead of importing back; an import inside a function is one too):\n"
                         + describe(graph, found))


def test_the_report_imports_no_module_of_findings():
    """docs/DESIGN.md, "Dependencies go one way": what the report and the detectors both use is
    below both (the words in ``forensics/wording.py``, a rank's hosts in the model), so the
    report does not load detector modules to format a number."""
    sources = product_sources()
    packages = {module_of(p) for r in PRODUCT for p in (ROOT / r).rglob("__init__.py")}
    graph = import_graph(sources, packages)
    assert any(m.startswith("forensics.report.") for m in graph)
    wrong = {f"{m} -> {t} ({'; '.join(where)})" for m, deps in graph.items()
             if m == "forensics.report" or m.startswith("forensics.report.")
             for t, where in deps.items() if t == "forensics.findings" or t.startswith("forensics.findings.")}
    assert not wrong, "the report imports findings modules:\n" + "\n".join(sorted(wrong))


# ------------------------------------------------------------------ the checker catches what it should

def toy(**modules: str) -> dict[str, dict[str, list[str]]]:
    """The graph of toy modules, keyword names with "__" for "." (``pkg__a``: ``pkg.a``); a
    name that is the head of another is a package."""
    sources = {name.replace("__", "."): text for name, text in modules.items()}
    packages = {m for m in sources if any(o.startswith(m + ".") for o in sources)}
    return import_graph(sources, packages)


def test_a_circle_through_an_import_inside_a_function_is_found_and_named():
    g = toy(pkg="", pkg__a="from .b import thing\n",
            pkg__b="def f():\n    from .a import other\n    return other\n")
    assert g["pkg.b"] == {"pkg.a": ["line 2, in a function"]}
    assert circles(g) == [["pkg.a", "pkg.b"]]
    assert describe(g, circles(g)) == ("circle of 2 modules: pkg.a, pkg.b\n"
                                       "    pkg.a -> pkg.b (line 1)\n"
                                       "    pkg.b -> pkg.a (line 2, in a function)")


def test_from_a_package_import_a_name_imports_the_package():
    """``from . import __version__`` imports the package; with a package that imports the
    module back (``from .runner import run``), that is a circle."""
    g = toy(pkg="__version__ = '1'\n", pkg__runner="from . import __version__\n")
    assert g["pkg.runner"] == {"pkg": ["line 1"]} and circles(g) == []
    g = toy(pkg="def __getattr__(n):\n    from .runner import run\n    return run\n",
            pkg__runner="from . import __version__\n")
    assert circles(g) == [["pkg", "pkg.runner"]]


def test_imports_resolve_to_the_module_not_to_its_packages():
    g = toy(pkg="from . import a\n", pkg__a="from .sub.c import x\n", pkg__sub="", pkg__sub__c="import pkg.a\n",
            pkg__b="from .sub import c\nfrom ..pkg import a\nimport os\n")
    assert g["pkg"] == {"pkg.a": ["line 1"]}           # a module of the package, not the package
    assert g["pkg.b"] == {"pkg.sub.c": ["line 1"], "pkg.a": ["line 2"]}
    assert toy(pkg="", pkg__a="", pkg__b="from . import a, __doc__\nfrom .a import x, y\n")["pkg.b"] == {
        "pkg.a": ["line 1", "line 2"], "pkg": ["line 1"]}    # one statement is named once
    assert circles(g) == [["pkg.a", "pkg.sub.c"]]      # and the package that holds both is no part of it


def test_a_chain_without_a_way_back_is_no_circle():
    g = toy(pkg="", pkg__a="from .b import x\n", pkg__b="from .c import y\n", pkg__c="import json\n")
    assert circles(g) == []
