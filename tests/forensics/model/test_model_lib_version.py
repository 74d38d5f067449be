"""A process's NCCL version when no log line states it: the version string its libnccl file
carries, which the capture records in the manifest (``processes[].nccl_version``,
capture/libversion.py). A log's version wins; a bundle without the field models as before."""
from __future__ import annotations

import json

from forensics.analysis import analyze
from forensics.inputs.bundle import open_bundle
from forensics.execution.host_reading import read_model
from synthetic_bundle import lab_bundle, lab_pids

LOGGED = "2.21.5+cuda12.4"          # what rank 0's lab log states (the lab prints it on rank 0 only)


def _with_library_versions(bundle, versions: dict[int, str]):
    """The bundle's manifest with ``nccl_version`` set on the given ranks' processes."""
    m = bundle / "manifest.json"
    doc = json.loads(m.read_text())
    for p in doc["processes"]:
        if p["rank"] in versions:
            p["nccl_version"] = versions[p["rank"]]
    m.write_text(json.dumps(doc))
    return bundle


def _versions(bundle) -> dict[int, object]:
    cfg = read_model([bundle])["nccl_config"]
    return {int(r): (None if v != v else v) for r, v in zip(cfg["rank"], cfg["nccl_version"])}


def test_without_the_field_only_the_logged_rank_has_a_version(tmp_path):
    assert _versions(lab_bundle(tmp_path)) == {0: LOGGED, 1: None, 2: None, 3: None}


def test_the_library_version_fills_the_ranks_whose_log_states_none(tmp_path):
    b = _with_library_versions(lab_bundle(tmp_path), {0: "2.99.9+cuda0.0", 1: LOGGED, 2: LOGGED, 3: LOGGED})
    assert {p.rank: p.nccl_version for p in open_bundle(b).manifest.processes} == \
        {0: "2.99.9+cuda0.0", 1: LOGGED, 2: LOGGED, 3: LOGGED}
    assert _versions(b) == {0: LOGGED, 1: LOGGED, 2: LOGGED, 3: LOGGED}      # rank 0: its log wins


def test_a_rank_whose_library_differs_is_named(tmp_path):
    b = _with_library_versions(lab_bundle(tmp_path), {1: LOGGED, 2: LOGGED, 3: "2.19.3+cuda12.2"})
    a = analyze([b])
    try:
        (f,) = [f for f in a.findings if (f.details or {}).get("rule") == "nccl_version_differs"]
        assert "2.19.3+cuda12.2 on rank 3" in f.summary and 3 in f.ranks
    finally:
        a.close()
