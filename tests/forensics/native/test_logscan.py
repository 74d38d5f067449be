"""The C log scanner against the regular expressions it stands in for (forensics/native/logscan.c)."""
from __future__ import annotations

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.native import first_offsets, line_count, line_hits, line_spans
from forensics.parsers.nccl_coll import COLL_RE
from forensics.parsers.nccl_debug import NcclDebugParser
from forensics.parsers.nccl_grammar import LINE_RE
from forensics.parsers.registry import split_lines
from forensics.parsers.text import LogText

COLL = ("{pre}{host}:{pid}:{tid} [{dev}] NCCL INFO {op}: opCount {oc} sendbuff {sb} recvbuff {rb} count {cnt} "
        "datatype {dt} op {ro} root {root} comm {comm} [nranks={nr}] stream {stream}{tail}")
PTR = st.one_of(st.just("(nil)"), st.integers(1, 2 ** 64 - 1).map(lambda v: f"0x{v:x}"),
                st.sampled_from(["0x00ab", "0xABCD", "0x", "nil", "0x7f3-"]))


@st.composite
def coll_line(draw):
    return COLL.format(
        pre=draw(st.sampled_from(["", "0: ", "[1,3]<stdout>:", "[2025-08-12 01:37:03] ", "(pid=7) ", "x y ", "[3] ",
                                  "[Rank 3] ", "[Tue Jan 21 10:00:00 2025] ", "[2025-08-12]"])),
        host=draw(st.sampled_from(["node1", "", "gpu-a.b", "h_2"])), pid=draw(st.integers(0, 10 ** 7)),
        tid=draw(st.integers(0, 10 ** 7)), dev=draw(st.integers(0, 15)),
        op=draw(st.sampled_from(["AllReduce", "Send", "Recv", "AllGather", "Broadcast", "Weird_Op2"])),
        oc=draw(st.sampled_from(["0", "1a", "FFFF", "deadbeefdeadbeef", "1" * 17])), sb=draw(PTR), rb=draw(PTR),
        cnt=draw(st.one_of(st.integers(0, 10 ** 12), st.just(10 ** 19))), dt=draw(st.integers(0, 12)),
        ro=draw(st.integers(0, 9)), root=draw(st.integers(-1, 5)), comm=draw(PTR), nr=draw(st.integers(1, 512)),
        stream=draw(PTR), tail=draw(st.sampled_from(["", " ", "  \t"])))


def _python_rows(data: bytes) -> list[tuple]:
    """What the regular expressions read from the same lines (the parser's fallback path)."""
    rows = []
    for ln, text in enumerate(split_lines(data.decode()), 1):
        g = LINE_RE.search(text)
        if g is None or g["level"] != "INFO" or g["dev"] is None:
            continue
        c = COLL_RE.search(g["msg"].rstrip())
        if c is None:
            continue
        rows.append((ln, g["ts"], g["host"], int(g["pid"]), int(g["tid"]), int(g["dev"]), c["op_name"],
                     _i64(int(c["op_count"], 16)), _i64(int(c["count"])), int(c["datatype"]), int(c["red_op"]),
                     int(c["root"]), c["comm"], int(c["nranks"])))
    return rows


@settings(max_examples=300, deadline=None)
@given(st.lists(coll_line(), min_size=1, max_size=8), st.sampled_from(["\n", "\r\n", "\r"]))
def test_coll_lines_read_in_c_as_the_regular_expressions_read_them(lines, nl):
    data = nl.join(lines + ["plain output line"]).encode()
    # the text as given, not as pasted text is repaired (forensics.parsers.normalize): the C scanner
    # and the regular expressions are compared on the same bytes and lines
    r = NcclDebugParser.parse_text(LogText(data, "<bytes>", normalize=False), "<bytes>")
    c = r.tables["nccl_coll"]
    got = sorted(zip(c["line"], c["ts"], c["host"].fillna(""), c["pid"], c["tid"], c["dev"], c["op_name"],
                     [None if x is None or x is pd.NA else int(x) for x in c["op_count"]],
                     [None if x is pd.NA else int(x) for x in c["count"]], c["datatype"], c["red_op"], c["root"],
                     c["comm"], c["nranks"]), key=str)
    want = sorted(_python_rows(data), key=str)
    # a row the C scanner leaves (an odd pointer) the regular expressions read instead: the union is the same
    # the bracketed time is NCCL's (>= 2.26) only when the regular expression takes it too: "[3] " is a tag
    assert [(int(a), _plain(t), str(b), *map(_plain, rest)) for a, t, b, *rest in got] == want


def _plain(v):
    import pandas as pd
    return v if isinstance(v, str) else None if v is None or v is pd.NA or v != v else int(v)


def _i64(v: int):
    """What a typed (int64) column holds: None beyond its range."""
    return v if -(1 << 63) <= v < (1 << 63) else None


