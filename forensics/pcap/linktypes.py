"""Link-layer rules: where the network-layer header starts, per link type.

Each rule is declared as data (a :class:`LinkRule`) and registered in
``LINK_RULES`` keyed by the pcap LINKTYPE value, dpkt style. A rule maps the
packets of its link type to ``(l3_offset, ethertype)`` arrays; the only code
is the one vectorised step each family needs (VLAN tags, BSD address family).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .fields import be16, be32, le32

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
VLAN_TPIDS = (0x8100, 0x88A8, 0x9100)
MAX_VLAN_TAGS = 4

# BSD loopback address families seen in the wild for IPv6 (OpenBSD 24, FreeBSD 28, Darwin 30, Linux 10)
AF_INET = 2
AF_INET6 = (10, 24, 28, 30)


@dataclass(frozen=True)
class LinkRule:
    name: str
    header_len: int
    # how the protocol is found: "ethertype" at ``proto_at`` (then VLAN tags),
    # "af" (BSD address family, 4 bytes), or "version" (raw IP: IP version nibble)
    proto: str
    proto_at: int = 0
    af_byteorder: str = "host"     # "host" (DLT_NULL) or "big" (DLT_LOOP)


LINK_RULES: dict[int, LinkRule] = {
    0: LinkRule("null", 4, "af"),
    1: LinkRule("ethernet", 14, "ethertype", 12),
    12: LinkRule("raw", 0, "version"),
    14: LinkRule("raw", 0, "version"),
    101: LinkRule("raw", 0, "version"),
    108: LinkRule("loop", 4, "af", af_byteorder="big"),
    113: LinkRule("linux_sll", 16, "ethertype", 14),
    228: LinkRule("ipv4", 0, "version"),
    229: LinkRule("ipv6", 0, "version"),
    276: LinkRule("linux_sll2", 20, "ethertype", 0),
}


def _skip_vlan(buf: np.ndarray, l3: np.ndarray, etype: np.ndarray, end: np.ndarray) -> None:
    """Step over stacked 802.1Q / 802.1ad tags in place."""
    for _ in range(MAX_VLAN_TAGS):
        tagged = np.isin(etype, VLAN_TPIDS) & (l3 + 4 <= end)
        if not tagged.any():
            return
        idx = np.flatnonzero(tagged)
        etype[idx] = be16(buf, l3[idx] + 2)
        l3[idx] += 4


def _ethertype_rule(rule: LinkRule) -> Callable:
    def locate(buf, off, end):
        l3 = off + rule.header_len
        etype = np.where(l3 <= end, be16(buf, off + rule.proto_at), 0).astype(np.int64)
        _skip_vlan(buf, l3, etype, end)
        return l3, etype
    return locate


def _af_rule(rule: LinkRule) -> Callable:
    def locate(buf, off, end):
        if rule.af_byteorder == "big":
            af = be32(buf, off)
        else:
            # DLT_NULL stores the family in the capturing host's byte order: small
            # values read little-endian mean a little-endian writer.
            le = le32(buf, off)
            af = np.where(le < 256, le, be32(buf, off))
        etype = np.where(af == AF_INET, ETH_IPV4,
                         np.where(np.isin(af, AF_INET6), ETH_IPV6, 0)).astype(np.int64)
        return off + rule.header_len, etype
    return locate


def _version_rule(rule: LinkRule) -> Callable:
    def locate(buf, off, end):
        ver = buf[off] >> 4
        etype = np.where(ver == 4, ETH_IPV4, np.where(ver == 6, ETH_IPV6, 0)).astype(np.int64)
        return off + rule.header_len, etype
    return locate


_RULE_KINDS = {"ethertype": _ethertype_rule, "af": _af_rule, "version": _version_rule}
LOCATORS: dict[int, Callable] = {lt: _RULE_KINDS[r.proto](r) for lt, r in LINK_RULES.items()}


def locate_l3(buf: np.ndarray, off: np.ndarray, end: np.ndarray, linktype: np.ndarray):
    """Network-layer offset and ethertype for every record; ethertype 0 = unknown.

    Returns ``(l3, etype, unknown_linktypes)`` where the last item maps each
    link type without a rule to its record count.
    """
    l3 = np.zeros(len(off), np.int64)
    etype = np.zeros(len(off), np.int64)
    unknown: dict[int, int] = {}
    kinds = np.unique(linktype)
    for lt in kinds.tolist():
        sel = slice(None) if len(kinds) == 1 else np.flatnonzero(linktype == lt)
        locate = LOCATORS.get(lt)
        if locate is None:
            unknown[lt] = int(np.count_nonzero(linktype == lt))
            continue
        l3[sel], etype[sel] = locate(buf, off[sel], end[sel])
    etype[l3 > end] = 0
    return l3, etype, unknown
