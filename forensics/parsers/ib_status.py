"""InfiniBand/RoCE port state: ``ibstat``, ``ibstatus``, ``ibv_devinfo [-v]`` output, sysfs files.

The port counters (:mod:`.ib_counters`) say what went wrong on a link; these say whether the
link is up at all, and at what rate. Formats (infiniband-diags, rdma-core):

- ``ibstat``: ``CA 'mlx5_0'`` then, per port, ``Port 1:`` with ``State: Active``, ``Physical
  state: LinkUp``, ``Rate: 200``, ``Base lid``, ``SM lid``, ``Port GUID``, ``Link layer:
  InfiniBand`` (tab-indented); ``ibstat mlx5_0 1`` prints the port block alone after ``CA:``;
- ``ibstatus``: ``Infiniband device 'mlx5_0' port 1 status:`` then ``state: 4: ACTIVE``,
  ``phys state: 5: LinkUp``, ``rate: 200 Gb/sec (4X HDR)``, ``link_layer: InfiniBand``;
- ``ibv_devinfo``: ``hca_id: mlx5_0``, ``port: 1``, ``state: PORT_ACTIVE (4)``,
  ``link_layer: Ethernet``; with ``-v`` also ``active_width: 4X (2)``, ``active_speed: 25.0
  Gbps (32)``, ``phys_state: LINK_UP (5)``;
- sysfs (``/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}`` as ``grep
  . …`` prints them): ``…/mlx5_0/ports/1/state:4: ACTIVE``;
- ``ibdev2netdev`` (MLNX_OFED): ``mlx5_0 port 1 ==> ib0 (Up)`` (``| column -t`` widens the
  spaces); with ``-v`` the IB port state before the arrow (``… fw 20.31.1014 port 1 (ACTIVE) ==>
  ib0 (Up)``), which decides; else the netdev's state: Up is ACTIVE (a netdev is up only over
  an active port); Down is DOWN for a RoCE netdev (its carrier is the port's link), and says
  nothing of the port for an IPoIB one (``ib*``: a fabric without IPoIB leaves it down over
  an active port), whose state is then NA and link_layer InfiniBand;
- ``iblinkinfo`` (infiniband-diags): a ``Switch: 0x<guid> <desc>:`` or ``CA: <desc>:`` header,
  then per port ``<lid> <port>[<ext>] ==( 4X 25.78125 Gbps Active/  LinkUp)==> <remote>`` (a
  down port: ``==(                Down/ Polling)==>``); ``-l`` puts ``0x<guid> "<desc>"`` on
  every line instead. The device is the node's description; a CA's host is the first word of
  its description (``node01 mlx5_0``: node01, device mlx5_0). node_type is the header's
  (Switch|CA|Router), peer the description of the node at the link's other end (NA where none
  is listed: an unused port).

Lines may carry a launcher's or pdsh's tag (``node7: CA 'mlx5_0'``): the host it names is the
port's host (:mod:`.lines`); else a pasted shell prompt above (``[root@gpu-e03 ~]# ibstat``,
``user@gpu-e03:~$ ibdev2netdev``) names it; otherwise the model gives the file's host.

Table ``ib_ports`` (one row per device and port): line (int, of its first line), tool (ibstat|
ibstatus|ibv_devinfo|sysfs|ibdev2netdev|iblinkinfo), host (str: the tag's, NA without one), device (str), port (int),
state (ACTIVE|DOWN|INIT|ARMED|ACTIVE_DEFER|NOP|…; MISSING: a device ``ibpanic`` could not
open, its port NA), phys_state (LinkUp|Polling|Disabled|Sleep|
PortConfigurationTraining|LinkErrorRecovery|PhyTest|…), rate_gbps (float), width (str, e.g.
4X), speed (str, e.g. HDR or "25.0 Gbps"), link_layer (InfiniBand|Ethernet), lid, sm_lid (str),
guid (str), firmware (str), ca_type (str), node_type (str: iblinkinfo's Switch|CA|Router), peer
(str: iblinkinfo's remote node description).
"""
from __future__ import annotations

import re

import numpy as np

from . import lines as lines_mod
from .heads import IBSTAT_KEYS
from .registry import WarningLog, register
from .text import LogText, TextParser

