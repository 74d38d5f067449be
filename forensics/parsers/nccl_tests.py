"""nccl-tests output (``all_reduce_perf`` & co.): stdout of any version, and ``-J`` JSON.

Text: the ``# nccl-tests version``, ``# Collective test starting``, ``# nThread …`` and
``#  Rank … on <host> device …`` header lines, the results table (column layout read
from its ``#  size count type redop root time algbw busbw #wrong …`` header; without a
header, inferred from the number of fields: 5 key columns [size count type redop root]
or 4 [no root, pre-2.13 all_reduce], then groups of 4 per side), its optional trailing
``-S 1`` timestamp, old ``error`` columns (``0e+00``) and ``N/A`` for ``-c 0``, launcher
tags (``[1,0]<stdout>:``, ``[0]`` even in mid-row), the footer (``# Out of bounds
values``, ``# Avg bus bandwidth``) and failure lines. Several runs in one file are
told apart by ``test``.

JSON (nccl-tests >= 2.17.3, ``JSON_FILE_VERSION`` 3): ``results[]`` with
``out_of_place``/``in_place`` ``{time|cpu_time, alg_bw, bus_bw, nwrong}``, string
booleans, a space-padded string ``root``, ``"nan"`` strings.

Tables (``line``: 1-based line of the row in the text, NA for JSON):

``nccl_tests`` -- one row per result row and side:
    line, test (str: e.g. all_reduce_perf, from the header, the command line, the JSON
    or the file name; NA if unknown), size_bytes (int), count (int), dtype (str),
    redop (str), root (int; -1 for no root, NA when the layout has no root column),
    placement (out|in), time_us (float; CPU time with ``-C 1``), time_kind (gpu|cpu),
    algbw_gbps (float), busbw_gbps (float), wrong (float: #wrong count, or the old
    ``error`` value; NA when not checked), timestamp (str, ``-S 1`` only).
``nccl_tests_devices`` -- ``#  Rank r Group g Pid p on host device d [bus] name``:
    line, rank (int), group (int, NA before 2.13), pid (int), host (str), device (int),
    bus_id (str), gpu (str).

Facts: tests (names in order), version, git_hash, nccl_headers, nccl_library (int
codes, text) or nccl_version and json_version (JSON), config (nThread, nGpus, minBytes, maxBytes, step,
warmup_iters, iters, agg_iters, validation, graph, unalign as present), hosts (sorted),
ranks (int), devices (int), avg_busbw_gbps (float, last footer; NaN if ``nan``),
avg_busbw_by_test ({test: float}), avg_busbw_status (OK|FAILED|None),
out_of_bounds (int), out_of_bounds_ok (bool), failures ([str]).
"""
from __future__ import annotations

import json
import re


from .heads import NCCL_TESTS_MARKERS
from .lines import strip_tags
from .registry import WarningLog, decode_text, looks_binary, register, split_lines
from .text import LogText, TextParser

OMPI_TAG_RE = re.compile(r"^(?:.*?\d{4})?\[\d+,\d+\]<std(?:out|err)>:")
QUOTE_RE = re.compile(r"^\s*(?:>\s*)+")          # a Markdown quote of a pasted line
# launcher tags and quote marks a pasted line may carry before an nccl-tests line (sniffing)
_LEAD = r"(?m)^[>\s]*(?:(?:\[[^\]\n]{1,40}\](?:<std\w+>)?|\S+ >>|\d{1,6}(?!\d)):?[ \t]*)*"
# the data types and reduction operations nccl-tests prints, every version (1.x: char, int)
DTYPES = r"(?:u?int(?:8|32|64)?|half|float|double|bfloat16|f8e4m3|f8e5m2|char)"
REDOPS = r"(?:sum|prod|max|min|avg|mulsum|premulsum|none)"
_NUM = r"(?:-?\d+(?:\.\d+)?(?:e[+-]\d+)?|N/A|nan|inf)"
# a result row by its shape, header or not: size count type [redop] [root], then 3 or 4
# values per side (time algbw busbw [#wrong|error]), one or two sides, [a -S 1 timestamp]
ROW_SHAPE_RE = re.compile(_LEAD + r"[ \t]*\d+[ \t]+\d+[ \t]+" + DTYPES + r"[ \t]+(?:" + REDOPS + r"[ \t]+)?"
                          r"(?:-?\d+[ \t]+)?(?:" + _NUM + r"[ \t]+){2,}" + _NUM + r"[ \t]*(?:\d{4}-\d\d-\d\d[ \t]+\S+)?"
                          r"[ \t]*\r?$")
