"""Launchers other than torchrun saying a worker process died: DeepSpeed, Ray, ``mp.spawn``.

torchrun's own summary is :mod:`.torch_elastic`'s; these launchers print one line (or a short
block) of their own when a worker dies, each naming the worker its own way:

- DeepSpeed's launcher (``deepspeed`` / ``python -m deepspeed.launcher.launch``, 0.5 to 0.16)::

      [2024-03-20 20:31:29,210] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 3353707
      [2024-03-20 20:31:29,269] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u',
      'train.py', '--local_rank=4', ...] exits with return code = 1

  the worker's command line (its ``--local_rank``) and return code (negative: the signal); the
  ``Killing subprocess`` lines are the launcher stopping the others after that failure;
- Ray (``ray.exceptions.ActorDiedError``, alone or inside ``RayTaskError(ActorDiedError)``),
  followed by tab-indented fields of the dead actor: ``class_name``, ``actor_id``, ``pid``,
  ``name``, ``ip`` (the node it ran on); or the raylet's (``worker.py``'s) own report of a worker
  process lost: ``A worker died or was killed while executing a task by an unexpected system
  error. … Worker IP address: <ip> Worker port: <n> Worker PID: <pid> Worker exit type: <t>
  Worker exit detail: <text>`` (one line; its fields say whose);
- ``torch.multiprocessing.spawn``: ``ProcessExitedException: process 3 terminated with signal
  SIGKILL`` (``Exception:`` before torch 1.8), ``... terminated with exit code 1`` (the process
  index: the local rank).

A pdsh or Ray prefix before a line gives its host (:mod:`.lines`).

Table ``process_exits`` (the columns of :mod:`.torch_elastic`'s, merged with them: line, kind,
time, host, rank, local_rank, exitcode, pid, signal, error_file, traceback, ctx_rank,
ctx_local_rank, ctx_host, ctx_pid, ctx_clock), its kinds:
    kind ``deepspeed`` (a worker's return code), ``deepspeed_kill`` (a worker the launcher
    killed after another failed: pid only, no signal of its own: not a cause),
    ``ray_actor_died`` (an actor's or the raylet's worker's death: pid, host: its ip; the reason
    in ``traceback``), ``spawn``
    (local_rank, exitcode, signal).
"""
from __future__ import annotations

import re
import signal as signal_mod

from . import lines as lines_mod
from .registry import WarningLog, register
from .text import LogText, TextParser
from .torch_elastic import TorchElasticParser, signal_name

DS_EXIT_RE = re.compile(r"exits with return code = (?P<code>-?\d+)")
DS_KILL_RE = re.compile(r"\bKilling subprocess (?P<pid>\d+)")
DS_START_RE = re.compile(r"\[launch\.py:\d+:\w+\]|\[['\"]")     # where DeepSpeed's own text starts
LOCAL_RANK_RE = re.compile(r"--local[_-]rank[= ]'?(?P<local>\d+)")
RAY_DIED_RE = re.compile(r"(?<!\()\bActorDiedError: (?P<msg>.*?)\s*$")
RAY_FIELD_RE = re.compile(r"(?<![\w])(?P<key>class_name|actor_id|pid|name|ip|namespace)\s*:\s*(?P<value>[^\s,]+)")
RAY_WORKER_RE = re.compile(r"A worker died or was killed while executing a task(?P<rest>.*)$")
RAY_WORKER_FIELD_RE = re.compile(r"Worker (?P<key>IP address|PID|exit type): (?P<value>\S+)")
RAY_WORKER_DETAIL_RE = re.compile(r"Worker exit detail: (?P<detail>.*?\.)(?= |$)")
SPAWN_RE = re.compile(r"(?:ProcessExitedException|ProcessRaisedException|Exception): process (?P<index>\d+) terminated "
                      r"with (?:signal (?P<sig>SIG[A-Z0-9]+)|exit code (?P<code>-?\d+))")
NEEDLES = (b"exits with return code", b"Killing subprocess", b"ActorDiedError", b"terminated with signal",
           b"terminated with exit code", b"A worker died or was killed")
RAY_FIELDS_MAX = 8       # the dead actor's field lines read after the ActorDiedError line


