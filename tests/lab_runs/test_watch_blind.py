"""No blind window (issue 43, item 1), as deployed (root, the lab): a watcher started before jobs
it knows nothing about, with neither --pid nor --nccl-lib, traces a job from a library path it
has never seen from the job's first call: the tracer sees the library mapped (bpf/nccl.bt,
block lib_map), the process is held there (``STALLSCOPE_HOLD``, here only the processes of
this test's own cgroup: other jobs on a shared machine are never stopped) and resumed once
the restarted program covers it. A fault 2 s after the first collective leaves a bundle that
holds every rank's communicator init and its collectives before the fault; once from the
host's file system, once from a private mount namespace (a container's bind-mounted copy)."""
from __future__ import annotations

import json
import os
import random
import tarfile
import time
from pathlib import Path

import pytest

from conftest import require_root, require_tool
from capture_helpers import bundle_manifest
from test_watch_unknown import LAB, SMALL, Watch, _fresh_copy

# minutes of lab jobs held at their library's mapping under a watcher; not yet passing on a
# machine whose other jobs keep restarting the tracer (issue 43 note): make watch-blind
pytestmark = pytest.mark.skipif(os.environ.get("STALLSCOPE_WATCH_BLIND") != "1",
                                reason="lab jobs held at their library's mapping under a watcher: make watch-blind")

S = 1_000_000_000
CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
# the ranks are held until the restarted program attaches: seconds on an idle host, minutes on a
# machine where many tracers attach and detach uprobes (the kernel registers them one at a time,
# under one lock for the whole machine); at most HOLD_S here
HOLD_S = 400
INIT_WAIT_S = 60 + HOLD_S
MAX_LIBS = 2


