"""NCCL RAS status (``ncclras [-v]`` text output, NCCL >= 2.24), as capture keeps it in
``sys/host/ncclras-<phase>.txt``.

The format (NCCL User Guide, Troubleshooting, RAS; printed by ``src/ras/client_support.cc``)::

    NCCL version 2.30.7 compiled with CUDA 12.8          (newer releases)
    CUDA runtime version 12080, driver version 13000

    Job summary
    ===========

      Nodes  Processes         GPUs  Processes     GPUs
    (total)   per node  per process    (total)  (total)
          4          8            1         32       32

    Communicators... (2.05s)
    =============

    Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
        #  in group  per comm  per node  per comm  in group
        0         1         4       7-8        32        32   RUNNING  INCOMPLETE

    Errors
    ======

    INCOMPLETE
      Missing communicator data from 1 job process
      Process 3487984 on node 172.16.64.213 managing GPU 5

    #0-0 (cf264af53edbe986) INCOMPLETE
      Missing communicator data from 1 rank
      The missing rank: 21

    Warnings
    ========

    TIMEOUT
      Encountered 2 communication timeouts while gathering communicator data

    #0-0 (27a079b828ff1a75) MISMATCH
      Communicator ranks have different collective operation counts
      26 ranks have launched up to operation 6650
      Rank 0 -- GPU 0 managed by process 483072 on node 172.16.64.210

A job whose nodes differ prints the summary as distributions (``Nodes / Processes per
node`` rows, then ``(total)`` rows) and ``The outlier node(s):``; communicators are
``#<group>-<index> (<commHash>)``; per-rank lines are ``Rank R -- GPU G managed by process
P on node N`` or ``Rank R has status S -- ...`` / ``has launched up to operation N -- ...``
/ ``reported <error> -- ...`` (the one-member case), ``The missing rank: R`` (older
releases; ``The unknown ranks: R,S`` or ``Rank R has status UNKNOWN`` in 2.24/2.25, NOCOMM from
2.26), ``Rank R -- [process information not found]``. Capture's own comment lines
(``# ...``) are skipped; anything else unexpected is a warning, never an exception.

The report may be pasted: indented as a whole (the NCCL guide's blocks by 2 spaces, a quoted
paste), fenced, or among a job's other log lines (the job's stdout before it, a watchdog
timeout after it). The indentation of its headings is removed from every line; lines before
the first heading and another log's lines (unindented, in a log's shape: ``[rank3]:``, a glog
or NCCL prefix, a timestamp, a Markdown fence) are not RAS output and are passed over
silently -- such a line ends the RAS section it interrupts. The other formats' lines are
read by their own parsers (this is a text parser that shares the file).

Tables:

``ras_comm_groups`` -- the Communicators table: line (int), group (int), comms (int: in the
    group), nodes_per_comm (int), ranks_per_node (str: ``8`` or a range ``7-8``),
    ranks_per_comm (int), ranks_in_group (int), status (INIT|RUNNING|FINALIZE|ABORT|NOCOMM),
    errors (OK, or a comma list of INCOMPLETE, ERROR, MISMATCH).
``ras_communicators`` -- one row per communicator entry of the Errors/Warnings sections:
    line, section (errors|warnings), comm_id (str ``#0-0``), group, index (int), comm_hash
    (str, hex as printed), kind (INCOMPLETE|ERROR|MISMATCH), missing_ranks (int: ``Missing
    communicator data from N ranks``), ranks_listed (int: rank lines under it), detail (str:
    its indented lines joined by `` | ``).
``ras_ranks`` -- one row per rank line: line, comm_hash, comm_id, kind, rank (int), gpu
    (str), pid (int), node (str), status (str: the rank's status group, e.g. RUNNING,
    FINALIZE, UNKNOWN/NOCOMM), op_count (int: the operation count group it is listed
    under; 0 for "not launched any"), collective (str: ``collective`` in older releases,
    else AllReduce, Broadcast, ...), error (str: for ERROR entries), missing (bool: a
    missing rank of an INCOMPLETE entry), behind (bool: the rank lags its communicator: missing,
    no communicator (UNKNOWN/NOCOMM), still in INIT, dead, or fewer operations of a collective
    than the most any rank launched), peers_op_count (int: that most, for the op-count rows),
    group_ranks (int: on a row standing for ranks RAS only counted -- ``30 ranks have launched
    up to operation 640`` with none of them listed, as it lists the smaller group, which may be
    the one ahead -- how many; rank NA).
``ras_rank_counts`` -- the group lines: line, comm_hash, comm_id, kind, what
    (op_count|status|error|init_error|async_error), collective, value (str), ranks (int).
``ras_processes`` -- job processes listed under INCOMPLETE / DEAD: line, kind, pid (int),
    node (str), gpus (str).

The JSON form (``ncclras -f json``, NCCL 2.28.9 and later) fills the same tables
(:func:`_read_json`); ``ras_ranks.comm_id`` is then ``#<index>``.

Facts: nccl_version, cuda_compiled, cuda_runtime, cuda_driver (str/int as printed), nodes,
processes, gpus, processes_per_node, gpus_per_process (int when uniform),
processes_per_node_counts, gpus_per_process_counts (lists, when not uniform), outlier_nodes
(list of {node, pids}), collection_s (float), no_communicators (bool), missing_processes,
dead_processes, timeouts (int), sections (list of the sections seen).
"""
from __future__ import annotations

