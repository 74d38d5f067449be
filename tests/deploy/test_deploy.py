"""deploy/: the recipes parse, run the watcher with no per-job option, and the DaemonSet names
the image the project builds (deploy/image/Containerfile, tagged with pyproject.toml's version),
whose Debian packages exist in Debian 12 and whose copied files exist and suffice to run the
capture with the standard library alone; every program the capture runs is in the image or
named as left out with its reason (deploy/image/tools.tsv). No image is built here."""
from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT

DEPLOY = ROOT / "deploy"
CONTAINERFILE = DEPLOY / "image" / "Containerfile"
DAEMONSET = DEPLOY / "kubernetes" / "stallscope-daemonset.yaml"
UNIT = DEPLOY / "systemd" / "stallscope-watch.service"
SLURM = sorted((DEPLOY / "slurm").glob("*.sh"))
TOOLS_TSV = DEPLOY / "image" / "tools.tsv"
PER_JOB_FLAGS = ("--pid", "--nccl-lib", "--iface", "--attach", "--nccl-tests")


def _version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile: comments dropped, continuations joined."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    assert not cur, "a continuation line at the end of the Containerfile"
    return out


def _apt_packages(instr) -> set[str]:
    pkgs: set[str] = set()
    for word, args in instr:
        if word != "RUN":
            continue
        for cmd in re.split(r"&&|;", args):
            argv = [a for a in shlex.split(cmd) if "=" not in a or a.startswith("-")]
            if "apt-get" in argv and "install" in argv:
                pkgs |= {a for a in argv[argv.index("install") + 1:] if not a.startswith("-")}
    return pkgs


def _tools() -> dict[str, tuple[str | None, bool, str]]:
    """deploy/image/tools.tsv: program -> (package or None when left out, essential, why)."""
    out = {}
    for line in TOOLS_TSV.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        prog, pkg, why = line.split("\t")
        essential = pkg.endswith(" (essential)")
        out[prog] = (None if pkg == "-" else pkg.removesuffix(" (essential)"), essential, why.strip())
    return out


def _image_packages() -> set[str]:
    """What the Containerfile must install by name: python3 and the table's non-essential packages."""
    return {"python3"} | {pkg for pkg, essential, _ in _tools().values() if pkg and not essential}


def _programs_the_capture_runs() -> set[str]:
    """Every program capture/ can start: the collectors' declared tools, the stack tools, and
    each argv list literal given to a call (run, Popen...) whose first item names a program
    (after ``nsenter`` and its options when it starts one in a namespace)."""
    from capture import stacks
    from capture.collectors.specs import SPECS
    progs = {s.tool for s in SPECS if s.tool} | set(stacks.TOOLS)
    for path in (ROOT / "capture").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.List)):
                continue
            elts = node.args[0].elts
            words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str)
                     else getattr(e, "id", None) for e in elts]
            if words and words[0] == "nsenter":          # nsenter [--net=... --uts=...] PROGRAM ...
                progs.add("nsenter")
                words = [w for w, e in zip(words[1:], elts[1:])
                         if not isinstance(e, ast.JoinedStr) and not (w or "").startswith("-")]
            if words and words[0] and re.fullmatch(r"[a-z][a-z0-9_.-]*", words[0]):
                progs.add(words[0])
    return progs


def _daemonset():
    yaml = pytest.importorskip("yaml")
    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    return {d["kind"]: d for d in docs}


def _watch_argv_ok(argv: list[str]) -> None:
    assert "--watch" in argv, argv
    assert not [a for a in argv if a.split("=")[0] in PER_JOB_FLAGS], f"a per-job option in {argv}"


