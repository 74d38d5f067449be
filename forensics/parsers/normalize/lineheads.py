"""The line heads the normalizer knows: how a log line begins (:data:`LOG_START_RE`, read by the
unwrap: such a line is never a continuation) and the heads a glued line is split before
(:func:`all_heads`, with the launcher tags before them, :data:`TAGS`), built from the parsers' own
markers in :mod:`forensics.parsers.heads`."""
from __future__ import annotations

import re

from ..heads import CODE_MARKERS, NCCL_DEBUG_MARKERS, NCCL_TESTS_MARKERS, TORCH_ELASTIC_MARKERS

# a line that begins like a log line (never joined onto the one before): launcher tags
# (lines.PREFIXES), NCCL's host:pid:tid [dev], c10/glog, timestamps, tracebacks, nccl-tests rows,
# a stack frame's ``at`` (a function and its ``(``, a path or a file:line after it: not prose's "at")
MON = rb"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
ISO = rb"\d{4}-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d|\s?UTC)?"
CTIME = rb"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + MON + rb" [ \d]\d \d\d:\d\d:\d\d \d{4}"
NCCL_HEAD = rb"(?:<[\w.-]+>|[\w.][\w.-]*)?:\d+:\d+ \[\d+\] "   # <name>, ...: redacted hosts
GLOG = rb"[EWIFD]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?"
DTYPES = rb"(?:float|double|half|bfloat16|int8|uint8|int32|uint32|int64|uint64|fp8_e4m3|fp8_e5m2|f8e4m3|f8e5m2)"
# a result row: size count type, then its redop, or (2.4-2.6, and rows without a redop) a root or a time
TEST_ROW = rb"[ \t]+\d+[ \t]+\d+[ \t]+" + DTYPES + rb"[ \t]+(?:(?:sum|prod|max|min|avg|none|mulsum)[ \t]|-?\d)"
LOG_START_RE = re.compile(
    rb"(?m)^(?:[ \t]*\d{1,6}: |\[\d+,\d+\]<std|\[default\d+\]:|\[rank\d+\]:|\[pod/|\((?:[\w.:-]+ )?pid=\d+"
    rb"|\[?" + ISO + rb"|\[?" + CTIME + rb"|" + MON + rb" [ \d]\d \d\d:\d\d:\d\d"
    rb"|" + NCCL_HEAD + rb"|\[?" + GLOG + rb"|\[[EWIF] \w+\.(?:cpp|hpp|py):\d+\]|\[\d{1,7}\] |L\d{1,7}[: \t]"
    rb"|Traceback \(most recent call last\)|[ \t]*File \"|During handling|The above exception"
    rb"|[\w.]*(?:Error|Exception|Interrupt|Warning)(?::|[ \t]*$)|frame #\d+:|Exception raised from|terminate called"
    rb"|[ \t]*what\(\):|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|FATAL)\b|\[(?:INFO|WARNING|ERROR|DEBUG)"
    rb"|#|" + TEST_ROW + rb"|[A-Za-z][\w.-]*\d[\w.-]*: |NCCL (?:[A-Z]{4,5}|version)\b|[ \t]*(?:time|host|rank|exitcode|error_file"
    rb"|traceback)\s*:|[ \t]*\[\d+\]:|Root Cause|Failures:|Other Failures|[=-]{5,}|[ \t]*at (?:[\w$.<>\[\]]+ ?\(|/|\S+:\d)|\S+@\S+:)")
SEPARATOR_RE = re.compile(rb"(?m)^[ \t]*[=*#~_-]{20,}[ \t]*$")


# glued lines: the heads a line of each format starts with; the split goes before them, and
# before the launcher tags that stand in front of them
TAGS = (rb"(?:(?:\[?" + ISO + rb"\]?:?[ \t]+(?:[\w.-]+ >> )?|" + CTIME + rb"|\d{1,6}: |\[rank\d+\]:[ \t]?"
         rb"|\[[A-Za-z_][A-Za-z_-]*\d+(?:\|\d+)?\]:[ \t]?|\[\d+,\d+\]<std\w+>:[ \t]?|\[pod/[^\]\s]+\][ \t]|\((?:[\w.:-]+ )?pid=\d+"
         rb"(?:, ip=[\d.:a-fA-F]+)?\)[ \t]|(?<![\w.-])[A-Za-z](?=[\w.-]*\d)[\w.-]*: )*)")


def nccl_markers() -> bytes:
    words = sorted({m[len(b"NCCL "):] for m in NCCL_DEBUG_MARKERS if m.startswith(b"NCCL ")
                    and m != b"NCCL version"} | {b"CALL"})
    return b"|".join(re.escape(w) for w in words)


