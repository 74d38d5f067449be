"""Shared by the report and findings tests: run ``stallscope analyze`` in-process (its outputs,
or its JSON document alone), validate a Chrome trace, and build a bundle whose strings carry
HTML/script payloads."""
from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from forensics.cli import Env, main
from tests.shipped import SCENARIOS  # noqa: F401  (for the report tests)
from tests.shipped import shipped as bundle  # noqa: F401

ARTIFACTS = Path(__file__).resolve().parent.parent / "build" / "test-artifacts"

# each payload, if it ran, would set window.__pwned (and the <img> would request a file)
PAYLOAD = "<script>window.__pwned=1</script>"
PAYLOAD_IMG = "\"><img src=x onerror=\"window.__pwned=2\">"
PAYLOAD_MD = "| **bold** [link](javascript:alert(1)) `tick`"


def comparable(text: str) -> str:
    """A rendered report without what differs between two renderings of one analysis (the CSP
    nonce, the time it was generated)."""
    text = re.sub(r"nonce-?[=\"'A-Za-z0-9_-]*", "", text)
    return re.sub(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}Z", "", text)


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    out: Path

    def path(self, name: str) -> Path:
        return self.out / name


def analyze(bundles: list[str | Path], out: Path, *extra: str, all_outputs: bool = True) -> Run:
    out.mkdir(parents=True, exist_ok=True)
    argv = ["analyze", *map(str, bundles), "-o", str(out / "report.html")]
    if all_outputs:
        argv += ["--json", str(out / "findings.json"), "--markdown", str(out / "summary.md"),
                 "--perfetto", str(out / "trace.json")]
    so, se = io.StringIO(), io.StringIO()
    rc = main(argv + list(extra), Env(stdout=so, stderr=se))
    return Run(rc, so.getvalue(), se.getvalue(), out)


def findings_doc(tmp: Path, path: str | Path, rc: int = 1) -> dict:
    """``stallscope analyze PATH --jobs 1 --json``'s document, its exit code checked to be ``rc``
    (1: an error finding); the report goes to ``tmp``."""
    js = tmp / "f.json"
    err = io.StringIO()
    code = main(["analyze", str(path), "-o", str(tmp / "r.html"), "--json", str(js), "-q", "--jobs", "1"],
                Env(stdout=io.StringIO(), stderr=err, debug=True))
    assert code == rc, err.getvalue()
    return json.loads(js.read_text())


def validate_trace(doc: dict) -> list[str]:
    """Problems of a Chrome trace event JSON document (empty list: valid), per the Trace
    Event Format: required keys by phase, numeric ts/dur, ids, monotonic ts per track,
    properly nested complete events, named tracks."""
    errs: list[str] = []
    ev = doc.get("traceEvents")
    if not isinstance(ev, list):
        return ["traceEvents is not a list"]
    named_pids, named_tracks = set(), set()
    last_ts: dict[tuple, float] = {}
    open_ends: dict[tuple, list[float]] = {}
    for i, e in enumerate(ev):
        for k in ("name", "ph", "pid", "tid"):
            if k not in e:
                errs.append(f"event {i}: no {k}")
        ph = e.get("ph")
        if ph not in ("X", "i", "M"):
            errs.append(f"event {i}: phase {ph!r}")
            continue
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            errs.append(f"event {i}: pid/tid not integers")
            continue
        if ph == "M":
            if e["name"] == "process_name":
                named_pids.add(e["pid"])
            if e["name"] == "thread_name":
                named_tracks.add((e["pid"], e["tid"]))
            if not isinstance(e.get("args", {}).get("name", e.get("args", {}).get("sort_index")), (str, int)):
                errs.append(f"event {i}: metadata without a value")
            continue
        if e["pid"] < 1 or e["tid"] < 1:
            errs.append(f"event {i}: pid/tid 0 (Perfetto's idle task)")
        ts = e.get("ts")
        if not isinstance(ts, (int, float)):
            errs.append(f"event {i}: ts {ts!r}")
            continue
        track = (e["pid"], e["tid"])
        if ts < last_ts.get(track, float("-inf")):
            errs.append(f"event {i}: ts goes back on track {track}")
        last_ts[track] = ts
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                errs.append(f"event {i}: dur {dur!r}")
                continue
            stack = open_ends.setdefault(track, [])
            while stack and stack[-1] <= ts:
                stack.pop()
            if stack and ts + dur > stack[-1] + 1e-6:
                errs.append(f"event {i}: slice overlaps its parent on track {track} without nesting")
            stack.append(ts + dur)
        if ph == "i" and e.get("s", "t") not in ("t", "p", "g"):
            errs.append(f"event {i}: instant scope {e.get('s')!r}")
    used = {(e["pid"], e["tid"]) for e in ev if e.get("ph") in ("X", "i")}
    if used - named_tracks:
        errs.append(f"tracks without thread_name: {sorted(used - named_tracks)[:5]}")
    if {p for p, _ in used} - named_pids:
        errs.append("processes without process_name")
    return errs


