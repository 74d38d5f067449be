"""PyTorch Flight Recorder dumps (``TORCH_NCCL_TRACE_BUFFER_SIZE``; pickle, versions 2.x).

The on-disk dump (``<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>``, default
``/tmp/nccl_trace_rank_<rank>``) is a pickle of a plain dict: ``version``, ``pg_config``,
``pg_status``, ``entries`` (oldest first), optional ``nccl_comm_state``,
``comm_lib_version``/``nccl_version``. The JSON variant (``_dump_nccl_trace_json``)
is accepted as well; it writes ``time_discovered_*`` as 0 where the pickle has None,
so 0 is read as "not discovered" in both, and ``pg_status`` counters as decimal strings,
read as ints. Every dump format the writer has had (``version`` 1.1 to 2.10) is read: the
1.x formats' ``seq_id`` is ``collective_seq_id``, and their entries, which have no
``process_group``, take ``str(pg_id)`` as ``pg_name`` (tests/fixtures/parsers/flight_recorder/
README.md lists each format's keys and the PyTorch source each is read from).

SECURITY: a dump is untrusted input, and unpickling can run code. The unpickler here
constructs plain containers and scalars only; ``find_class`` imports nothing. The only
names it resolves are TorchScript's list builders (``torch.jit._pickle.build_intlist``
& co., which a C++-written pickle may use for typed lists), mapped to local functions
that return a list. Any other global (``os.system``, ``torch._utils._rebuild_tensor``,
…) makes the whole file refused with a warning, before anything is called.

Tables (``rank``: the dump's global rank, from a ``rank`` key or the file name's
trailing number, as the official analyzer infers it; NA if neither):

``fr_entries`` -- one row per entry:
    rank, record_id (int), pg_id (int), pg_name, pg_desc (str; ``process_group`` tuple),
    collective_seq_id (``seq_id`` in the oldest dumps), p2p_seq_id, op_id (int), profiling_name (str, e.g.
    ``nccl:all_reduce``), op (str: ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST,
    REDUCE, SEND, RECV, ALL_TO_ALL, BARRIER, COALESCED, … from profiling_name),
    is_p2p (bool), state (scheduled|started|completed), time_created_ns,
    time_discovered_started_ns, time_discovered_completed_ns (int, wall clock ns; NA
    when absent/0), duration_ms (float, only with TORCH_NCCL_ENABLE_TIMING), retired
    (bool), timeout_ms (int), input_sizes, output_sizes (str: JSON of the shape lists),
    input_numel, output_numel (int: total elements), input_dtypes, output_dtypes (str,
    comma-separated), thread_id (str), thread_name (str), top_frame (str: innermost
    ``name (file:line)``), frames (str: all frames, newline-separated).
``fr_pg_config`` -- rank, pg_name, desc, ranks (str as dumped, e.g. ``[0, 1]``), size (int).
``fr_pg_status`` -- rank, pg_id (str), last_enqueued_collective, last_started_collective,
    last_completed_collective (int; -1 = none).

Facts: format (pickle|json), version (str), rank, comm_lib_version, entries (int),
process_groups (int).
"""
from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
from pathlib import Path

from ..coerce import json_int
from .registry import Parser, WarningLog, register

OPS = {"all_reduce": "ALL_REDUCE", "allreduce": "ALL_REDUCE", "all_gather": "ALL_GATHER",
       "_allgather_base": "ALL_GATHER", "allgather": "ALL_GATHER", "all_gather_into_tensor": "ALL_GATHER",
       "reduce_scatter": "REDUCE_SCATTER", "_reduce_scatter_base": "REDUCE_SCATTER",
       "reduce_scatter_tensor": "REDUCE_SCATTER", "reducescatter": "REDUCE_SCATTER", "broadcast": "BROADCAST",
       "reduce": "REDUCE", "send": "SEND", "recv": "RECV", "recvanysource": "RECV", "all_to_all": "ALL_TO_ALL",
       "alltoall": "ALL_TO_ALL", "alltoall_base": "ALL_TO_ALL", "all_to_all_single": "ALL_TO_ALL",
       "barrier": "BARRIER", "gather": "GATHER", "scatter": "SCATTER", "coalesced": "COALESCED"}


