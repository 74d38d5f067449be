"""tshark 4.0.x as the oracle for the TCP analysis engine.

``oracle_packets(path)`` runs tshark exactly as reference/TCP_ANALYSIS.md section 2.1
prescribes (empty personal configuration, never ``-M``, first-occurrence fields) and
returns a DataFrame with the column names of ``forensics.tcp.analyze_file(path).packets``.
``compare(ours, oracle)`` aligns both on ``frame`` and lists every disagreement.

tshark is slow, so its raw output is cached per (file content, tshark version, field list)
in a directory under the system temp dir (override with ``STALLSCOPE_ORACLE_CACHE``; set it
to an empty string to disable caching).
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

# -- the oracle's fields ------------------------------------------------------------------

# (tshark field, column) for the fields that are copied as numbers.
_NUMERIC_FIELDS = [
    ("frame.number", "frame"),
    ("tcp.stream", "stream"),
    ("tcp.srcport", "sport"),
    ("tcp.dstport", "dport"),
    ("tcp.seq_raw", "seq_raw"),
    ("tcp.ack_raw", "ack_raw"),
    ("tcp.seq", "seq_rel"),
    ("tcp.ack", "ack_rel"),
    ("tcp.len", "len"),
    ("tcp.window_size_value", "window"),
    ("tcp.analysis.duplicate_ack_num", "duplicate_ack_num"),
    ("tcp.analysis.duplicate_ack_frame", "duplicate_ack_frame"),
    ("tcp.analysis.acks_frame", "acks_frame"),
    ("tcp.analysis.rto_frame", "rto_frame"),
]

# Verdicts: present -> 1, absent -> 0.  Column = field without the "tcp.analysis." prefix.
VERDICTS = [
    "retransmission",
    "fast_retransmission",
    "spurious_retransmission",
    "out_of_order",
    "lost_segment",
    "ack_lost_segment",
    "duplicate_ack",
    "zero_window",
    "zero_window_probe",
    "zero_window_probe_ack",
    "window_full",
    "window_update",
    "keep_alive",
    "keep_alive_ack",
    "reused_ports",
]

# Durations printed as seconds with 9 decimals; converted to int nanoseconds (0 = absent).
_DURATION_FIELDS = [
    ("tcp.analysis.ack_rtt", "ack_rtt_ns"),
    ("tcp.analysis.rto", "rto_ns"),
    ("tcp.analysis.initial_rtt", "initial_rtt_ns"),
]

FIELDS = (
    ["frame.number", "frame.time_epoch", "tcp.stream", "ip.src", "ipv6.src", "tcp.srcport",
     "ip.dst", "ipv6.dst", "tcp.dstport", "tcp.seq_raw", "tcp.ack_raw", "tcp.seq", "tcp.ack",
     "tcp.len", "tcp.flags", "tcp.flags.reset", "tcp.window_size_value", "frame.protocols"]
    + ["tcp.analysis." + v for v in VERDICTS]
    + ["tcp.analysis.duplicate_ack_num", "tcp.analysis.duplicate_ack_frame",
       "tcp.analysis.acks_frame", "tcp.analysis.ack_rtt", "tcp.analysis.rto",
       "tcp.analysis.rto_frame", "tcp.analysis.initial_rtt"]
)

PREFS = [
    "tcp.analyze_sequence_numbers:TRUE",
    "tcp.relative_sequence_numbers:TRUE",
    "tcp.fastrt_supersedes_ooo:TRUE",
    "ip.tso_support:TRUE",
]

# The columns the engine must produce and that compare() checks.  `stream` is compared
# through a bijection, the rest value by value.
COMPARED_COLUMNS = (
    ["time_epoch_ns", "src", "dst", "sport", "dport", "seq_raw", "ack_raw", "seq_rel",
     "ack_rel", "len", "rst"]
    + VERDICTS
    + ["duplicate_ack_num", "duplicate_ack_frame", "acks_frame"]
)
# Compared too when the engine happens to produce them (not part of the contract).
OPTIONAL_COLUMNS = ["flags", "window", "rto_frame", "ack_rtt_ns", "rto_ns", "initial_rtt_ns"]


class OracleUnavailable(RuntimeError):
    """tshark is missing or is not the pinned 4.0.x series."""


@dataclass(frozen=True)
class TsharkInfo:
    path: str
    version: str          # e.g. "4.0.17"
    version_line: str     # first line of `tshark --version`


_INFO: TsharkInfo | None = None


def tshark_info() -> TsharkInfo:
    """The tshark on PATH, checked to be 4.0.x; raises OracleUnavailable otherwise."""
    global _INFO
    if _INFO is not None:
        return _INFO
    path = shutil.which("tshark")
    if path is None:
        raise OracleUnavailable("tshark not found on PATH (apt-get install tshark; the TCP oracle is tshark 4.0.x)")
    proc = subprocess.run([path, "--version"], capture_output=True, text=True, env=_env(), timeout=60)
    line = (proc.stdout.splitlines() or [""])[0].strip()
    m = re.search(r"TShark \(Wireshark\) (\d+\.\d+\.\d+)", line)
    if proc.returncode != 0 or not m:
        raise OracleUnavailable(f"cannot read the tshark version from {line!r} (rc={proc.returncode})")
    version = m.group(1)
    if not version.startswith("4.0."):
        raise OracleUnavailable(
            f"tshark {version} is not 4.0.x: TCP analysis rules differ between versions "
            f"(TCP_ANALYSIS.md section 1.8), the oracle is pinned to 4.0.x")
    _INFO = TsharkInfo(path, version, line)
    return _INFO


_CONFIG_DIR: str | None = None


def _env() -> dict:
    """Environment with an empty personal configuration directory (no user preferences)."""
    global _CONFIG_DIR
    if _CONFIG_DIR is None or not os.path.isdir(_CONFIG_DIR) or os.listdir(_CONFIG_DIR):
        _CONFIG_DIR = tempfile.mkdtemp(prefix="sstcp-wsconf-")
    env = dict(os.environ)
    env["WIRESHARK_CONFIG_DIR"] = _CONFIG_DIR
    env.pop("WIRESHARK_DEBUG_WMEM_OVERRIDE", None)
    env["LC_ALL"] = "C"
    return env


def tshark_command(path: str | os.PathLike) -> list[str]:
    cmd = [tshark_info().path, "-n", "-r", str(path)]
    for p in PREFS:
        cmd += ["-o", p]
    # occurrence=a instead of TCP_ANALYSIS.md's occurrence=f: every field is reduced to its
    # first occurrence in parse_tsv() (identical to occurrence=f), except the addresses, which
    # are taken from the IP header that carries the TCP header (see _carrying_ip()).
    cmd += ["-Y", "tcp", "-T", "fields", "-E", "header=y", "-E", "separator=/t",
            "-E", "occurrence=a", "-E", "aggregator=,", "-E", "quote=n"]
    for f in FIELDS:
        cmd += ["-e", f]
    return cmd


def _cache_dir() -> Path | None:
    d = os.environ.get("STALLSCOPE_ORACLE_CACHE")
    if d == "":
        return None
    p = Path(d) if d else Path(tempfile.gettempdir()) / "stallscope-oracle-cache"
    p.mkdir(parents=True, exist_ok=True)
    return p


def _cache_key(path: Path) -> str:
    h = hashlib.sha256()
    h.update(tshark_info().version_line.encode())
    h.update("\0".join(tshark_command("-")).encode())   # fields, preferences and -E options
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_tshark(path: str | os.PathLike, use_cache: bool = True) -> str:
    """Raw TSV output of tshark for `path` (cached by content unless use_cache=False)."""
    path = Path(path)
    cache = _cache_dir() if use_cache else None
    key = _cache_key(path) if cache else None
    if cache:
        hit = cache / f"{key}.tsv"
        if hit.exists():
            return hit.read_text()
    proc = subprocess.run(tshark_command(path), capture_output=True, text=True, env=_env(), timeout=900)
    if proc.returncode != 0:
        err = "\n".join(l for l in proc.stderr.splitlines() if "dangerous" not in l)
        raise RuntimeError(f"tshark failed on {path} (rc={proc.returncode}): {err[-2000:]}")
    if cache:
        tmp = cache / f"{key}.tsv.{os.getpid()}.tmp"
        tmp.write_text(proc.stdout)
        os.replace(tmp, cache / f"{key}.tsv")
    return proc.stdout


def seconds_to_ns(s: str) -> int:
    """'1270661369.782934000' -> 1270661369782934000 exactly (no float rounding)."""
    if s == "":
        return 0
    neg = s.startswith("-")
    if neg:
        s = s[1:]
    whole, _, frac = s.partition(".")
    ns = int(whole or "0") * 1_000_000_000 + int((frac + "000000000")[:9])
    return -ns if neg else ns


def _to_int(s: str) -> int:
    if s == "":
        return 0
    return int(s, 0) if s.startswith("0x") else int(s)


# Which IP header's addresses go into src/dst:
#   "carrying": the IPv4/IPv6 header directly in front of the (first) TCP header, i.e. the
#               addresses of the TCP conversation: the inner header of a tunnel (GRE, VXLAN,
#               IP-in-IP), the quoted header of an ICMP error;
#   "first":    the first ip.src/ipv6.src of the frame (what `-E occurrence=f` prints: the
#               outer tunnel endpoints).
ADDRESS_LAYER = os.environ.get("STALLSCOPE_ORACLE_ADDRESS_LAYER", "carrying")


def _carrying_ip(protocols: str, v4: str, v6: str, which: str = ADDRESS_LAYER) -> str:
    """Pick one address from the comma-joined ip.X / ipv6.X occurrence lists."""
    l4 = [a for a in v4.split(",") if a]
    l6 = [a for a in v6.split(",") if a]
    if which == "first" or not protocols:
        return (l4 or l6 or [""])[0]
    layers = protocols.split(":")
    cut = layers.index("tcp") if "tcp" in layers else len(layers)
    before = layers[:cut]
    n4, n6 = before.count("ip"), before.count("ipv6")
    last = max((i for i, p in enumerate(before) if p in ("ip", "ipv6")), default=None)
    if last is None:
        return (l4 or l6 or [""])[0]
    if before[last] == "ip":
        return l4[n4 - 1] if 0 < n4 <= len(l4) else ""
    return l6[n6 - 1] if 0 < n6 <= len(l6) else ""


def parse_tsv(text: str) -> pd.DataFrame:
    raw = pd.read_csv(io.StringIO(text), sep="\t", dtype=str, keep_default_na=False,
                      quoting=3, engine="python") if text.strip() else pd.DataFrame(columns=FIELDS)
    missing = [f for f in FIELDS if f not in raw.columns]
    if missing:
        raise RuntimeError(f"tshark output lacks columns {missing}")
    addr = {}
    for k in ("src", "dst"):
        addr[k] = [_carrying_ip(p, a, b) for p, a, b in
                   zip(raw["frame.protocols"], raw[f"ip.{k}"], raw[f"ipv6.{k}"])]
    # first occurrence of everything else (= -E occurrence=f)
    for f in FIELDS:
        raw[f] = raw[f].map(lambda v: v.split(",", 1)[0])
    out = pd.DataFrame(index=range(len(raw)))
    for field, col in _NUMERIC_FIELDS:
        out[col] = raw[field].map(_to_int).astype("int64")
    # a TCP header too short for a conversation (cut by the snaplen) has no tcp.stream:
    # -1, so that it cannot be confused with stream 0
    out["stream"] = raw["tcp.stream"].map(lambda v: int(v) if v != "" else -1).astype("int64")
    out["time_epoch_ns"] = raw["frame.time_epoch"].map(seconds_to_ns).astype("int64")
    out["src"] = addr["src"]
    out["dst"] = addr["dst"]
    out["flags"] = raw["tcp.flags"].map(_to_int).astype("int64")
    out["quoted_in_icmp"] = raw["frame.protocols"].map(_quoted_in_icmp)
    out["rst"] = raw["tcp.flags.reset"].map(lambda v: 1 if v in ("1", "True") else 0).astype("int64")
    for v in VERDICTS:
        out[v] = (raw["tcp.analysis." + v] != "").astype("int64")
    for field, col in _DURATION_FIELDS:
        out[col] = raw[field].map(seconds_to_ns).astype("int64")
    order = ["frame", "stream", "time_epoch_ns", "src", "dst", "sport", "dport", "seq_raw",
             "ack_raw", "seq_rel", "ack_rel", "len", "flags", "window", "rst"] + VERDICTS + [
        "duplicate_ack_num", "duplicate_ack_frame", "acks_frame", "rto_frame",
        "ack_rtt_ns", "rto_ns", "initial_rtt_ns", "quoted_in_icmp"]
    return out[order]


def _quoted_in_icmp(protocols: str) -> bool:
    layers = protocols.split(":")
    inner = layers[:layers.index("tcp")] if "tcp" in layers else layers
    return "icmp" in inner or "icmpv6" in inner


def engine_scope(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of tshark's ``-Y tcp`` output that are TCP packets the engine analyses.

    Two kinds of row are TCP to tshark's display filter but not packets whose flow
    can be analysed, and the engine leaves them out of its packet table (it counts
    them instead): TCP headers quoted inside ICMP errors (tshark never analyses them
    either, though it gives them a stream number), and headers cut before their 20
    bytes, by the snaplen or by the IP length (tshark shows only the ports: no
    stream, no analysis). Everything else must agree.
    """
    keep = (df["stream"] >= 0) & ~df["quoted_in_icmp"]
    return df[keep].drop(columns="quoted_in_icmp").reset_index(drop=True)


