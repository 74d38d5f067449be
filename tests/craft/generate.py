#!/usr/bin/env python3
"""Writes the crafted captures under tests/fixtures/pcaps/crafted/ and the malformed ones
under tests/fixtures/pcaps/bad/, with a README line per file and MANIFEST.json (what each
crafted file is meant to exercise, checked against tshark by tests/forensics/tcp/test_tcp_oracle.py).

Run once after changing a scenario:  .venv/bin/python tests/craft/generate.py
The output is deterministic (no randomness, fixed timestamps), so regenerating an unchanged
scenario reproduces the committed bytes.
"""
from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from packets import NOP, Pkt  # noqa: E402
from scenarios import (FORMAT_DESC, FORMAT_VARIANTS, VERDICT_SCENARIOS, Scenario,  # noqa: E402
                       base_flow)
from writers import (LINKS, LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL2, custom_block, epb, idb,  # noqa: E402
                     shb, spb, ticks_of, unknown_block, write_pcap, write_pcap_scapy, _opt)

FIX = HERE.parent / "fixtures" / "pcaps"
CRAFTED = FIX / "crafted"
BAD = FIX / "bad"


def _write_cut(path, pkts, cut_frames, cut_len, link="eth"):
    """pcap where only the listed frames are cut to cut_len bytes (others complete)."""
    lk = LINKS[link]
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, lk.linktype)]
    for i, p in enumerate(pkts, 1):
        data = lk.frame(p)
        cap = data[:cut_len] if i in cut_frames else data
        sec, ns = divmod(p.t_ns, 1_000_000_000)
        out.append(struct.pack("<IIII", sec, ns // 1000, len(cap), len(data)) + cap)
    Path(path).write_bytes(b"".join(out))


def write_pcapng(path, pkts: list[Pkt], layout: str) -> list[int]:
    """Writes the layout; returns the frame number tshark gives each packet (custom blocks
    are records too: tshark 4.0 numbers them as frames)."""
    eth = LINKS["eth"]
    out = []
    frames = list(range(1, len(pkts) + 1))
    if layout in ("pcapng_2if", "pcapng_pow2", "pcapng_mixed_links"):
        r0 = 0x80 | 20 if layout == "pcapng_pow2" else 6
        out += [shb(), idb(LINKTYPE_ETHERNET, tsresol=r0, name="eth0")]
        if layout == "pcapng_mixed_links":
            out.append(idb(LINKTYPE_LINUX_SLL2, tsresol=9, name="any"))
            links = [eth, LINKS["sll2"]]
        else:
            out.append(idb(LINKTYPE_ETHERNET, tsresol=9, name="eth1"))
            links = [eth, eth]
        res = [r0, 9]
        for p in pkts:
            i = 0 if p.meta.get("side") == "c" else 1
            data = links[i].frame(p)
            out.append(epb(i, ticks_of(p.t_ns, res[i]), data, len(data)))
    elif layout == "pcapng_tsoffset":
        # interface 0 counts microseconds from if_tsoffset = 1_700_000_000 s (small ticks),
        # interface 1 is absolute nanoseconds: both must give the same absolute times
        off = 1_700_000_000
        out += [shb(), idb(LINKTYPE_ETHERNET, tsresol=6, name="eth0", tsoffset=off),
                idb(LINKTYPE_ETHERNET, tsresol=9, name="eth1")]
        for p in pkts:
            i = 0 if p.meta.get("side") == "c" else 1
            data = eth.frame(p)
            ticks = ticks_of(p.t_ns - off * 1_000_000_000, 6) if i == 0 else ticks_of(p.t_ns, 9)
            out.append(epb(i, ticks, data, len(data)))
    elif layout == "pcapng_spb":
        out += [shb(), idb(LINKTYPE_ETHERNET, snaplen=262144, tsresol=None)]
        for p in pkts:
            data = eth.frame(p)
            if p.meta.get("side") == "s":
                out.append(spb(data, len(data)))
            else:
                out.append(epb(0, ticks_of(p.t_ns, None), data, len(data)))
    elif layout == "pcapng_unknown":
        out += [shb(opts=_opt("<", 4, b"stallscope crafted")), idb(LINKTYPE_ETHERNET, tsresol=9, name="eth0")]
        for n, p in enumerate(pkts, 1):
            data = eth.frame(p)
            out.append(epb(0, ticks_of(p.t_ns, 9), data, len(data),
                           comment=f"frame {n}" if n % 4 == 0 else None))
            if n == 5:
                out.append(custom_block(32473, b"stallscope custom block payload"))
                frames[n:] = [f + 1 for f in frames[n:]]
            if n == 9:
                frames[n:] = [f + 1 for f in frames[n:]]
                out.append(unknown_block(0x80000001, b"\xde\xad\xbe\xef" * 5))
                out.append(custom_block(32473, b"not copyable", copyable=False))
            if n == 12:
                # Name Resolution Block: one IPv4 record + end of records
                rec = struct.pack("<HH", 1, 4 + 7) + bytes([10, 0, 0, 2]) + b"server\0" + b"\0"
                out.append(unknown_block(4, rec + struct.pack("<HH", 0, 0)))
    elif layout == "pcapng_2sections":
        half = len(pkts) // 2
        out += [shb("<"), idb(LINKTYPE_ETHERNET, tsresol=6, name="eth0", e="<")]
        for p in pkts[:half]:
            data = eth.frame(p)
            out.append(epb(0, ticks_of(p.t_ns, 6), data, len(data), e="<"))
        out += [shb(">"), idb(LINKTYPE_ETHERNET, tsresol=9, name="eth0", e=">")]
        for p in pkts[half:]:
            data = eth.frame(p)
            out.append(epb(0, ticks_of(p.t_ns, 9), data, len(data), e=">"))
    elif layout == "pcapng_be":
        out += [shb(">"), idb(LINKTYPE_ETHERNET, tsresol=9, e=">")]
        for p in pkts:
            data = eth.frame(p)
            out.append(epb(0, ticks_of(p.t_ns, 9), data, len(data), e=">"))
    else:
        raise ValueError(layout)
    Path(path).write_bytes(b"".join(out))
    return frames


def write_scenario(sc: Scenario, dirpath: Path) -> str:
    w = dict(sc.write)
    fmt = w.pop("fmt", None)
    if fmt:
        name = sc.name + ".pcapng"
        frames = write_pcapng(dirpath / name, sc.pkts, fmt)
        fr = {"acks_frame", "duplicate_ack_frame", "rto_frame"}
        sc.expect = [(frames[f - 1], c, frames[v - 1] if c in fr and v else v) for f, c, v in sc.expect]
        return name
    name = sc.name + ".pcap"
    if "cut_frames" in w:
        _write_cut(dirpath / name, sc.pkts, w["cut_frames"], w["cut_len"])
    elif w.pop("writer", None) == "scapy":
        write_pcap_scapy(dirpath / name, sc.pkts, nano=w.get("nano", False))
    else:
        write_pcap(dirpath / name, sc.pkts, **w)
    return name


def all_scenarios() -> list[Scenario]:
    out = [f() for f in VERDICT_SCENARIOS]
    for name, (v6, kw) in FORMAT_VARIANTS.items():
        pkts, exp = base_flow(v6)
        if name == "fmt_pcapng_spb":
            # the server's packets have no timestamp (time 0): the dup ACKs are "ancient",
            # so frame 10 is no fast retransmission but out-of-order (6.5 ms after frame 6)
            exp = [e for e in exp if e[0] != 10] + [(10, "out_of_order", 1), (10, "fast_retransmission", 0),
                                                     (7, "time_epoch_ns", 0)]
        out.append(Scenario(name, FORMAT_DESC[name] + " (the base flow of the fmt_* group)", pkts, exp,
                            write=dict(kw), group="base_flow_v6" if v6 else "base_flow"))
    return out


def write_bad(dirpath: Path, good_pcap: Path, good_pcapng: Path) -> dict:
    dirpath.mkdir(parents=True, exist_ok=True)
    files = {}
    (dirpath / "empty.pcap").write_bytes(b"")
    files["empty.pcap"] = "zero bytes"
    g = good_pcap.read_bytes()
    # cut in the middle of the 5th record's packet data
    off = 24
    for _ in range(4):
        off += 16 + struct.unpack_from("<I", g, off + 8)[0]
    (dirpath / "truncated_record.pcap").write_bytes(g[:off + 16 + 20])
    files["truncated_record.pcap"] = "valid pcap cut 20 bytes into the 5th record's packet data (4 complete records)"
    (dirpath / "truncated_record_header.pcap").write_bytes(g[:off + 7])
    files["truncated_record_header.pcap"] = "valid pcap cut 7 bytes into the 5th record header"
    (dirpath / "header_only.pcap").write_bytes(g[:24])
    files["header_only.pcap"] = "pcap global header only, no records (valid, empty capture)"
    (dirpath / "short_header.pcap").write_bytes(g[:10])
    files["short_header.pcap"] = "first 10 bytes of a pcap global header"
    # deterministic garbage
    x, buf = 0x12345678, bytearray()
    for _ in range(4096):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        buf.append(x >> 16 & 0xFF)
    (dirpath / "garbage.bin").write_bytes(bytes(buf))
    files["garbage.bin"] = "4096 pseudo-random bytes (LCG), no capture magic"
    (dirpath / "wrong_magic.pcap").write_bytes(b"\xd4\xc3\xb2\xa2" + g[4:])
    files["wrong_magic.pcap"] = "valid pcap whose first bytes are d4 c3 b2 a2 (one byte off the little-endian magic d4 c3 b2 a1)"
    (dirpath / "text.pcap").write_bytes(b"this is not a capture file\n" * 10)
    files["text.pcap"] = "ASCII text with a .pcap name"
    n = bytearray(good_pcapng.read_bytes())
    # corrupt the block total length of the 3rd block (first EPB): leading length != trailing
    off = 0
    for _ in range(2):
        off += struct.unpack_from("<I", n, off + 4)[0]
    struct.pack_into("<I", n, off + 4, 0x7FFFFFF0)
    (dirpath / "bad_block_length.pcapng").write_bytes(bytes(n))
    files["bad_block_length.pcapng"] = "pcapng whose first EPB has block total length 0x7FFFFFF0 (beyond the file)"
    n2 = bytearray(good_pcapng.read_bytes())
    struct.pack_into("<I", n2, off + 4, 13)
    (dirpath / "unaligned_block_length.pcapng").write_bytes(bytes(n2))
    files["unaligned_block_length.pcapng"] = "pcapng whose first EPB has block total length 13 (not a multiple of 4, smaller than an EPB)"
    nb = good_pcapng.read_bytes()
    (dirpath / "truncated_block.pcapng").write_bytes(nb[: len(nb) - 30])
    files["truncated_block.pcapng"] = "valid pcapng cut 30 bytes before its end (inside the last EPB)"
    return files


def _tshark_says(path: Path) -> str:
    import shutil
    import subprocess
    import tempfile
    if not shutil.which("tshark"):
        return "(tshark not installed)"
    env = dict(os.environ, WIRESHARK_CONFIG_DIR=tempfile.mkdtemp(prefix="sstcp-wsconf-"))
    r = subprocess.run(["tshark", "-n", "-r", str(path)], capture_output=True, text=True, env=env)
    err = " ".join(l.strip() for l in r.stderr.splitlines() if "dangerous" not in l).replace(str(path.parent) + "/", "")
    rows = len(r.stdout.splitlines())
    return f"rc={r.returncode}, {rows} packets printed" + (f"; {err}" if err else "")


def main() -> None:
    CRAFTED.mkdir(parents=True, exist_ok=True)
    for f in CRAFTED.iterdir():
        if f.suffix in (".pcap", ".pcapng"):
            f.unlink()
    manifest, readme = {}, []
    for sc in all_scenarios():
        name = write_scenario(sc, CRAFTED)
        manifest[name] = {"desc": sc.desc, "group": sc.group,
                          "expect": [[int(f), c, int(v)] for f, c, v in sc.expect]}
        readme.append(f"| `{name}` | {sc.desc} |")
    (CRAFTED / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    (CRAFTED / "README.md").write_text(
        "# Crafted captures\n\nGenerated by `tests/craft/generate.py` (deterministic; rerun after changing a "
        "scenario in `tests/craft/scenarios.py`). `MANIFEST.json` lists, per file, the (frame, column, value) "
        "facts the file is meant to exercise; "
        "`tests/forensics/tcp/test_tcp_oracle.py::test_crafted_capture_exercises_verdict` checks them "
        "against tshark 4.0.x. All times are after 2023-11-14T22:13:20Z except `syn_at_epoch0`. "
        "The `fmt_*` files carry one and the same flow in different formats and link types "
        "(`tests/forensics/pcap/test_pcap_formats.py` checks the engine gives identical answers for all of them).\n\n"
        "| file | exercises |\n|---|---|\n" + "\n".join(readme) + "\n")
    bad = write_bad(BAD, CRAFTED / "fast_retransmission.pcap", CRAFTED / "fmt_pcapng_unknown_blocks.pcapng")
    (BAD / "README.md").write_text(
        "# Malformed capture files\n\nGenerated by `tests/craft/generate.py` from crafted captures. For error-handling "
        "tests (the analyzer must fail with one clear line, or handle the valid-but-empty ones). The last column is "
        "what `tshark -r FILE` (4.0.17) does with it, for reference.\n\n"
        "| file | what is wrong | tshark 4.0.17 |\n|---|---|---|\n"
        + "\n".join(f"| `{k}` | {v} | {_tshark_says(BAD / k)} |" for k, v in bad.items()) + "\n")
    print(f"wrote {len(manifest)} crafted captures to {CRAFTED} and {len(bad)} bad files to {BAD}")


if __name__ == "__main__":
    main()
