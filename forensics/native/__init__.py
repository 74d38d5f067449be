"""ctypes bindings to the compiled kernels (``walk.c``, ``tcpkernel.c``, ``csvfmt.c``,
``logscan.c``).

The shared library is built by ``pip install`` (setup.py) as the extension
``forensics.native._tcpkernel``; it has no Python API, so it is loaded with
ctypes and fed numpy arrays. Only the parts that touch every record or byte live
there: walking capture records, the per-flow TCP state machine, formatting CSV,
and scanning text logs (marker lines, line bounds, NCCL COLL lines into columns).
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import os

import numpy as np

from ..errors import CaptureFormatError, StallscopeError

_HERE = os.path.dirname(os.path.abspath(__file__))


def _find_library() -> str:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = os.path.join(_HERE, f"_tcpkernel{suffix}")
        if os.path.exists(candidate):
            return candidate
    raise StallscopeError(
        "the native TCP kernel is not built; run 'make venv' (or 'pip install -e .') first"
    )


_lib = ctypes.CDLL(_find_library())

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


class WalkCols(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("data_off", "caplen", "origlen", "ts_ns", "linktype")]


class TcpIn(ctypes.Structure):
    _fields_ = [
        *[(name, _P) for name in ("frame", "ts", "ipver", "src", "dst")],
        ("addr_words", _I64),
        *[(name, _P) for name in ("sport", "dport", "seq", "ack", "seglen", "win", "flags", "wscale", "status")],
    ]


class TcpOut(ctypes.Structure):
    _fields_ = [
        (name, _P)
        for name in ("key", "dir", "stream", "verdicts", "dupack_num", "dupack_frame", "acks_frame",
                     "seq_rel", "ack_rel", "ack_rtt", "rto")
    ]


HISTORY_LEN = 48


class TcpConv(ctypes.Structure):
    _fields_ = [
        ("key", ctypes.c_uint32),
        ("first_frame", ctypes.c_uint32),
        ("orig_flow", ctypes.c_uint8),
        ("first_ts", _I64),
        ("last_ts", _I64),
        ("irtt", _I64),
        ("packets", ctypes.c_uint64 * 2),
        ("bytes", ctypes.c_uint64 * 2),
        *[(name, ctypes.c_uint32 * 2) for name in (
            "retrans", "fast", "spurious", "ooo", "lost", "dupack",
            "zero_window", "rst", "keep_alive", "syn", "fin")],
        ("rtt_sum", _I64 * 2),
        ("rtt_min", _I64 * 2),
        ("rtt_n", ctypes.c_uint32 * 2),
        ("history", ctypes.c_char * HISTORY_LEN),
    ]


def _numpy_dtype(struct: type[ctypes.Structure]) -> np.dtype:
    """The numpy twin of a ctypes struct (same offsets, so C can fill it directly)."""
    names, formats, offsets = [], [], []
    for name, ctype in struct._fields_:
        names.append(name)
        offsets.append(getattr(struct, name).offset)
        if issubclass(ctype, ctypes.Array):
            if ctype._type_ is ctypes.c_char:
                formats.append(f"S{ctype._length_}")
            else:
                formats.append((np.dtype(ctype._type_), (ctype._length_,)))
        else:
            formats.append(np.dtype(ctype))
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": ctypes.sizeof(struct)})


CONV_DTYPE = _numpy_dtype(TcpConv)

_lib.walk_new.restype = _P
_lib.walk_new.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int32, ctypes.c_uint32]
_lib.walk_free.argtypes = [_P]
_lib.walk_error.restype = ctypes.c_char_p
_lib.walk_error.argtypes = [_P]
_lib.walk_counters.argtypes = [_P, _P]
_lib.walk_records.restype = _I64
_lib.walk_records.argtypes = [_P, _P, _I64, _I64, ctypes.POINTER(WalkCols), _I64, ctypes.POINTER(_I64)]

_lib.tcpk_new.restype = _P
_lib.tcpk_free.argtypes = [_P]
_lib.tcpk_run.restype = _I64
_lib.tcpk_run.argtypes = [_P, ctypes.POINTER(TcpIn), ctypes.POINTER(TcpOut), _I64]
_lib.tcpk_nconv.restype = _I64
_lib.tcpk_nconv.argtypes = [_P]
_lib.tcpk_convs.restype = _I64
_lib.tcpk_convs.argtypes = [_P, _P, _I64]
_lib.tcpk_nkeys.restype = _I64
_lib.tcpk_nkeys.argtypes = [_P]
_lib.tcpk_keys.restype = _I64
_lib.tcpk_keys.argtypes = [_P, _I64, _P, _I64]
_lib.tcpk_error.restype = ctypes.c_char_p
_lib.tcpk_error.argtypes = [_P]

class CsvCol(ctypes.Structure):
    _fields_ = [("data", _P), ("type", ctypes.c_int32), ("param", ctypes.c_int32)]


_lib.csv_format.restype = _I64
_lib.csv_format.argtypes = [ctypes.POINTER(CsvCol), ctypes.c_int32, _P, _P, ctypes.c_int32,
                            _I64, _I64, _P, _I64, ctypes.POINTER(_I64)]

CSV_U8, CSV_U16, CSV_U32, CSV_I64, CSV_BIT, CSV_CATEGORY = 1, 2, 3, 4, 5, 6
_CSV_TYPES = {np.dtype(np.uint8): CSV_U8, np.dtype(np.uint16): CSV_U16,
              np.dtype(np.uint32): CSV_U32, np.dtype(np.int64): CSV_I64}


def csv_rows(columns: list[tuple[np.ndarray, str, int]], strings: list[str],
             chunk: int = 4 << 20):
    """Yield CSV text (bytes) for rows of integer columns.

    ``columns`` holds ``(array, kind, param)``: kind ``"int"`` (uint8/16/32 or
    int64), ``"bit"`` (bit ``param`` of a uint32 array) or ``"category"``
    (int32 codes into ``strings``).
    """
    keep = []
    spec = (CsvCol * len(columns))()
    nrows = len(columns[0][0]) if columns else 0
    for i, (arr, kind, param) in enumerate(columns):
        if kind == "bit":
            arr, ctype = np.ascontiguousarray(arr, np.uint32), CSV_BIT
        elif kind == "category":
            arr, ctype = np.ascontiguousarray(arr, np.int32), CSV_CATEGORY
        else:
            arr = np.ascontiguousarray(arr)
            if arr.dtype not in _CSV_TYPES:
                arr = arr.astype(np.int64)
            ctype = _CSV_TYPES[arr.dtype]
        if len(arr) != nrows:
            raise ValueError("CSV columns differ in length")
        keep.append(arr)
        spec[i] = CsvCol(_ptr(arr), ctype, param)
    encoded = [s.encode() for s in strings]
    strs = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
    lens = np.array([len(e) for e in encoded] or [0], np.int32)
    out = np.empty(chunk, np.uint8)
    row, done = 0, _I64(0)
    while row < nrows:
        n = _lib.csv_format(spec, len(columns), ctypes.cast(strs, _P), _ptr(lens), len(encoded),
                            row, nrows, _ptr(out), chunk, ctypes.byref(done))
        if done.value == row:       # one row larger than the chunk: grow it
            chunk *= 2
            out = np.empty(chunk, np.uint8)
            continue
        row = done.value
        yield out[:n].tobytes()


class CollCols(ctypes.Structure):
    _fields_ = [(name, _P) for name in (
        "start", "pre", "ts_len", "host_off", "host_len", "host_hash", "pid", "tid", "dev", "op_off", "op_len",
        "op_hash", "op_count", "sendbuff", "recvbuff", "count", "datatype", "red_op", "root", "comm", "nranks",
        "stream")]


COLL_DTYPES = {
    "start": np.int64, "pre": np.int64, "ts_len": np.int32, "host_off": np.int64, "host_len": np.int32,
    "host_hash": np.uint64, "pid": np.int64, "tid": np.int64, "dev": np.int32, "op_off": np.int64,
    "op_len": np.int32, "op_hash": np.uint64, "op_count": np.uint64, "sendbuff": np.uint64, "recvbuff": np.uint64,
    "count": np.int64, "datatype": np.int32, "red_op": np.int32, "root": np.int64, "comm": np.uint64,
    "nranks": np.int32, "stream": np.uint64,
}

_lib.logscan_coll.restype = _I64
_lib.logscan_coll.argtypes = [_P, _I64, _I64, ctypes.POINTER(CollCols), _I64, _P, _I64, ctypes.POINTER(_I64),
                              ctypes.POINTER(_I64)]
_lib.logscan_hits.restype = _I64
_lib.logscan_hits.argtypes = [_P, _I64, _I64, ctypes.c_char_p, _I64, _P, _I64, ctypes.POINTER(_I64)]
_lib.logscan_spans.restype = _I64
_lib.logscan_spans.argtypes = [_P, _I64, _P, _I64, _P, _P, _P]


def coll_chunks(buf, length: int, columns=tuple(COLL_DTYPES), chunk: int = 1 << 16):
    """NCCL_DEBUG COLL lines of ``buf`` (bytes, mmap: anything with the buffer protocol),
    parsed by ``logscan.c`` a chunk at a time: yields ``(columns, other)``, ``columns`` the
    wanted ones of ``COLL_DTYPES`` for up to ``chunk`` lines (views of buffers reused by the
    next chunk: aggregate or copy them first), ``other`` the offsets of the "NCCL INFO "
    lines in the same stretch that are not COLL lines (or not in the form C reads)."""
    addr = _buffer_address(buf)
    cols = {k: np.empty(chunk, COLL_DTYPES[k]) for k in columns}
    other = np.empty(chunk, np.int64)
    c = CollCols(**{k: _ptr(v) for k, v in cols.items()})
    pos, nxt, n_other = 0, _I64(0), _I64(0)
    while pos < length:
        n = _lib.logscan_coll(addr, length, pos, ctypes.byref(c), chunk, _ptr(other), chunk, ctypes.byref(n_other),
                              ctypes.byref(nxt))
        if n or n_other.value:
            yield {k: v[:n] for k, v in cols.items()}, other[:n_other.value]
        if nxt.value <= pos:
            break
        pos = nxt.value


TOPO_DTYPES = {
    "start": np.int64, "pre": np.int64, "pre_hash": np.uint64, "ts_len": np.int32, "host_off": np.int64,
    "host_len": np.int32, "host_hash": np.uint64, "pid": np.int64, "tid": np.int64, "dev": np.int32, "msg_off": np.int64,
    "msg_len": np.int32, "msg_hash": np.uint64, "kind": np.int32, "channel": np.int64, "sub": np.int64,
    "src_rank": np.int64, "dst_rank": np.int64, "src_dev_off": np.int64, "src_dev_len": np.int32,
    "src_dev_hash": np.uint64, "dst_dev_off": np.int64, "dst_dev_len": np.int32, "dst_dev_hash": np.uint64,
    "direction": np.int32, "via_off": np.int64, "via_len": np.int32, "via_hash": np.uint64,
    "order_off": np.int64, "order_len": np.int32, "order_hash": np.uint64,
}


TOPO_ITEM_DTYPES = {"item_row": np.int64, "item_channel": np.int64, "item_rank": np.int64, "item_up": np.int64,
                    "item_down_off": np.int64, "item_down_len": np.int32, "item_down_hash": np.uint64}


class TopoCols(ctypes.Structure):
    _fields_ = [*[(name, _P) for name in TOPO_DTYPES], ("item_cap", _I64),
                *[(name, _P) for name in TOPO_ITEM_DTYPES], ("n_items", _I64)]


_lib.logscan_topo.restype = _I64
_lib.logscan_topo.argtypes = [_P, _I64, _P, _I64, ctypes.c_int32, ctypes.POINTER(TopoCols), _P,
                              ctypes.POINTER(_I64)]

TOPO_CONNECTION, TOPO_RING_ORDER, TOPO_PREFIX, TOPO_TREES = 1, 2, 3, 4


def topo_chunks(buf, length: int, hits: np.ndarray, any_message: bool = False, chunk: int = 1 << 17,
                into: dict[str, np.ndarray] | None = None):
    """The NCCL init ``Channel`` lines (connections and ring order) among the "NCCL INFO "
    offsets ``hits`` (``coll_chunks``' ``other``), parsed by ``logscan.c`` up to ``chunk`` hits
    at a time: yields ``(columns, items, rest)`` per stretch of hits. ``columns``: those of
    ``TOPO_DTYPES`` with a row per line read (``kind``: ``TOPO_CONNECTION`` or
    ``TOPO_RING_ORDER``, ``TOPO_TREES`` (its items: the ``TOPO_ITEM_DTYPES`` columns of
    ``items``, a row per item, ``item_row`` the index of its line's row in this stretch), or
    with ``any_message`` ``TOPO_PREFIX``: another message, of which the prefix and message
    bounds are read; a column a kind does not fill holds garbage in the other kinds' rows);
    ``rest``: the offsets of the stretch's hits not read (a prefix or form the C reader leaves
    to Python's regular expressions), in their order. A Trees line whose items would pass
    ``chunk + 4096`` items in its stretch is left to Python. The arrays are views of buffers
    the next stretch reuses: take what is wanted of them first. Bounded buffers, reused: a log
    of millions of init lines is read without columns of its full length it mostly does not
    keep. ``into``: columns of ``TOPO_DTYPES`` (arrays of their dtype, at least ``len(hits)``
    long) that C writes in place instead, each stretch's rows after the previous ones': their
    ``columns`` are views of these."""
    hits = np.ascontiguousarray(hits, np.int64)
    n_all = len(hits)
    if not n_all:
        return
    size = min(n_all, max(1, chunk))
    # not zeroed (a heap block reused would be cleared byte by byte): C writes every column a
    # row's kind fills, and the others are garbage anyway
    into = into or {}
    if any(k not in TOPO_DTYPES or v.dtype != TOPO_DTYPES[k] or len(v) < n_all or not v.flags.c_contiguous
           for k, v in into.items()):
        raise ValueError("topo_chunks: each column of into must be a contiguous array of its dtype, len(hits) long")
    cols = {k: np.empty(size, dt) for k, dt in TOPO_DTYPES.items() if k not in into}
    cap = size + 4096
    items = {k: np.empty(cap, dt) for k, dt in TOPO_ITEM_DTYPES.items()}
    rest = np.empty(size, np.int64)
    c = TopoCols(item_cap=cap, **{k: _ptr(v) for k, v in cols.items()}, **{k: _ptr(v) for k, v in items.items()})
    addr, n_rest, done = _buffer_address(buf), _I64(0), 0
    for at in range(0, n_all, size):
        part = hits[at:at + size]
        for key, v in into.items():
            setattr(c, key, v.ctypes.data + done * v.itemsize)
        c.n_items = 0
        k = _lib.logscan_topo(addr, length, _ptr(part), len(part), int(any_message), ctypes.byref(c), _ptr(rest),
                              ctypes.byref(n_rest))
        yield ({**{key: v[:k] for key, v in cols.items()}, **{key: v[done:done + k] for key, v in into.items()}},
               {key: v[:c.n_items] for key, v in items.items()}, rest[:n_rest.value])
        done += k


def topo_lines(buf, length: int, hits: np.ndarray, any_message: bool = False
               ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """:func:`topo_chunks` of ``hits`` in one stretch, its arrays copied: ``(columns, rest)``,
    ``columns`` those of ``TOPO_DTYPES`` and of ``TOPO_ITEM_DTYPES`` together."""
    for cols, items, rest in topo_chunks(buf, length, hits, any_message, chunk=len(hits)):
        return {**{k: v.copy() for k, v in cols.items()}, **{k: v.copy() for k, v in items.items()}}, rest.copy()
    return {**{k: np.empty(0, dt) for k, dt in TOPO_DTYPES.items()},
            **{k: np.empty(0, dt) for k, dt in TOPO_ITEM_DTYPES.items()}}, np.empty(0, np.int64)


_lib.logscan_count.restype = None
_lib.logscan_count.argtypes = [_P, _I64, ctypes.POINTER(_I64), ctypes.POINTER(_I64)]


def line_count(buf, length: int) -> tuple[int, int]:
    """(lines, lines holding more than blanks) of ``buf``."""
    n, full = _I64(0), _I64(0)
    if length:
        _lib.logscan_count(_buffer_address(buf), length, ctypes.byref(n), ctypes.byref(full))
    return n.value, full.value


_lib.logscan_presence.restype = ctypes.c_int
_lib.logscan_presence.argtypes = [_P, _I64, ctypes.c_char_p, _P, _P, ctypes.c_int32, _P]


PRESENCE_MAX = 1024         # needles per logscan_presence pass (logscan.h)


def first_offsets(buf, length: int, needles: list[bytes]) -> list[int]:
    """The first offset of each needle in ``buf`` (-1: absent), found in one pass (at most
    1024 needles per pass; each of 2 bytes or more)."""
    out: list[int] = []
    for k in range(0, len(needles), PRESENCE_MAX):
        part = needles[k:k + PRESENCE_MAX]
        blob = b"".join(part)
        off = np.cumsum([0] + [len(x) for x in part[:-1]]).astype(np.int64)
        lens = np.array([len(x) for x in part], np.int32)
        first = np.full(len(part), -1, np.int64)
        if length and _lib.logscan_presence(_buffer_address(buf), length, blob, _ptr(off), _ptr(lens), len(part),
                                            _ptr(first)) < 0:
            raise ValueError("first_offsets: bad needles")
        out += [int(x) for x in first]
    return out


def line_hits(buf, length: int, needle: bytes, chunk: int = 1 << 14, start: int = 0) -> np.ndarray:
    """Offsets of the first ``needle`` in each line that holds one, in file order (from byte
    ``start``: the needle's first offset, where known)."""
    addr = _buffer_address(buf)
    parts, pos, nxt = [], max(0, start), _I64(0)
    while pos < length:
        out = np.empty(chunk, np.int64)
        n = _lib.logscan_hits(addr, length, pos, needle, len(needle), _ptr(out), chunk, ctypes.byref(nxt))
        parts.append(out[:n])
        if nxt.value <= pos:
            break
        pos = nxt.value
        chunk = min(chunk * 4, 1 << 22)
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def line_spans(buf, length: int, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, 1-based line number) of the lines holding the sorted offsets ``pos``."""
    pos = np.ascontiguousarray(pos, np.int64)
    start, end, line = (np.empty(len(pos), np.int64) for _ in range(3))
    if len(pos) and _lib.logscan_spans(_buffer_address(buf), length, _ptr(pos), len(pos), _ptr(start), _ptr(end),
                                       _ptr(line)) < 0:
        raise ValueError("line_spans: offsets must be sorted and inside the buffer")
    return start, end, line


def _buffer_address(buf) -> int:
    """The address of a read-only buffer's bytes (bytes, bytearray, mmap, memoryview), for C
    that only reads them; the caller keeps ``buf`` alive for the call."""
    view = np.frombuffer(buf, np.uint8)
    return view.ctypes.data if len(view) else 0


FORMAT_PCAP = 1
FORMAT_PCAPNG = 2


def _ptr(arr: np.ndarray) -> int:
    assert arr.flags.c_contiguous
    return arr.ctypes.data


class RecordWalker:
    """Sequential walk over pcap/pcapng records, a buffer at a time."""

    def __init__(self, fmt: int, swapped: bool = False, nsec: bool = False,
                 linktype: int = 0, snaplen: int = 0):
        self._st = _lib.walk_new(fmt, int(swapped), int(nsec), linktype, snaplen)
        if not self._st:
            raise MemoryError("cannot allocate record walker")

    def __del__(self):
        st, self._st = getattr(self, "_st", None), None
        if st:
            _lib.walk_free(st)

    def walk(self, buf: np.ndarray, length: int, base: int, max_out: int):
        """Walk complete records in ``buf[:length]`` (file offset ``base``).

        Returns ``(columns, consumed)``; columns hold absolute data offsets.
        Raises CaptureFormatError on corrupt structure.
        """
        cols = {
            "data_off": np.empty(max_out, np.int64),
            "caplen": np.empty(max_out, np.uint32),
            "origlen": np.empty(max_out, np.uint32),
            "ts_ns": np.empty(max_out, np.int64),
            "linktype": np.empty(max_out, np.int32),
        }
        c = WalkCols(**{k: _ptr(v) for k, v in cols.items()})
        consumed = _I64(0)
        n = _lib.walk_records(self._st, _ptr(buf), length, base, ctypes.byref(c), max_out,
                              ctypes.byref(consumed))
        if n < 0:
            raise CaptureFormatError(_lib.walk_error(self._st).decode())
        return {k: v[:n] for k, v in cols.items()}, consumed.value

    def counters(self) -> dict[str, int]:
        out = np.zeros(5, np.int64)
        _lib.walk_counters(self._st, _ptr(out))
        return dict(zip(("records", "blocks_skipped", "blocks_unknown", "sections", "interfaces"),
                        map(int, out)))


class TcpKernel:
    """The per-flow TCP state machine; state persists across ``run`` calls."""

    KEY_WORDS = 11   # ipver, flow1 address (4 words), flow1 port, flow2 address, flow2 port
    IN_DTYPES = {
        "frame": np.uint32, "ts": np.int64, "ipver": np.uint8, "src": np.uint32, "dst": np.uint32,
        "sport": np.uint16, "dport": np.uint16, "seq": np.uint32, "ack": np.uint32, "seglen": np.uint32, "win": np.uint16,
        "flags": np.uint16, "wscale": np.int8, "status": np.uint8,
    }
    OUT_DTYPES = {
        "key": np.uint32, "dir": np.uint8, "stream": np.uint32, "verdicts": np.uint32, "dupack_num": np.uint32,
        "dupack_frame": np.uint32, "acks_frame": np.uint32, "seq_rel": np.uint32,
        "ack_rel": np.uint32, "ack_rtt": np.int64, "rto": np.int64,
    }

    def __init__(self):
        self._st = _lib.tcpk_new()
        if not self._st:
            raise MemoryError("cannot allocate TCP kernel")

    def __del__(self):
        st, self._st = getattr(self, "_st", None), None
        if st:
            _lib.tcpk_free(st)

    def run(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(cols["frame"])
        ins = {k: np.ascontiguousarray(cols[k], dtype=dt) for k, dt in self.IN_DTYPES.items()}
        outs = {k: np.empty(n, dt) for k, dt in self.OUT_DTYPES.items()}
        if ins["src"].ndim == 2:
            assert ins["src"].shape[1] == 4 and ins["dst"].shape == ins["src"].shape
            words = 4
        else:
            words = 1      # an all-IPv4 batch passes one word per address
        c_in = TcpIn(addr_words=words, **{k: _ptr(v) for k, v in ins.items()})
        c_out = TcpOut(**{k: _ptr(v) for k, v in outs.items()})
        if _lib.tcpk_run(self._st, ctypes.byref(c_in), ctypes.byref(c_out), n) < 0:
            raise MemoryError(_lib.tcpk_error(self._st).decode())
        return outs

    def keys(self, start: int = 0) -> np.ndarray:
        """Endpoint pairs ``start..`` as rows of KEY_WORDS uint32 (index = key id - start)."""
        n = max(int(_lib.tcpk_nkeys(self._st)) - start, 0)
        out = np.zeros((n, self.KEY_WORDS), np.uint32)
        if n:
            _lib.tcpk_keys(self._st, start, _ptr(out), n)
        return out

    def nconv(self) -> int:
        return int(_lib.tcpk_nconv(self._st))

    def conversations(self) -> np.ndarray:
        """Per-conversation summaries as a numpy structured array (index = stream)."""
        n = _lib.tcpk_nconv(self._st)
        out = np.zeros(n, CONV_DTYPE)
        got = _lib.tcpk_convs(self._st, _ptr(out) if n else None, n)
        return out[:got]
