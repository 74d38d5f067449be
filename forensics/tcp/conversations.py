"""Text for the endpoints of TCP conversations.

The kernel finds conversations (exact endpoint-pair lookup and Wireshark's
flow1/flow2 choice: the sender whose address, then port, compares greater is
flow1) and numbers endpoint pairs densely as it meets them. This table turns
those pairs into address strings once per pair, so the per-packet ``src`` and
``dst`` columns are category codes, never per-packet Python strings.
"""
from __future__ import annotations

import ipaddress

import numpy as np

from ..native import TcpKernel


def _address_text(ver: int, words) -> str:
    if ver == 4:
        return str(ipaddress.IPv4Address(int(words[0])))
    value = 0
    for w in words:
        value = (value << 32) | int(w)
    return str(ipaddress.IPv6Address(value))


class ConversationTable:
    """Per endpoint-pair id: address category codes and ports of flow1 and flow2."""

    def __init__(self, kernel: TcpKernel):
        self._kernel = kernel
        self.addresses: list[str] = []               # category list for src/dst columns
        self._address_code: dict[tuple, int] = {}
        self._codes = np.zeros((0, 2), np.int32)     # per key: flow1, flow2 address code
        self._ports = np.zeros((0, 2), np.uint16)

    def __len__(self) -> int:
        return len(self._codes)

    def sync(self) -> None:
        """Learn the endpoint pairs the kernel met since the last call."""
        rows = self._kernel.keys(len(self._codes))
        if not len(rows):
            return
        codes = np.array([(self._code(int(r[0]), r[1:5]), self._code(int(r[0]), r[6:10]))
                          for r in rows], np.int32).reshape(-1, 2)
        self._codes = np.concatenate([self._codes, codes])
        self._ports = np.concatenate([self._ports, rows[:, [5, 10]].astype(np.uint16)])

    def _code(self, ver: int, words) -> int:
        k = (ver, *map(int, words))
        code = self._address_code.get(k)
        if code is None:
            code = self._address_code[k] = len(self.addresses)
            self.addresses.append(_address_text(ver, words))
        return code

    def address_codes(self, key: np.ndarray, is_flow1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Category codes of each packet's source and destination address."""
        f1, f2 = self._codes[key, 0], self._codes[key, 1]
        sender_f1 = is_flow1.astype(bool)
        return np.where(sender_f1, f1, f2), np.where(sender_f1, f2, f1)

    def endpoints(self, key: np.ndarray) -> dict[str, np.ndarray]:
        """Per key: flow1's (greater) and flow2's address code and port."""
        return {"flow1_addr": self._codes[key, 0], "flow1_port": self._ports[key, 0],
                "flow2_addr": self._codes[key, 1], "flow2_port": self._ports[key, 1]}
