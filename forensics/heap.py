"""The cyclic garbage collector kept off what an analysis holds for its whole run.

An analysis keeps millions of objects that CPython's collector tracks until it ends (the
hosts' parts, then the model's tables: object columns, which numpy walks element by element
for the collector) while it makes and drops pandas objects by the thousand. Every full
collection walks all of it again: at 64 hosts with ``--jobs 2``, 12 full collections cost the
analyzing process 1.0 s, and the merge alone 0.4 s of its 1.8 s, which no other core shares.
Settled as below, one full collection is left (0.01 s) and all collections take 0.24 s.

Within :func:`steady`, :func:`settle` puts what exists at that moment out of the collector's
reach (``gc.freeze``: the permanent generation, which collections skip); the end of the
outermost scope hands it all back (``gc.unfreeze``). Reference counting still frees whatever
is dropped; only a reference cycle that was already garbage when settled waits for the
scope's end to be freed. Outside a scope :func:`settle` does nothing, so a library caller
that opens none gets the collector's usual behaviour. A scope opened while frozen objects
exist already (the caller's own ``gc.freeze``) leaves the collector alone:
``gc.unfreeze`` could not tell their objects from ours.

The workers of :class:`forensics.workers.Reading` are forked inside such a scope, so the
imports settled before the fork stay shared with them page for page.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

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
