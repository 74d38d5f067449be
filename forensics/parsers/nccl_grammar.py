"""The NCCL_DEBUG line grammar: the regular expressions that recognise NCCL's log lines and
read their fields, for every NCCL version the parser knows (1.x to 2.30), the prefixes that
launchers, log shippers and reporters leave on them, and the few tables that name what a line
says (``NCCL_RESULTS``).

:mod:`.nccl_debug` reads a log with them (where ``logscan.c`` has not read the line already:
:mod:`.nccl_coll`, :mod:`.nccl_topo`); they are kept apart so the grammar can be read, and
grown, on its own. Inputs: one line's text (a message: the text after ``NCCL INFO``); outputs:
``re.Match`` objects whose named groups are the fields (see each table in :mod:`.nccl_debug`).
"""
from __future__ import annotations

import re

# The NCCL prefix, found anywhere in the line (launchers prepend their own tags).
LINE_RE = re.compile(
    r"(?:\[(?P<ts>\d{4}-\d\d-\d\d[ T_][^\]]*|[A-Z][a-z]{2} [^\]]*\d)\] ?)?"
    r"(?P<host><[\w.-]+>|[A-Za-z0-9._-]*):(?P<pid>\d+):(?P<tid>\d+) "   # <name>: a reporter's redaction
    r"(?:\[(?P<dev>-?\d+)\] )?"
    r"(?:(?P<tms>\d+\.\d+) (?P<tfunc>[^\s:]+):(?P<tline>\d+) "
    r"|(?P<src>[^\s:()]+):(?P<srcline>\d+) (?:\((?P<func>[^)\s]*)\) )?)?"
    r"NCCL (?P<level>INFO|WARN|TRACE|CALL|ABORT)\b ?(?P<msg>.*)$"
)
VERSION_RE = re.compile(r"(?:^|[\s\]>:])NCCL version (?P<version>\d+\.\d+\.\d+\S*)")
# a WARN line pasted without its host:pid:tid (users strip hosts from the logs they post)
HOSTLESS_WARN_RE = re.compile(r"(?:\[(?P<dev>-?\d+)\] )?(?P<src>[^\s:()]+):(?P<srcline>\d+) (?:\((?P<func>[^)\s]*)\) )?"
                              r"NCCL (?P<level>WARN) ?(?P<msg>.*)$")
# the prefix with a host but no pid:tid (``gpu-server320 [5] NCCL INFO …``, as some log
# collectors print it): the host is a word before the device. A timestamp before it is left to
# the launcher context (:mod:`.lines`), which also reads a shipper's zoned clock there
PIDLESS_RE = re.compile(r"(?<!\S)(?P<host>[A-Za-z][\w.-]*\w) "
                        r"\[(?P<dev>\d+)\] (?:(?P<src>[^\s:()]+):(?P<srcline>\d+) (?:\((?P<func>[^)\s]*)\) )?)?"
                        r"NCCL (?P<level>INFO|WARN|TRACE|CALL|ABORT)\b ?(?P<msg>.*)$")
MENTION_RE = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|CALL|ABORT)\b")
# a WARN line pasted with no prefix at all (``NCCL WARN Connect to 10.0.0.2<2172> failed``): only
# launcher tags before it, never a mention inside prose
BARE_WARN_RE = re.compile(r"NCCL (?P<level>WARN) (?P<msg>\S.*)$")
# WARN lines before NCCL 2.3 printed "NCCL " before the level (NVIDIA/nccl's history: 1.x's
# core.h, 2.3's debug.h): 2.0-2.2 "host:pid:tid [dev] file:line WARN msg" (2.0: "host [dev] ...",
# the host often stripped or redacted by the reporter), 1.x "WARN file:line msg". The source
# file names the line as NCCL's; a host is [A-Za-z0-9._-] (punctuation glued before it is not).
OLD_SRC = r"(?P<src>[\w./-]+\.(?:h|hpp|hh|c|cc|cu|cpp|cxx)):(?P<srcline>\d+)"
OLD_WARN_RE = re.compile(r"(?:(?:(?P<host>[A-Za-z0-9._-]+)(?::(?P<pid>\d+):(?P<tid>\d+))? )?\[(?P<dev>\d+)\] )?"
                         + OLD_SRC + r" (?P<level>WARN) ?(?P<msg>.*)$")
V1_WARN_RE = re.compile(r"(?<![\w.])(?P<level>WARN) " + OLD_SRC + r" ?(?P<msg>.*)$")
OLD_NEEDLES = (b"WARN ",)