import json
import re

from .registry import WarningLog, decode_text, looks_binary, register, split_lines
from .text import LogText, TextParser

VERSION_RE = re.compile(r"^NCCL version (?P<v>\S+)(?: compiled with CUDA (?P<cuda>\S+))?\s*$")
CUDA_RE = re.compile(r"^CUDA runtime version (?P<rt>-?\d+), driver version (?P<drv>-?\d+)\s*$")
COMMS_RE = re.compile(r"^Communicators\.\.\.(?: \((?P<s>[\d.]+)s\))?\s*$")
GROUP_ROW_RE = re.compile(r"^\s*(?P<group>\d+)\s+(?P<comms>\d+)\s+(?P<nodes>\d+)\s+(?P<rpn>\d+(?:-\d+)?)\s+"
                          r"(?P<rpc>\d+)\s+(?P<rig>\d+)\s+(?P<status>[A-Z]+)\s+(?P<errors>[A-Z,]+)\s*$")
COMM_RE = re.compile(r"^#(?P<group>\d+)-(?P<index>\d+) \((?P<hash>[0-9a-fA-Fx]+)\) (?P<kind>INCOMPLETE|ERROR|MISMATCH)\s*$")
PROCESS_RE = re.compile(r"^\s+Process (?P<pid>\d+) on node (?P<node>\S+) managing GPUs? (?P<gpus>.+?)\s*$")
OUTLIER_NODE_RE = re.compile(r"^\s+Node (?P<node>\S+) running process(?:es)? (?P<pids>[\d,]+)\s*$")
RANK_TAIL = r"(?: -- (?:GPU (?P<gpu>.+?) managed by process (?P<pid>\d+) on node (?P<node>\S+)|\[process information not found\]))"
RANK_RE = re.compile(r"^\s+Rank (?P<rank>\d+)(?: has status (?P<status>[A-Z]+)| has launched up to operation "
                     r"(?P<op>\d+)| has not launched any operations(?P<none>)| reported (?P<err>.+?))?" + RANK_TAIL + r"\s*$")