def oracle_packets(path: str | os.PathLike, use_cache: bool = True, all_rows: bool = False) -> pd.DataFrame:
    """tshark's view of the TCP frames of `path`, as a DataFrame (see module doc).

    By default only the rows in the engine's scope (:func:`engine_scope`);
    ``all_rows=True`` keeps every ``-Y tcp`` row (with a ``quoted_in_icmp`` column).
    """
    df = parse_tsv(run_tshark(path, use_cache=use_cache))
    return df if all_rows else engine_scope(df)


# -- comparison ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Mismatch:
    frame: int
    column: str
    ours: object
    tshark: object

    def __str__(self) -> str:
        return f"frame {self.frame}: {self.column}: ours={self.ours!r} tshark={self.tshark!r}"


def _norm(v):
    """Comparable scalar: numpy ints/bools -> int, NaN/None -> None, strings stay."""
    if v is None:
        return None
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    if isinstance(v, (bool,)):
        return int(v)
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def compare(ours: pd.DataFrame, oracle: pd.DataFrame, columns: list[str] | None = None) -> list[Mismatch]:
    """Every disagreement between the engine's packets and tshark's.

    - the set of frames must be identical (a missing/extra frame is one mismatch, column
      "<frame present>");
    - every column of `columns` (default COMPARED_COLUMNS, plus OPTIONAL_COLUMNS the engine
      happens to have) is compared value by value; a required column the engine lacks is
      one mismatch at frame 0;
    - `stream` must map bijectively: each of our streams corresponds to exactly one tshark
      stream and vice versa (tshark may count extra streams, e.g. for TCP quoted in ICMP).
    """
    cols = list(columns) if columns is not None else list(COMPARED_COLUMNS) + [
        c for c in OPTIONAL_COLUMNS if c in ours.columns]
    out: list[Mismatch] = []
    for c in cols + ["frame", "stream"]:
        if c not in ours.columns:
            out.append(Mismatch(0, c, "<column missing>", "<present>"))
    if any(m.column == "frame" for m in out):
        return out
    cols = [c for c in cols if c in ours.columns]

    if ours["frame"].duplicated().any():
        d = ours.loc[ours["frame"].duplicated(), "frame"].tolist()
        out.extend(Mismatch(int(f), "<duplicate frame row>", "dup", "unique") for f in d[:50])
        ours = ours.drop_duplicates("frame")
    a = ours.set_index("frame", drop=False)
    b = oracle.set_index("frame", drop=False)
    fa, fb = set(a.index.tolist()), set(b.index.tolist())
    for f in sorted(fa - fb):
        out.append(Mismatch(int(f), "<frame present>", True, False))
    for f in sorted(fb - fa):
        out.append(Mismatch(int(f), "<frame present>", False, True))
    common = sorted(fa & fb)
    a = a.loc[common]
    b = b.loc[common]

    for c in cols:
        av = a[c].tolist()
        bv = b[c].tolist()
        for f, x, y in zip(common, av, bv):
            x, y = _norm(x), _norm(y)
            if x != y:
                out.append(Mismatch(int(f), c, x, y))

    if "stream" in a.columns:
        fwd: dict = {}
        rev: dict = {}
        for f, x, y in zip(common, a["stream"].tolist(), b["stream"].tolist()):
            x, y = _norm(x), _norm(y)
            if fwd.setdefault(x, y) != y:
                out.append(Mismatch(int(f), "stream", x, f"{y} (our stream {x} already mapped to tshark {fwd[x]})"))
            elif rev.setdefault(y, x) != x:
                out.append(Mismatch(int(f), "stream", x, f"{y} (tshark stream {y} already mapped to our {rev[y]})"))
    out.sort(key=lambda m: (m.frame, m.column))
    return out


