"""Every reader of untrusted input, with its real samples and the contract it must keep.

A target turns one input (bytes) into a call of the real code path and checks what comes
back. The contract (issue 7): a result whose tables keep their schema and whose warnings
are one line each, or the project's own error (``StallscopeError``) with one line. Any
other exception is a crash; :mod:`fuzz.runner` records it with the input.

Seeds are real samples: ``tests/fixtures`` (parsers, pcaps), ``/work/shared/reference``
(verbatim format samples) when present, and the shipped bundles' ``events.jsonl`` and
``manifest.json``. Large samples are cut to their first ``SEED_BYTES`` (a cut sample is a
realistic input too).
"""
from __future__ import annotations

import functools
import json
import os
import pickle
import random
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from forensics.errors import InputError

from . import mutate as mu

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
REFERENCE = Path(os.environ.get("STALLSCOPE_REFERENCE", ROOT.parent / "shared" / "reference"))
SHARED_PCAPS = ROOT.parent / "shared" / "pcaps"
SEED_BYTES = 32 * 1024

# the file a malicious pickle would create if the unpickler ever ran what it names
PWNED = Path(tempfile.gettempdir()) / f"stallscope-fuzz-pwned-{os.getpid()}"


class ContractViolation(AssertionError):
    """The call returned, but what it returned breaks the contract."""


@dataclass
class Target:
    name: str
    seeds: Callable[[], list[bytes]]            # loaded lazily, once
    generate: Callable[[random.Random, "Target"], bytes]
    check: Callable[[bytes, "Workdir"], None]
    doc: str = ""
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def samples(self) -> list[bytes]:
        if "seeds" not in self._cache:
            s = [x[:SEED_BYTES] for x in self.seeds() if x is not None]
            if not s:
                raise RuntimeError(f"fuzz target {self.name}: no seed samples found")
            self._cache["seeds"] = s
            self._cache["pool"] = mu.line_pool(s)
        return self._cache["seeds"]

    @property
    def pool(self) -> list[bytes]:
        self.samples
        return self._cache["pool"]


class Workdir:
    """A scratch folder reused across inputs (files rewritten in place: cheap)."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else Path(tempfile.mkdtemp(prefix="stallscope-fuzz-"))
        self.path.mkdir(parents=True, exist_ok=True)
        self._own = path is None

    def file(self, name: str, data: bytes) -> Path:
        p = self.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return p

    def close(self) -> None:
        if self._own:
            shutil.rmtree(self.path, ignore_errors=True)


# ------------------------------------------------------------------ seeds

def _read(paths) -> list[bytes]:
    out = []
    for p in paths:
        try:
            if p.is_file() and p.suffix not in (".md", ".py"):
                with open(p, "rb") as fh:
                    out.append(fh.read(SEED_BYTES))
        except OSError:
            continue
    return out


def _fixture(folder: str, *patterns: str) -> list[Path]:
    base = FIXTURES / folder
    return sorted(p for pat in (patterns or ("**/*",)) for p in base.glob(pat))


def _reference(*names: str) -> list[Path]:
    return [REFERENCE / n for n in names if (REFERENCE / n).is_file()]


@functools.lru_cache(maxsize=None)
def bundle_members(suffix: str) -> tuple[bytes, ...]:
    """One member (e.g. ``bpf/events.jsonl``) of every shipped bundle, read straight from
    the archives (our own fixtures; their first SEED_BYTES * 4)."""
    out = []
    for arc in sorted((FIXTURES / "bundles").glob("*/*.tar.gz")):
        try:
            with tarfile.open(arc) as t:
                for m in t:
                    if m.isfile() and m.name.endswith("/" + suffix):
                        out.append(t.extractfile(m).read(SEED_BYTES * 4))
                        break
        except (OSError, tarfile.TarError):
            continue
    return tuple(out)


def _pcap_seeds(ext: str) -> list[bytes]:
    paths = _fixture("pcaps", f"*/*{ext}") + sorted(SHARED_PCAPS.glob(f"**/*{ext}"))
    return _read([p for p in paths if not p.name.endswith(".pcapng") or ext == ".pcapng"])


# ------------------------------------------------------------------ checks

def _one_line(what: str, text) -> None:
    if not isinstance(text, str) or not text.strip() or "\n" in text or "\r" in text:
        raise ContractViolation(f"{what} is not one line: {text!r:.300}")


def project_error(e: BaseException) -> bool:
    """The project's own error with one clear line: allowed."""
    from forensics.errors import StallscopeError
    if isinstance(e, StallscopeError):
        _one_line("error message", str(e))
        return True
    return False