ROWS_TO_CLAIM = 2                                  # row-shaped lines that make a headerless table
RANK_TAG_RE = re.compile(r"\[\d+\]")
VERSION_RE = re.compile(r"^#\s*nccl-tests version (?P<v>\S+)(?: \((?P<git>[^)]*)\))?"
                        r"(?: nccl-headers=(?P<h>\d+))?(?: nccl-library=(?P<l>\d+))?")
START_RE = re.compile(r"^#\s*Collective test starting: (?P<name>\S+)")
CONFIG_FIELDS = {
    "nThread": r"nThread (\d+)", "nGpus": r"nGpus (\d+)", "minBytes": r"minBytes (\d+)",
    "maxBytes": r"maxBytes (\d+)", "step": r"step: (\S+)", "warmup_iters": r"warmup iters: (\d+)",
    "iters": r"(?<!warmup )(?<!agg )iters: (\d+)", "agg_iters": r"agg iters: (\d+)",
    "validation": r"validation: (\d+)", "graph": r"graph: (\d+)", "unalign": r"unalign: (\d+)",
}
# (before 2019 the line had no "Pid": ``#   Rank  0 on node1 device  0 [0x00] Tesla M60``)
DEVICE_RE = re.compile(r"^#\s+Rank\s+(?P<rank>\d+)(?:\s+Group\s+(?P<group>\d+))?(?:\s+Pid\s+(?P<pid>\d+))?\s+on\s+"
                       r"(?P<host>\S+)\s+device\s+(?P<device>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<gpu>.*?)\s*$")
OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<n>\d+)\s*(?P<ok>OK|FAILED)?")
AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<v>[-+\w.]+)\s*(?P<ok>OK|FAILED)?")
FAIL_RE = re.compile(r"Test (?:NCCL )?failure|Test timeout|Test CUDA failure")
CMD_RE = re.compile(r"(?:^|[\s/])(?P<name>\w+_perf)(?:_mpi)?\b")
STAMP_RE = re.compile(r"^\d{4}-\d\d-\d\d$")
SIDE_NAMES = {"time": "time_us", "algbw": "algbw_gbps", "busbw": "busbw_gbps", "#wrong": "wrong",
              "wrong": "wrong", "error": "wrong", "res": "wrong"}
# nccl-tests 1.x printed its parameter and summary lines without the "#" of 2.x
UNMARKED_RE = re.compile(r"^(?:nThread \d|Using devices|Out of bounds values|Avg bus bandwidth|Rank\s+\d+\s)")
# the same lines as nccl-tests 1.x printed them, or a paste that lost the "#" (Markdown read it
# as a heading): whole lines of their own, never a phrase inside prose
UNMARKED_SNIFF_RE = re.compile(_LEAD + r"(?:nThread \d+ nGpus \d+ minBytes \d+|Out of bounds values\s*:\s*\d+\s*(?:OK|FAILED)"
                               r"|Avg bus bandwidth\s*:\s*[-+\d.]+\s*$|#?\s*Rank\s+\d+\s+(?:Group\s+\d+\s+)?(?:Pid\s+\d+\s+)?"
                               r"on\s+\S+\s+device\s+\d+\s+\[|\s*size\s+count\s+type\s+redop\s)")
MS_UNITS_RE = re.compile(r"^#?\s*\(B\)\s+\(elements\).*\(ms\)")


