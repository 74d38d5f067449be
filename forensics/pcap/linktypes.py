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

from .fields import FieldViews

NOT_A_PACKET = -1      # walker's link type for pcapng records that are not packets
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


def _is_vlan(etype: np.ndarray) -> np.ndarray:
    tagged = etype == VLAN_TPIDS[0]
    for tpid in VLAN_TPIDS[1:]:
        tagged |= etype == tpid
    return tagged


def _skip_vlan(fv: FieldViews, l3: np.ndarray, etype: np.ndarray, end: np.ndarray) -> None:
    """Step over stacked 802.1Q / 802.1ad tags in place."""
    for _ in range(MAX_VLAN_TAGS):
        tagged = _is_vlan(etype)
        if not tagged.any():
            return
        idx = np.flatnonzero(tagged & (l3 + 4 <= end))
        if not len(idx):
            return
        etype[idx] = fv.u16(l3[idx] + 2)
        l3[idx] += 4


def _ethertype_rule(rule: LinkRule) -> Callable:
    def locate(fv, off, end):
        l3 = off + rule.header_len
        etype = fv.u16(off + rule.proto_at).astype(np.int32)
        etype[l3 > end] = 0
        _skip_vlan(fv, l3, etype, end)
        return l3, etype
    return locate


def _af_rule(rule: LinkRule) -> Callable:
    def locate(fv, off, end):
        if rule.af_byteorder == "big":
            af = fv.u32(off)
        else:
            # DLT_NULL stores the family in the capturing host's byte order: small
            # values read little-endian mean a little-endian writer.
            le = fv.u32le(off)
            af = np.where(le < 256, le, fv.u32(off))
        etype = np.where(af == AF_INET, ETH_IPV4,
                         np.where(np.isin(af, AF_INET6), ETH_IPV6, 0)).astype(np.int32)
        return off + rule.header_len, etype
    return locate


def _version_rule(rule: LinkRule) -> Callable:
    def locate(fv, off, end):
        ver = fv.u8(off) >> 4
        etype = np.where(ver == 4, ETH_IPV4, np.where(ver == 6, ETH_IPV6, 0)).astype(np.int32)
        return off + rule.header_len, etype
    return locate


_RULE_KINDS = {"ethertype": _ethertype_rule, "af": _af_rule, "version": _version_rule}
LOCATORS: dict[int, Callable] = {lt: _RULE_KINDS[r.proto](r) for lt, r in LINK_RULES.items()}


def locate_l3(fv: FieldViews, off: np.ndarray, end: np.ndarray, linktype: np.ndarray):
    """Network-layer offset and ethertype for every record; ethertype 0 = unknown.

    Returns ``(l3, etype, unknown_linktypes)`` where the last item maps each
    link type without a rule to its record count.
    """
    unknown: dict[int, int] = {}
    first = int(linktype[0]) if len(linktype) else 0
    if not len(linktype) or (linktype == first).all():     # the usual case: one link type
        kinds = [first]
    else:
        kinds = np.unique(linktype).tolist()
    if len(kinds) == 1 and kinds[0] in LOCATORS:   # (NOT_A_PACKET is never a key)
        l3, etype = LOCATORS[kinds[0]](fv, off, end)
    else:
        l3 = np.zeros(len(off), np.int64)
        etype = np.zeros(len(off), np.int32)
        for lt in kinds:
            if lt == NOT_A_PACKET:
                continue                      # pcapng custom blocks: frames, never IP
            sel = np.flatnonzero(linktype == lt)
            locate = LOCATORS.get(lt)
            if locate is None:
                unknown[lt] = len(sel)
                continue
            l3[sel], etype[sel] = locate(fv, off[sel], end[sel])
    etype[l3 > end] = 0
    return l3, etype, unknown
