"""Communicator identity: the fold of NCCL's 128-byte ``ncclUniqueId``.

The tracer reads the unique id from the caller's stack at ``ncclCommInitRank``
entry (it is passed by value) and emits ``comm_id_hash``, so events from every rank
of one communicator join on it. This is the reference definition the lab's library
implements and the tests check the tracer against; the analyzer only reads the
tracer's value.

Definition (also implemented in ``bpf/nccl.bt`` and the lab): view the id as
sixteen little-endian unsigned 64-bit words w0..w15 and fold them through the
splitmix64 finalizer::

    h = 0
    for w in words:
        h = splitmix64(h ^ w)

where ``splitmix64(x)`` adds the golden-ratio increment and applies the two
xor-shift-multiply rounds of Vigna's SplitMix64, all modulo 2**64.
"""
from __future__ import annotations

import struct

MASK64 = (1 << 64) - 1
UNIQUE_ID_BYTES = 128
GOLDEN = 0x9E3779B97F4A7C15
MUL1 = 0xBF58476D1CE4E5B9
MUL2 = 0x94D049BB133111EB


def splitmix64(x: int) -> int:
    """One SplitMix64 step: increment by the golden ratio, then finalize."""
    z = (x + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MUL1) & MASK64
    z = ((z ^ (z >> 27)) * MUL2) & MASK64
    return z ^ (z >> 31)


def comm_id_fold(unique_id: bytes) -> int:
    """Fold a 128-byte ``ncclUniqueId`` into the 64-bit ``comm_id_hash``."""
    if len(unique_id) != UNIQUE_ID_BYTES:
        raise ValueError(f"ncclUniqueId must be {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
    h = 0
    for (word,) in struct.iter_unpack("<Q", unique_id):
        h = splitmix64(h ^ word)
    return h


def nccl_comm_hash(unique_id: bytes) -> int:
    """NCCL's own ``commId`` as printed in ``Init START/COMPLETE`` log lines.

    NCCL hashes the id bytes with a DJB2a variant over *signed* chars
    (``result = result * 33 ^ (char)byte``); keeping it lets the analyzer join
    tracer events with NCCL_DEBUG logs of the same communicator.
    """
    if len(unique_id) != UNIQUE_ID_BYTES:
        raise ValueError(f"ncclUniqueId must be {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
    h = 5381
    for b in unique_id:
        signed = b - 256 if b >= 128 else b
        h = (((h << 5) + h) ^ (signed & MASK64)) & MASK64
    return h