REGION_MIN_BYTES = 16 << 20
INT_RE = re.compile(r"^-?\d+$")
HEADER_RE = re.compile(r"^\s*#?\s*size\s+count\s+type\b")


def _is_num(tok: str) -> bool:
    """Whether ``tok`` reads as a number (a reduction operation is a name, never one)."""
    try:
        float(tok)
    except ValueError:
        return False
    return True


def _num(tok: str) -> float | None:
    if tok in ("N/A", "-", ""):
        return None
    return float(tok)        # raises ValueError on junk; the caller warns


class NcclTestsParser(TextParser):
    NAME = "nccl_tests"
    DESCRIPTION = "nccl-tests stdout (all versions) and its -J JSON output"
    GLOBS = ("nccl-tests/*", "nccl-tests/**/*", "*_perf*.txt", "*_perf*.log", "*_perf*.json")
    SCHEMAS = {
        "nccl_tests": {"line": "int", "test": "str", "size_bytes": "int", "count": "int", "dtype": "str",
                       "redop": "str", "root": "int", "placement": "str", "time_us": "float",
                       "time_kind": "str", "algbw_gbps": "float", "busbw_gbps": "float", "wrong": "float",
                       "timestamp": "str"},
        "nccl_tests_devices": {"line": "int", "rank": "int", "group": "int", "pid": "int", "host": "str",
                               "device": "int", "bus_id": "str", "gpu": "str"},
    }

    MARKERS = NCCL_TESTS_MARKERS     # (:mod:`.heads`)

    @classmethod
    def claims(cls, text: LogText) -> bool:
        if cls.sniff(text.head()):
            return True
        hits = text.first(cls.MARKERS)
        if any(hits.get(m, -1) >= 0 for m in cls.MARKERS[:8]):
            return True
        # a row-type marker alone is not enough: the rows around it must have the shape
        at = min((o for o in hits.values() if o >= 0), default=-1)
        return at >= 0 and _rows_in(bytes(text.data[max(0, at - 4096):at + 4096]))

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        if re.search(_LEAD + r"#\s*(?:nThread \d|nccl-tests version|Collective test starting"
                     r"|\s*size\s+count\s+type|\s*\(B\)\s+\(elements\)|Avg bus bandwidth|Out of bounds values)", t):
            return True
        if UNMARKED_SNIFF_RE.search(t) or _rows_in(head):
            return True
        return t.lstrip().startswith("{") and '"results"' in t and ('"nccl_version"' in t or '"experiment_name"' in t)

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        """A large log is read around its nccl-tests lines only (a run is a few hundred lines)."""
        return cls.parse_region(text, label, REGION_MIN_BYTES, cls.MARKERS + (b"#       size", b"#  Rank"))

    @classmethod
    def parse_bytes(cls, data: bytes, label: str, first_line: int = 1):
        log = WarningLog(label)
        facts = {"tests": [], "version": None, "git_hash": None, "nccl_headers": None, "nccl_library": None,
                 "config": {}, "hosts": [], "ranks": 0, "devices": 0, "avg_busbw_gbps": None,
                 "avg_busbw_by_test": {}, "avg_busbw_status": None, "out_of_bounds": None,
                 "out_of_bounds_ok": None, "failures": []}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, {}, facts, log)
        if looks_binary(data):
            log.add(None, "binary data, not nccl-tests output")
            return cls.result(label, {}, facts, log)
        text = decode_text(data)
        default_test = (m["name"] if (m := CMD_RE.search(label.rsplit("/", 1)[-1])) else None)
        if text.lstrip().startswith("{"):
            rows, devices = _parse_json(text, facts, log, default_test)
        else:
            rows, devices = _parse_text(text, facts, log, default_test, first_line)
        facts["hosts"] = sorted({d["host"] for d in devices if d.get("host")})
        facts["ranks"] = len({d["rank"] for d in devices if d.get("rank") is not None})
        facts["devices"] = len(devices)
        if not rows and not devices and not facts["failures"] and facts["avg_busbw_gbps"] is None \
                and facts["out_of_bounds"] is None:
            log.add(None, "no nccl-tests results found")
        return cls.result(label, {"nccl_tests": rows, "nccl_tests_devices": devices}, facts, log)


