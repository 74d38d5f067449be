"""Conversation keys: which packets belong to the same TCP address/port pair.

Wireshark finds a conversation by the unordered pair of endpoints and names
its two flows by comparing the endpoints (address bytes, then ports): the
sender of a packet is "flow1" when its endpoint compares greater. This module
does the same for whole arrays: it hashes the canonical endpoint pair,
factorises the hashes, checks every packet against the stored endpoints (so a
hash collision can never merge two conversations), and hands out dense key ids
that stay stable across batches. Port reuse (a new SYN) is the kernel's job.
"""
from __future__ import annotations

import ipaddress

import numpy as np
import pandas as pd

from ..pcap.decode import TcpPackets

_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(29)


def _endpoint_cmp(pk: TcpPackets) -> np.ndarray:
    """Sign of (src address, sport) compared with (dst address, dport)."""
    cmp = np.zeros(len(pk), np.int8)
    for k in range(4):
        s, d = pk.src[:, k], pk.dst[:, k]
        undecided = cmp == 0
        cmp[undecided & (s > d)] = 1
        cmp[undecided & (s < d)] = -1
    undecided = cmp == 0
    cmp[undecided & (pk.sport > pk.dport)] = 1
    cmp[undecided & (pk.sport < pk.dport)] = -1
    return cmp


def _address_text(ver: int, words) -> str:
    if ver == 4:
        return str(ipaddress.IPv4Address(int(words[0])))
    value = 0
    for w in words:
        value = (value << 32) | int(w)
    return str(ipaddress.IPv6Address(value))


class ConversationTable:
    """Dense ids for endpoint pairs, and the endpoints' text for output."""

    # canonical layout of one key: ver, hi address (4 words), hi port, lo address, lo port
    WIDTH = 11

    def __init__(self):
        self._by_hash: dict[int, int] = {}
        self._n = 0
        self._canon = np.zeros((1024, self.WIDTH), np.uint32)   # rows [0, _n) are keys
        self._codes = np.zeros((1024, 2), np.int32)              # per key: hi, lo address code
        self._exact: dict[bytes, int] = {}      # only used after a hash collision
        self.addresses: list[str] = []          # category list for src/dst columns
        self._address_code: dict[tuple, int] = {}

    def __len__(self) -> int:
        return self._n

    def assign(self, pk: TcpPackets) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(key_id uint32, sender_is_flow1 uint8)`` for every packet."""
        n = len(pk)
        is_flow1 = _endpoint_cmp(pk) > 0
        hi = np.where(is_flow1[:, None], pk.src, pk.dst)
        lo = np.where(is_flow1[:, None], pk.dst, pk.src)
        canon = np.empty((n, self.WIDTH), np.uint32)
        canon[:, 0] = pk.ipver
        canon[:, 1:5] = hi
        canon[:, 5] = np.where(is_flow1, pk.sport, pk.dport)
        canon[:, 6:10] = lo
        canon[:, 10] = np.where(is_flow1, pk.dport, pk.sport)
        h = np.zeros(n, np.uint64)
        with np.errstate(over="ignore"):
            for col in range(self.WIDTH):
                h = (h ^ canon[:, col].astype(np.uint64)) * _MIX
                h ^= h >> _SHIFT
        codes, uniques = pd.factorize(h)
        first = np.zeros(len(uniques), np.int64)
        first[codes[::-1]] = np.arange(n - 1, -1, -1)       # first occurrence of each code
        gids = np.empty(len(uniques), np.int64)
        for u, (hv, row) in enumerate(zip(uniques.tolist(), first.tolist())):
            gid = self._by_hash.get(hv)
            if gid is None:
                gid = self._new_key(canon[row])
                self._by_hash[hv] = gid
            gids[u] = gid
        key = gids[codes]
        clash = np.flatnonzero((self._canon[key] != canon).any(axis=1))
        for i in clash.tolist():                            # exact fallback, practically never
            exact = canon[i].tobytes()
            gid = self._exact.get(exact)
            if gid is None:
                gid = self._exact[exact] = self._new_key(canon[i])
            key[i] = gid
        return key.astype(np.uint32), is_flow1.astype(np.uint8)

    def _new_key(self, row: np.ndarray) -> int:
        gid = self._n
        if gid == len(self._canon):
            self._canon = np.concatenate([self._canon, np.zeros_like(self._canon)])
            self._codes = np.concatenate([self._codes, np.zeros_like(self._codes)])
        self._canon[gid] = row
        ver = int(row[0])
        self._codes[gid] = (self._code(ver, row[1:5]), self._code(ver, row[6:10]))
        self._n += 1
        return gid

    def _code(self, ver: int, words) -> int:
        k = (ver, *map(int, words))
        code = self._address_code.get(k)
        if code is None:
            code = self._address_code[k] = len(self.addresses)
            self.addresses.append(_address_text(ver, words))
        return code

    def address_codes(self, key: np.ndarray, is_flow1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Category codes of each packet's source and destination address."""
        hi, lo = self._codes[key, 0], self._codes[key, 1]
        f1 = is_flow1.astype(bool)
        return np.where(f1, hi, lo), np.where(f1, lo, hi)

    def endpoints(self, key: np.ndarray) -> dict[str, np.ndarray]:
        """Per key: flow1's (greater) and flow2's address code and port."""
        return {
            "flow1_addr": self._codes[key, 0], "flow1_port": self._canon[key, 5].astype(np.uint16),
            "flow2_addr": self._codes[key, 1], "flow2_port": self._canon[key, 10].astype(np.uint16),
        }