def check_parser(name: str):
    def check(data: bytes, work: Workdir) -> None:
        from forensics.parsers import get
        p = get(name)
        p.sniff(data[:8192])                      # sniffers run on every file of a bundle
        r = p.parse(data)
        if r.parser != name or set(r.tables) != set(p.SCHEMAS):
            raise ContractViolation(f"{name}: result names {r.parser!r} / tables {sorted(r.tables)}")
        for t, df in r.tables.items():
            if list(df.columns) != list(p.SCHEMAS[t]):
                raise ContractViolation(f"{name}: table {t} has columns {list(df.columns)}")
        for w in r.warnings:
            _one_line("warning", w)
        json.dumps(r.facts, default=str)          # facts go into the report's JSON
    return check


def check_ib_tree(data: bytes, work: Workdir) -> None:
    """ib/ is parsed as a folder: counter files of phases, devices and ports together."""
    from forensics.parsers import get
    root = work.path / "ib"
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(data[:64])
    for i, part in enumerate(data.split(b"\n\n\n")[:6]):
        phase = rng.choice(["start", "end", "x"])
        name = rng.choice(["perfquery-x-mlx5_0-1.txt", "sysfs-mlx5_0-1.txt", "perfquery-mlx5_1-1.txt", "odd"])
        work.file(f"ib/{phase}/{i}-{name}", part)
    r = get("ib_counters").parse(root)
    for w in r.warnings:
        _one_line("warning", w)
    from forensics.parsers.ib_counters import ib_deltas
    df = r.tables.get("ib_counters")
    if df is not None and len(df):
        ib_deltas(df)


def check_pcap(data: bytes, work: Workdir) -> None:
    from forensics.tcp import analyze_file
    path = work.file("input.pcap", data)
    res = analyze_file(path, keep="flagged" if data[-1:] != b"\x00" else "all")
    for w in res.stats.defects + res.stats.warnings:
        _one_line("capture defect/warning", w)
    if res.packets is not None and len(res.packets) and res.packets["frame"].max() > res.stats.frames:
        raise ContractViolation("packet frame numbers beyond the frames read")


def _folder_bundle(work: Workdir, manifest: bytes | None, events: bytes | None) -> Path:
    root = work.path / "stallscope-fuzz-20260101T000000Z"
    shutil.rmtree(root, ignore_errors=True)
    (root / "bpf").mkdir(parents=True)
    if manifest is not None:
        (root / "manifest.json").write_bytes(manifest)
    if events is not None:
        (root / "bpf" / "events.jsonl").write_bytes(events)
    return root


MINIMAL_MANIFEST = json.dumps({
    "schema_version": 1, "host": "fuzz", "started_ns": 1_700_000_000_000_000_000,
    "ended_ns": 1_700_000_010_000_000_000, "options": {"pcap": False},
    "clock_samples": [{"monotonic_ns": 11_000_000_000_000, "realtime_ns": 1_700_000_000_000_000_000}],
    "collectors": {"tracer": {"status": "ok", "started_ns": 1_700_000_000_000_000_000}},
    "processes": [{"pid": 30849, "rank": 0, "world_size": 4}, {"pid": 30850, "rank": 1, "world_size": 4}],
}).encode()


def check_bpf_events(data: bytes, work: Workdir) -> None:
    from forensics.inputs.bundle import Bundle
    root = _folder_bundle(work, MINIMAL_MANIFEST, data)
    with Bundle.open(root) as b:
        ev = b.read_bpf_events()
        if not all(isinstance(e, dict) and isinstance(e.get("ev"), str) for e in ev):
            raise ContractViolation("read_bpf_events returned a record without a string 'ev'")
        for p in b.problems:
            _one_line("bundle problem", p)


