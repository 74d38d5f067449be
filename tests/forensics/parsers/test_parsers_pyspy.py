"""py-spy dump text (plain, --native, --locals) and --json."""
from __future__ import annotations

import pandas as pd

from conftest import FIXTURES
from forensics.parsers.pyspy import PySpyParser

D = FIXTURES / "parsers" / "pyspy"


def test_plain_dump():
    r = PySpyParser.parse(D / "pyspy_dump_rank0.txt")
    assert r.warnings == []
    th = r.tables["stack_threads"]
    assert th["thread_id"].tolist() == ["48213", "48290", "0x7F3A5C7FE640"]
    main = th.iloc[0]
    assert (main["pid"], main["os_tid"], main["thread_name"], main["status"], bool(main["owns_gil"])) == \
        (48213, 48213, "MainThread", "active+gil", True)
    assert (main["n_frames"], main["top_function"], main["top_file"], main["top_lineno"]) == \
        (4, "synchronize", "torch/cuda/__init__.py", 792)
    assert th.iloc[1]["thread_name"] == "Thread-1 (_pin_memory_loop)" and not bool(th.iloc[1]["active"])
    assert pd.isna(th.iloc[2]["os_tid"]) and th.iloc[2]["n_frames"] == 0 and pd.isna(th.iloc[2]["thread_name"])
    st = r.tables["stacks"]
    assert len(st) == 14
    assert st[st["thread_id"] == "48213"]["function"].tolist() == ["synchronize", "train_step", "main", "<module>"]
    assert st[st["thread_id"] == "48290"]["depth"].tolist() == list(range(10))
    assert r.facts["processes"][48213]["python_version"] == "3.10.12"


def test_native_frames_locals_and_parent():
    r = PySpyParser.parse(D / "pyspy_dump_native_locals_rank1.txt")
    assert r.warnings == []
    st = r.tables["stacks"]
    assert st.iloc[0]["function"] == "ncclProxyProgress" and st.iloc[0]["file"] == "libnccl.so.2"
    assert pd.isna(st.iloc[0]["lineno"])
    ar = st[st["function"] == "all_reduce"].iloc[0]
    assert (ar["lineno"], ar["n_locals"], ar["depth"]) == (2050, 5, 2)
    assert r.facts["processes"][51177]["parent_pid"] == 51100


def test_json_dump():
    r = PySpyParser.parse(D / "pyspy_dump_rank1.json")
    assert r.warnings == []
    th = r.tables["stack_threads"]
    assert th["thread_id"].tolist() == ["51177", f"0x{139871100000000:X}"]
    assert th.iloc[0]["status"] == "active" and th.iloc[1]["status"] == "idle"
    st = r.tables["stacks"]
    assert st["file"].tolist() == ["torch/distributed/distributed_c10d.py", "train.py"]
    assert st["lineno"].tolist() == [2050, 139]


def test_garbage_and_errors_warn():
    text = (D / "pyspy_dump_rank0.txt").read_text().replace("    main (train.py:203)\n", "    main (train.py:203\n")
    text = "    orphan (x.py:1)\n" + text + "Error: Failed to suspend process\n"
    r = PySpyParser.parse(text.encode())
    assert len(r.tables["stacks"]) == 13 and len(r.warnings) == 3
    assert r.facts["errors"] == ["Error: Failed to suspend process"]
    assert PySpyParser.parse(b"[1, 2").warnings[-1].startswith("<bytes>:1: invalid JSON")
