"""Seeded mutators: real samples in, damaged but still plausible inputs out.

Every function takes a ``random.Random`` so a run is reproducible from its seed. Three
families, mixed by :func:`mutate`:

- bytes: bit flips, interesting integers written over length and type fields (the
  binary containers: pcap, pcapng, pickle, tar), cuts, deleted/duplicated ranges,
  splices of two samples;
- lines: a few lines drawn from all samples of a format, each kept, cut, spliced with
  another, given random bytes or tokens parsers trip on (huge and negative numbers,
  nan, separators, brackets, NUL, invalid UTF-8), numbers rewritten;
- JSON: a line or document that parses as JSON gets values of the wrong type or size,
  keys dropped or added, containers nested — what a tracer or writer of a different
  version (or a bug) emits.

Sizes are bounded (``MAX_BYTES``) so no input can make a parser legitimately slow.
"""
from __future__ import annotations

import json
import random
import re
import struct

MAX_BYTES = 64 * 1024

TOKENS = [b" ", b"  ", b"\t", b":", b"=", b",", b";", b"|", b"-", b"-1", b"0", b"1", b"nan", b"NaN", b"inf",
          b"-inf", b"1e308", b"1e999", b"0x", b"0xffffffffffffffff", b"18446744073709551616",
          b"9223372036854775808", b"-9223372036854775809", b"99999999999999999999999999", b"[", b"]", b"{",
          b"}", b"(", b")", b'"', b"'", b"\\", b"\x00", b"\xff", b"\xc3(", b"\xe2\x82", b"\r", b"\n", b"%s",
          b"%n", b"\xef\xbb\xbf", b"null", b"true", b"None", b"#", b"//", b"NCCL", b"INFO", b"WARN"]

INTERESTING_INTS = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
                    0xFFFFFFFF, 0xFFFFFFFC, 0xFFFFFFF0, 12, 24, 28, 32, 64, 65535, 262144]

JSON_VALUES = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 63, 2 ** 64, -(2 ** 63) - 1, 10 ** 30, 1.5, -0.0,
               float("nan"), float("inf"), "", "x", "0x", "0xffffffffffffffffff", "-1", "nan", "\u0000",
               "\udcff", "é" * 3, [], [1, "a"], {}, {"a": 1}, [[[]]], {"ev": None}]


# ------------------------------------------------------------------ bytes