def check_bpf_events_model(data: bytes, work: Workdir) -> None:
    """The events through the model (NCCL calls, kernel TCP events, attribution)."""
    from forensics.execution.host_reading import read_model
    root = _folder_bundle(work, MINIMAL_MANIFEST, data)
    m = read_model([root], skew=False)
    for p in m.problems:
        _one_line("model problem", p)


def check_manifest(data: bytes, work: Workdir) -> None:
    from forensics.inputs.bundle import Bundle
    ev = b'{"ev":"tracer_start","t":11000000000000}\n{"ev":"coll","t":11000000001000}\n'
    root = _folder_bundle(work, data, ev)
    with Bundle.open(root) as b:
        for p in b.problems:
            _one_line("bundle problem", p)
        if b.clock is not None:
            b.clock.to_utc([0, 11_000_000_000_000, 2 ** 62])
        b.read_bpf_events()
        b.pcaps()


def check_archive(data: bytes, work: Workdir) -> None:
    """A damaged bundle archive: unpacked (or refused) without leaving anything behind."""
    from forensics.inputs.bundle import Bundle
    arc = work.file("stallscope-fuzz-20260101T000000Z.tar.gz", data)
    unpack = work.path / "unpack"
    unpack.mkdir(exist_ok=True)
    try:
        with Bundle.open(arc, workdir=unpack, max_total_bytes=16 << 20) as b:
            b.read_bpf_events()
            for p in b.problems:
                _one_line("bundle problem", p)
    finally:
        left = list(unpack.iterdir())
        if left:
            for x in left:
                shutil.rmtree(x, ignore_errors=True)
            raise ContractViolation(f"unpack folder left behind: {[x.name for x in left]}")


def check_loose_archive(data: bytes, work: Workdir) -> None:
    """A damaged archive of loose evidence: sorted out by the intake (what it cannot unpack is
    a note, an archive that yields nothing a one-line error), nothing left behind once closed."""
    from forensics.inputs.intake import gather
    from forensics.inputs.archive import Budget
    unpack = work.path / "loose"
    unpack.mkdir(exist_ok=True)
    arc = work.file("logs.tar.gz" if data[:2] == b"\x1f\x8b" else "logs.zip", data)
    try:
        with gather([arc], workdir=unpack, budget=Budget.of(8 << 20)) as intake:
            for n in (intake.loose.not_read if intake.loose else ()):
                _one_line("not read", n.reason)
    except InputError as e:
        _one_line("intake error", str(e))
    left = list(unpack.iterdir())
    if left:
        for x in left:
            shutil.rmtree(x, ignore_errors=True)
        raise ContractViolation(f"unpack folder left behind: {[x.name for x in left]}")


def check_nccl_topo(data: bytes, work: Workdir) -> None:
    """``logscan.c``'s readers of NCCL INFO lines (``logscan_topo``, ``logscan_coll``) on any
    bytes and any offsets: every offset they give lies inside the input; its needle finder
    (``logscan_presence``) finds what ``bytes.find`` finds; then the NCCL_DEBUG parser with them
    and without them (``native=False``) gives the same tables."""
    import numpy as np
    import pandas as pd
    from forensics.native import coll_chunks, first_offsets, topo_lines
    from forensics.parsers.nccl_debug import NcclDebugParser
    from forensics.parsers.text import LogText
    n = len(data)
    marks = [i for i in range(n) if data.startswith(b"NCCL INFO ", i)]
    rng = random.Random(n)
    odd = [rng.randrange(-8, n + 8) for _ in range(4)] + [1 << 40, -(1 << 40)]
    cols, rest = topo_lines(data, n, np.array(marks + odd, np.int64))
    if len(cols["start"]) + len(rest) != len(marks) + len(odd):
        raise ContractViolation("logscan_topo lost offsets")
    for off, ln in (("start", None), ("pre", None), ("host_off", "host_len"), ("msg_off", "msg_len")):
        a = cols[off]
        e = a + (cols[ln] if ln else 0)
        if len(a) and (a.min() < 0 or e.max() > n):
            raise ContractViolation(f"logscan_topo: {off} outside the input")
    for _ in coll_chunks(data, n, chunk=64):
        pass
    needles = [data[i:i + rng.randrange(2, 9)] for i in (rng.randrange(n) for _ in range(8 if n else 0))]
    needles = [x for x in needles if len(x) >= 2] + [b"NCCL INFO ", b"->", b"\x00\xffabsent"]
    if first_offsets(data, n, needles) != [data.find(x) for x in needles]:
        raise ContractViolation("logscan_presence: a first offset differs from bytes.find")
    text = LogText(data, "fuzz.log")
    if text.size == 0:
        return
    got = [NcclDebugParser.parse_text(text, "fuzz.log", native=x) for x in (True, False)]
    for t in got[0].tables:
        if not got[0].tables[t].equals(got[1].tables[t]):
            pd.testing.assert_frame_equal(got[0].tables[t], got[1].tables[t], obj=t)
    if got[0].facts != got[1].facts or got[0].warnings != got[1].warnings:
        raise ContractViolation("nccl_debug: the C readers change the facts or warnings")


