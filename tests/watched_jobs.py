"""Lab jobs run under one black-box watcher started before them (``stallscope capture --watch``
as deployed: no --pid, no --nccl-lib), for the watcher's end-to-end tests (tests/lab_runs/
test_watch_align.py, test_watch_faults.py).

Each job runs from a copy of the lab's libnccl at a path the watcher has never seen (so its
tracer restarts for it and counts the job's calls from its attach). Its bundles are those that
appeared while it ran and whose trigger is its own: a hang's names one of its processes, a log
trigger's is one of its log files; for an operator's trigger (``--operator-trigger``, the
on-demand file), those triggered on demand after it was written. After a job, the watcher's rings are left to forget it (``then_quiet``)."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from capture_helpers import bundle_manifest
from conftest import ROOT, require_root, require_tool

from capture.watch.triggers import TRIGGER_NAME
from capture.watch.watcher import RING_SLACK_S

PY = sys.executable
SMALL = ["--compute-ms", "30", "--buckets", "131072,65536"]
LAB = ROOT / "tests" / "lab"


@contextmanager
def watched_lab(tmp_path_factory, name: str, settle_s: float = 0.0, **watch):
    """The lab built and one watcher started (``watch``: :class:`WatchedJobs`'s settings), as
    ``{"build", "watch"}``, for a test module; after it, the watcher stopped and no namespace,
    process or link of the lab's left (root, the lab's tools; skips without them)."""
    require_root()
    require_tool("gcc", "make", "ip", "unshare", "bridge", "ss", "nsenter", "tcpdump", "bpftrace", "nft", "tc")
    from tests.lab import netns
    build = tmp_path_factory.mktemp("labbuild") / "build"
    p = subprocess.run(["make", "-C", str(LAB), "all", f"BUILD={build}"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    jobs = WatchedJobs(tmp_path_factory.mktemp(name), **watch)
    time.sleep(settle_s)
    try:
        yield {"build": build, "watch": jobs}
    finally:
        jobs.close()
        assert netns.leftovers() == {"namespaces": [], "pids": [], "links": []}


class WatchedJobs:
    """One watcher writing into ``base/bundles`` (its stderr in ``base/watch.err``), with
    ``--hang-after``, ``--after`` and ``--before`` as given; :meth:`run` runs a lab job under it."""

    def __init__(self, base: Path, hang_after_s: float = 5, after_s: float = 5, before_s: float = 20):
        from tests.lab.watcher import start_watcher
        self.base, self.bundles, self.err = base, base / "bundles", base / "watch.err"
        self.after_s, self.before_s = after_s, before_s
        self.bundles.mkdir()
        self.trigger_file = self.bundles / TRIGGER_NAME
        self.proc = start_watcher(self.bundles, ["--status-every", "30s", "--hang-after", f"{hang_after_s:g}s",
                                                 "--after", f"{after_s:g}s", "--before", f"{before_s:g}s"], self.err)

    def run(self, name: str, build: Path, lab_args: list[str], then_quiet: bool = True,
            operator_at_s: float | None = None) -> dict:
        """Run one lab job (``lab_args`` plus :data:`SMALL`); ``operator_at_s``: an operator asks
        for a bundle that long after the onset. Returns its truth (scenario.json), pids and
        bundles."""
        lib = build.parent / f"opt-{random.randrange(1 << 30):x}" / "nccl"
        shutil.copytree(build, lib, ignore=shutil.ignore_patterns("static"))
        before = set(self.bundles.glob("stallscope-*.tar.gz"))
        out = self.base / name
        extra = ["--operator-trigger", f"{self.trigger_file}@{operator_at_s:g}"] if operator_at_s is not None else []
        p = subprocess.run([PY, "-m", "tests.lab.launcher", "--build", str(lib), "--out", str(out / "lab"),
                            *lab_args, *SMALL, *extra], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=400)
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        truth = json.loads((out / "lab" / "scenario.json").read_text())
        pids = {r["pid"] for r in truth["ranks"]}
        if operator_at_s is not None:
            assert truth.get("operator_trigger_ns"), "the job ended before the operator's trigger: more --steps"

        def own(trigger: dict) -> bool:
            if operator_at_s is not None:      # the file's text is the trigger's reason
                return trigger["kind"] == "on-demand" and str(out / "lab") in (trigger.get("reason") or "")
            return bool(set(trigger.get("pids") or []) & pids) or str(out) in (trigger.get("source") or "")

        def mine() -> list[Path]:
            new = sorted(set(self.bundles.glob("stallscope-*.tar.gz")) - before)
            return [b for b in new if own(bundle_manifest(b)["trigger"])]
        # a bundle may come after the job: the watcher writes one incident at a time, completed
        # --after the trigger, and another job's on the host may be before it
        waits = truth["fault"].get("kind") not in (None, "none") or operator_at_s is not None
        deadline = time.monotonic() + (90 if waits else 2)
        while not mine() and time.monotonic() < deadline:
            time.sleep(2)
        if then_quiet:
            time.sleep(self.before_s + self.after_s + RING_SLACK_S)
        return {"truth": truth, "pids": pids, "bundles": mine()}

    def close(self) -> None:
        from tests.lab.watcher import stop_watcher
        stop_watcher(self.proc)