def _as_list(data):
    return list(data)


# (module, name) -> harmless local stand-in. Nothing is ever imported.
SAFE_GLOBALS = {
    ("torch.jit._pickle", "build_intlist"): _as_list,
    ("torch.jit._pickle", "build_doublelist"): _as_list,
    ("torch.jit._pickle", "build_boollist"): _as_list,
    ("torch.jit._pickle", "build_list"): _as_list,
}


class RefusedGlobal(pickle.UnpicklingError):
    pass


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles containers and scalars; refuses every global outside SAFE_GLOBALS."""

    def find_class(self, module, name):
        fn = SAFE_GLOBALS.get((module, name))
        if fn is None:
            raise RefusedGlobal(f"{module}.{name}")
        return fn

    def persistent_load(self, pid):
        raise RefusedGlobal(f"persistent id {pid!r}")


_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def _check_memo_indices(data: bytes) -> None:
    """Refuse memo indices no real pickle uses, before the C unpickler sees them.

    The C unpickler sizes its memo table by the largest index a PUT names: one
    ``LONG_BINPUT 0xFFFFFFFF`` makes it allocate and clear tens of GB (a hang, then the
    OOM killer). A pickler numbers memo entries 0, 1, 2, ...: an index at or beyond the
    number of opcodes read so far cannot come from one. The scan only decodes opcodes
    (``pickletools.genops``), it runs nothing; a malformed stream raises ValueError."""
    for n, (op, arg, _) in enumerate(pickletools.genops(data), 1):
        if op.name in _MEMO_PUTS and isinstance(arg, int) and arg >= n:
            raise pickle.UnpicklingError(f"memo index {arg} at opcode {n} (corrupt or hostile pickle)")


def safe_loads(data: bytes):
    """Unpickle ``data`` without constructing anything but plain values (RefusedGlobal otherwise)."""
    _check_memo_indices(data)
    return RestrictedUnpickler(io.BytesIO(data)).load()


def op_from_profiling_name(name) -> str | None:
    if not isinstance(name, str):
        return None
    base = name.split(":", 1)[-1].strip()
    word = re.split(r"[\s(]", base, maxsplit=1)[0]
    if word.endswith("_coalesced") and word.lower() != "coalesced":
        word = word[: -len("_coalesced")]
    return OPS.get(word.lower(), word.upper() or None)


def _shape_numel(sizes) -> int | None:
    if not isinstance(sizes, (list, tuple)):
        return None
    total = 0
    for shape in sizes:
        if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                            for d in shape):
            return None
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def _jsonish(v):
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


class FlightRecorderParser(Parser):
    STRUCTURED = True     # a whole file of its own format
    NAME = "flight_recorder"
    DESCRIPTION = "PyTorch Flight Recorder dump (restricted pickle, or JSON)"
    GLOBS = ("flight-recorder/*", "flight-recorder/**/*", "nccl_trace_rank_*", "*fr_dump*")
    SCHEMAS = {
        "fr_entries": {"rank": "int", "record_id": "int", "pg_id": "int", "pg_name": "str", "pg_desc": "str",
                       "collective_seq_id": "int", "p2p_seq_id": "int", "op_id": "int", "profiling_name": "str",
                       "op": "str", "is_p2p": "bool", "state": "str", "time_created_ns": "int",
                       "time_discovered_started_ns": "int", "time_discovered_completed_ns": "int",
                       "duration_ms": "float", "retired": "bool", "timeout_ms": "int", "input_sizes": "str",
                       "output_sizes": "str", "input_numel": "int", "output_numel": "int", "input_dtypes": "str",
                       "output_dtypes": "str", "thread_id": "str", "thread_name": "str", "top_frame": "str",
                       "frames": "str"},
        "fr_pg_config": {"rank": "int", "pg_name": "str", "desc": "str", "ranks": "str", "size": "int"},
        "fr_pg_status": {"rank": "int", "pg_id": "str", "last_enqueued_collective": "int",
                         "last_started_collective": "int", "last_completed_collective": "int"},
    }

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
            # a pickle; claim it only if it looks like an FR dump (keys are near the start)
            return b"entries" in head or b"pg_config" in head or b"version" in head
        t = head.lstrip()[:4096]
        return t.startswith(b"{") and b'"entries"' in t and (b'"pg_config"' in t or b'"pg_status"' in t)

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        log = WarningLog(label)
        facts = {"format": None, "version": None, "rank": None, "comm_lib_version": None, "entries": 0,
                 "process_groups": 0}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, {}, facts, log)
        doc = None
        if data[:1] == b"\x80" or data[:1] in (b"}", b"(", b"]"):
            facts["format"] = "pickle"
            try:
                doc = safe_loads(data)
            except RefusedGlobal as e:
                log.add(None, f"refused pickle: it would construct {e} (only plain values are allowed)")
                return cls.result(label, {}, facts, log)
            except Exception as e:   # truncated or corrupt pickle: any error the VM raises
                log.add(None, f"unreadable pickle: {type(e).__name__}: {e}")
                return cls.result(label, {}, facts, log)
        else:
            facts["format"] = "json"
            try:
                doc = json.loads(data.decode("utf-8", errors="strict"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                log.add(getattr(e, "lineno", None), f"neither a pickle nor valid JSON: {e}")
                return cls.result(label, {}, facts, log)
        if isinstance(doc, list) and all(isinstance(e, dict) for e in doc):
            doc = {"entries": doc}      # a bare list of entries: no version or pg_config
        if not isinstance(doc, dict):
            log.add(None, f"dump is a {type(doc).__name__}, expected a dict")
            return cls.result(label, {}, facts, log)

        rank = doc.get("rank") if isinstance(doc.get("rank"), int) and not isinstance(doc.get("rank"), bool) \
            else None
        if rank is None and (m := re.search(r"(\d+)(?:\.\w+)?$", Path(label).name)) and label != "<bytes>":
            rank = int(m[1])
        facts["rank"] = rank
        facts["version"] = doc.get("version") if isinstance(doc.get("version"), str) else None
        if facts["version"] is None:
            log.add(None, "dump has no version string")
        lib = doc.get("comm_lib_version", doc.get("nccl_version"))
        facts["comm_lib_version"] = lib if isinstance(lib, str) else None

        pg_config = []
        cfg = doc.get("pg_config", {})
        if not isinstance(cfg, dict):
            log.add(None, f"pg_config is a {type(cfg).__name__}, expected a dict")
            cfg = {}
        for name, v in cfg.items():
            if isinstance(v, dict):
                ranks = v.get("ranks")
                pg_config.append({"rank": rank, "pg_name": str(v.get("name", name)), "desc": v.get("desc"),
                                  "ranks": ranks if isinstance(ranks, str) else _jsonish(ranks),
                                  "size": _ranks_size(ranks)})
            elif isinstance(v, (list, str)):      # older dumps: {name: ranks}
                pg_config.append({"rank": rank, "pg_name": str(name), "ranks": v if isinstance(v, str) else
                                  _jsonish(v), "size": _ranks_size(v)})
            else:
                log.add(None, f"pg_config[{name!r}] is a {type(v).__name__}")
        pg_status = []
        st = doc.get("pg_status", {})
        if not isinstance(st, dict):
            log.add(None, f"pg_status is a {type(st).__name__}, expected a dict")
            st = {}
        for pg, v in st.items():
            if not isinstance(v, dict):
                log.add(None, f"pg_status[{pg!r}] is a {type(v).__name__}")
                continue
            pg_status.append({"rank": rank, "pg_id": str(pg), **{k: _counter(v.get(k)) for k in (
                "last_enqueued_collective", "last_started_collective", "last_completed_collective")}})

        entries = []
        raw = doc.get("entries", [])
        if not isinstance(raw, (list, tuple)):
            log.add(None, f"entries is a {type(raw).__name__}, expected a list")
            raw = []
        for i, e in enumerate(raw):
            if not isinstance(e, dict):
                log.add(None, f"entries[{i}] is a {type(e).__name__}, skipped")
                continue
            row = _entry(e, rank, i, log)
            if row is not None:
                entries.append(row)
        facts["entries"] = len(entries)
        facts["process_groups"] = len(pg_config)
        return cls.result(label, {"fr_entries": entries, "fr_pg_config": pg_config, "fr_pg_status": pg_status},
                          facts, log)


def _counter(v):
    """A pg_status counter: an int in the pickle, a decimal string in the JSON dump
    (``getPgStatusJson`` writes ``std::to_string(status->lastEnqueuedSeq)``; FlightRecorder.hpp /
    FlightRecorderDetail.hpp from format 2.3 on)."""
    if isinstance(v, str) and re.fullmatch(r"-?\d{1,20}", v.strip()):
        return int(v)
    return json_int(v)


def _ranks_size(ranks) -> int | None:
    if isinstance(ranks, (list, tuple)):
        return len(ranks)
    if isinstance(ranks, str):
        try:
            v = json.loads(ranks)
            return len(v) if isinstance(v, list) else None
        except json.JSONDecodeError:
            return None
    return None


INT_FIELDS = ("record_id", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns",
              "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms")


def _entry(e: dict, rank, i: int, log: WarningLog) -> dict | None:
    row = {"rank": rank}
    for k in INT_FIELDS:
        v = e.get(k)
        if v is None:
            row[k] = None
        elif isinstance(v, int) and not isinstance(v, bool):
            row[k] = v
        else:
            log.add(None, f"entries[{i}].{k} is {type(v).__name__} {v!r:.40}, expected int")
            row[k] = None
    for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
        if row[k] == 0:
            row[k] = None
    if row["collective_seq_id"] is None and json_int(e.get("seq_id")) is not None:
        row["collective_seq_id"] = e["seq_id"]          # dumps before collective_seq_id/p2p_seq_id (2.2)
    if row["collective_seq_id"] is None and row["p2p_seq_id"] is None and row["record_id"] is None:
        log.add(None, f"entries[{i}] has no record_id or sequence ids, skipped")
        return None
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) >= 1:
        row["pg_name"] = str(pg[0])
        row["pg_desc"] = str(pg[1]) if len(pg) > 1 else None
    elif pg is not None:
        log.add(None, f"entries[{i}].process_group is {type(pg).__name__}, expected a (name, desc) tuple")
    elif row["pg_id"] is not None:
        # formats 1.x have no process_group: an entry names its group by pg_id, which is also
        # the key of 1.4's pg_config ({pg_id: [ranks]}), so the id is the group's name here
        row["pg_name"] = str(row["pg_id"])
    pn = e.get("profiling_name")
    row["profiling_name"] = pn if isinstance(pn, str) else None
    row["op"] = op_from_profiling_name(pn)
    state = e.get("state")
    row["state"] = state if isinstance(state, str) else None
    for k in ("is_p2p", "retired"):
        row[k] = e[k] if isinstance(e.get(k), bool) else None
    d = e.get("duration_ms")
    row["duration_ms"] = float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else None
    for k in ("input_sizes", "output_sizes"):
        v = e.get(k)
        row[k] = _jsonish(v) if v is not None else None
        row[k.replace("sizes", "numel")] = _shape_numel(v)
    for k in ("input_dtypes", "output_dtypes"):
        v = e.get(k)
        row[k] = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else (v if isinstance(v, str) else None)
    for k in ("thread_id", "thread_name"):
        row[k] = None if e.get(k) is None else str(e.get(k))
    frames = e.get("frames") or []
    lines = []
    if isinstance(frames, (list, tuple)):
        for f in frames:
            if isinstance(f, dict):
                lines.append(f"{f.get('name')} ({f.get('filename')}:{f.get('line')})")
    row["frames"] = "\n".join(lines) if lines else None
    row["top_frame"] = lines[0] if lines else None
    return row


register(FlightRecorderParser)