STATES = {"0": "NOP", "1": "DOWN", "2": "INIT", "3": "ARMED", "4": "ACTIVE", "5": "ACTIVE_DEFER"}
PHYS = {"0": "NoChange", "1": "Sleep", "2": "Polling", "3": "Disabled", "4": "PortConfigurationTraining",
        "5": "LinkUp", "6": "LinkErrorRecovery", "7": "PhyTest"}
PHYS_NAMES = {v.lower(): v for v in PHYS.values()} | {"link_up": "LinkUp", "linkup": "LinkUp",
                                                      "port_configuration_training": "PortConfigurationTraining",
                                                      "link_error_recovery": "LinkErrorRecovery", "phy_test": "PhyTest"}

CA_RE = re.compile(r"\bCA:? '(?P<dev>[^']+)'")
IBSTATUS_RE = re.compile(r"Infiniband device '(?P<dev>[^']+)' port (?P<port>\d+) status:")
HCA_RE = re.compile(r"\bhca_id:\s*(?P<dev>\S+)")
PORT_RE = re.compile(r"^\s*(?:Port (?P<p1>\d+):|port:\s*(?P<p2>\d+))\s*$")
KV_RE = re.compile(r"^\s*(?P<k>[A-Za-z][A-Za-z _]*?)\s*:\s*(?P<v>.*?)\s*$")
SYSFS_RE = re.compile(r"/(?:sys/class/infiniband/)?(?P<dev>[\w-]+)/ports/(?P<port>\d+)/(?P<attr>state|phys_state|rate"
                      r"|link_layer|lid|sm_lid)\s*:\s*(?P<v>.*?)\s*$")
RATE_RE = re.compile(r"(?P<g>[\d.]+)\s*(?:Gb/sec|Gbps|Gb/s)?(?:\s*\((?P<w>\d+X)\s*(?P<s>\w+)\))?", re.I)
IBDEV2NETDEV_RE = re.compile(r"(?P<dev>mlx\w+|[a-z]\w*_\d+)\b.*? port +(?P<port>\d+)(?: +\((?P<state>[A-Z_]+)\s*\))? +==> +"
                             r"(?P<netdev>\S+) +\((?P<link>Up|Down)\)")
LINK_HEAD_RE = re.compile(r"^(?P<type>Switch|CA|Router): (?:0x[0-9a-fA-F]+ )?(?P<desc>.+?):\s*$")
LINK_PORT_RE = re.compile(r"^(?P<pre>.*?)\s*(?P<lid>\d+)\s+(?P<port>\d+)\[[\s\d]*\] ==\(\s*(?:(?P<width>\d+X)\s+"
                          r"(?P<speed>[\d.]+ Gbps(?: \(\w+\))?)\s+)?(?P<state>\w+)/\s*(?P<phys>\w+)\)")
LINK_PEER_RE = re.compile(r'==>\s+(?:0x[0-9a-fA-F]+\s+)?\d+\s+\d+\[[\s\d]*\]\s+"(?P<peer>[^"]+)"')
LINE_MODE_RE = re.compile(r'0x[0-9a-fA-F]+ "\s*(?P<desc>[^"]*)"')
# infiniband-diags' fatal error naming a device that vanished: "ibpanic: [1323906] main: stat of
# IB device 'mlx5_8' failed: No such file or directory" (its port: NA, its state: MISSING)
IBPANIC_RE = re.compile(r"\bibpanic: .*?'(?P<dev>[\w.-]+)'(?P<why>.*?)\s*$")
NEEDLES = (b"CA '", b"CA: '", b"Infiniband device '", b"hca_id:", b"/ports/", b" ==> ", b"  ==>  ", b")==>",
           b"Switch: 0x", b"CA: ", b"ibpanic: ")
CLUSTER_GAP = 64 << 10      # device lines further apart than this are read as separate stretches
BLOCK_TAIL = 8192           # a block's lines after its last device line (ibv_devinfo -v: ~60 lines)


def _state(v: str) -> str:
    """ACTIVE, DOWN, ... from "Active", "4: ACTIVE", "PORT_ACTIVE (4)" (the number decides)."""
    v = v.strip()
    if (m := re.match(r"^(\d):", v) or re.search(r"\((\d)\)\s*$", v)) and m[1] in STATES:
        return STATES[m[1]]
    if (m := re.match(r"^PORT_(\w+)", v)):
        return m[1].upper()
    return v.split()[0].upper() if v else v


