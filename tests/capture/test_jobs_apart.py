"""Jobs told apart on one host (capture/jobs.py: lineage, Jobs.job_of): the processes two
launchers started are two jobs; a trigger's processes name the one that hung, the manifest's
``job`` lists its processes and the other job's."""
from __future__ import annotations

import subprocess
import sys
import time

from capture import jobs as jobs_mod
from capture import manifest as schema
from capture.options import CaptureOptions
from capture.procs import ProcInfo

LAUNCHER = ("import subprocess, sys, time\n"
            "ps = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env={'RANK': str(r)})"
            " for r in range(2)]\n"
            "print(' '.join(str(p.pid) for p in ps), flush=True)\n"
            "time.sleep(60)\n")


def _launch():
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    return p, [int(x) for x in p.stdout.readline().split()]


def test_two_launchers_are_two_jobs_and_the_trigger_names_the_hung_one():
    (a, ranks_a), (b, ranks_b) = _launch(), _launch()
    try:
        j = jobs_mod.Jobs(CaptureOptions(output="unused"))
        for r, pid in list(enumerate(ranks_a)) + list(enumerate(ranks_b)):
            j.procs[pid] = ProcInfo(pid=pid, env={"RANK": str(r)}, start_ticks=1)
            j.lineage[pid] = jobs_mod.lineage(pid)
        assert {j.lineage[p][0] for p in ranks_a} == {a.pid} and {j.lineage[p][0] for p in ranks_b} == {b.pid}
        assert j.job_id(ranks_a[0]) == j.job_id(ranks_a[1]) != j.job_id(ranks_b[0])
        job = j.job_of([ranks_b[1]])
        assert schema.JOB.make(**job) == job
        assert job["pids"] == sorted(ranks_b) and job["ranks"] == [0, 1]
        assert job["id"].startswith(f"ppid:{b.pid}") and "-c" in (job["launcher"] or "")
        assert [o["pids"] for o in job["others"]] == [sorted(ranks_a)]
        assert j.job_of([]) is None and j.job_of([1]) is None      # no followed process: no job named
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        for pid in ranks_a + ranks_b:
            subprocess.run(["kill", str(pid)], capture_output=True)
        time.sleep(0.1)