@pytest.fixture(scope="module")
def blind(tmp_path_factory):
    require_root()
    require_tool("gcc", "make", "ip", "unshare", "bridge", "ss", "nsenter", "tcpdump", "bpftrace", "nft", "tc")
    if not (CGROUP_ROOT / "cgroup.procs").exists() and not (Path("/sys/fs/cgroup") / "cgroup.controllers").exists():
        pytest.skip("no cgroup v2 hierarchy to confine the hold to")
    root = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.procs").exists() else Path("/sys/fs/cgroup")
    import subprocess
    from tests.lab import netns
    build = tmp_path_factory.mktemp("labbuild") / "build"
    p = subprocess.run(["make", "-C", str(LAB), "all", f"BUILD={build}"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    cg = root / f"stallscope-blind-{os.getpid()}-{random.randrange(1 << 20):x}"
    cg.mkdir()
    netns.sweep()
    base = tmp_path_factory.mktemp("blind")
    # the hold only for this test's cgroup; at most MAX_LIBS libraries traced (this test's first:
    # on a shared machine other jobs' copies of the lab's library must not fill the program)
    os.environ.update(STALLSCOPE_HOLD=str(cg), STALLSCOPE_MAX_NCCL_LIBS=str(MAX_LIBS), STALLSCOPE_HOLD_MAX_S=str(HOLD_S))
    try:
        watch = Watch(base)
    finally:
        os.environ.pop("STALLSCOPE_HOLD", None)
        os.environ.pop("STALLSCOPE_MAX_NCCL_LIBS", None)
        os.environ.pop("STALLSCOPE_HOLD_MAX_S", None)
    watch.jobs = []                 # each job's namespaces: gone after the test
    try:
        yield {"build": build, "base": base, "watch": watch, "cgroup": cg}
    finally:
        watch.close()
        try:
            cg.rmdir()
        except OSError:
            pass
        mine = {n for job in watch.jobs for n in job}
        assert not mine & set(netns.list_namespaces()), mine


def _job_bundle(job: dict, watch: Watch, kind: str = "hang") -> tuple[Path, dict]:
    """The bundle of this job (the watcher sees every job of a shared machine): the one whose
    trigger names a rank process of it; its manifest."""
    pids = {r["pid"] for r in job["truth"]["ranks"]}
    watch.jobs.append({r["namespace"] for r in job["truth"]["ranks"] if r.get("namespace")})
    ours = []
    for b in job["bundles"]:
        m = bundle_manifest(b)
        # other jobs' hangs on a shared machine: this job's trigger may be folded into their incident
        trigs = [m["trigger"]] + list(m["trigger"].get("also") or [])
        mine = [t for t in trigs if set(t.get("pids") or []) & pids]
        if mine:
            ours.append((b, m, mine[0]))
    assert len(ours) == 1, ([o[0] for o in ours], job["bundles"], watch.err.read_text()[-3000:])
    b, m, trig = ours[0]
    assert trig["kind"] == kind, trig
    m["trigger"] = trig
    assert m["options"]["pids"] == [] and m["options"]["nccl_libs"] == []
    return b, m


def _verdict(bundle: Path, kind: str, ranks: list[int]):
    from forensics.analysis import analyze
    res = analyze([str(bundle)])
    assert not [p for p in res.problems if "detector" in p], res.problems
    top = res.findings[0]
    assert top.kind == kind and set(ranks) <= set(top.ranks), [(f.kind, f.ranks, f.summary) for f in res.findings[:3]]
    return top


def _events(bundle: Path) -> list[dict]:
    with tarfile.open(bundle) as tf:
        name = next(n for n in tf.getnames() if n.endswith("bpf/events.jsonl"))
        return [json.loads(line) for line in tf.extractfile(name).read().splitlines() if line.strip()]


def _from_the_first_call(job: dict, bundle: Path, m: dict, ranks: int) -> None:
    """Every rank's ncclCommInitRank and its collectives from the first one on are in the
    bundle (the ring holds them all: a short job). The ring may hold an earlier job's calls
    too (the manifest names the hung job: forensics.model.job_scope leaves the rest out)."""
    truth = job["truth"]
    evs = _events(bundle)
    mine = {r["pid"] for r in truth["ranks"]}
    inits = [e for e in evs if e.get("ev") == "comm_init" and e.get("fn") == "ncclCommInitRank"
             and e.get("pid") in mine]
    assert sorted(e["rank"] for e in inits) == list(range(ranks)), inits
    pids = {e["pid"] for e in inits}
    colls = [e for e in evs if e.get("ev") == "coll" and e.get("pid") in pids]
    # the tracer's clock: the bundle's monotonic <-> UTC sample
    first = {p: min(e["op_count"] for e in colls if e["pid"] == p) for p in pids}
    assert all(v == 0 for v in first.values()), first          # op 0 of the world communicator: from its start
    onset = truth["fault"]["start_time_ns"]
    assert onset - truth["train_start_ns"] >= 1.5 * S
    held = m["collectors"]["tracer"].get("hold")
    assert held is True, m["collectors"]["tracer"]


def _in_cgroup(cg: Path) -> list[str]:
    return ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh"]


def test_a_job_from_an_unseen_path_is_traced_from_its_first_call(blind):
    watch = blind["watch"]
    time.sleep(max(0.0, 8.0 - (time.monotonic() - watch.started)))
    lib = _fresh_copy(blind["build"], blind["base"])
    job = watch.run_job("blind-a", lib, ["--scenario", "link-down-hang", "--rank", "2", "--ranks", "3",
                                         "--start-s", "2", "--hold-s", "25", "--init-timeout-s", str(INIT_WAIT_S)] + SMALL,
                        wrap=_in_cgroup(blind["cgroup"]))
    b, m = _job_bundle(job, watch)
    _verdict(b, "hang_stuck", job["truth"]["fault"]["ranks"])
    _from_the_first_call(job, b, m, 3)


def test_a_job_in_its_own_mount_namespace_is_traced_from_its_first_call(blind):
    """As a container: a private copy of the lab's libnccl bind-mounted at a path that exists
    only in the job's mount namespace."""
    watch = blind["watch"]
    lib = _fresh_copy(blind["build"], blind["base"])
    inside = "/run/stallscope-blind-container/nccl"
    script = (f"echo $$ > {blind['cgroup']}/cgroup.procs && mkdir -p /run/stallscope-blind-container && "
              f"mount -t tmpfs tmpfs /run/stallscope-blind-container && mkdir {inside} && "
              f"mount --bind {lib} {inside} && exec \"$@\"")
    job = watch.run_job("blind-c", Path(inside),
                        ["--scenario", "link-down-hang", "--rank", "1", "--ranks", "3", "--start-s", "2",
                         "--hold-s", "25", "--init-timeout-s", str(INIT_WAIT_S)] + SMALL,
                        wrap=["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"])
    assert not Path(inside).exists()
    b, m = _job_bundle(job, watch)
    _verdict(b, "hang_stuck", job["truth"]["fault"]["ranks"])
    _from_the_first_call(job, b, m, 3)


def test_a_rank_that_never_joins_is_an_init_hang_named_by_the_watcher(blind):
    """init-hang: rank 1 never calls ncclCommInitRank; the others wait in it. The watcher triggers
    on the ranks stuck in init (traced) and the bundle names rank 1."""
    watch = blind["watch"]
    lib = _fresh_copy(blind["build"], blind["base"])
    job = watch.run_job("init-hang", lib, ["--scenario", "init-hang", "--rank", "1", "--ranks", "3", "--hold-s", "25",
                                           "--init-timeout-s", str(INIT_WAIT_S)] + SMALL,
                        wrap=_in_cgroup(blind["cgroup"]))
    b, m = _job_bundle(job, watch)
    assert "init" in m["trigger"]["reason"], m["trigger"]
    top = _verdict(b, "init_hang", [1])
    assert top.severity == "error" and top.details["missing"] == [1], top.details


def test_a_dropped_bootstrap_connection_names_the_unreachable_address(blind):
    """init-hang-dropped: rank 1's packets to the root's host dropped in the switch; the bundle
    names rank 1 and the address it cannot reach."""
    watch = blind["watch"]
    lib = _fresh_copy(blind["build"], blind["base"])
    job = watch.run_job("init-dropped", lib, ["--scenario", "init-hang-dropped", "--rank", "1", "--ranks", "3",
                                              "--hold-s", "25", "--init-timeout-s", str(INIT_WAIT_S)] + SMALL,
                        wrap=_in_cgroup(blind["cgroup"]))
    b, m = _job_bundle(job, watch)
    top = _verdict(b, "init_hang", [1])
    assert any(a.startswith(job["truth"]["fault"]["address"] + ":") for a in top.details["unreached"]), top.details