MISSING_RANK_RE = re.compile(r"^\s+The (?:missing|unknown) ranks?: (?P<ranks>[\d, ]+)\s*$")
# 2.24/2.25: one rank without a communicator, no process information: "Rank 5 has status UNKNOWN"
BARE_STATUS_RE = re.compile(r"^\s+Rank (?P<rank>\d+) has status (?P<status>[A-Z]+)\s*$")
MISSING_RE = re.compile(r"^\s+Missing communicator data from (?P<n>\d+) (?P<what>job process(?:es)?|ranks?)\s*$")
DEAD_RE = re.compile(r"^\s+(?P<n>\d+) job process(?:es are| is) considered dead")
TIMEOUT_RE = re.compile(r"^\s+Encountered (?P<n>\d+) communication timeouts? while gathering")
DIFF_COUNTS_RE = re.compile(r"^\s+Communicator ranks have different (?P<coll>\S+) operation counts\s*$")
DIFF_STATUS_RE = re.compile(r"^\s+Communicator ranks have different status\s*$")
LAUNCHED_RE = re.compile(r"^\s+(?P<n>\d+) ranks have (?:launched up to operation (?P<op>\d+)|not launched any "
                         r"operations(?P<none>))\s*$")
STATUS_COUNT_RE = re.compile(r"^\s+(?P<n>\d+) ranks have status (?P<status>[A-Z]+)\s*$")
ERR_COUNT_RE = re.compile(r"^\s+(?P<n>\d+) ranks reported (?P<err>.+?)\s*$")
ERR_HEAD_RE = re.compile(r"^\s+(?P<what>Initialization|Asynchronous) errors? on (?P<n>\d+) ranks?\s*$")
TABLE_HEAD = ("Group     Comms", "    #  in group")
INT_ROW_RE = re.compile(r"^\s*\d+(?:\s+\d+)*\s*$")
NO_COMMS = "No communicator data collected!"
# the headings whose indentation is the whole report's (a pasted or quoted copy)
ANCHOR_RE = re.compile(r"^(?P<indent>[ \t]*)(?:Job summary|Communicators\.\.\.|Errors|Warnings|Group     Comms|"
                       r"NCCL version \S+ compiled|#\d+-\d+ \([0-9a-fA-Fx]+\) (?:INCOMPLETE|ERROR|MISMATCH))\s*$|"
                       r"^(?P<indent2>[ \t]*)(?:Group     Comms|NCCL version \S+ compiled)")
# an unindented line of another log among the report's (PyTorch, glog, NCCL_DEBUG, a launcher,
# a timestamped shipper line, a Markdown fence, a shell prompt)
FOREIGN_RE = re.compile(r"^(?:\[(?:rank|default|E|W|I)|[IWEF]\d{4} |\[?\d{4}-\d\d-\d\d|\S+:\d+:\d+ \[\d+\] NCCL |"
                        r"```|~~~|\$ |Traceback |\S+\.(?:py|cpp|cc):\d+|torch\.|RuntimeError|\w+Error:)")
MARKERS = (b"Communicators... (", b"Group     Comms     Nodes", b"Missing communicator data from",
           b"considered dead (unreachable via the RAS network)", b"Communicator ranks have different",
           b"communication timeouts while gathering communicator data", NO_COMMS.encode(),
           b"Job summary\n=====", b"Job summary\r\n=====")
REGION_MIN_BYTES = 4 << 20    # a larger log is read around its RAS lines only


