"""DeepSpeed, Ray and mp.spawn lines naming a worker that died (forensics/parsers/launcher_exits.py)."""
from __future__ import annotations

import pandas as pd

from forensics.parsers.launcher_exits import LauncherExitsParser

DEEPSPEED = (
    "node07: [2024-03-20 20:31:29,210] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 3353707\n"
    "node07: [2024-03-20 20:31:29,269] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', "
    "'train.py', '--local_rank=4', '--rank 2'] exits with return code = -9\n")
RAY = ("ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunner.run() (pid=18948, ip=10.0.0.1)\n"
       "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
       "\tclass_name: WorkerDict\n\tactor_id: d9cc46\n\tpid: 20174\n\tname: WorkerDict_0:1\n\tip: 10.0.0.7\n"
       "Traceback (most recent call last):\n")
SPAWN = ("  0%|          | 0/4878 [00:00<?, ?it/s]Traceback (most recent call last):\n"
         "Exception: process 3 terminated with signal SIGKILL\n"
         "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 1\n")


def _rows(text: str):
    r = LauncherExitsParser.parse(text.encode())
    return r.tables["process_exits"]


def test_deepspeed_return_code_and_the_launchers_kills():
    t = _rows(DEEPSPEED)
    kill, dead = t.iloc[0], t.iloc[1]
    assert (kill["kind"], kill["pid"], kill["host"]) == ("deepspeed_kill", 3353707, "node07")
    assert pd.isna(kill["signal"]) and pd.isna(kill["exitcode"])          # not a death of its own
    assert (dead["kind"], dead["local_rank"], dead["exitcode"], dead["signal"], dead["ctx_host"]) == \
        ("deepspeed", 4, -9, "SIGKILL", "node07")
    assert pd.isna(dead["ctx_rank"])                                       # its command line is no prefix


def test_ray_actor_died_names_the_actors_pid_and_ip_not_the_callers():
    t = _rows(RAY)
    assert len(t) == 1
    r = t.iloc[0]
    assert (r["kind"], r["pid"], r["host"]) == ("ray_actor_died", 20174, "10.0.0.7")
    assert r["traceback"].startswith("The actor died unexpectedly") and "WorkerDict_0:1" in r["traceback"]


def test_mp_spawn_signal_and_exit_code():
    t = _rows(SPAWN)
    assert t["local_rank"].tolist() == [3, 0] and t["exitcode"].tolist() == [-9, 1]
    assert t["signal"].iloc[0] == "SIGKILL" and pd.isna(t["signal"].iloc[1])


def test_nothing_of_its_own_is_a_warning_not_an_error():
    r = LauncherExitsParser.parse(b"hello\nworld\n")
    assert r.tables.get("process_exits") is None or len(r.tables["process_exits"]) == 0
    assert r.warnings


def test_the_raylets_worker_died_line_names_its_ip_and_pid():
    """Ray's own report of a worker process lost (one line, fields inline), behind the bare
    remnants of its colour codes or the ``(raylet)`` tag; an ip of 0.0.0.0 names no host."""
    died = ("A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the "
            "problem, check the logs for the dead worker. RayTask ID: ffff Worker ID: 0c62 Node ID: 3830 Worker IP "
            "address: {ip} Worker port: 10016 Worker PID: {pid} Worker exit type: SYSTEM_ERROR Worker exit detail: "
            "Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root "
            "causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage.\n")
    text = ("2023-01-17 17:21:35,472\tWARNING worker.py:1829 -- " + died.format(ip="100.97.252.234", pid=1942)
            + "[2m[36m(raylet)[0m " + died.format(ip="0.0.0.0", pid=66408))
    t = _rows(text)
    assert len(t) == 2
    a, b = t.iloc[0], t.iloc[1]
    assert (a["kind"], a["pid"], a["host"]) == ("ray_actor_died", 1942, "100.97.252.234")
    assert a["traceback"] == ("Ray worker died (SYSTEM_ERROR): Worker unexpectedly exits with a connection error "
                              "code 2.")
    assert b["pid"] == 66408 and pd.isna(b["host"])