def _topo_seeds() -> list[bytes]:
    """NCCL_DEBUG samples and a few ranks' init lines (the bench's init shape)."""
    import sys
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import logs as bench_logs
    finally:
        sys.path.remove(str(ROOT / "bench"))
    init = "\n".join(f"{r}: {ln}" for r in range(4)
                     for ln in bench_logs.init_lines("gpu-node000", 31000 + r, r, 4, f"0x55d4{r:08x}", "0x7d1e"))
    return _read(_fixture("parsers/nccl_debug")) + [init.encode()]


# ------------------------------------------------------------------ generators

def gen_text(json_docs: bool = False, whole: float = 0.35):
    def gen(rng: random.Random, t: Target) -> bytes:
        return mu.mutate(rng, t.samples, t.pool, json_docs=json_docs, whole=whole)
    return gen


def gen_binary(rng: random.Random, t: Target) -> bytes:
    return mu.mutate(rng, t.samples, None, text=False)


def gen_events(rng: random.Random, t: Target) -> bytes:
    if rng.random() < 0.1:
        return mu.mutate_bytes(rng, t.samples)[: 8 * 1024]
    return mu.mutate_lines(rng, t.pool, max_lines=40)


def gen_manifest(rng: random.Random, t: Target) -> bytes:
    r = rng.random()
    if r < 0.75:
        return mu.mutate_json_document(rng, t.samples)
    if r < 0.9:
        return mu.mutate_bytes(rng, t.samples)
    return mu.dumps(rng, mu.json_value(rng))


def _plain(obj):
    """A pickle seed as plain values (for re-pickling after a structural mutation)."""
    return obj


MALICIOUS_GLOBALS = [("os", "system"), ("posix", "system"), ("subprocess", "getoutput"),
                     ("builtins", "exec"), ("builtins", "eval"), ("__builtin__", "eval"), ("builtins", "getattr"),
                     ("torch._utils", "_rebuild_tensor_v2"), ("torch.jit._pickle", "build_intlist_x"),
                     ("nt", "system"), ("commands", "getoutput")]


def malicious_pickle(rng: random.Random) -> bytes:
    """A pickle that would create PWNED if its global were called, buried in a dump-shaped
    dict, built with one of the opcode routes to a call (REDUCE, INST, OBJ, NEWOBJ, BUILD)."""
    mod, name = rng.choice(MALICIOUS_GLOBALS)
    cmd = f"touch {PWNED}"
    arg = ("exec", f"open({str(PWNED)!r}, 'w')") if name in ("exec", "eval") else (cmd,)
    sarg = b"".join(b"X" + len(a.encode()).to_bytes(4, "little") + a.encode() for a in arg[-1:])
    route = rng.randrange(6)
    glob = b"c" + mod.encode() + b"\n" + name.encode() + b"\n"
    if route == 0:     # GLOBAL + TUPLE + REDUCE
        call = glob + b"(" + sarg + b"tR"
    elif route == 1:   # STACK_GLOBAL (protocol 4)
        call = (b"X" + len(mod).to_bytes(4, "little") + mod.encode() + b"X" + len(name).to_bytes(4, "little")
                + name.encode() + b"\x93(" + sarg + b"tR")
    elif route == 2:   # INST
        call = b"(" + sarg + b"i" + mod.encode() + b"\n" + name.encode() + b"\n"
    elif route == 3:   # OBJ
        call = b"(" + glob + sarg + b"o"
    elif route == 4:   # NEWOBJ on a class-like global
        call = glob + b"(" + sarg + b"t\x81"
    else:              # BUILD with a state on a constructed object
        call = glob + b")R}" + b"X\x03\x00\x00\x00abcX\x01\x00\x00\x00xsb"
    head = b"\x80\x02}(X\x07\x00\x00\x00versionX\x03\x00\x00\x002.5X\x07\x00\x00\x00entries]("
    where = rng.randrange(3)
    if where == 0:
        return head + call + b"eu."
    if where == 1:
        return b"\x80\x02" + call + b"."
    return head + b"eX\x09\x00\x00\x00pg_config" + call + b"u."