def flip_bits(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return bytes([rng.randrange(256)])
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def set_bytes(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        b[rng.randrange(len(b))] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
    return bytes(b)


def write_int(rng: random.Random, data: bytes) -> bytes:
    """An interesting 16/32/64-bit value over a random (often 4-aligned) offset."""
    if len(data) < 2:
        return data
    fmt = rng.choice(("<H", ">H", "<I", ">I", "<Q", "<i"))
    size = struct.calcsize(fmt)
    if len(data) < size:
        return data
    off = rng.randrange(0, len(data) - size + 1)
    if rng.random() < 0.6:
        off -= off % 4
    v = rng.choice(INTERESTING_INTS + [len(data), len(data) - off, rng.randrange(1 << 16)])
    if fmt == "<i":
        v = rng.choice((-1, -2, -(1 << 31)))
    v &= (1 << (8 * size)) - 1 if fmt != "<i" else 0xFFFFFFFF
    packed = struct.pack(fmt.replace("i", "I"), v) if fmt == "<i" else struct.pack(fmt, v)
    return data[:off] + packed + data[off + size:]


def cut(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def delete_range(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randint(1, min(64, len(data) - i)):]


def duplicate_range(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    j = min(len(data), i + rng.randint(1, 256))
    return data[:j] + data[i:j] * rng.randint(1, 3) + data[j:]


def insert_random(rng: random.Random, data: bytes) -> bytes:
    i = rng.randrange(len(data) + 1)
    blob = rng.choice(TOKENS) if rng.random() < 0.5 else rng.randbytes(rng.randint(1, 16))
    return data[:i] + blob + data[i:]


def splice(rng: random.Random, data: bytes, other: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1):]


BYTE_OPS = (flip_bits, set_bytes, write_int, cut, delete_range, duplicate_range, insert_random)


def mutate_bytes(rng: random.Random, seeds: list[bytes], rounds: int | None = None) -> bytes:
    data = rng.choice(seeds)
    for _ in range(rounds or rng.choice((1, 1, 1, 2, 3, 5))):
        if rng.random() < 0.1 and len(seeds) > 1:
            data = splice(rng, data, rng.choice(seeds))
        else:
            data = rng.choice(BYTE_OPS)(rng, data)
    return data[:MAX_BYTES]


# ------------------------------------------------------------------ lines

_NUM = re.compile(rb"-?\d+(?:\.\d+)?")


def renumber(rng: random.Random, line: bytes) -> bytes:
    hits = list(_NUM.finditer(line))
    if not hits:
        return line
    m = rng.choice(hits)
    new = rng.choice([b"0", b"-1", b"-0", b"1.5", b"nan", b"inf", b"4294967296", b"18446744073709551615",
                      b"18446744073709551616", b"99999999999999999999999", b"1e400", b"00", b"0x10",
                      str(rng.randrange(1 << 20)).encode()])
    return line[: m.start()] + new + line[m.end():]


def mutate_line(rng: random.Random, line: bytes, pool: list[bytes]) -> bytes:
    op = rng.randrange(9)
    if op <= 1 or not line:
        return line
    i = rng.randrange(len(line) + 1)
    if op == 2:
        return line[:i]
    if op == 3:
        j = rng.randrange(i, len(line) + 1)
        return line[:i] + rng.randbytes(rng.randint(0, 8)) + line[j:]
    if op == 4:
        return line[:i] + rng.choice(TOKENS) + line[i:]
    if op == 5:
        other = rng.choice(pool)
        return line[:i] + other[rng.randrange(len(other) + 1):]
    if op == 6:
        return renumber(rng, line)
    if op == 7:
        return json_line(rng, line)
    return line * rng.randint(2, 4)


def mutate_lines(rng: random.Random, pool: list[bytes], max_lines: int = 20) -> bytes:
    """A small document: a few mutated lines drawn from every sample of the format."""
    n = rng.choice((1, 2, 3, 5, 8, max_lines))
    if rng.random() < 0.5:         # a run of consecutive lines keeps multi-line structure
        start = rng.randrange(len(pool))
        lines = pool[start:start + n]
    else:
        lines = [rng.choice(pool) for _ in range(n)]
    out = [mutate_line(rng, ln, pool) for ln in lines]
    sep = rng.choice((b"\n", b"\n", b"\n", b"\r\n", b"\r"))
    return sep.join(out)[:MAX_BYTES] + (b"\n" if rng.random() < 0.7 else b"")


def mutate_document(rng: random.Random, seeds: list[bytes], pool: list[bytes]) -> bytes:
    """A whole sample with a few of its lines mutated, dropped, duplicated or moved."""
    lines = rng.choice(seeds).splitlines()
    for _ in range(rng.randint(1, 4)):
        if not lines:
            break
        i = rng.randrange(len(lines))
        op = rng.randrange(4)
        if op == 0:
            lines[i] = mutate_line(rng, lines[i], pool)
        elif op == 1:
            del lines[i]
        elif op == 2:
            lines.insert(i, lines[i])
        else:
            lines.insert(rng.randrange(len(lines) + 1), lines.pop(i))
    return b"\n".join(lines)[:MAX_BYTES]


# ------------------------------------------------------------------ JSON

def json_value(rng: random.Random, depth: int = 0):
    v = rng.choice(JSON_VALUES)
    if depth < 2 and rng.random() < 0.15:
        v = [json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))] if rng.random() < 0.5 else \
            {rng.choice(["ev", "t", "pid", "rank", "x", ""]): json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return v


def mutate_json(rng: random.Random, obj, depth: int = 0):
    """The parsed value with one to a few of its leaves or keys damaged."""
    if isinstance(obj, dict) and obj:
        obj = dict(obj)
        for _ in range(rng.randint(1, 3)):
            k = rng.choice(list(obj))
            op = rng.randrange(5)
            if op == 0:
                del obj[k]
            elif op == 1 and depth < 6:
                obj[k] = mutate_json(rng, obj[k], depth + 1)
            elif op == 2:
                obj[rng.choice(["extra", "", "ev", "t", f"{k}_"])] = json_value(rng)   # a pickle may key by int
            else:
                obj[k] = json_value(rng)
            if not obj:
                break
        return obj
    if isinstance(obj, list) and obj:
        obj = list(obj)
        i = rng.randrange(len(obj))
        op = rng.randrange(4)
        if op == 0:
            del obj[i]
        elif op == 1 and depth < 6:
            obj[i] = mutate_json(rng, obj[i], depth + 1)
        elif op == 2:
            obj.insert(i, json_value(rng))
        else:
            obj = obj * rng.randint(2, 3)
        return obj
    return json_value(rng)


def dumps(rng: random.Random, obj) -> bytes:
    try:
        return json.dumps(obj, ensure_ascii=rng.random() < 0.5, separators=(",", ":")).encode("utf-8",
                                                                                               "surrogatepass")
    except (ValueError, RecursionError):
        return b"{}"


def json_line(rng: random.Random, line: bytes) -> bytes:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return line
    return dumps(rng, mutate_json(rng, obj))


def mutate_json_document(rng: random.Random, seeds: list[bytes]) -> bytes:
    data = rng.choice(seeds)
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return mutate_bytes(rng, [data])
    for _ in range(rng.randint(1, 4)):
        obj = mutate_json(rng, obj)
    return dumps(rng, obj)[:MAX_BYTES]


# ------------------------------------------------------------------ the mix

def mutate(rng: random.Random, seeds: list[bytes], pool: list[bytes] | None = None, *, text: bool = True,
           json_docs: bool = False, whole: float = 0.35) -> bytes:
    """One input. Text formats: a small document of mutated lines, or (with probability
    ``whole``) a whole sample mutated line-wise, JSON-structurally or byte-wise; binary
    formats: byte-level mutations of a sample. A few random blobs and empty inputs."""
    r = rng.random()
    if r < 0.03:
        return rng.randbytes(rng.randint(0, 512))
    if r < 0.05:
        return b""
    if not (text and pool):
        return mutate_bytes(rng, seeds)
    if rng.random() >= whole:
        return mutate_lines(rng, pool)
    r = rng.random()
    if json_docs and r < 0.4:
        return mutate_json_document(rng, seeds)
    if r < 0.7:
        return mutate_document(rng, seeds, pool)
    return mutate_bytes(rng, seeds)


def line_pool(seeds: list[bytes]) -> list[bytes]:
    return [ln for s in seeds for ln in s.splitlines()] or [b""]
