"""Line heads of the text formats: the literal markers shared by a parser and the normalizer.

Each table here is read by two sides. The parser named beside it sniffs a file with it (its
``MARKERS``: whether it reads the file at all) or reads its lines with it; :mod:`.normalize`
builds its glued-line split from the same table, so a line head a parser learns is a head the
normalizer splits before. The tables live here, below both, so that the parsers (which read
through :mod:`.text`, which normalizes) and the normalizer import them without importing each
other. A parser's own tables that the normalizer does not read stay in the parser.
"""
from __future__ import annotations

# NcclDebugParser.MARKERS: NCCL's own line heads (``NCCL INFO``, ...) and libfabric's error lines
NCCL_DEBUG_MARKERS = (b"NCCL INFO", b"NCCL WARN", b"NCCL version", b"NCCL TRACE", b"NCCL ABORT", b"libfabric:")

# NcclTestsParser.MARKERS: the header's units line and the commonest rows' type/redop columns
# (``%8s  %6s``) find a table body pasted without its "#" header lines (its rows are then told by
# their shape)
NCCL_TESTS_MARKERS = (b"# nThread", b"nccl-tests version", b"# Avg bus bandwidth", b"# Out of bounds values",
                      b"Test NCCL failure", b"Test CUDA failure", b": Test failure", b"Collective test starting",
                      b"(B)    (elements)", b"   float     sum  ", b"   float    none  ", b"bfloat16     sum  ",
                      b"    half     sum  ")

# TorchElasticParser.MARKERS: torchrun's failure summary, the launchers' exit lines
TORCH_ELASTIC_MARKERS = (b"ChildFailedError", b"exitcode  :", b"exitcode :", b"(exitcode: ", b"closing signal",
                         b"death signal", b"srun: error:",
                         b"slurmstepd: error:", b"exited on signal", b"died with <Signals.", b"non-zero exit status")

# NCCL's result codes as PyTorch prints them (``ncclInternalError: ``), read by torch_watchdog
# wherever they stand
CODE_MARKERS = tuple(f"nccl{c}Error: ".encode() for c in
                     ("Remote", "System", "Internal", "UnhandledCuda", "InvalidUsage", "InvalidArgument"))

# what ibstat prints (read by ib_status); "ibstat CA port" prints them unindented (every other
# block line is indented)
IBSTAT_KEYS = frozenset({"ca type", "number of ports", "firmware version", "hardware version", "node guid",
                         "system image guid", "state", "physical state", "rate", "base lid", "lmc", "sm lid",
                         "capability mask", "port guid", "link layer"})