INIT_RE = re.compile(
    r"^(?:\[Rank \d+\] )?(?:(?P<func>nccl\w+) )?comm (?P<comm>\S+) rank (?P<rank>\d+) "
    r"nranks (?P<nranks>\d+) cudaDev (?P<cuda_dev>-?\d+)(?: nvmlDev (?P<nvml_dev>-?\d+))?"
    r"(?: busId (?P<bus_id>[0-9a-fA-F]+))?(?: commId (?P<comm_id>0x[0-9a-fA-F]+))?"
    r"(?: parent (?P<parent>\S+))?.*? - Init (?P<status>START|COMPLETE)\s*$"
)
INIT_HINT_RE = re.compile(r" - Init (?:START|COMPLETE)")
TOPO_RE = re.compile(
    r"^comm (?P<comm>\S+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
    r"localRanks (?P<local_ranks>\d+) localRank (?P<local_rank>\d+)"
)
CHANNEL_RE = re.compile(
    r"^Channel (?P<channel>\d+)(?:/(?P<conn_index>\d+))? : (?P<src_rank>\d+)\[(?P<src_dev>[0-9a-fA-F]+)\] "
    r"-> (?P<dst_rank>\d+)\[(?P<dst_dev>[0-9a-fA-F]+)\](?: \[(?P<direction>send|receive)\])? "
    r"via (?P<via>\S.*?)\s*$"
)
RING_ORDER_RE = re.compile(r"^Channel (?P<channel>\d+)(?:/(?P<nchannels>\d+))? :(?P<order>(?:\s+\d+)+)\s*$")
RING_RE = re.compile(r"^Ring (?P<channel>\d+) : (?P<prev>-?\d+) -> (?P<rank>-?\d+) -> (?P<next>-?\d+)")
TREE_RE = re.compile(r"^Tree (?P<channel>\d+) : (?P<up>-?\d+) -> (?P<rank>-?\d+) -> (?P<down>[-\d/]+)")
TREES_ITEM_RE = re.compile(r"\[(?P<channel>\d+)\] (?P<down>[-\d/]+)->(?P<rank>-?\d+)->(?P<up>-?\d+)")
NET_IB_RE = re.compile(r"^NET/IB ?: Using (?P<devs>.*?)\s*;\s*OOB (?P<oob>\S+)")
IB_DEV_RE = re.compile(r"\[(?P<index>\d+)\](?P<name>[^\s:\[\]]+):(?P<port>\d+)(?::\d+)*/(?P<ll>\w+)")
# "NET/IB : Using [RO]; OOB eth0:…" (2.2x): relaxed ordering on, and no IB device found: nothing wrong
NO_IB_DEVICE_RE = re.compile(r"^(?:\[RO\])?\s*$")
NET_SOCKET_RE = re.compile(r"^NET/Socket ?: Using (?P<devs>.+)$")
SOCK_DEV_RE = re.compile(r"\[(?P<index>\d+)\](?P<name>[^\s:\[\]]+):(?P<addr>\S+?)<\d+>")
USING_NET_RE = re.compile(r"^Using network (?P<net>\S+)")
BOOTSTRAP_RE = re.compile(r"^Bootstrap ?: Using (?P<iface>[^\s:]+):(?P<addr>\S+?)<\d+>")
GDR_RE = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled)\b")
ENV_RE = re.compile(r"^(?P<var>NCCL_\w+) set (?:by environment )?to (?P<val>.*?)\s*$")
NCHANNELS_RE = re.compile(r"^(?P<n>\d+) coll channels\b")
ERROR_RETURN_RE = re.compile(r"^\S+:\d+ (?:\(\w+\) )?-> \d+")
ERROR_RETURN_FIELDS_RE = re.compile(r"^(?P<src>[^\s:]+):(?P<srcline>\d+) (?:\((?P<func>\w+)\) )?-> (?P<code>\d+)")
# ncclResult_t (nccl.h): what an error return's code says
NCCL_RESULTS = {1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError", 4: "ncclInvalidArgument",
                5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"}
# libfabric's own log line (FI_LOG_LEVEL, aws-ofi-nccl's provider): "libfabric:<pid>:<epoch s>:[<domain>:]<prov>:
# <subsys>:<func>():<line><level> <message>"; the ones that say something failed are kept as WARN rows
LIBFABRIC_RE = re.compile(r"libfabric:(?P<pid>\d+):(?P<epoch>\d+):(?P<path>(?:[^:<\s]*:)*?)(?P<func>[\w.]+)\(\):"
                          r"(?P<srcline>\d+)<(?P<lvl>warn|error)>\s*(?P<msg>.*?)\s*$")
LIBFABRIC_ERROR_RE = re.compile(r"error|fail|unable|cannot|can't|couldn't|unreachable|timed? ?out|refused|empty list"
                                r"|not (?:supported|available)|denied|invalid|no route", re.I)
WRAP_WIDTHS = frozenset({80, 100, 120, 128, 132, 140, 150, 160, 180, 200, 220, 240, 250, 256})
# needles of the NCCL lines other than INFO (INFO lines come from the COLL scanner's "other")
NEEDLES = (b"NCCL WARN", b"NCCL TRACE", b"NCCL CALL", b"NCCL ABORT", b"NCCL version", b"libfabric:", *OLD_NEEDLES)
INFO_VERSION_RE = re.compile(r"^NCCL version (?P<version>\S+)")