def gen_flight_recorder(rng: random.Random, t: Target) -> bytes:
    pickles = [s for s in t.samples if s[:1] == b"\x80"]
    r = rng.random()
    if r < 0.15:
        return malicious_pickle(rng)
    if r < 0.45 and pickles:
        from forensics.parsers.flight_recorder import safe_loads
        try:
            obj = safe_loads(rng.choice(pickles))
        except Exception:  # noqa: BLE001 - a damaged seed (the truncated fixture)
            obj = {}
        for _ in range(rng.randint(1, 4)):
            obj = mu.mutate_json(rng, obj)
        try:
            return pickle.dumps(obj, protocol=rng.randint(0, 5))
        except (pickle.PicklingError, RecursionError, TypeError, ValueError):
            return b"\x80\x02}."
    if r < 0.8 and pickles:
        return mu.mutate_bytes(rng, pickles)
    return mu.mutate(rng, t.samples, t.pool, json_docs=True)


def gen_archive(rng: random.Random, t: Target) -> bytes:
    """Uncompressed tar (so header damage reaches tarfile, not just the gzip CRC) or gzip."""
    import gzip
    data = mu.mutate_bytes(rng, t.samples, rounds=rng.randint(1, 3))
    return gzip.compress(data, 1) if rng.random() < 0.3 else data


@functools.lru_cache(maxsize=None)
def _small_log_tar() -> bytes:
    """A folder of two job logs as an uncompressed tar (loose evidence, no bundle)."""
    import io
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, src in (("run/rank0.log", "parsers/torch_watchdog/watchdog.log"),
                          ("run/nccl.log", "parsers/nccl_debug/nccl_debug_warn.log")):
            data = (FIXTURES / src).read_bytes()[:4096]
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@functools.lru_cache(maxsize=None)
def _small_log_zip() -> bytes:
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("logs/rank1.log", (FIXTURES / "parsers/torch_watchdog/watchdog.log").read_bytes()[:4096])
    return buf.getvalue()


@functools.lru_cache(maxsize=None)
def _small_tar() -> bytes:
    """A small bundle as an uncompressed tar: the manifest and events of a shipped one."""
    import io
    buf = io.BytesIO()
    ev = b"\n".join((bundle_members("bpf/events.jsonl") or (b"",))[0].splitlines()[:40]) + b"\n"
    try:   # the real manifest, its file list cut to what this small archive holds (it stays < SEED_BYTES)
        m = json.loads((bundle_members("manifest.json") or (MINIMAL_MANIFEST,))[0])
        m["files"] = [{"path": "bpf/events.jsonl", "bytes": len(ev)}, {"path": "pcap/x.pcap", "bytes": 0}]
        m["collectors"] = {k: v for k, v in m.get("collectors", {}).items() if k == "tracer"}
        man = json.dumps(m).encode()
    except ValueError:
        man = MINIMAL_MANIFEST
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, blob in (("b/manifest.json", man), ("b/bpf/events.jsonl", ev), ("b/pcap/x.pcap", b"")):
            ti = tarfile.TarInfo(name)
            ti.size = len(blob)
            tf.addfile(ti, io.BytesIO(blob))
    return buf.getvalue()


# ------------------------------------------------------------------ the table