def hostile_bundle(src: Path, dest_parent: Path) -> Path:
    """Unpack ``src`` into a folder whose name carries a payload, then put payloads in the
    manifest's host, process names and command lines, a collector's reason and file list,
    and a log file's name and lines."""
    folder = dest_parent / f"stallscope-{PAYLOAD.replace('/', '_')}-20260101T000000Z"
    folder.mkdir(parents=True)
    with tarfile.open(src) as tf:
        try:
            tf.extractall(folder, filter="data")
        except TypeError:           # Python without extraction filters (< 3.10.12 / 3.11.4)
            tf.extractall(folder)
    roots = [p.parent for p in folder.rglob("manifest.json")]
    root = roots[0]
    m = json.loads((root / "manifest.json").read_text())
    m["host"] = f"node{PAYLOAD}{PAYLOAD_IMG}"
    for p in m.get("processes", []):
        p["comm"] = f"train{PAYLOAD}"
        p["cmdline"] = ["python", f"--name={PAYLOAD_IMG}", PAYLOAD_MD]
    colls = m.get("collectors", {})
    items = colls.values() if isinstance(colls, dict) else colls
    for c in list(items)[:3]:
        c["reason"] = f"failed {PAYLOAD} {PAYLOAD_MD}"
        c["files"] = list(c.get("files") or []) + [f"logs/{PAYLOAD_IMG.replace('/', '_')}.log"]
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    bad_name = logs / f"nccl-{PAYLOAD.replace('/', '_')}.log"
    line = f"node:1:1 [0] NCCL WARN {PAYLOAD}{PAYLOAD_IMG} {PAYLOAD_MD}\n"
    bad_name.write_text(line)
    for log in logs.glob("nccl-rank*.log"):
        with open(log, "a") as fh:
            fh.write(line)
    (root / "manifest.json").write_text(json.dumps(m))
    return root


def copy_report(src: Path, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dst = ARTIFACTS / name
    shutil.copyfile(src, dst)
    return dst


def screenshot(report: Path, png: Path, width: int = 1200, height: int = 900) -> None:
    """The first screen of a report, as the browser test sees it (Debian chromium, requests
    outside the file blocked). Used for docs/report.png:
    ``.venv/bin/python -m tests.report_helpers out/demo/report.html docs/report.png``."""
    import os
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                              args=["--no-sandbox"] if os.geteuid() == 0 else [])
        page = b.new_page(viewport={"width": width, "height": height})
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
        page.goto(report.resolve().as_uri(), wait_until="load")
        page.wait_for_function("document.querySelectorAll('[data-plot].js-plotly-plot').length >= 1")
        page.screenshot(path=str(png))
        b.close()


if __name__ == "__main__":
    import sys
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]))
