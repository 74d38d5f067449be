"""A bundle captured on a real GPU with the real libnccl (``fixtures/device/``): it analyses
cleanly, every traced call and the library's version read, nothing said wrong."""
from __future__ import annotations

import io
import json

from conftest import FIXTURES
from forensics.cli import Env, main

CASE = FIXTURES / "device" / "h200-nccl-2.28.9"


def _query(bundle, sql: str) -> list[str]:
    out, err = io.StringIO(), io.StringIO()
    assert main(["query", "--csv", str(bundle), sql], Env(stdout=out, stderr=err)) == 0, err.getvalue()
    return out.getvalue().strip().splitlines()[1:]


def test_the_h200_capture_reads_every_call_and_the_version(tmp_path):
    truth = json.loads((CASE / "result.json").read_text())
    bundle = next(CASE.glob("stallscope-*.tar.gz"))
    out, err = io.StringIO(), io.StringIO()
    js = tmp_path / "f.json"
    rc = main(["analyze", str(bundle), "-o", str(tmp_path / "r.html"), "--json", str(js), "-q"],
              Env(stdout=out, stderr=err))
    assert rc == 0, err.getvalue()
    assert "internal error" not in err.getvalue() and "warning" not in err.getvalue(), err.getvalue()
    doc = json.loads(js.read_text())
    assert not [f for f in doc["findings"] if f["severity"] in ("error", "warning")], doc["verdict"]
    assert _query(bundle, "SELECT op, count(*), min(count), max(count) FROM nccl_events GROUP BY op") == \
        [f"ALL_REDUCE,{truth['allreduces']},{truth['count']},{truth['count']}"]
    assert [v.split("+")[0] for v in _query(bundle, "SELECT DISTINCT nccl_version FROM nccl_config")] == \
        [truth["nccl_version"]]
