"""The memory an analysis holds and drops, handled as an analysis uses it: the cyclic garbage
collector kept off what it holds for its whole run (:func:`steady`, :func:`settle`), and the
allocator told to keep what it frees for the next host (:func:`keep_freed_memory`).

An analysis keeps millions of objects that CPython's collector tracks until it ends (the
hosts' parts, then the model's tables: object columns, which numpy walks element by element
for the collector) while it makes and drops pandas objects by the thousand. Every full
collection would walk all of it again, in the analyzing process, where no other core shares
the work (what settling saves: bench/README.md, "bench/fleet.py").

Within :func:`steady`, :func:`settle` puts what exists at that moment out of the collector's
reach (``gc.freeze``: the permanent generation, which collections skip); the end of the
outermost scope hands it all back (``gc.unfreeze``). Reference counting still frees whatever
is dropped; only a reference cycle that was already garbage when settled waits for the
scope's end to be freed. Outside a scope :func:`settle` does nothing, so a library caller
that opens none gets the collector's usual behaviour. A scope opened while frozen objects
exist already (the caller's own ``gc.freeze``) leaves the collector alone:
``gc.unfreeze`` could not tell their objects from ours.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

# glibc's mallopt(3) parameters, and the values an analysis runs with (keep_freed_memory)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MALLOC_SETTINGS = {
    M_MMAP_THRESHOLD: 32 << 20,   # blocks below it come from the heap (glibc's own ceiling for it)
    M_TRIM_THRESHOLD: 512 << 20,  # the heap's free top is given back only beyond this
    M_TOP_PAD: 64 << 20,          # the heap grows by this much more at a time
}

_depth = 0          # scopes open in this process
_owned = False      # the outermost scope found nothing frozen: it may freeze and thaw


@contextmanager
def steady() -> Iterator[None]:
    """A scope within which :func:`settle` takes effect; nested scopes are one with the
    outermost, whose end thaws what was settled (when it found nothing frozen on entry)."""
    global _depth, _owned
    if _depth == 0:
        _owned = gc.get_freeze_count() == 0
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _owned:
            _owned = False
            gc.unfreeze()


def settle() -> bool:
    """Every object the collector tracks now, out of its reach until the outermost
    :func:`steady` scope ends; True when done (in a scope that owns the freeze)."""
    if _depth and _owned:
        gc.freeze()
        return True
    return False


def keep_freed_memory() -> bool:
    """glibc's malloc told to keep what this process frees for its next allocations (a fixed
    mmap threshold, a high trim threshold: :data:`MALLOC_SETTINGS`); True when it took them.

    Reading a host makes and drops some hundreds of MB of arrays. By default glibc gives the
    largest blocks and the heap's free top back to the kernel, and the next host faults them in
    again, page by page; kept, only a process's first host faults its pages in, and the peak
    memory is unchanged (bench/README.md, "bench/fleet.py"). A process-wide setting: the
    command line sets it for itself (its forked workers inherit it) and the workers for
    themselves, never a library caller's process. False where the C library is not glibc
    (no ``mallopt``, or one that refuses)."""
    try:
        import ctypes
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all([mallopt(k, v) == 1 for k, v in MALLOC_SETTINGS.items()])
