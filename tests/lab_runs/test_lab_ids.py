"""The communicator id fold shared by the tracer and the lab (tests/lab/ids.py)."""
import struct

import pytest

from tests.lab.ids import comm_id_fold, nccl_comm_hash, splitmix64


def test_splitmix64_matches_the_reference_sequence():
    # Vigna's SplitMix64 seeded with 0 yields these first outputs: our step is
    # "add the increment, finalize", so feeding the running state reproduces them.
    state, outputs = 0, []
    for _ in range(3):
        outputs.append(splitmix64(state))
        state = (state + 0x9E3779B97F4A7C15) & (2**64 - 1)
    assert outputs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_fold_is_order_sensitive_and_uses_all_words():
    words = list(range(1, 17))
    uid = struct.pack("<16Q", *words)
    h = comm_id_fold(uid)
    assert h == comm_id_fold(uid)
    swapped = struct.pack("<16Q", *(words[1:2] + words[0:1] + words[2:]))
    assert comm_id_fold(swapped) != h
    last_changed = struct.pack("<16Q", *(words[:15] + [99]))
    assert comm_id_fold(last_changed) != h
    # by hand: h = splitmix64(h ^ w) for every word
    expect = 0
    for w in words:
        expect = splitmix64(expect ^ w)
    assert h == expect


def test_nccl_comm_hash_treats_bytes_as_signed_chars():
    uid = bytes([0x80]) + bytes(127)
    h = 5381
    h = ((h << 5) + h) ^ ((-128) & (2**64 - 1))
    for _ in range(127):
        h = (((h << 5) + h) ^ 0) & (2**64 - 1)
    assert nccl_comm_hash(uid) == h


@pytest.mark.parametrize("n", [0, 127, 129])
def test_wrong_length_is_rejected(n):
    with pytest.raises(ValueError):
        comm_id_fold(bytes(n))
