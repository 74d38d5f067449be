"""Vectorised field gathers at per-packet byte offsets.

``FieldViews`` lays overlapping strided views over the byte buffer (element
``i`` of the big-endian u32 view is bytes ``i..i+3``), so gathering a 32-bit
header field for every packet is one fancy-index operation. Callers
guarantee that ``idx`` plus the field width stays inside the buffer (the
reader pads it), then mask results by captured length.
"""
from __future__ import annotations

import numpy as np


class FieldViews:
    def __init__(self, buf: np.ndarray):
        self.buf = buf
        n = len(buf)
        # native-order views gather fastest; big-endian fields are byte-swapped after
        self.ne16 = np.ndarray((n - 1,), np.uint16, buffer=buf, strides=(1,))
        self.ne32 = np.ndarray((n - 3,), np.uint32, buffer=buf, strides=(1,))
        self._swap = np.little_endian

    def u8(self, idx: np.ndarray) -> np.ndarray:
        return self.buf[idx]

    def u16(self, idx: np.ndarray) -> np.ndarray:
        """Big-endian 16-bit fields."""
        v = self.ne16[idx]
        return v.byteswap(inplace=True) if self._swap else v

    def u32(self, idx: np.ndarray) -> np.ndarray:
        """Big-endian 32-bit fields."""
        v = self.ne32[idx]
        return v.byteswap(inplace=True) if self._swap else v

    def u32le(self, idx: np.ndarray) -> np.ndarray:
        """Little-endian 32-bit fields."""
        v = self.ne32[idx]
        return v if self._swap else v.byteswap(inplace=True)