def _phys(v: str) -> str:
    """LinkUp, Polling, ... from "LinkUp", "5: LinkUp", "LINK_UP (5)", the kernel's "7: Phy Test"
    and ibv_devinfo's "PORT_CONFIGURATION TRAINNING (4)" (the number decides)."""
    v = v.strip()
    if (m := re.match(r"^(\d):", v) or re.search(r"\((\d)\)\s*$", v)) and m[1] in PHYS:
        return PHYS[m[1]]
    word = re.split(r"\s|\(", v)[0] if v else v
    return PHYS_NAMES.get(word.lower(), word)


def _rate(v: str) -> tuple[float | None, str | None, str | None]:
    m = RATE_RE.match(v.strip())
    if not m:
        return None, None, None
    try:
        return float(m["g"]), m["w"], m["s"]
    except ValueError:
        return None, m["w"], m["s"]


class IbStatusParser(TextParser):
    NEEDLES = NEEDLES       # the lines it reads (besides MARKERS: whether it reads the file at all)
    NAME = "ib_status"
    DESCRIPTION = "InfiniBand/RoCE port state: ibstat, ibstatus, ibv_devinfo, sysfs port files"
    GLOBS = ("ib/ibstat*", "ib/ibv_devinfo*", "ib/ibstatus*")
    MARKERS = (b"\tCA type:", b"Infiniband device '", b"hca_id:", b"Physical state:", b"phys state:",
               b" port 1 ==> ", b" port 2 ==> ", b"  port  1  ==>  ", b"  port  2  ==>  ", b")==>  ", b"ibpanic: ")
    SCHEMAS = {"ib_ports": {
        "line": "int", "tool": "str", "host": "str", "device": "str", "port": "int", "state": "str",
        "phys_state": "str", "rate_gbps": "float", "width": "str", "speed": "str", "link_layer": "str",
        "lid": "str", "sm_lid": "str", "guid": "str", "firmware": "str", "ca_type": "str", "node_type": "str",
        "peer": "str"}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return bool(re.search(rb"CA:? '[^']+'|Infiniband device '[^']+' port \d+ status|hca_id:\s*\S+"
                              rb"|/ports/\d+/(?:state|phys_state):| port +\d+ +(?:\(\w+\) +)?==> +\S+ +\((?:Up|Down)\)"
                              rb"|\)==>  ", head))

    @classmethod
    def parse_text(cls, text: LogText, label: str):
        log = WarningLog(label)
        if cls.unreadable(text, log, "ibstat output"):
            return cls.result(label, {}, {}, log)
        hits = text.lines_with(NEEDLES)
        if not len(hits):
            log.add(None, "no InfiniBand port status found")
            return cls.result(label, {}, {}, log)
        # each stretch of device lines, to a little past its last one, holds its blocks: a merged
        # job log with ibstat near its start and its end is not decoded whole
        rows: dict[tuple, dict] = {}
        cut = np.flatnonzero(hits.start[1:] - hits.end[:-1] > CLUSTER_GAP) + 1
        for a, b in zip(np.r_[0, cut], np.r_[cut, len(hits.start)]):
            body = text.region(int(hits.start[a]), int(hits.end[b - 1]) + BLOCK_TAIL)
            before = [m for ln in text.preceding(int(hits.start[a]), 2) if (m := PROMPT_RE.match(ln))]
            _parse_lines(body, int(hits.line[a]), rows, (before[-1]["h1"] or before[-1]["h2"]) if before else None)
        rows = _ipoib_down(list(rows.values()))
        if not rows:
            log.add(None, "no InfiniBand port status found")
        return cls.result(label, {"ib_ports": rows}, {}, log)


def _parse_lines(body: list[str], first_line: int, rows: dict[tuple, dict], prompt_host: str | None = None) -> None:
    """Add the ports of the lines ``body`` (the first numbered ``first_line``) to ``rows``, keyed
    (host, device, port); ``prompt_host``: the host of a shell prompt just above. A block's
    lines are indented (``ibstat CA port`` prints its own
    unindented); its first other line ends it, so the job's output after it is not read as
    the port's fields."""
    dev = tool = ca = None
    port = None
    indented = False
    host = None

    def cur() -> dict | None:
        if dev is None or port is None:
            return None
        key = (host, dev, port)
        if key not in rows:
            rows[key] = {"line": ln, "tool": tool, "host": host, "device": dev, "port": port, **ca}
        return rows[key]

    link_node: tuple | None = None      # iblinkinfo: the (host, device, node type) of the node header above
    tagged = None                       # prompt_host: a pasted shell prompt's (``[root@gpu-e03 ~]# ibstat``)
    for i, raw in enumerate(body):
        ln = first_line + i
        raw = lines_mod.ANSI_RE.sub("", raw)
        if (m := PROMPT_RE.match(raw)):
            prompt_host = m["h1"] or m["h2"]
            dev = None
            continue
        if (m := IBDEV2NETDEV_RE.search(raw)):
            h = lines_mod.context(raw[:m.start()]).host or prompt_host
            r = rows.setdefault((h, m["dev"], int(m["port"])), {"line": ln, "tool": "ibdev2netdev", "host": h,
                                                                "device": m["dev"], "port": int(m["port"])})
            ipoib = m["netdev"].startswith("ib")
            r["link_layer"] = r.get("link_layer") or ("InfiniBand" if ipoib else "Ethernet")
            r["state"] = (_state(m["state"]) if m["state"] else "ACTIVE" if m["link"] == "Up"
                          else None if ipoib else "DOWN")
            if ipoib and not m["state"] and m["link"] == "Down":
                r["_ipoib_down"] = True          # decided with the host's other IPoIB netdevs
            continue
        if "==(" in raw and (m := LINK_PORT_RE.match(raw)):
            _link_port(m, ln, link_node, rows)
            continue
        if (m := LINK_HEAD_RE.match(raw.strip())) and "'" not in raw:
            link_node = _link_node(m["desc"]) + (m["type"],)
            dev = None
            continue
        if (m := SYSFS_RE.search(raw)):
            h = lines_mod.context(raw[:m.start()]).host
            key = (h, m["dev"], int(m["port"]))
            r = rows.setdefault(key, {"line": ln, "tool": "sysfs", "host": h, "device": m["dev"], "port": int(m["port"])})
            _set(r, m["attr"], m["v"])
            continue
        if (m := IBSTATUS_RE.search(raw)):
            tagged = lines_mod.context(raw[:m.start()]).host
            host = tagged or prompt_host
            dev, port, tool, ca = m["dev"], int(m["port"]), "ibstatus", {}
            indented = False
            cur()
            continue
        if (m := CA_RE.search(raw)):
            tagged = lines_mod.context(raw[:m.start()]).host
            host = tagged or prompt_host
            dev, port, tool, ca = m["dev"], None, "ibstat", {}
            indented = False
            continue
        if (m := HCA_RE.search(raw)):
            tagged = lines_mod.context(raw[:m.start()]).host
            host = tagged or prompt_host
            dev, port, tool, ca = m["dev"], None, "ibv_devinfo", {}
            indented = False
            continue
        if (m := IBPANIC_RE.search(raw)):
            h = lines_mod.context(raw[:m.start()]).host or host
            rows.setdefault((h, m["dev"], None), {"line": ln, "tool": "ibstat", "host": h, "device": m["dev"],
                                                  "port": None, "state": "MISSING"})
            dev = None
            continue
        if dev is None:
            continue
        stripped = re.sub(r"^\S+: (?=\s)", "", raw) if tagged else raw      # pdsh's "node7: " before the tabs
        if not stripped.strip():
            continue
        if (m := PORT_RE.match(stripped)):
            port = int(m["p1"] or m["p2"])
            cur()
            continue
        m = KV_RE.match(stripped)
        k = m["k"].strip().lower() if m else ""
        if stripped[0].isspace():
            indented = True
        elif indented or not (m and tool == "ibstat" and k in IBSTAT_KEYS):
            dev = None                           # the job's own output again
            continue
        if m is None:                            # ibv_devinfo -v's GID and flag lines
            continue
        v = m["v"]
        if port is None:                         # a device-level field
            if k == "ca type":
                ca["ca_type"] = v
            elif k in ("firmware version", "fw_ver"):
                ca["firmware"] = v
            elif tool == "ibstat" and k in ("state", "physical state", "rate"):
                port = 1                         # "ibstat mlx5_0 1": the port block alone
                _set(cur(), k, v)
            continue
        r = cur()
        if r is not None:
            _set(r, k, v)


def _ipoib_down(rows: list[dict]) -> list[dict]:
    """An IPoIB netdev ``ibdev2netdev`` shows Down over a port of unknown state: the port is
    DOWN where another IPoIB netdev of its host is Up (IPoIB is configured there, this one
    lost its link), else unknown (a fabric without IPoIB)."""
    up = {r.get("host") for r in rows if r.get("tool") == "ibdev2netdev" and r.get("link_layer") == "InfiniBand"
          and r.get("state") == "ACTIVE"}
    for r in rows:
        if r.pop("_ipoib_down", False) and r.get("host") in up:
            r["state"] = "DOWN"
    return rows


# a shell prompt: bash ``[u@h d]# ``, ``u@h:d$ ``, zsh ``u@h d % ``, tcsh/SUSE ``u@h:d> ``
PROMPT_RE = re.compile(r"^\s*(?:\[[\w.-]+@(?P<h1>[\w-]+)[^\]]*\]|[\w.-]+@(?P<h2>[\w-]+)(?::\S*| \S+)?)\s?[#$%>] ")
CA_DESC_RE = re.compile(r"^(?P<host>\S+)\s+(?P<dev>mlx\d+_\d+|HCA-\d+|[a-z]+\w*_\d+)$")


def _link_node(desc: str) -> tuple[str | None, str]:
    """(host, device) of an iblinkinfo node description: ``node01 mlx5_0`` is a host's HCA;
    anything else (a switch's ``MF0;sw-ib-01:MQM8700/U1``) is its own device, on no host."""
    desc = desc.strip()
    m = CA_DESC_RE.match(desc)
    return (m["host"], m["dev"]) if m else (None, desc)


def _link_port(m: re.Match, ln: int, node: tuple | None, rows: dict[tuple, dict]) -> None:
    """One iblinkinfo port line: its node from ``-l``'s own columns, else the header above."""
    kind = node[2] if node else None
    if (lm := LINE_MODE_RE.search(m["pre"])):
        node = _link_node(lm["desc"]) + (kind,)
    host, dev = node[:2] if node else (None, f"lid{m['lid']}")
    port = int(m["port"])
    r = rows.setdefault((host, dev, port), {"line": ln, "tool": "iblinkinfo", "host": host, "device": dev,
                                            "port": port, "lid": m["lid"], "node_type": kind})
    peer = LINK_PEER_RE.search(m.string, m.end())
    r["peer"] = peer["peer"].strip() if peer and peer["peer"].strip() else None
    r["state"], r["phys_state"] = _state(m["state"]), _phys(m["phys"])
    if m["width"]:
        r["width"], r["speed"] = m["width"], m["speed"]
        lanes = int(m["width"][:-1])
        r["rate_gbps"] = round(lanes * float(m["speed"].split()[0]), 3)


def _set(r: dict | None, k: str, v: str) -> None:
    if r is None:
        return
    if k == "state":
        r["state"] = _state(v)
    elif k in ("physical state", "phys state", "phys_state"):
        r["phys_state"] = _phys(v)
    elif k == "rate":
        r["rate_gbps"], w, s = _rate(v)
        r["width"] = r.get("width") or w
        r["speed"] = r.get("speed") or s
    elif k in ("link layer", "link_layer"):
        r["link_layer"] = v.split()[0] if v.split() else None
    elif k in ("base lid", "port_lid", "lid"):
        r["lid"] = v
    elif k in ("sm lid", "sm_lid"):
        r["sm_lid"] = v
    elif k in ("port guid", "default gid"):
        r["guid"] = v
    elif k == "active_width" and v.split():
        r["width"] = v.split()[0]
    elif k == "active_speed":
        r["speed"] = re.sub(r"\s*\(\d+\)$", "", v)


register(IbStatusParser)
