"""What CI fuzzes and how (issue 7): the targets' input counts and which run in worker
processes. Shared by tests/forensics/test_fuzz_parsers.py and :mod:`fuzz.background` (the
same inputs, wherever they run)."""
from __future__ import annotations

import os

EXAMPLES = int(os.environ.get("STALLSCOPE_FUZZ_EXAMPLES", "10000"))
# deeper paths cost 2-60 ms an input: fewer of them (each still well past a thousand but the model)
DEEP = {"ib_counters_tree": max(1, EXAMPLES // 5), "bundle_archive": max(1, EXAMPLES // 5),
        "bpf_events_model": max(1, EXAMPLES // 40), "loose_archive": max(1, EXAMPLES // 10),
        "nccl_topo": max(1, EXAMPLES // 40)}
# the targets that cost about a millisecond an input or more run in worker processes (two cores
# on CI; a worker's start, ~1 s of imports, is paid back from ~5 s of inputs)
PARALLEL = {"nccl_debug", "nccl_profiler_trace", "flight_recorder", "bpf_events", "pcap", "pcapng", "manifest",
            "torch_watchdog", "bpf_events_model", "ss", "ncclras", "native_stacks", "nccl_tests", "pyspy",
            "nccl_inspector", "nccl_topo"}
JOBS = int(os.environ.get("STALLSCOPE_FUZZ_JOBS", str(min(2, os.cpu_count() or 1))))
TIME_LIMIT_S = 10.0


def runs(targets) -> list[tuple[str, str, int]]:
    """(kind, target, inputs) of every run: ``mutated`` (each of ``targets``) then ``deep``."""
    return [("mutated", n, EXAMPLES) for n in sorted(targets)] + [("deep", n, k) for n, k in sorted(DEEP.items())]