def format_mismatches(mismatches: list[Mismatch], limit: int = 40, label: str = "") -> str:
    if not mismatches:
        return f"{label}: engine agrees with tshark"
    by_col: dict[str, int] = {}
    for m in mismatches:
        by_col[m.column] = by_col.get(m.column, 0) + 1
    only_ours = [m.frame for m in mismatches if m.column == "<frame present>" and m.ours is True]
    only_tshark = [m.frame for m in mismatches if m.column == "<frame present>" and m.tshark is True]
    head = []
    if only_ours or only_tshark:
        head.append(f"  frame sets differ (later columns are misaligned from there): only ours {only_ours[:20]}"
                    f"{'...' if len(only_ours) > 20 else ''}, only tshark {only_tshark[:20]}"
                    f"{'...' if len(only_tshark) > 20 else ''}")
    lines = [f"{label}: {len(mismatches)} mismatches vs tshark "
             f"{_INFO.version if _INFO else '?'} (per column: "
             + ", ".join(f"{k}={v}" for k, v in sorted(by_col.items())) + ")"]
    lines += head
    lines += ["  " + str(m) for m in mismatches[:limit]]
    if len(mismatches) > limit:
        lines.append(f"  ... and {len(mismatches) - limit} more")
    return "\n".join(lines)


def assert_agrees(ours: pd.DataFrame, oracle: pd.DataFrame, label: str = "", exceptions=()) -> None:
    """Assert no mismatch except those listed in `exceptions` ((frame, column) pairs)."""
    allowed = set(exceptions)
    mm = [m for m in compare(ours, oracle) if (m.frame, m.column) not in allowed]
    assert not mm, format_mismatches(mm, label=label)