class NcclRasParser(TextParser):
    # a text format: a report may stand among a job's other log lines (its JSON form is a whole
    # file, told by its first bytes)
    MARKERS = MARKERS
    NAME = "ncclras"
    DESCRIPTION = "NCCL RAS status (ncclras -v): job summary, communicators, missing/dead ranks, mismatches"
    GLOBS = ("sys/**/ncclras*", "*ncclras*")
    SCHEMAS = {
        "ras_comm_groups": {"line": "int", "group": "int", "comms": "int", "nodes_per_comm": "int",
                            "ranks_per_node": "str", "ranks_per_comm": "int", "ranks_in_group": "int",
                            "status": "str", "errors": "str"},
        "ras_communicators": {"line": "int", "section": "str", "comm_id": "str", "group": "int", "index": "int",
                              "comm_hash": "str", "kind": "str", "missing_ranks": "int", "ranks_listed": "int",
                              "detail": "str"},
        "ras_ranks": {"line": "int", "comm_hash": "str", "comm_id": "str", "kind": "str", "rank": "int",
                      "gpu": "str", "pid": "int", "node": "str", "status": "str", "op_count": "int",
                      "collective": "str", "error": "str", "missing": "bool", "behind": "bool",
                      "peers_op_count": "int", "group_ranks": "int"},
        "ras_rank_counts": {"line": "int", "comm_hash": "str", "comm_id": "str", "kind": "str", "what": "str",
                            "collective": "str", "value": "str", "ranks": "int"},
        "ras_processes": {"line": "int", "kind": "str", "pid": "int", "node": "str", "gpus": "str"},
    }

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        if t.lstrip().startswith("{") and '"communicators' in t and '"nccl_version"' in t:
            return True                 # ncclras -f json (2.28.9 and later)
        return re.search(r"(?m)^[ \t]*(?:Job summary\n[ \t]*=+$|Communicators\.\.\.|Group     Comms     Nodes|"
                         r"#\d+-\d+ \([0-9a-fA-Fx]+\) (?:INCOMPLETE|ERROR|MISMATCH)\s*$)", t) is not None

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        """A large log is read around its RAS lines only (a report is a few hundred lines)."""
        return cls.parse_region(text, label, REGION_MIN_BYTES, cls.MARKERS + (b"Job summary", b"NCCL version"))

    @classmethod
    def parse_bytes(cls, data: bytes, label: str, first_line: int = 1):
        log = WarningLog(label)
        facts = {"sections": [], "missing_processes": 0, "dead_processes": 0, "timeouts": 0, "outlier_nodes": [],
                 "no_communicators": False}
        tables = {k: [] for k in cls.SCHEMAS}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, tables, facts, log)
        if looks_binary(data):
            log.add(None, "binary data, not ncclras output")
            return cls.result(label, tables, facts, log)
        text = decode_text(data)
        if text.lstrip().startswith("{"):
            _read_json(text, facts, tables, log)
            mark_behind(tables["ras_ranks"], tables["ras_rank_counts"])
            return cls.result(label, tables, facts, log)
        _Reader(facts, tables, log).run(split_lines(text), first_line)
        _finalize_detail(tables["ras_communicators"])
        mark_behind(tables["ras_ranks"], tables["ras_rank_counts"])
        if not facts["sections"]:
            log.add(None, "no RAS section found (Job summary, Communicators, Errors, Warnings)")
        return cls.result(label, tables, facts, log)