def test_positions_mode_keeps_the_last_line_of_each_process_and_communicator():
    lines = []
    for oc in (1, 2, 3):
        for pid, host in ((10, "a"), (10, "b"), (11, "a")):
            lines.append(COLL.format(pre="", host=host, pid=pid, tid=1, dev=0, op="AllReduce", oc=f"{oc:x}",
                                     sb="0x1", rb="0x1", cnt=oc * 10, dt=7, ro=0, root=0, comm="0xc0", nr=2, stream="0x5",
                                     tail=""))
    lines.insert(4, COLL.format(pre="", host="a", pid=10, tid=1, dev=0, op="AllReduce", oc="2", sb="0x1", rb="0x1",
                                cnt=99, dt=7, ro=0, root=0, comm="0xc0", nr=2, stream="0x5", tail=""))   # out of order
    text = LogText(("\n".join(lines) + "\n").encode(), "x")
    t = NcclDebugParser.parse_text(text, "x", coll="positions").tables["nccl_coll_last"]
    got = {(h, p): (oc, n, cnt) for h, p, oc, n, cnt in zip(t["host"], t["pid"], t["op_count"], t["lines"], t["count"])}
    assert got == {("a", 10): (3, 4, 30), ("b", 10): (3, 3, 30), ("a", 11): (3, 3, 30)}


def test_line_numbers_count_every_line_end_as_split_lines_does():
    data = b"a NCCL x\r\nb\rc NCCL y\n\nd\r\re NCCL z"
    hits = line_hits(data, len(data), b"NCCL")
    start, end, line = line_spans(data, len(data), hits)
    lines = split_lines(data.decode())
    assert [lines[i - 1] for i in line] == ["a NCCL x", "c NCCL y", "e NCCL z"]
    assert [data[s:e].decode() for s, e in zip(start, end)] == ["a NCCL x", "c NCCL y", "e NCCL z"]
    assert line_count(data, len(data)) == (len(lines), sum(1 for ln in lines if ln.strip()))


def test_first_offsets_finds_every_needle_in_one_pass():
    data = b"xx WorkNCCL yy NCCL WARN zz ProcessGroupNCCL.cpp" * 3
    needles = [b"WorkNCCL", b"NCCL WARN", b"ProcessGroupNCCL", b"absent!", b"zz"]
    assert first_offsets(data, len(data), needles) == [data.find(n) for n in needles]
    many = [f"k{i:03d}".encode() for i in range(70)]
    blob = b" ".join(many[::2])
    assert first_offsets(blob, len(blob), many) == [blob.find(n) for n in many]
    # past one call's 1024 needles, many sharing their first bytes (one table key), some
    # found only at the very end, some shorter than 4 bytes
    more = [f"kk{i:04d}".encode() for i in range(1100)] + [b"kk", b"k0", b"zz9"]
    blob = b"..".join(more[::3]) + b"kk1099"
    assert first_offsets(blob, len(blob), more) == [blob.find(n) for n in more]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(min_size=4, max_size=12), min_size=1, max_size=40), st.binary(max_size=300),
       st.lists(st.integers(0, 1000), max_size=8), st.booleans())
def test_first_offsets_agrees_with_find_where_every_needle_has_four_bytes(needles, noise, spots, short):
    """The 4-byte prefilter (every needle 4 bytes or more) and the per-position path (a short
    needle among them) both find what bytes.find finds: needles planted at random places,
    at the very start and in the last 8 bytes, overlapping, or absent."""
    data = bytearray(noise)
    for k, at in enumerate(spots):
        nd = needles[k % len(needles)]
        at %= len(data) + 1
        data[at:at] = nd
    data = bytes(data + needles[-1][:5] + needles[0])
    if short:
        needles = needles + [data[-3:-1] if len(data) >= 3 else b"zq"]
    assert first_offsets(data, len(data), needles) == [data.find(n) for n in needles]


def test_lines_with_selects_each_line_once():
    data = b"WorkNCCL and WorkNCCL\nnothing\nwatchdog WorkNCCL\n"
    t = LogText(data, "x")
    sel = t.lines_with([b"WorkNCCL", b"watchdog"])
    assert sel.line.tolist() == [1, 3]
    assert [x for _, x, _ in t.iter(sel)] == ["WorkNCCL and WorkNCCL", "watchdog WorkNCCL"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet=" \t\x0b\x0cab", max_size=40), st.sampled_from(["\n", "\r", "\r\n", ""])),
                max_size=12))
def test_line_count_counts_as_split_lines_does_on_long_and_blank_lines(parts):
    data = "".join(t + e for t, e in parts).encode()
    lines = split_lines(data.decode())
    lines = lines[:-1] if lines[-1] == "" else lines      # the last line counts without its terminator
    assert line_count(data, len(data)) == (len(lines), sum(1 for ln in lines if ln.strip()))
