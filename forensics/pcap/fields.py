"""Vectorised big/little-endian field gathers at per-packet byte offsets.

Callers guarantee that ``idx`` plus the field width stays inside ``buf``
(the reader pads its buffer), then mask results by captured length.
"""
from __future__ import annotations

import numpy as np


def u8(buf: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return buf[idx]


def be16(buf: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return (buf[idx].astype(np.uint16) << 8) | buf[idx + 1]


def be32(buf: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return ((buf[idx].astype(np.uint32) << 24) | (buf[idx + 1].astype(np.uint32) << 16)
            | (buf[idx + 2].astype(np.uint32) << 8) | buf[idx + 3])


def le32(buf: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return ((buf[idx + 3].astype(np.uint32) << 24) | (buf[idx + 2].astype(np.uint32) << 16)
            | (buf[idx + 1].astype(np.uint32) << 8) | buf[idx])
