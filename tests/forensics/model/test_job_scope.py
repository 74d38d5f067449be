"""One job per incident (forensics.model.job_scope): a watcher's bundle that holds two jobs of
the host (a clean one that ran before, the one that hung) is read as the hung job alone when
its manifest names it; without the name both are read."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from forensics.analysis import analyze
from forensics.inputs.bundle import Bundle
from shipped import SCENARIOS, shipped

needs_bundles = pytest.mark.skipif(not SCENARIOS, reason="no shipped bundles (tests/lab/make_bundles.sh)")


def _two_jobs(tmp_path, name_the_job: bool, forgotten: str | None = None):
    """The mismatch-hang bundle with the clean job's processes, events, logs, namespaces and
    captures added (as the watcher's rings hold a job that ran before); ``name_the_job``: the
    manifest's ``job`` names the hung one, as capture/jobs.py writes it. ``forgotten``: the
    clean job's processes are not in the manifest (the watcher stopped following them after
    they exited), and its calls are moved to end just ``"before"`` the hung job's first call
    or to run ``"beside"`` them (shifted onto the hung job's first second)."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir(parents=True)
    with Bundle.open(shipped("mismatch-hang"), workdir=tmp_path / "a") as b:
        folder = tmp_path / "stallscope-vm-20261122T221316Z"
        shutil.copytree(b.root, folder)
    with Bundle.open(shipped("clean"), workdir=tmp_path / "b") as c:
        other = c.root
        man = json.loads((folder / "manifest.json").read_text())
        old = json.loads((other / "manifest.json").read_text())
        hung = [p["pid"] for p in man["processes"]]
        older = [p for p in old["processes"] if p["pid"] not in hung]
        assert older and {n["label"] for n in old["netns"] if not n.get("own")}.isdisjoint(
            n["label"] for n in man["netns"])
        if not forgotten:
            man["processes"] += older
        man["netns"] += [n for n in old["netns"] if not n.get("own")]
        theirs = [e for e in map(json.loads, (other / "bpf" / "events.jsonl").read_text().splitlines())
                  if e.get("pid") in {p["pid"] for p in older}]
        if forgotten:
            man["processes"] = [p for p in man["processes"] if p["pid"] not in {q["pid"] for q in older}]
            stamps = ("t", "t0", "t1")
            ours = [e[k] for e in map(json.loads, (folder / "bpf" / "events.jsonl").read_text().splitlines())
                    if e.get("pid") in hung for k in stamps if isinstance(e.get(k), int)]
            timed = [e[k] for e in theirs for k in stamps if isinstance(e.get(k), int)]
            shift = (min(ours) - max(timed) - 1000 if forgotten == "before"
                     else min(ours) + 1_000_000 - min(timed))
            theirs = [{**e, **{k: e[k] + shift for k in stamps if isinstance(e.get(k), int)}} for e in theirs]
        with open(folder / "bpf" / "events.jsonl", "a") as fh:
            for e in theirs:
                fh.write(json.dumps(e) + "\n")
        by_rank = {p["rank"]: p["pid"] for p in older}
        sources = []
        for f in (other / "logs").glob("nccl-rank*.log"):
            shutil.copyfile(f, folder / "logs" / f"1-{f.name}")
            # as the watcher records what it copied for whom (a log a line of which names no pid)
            sources.append({"source": f"/elsewhere/{f.name}", "path": f"logs/1-{f.name}",
                            "why": f"NCCL_DEBUG_FILE of pid {by_rank[int(f.stem[len('nccl-rank'):])]}"})
        man["collectors"]["attachments:end"] = {"status": "ok", "files": [s["path"] for s in sources],
                                                "sources": sources}
        for f in (other / "pcap").glob("*.pcap"):
            shutil.copyfile(f, folder / "pcap" / f.name)
    if name_the_job:
        man["job"] = {"id": "ppid:1880", "pids": hung, "ranks": [0, 1, 2, 3], "launcher": "launcher",
                      "cgroup": None, "started_ns": man["started_ns"], "why": "the trigger's processes",
                      "others": [{"id": "ppid:77", "pids": sorted(p["pid"] for p in older), "started_ns": None}]}
    (folder / "manifest.json").write_text(json.dumps(man))
    return folder, set(hung), {p["pid"] for p in older}


@needs_bundles
def test_the_bundle_is_read_as_the_job_that_hung(tmp_path):
    alone = analyze([str(shipped("mismatch-hang"))])
    folder, hung, older = _two_jobs(tmp_path / "named", name_the_job=True)
    res = analyze([str(folder)])
    top, ref = res.findings[0], alone.findings[0]
    assert (top.kind, top.ranks, top.op_count) == (ref.kind, ref.ranks, ref.op_count)
    pids = set(res.model.tables["nccl_events"]["pid"].dropna().astype(int))
    assert pids <= hung and not pids & older
    logs = res.model.tables["coll_log_ops"]
    assert not set(logs["pid"].dropna().astype(int)) & older
    assert not logs["artifact"].astype(str).str.startswith("logs/1-").any()
    assert any("the incident's job is ppid:1880" in p and f"{len(older)} process(es)" in p for p in res.problems)
    assert res.model.captures[0]["job"]["id"] == "ppid:1880"


@needs_bundles
def test_without_the_job_named_both_jobs_are_read(tmp_path):
    folder, hung, older = _two_jobs(tmp_path / "unnamed", name_the_job=False)
    res = analyze([str(folder)])
    pids = set(res.model.tables["nccl_events"]["pid"].dropna().astype(int))
    assert pids & older and pids & hung
    assert "job" not in res.model.captures[0]


@needs_bundles
def test_a_job_that_ended_before_the_hung_one_began_is_left_out(tmp_path):
    """The watcher no longer lists the processes of a job that exited before the hung one
    started, but their calls are still in its ring: calls that all precede the hung job's first
    are another job's."""
    alone = analyze([str(shipped("mismatch-hang"))])
    folder, hung, older = _two_jobs(tmp_path / "forgotten", name_the_job=True, forgotten="before")
    res = analyze([str(folder)])
    pids = set(res.model.tables["nccl_events"]["pid"].dropna().astype(int))
    assert pids <= hung and not pids & older
    assert not set(res.model.tables["coll_log_ops"]["pid"].dropna().astype(int)) & older
    top, ref = res.findings[0], alone.findings[0]
    assert (top.kind, top.ranks, top.op_count) == (ref.kind, ref.ranks, ref.op_count)
    assert any(f"{len(older)} process(es) that ended before it began left out" in p for p in res.problems), \
        res.problems


@needs_bundles
def test_an_unlisted_process_that_ran_beside_the_hung_job_is_kept(tmp_path):
    """A process the manifest does not list but whose calls overlap the hung job's (a rank
    that died mid-job, no longer followed) may be the job's own: it stays."""
    folder, hung, older = _two_jobs(tmp_path / "beside", name_the_job=True, forgotten="beside")
    res = analyze([str(folder)])
    pids = set(res.model.tables["nccl_events"]["pid"].dropna().astype(int))
    assert pids & older and pids & hung


class _Clock:
    def to_utc(self, mono):
        return np.asarray(mono, np.int64)          # monotonic read as UTC, as it is


def test_what_the_rings_hold_from_before_the_job_began_is_left_out():
    """A watcher's rings hold the minutes before the incident: another job's TCP trouble there
    (on the same lab addresses, as a job before it used) read as this job's was a link flap
    named above the real hang (make watch-blind). Records and packets from before the job's
    start (less its slack) go; the tracer's own records and what came after stay."""
    from types import SimpleNamespace

    from forensics.model.hosts import PcapPart
    from forensics.model.job_scope import START_SLACK_NS, JobScope, _since, drop_early_packets
    since = 10 * START_SLACK_NS - START_SLACK_NS
    bundle = SimpleNamespace(clock=_Clock())
    events = [{"ev": "tracer_start", "t": 1}, {"ev": "tcp_retransmit_skb", "t": since - 1, "saddr": "10.0.0.2"},
              {"ev": "coll", "t0": since - 5, "pid": 9}, {"ev": "tcp_retransmit_skb", "t": since + 1},
              {"ev": "coll", "t0": since + 5, "pid": 7}]
    kept, n = _since(bundle, events, since)
    assert n == 2 and kept == [events[0], events[3], events[4]]
    assert _since(bundle, events, None) == (events, 0)
    flows = pd.DataFrame({"capture": ["p", "p"], "orig_addr": ["a", "a"], "orig_port": [1, 3], "resp_addr": ["b", "b"],
                          "resp_port": [2, 4], "first_ns": [0, 0], "last_ns": [since - 1, since + 1]})
    timing = pd.DataFrame({"capture": ["p", "p", "p"], "saddr": ["b", "a", "a"], "sport": [2, 3, 1],
                           "daddr": ["a", "b", "b"], "dport": [1, 4, 2]})
    pk = pd.DataFrame({"timestamp_ns": [since - 1, since, since + 1]})
    part = PcapPart(packets=[pk], events=[pk.assign(event="retransmission")], flows=[flows], timing=[timing])
    problems: list[str] = []
    drop_early_packets(part, JobScope("j", since_ns=since), problems)
    assert part.packets[0]["timestamp_ns"].tolist() == [since, since + 1] and len(part.events[0]) == 2
    assert part.flows[0]["orig_port"].tolist() == [3] and part.timing[0]["sport"].tolist() == [3]
    assert problems == ["1 flow(s) and 1 flagged packet(s) of the captures from before the incident's job began "
                        "left out"]
