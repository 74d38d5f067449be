"""The house rules the product's code keeps (docs/DESIGN.md, "House rules"), checked on its
source with :mod:`ast`, so that a change that breaks one fails here, naming where.

- No private name across modules: ``from X import _name``, ``import X._name`` and
  ``X._name`` (X a module of the project) only inside the module that defines ``_name``; a
  private module (``pkg/_m.py``) only inside its package. What several modules use is
  public in its owner. Over ``forensics/`` and ``capture/`` (tests may reach inside).
- Sizes: no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES, no class
  over MAX_CLASS_LINES, in ``forensics/``, ``capture/`` and the lab (``tests/lab/``). Tables
  of data are the only exception, each in SIZE_EXCEPTIONS with its reason.
- No import inside a function (an import dodging a circle hides it from readers; there is
  none: tests/project/test_import_graph.py) except where a reason holds: a command line
  module imports what its command runs (LAZY_IMPORT_MODULES), a package that costs start-up
  time or is optional is loaded where it is needed (LAZY_IMPORT_PACKAGES), and the pairs of
  LAZY_IMPORT_PAIRS, each with its reason. Over ``forensics/`` and ``capture/``.
- One set of int readers: a module-level function named as one (``_int``, ``to_int``,
  ``int_or_none``, ...) is defined only in ``forensics/coerce.py``, whose readers each name
  the kind of value they read (a regex group, a JSON value, a pandas cell, ...). Over
  ``forensics/``; ``capture/`` keeps to the standard library and its own.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT
from import_paths import from_module

PRODUCT = ("forensics", "capture")
SIZED = PRODUCT + ("tests/lab",)
MAX_MODULE_LINES = 900
MAX_FUNCTION_LINES = 120
MAX_CLASS_LINES = 450
# "path" or "path:Qualified.name" -> why it may exceed its limit (tables of data only)
SIZE_EXCEPTIONS: dict[str, str] = {}
# imports inside functions: the importing module (a path or a folder's prefix) -> why
COMMAND_LINE = ("the command line: each command imports what it runs when it runs, so `stallscope capture` "
                "starts without numpy or the analyzer (DESIGN.md, Commands)")
LAZY_IMPORT_MODULES: dict[str, str] = {
    "forensics/cli.py": COMMAND_LINE, "forensics/commands/": COMMAND_LINE, "capture/cli.py": COMMAND_LINE,
}
# the imported top-level package -> why it is imported where it is needed
LAZY_IMPORT_PACKAGES: dict[str, str] = {
    "duckdb": "~0.1 s to import: only a process that opens a database loads it (worker processes read hosts "
              "without it; analyze imports it on a thread while the hosts are read)",
    "jinja2": "only the HTML report renders templates",
    "distributed": "optional: only --dask ADDRESS needs dask.distributed",
}
# (importing path, imported module as written) -> why
LAZY_IMPORT_PAIRS: dict[tuple[str, str], str] = {
    ("forensics/model/__init__.py", ".database"): "the model's database, and duckdb with it, only when connected",
    ("forensics/execution/thread_call.py", "..model.database"): "execution's scheduling modules import no analyzer "
                                                                "code at module level",
    ("forensics/execution/reader_pool.py", "..model.hosts"): "reader_pool imports the standard library only: analyze "
                                                             "starts its workers before pandas and the analyzer load",
    ("forensics/execution/reader_pool.py", "concurrent.futures"): "the same: nothing but what forking the workers needs",
    ("forensics/execution/memory.py", "ctypes"): "glibc's mallopt is reached only when an analysis asks for it",
    ("forensics/inputs/loose.py", "pandas"): "forensics.inputs sorts the user's paths with the standard library; "
                                             "pandas only to merge the shares of a loose set",
    ("forensics/tcp/engine.py", "pandas"): "the TCP engine works in numpy (`stallscope tcp` needs no pandas); a "
                                           "frame only when one is asked for",
    ("forensics/inputs/intake.py", "capture.bundle_files"): "the analyzer reads one setting with capture's size "
                                                            "parser; capture's modules stay out of its start-up",
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def sources(*roots: str) -> list[Path]:
    """Every Python file under ``roots`` (relative to the repository), sorted."""
    return sorted(p for r in roots for p in (ROOT / r).rglob("*.py"))


def module_of(path: Path) -> str:
    """The dotted module name of a file of the repository (``forensics/model/__init__.py``:
    ``forensics.model``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True)