class _Reader:
    def __init__(self, facts, tables, log):
        self.facts, self.t, self.log = facts, tables, log
        self.section = None          # summary | communicators | errors | warnings
        self.block = None            # INCOMPLETE | DEAD | TIMEOUT (job-level) or a communicator row
        self.summary_rows: list[tuple[str, list[int]]] = []
        self.head_kind = None        # the last summary header: ("total", "distribution", "gpus")
        self.collective = None       # MISMATCH: the op-count group's collective
        self.group = {}              # the current rank group: status/op_count/error

    def warn(self, ln, line):
        self.log.add(ln, f"unexpected line in {self.section or 'preamble'}: {line.strip()[:120]!r}")

    def run(self, lines, first_line: int = 1):
        indent = _indent(lines)
        for ln, raw in enumerate(lines, first_line):
            line = raw.rstrip()
            if indent and line.startswith(indent):
                line = line[len(indent):]
            if not line.strip():
                if self.section in ("errors", "warnings"):
                    self.block = None        # a blank line ends an entry
                continue
            if line.startswith("# ") or set(line.strip()) == {"="}:
                continue
            if FOREIGN_RE.match(line):       # another log's line, or a fence: the RAS section ends
                self.finish_summary()
                self.section, self.block = None, None
                continue
            self.line(ln, line)
        self.finish_summary()

    def enter(self, name):
        self.section = name
        self.block = None
        if name not in self.facts["sections"]:
            self.facts["sections"].append(name)

    def line(self, ln, line):
        f = self.facts
        if (m := VERSION_RE.match(line)):
            f["nccl_version"], f["cuda_compiled"] = m["v"], m["cuda"]
            return
        if (m := CUDA_RE.match(line)):
            f["cuda_runtime"], f["cuda_driver"] = int(m["rt"]), int(m["drv"])
            return
        if line.strip() == "Job summary":
            self.enter("summary")
            return
        if (m := COMMS_RE.match(line)):
            self.finish_summary()
            self.enter("communicators")
            if m["s"]:
                f["collection_s"] = float(m["s"])
            return
        if line.strip() in ("Errors", "Warnings"):
            self.finish_summary()
            self.enter(line.strip().lower())
            return
        if COMM_RE.match(line) and self.section not in ("errors", "warnings"):
            # an entry without its section heading (an excerpt): NCCL prints MISMATCH under
            # Warnings, INCOMPLETE and ERROR under Errors
            self.finish_summary()
            self.enter("warnings" if line.rstrip().endswith("MISMATCH") else "errors")
        if line.strip() == NO_COMMS:
            f["no_communicators"] = True
            return
        if line.startswith(TABLE_HEAD):
            if self.section is None:
                self.enter("communicators")
            return
        if (m := GROUP_ROW_RE.match(line)) and self.section in ("communicators", None):
            if self.section is None:
                self.enter("communicators")
            self.t["ras_comm_groups"].append(
                {"line": ln, "group": int(m["group"]), "comms": int(m["comms"]), "nodes_per_comm": int(m["nodes"]),
                 "ranks_per_node": m["rpn"], "ranks_per_comm": int(m["rpc"]), "ranks_in_group": int(m["rig"]),
                 "status": m["status"], "errors": m["errors"]})
            return
        if self.section == "summary":
            return self.summary_line(ln, line)
        if self.section in ("errors", "warnings"):
            return self.issue_line(ln, line)
        if self.section is not None:
            self.warn(ln, line)
        # before the report's first heading (or after another log's line): not RAS output

    # ---- job summary
    def summary_line(self, ln, line):
        s = " ".join(line.split())
        if s.startswith(("Nodes", "Processes")):          # first header line
            return
        if "(total)" in s or "per node" in s or "per process" in s:    # second header line: what the rows are
            if "(total)" in s:
                self.head_kind = "uniform" if "per node" in s else "totals"
            else:
                self.head_kind = "per_node" if "per node" in s else "per_process"
            return
        if s.startswith("The outlier node"):
            return
        if (m := OUTLIER_NODE_RE.match(line)):
            self.facts["outlier_nodes"].append({"node": m["node"], "pids": [int(p) for p in m["pids"].split(",")]})
            return
        if INT_ROW_RE.match(line):
            nums = [int(x) for x in s.split()]
            want = {"uniform": 5, "totals": 3, "per_node": (2, 3), "per_process": 2}.get(self.head_kind)
            if want is None or len(nums) not in (want if isinstance(want, tuple) else (want,)):
                return self.warn(ln, line)
            self.summary_rows.append((self.head_kind, nums))
            return
        self.warn(ln, line)

    def finish_summary(self):
        f = self.facts
        for kind, nums in self.summary_rows:
            if kind == "uniform":
                f["nodes"], f["processes_per_node"], f["gpus_per_process"], f["processes"], f["gpus"] = nums
            elif kind == "totals":
                f["nodes"], f["processes"], f["gpus"] = nums
            elif kind == "per_node":
                f.setdefault("processes_per_node_counts", []).append({"nodes": nums[0], "processes_per_node": nums[1]})
            elif kind == "per_process":
                f.setdefault("gpus_per_process_counts", []).append({"processes": nums[0], "gpus_per_process": nums[1]})
        self.summary_rows = []

    # ---- errors and warnings
    def issue_line(self, ln, line):
        f, t = self.facts, self.t
        s = line.strip()
        if s in ("INCOMPLETE", "DEAD", "TIMEOUT"):
            self.block = s
            return
        if (m := COMM_RE.match(line)):
            self.block = {"line": ln, "section": self.section, "comm_id": f"#{m['group']}-{m['index']}",
                          "group": int(m["group"]), "index": int(m["index"]), "comm_hash": m["hash"],
                          "kind": m["kind"], "missing_ranks": None, "ranks_listed": 0, "detail": []}
            t["ras_communicators"].append(self.block)
            self.collective, self.group = None, {}
            return
        if not line[:1].isspace():
            return self.warn(ln, line)
        if isinstance(self.block, dict):
            return self.comm_line(ln, line)
        if self.block in ("INCOMPLETE", "DEAD"):
            if (m := MISSING_RE.match(line)) and "process" in m["what"]:
                f["missing_processes"] = int(m["n"])
                return
            if (m := DEAD_RE.match(line)):
                f["dead_processes"] = int(m["n"])
                return
            if (m := PROCESS_RE.match(line)):
                t["ras_processes"].append({"line": ln, "kind": self.block, "pid": int(m["pid"]), "node": m["node"],
                                           "gpus": m["gpus"]})
                return
            if s.startswith("[could not find information"):
                return
        if self.block == "TIMEOUT" and (m := TIMEOUT_RE.match(line)):
            f["timeouts"] = int(m["n"])
            return
        self.warn(ln, line)

    def comm_line(self, ln, line):
        c, t = self.block, self.t
        c["detail"].append(line.strip())
        base = {"comm_hash": c["comm_hash"], "comm_id": c["comm_id"], "kind": c["kind"]}
        if (m := MISSING_RE.match(line)):
            c["missing_ranks"] = int(m["n"])
            return
        if (m := MISSING_RANK_RE.match(line)):
            unknown = "unknown" in line
            for r in re.findall(r"\d+", m["ranks"]):
                t["ras_ranks"].append(dict(base, line=ln, rank=int(r), missing=True,
                                           status="UNKNOWN" if unknown else None))
                c["ranks_listed"] += 1
            return
        if (m := BARE_STATUS_RE.match(line)):
            t["ras_ranks"].append(dict(base, line=ln, rank=int(m["rank"]), status=m["status"],
                                       missing=m["status"] in ("UNKNOWN", "NOCOMM") or None))
            c["ranks_listed"] += 1
            return
        if (m := DIFF_COUNTS_RE.match(line)):
            self.collective, self.group = m["coll"], {}
            return
        if DIFF_STATUS_RE.match(line):
            self.collective, self.group = None, {"what": "status"}
            return
        if (m := ERR_HEAD_RE.match(line)):
            self.group = {"what": "init_error" if m["what"] == "Initialization" else "async_error"}
            return
        if (m := LAUNCHED_RE.match(line)):
            op = 0 if m["none"] is not None else int(m["op"])
            self.group = {"what": "op_count", "op_count": op}
            t["ras_rank_counts"].append(dict(base, line=ln, what="op_count", collective=self.collective,
                                             value=str(op), ranks=int(m["n"])))
            return
        if (m := STATUS_COUNT_RE.match(line)):
            self.group = {"what": "status", "status": m["status"]}
            t["ras_rank_counts"].append(dict(base, line=ln, what="status", collective=None, value=m["status"],
                                             ranks=int(m["n"])))
            return
        if (m := ERR_COUNT_RE.match(line)):
            what = self.group.get("what") if self.group.get("what") in ("init_error", "async_error") else "error"
            self.group = {"what": what, "error": m["err"]}
            t["ras_rank_counts"].append(dict(base, line=ln, what=what, collective=None, value=m["err"],
                                             ranks=int(m["n"])))
            return
        if (m := RANK_RE.match(line)):
            row = dict(base, line=ln, rank=int(m["rank"]), gpu=m["gpu"], pid=int(m["pid"]) if m["pid"] else None,
                       node=m["node"], missing=c["kind"] == "INCOMPLETE" or None)
            if m["status"]:
                row["status"] = m["status"]
            elif m["op"] or m["none"] is not None:
                row["op_count"] = int(m["op"]) if m["op"] else 0
                row["collective"] = self.collective
            elif m["err"]:
                row["error"] = m["err"]
            else:     # a member of the current group
                if "status" in self.group:
                    row["status"] = self.group["status"]
                if "op_count" in self.group:
                    row["op_count"], row["collective"] = self.group["op_count"], self.collective
                if "error" in self.group:
                    row["error"] = self.group["error"]
            t["ras_ranks"].append(row)
            c["ranks_listed"] += 1
            return
        if line.strip().startswith("[could not find information"):
            return
        c["detail"].pop()
        self.warn(ln, line)


