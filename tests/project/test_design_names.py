"""docs/DESIGN.md says where things are; every code name it gives must still be there.

Checked, for each backticked name in DESIGN.md:
- a source path (``capture/runner.py``, ``model/nccl.py``, ``forensics/execution/``): the file or
  folder exists, from the repository root or from ``forensics/``, ``capture/``, ``tests/``;
- a bare source file name (``hang.py``): some file of the tree has that name;
- ``path.py: name``: the module defines ``name``;
- a dotted name whose head is a module (``report.data.memo``, ``findings.Context.memos``,
  ``session.record``): some module of ``forensics/`` or ``capture/`` ends with a prefix of it and
  the rest resolves on it (attributes, a dataclass's fields, or a method of one of its classes).
Names that are not code (manifest keys, ``--json`` keys, Wireshark fields, variables in
examples) are listed in ``NOT_CODE`` with what they are; a name that is neither fails."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import re

from conftest import ROOT

DESIGN = ROOT / "docs" / "DESIGN.md"
SOURCE_EXT = ("py", "c", "h", "bt", "sh", "j2", "tsv", "toml", "yaml")
BASES = ("", "forensics", "capture", "tests")
NOT_CODE = {
    "watch.pcap_ring": "an object of the manifest (Bundle layout)",
    "job.id": "a key of the manifest's job object (Bundle layout)",
    "watch.stage": "a key of the manifest's watch object (Bundle layout)",
    "watch.stall": "an object of the manifest's watch object (Bundle layout)",
    "capture.clock_skew": "a key of analyze --json",
    "nccl_events.rank": "a column of an event table",
    "tcp.analysis": "Wireshark's field prefix",
    "tcp.stream": "Wireshark's field",
    "sys.path": "Python's",
    "dask.distributed": "an optional dependency",
    "ctx.sql": "a detector's Context, named ctx in the examples (checked on Context below)",
    "ctx.memo": "a detector's Context, named ctx in the examples (checked on Context below)",
    "bpf/nccl.generated.bt": "a file of a bundle",
    "bpf/raw/": "a folder of a bundle",
    "pkg/_m.py": "the house rules' example of a private module",
}


def _modules() -> dict[str, str]:
    out = {}
    for top in ("forensics", "capture"):
        for p in (ROOT / top).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _has(obj, name: str):
    """``obj.name``: an attribute, a dataclass field, or (for a module) a member of one of its classes."""
    if hasattr(obj, name):
        return getattr(obj, name)
    if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
        return dataclasses.MISSING
    if inspect.ismodule(obj):
        for _, cls in inspect.getmembers(obj, inspect.isclass):
            if cls.__module__ == obj.__name__ and (hasattr(cls, name) or (
                    dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)})):
                return getattr(cls, name, dataclasses.MISSING)
    raise AttributeError(name)


def _resolves(dotted: str, modules: dict) -> bool:
    segs = dotted.split(".")
    for full in modules:
        fs = full.split(".")
        for k in range(len(segs), 0, -1):
            if fs[-k:] != segs[:k]:
                continue
            obj = importlib.import_module(full)
            try:
                for a in segs[k:]:
                    obj = _has(obj, a)
                return True
            except AttributeError:
                break
    return False


def _names():
    text = DESIGN.read_text()
    return re.findall(r"`([^`\n]+)`", text)


def test_every_path_design_names_exists():
    files = {p.name for p in ROOT.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts}
    missing = []
    for tok in _names():
        tok = tok.split(":")[0].strip()
        if re.search(r"[<>{}*\s]", tok):
            continue                                   # a template or a glob: bundle paths, patterns
        m = re.fullmatch(r"([\w./-]+?)/?", tok)
        if not m:
            continue
        path = m.group(1)
        is_source = re.search(r"\.(%s)$" % "|".join(SOURCE_EXT), path)
        if "/" not in path:
            if is_source and path not in files:
                missing.append(tok)
            continue
        if not (is_source or tok.endswith("/")) or path.startswith(("/", "../")):
            continue                                   # a bundle's data file, a host path
        if tok not in NOT_CODE and not any((ROOT / base / path).exists() for base in BASES):
            missing.append(tok)
    assert not missing, f"DESIGN.md names paths that do not exist: {sorted(set(missing))}"


def test_every_symbol_design_names_resolves():
    modules = _modules()
    wrong = []
    for tok in _names():
        m = re.fullmatch(r"([\w/]+)\.py: *([A-Za-z_]\w*)", tok)
        if m:
            path = next((base + "/" + m.group(1) + ".py").strip("/") for base in BASES
                        if (ROOT / base / (m.group(1) + ".py")).exists()) if any(
                (ROOT / b / (m.group(1) + ".py")).exists() for b in BASES) else None
            mod = path and importlib.import_module(path[:-3].replace("/", "."))
            try:
                if not mod:
                    raise AttributeError(tok)
                _has(mod, m.group(2))
            except AttributeError:
                wrong.append(tok)
            continue
        if not re.fullmatch(r"[a-z_]\w*(\.[A-Za-z_]\w*)+", tok) or re.search(r"\.(%s|json|jsonl|txt|md|pcap|gz|"
                                                                           r"duckdb|html|csv|log|out|err)$"
                                                                           % "|".join(SOURCE_EXT), tok):
            continue
        if tok in NOT_CODE:
            continue
        if not _resolves(tok, modules):
            wrong.append(tok)
    assert not wrong, f"DESIGN.md names code that does not exist: {sorted(set(wrong))}"


def test_the_names_listed_as_not_code_are_still_in_design_and_the_context_has_its_methods():
    names = set(_names())
    assert set(NOT_CODE) <= names, f"no longer in DESIGN.md: {sorted(set(NOT_CODE) - names)}"
    from forensics.findings import Context
    assert callable(Context.sql) and callable(Context.memo)


def test_capture_readme_lists_every_module_of_capture():
    """capture/README.md's module table is where an operator looks a module up: none missing."""
    text = (ROOT / "capture" / "README.md").read_text()
    table = text[:text.index("\n\n", text.index("| module |"))]
    listed = set(re.findall(r"`([\w/]+(?:\.py|/))`", table))
    mods = {p.name for p in (ROOT / "capture").glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    pkgs = {p.name + "/" for p in (ROOT / "capture").iterdir() if (p / "__init__.py").exists()}
    assert not (mods | pkgs) - listed, f"capture/README.md's table misses {sorted((mods | pkgs) - listed)}"
