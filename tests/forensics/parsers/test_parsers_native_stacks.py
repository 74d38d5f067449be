"""Native stacks (eu-stack, gdb, py-spy --native) as capture writes them, and raw tool output."""
from __future__ import annotations

from conftest import FIXTURES
from forensics.parsers import registry
from forensics.parsers.native_stacks import NativeStacksParser
from forensics.parsers.pyspy import PySpyParser

D = FIXTURES / "parsers" / "native_stacks"
EU = next(D.glob("native-*-hung-eu-stack.txt"))       # recorded by make_fixtures.py (the pid varies)
GDB = next(D.glob("native-*-hung-gdb.txt"))
PID = int(EU.name.split("-")[1])
MAIN_STACK = ["pause", "wait_for_peer", "train_step", "main", "__libc_start_call_main", "__libc_start_main", "_start"]


def _thread(df, name):
    return df[df["thread_name"] == name].sort_values("depth")


def test_capture_file_with_eu_stack():
    r = NativeStacksParser.parse(EU)
    assert r.warnings == []
    assert (r.facts["pid"], r.facts["phase"], r.facts["tool"], r.facts["rc"], r.facts["threads"]) == \
        (PID, "hung", "eu-stack", 0, 2)
    assert r.facts["decision"].startswith("nothing progressed during the first 5s")
    st = r.tables["stacks"]
    main = _thread(st, "pause_hang")
    # "rank 1's main thread is in pause() called from train_step, not in NCCL"
    assert main["function"].tolist() == MAIN_STACK
    top = main.iloc[0]
    assert (top["depth"], top["file"], top["lineno"], top["module"], top["status"], bool(top["active"])) == \
        (0, "../sysdeps/unix/sysv/linux/pause.c", 29, "/usr/lib/x86_64-linux-gnu/libc.so.6", "sleeping", False)
    step = main[main["function"] == "train_step"].iloc[0]
    assert step["file"].endswith("pause_hang.c") and step["lineno"] == 19
    assert main.iloc[-1]["file"] == "pause_hang" and main.iloc[-1]["lineno"] is registry.pd.NA
    wd = _thread(st, "pt_nccl_watchdg")
    assert wd["function"].tolist() == ["__poll", "watchdog", "start_thread", "__clone3"]
    assert set(st["pid"]) == {PID} and set(st["tool"]) == {"eu-stack"}
    th = r.tables["stack_threads"]
    assert th[["os_tid", "thread_name", "n_frames", "top_function"]].values.tolist() == \
        [[PID, "pause_hang", 7, "pause"], [PID + 1, "pt_nccl_watchdg", 4, "__poll"]]
    # the columns of py-spy's stacks table (the model takes both into its stacks table)
    assert list(PySpyParser.SCHEMAS["stacks"]) == list(st.columns)[:len(PySpyParser.SCHEMAS["stacks"])]


def test_capture_file_with_gdb():
    r = NativeStacksParser.parse(GDB)
    assert r.warnings == []       # gdb's attach chatter and detach line are not stack lines
    assert r.facts["tool"] == "gdb" and r.facts["stderr"] == ["29\t../sysdeps/unix/sysv/linux/pause.c: "
                                                              "No such file or directory."]
    st = r.tables["stacks"]
    main = _thread(st, "pause_hang")
    assert main["function"].tolist() == ["__libc_pause", "wait_for_peer", "train_step", "main"]
    assert main["address"].iloc[0].startswith("0x00007f") and main["lineno"].tolist() == [29, 16, 19, 28]
    assert _thread(st, "pt_nccl_watchdg")["function"].tolist() == ["__GI___poll", "watchdog", "start_thread",
                                                                   "clone3"]
    assert set(st["status"]) == {"sleeping"}


def test_raw_tool_output():
    eu = NativeStacksParser.parse(D / "eu-stack_pause.txt")
    assert eu.warnings == [] and eu.facts["pid"] == PID and eu.facts["tool"] == "eu-stack"
    st = eu.tables["stacks"]
    assert st[st["os_tid"] == PID]["function"].tolist() == MAIN_STACK
    assert st["thread_name"].isna().all()          # no header: eu-stack prints no thread names
    gdb = NativeStacksParser.parse(D / "gdb_pause.txt")
    assert gdb.warnings == [] and gdb.facts["pid"] == PID    # from "[Inferior 1 (process N) detached]"
    assert set(gdb.tables["stacks"]["pid"]) == {PID}
    assert gdb.tables["stack_threads"]["thread_name"].tolist() == ["pt_nccl_watchdg", "pause_hang"]


def test_pyspy_native_behind_the_header():
    r = NativeStacksParser.parse(D / "native-51177-hung-pyspy.txt")
    assert r.warnings == [] and r.facts["tool"] == "py-spy" and r.facts["pid"] == 51177
    st = r.tables["stacks"]
    assert st["function"].tolist()[:3] == ["ncclProxyProgress", "cudaStreamSynchronize", "all_reduce"]
    assert st.iloc[0]["file"] == "libnccl.so.2" and st.iloc[2]["lineno"] == 2050
    assert st.iloc[0]["status"] == "active"        # py-spy's own status wins over /proc's


def test_selection_by_path_and_content():
    head = (EU).read_bytes()[:registry.SNIFF_BYTES]
    assert registry.select(f"stacks/native-{PID}-hung.txt", head)[0] is NativeStacksParser
    gdb_head = (D / "gdb_pause.txt").read_bytes()
    assert NativeStacksParser.sniff(gdb_head) and not PySpyParser.sniff(gdb_head)
    assert not NativeStacksParser.sniff((FIXTURES / "parsers" / "pyspy" / "pyspy_dump_rank0.txt").read_bytes())


def test_truncated_garbage_and_killed_runs_warn_never_raise():
    text = (EU).read_text()
    cut = NativeStacksParser.parse(text[: text.index("#3  0x")].encode())
    assert cut.warnings == [] and len(cut.tables["stacks"]) == 3       # cut at a frame: the frames before it
    spliced = text.replace(f"TID {PID + 1}:\n", f"TID {PID + 1}:\n\x00\x01garbage here\n#x 0xZZ\n")
    r = NativeStacksParser.parse(spliced.encode())
    assert len(r.tables["stacks"]) == 11 and len(r.warnings) == 2
    assert all("not an eu-stack line" in w for w in r.warnings)
    orphan = NativeStacksParser.parse(b"PID 1 - process\n#0  0x0000000000001000 main - /bin/x\n    x.c:1\n")
    assert {w.split(": ", 1)[1] for w in orphan.warnings} >= {"frame line outside a thread",
                                                             "source line without a frame"}
    killed = NativeStacksParser.parse(b"# stallscope native stacks\n# pid: 7\n# phase: hung\n# tool: eu-stack\n"
                                      b'# thread: 7 S "x"\n# rc: killed\n')
    assert killed.facts["rc"] == "killed" and killed.warnings == [] and killed.tables["stacks"].empty
    for junk in (b"", b"\x00\x01\x02\x03" * 100, b"hello\nworld\n"):
        res = NativeStacksParser.parse(junk)
        assert res.tables["stacks"].empty and res.warnings