def _indent(lines: list[str]) -> str:
    """The indentation of the report's headings (``""`` when they are not all indented alike
    with spaces, or there are none)."""
    seen = set()
    for line in lines:
        if line[:1] in (" ", "\t") or line.startswith(("J", "C", "E", "W", "G", "N", "#")):
            m = ANCHOR_RE.match(line)
            if m:
                seen.add(m["indent"] if m["indent"] is not None else m["indent2"])
    return min(seen, key=len) if seen and all(i.startswith(min(seen, key=len)) for i in seen) else ""


LAGGING_STATUS = frozenset({"UNKNOWN", "NOCOMM", "INIT", "DEAD", "UNRESPONSIVE"})


def mark_behind(ranks: list[dict], counts: list[dict]) -> None:
    """Set ``behind`` and ``peers_op_count`` on the ``ras_ranks`` rows: RAS lists the outliers,
    which may be the ranks ahead as well as the ones behind; the culprit of a hang is the rank
    that has not launched what its peers did (or has no communicator, or is missing)."""
    most: dict[tuple, int] = {}
    for c in counts:
        if c.get("what") == "op_count":
            key = (c.get("comm_hash"), c.get("collective"))
            most[key] = max(most.get(key, 0), int(c["value"]))
    for r in ranks:
        if r.get("op_count") is not None:
            key = (r.get("comm_hash"), r.get("collective"))
            most[key] = max(most.get(key, 0), int(r["op_count"]))
    for r in ranks:
        top = most.get((r.get("comm_hash"), r.get("collective"))) if r.get("op_count") is not None else None
        r["peers_op_count"] = top
        r["behind"] = bool(r.get("missing") or r.get("status") in LAGGING_STATUS
                           or (top is not None and r["op_count"] < top))
    listed = {(r.get("comm_hash"), r.get("collective"), int(r["op_count"])) for r in ranks
              if r.get("op_count") is not None}
    for c in counts:
        if c.get("what") != "op_count":
            continue
        key = (c.get("comm_hash"), c.get("collective"))
        op = int(c["value"])
        if op < most.get(key, op) and (key[0], key[1], op) not in listed:
            # the ranks behind, counted but not listed (RAS listed the smaller group, ahead)
            ranks.append({"line": c["line"], "comm_hash": c.get("comm_hash"), "comm_id": c.get("comm_id"),
                          "kind": c.get("kind"), "rank": None, "op_count": op, "collective": c.get("collective"),
                          "behind": True, "peers_op_count": most[key], "group_ranks": int(c["ranks"])})