# ---------------------------------------------------------------- manifests
def test_daemonset_parses_and_runs_the_watcher_with_no_per_job_option():
    docs = _daemonset()
    assert set(docs) == {"Namespace", "DaemonSet"}
    spec = docs["DaemonSet"]["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["hostNetwork"] is True
    (c,) = spec["containers"]
    assert c["command"][:3] == ["python3", "-m", "capture"]
    _watch_argv_ok(c["command"])
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"] for v in spec["volumes"]}
    assert set(mounts) <= vols
    out = c["command"][c["command"].index("-o") + 1]
    assert out in mounts.values()


def test_systemd_unit_parses_and_runs_the_watcher_with_no_per_job_option():
    sections: dict[str, dict[str, str]] = {}
    cur = None
    for n, line in enumerate(UNIT.read_text().splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(("#", ";")):
            continue
        if s.startswith("["):
            assert s.endswith("]"), f"line {n}: {line!r}"
            cur = sections.setdefault(s[1:-1], {})
            continue
        assert cur is not None and "=" in s, f"line {n}: not key=value in a section: {line!r}"
        k, _, v = s.partition("=")
        cur[k.strip()] = v.strip()
    assert set(sections) == {"Unit", "Service", "Install"}
    argv = shlex.split(sections["Service"]["ExecStart"])
    assert argv[0].endswith("python3") and argv[1:3] == ["-m", "capture"]
    _watch_argv_ok(argv)
    doc = sections["Unit"].get("Documentation", "")
    if doc.startswith("file:///opt/stallscope/"):       # the install holds capture/ and bpf/ (the unit's header)
        assert (ROOT / doc[len("file:///opt/stallscope/"):]).exists(), doc


@pytest.mark.parametrize("script", SLURM, ids=lambda p: p.name)
def test_slurm_scripts_are_valid_sh(script):
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("needs sh")
    p = subprocess.run([sh, "-n", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_slurm_prolog_runs_the_watcher_with_no_per_job_option():
    text = (DEPLOY / "slurm" / "prolog.sh").read_text().replace("\\\n", " ")
    runs = [ln for ln in text.splitlines() if "-m capture" in ln and not ln.lstrip().startswith("#")]
    assert len(runs) == 1, runs
    _watch_argv_ok(shlex.split(runs[0].split("-m capture", 1)[1].split("<", 1)[0]))


# ---------------------------------------------------------------- the image
def test_the_daemonset_names_the_image_the_project_builds():
    ref = subprocess.run([str(DEPLOY / "image" / "image.sh"), "tag"], capture_output=True, text=True,
                         check=True, env={k: v for k, v in os.environ.items() if k != "IMAGE_REPO"}).stdout.strip()
    assert ref.endswith(":" + _version())
    (c,) = _daemonset()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert c["image"] == ref
    import capture
    assert capture.__version__ == _version()


def test_containerfile_is_debian_12_with_exactly_the_packages_the_capture_runs():
    instr = _instructions(CONTAINERFILE.read_text())
    froms = [a for w, a in instr if w == "FROM"]
    assert len(froms) == 1 and re.search(r"(^|/)debian:(12|bookworm)([-.:@]|$)", froms[0]), froms
    assert _apt_packages(instr) == _image_packages()
    assert any(w == "RUN" and "--no-install-recommends" in a for w, a in instr)
    entry = [a for w, a in instr if w == "ENTRYPOINT"]
    assert entry == ['["python3", "-m", "capture"]']


def test_the_packages_exist_in_debian_12():
    """Asked of the local apt lists (offline) on a Debian 12 machine."""
    osr = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    if "VERSION_CODENAME=bookworm" not in osr or shutil.which("apt-cache") is None:
        pytest.skip("needs a Debian 12 (bookworm) machine with apt-cache to ask its package lists")
    pkgs = _apt_packages(_instructions(CONTAINERFILE.read_text())) | {p for p, _, _ in _tools().values() if p}
    p = subprocess.run(["apt-cache", "show", "--no-all-versions", *sorted(pkgs)], capture_output=True, text=True)
    if p.returncode and "No packages found" not in p.stderr and not p.stdout:
        pytest.skip(f"apt-cache has no package lists here: {p.stderr.strip()[:200]}")
    found = set(re.findall(r"^Package: (\S+)$", p.stdout, re.M))
    assert found == pkgs, f"not in Debian 12: {sorted(pkgs - found)}"


def test_the_copied_files_exist_and_run_the_capture_with_the_standard_library_alone(tmp_path):
    """Every COPY source exists (context: the repository root); a folder holding only them
    runs ``python3 -m capture`` with no site-packages (-S) and no PYTHONPATH (-E), imports
    every module of the capture package (its subpackages' too), and the tracer finds its bpftrace template."""
    instr = _instructions(CONTAINERFILE.read_text())
    copies = [a.split() for w, a in instr if w == "COPY"]
    assert copies, "the Containerfile copies nothing"
    workdir = [a for w, a in instr if w == "WORKDIR"][-1]
    for *srcs, dest in copies:
        assert dest.startswith(workdir), f"{dest} is outside {workdir}"
        for src in srcs:
            assert not src.startswith("--"), f"COPY option {src} not expected"
            assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
            target = tmp_path / dest[len(workdir):].strip("/")
            shutil.copytree(ROOT / src, target, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    p = subprocess.run([sys.executable, "-E", "-S", "-m", "capture", "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "--watch" in p.stdout, p.stderr
    code = ("import sys, pkgutil, importlib, capture\n"
            "mods = [m.name for m in pkgutil.walk_packages(capture.__path__, 'capture.')\n"
            "        if not m.name.endswith('__main__')]\n"
            "for m in mods: importlib.import_module(m)\n"
            "from capture.tracer import program\n"
            "assert program.TEMPLATE.exists(), program.TEMPLATE\n"
            "assert not [n for n in sys.modules if n.split('.')[0] in ('forensics', 'pandas', 'numpy', 'yaml')]\n"
            "print(len(mods))\n")
    p = subprocess.run([sys.executable, "-E", "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) >= 10


# ---------------------------------------------------------------- the programs the capture runs
def test_every_program_the_capture_runs_is_in_the_image_or_left_out_with_its_reason():
    """Both ways: a program the capture starts has a row (its package, or "-" and why), and a
    row names a program the capture still starts. The image then installs every package named."""
    table, runs = _tools(), _programs_the_capture_runs()
    assert {"perfquery", "ibstat", "ethtool", "bpftrace", "tcpdump", "nsenter"} <= runs, runs
    assert runs - set(table) == set(), "programs the capture runs with no row in deploy/image/tools.tsv"
    assert set(table) - runs == set(), "rows of deploy/image/tools.tsv for programs the capture no longer runs"
    for prog, (pkg, _, why) in table.items():
        assert why, f"{prog}: say what it collects or why the image leaves it out"
    left_out = {p for p, (pkg, _, _) in table.items() if pkg is None}
    assert left_out <= {"nvidia-smi", "ncclras", "py-spy"}, f"the image leaves out {left_out}: the design promises them"


def _apt_fields(pkg: str) -> dict[str, str]:
    p = subprocess.run(["apt-cache", "show", "--no-all-versions", pkg], capture_output=True, text=True)
    return dict(re.findall(r"^([A-Za-z-]+): (.*)$", p.stdout, re.M))


def _deb_files(pkg: str) -> list[str] | None:
    """The paths a Debian package installs: dpkg's list when installed here, else the list of its
    .deb fetched once from the package registry (kept in ~/.cache/stallscope/debs); None when neither."""
    p = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
    if p.returncode == 0 and p.stdout.strip():
        return p.stdout.split()
    cache = Path.home() / ".cache" / "stallscope" / "debs"
    cache.mkdir(parents=True, exist_ok=True)
    debs = sorted(cache.glob(f"{pkg}_*.deb"))
    if not debs:
        subprocess.run(["apt-get", "download", pkg], cwd=cache, capture_output=True, timeout=120)
        debs = sorted(cache.glob(f"{pkg}_*.deb"))
    if not debs:
        return None
    p = subprocess.run(["dpkg-deb", "-c", str(debs[-1])], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    # "-rwxr-xr-x root/root 1234 2023-01-10 12:59 ./usr/sbin/perfquery" (a link: "... ./bin/lsmod -> kmod")
    return [line.split(" -> ")[0].split()[-1].lstrip(".") for line in p.stdout.splitlines()]


def test_each_package_installs_its_program():
    """Asked of Debian 12's own package lists and file lists, so a wrong package name in
    tools.tsv (the image then silently lacking perfquery) fails here, not on a cluster."""
    osr = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    if "VERSION_CODENAME=bookworm" not in osr or not (shutil.which("apt-cache") and shutil.which("dpkg-deb")):
        pytest.skip("needs a Debian 12 (bookworm) machine with apt-cache and dpkg-deb to ask its package lists")
    unchecked = []
    for prog, (pkg, essential, _) in _tools().items():
        if pkg is None:
            continue
        fields = _apt_fields(pkg)
        assert fields.get("Package") == pkg, f"{prog}: no Debian 12 package {pkg}"
        if essential:
            assert fields.get("Essential") == "yes" or fields.get("Priority") == "required", \
                f"{pkg} is not in every Debian image: install it by name"
        files = _deb_files(pkg)
        if files is None:
            unchecked.append(pkg)
            continue
        bins = [f for f in files if re.search(r"/s?bin/" + re.escape(prog) + "$", f)]
        assert bins, f"{pkg} installs no {prog}"
    if unchecked:
        pytest.skip(f"no file list for {sorted(set(unchecked))}: not installed and the registry is unreachable")
