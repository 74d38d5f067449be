"""The repairs' common ground: what the sniff samples of a text (:func:`sample`) and the
contract every repair keeps (:class:`Repair`)."""
from __future__ import annotations

SMALL_BYTES = 256 << 10        # texts up to this size are sniffed whole
HEAD_BYTES = 64 << 10          # else: the head, and WINDOWS windows of WINDOW_BYTES further in
WINDOW_BYTES = 16 << 10
WINDOWS = 4
LINE_NUMBER_BYTES = 8 << 10     # line numbers are looked for in each window's first lines


def sample(data) -> list[bytes]:
    """What the sniff looks at: the whole text when small, else the head and a few windows
    (each cut to whole lines); the first segment is always the text's start."""
    n = len(data)
    if n <= SMALL_BYTES:
        return [bytes(data)]
    segs = [whole_lines(bytes(data[:HEAD_BYTES]), head=True)]
    for i in range(1, WINDOWS + 1):
        at = (n - WINDOW_BYTES) * i // WINDOWS
        segs.append(whole_lines(bytes(data[at:at + WINDOW_BYTES])))
    return [s for s in segs if s]


def whole_lines(b: bytes, head: bool = False) -> bytes:
    if not head:
        i = b.find(b"\n")
        b = b[i + 1:] if i >= 0 else b""
    j = b.rfind(b"\n")
    return b[:j + 1] if j >= 0 else b


class Repair:
    """One named repair. ``needed(segments)``: whether any sampled segment shows the damage
    (cheap: the segments are small); ``apply(data)``: the whole text repaired (``bytes`` in,
    ``bytes`` out, LF line ends). ``apply`` must leave text without that damage unchanged."""

    NAME = ""
    # True where ``apply`` also takes any read-only buffer (the file's ``mmap``) and returns that
    # very object when it repairs nothing: a clean file the sniff misjudged is then not copied
    BUFFERS = False

    @classmethod
    def needed(cls, segments: list[bytes]) -> bool:
        return any(cls.seen(s) for s in segments)

    @classmethod
    def seen(cls, seg: bytes) -> bool:   # pragma: no cover - each repair's own
        raise NotImplementedError

    @classmethod
    def apply(cls, data: bytes) -> bytes:   # pragma: no cover - each repair's own
        raise NotImplementedError