def _read_json(text: str, facts: dict, t: dict, log: WarningLog) -> None:
    """``ncclras -f json`` (2.28.9+): one document of communicators, each with its ranks (status,
    per-collective operation counts) and missing ranks. 2.28.9 printed no comma after a missing
    rank's ``nvml_dev`` (fixed in 2.29); that is mended before decoding. Rows as the text's:
    a rank whose count of some collective differs from its peers' (MISMATCH, one row per such
    collective), a rank with an asynchronous error (ERROR), a missing rank (INCOMPLETE; status
    DEAD when RAS considers its process dead, UNRESPONSIVE when it did not answer)."""
    fixed = re.sub(r'("nvml_dev": -?\d+)(\s*\n\s*"status")', r"\1,\2", text)
    try:
        doc = json.loads(fixed)
    except json.JSONDecodeError as e:
        log.add(e.lineno, f"not valid JSON: {e.msg}")
        return
    if not isinstance(doc, dict):
        log.add(None, "JSON document is not an object")
        return
    facts["sections"].append("json")
    facts["nccl_version"] = doc.get("nccl_version")
    facts["cuda_runtime"], facts["cuda_driver"] = doc.get("cuda_runtime_version"), doc.get("cuda_driver_version")
    ras = doc.get("ras") if isinstance(doc.get("ras"), dict) else {}
    facts["timeouts"] = ras.get("timeouts_count") or 0
    facts["collection_s"] = ras.get("collection_time_sec")
    comms = doc.get("communicators") if isinstance(doc.get("communicators"), list) else []
    for i, c in enumerate(comms):
        if isinstance(c, dict):
            _json_comm(i, c, t)
    if not comms:
        facts["no_communicators"] = True