def _rows_in(data: bytes) -> bool:
    """Whether ``data`` holds a results table's rows (by their shape, no header needed)."""
    t = data.decode("utf-8", "replace")
    n = 0
    for _ in ROW_SHAPE_RE.finditer(t):
        n += 1
        if n >= ROWS_TO_CLAIM:
            return True
    return False


def _layout_from_header(tokens: list[str]) -> tuple[list[str], list[list[str]], bool] | None:
    """(key columns, per-side column names, trailing timestamp) from a table header line."""
    if "time" not in tokens:
        return None
    first = tokens.index("time")
    keys, sides, trailing = tokens[:first], [], False
    for tok in tokens[first:]:
        if tok == "time":
            sides.append([tok])
        elif tok.lower() in ("timestamp", "date"):
            trailing = True
        elif sides:
            sides[-1].append(tok)
    return keys, sides, trailing


def _parse_text(text: str, facts: dict, log: WarningLog, default_test: str | None, first_line: int = 1):
    rows, devices = [], []
    test = default_test
    layout = None
    scale = 1.0                      # nccl-tests 1.x timed in ms: its times are kept in us
    for ln, raw in enumerate(split_lines(text), first_line):
        line = OMPI_TAG_RE.sub("", QUOTE_RE.sub("", raw)).strip()
        if line[:1] in "[(" or (line[:1].isdigit() and ":" in line[:8]):
            line = strip_tags(line)[1].strip()
        if not line:
            continue
        if UNMARKED_RE.match(line):
            line = "# " + line
        if MS_UNITS_RE.match(line):
            scale = 1000.0
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if (m := VERSION_RE.match(line)):
                facts["version"], facts["git_hash"] = m["v"], m["git"]
                facts["nccl_headers"] = int(m["h"]) if m["h"] else None
                facts["nccl_library"] = int(m["l"]) if m["l"] else None
            elif (m := START_RE.match(line)):
                test = m["name"]
                if test not in facts["tests"]:
                    facts["tests"].append(test)
            elif body.startswith("nThread"):
                for key, rx in CONFIG_FIELDS.items():
                    if (m := re.search(rx, body)):
                        facts["config"][key] = int(m[1]) if m[1].isdigit() else m[1]
            elif (m := DEVICE_RE.match(line)):
                devices.append({"line": ln, "rank": int(m["rank"]), "group": int(m["group"]) if m["group"] else None,
                                "pid": int(m["pid"]) if m["pid"] else None, "host": m["host"], "device": int(m["device"]),
                                "bus_id": m["bus"], "gpu": m["gpu"]})
            elif body.split()[:2] == ["size", "count"]:
                layout = _layout_from_header(body.split())
                if layout is None:
                    log.add(ln, f"table header without a time column: {line[:120]!r}")
            elif (m := OOB_RE.match(line)):
                facts["out_of_bounds"] = int(m["n"])
                facts["out_of_bounds_ok"] = None if m["ok"] is None else m["ok"] == "OK"
            elif (m := AVG_RE.match(line)):
                try:
                    v = float(m["v"])
                except ValueError:
                    log.add(ln, f"unreadable average bus bandwidth {m['v']!r}")
                    continue
                facts["avg_busbw_gbps"] = v
                facts["avg_busbw_status"] = m["ok"]
                facts["avg_busbw_by_test"][test or ""] = v
            continue
        if FAIL_RE.search(line):
            facts["failures"].append(line)
            continue
        if HEADER_RE.match(line):              # a column header printed without its "#"
            layout = _layout_from_header(line.lstrip("#").split())
            continue
        tokens = RANK_TAG_RE.sub(" ", line).split()
        if not tokens or not tokens[0].isdigit():
            if (m := CMD_RE.search(line)) and ("./" in line or line.startswith(m["name"])):
                test = m["name"]
                if test not in facts["tests"]:
                    facts["tests"].append(test)
            continue
        parsed = _parse_row(tokens, layout)
        if isinstance(parsed, str):
            log.add(ln, f"{parsed}: {line[:120]!r}")
            continue
        key, sides, stamp = parsed
        if scale != 1.0:
            sides = [{k: (v * scale if k == "time_us" and v is not None else v) for k, v in s.items()} for s in sides]
        if test and test not in facts["tests"]:
            facts["tests"].append(test)
        for placement, vals in zip(("out", "in"), sides):
            rows.append({"line": ln, "test": test, **key, "placement": placement, "time_kind": "gpu",
                         "timestamp": stamp, **vals})
    return rows, devices