def _other_nccl_heads() -> bytes:
    """``heads.NCCL_DEBUG_MARKERS``' heads other than NCCL's own: ``libfabric:<pid>:<time>:``."""
    return b"|".join(rb"(?<![\w.-])" + re.escape(m) + rb"\d+:\d+:" for m in NCCL_DEBUG_MARKERS
                     if not m.startswith(b"NCCL "))


def tests_markers() -> bytes:
    hashed = [re.escape(m[1:].lstrip()) for m in NCCL_TESTS_MARKERS if m.startswith(b"# ")]
    return b"#[ \t]*(?:" + b"|".join(hashed + [rb"Using devices", rb"Rank +\d", rb"[ \t]*size[ \t]",
                                                rb"[ \t]*\(B\)", rb"[ \t]+out-of-place", rb"nccl-tests"]) + b")"


def _exit_heads() -> bytes:
    """Lines of the programs ``heads.TORCH_ELASTIC_MARKERS`` names (``srun:``, ``slurmstepd[-host]:``), torchrun's logger."""
    progs = [rb"(?<![\w./-])" + re.escape(m[:-len(b": error:")]) + rb"(?:-[\w.-]+)?: " for m in TORCH_ELASTIC_MARKERS
             if m.endswith(b": error:")]
    return b"|".join(progs + [rb"torch\.distributed\.elastic\.[\w.]+: \[?(?:WARNING|ERROR|INFO)\]?"])


def _code_heads() -> bytes:
    """NCCL's result codes as PyTorch prints them alone on a line: ``heads.CODE_MARKERS``."""
    return rb"(?<![\w.])(?:" + b"|".join(re.escape(m) for m in CODE_MARKERS) + b")"


def _ib_heads() -> bytes:
    """Port lines of ibdev2netdev and iblinkinfo: the heads of ``ib_status``' IBDEV2NETDEV_RE, LINK_PORT_RE."""
    return (rb"(?<![\w.-])(?:mlx\w+|[a-z]\w*_\d+) +port +\d+ +(?:\([A-Z_]+ *\) +)?==> +\S"
            rb"|(?<![\w.-])(?:0x[0-9a-fA-F]+ +)?\d+ +\d+\[[ \d]*\] ==\(")


def all_heads() -> bytes:
    return b"|".join((
        rb"(?<![\w.<>-])" + NCCL_HEAD + rb"(?:[\w./-]+:\d+ (?:\(\w+\) )?)?NCCL (?:" + nccl_markers() + rb")\b",
        VERSION_HEAD.pattern,
        rb"\[rank\d+\]:",                                   # PyTorch >= 2.2 stderr
        rb"\[" + GLOG + rb" +\d+ [\w/.-]+:\d+\]",          # c10 logger, bracketed
        GLOG + rb" +\d+ [\w/.-]+:\d+\]",                   # c10 / torchrun glog
        rb"\[[EWIF] ProcessGroupNCCL\.cpp:\d+\]",           # PyTorch 1.x watchdog
        rb"(?:ERROR|WARNING|INFO): ?torch\.distributed",     # torchrun 1.x / 2.0
        _exit_heads(), _code_heads(), _ib_heads(), _other_nccl_heads(),
        rb"\[[\w.-]+@[\w-]+[^\]\n]*\][#$] ",                # a shell prompt (as ib_status' PROMPT_RE)
        rb"(?<=\s)File \"[^\"\n]+\", line \d+",              # a traceback's frame
        rb"torch\.distributed\.elastic\.multiprocessing\.errors\.ChildFailedError",
        rb"Traceback \(most recent call last\):",
        rb"terminate called after throwing", rb"(?<=\s)what\(\): ",      # and the C++ runtime's next line
        rb"Exception raised from ",
        rb"frame #\d+: ",
        rb"(?<=\s)={20,}", rb"Root Cause \(first observed failure\):", rb"Other Failures:",
        rb"Failures:(?=\s+(?:<NO_OTHER_FAILURES>|\[\d+\]))",
        rb"\[\d+\]:(?=\s+time\s*:)", rb"(?<=\s\s)(?:time|host|rank|exitcode|error_file|traceback)\s*: ",
        tests_markers(),
        rb"(?<!#)(?<!# )(?:Out of bounds values|Avg bus bandwidth)[ \t]*: ",   # nccl-tests 1.x: no "#"
        TEST_ROW[len(rb"[ \t]+"):],
        rb"\S+: Test (?:NCCL|CUDA) failure", rb"\.\. \S+ pid \d+: Test failure",
        rb"CA '\w+'", rb"hca_id:\s", rb"Infiniband device '", rb"(?<![\w.-])(?:Switch|CA|Router): (?:0x[0-9a-fA-F]+ )?\S",
        rb"(?<= )\t+",
    ))


# NCCL's version line as a head (not the INFO line quoting it)
VERSION_HEAD = re.compile(rb"(?<!INFO )(?<!, )(?<!\w)NCCL version \d")    # as in all_heads()