def _json_comm(i: int, c: dict, t: dict) -> None:
    h = str(c.get("hash") or "")
    base = {"comm_hash": h[2:] if h.startswith("0x") else h, "comm_id": f"#{i}", "line": None}
    ranks = [r for r in c.get("ranks") or [] if isinstance(r, dict)]
    missing = [r for r in c.get("missing_ranks") or [] if isinstance(r, dict)]
    kinds = []

    def who(r):
        return {"rank": r.get("rank"), "node": r.get("host"), "pid": r.get("pid"),
                "gpu": None if r.get("cuda_dev") is None else str(r.get("cuda_dev"))}
    counts: dict[str, dict] = {}
    for r in ranks:
        for coll, n in (r.get("collective_counts") or {}).items():
            counts.setdefault(coll, {})[r.get("rank")] = n
    for coll, by_rank in counts.items():
        values = set(by_rank.values())
        if len(values) < 2:
            continue
        kinds.append("MISMATCH")
        for n, k in sorted({(v, sum(1 for x in by_rank.values() if x == v)) for v in values}):
            t["ras_rank_counts"].append(dict(base, kind="MISMATCH", what="op_count", collective=coll, value=str(n),
                                             ranks=k))
        for r in ranks:
            t["ras_ranks"].append(dict(base, **who(r), kind="MISMATCH", op_count=by_rank.get(r.get("rank")),
                                       collective=coll))
    for r in ranks:
        st = r.get("status") if isinstance(r.get("status"), dict) else {}
        if st.get("async_error"):
            kinds.append("ERROR")
            t["ras_ranks"].append(dict(base, **who(r), kind="ERROR", error=f"error {st['async_error']}",
                                       status="ABORT" if st.get("abort_flag") else None))
    for r in missing:
        st = r.get("status") if isinstance(r.get("status"), dict) else {}
        kinds.append("INCOMPLETE")
        status = "DEAD" if st.get("considered_dead") else "UNRESPONSIVE" if st.get("unresponsive") else None
        t["ras_ranks"].append(dict(base, **who(r), kind="INCOMPLETE", missing=True, status=status))
    for kind in dict.fromkeys(kinds):
        t["ras_communicators"].append(dict(base, section="json", group=None, index=i, kind=kind,
                                           missing_ranks=len(missing) if kind == "INCOMPLETE" else None,
                                           ranks_listed=len(ranks) + len(missing), detail=None))


def _finalize_detail(rows):
    for r in rows:
        if isinstance(r.get("detail"), list):
            r["detail"] = " | ".join(r["detail"]) or None
    return rows


register(NcclRasParser)