class LauncherExitsParser(TextParser):
    NEEDLES = NEEDLES
    NAME = "launcher_exits"
    DESCRIPTION = "DeepSpeed, Ray and mp.spawn lines naming a worker process that died"
    GLOBS = ("logs/*", "logs/**/*")
    MARKERS = (b"exits with return code", b"sigkill_handler", b"ActorDiedError", b"terminated with signal",
               b"terminated with exit code", b"A worker died or was killed")
    SCHEMAS = {"process_exits": TorchElasticParser.SCHEMAS["process_exits"]}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return any(m in head for m in cls.MARKERS)

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        log = WarningLog(label)
        if cls.unreadable(text, log, "a text log"):
            return cls.result(label, {}, {}, log)
        rows = []
        for ln, line, _start, end in text.iter_spans(text.lines_with(NEEDLES)):
            line = lines_mod.ANSI_RE.sub("", line)
            row = _deepspeed(ln, line) or _ray(text, ln, line, end) or _ray_worker(ln, line) or _spawn(ln, line)
            if row:
                rows.append(row)
        if not rows:
            log.add(None, "no launcher line naming a dead worker found")
        return cls.result(label, {"process_exits": rows}, {}, log)


def _prefix_ctx(prefix: str) -> dict:
    """The launcher context of the text before a line's own, and the host it names (pdsh's
    ``node07:``, kubectl's pod): ``process_exits`` keeps the host, not the context."""
    row = lines_mod.context(prefix).as_row()
    return {**row, "host": row["ctx_host"]}


def _deepspeed(ln: int, line: str) -> dict | None:
    if (m := DS_EXIT_RE.search(line)):
        code = int(m["code"])
        head = line[:m.start()]
        start = DS_START_RE.search(head)
        local = LOCAL_RANK_RE.search(head)
        return {"line": ln, "kind": "deepspeed", "exitcode": code, "signal": signal_name(code),
                "local_rank": int(local["local"]) if local else None,
                "traceback": f"exits with return code = {code}",
                **_prefix_ctx(head[:start.start()] if start else "")}
    if (m := DS_KILL_RE.search(line)) and "sigkill_handler" in line:
        start = DS_START_RE.search(line)
        return {"line": ln, "kind": "deepspeed_kill", "pid": int(m["pid"]),
                "traceback": "killed by the DeepSpeed launcher after another worker failed",
                **_prefix_ctx(line[:start.start()] if start else "")}
    return None


def _ray(text: LogText, ln: int, line: str, end: int) -> dict | None:
    m = RAY_DIED_RE.search(line)
    if m is None:
        return None
    fields: dict[str, str] = {}
    for f in RAY_FIELD_RE.finditer(m["msg"]):          # the fields on the same line (a joined paste)
        fields.setdefault(f["key"], f["value"])
    for nxt in text.following(end, RAY_FIELDS_MAX):
        found = list(RAY_FIELD_RE.finditer(nxt.strip().strip("`")))
        if not found or not nxt.strip().startswith(found[0]["key"]):
            break                                       # the actor's field block ended
        for f in found:
            fields.setdefault(f["key"], f["value"])
    pid = fields.get("pid")
    ctx = _prefix_ctx(line[:m.start()])
    reason = re.split(r"\s(?:class_name|actor_id|pid|ip)\s*:", m["msg"])[0].strip()
    return {"line": ln, "kind": "ray_actor_died", "pid": int(pid) if pid and pid.isdigit() else None,
            "traceback": (reason + (f" ({fields['name']})" if fields.get("name") else
                                                              f" ({fields['class_name']})" if fields.get("class_name")
                                                              else ""))[:200],
            **{**ctx, "ctx_pid": None, "ctx_host": None, "host": fields.get("ip")}}


def _ray_worker(ln: int, line: str) -> dict | None:
    """The raylet's line of a worker process lost (its ip, pid, exit type and detail), or None."""
    m = RAY_WORKER_RE.search(line)
    if m is None:
        return None
    fields = {f["key"]: f["value"] for f in RAY_WORKER_FIELD_RE.finditer(m["rest"])}
    detail = RAY_WORKER_DETAIL_RE.search(m["rest"])
    pid, ip = fields.get("PID"), fields.get("IP address")
    reason = "Ray worker died" + (f" ({fields['exit type']})" if fields.get("exit type") else "") \
        + (f": {detail['detail']}" if detail else "")
    ctx = _prefix_ctx(line[:m.start()])
    return {"line": ln, "kind": "ray_actor_died", "pid": int(pid) if pid and pid.isdigit() else None,
            "traceback": reason[:200],
            **{**ctx, "ctx_pid": None, "ctx_host": None,
               "host": ip if ip and ip not in ("0.0.0.0", "127.0.0.1") else ctx.get("host")}}


def _spawn(ln: int, line: str) -> dict | None:
    m = SPAWN_RE.search(line)
    if m is None:
        return None
    if m["sig"]:
        sig = m["sig"]
        try:
            code = -signal_mod.Signals[sig].value
        except KeyError:
            code = None
    else:
        code = int(m["code"])
        sig = signal_name(code)
    return {"line": ln, "kind": "spawn", "local_rank": int(m["index"]), "exitcode": code, "signal": sig,
            "traceback": line[m.start():].strip()[:200], **_prefix_ctx(line[:m.start()])}


register(LauncherExitsParser)