def _parse_row(tokens: list[str], layout) -> tuple[dict, list[dict], str | None] | str:
    stamp = None
    if len(tokens) >= 2 and STAMP_RE.match(tokens[-2]):
        stamp = f"{tokens[-2]} {tokens[-1]}"
        tokens = tokens[:-2]
    candidates = []
    if layout is not None:
        keys, sides, _ = layout
        if len(tokens) == len(keys) + sum(len(s) for s in sides):
            candidates.append((keys, sides))
        elif len(tokens) == len(keys) + len(sides[0]) if sides else False:
            candidates.append((keys, sides[:1]))
    for nkeys in (5, 4, 3):
        # 4 keys: no root (2017's all_reduce: "bytes N type op") or no redop ("bytes N type root");
        # 3 keys: neither (2.4-2.6's all_reduce and all_gather: "size count type time ...")
        keys = (["size", "count", "type", "redop", "root"] if nkeys == 5 else ["size", "count", "type"] if nkeys == 3
                else ["size", "count", "type", "root" if INT_RE.match(tokens[3] if len(tokens) > 3 else "") else "redop"])
        rest = len(tokens) - nkeys
        for per in (4, 3):                  # time algbw busbw [#wrong]: no #wrong column before 2018
            if rest in (per, 2 * per):
                candidates.append((keys, [["time", "algbw", "busbw", "#wrong"][:per]] * (rest // per)))
    # a root is an integer and a time never negative (a row cut short is no row); a time under
    # 10 ms has decimals: these tell "5 keys, 3 per side" from "4 keys, 4 per side"
    candidates = [c for c in candidates if ("root" not in c[0] or INT_RE.match(tokens[c[0].index("root")]))
                  and ("redop" not in c[0] or not _is_num(tokens[c[0].index("redop")]))
                  and not tokens[len(c[0])].startswith("-")]
    candidates.sort(key=lambda c: bool(INT_RE.match(tokens[len(c[0])])) and c[0][-1] == "redop")
    if not candidates:
        return f"result row with {len(tokens)} fields fits no known column layout"
    keys, sides = candidates[0]
    kv = dict(zip(keys, tokens))
    try:
        key = {"size_bytes": int(kv["size"]), "count": int(kv["count"]), "dtype": kv["type"],
               "redop": kv.get("redop"), "root": int(kv["root"]) if "root" in kv else None}
    except (KeyError, ValueError):
        return "result row with non-numeric size/count/root"
    if not re.fullmatch(r"[A-Za-z_]\w*", key["dtype"] or ""):
        return "result row with an unreadable type column"
    out, pos = [], len(keys)
    for side in sides:
        vals = {}
        for name in side:
            tok = tokens[pos]
            pos += 1
            col = SIDE_NAMES.get(name)
            if col is None:
                continue
            try:
                vals[col] = _num(tok)
            except ValueError:
                return f"non-numeric {name} value {tok!r}"
        out.append(vals)
    return key, out, stamp


def _jstr_num(v):
    if v is None:
        return None
    if isinstance(v, bool):
        raise ValueError("boolean")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        return float(v.strip())        # "nan" -> nan, "  -1" -> -1.0
    raise ValueError(type(v).__name__)


def _parse_json(text: str, facts: dict, log: WarningLog, default_test: str | None):
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        log.add(e.lineno, f"invalid JSON: {e.msg}")
        return [], []
    if not isinstance(doc, dict):
        log.add(None, f"JSON top level is {type(doc).__name__}, expected an object")
        return [], []
    facts["json_version"] = doc.get("version")      # JSON_FILE_VERSION, not the nccl-tests version
    facts["nccl_version"] = doc.get("nccl_version")
    cfg = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    facts["config"] = {k: v for k, v in cfg.items() if k != "devices"}
    devices = []
    raw_devices = cfg.get("devices")
    if raw_devices is not None and not isinstance(raw_devices, list):
        log.add(None, f"config.devices is a {type(raw_devices).__name__}, expected a list")
        raw_devices = None
    for i, d in enumerate(raw_devices or []):
        if not isinstance(d, dict):
            log.add(None, f"config.devices[{i}] is not an object")
            continue
        try:
            devices.append({"rank": int(d["rank"]), "group": d.get("group"), "pid": d.get("pid"),
                            "host": str(d.get("hostname", "")), "device": d.get("device"),
                            "bus_id": d.get("device_hex"), "gpu": d.get("device_info")})
        except (KeyError, TypeError, ValueError, OverflowError):
            log.add(None, f"config.devices[{i}] has no usable rank")
    rows = []
    results = doc.get("results")
    if not isinstance(results, list):
        log.add(None, "JSON has no results list")
        results = []
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            log.add(None, f"results[{i}] is not an object")
            continue
        test = r.get("experiment_name") if isinstance(r.get("experiment_name"), str) else default_test
        try:
            key = {"size_bytes": int(r["size"]), "count": int(r["count"]), "dtype": str(r["type"]),
                   "redop": str(r.get("redop")) if r.get("redop") is not None else None,
                   "root": int(_jstr_num(r["root"])) if r.get("root") is not None else None}
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            log.add(None, f"results[{i}]: unusable size/count/type/root ({e})")
            continue
        if test and test not in facts["tests"]:
            facts["tests"].append(test)
        for placement, side_key in (("out", "out_of_place"), ("in", "in_place")):
            side = r.get(side_key)
            if side is None:
                continue
            if not isinstance(side, dict):
                log.add(None, f"results[{i}].{side_key} is not an object")
                continue
            try:
                kind = "cpu" if "cpu_time" in side else "gpu"
                vals = {"time_us": _jstr_num(side.get("cpu_time", side.get("time"))),
                        "algbw_gbps": _jstr_num(side.get("alg_bw")), "busbw_gbps": _jstr_num(side.get("bus_bw")),
                        "wrong": _jstr_num(side.get("nwrong"))}
            except (TypeError, ValueError, OverflowError) as e:
                log.add(None, f"results[{i}].{side_key}: non-numeric value ({e})")
                continue
            rows.append({"test": test, **key, "placement": placement, "time_kind": kind, **vals})
    avg = doc.get("average_bus_bandwidth")
    if isinstance(avg, dict):
        try:
            facts["avg_busbw_gbps"] = _jstr_num(avg.get("bandwidth"))
        except (TypeError, ValueError, OverflowError):
            log.add(None, "average_bus_bandwidth.bandwidth is not a number")
        ok = avg.get("okay")
        facts["avg_busbw_status"] = {"true": "OK", "false": "FAILED"}.get(str(ok).lower())
        if facts["tests"] and facts["avg_busbw_gbps"] is not None:
            facts["avg_busbw_by_test"][facts["tests"][-1]] = facts["avg_busbw_gbps"]
    oob = doc.get("out_of_bounds")
    if isinstance(oob, dict):
        facts["out_of_bounds"] = oob.get("count") if isinstance(oob.get("count"), int) else None
        facts["out_of_bounds_ok"] = {"true": True, "false": False}.get(str(oob.get("okay")).lower())
    return rows, devices


register(NcclTestsParser)