def _text_target(name: str, folder: str, refs: tuple[str, ...] = (), json_docs: bool = False,
                 extra: Callable[[], list[bytes]] = lambda: [], whole: float = 0.35) -> Target:
    """A registered parser. ``whole``: share of inputs that are whole mutated samples (the
    vectorised parsers pay ~10 ms of pandas per whole sample, so theirs is smaller)."""
    return Target(name, lambda: _read(_fixture(folder) + _reference(*refs)) + list(extra()),
                  gen_text(json_docs, whole), check_parser(name), doc=f"forensics.parsers {name}")


TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("pcap", lambda: _pcap_seeds(".pcap"), gen_binary, check_pcap, doc="CaptureReader + TCP engine, pcap"),
    Target("pcapng", lambda: _pcap_seeds(".pcapng"), gen_binary, check_pcap, doc="CaptureReader + TCP engine, pcapng"),
    Target("bpf_events", lambda: list(bundle_members("bpf/events.jsonl")), gen_events, check_bpf_events,
           doc="Bundle.read_bpf_events"),
    Target("manifest", lambda: list(bundle_members("manifest.json")) + [MINIMAL_MANIFEST], gen_manifest,
           check_manifest, doc="manifest.json through Bundle.open (parse_manifest, clock, file checks)"),
    _text_target("nccl_debug", "parsers/nccl_debug",
                 ("nccl_debug_coll.txt", "nccl_debug_info_init.txt", "nccl_debug_warn.txt"), whole=0.05),
    _text_target("nccl_tests", "parsers/nccl_tests", ("nccl_tests_output.txt", "nccl_tests_json_skeleton.txt"),
                 json_docs=True),
    _text_target("ib_counters", "parsers/ib_counters", ("perfquery_output.txt", "sysfs_ib_counters.txt")),
    _text_target("ss", "parsers/ss", (), extra=lambda: [m for m in bundle_members("ss-tinp-end.txt")]),
    Target("flight_recorder", lambda: _read(_fixture("parsers/flight_recorder")), gen_flight_recorder,
           check_parser("flight_recorder"), doc="restricted unpickler + FR dump reader"),
    _text_target("nccl_inspector", "parsers/nccl_inspector", ("nccl_inspector_output.txt",), json_docs=True),
    _text_target("nccl_profiler_trace", "parsers/nccl_profiler_trace", ("nccl_profiler_example_trace.txt",),
                 json_docs=True, whole=0.1),
    _text_target("pyspy", "parsers/pyspy", (), json_docs=True),
    _text_target("torch_watchdog", "parsers/torch_watchdog", ("pytorch_nccl_watchdog.txt",)),
    _text_target("proc_threads", "parsers/proc_threads", (), json_docs=True),
    _text_target("native_stacks", "parsers/native_stacks"),
    _text_target("ncclras", "parsers/ncclras"),
    _text_target("torch_elastic", "parsers/torch_elastic"),
    _text_target("ib_status", "parsers/ib_status"),
    _text_target("kernel_log", "parsers/kernel_log"),
    _text_target("fr_analyzer", "parsers/fr_analyzer"),
    _text_target("launcher_exits", "parsers/launcher_exits"),
    _text_target("torch_init", "parsers/torch_init"),
    _text_target("nvidia_smi", "parsers/nvidia_smi"),
]}

# slower, deeper paths: fuzzed with fewer inputs (their inputs are counted separately)
DEEP_TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("ib_counters_tree", TARGETS["ib_counters"].seeds, gen_text(), check_ib_tree,
           doc="ib/ folder: phases, devices, ports, deltas"),
    Target("bpf_events_model", TARGETS["bpf_events"].seeds, gen_events, check_bpf_events_model,
           doc="events.jsonl through read_model (NCCL calls, TCP events, attribution)"),
    Target("bundle_archive", lambda: [_small_tar()], gen_archive, check_archive,
           doc="Bundle.open on damaged tar / tar.gz"),
    Target("loose_archive", lambda: [_small_log_tar(), _small_log_zip()], gen_archive, check_loose_archive,
           doc="intake.gather on damaged tar / tar.gz / zip of loose logs"),
    Target("nccl_topo", _topo_seeds, gen_text(whole=0.1), check_nccl_topo,
           doc="logscan.c's NCCL INFO readers on any bytes and offsets; nccl_debug with and without them"),
]}

ALL_TARGETS = {**TARGETS, **DEEP_TARGETS}