class Modules:
    """The project's modules by dotted name, each with whether it is a package."""

    packages: frozenset[str]
    modules: frozenset[str]

    @classmethod
    def of(cls, paths: list[Path]) -> "Modules":
        return cls(frozenset(module_of(p) for p in paths if p.name == "__init__.py"),
                   frozenset(module_of(p) for p in paths))

    def __contains__(self, name: str) -> bool:
        return name in self.modules

    @property
    def roots(self) -> frozenset[str]:
        """The top-level packages (``forensics``, ``capture``)."""
        return frozenset(m.split(".")[0] for m in self.modules)


def _owner_of_private_module(name: str) -> str | None:
    """The package a module name is private to: its parent where its last private part is
    (``a.b._c.d``: ``a.b``), None when no part is private."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if _is_private(parts[i]):
            return ".".join(parts[:i])
    return None


def _may_import_module(importer: str, target: str) -> bool:
    """Whether ``importer`` may import the module ``target`` (a private module only from its
    own package, or below it)."""
    owner = _owner_of_private_module(target)
    return owner is None or importer == owner or importer.startswith(owner + ".")


def private_uses(source: str, module: str, known: Modules) -> list[str]:
    """Where ``source`` (the text of ``module``) uses a private name of another module of
    ``known``: one line each, "line N: what"."""
    tree = ast.parse(source)
    here = module if module in known.packages else module.rpartition(".")[0]
    # local name -> (the project module it is or comes from, whether it is that module)
    bound: dict[str, tuple[str, bool]] = {}
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] not in known.roots:
                    continue
                if not _may_import_module(module, a.name):
                    out.append(f"line {node.lineno}: import {a.name}")
                local = a.asname or a.name.split(".")[0]
                bound[local] = (a.name if a.asname else local, True)
        elif isinstance(node, ast.ImportFrom):
            source_mod = from_module(here, node)
            if source_mod not in known:
                continue
            for a in node.names:
                full = f"{source_mod}.{a.name}"
                if full in known:            # a module of a package
                    if not _may_import_module(module, full):
                        out.append(f"line {node.lineno}: from {source_mod} import {a.name}")
                    bound[a.asname or a.name] = (full, True)
                else:
                    if _is_private(a.name) and source_mod != module:
                        out.append(f"line {node.lineno}: from {source_mod} import {a.name}")
                    bound[a.asname or a.name] = (source_mod, False)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            chain = _dotted(node.value)
            if chain is None or chain.split(".")[0] not in bound:
                continue
            first, *rest = chain.split(".")
            owner, is_module = bound[first]
            while is_module and rest and f"{owner}.{rest[0]}" in known:   # down to the module that owns it
                owner = f"{owner}.{rest.pop(0)}"
            if owner != module and not (is_module and not rest and f"{owner}.{node.attr}" in known):
                out.append(f"line {node.lineno}: {chain}.{node.attr}")
    return sorted(set(out), key=lambda s: int(s.split(":")[0].split()[1]))


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` of a chain of attributes on a name; None for anything else."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + names[::-1])


def oversized(rel: str, text: str) -> list[str]:
    """What in ``text``, the file at ``rel`` (relative to the repository), exceeds its size
    limit, less SIZE_EXCEPTIONS: one line each."""
    out = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES and rel not in SIZE_EXCEPTIONS:
        out.append(f"{rel}: module of {lines} lines (at most {MAX_MODULE_LINES})")

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                n = child.end_lineno - child.lineno + 1
                limit, what = ((MAX_CLASS_LINES, "class") if isinstance(child, ast.ClassDef)
                               else (MAX_FUNCTION_LINES, "function"))
                if n > limit and f"{rel}:{name}" not in SIZE_EXCEPTIONS:
                    out.append(f"{rel}:{child.lineno}: {what} {name} of {n} lines (at most {limit})")
                visit(child, name + ".")
            else:
                visit(child, prefix)
    visit(ast.parse(text), "")
    return out


# ------------------------------------------------------------------ the checks themselves

KNOWN = Modules.of(sources(*PRODUCT))


def test_no_private_name_is_used_across_modules():
    found = [f"{p.relative_to(ROOT)}: {use}" for p in sources(*PRODUCT)
             for use in private_uses(p.read_text(), module_of(p), KNOWN)]
    assert found == [], "private names used outside their module (make them public in their owner):\n" \
        + "\n".join(found)


def test_no_module_function_or_class_exceeds_its_size():
    found = [line for p in sources(*SIZED) for line in oversized(str(p.relative_to(ROOT)), p.read_text())]
    assert found == [], "over the house's sizes:\n" + "\n".join(found)


def test_every_size_exception_names_something_that_exists():
    for key in SIZE_EXCEPTIONS:
        assert (ROOT / key.partition(":")[0]).is_file(), key


INT_READER_NAME = re.compile(r"_?(to_|as_|maybe_|opt_)?ints?(_or_none)?")
COERCE = "forensics/coerce.py"


def int_readers(text: str) -> list[str]:
    """``line: name`` of each module-level function of ``text`` named as an int reader."""
    return [f"{n.lineno}: {n.name}" for n in ast.parse(text).body
            if isinstance(n, ast.FunctionDef) and INT_READER_NAME.fullmatch(n.name)]


def test_int_readers_live_in_coerce_only():
    found = [f"{p.relative_to(ROOT)}:{r}" for p in sources("forensics") if str(p.relative_to(ROOT)) != COERCE
             for r in int_readers(p.read_text())]
    assert found == [], f"int readers outside {COERCE} (use or add a named reader there):\n" + "\n".join(found)


def test_an_int_reader_outside_coerce_is_found():
    text = "def _int(v):\n    return int(v)\n\ndef _interval(v):\n    pass\n\ndef to_ints(v):\n    pass\n"
    assert int_readers(text) == ["1: _int", "7: to_ints"]


def function_imports(text: str) -> list[tuple[int, str]]:
    """(line, the module as written) of every import inside a function of ``text``."""
    out = []
    for fn in ast.walk(ast.parse(text)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(fn):
                if isinstance(n, ast.Import):
                    out += [(n.lineno, a.name) for a in n.names]
                elif isinstance(n, ast.ImportFrom):
                    out.append((n.lineno, "." * n.level + (n.module or "")))
    return sorted(set(out))


def lazy_import_reason(path: str, module: str) -> str | None:
    """Why ``path`` may import ``module`` inside a function, None when nothing allows it."""
    for prefix, why in LAZY_IMPORT_MODULES.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return why
    return LAZY_IMPORT_PACKAGES.get(module.split(".")[0]) or LAZY_IMPORT_PAIRS.get((path, module))


def test_no_import_inside_a_function_without_its_reason():
    found = [f"{p.relative_to(ROOT)}:{line}: {mod}" for p in sources(*PRODUCT)
             for line, mod in function_imports(p.read_text())
             if lazy_import_reason(str(p.relative_to(ROOT)), mod) is None]
    assert found == [], ("imports inside functions with no reason listed (import at module level; or add the "
                         "reason to LAZY_IMPORT_*):\n" + "\n".join(found))


def test_every_listed_lazy_import_is_still_there():
    used = {(str(p.relative_to(ROOT)), mod) for p in sources(*PRODUCT) for _, mod in function_imports(p.read_text())}
    assert set(LAZY_IMPORT_PAIRS) <= used, set(LAZY_IMPORT_PAIRS) - used
    for prefix in LAZY_IMPORT_MODULES:
        assert (ROOT / prefix).exists(), prefix


def test_an_import_inside_a_function_is_found_and_a_listed_one_passes():
    text = "import os\n\ndef f():\n    from .x import y\n    import duckdb\n    return y\n"
    assert function_imports(text) == [(4, ".x"), (5, "duckdb")]
    assert lazy_import_reason("forensics/a.py", ".x") is None
    assert lazy_import_reason("forensics/a.py", "duckdb") and lazy_import_reason("forensics/commands/q.py", ".x")


# ------------------------------------------------------------------ the checker catches what it should

TOY = Modules(packages=frozenset({"pkg", "pkg.sub"}),
              modules=frozenset({"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub._reg", "pkg.sub.c"}))


@pytest.mark.parametrize("source, module, expected", [
    ("from .a import _helper", "pkg.b", ["line 1: from pkg.a import _helper"]),
    ("from pkg.a import _helper", "pkg.b", ["line 1: from pkg.a import _helper"]),
    ("from ..a import public, _x as y", "pkg.sub.c", ["line 1: from pkg.a import _x"]),
    ("from . import a\n\nv = a._table", "pkg.b", ["line 3: a._table"]),
    ("import pkg.a\nv = pkg.a._table", "pkg.b", ["line 2: pkg.a._table"]),
    ("import pkg.a as m\nv = m._table", "pkg.b", ["line 2: m._table"]),
    ("from .a import Thing\nThing._private()", "pkg.b", ["line 2: Thing._private"]),   # a class's, too
    ("from .sub import c\nv = c.Thing._x", "pkg.b", ["line 2: c.Thing._x"]),
    ("from .sub import _reg", "pkg.b", ["line 1: from pkg.sub import _reg"]),
    ("import pkg.sub._reg", "pkg.a", ["line 1: import pkg.sub._reg"]),
    ("from ._reg import _x", "pkg.sub", ["line 1: from pkg.sub._reg import _x"]),   # its own module's names
])
def test_a_private_name_used_across_modules_is_found(source, module, expected):
    assert private_uses(source, module, TOY) == expected


@pytest.mark.parametrize("source, module", [
    ("from .a import public\nfrom . import a\nv = a.public", "pkg.b"),
    ("from . import _reg", "pkg.sub"),                 # a package imports its private module
    ("from ._reg import public", "pkg.sub.c"),        # ... and so does a module of it
    ("_x = 1\nimport pkg.b\nv = pkg.b._x", "pkg.b"),  # a module's own private name
    ("import pkg.sub\nv = pkg.sub.c.public", "pkg.b"),
    ("from .a import Thing\nThing.__name__", "pkg.b"),
    ("import os\nos._exit(0)", "pkg.b"),              # not a module of the project
    ("from .a import __doc__", "pkg.b"),              # dunder names are not private
    ("def f(self):\n    return self._x", "pkg.b"),    # an object's attribute, not a module's
])
def test_what_is_not_a_private_name_across_modules_passes(source, module):
    assert private_uses(source, module, TOY) == []


@pytest.mark.parametrize("kind, limit", [("def", MAX_FUNCTION_LINES), ("class", MAX_CLASS_LINES)])
def test_an_oversized_function_or_class_is_found_and_one_at_its_limit_is_not(kind, limit):
    def source(lines: int) -> str:      # a def or class of exactly ``lines`` lines
        head = "def f():" if kind == "def" else "class C:"
        return head + "\n" + "\n".join(f"    x{i} = {i}" for i in range(lines - 1)) + "\n"
    assert oversized("capture/toy.py", source(limit)) == []
    [found] = oversized("capture/toy.py", source(limit + 1))
    assert found.startswith("capture/toy.py:1: ") and f"of {limit + 1} lines" in found


def test_an_oversized_module_is_found():
    assert oversized("capture/toy.py", "x = 1\n" * MAX_MODULE_LINES) == []
    assert oversized("capture/toy.py", "x = 1\n" * (MAX_MODULE_LINES + 1)) == [
        f"capture/toy.py: module of {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})"]
