"""NCCL_DEBUG logs: real lines from NCCL issue threads (tests/fixtures/parsers/nccl_debug)."""
from __future__ import annotations

import pandas as pd

from conftest import FIXTURES
from forensics.parsers.nccl_debug import NcclDebugParser

D = FIXTURES / "parsers" / "nccl_debug"


def parse(name):
    return NcclDebugParser.parse(D / name)


def test_coll_lines_all_fields():
    r = parse("nccl_debug_coll.log")
    assert r.warnings == []
    coll = r.tables["nccl_coll"]
    assert len(coll) == 19
    first = coll.iloc[0]
    # (RayTrainWorker pid=615, ip=10.72.7.6) r24-…-fqztx:615:18953 [2] NCCL INFO AllReduce: opCount 139d …
    assert first["host"] == "r24-02-22-23-29-0066-raycluster-lv52c-worker-l4-8-fqztx"
    assert (first["pid"], first["tid"], first["dev"]) == (615, 18953, 2)
    assert first["op"] == "ALL_REDUCE" and first["op_name"] == "AllReduce"
    assert first["op_count"] == 0x139D
    assert first["sendbuff"] == "0x78d056200000" and first["recvbuff"] == "0x78d056200000"
    assert first["count"] == 7382228 and first["datatype"] == 7 and first["datatype_name"] == "float32"
    assert first["bytes"] == 7382228 * 4
    assert first["red_op"] == 0 and first["red_op_name"] == "sum" and first["root"] == 0
    assert first["comm"] == "0x78cfda045840" and first["nranks"] == 128 and first["stream"] == "0x78d07125e5e0"
    assert pd.isna(first["peer"])
    assert coll["op"].value_counts().to_dict() == {"ALL_REDUCE": 11, "SEND": 3, "RECV": 1, "ALL_GATHER": 2,
                                                   "REDUCE_SCATTER": 2}


def test_send_recv_nil_buffers_and_peer():
    coll = parse("nccl_debug_coll.log").tables["nccl_coll"]
    recv = coll[coll["op"] == "RECV"].iloc[0]
    assert pd.isna(recv["sendbuff"]) and recv["recvbuff"] == "0x7f5176000000"
    assert recv["op_count"] == 0xD60 and recv["peer"] == 1 and recv["root"] == 1
    send = coll[coll["op"] == "SEND"]
    assert send["recvbuff"].isna().all() and send["peer"].tolist() == [1, 1, 0]


def test_opcount_is_per_process_and_comm():
    coll = parse("nccl_debug_coll.log").tables["nccl_coll"]
    g = coll[coll["host"] == "gpu1"].groupby("comm")["op_count"].apply(list).to_dict()
    assert g == {"0x7f0c741162f0": [0x1A, 0x1B], "0x7f0c7410f0e0": [0x1A, 0x1B]}
    # the nranks=1 comm keeps opCount 0 (trailing space in the source line)
    single = coll[coll["nranks"] == 1]
    assert single["op_count"].tolist() == [0, 0] and single["count"].tolist() == [33554432, 33554432]


def test_init_lines_comms_and_transport_facts():
    r = parse("nccl_debug_info_init.log")
    assert r.warnings == []
    comms = r.tables["nccl_comms"]
    assert len(comms) == 5
    start = comms.iloc[0]
    assert (start["comm"], start["rank"], start["nranks"], start["bus_id"], start["comm_id"], start["status"]) == \
        ("0x55cc8aa86c70", 0, 16, "1c000", "0x65e0bd6ee7449db4", "START")
    new = comms[comms["func"] == "ncclCommInitRank"]
    assert new["comm_id"].unique().tolist() == ["0x49bbd7790311d5eb"] and new["rank"].tolist() == [6, 0]
    old = comms.iloc[-1]          # 2.7-era: no busId, no commId
    assert old["host"] == "server2" and old["rank"] == 15 and pd.isna(old["bus_id"]) and pd.isna(old["comm_id"])
    procs = r.facts["processes"]
    ib = procs["hostname1:25668"]
    assert ib["transport"] == "IB" and ib["gdr"] is False
    assert [d["name"] for d in ib["ib_devices"]] == ["mlx5_0", "mlx5_1"]
    assert {d["link_layer"] for d in ib["ib_devices"]} == {"RoCE"}
    assert (ib["oob_interface"], ib["oob_address"]) == ("primaryip", "10.10.10.10")
    assert ib["ranks"] == {"0x55cc8aa86c70": 0} and ib["comm_ids"] == ["0x65e0bd6ee7449db4"]
    sock = procs["axa:3048391"]
    assert sock["transport"] == "Socket" and sock["socket_interfaces"] == [{"index": 0, "name": "lo",
                                                                            "address": "127.0.0.1"}]
    assert sock["env"] == {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "lo"}
    old_ib = procs["master_node:24570"]
    assert old_ib["transport"] == "IB" and old_ib["oob_interface"] == "ib0" and old_ib["interfaces"] == ["ib0", "mlx5_0"]
    assert procs["10-90-43-152:120890"]["gdr"] is True        # from NET/IB/…/GDRDMA channels
    assert procs["hostname-test:983"]["nchannels"] == 16
    assert procs["node2:22556"]["nchannels"] == 2
    assert procs["LIUCC13-AC-01:106"]["nchannels"] == 2        # from "Channel 00/02 :    0   1"
    assert r.facts["nccl_version"] == "2.5.6+cuda10.0"           # the bare printf line


def test_channels_both_notations_and_transports():
    ch = parse("nccl_debug_info_init.log").tables["nccl_channels"]
    assert len(ch) == 11
    a = ch.iloc[0]    # Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA
    assert (a["channel"], a["src_rank"], a["src_dev"], a["dst_rank"], a["dst_dev"], a["direction"]) == \
        (1, 2, "c7000", 0, "87000", "receive")
    assert (a["transport"], a["net"], a["net_dev"], bool(a["gdrdma"])) == ("NET", "IB", 5, True)
    assert pd.isna(a["conn_index"])
    b = ch[ch["line"] == 24].iloc[0]   # Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
    assert (b["conn_index"], b["net"], b["net_dev"], bool(b["gdrdma"])) == (0, "Socket", 3, False)
    assert ch["transport"].value_counts().to_dict() == {"NET": 7, "P2P": 3, "SHM": 1}


def test_rings_and_trees():
    rings = parse("nccl_debug_info_init.log").tables["nccl_rings"]
    ring = rings[rings["kind"] == "ring"].iloc[0]
    assert (ring["channel"], ring["prev"], ring["rank"], ring["next"]) == (0, 0, 1, 0)
    trees = rings[rings["kind"] == "trees"]
    assert trees["channel"].tolist() == [0, 1] and trees["up"].tolist() == [0, 0]
    assert trees["down"].tolist() == ["-1/-1/-1", "-1/-1/-1"]
    order = rings[rings["kind"] == "ring_order"].iloc[0]
    assert order["order"] == "0 1" and order["nchannels"] == 2


def test_warn_lines_all_formats():
    r = parse("nccl_debug_warn.log")
    assert r.warnings == []
    w = r.tables["nccl_warnings"]
    assert len(w) == 13
    first = w.iloc[0]
    assert (first["host"], first["src_file"], first["src_line"]) == ("gpu004", "misc/socket.cc", 49)
    assert first["peer"] == "gpu004.ds-a4-r02.abc.com<55693>"
    ib = w[w["ib_status"].notna()]
    assert ib["ib_status"].tolist() == [12, 4] and ib["peer"].tolist() == ["10.216.210.236<54862>", "10.0.35.1<49189>"]
    # mpirun --timestamp-output prefix and the NCCL >= 2.26 timestamp with an empty hostname
    assert w[w["host"] == "tomte401"]["message"].iloc[0] == "Cuda failure 'invalid argument'"
    ts = w[w["ts"].notna()].iloc[0]
    assert ts["ts"] == "2025-08-12 01:37:03" and ts["host"] == "" and ts["pid"] == 166
    assert ts["ts_local"] == pd.Timestamp("2025-08-12 01:37:03")
    lines = r.tables["nccl_log_lines"]
    assert (lines["kind"] == "error_return").sum() == 10


def test_new_warn_format_with_func_and_trace_and_call_lines():
    data = (b"[2026-01-02 03:04:05.123456] n1:10:11 [3] misc/socket.cc:484 (socketProgress) NCCL WARN boom\n"
            b"n1:10:12 [0] 12.345 ncclProxyProgress:77 NCCL TRACE step 3\n"
            b"n1:10:10 NCCL CALL ncclAllReduce(0x1,0x2,4,7,0,0x3,0x4)\n")
    r = NcclDebugParser.parse(data)
    assert r.warnings == []
    w = r.tables["nccl_warnings"].iloc[0]
    assert (w["func"], w["src_line"], w["message"], w["dev"]) == ("socketProgress", 484, "boom", 3)
    assert w["ts_local"] == pd.Timestamp("2026-01-02 03:04:05.123456")
    lines = r.tables["nccl_log_lines"]
    assert lines["level"].tolist() == ["WARN", "TRACE", "CALL"]
    assert pd.isna(lines["dev"].iloc[2])


def test_malformed_lines_warn_and_keep_the_rest():
    good = (D / "nccl_debug_coll.log").read_bytes().splitlines()
    bad = [b"gpu1:13135:13922 [0] NCCL INFO AllReduce: opCount 1c sendbuff 0x1 recvbuff",   # truncated COLL
           b"gpu1:13135:13922 [0] NCCL INFO comm 0xabc rank x nranks 2 - Init COMPLETE",     # bad Init
           b"garbage NCCL WARN without a prefix",
           b"\xff\xfe\x00binary"[:3] + b" NCCL INFO mojibake",
           b"just application output"]
    r = NcclDebugParser.parse(b"\n".join(good[:3] + bad + good[3:]))
    assert len(r.tables["nccl_coll"]) == 19
    assert len(r.warnings) == 4
    assert "malformed COLL line" in r.warnings[0] and ":4:" in r.warnings[0]
    assert "malformed Init line" in r.warnings[1]
    assert r.facts["other_lines"] == 1


def test_empty_and_binary_inputs_warn():
    assert NcclDebugParser.parse(b"").warnings == ["<bytes>: empty file"]
    r = NcclDebugParser.parse(bytes(range(256)) * 4)
    assert len(r.warnings) == 1 and "binary" in r.warnings[0]
    assert all(len(t) == 0 for t in r.tables.values())


def test_warn_lines_pasted_without_their_host_prefix_are_still_warn_lines():
    data = (b"[0] misc/socket.cc:71 NCCL WARN socketProgress: Connection closed by remote peer node2<4321>\n"
            b"[3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<5000> with error 12, "
            b"opcode 0, len 0, vendor err 129\n")
    r = NcclDebugParser.parse(data)
    w = r.tables["nccl_warnings"]
    assert r.warnings == [] and w["dev"].tolist() == [0, 3] and w["pid"].isna().all()
    assert w["ib_status"].tolist()[1] == 12 and w["peer"].tolist()[0] == "node2<4321>"
    assert r.facts["processes"] == {}


def test_a_warn_line_pasted_with_no_prefix_at_all_is_a_warn_line_but_not_a_mention_in_prose():
    data = (b"Some of the log information is as follows:\n"
            b"NCCL WARN Connect to 10.38.10.112<21724> failed : Connection refused\n"
            b"[1,0]<stderr>:NCCL WARN Call to ibv_modify_qp failed with error Network is unreachable\n"
            b"I grepped for NCCL WARN lines and found none else\n")
    r = NcclDebugParser.parse(data)
    w = r.tables["nccl_warnings"]
    assert w["message"].tolist() == ["Connect to 10.38.10.112<21724> failed : Connection refused",
                                     "Call to ibv_modify_qp failed with error Network is unreachable"]
    assert w["line"].tolist() == [2, 3] and w["peer"].tolist()[0] == "10.38.10.112<21724>"


def test_a_host_without_pid_and_tid_is_the_lines_host():
    data = (b"2025-11-24T03:20:21.001125857Z [2025-11-24 11:20:21] gpu-server320 [5] misc/socket.cc:46 NCCL WARN "
            b"socketProgressOpt: Call to send to 10.44.137.149<52905> failed : Connection reset by peer\n"
            b"2025-11-24T03:20:21.001128133Z gpu-server320 [5] NCCL INFO misc/socket.cc:64 -> 6\n")
    r = NcclDebugParser.parse(data)
    w = r.tables["nccl_warnings"]
    assert r.warnings == [] and w["host"].tolist() == ["gpu-server320"] and w["dev"].tolist() == [5]
    assert w["pid"].isna().all() and w["src_line"].tolist() == [46]
    assert r.tables["nccl_log_lines"]["host"].tolist() == ["gpu-server320"] * 2


def test_launcher_tags_before_a_bare_version_line_and_the_warn_lines():
    data = (b"Fri Aug 11 12:31:45 2023[1,0]<stdout>:NCCL version 2.18.3+cuda12.1\n"
            b"Fri Aug 11 12:31:46 2023[1,3]<stdout>:gpu7:11:12 [0] misc/socket.cc:49 NCCL WARN socketProgress: "
            b"Connection closed by remote peer gpu8<55693>\n")
    r = NcclDebugParser.parse(data)
    assert r.facts["nccl_version"] == "2.18.3+cuda12.1"
    w = r.tables["nccl_warnings"].iloc[0]
    assert (w["host"], w["ctx_rank"], w["ctx_clock"]) == ("gpu7", 3, "Fri Aug 11 12:31:46 2023")
    lines = r.tables["nccl_log_lines"]
    assert lines.loc[lines["level"] == "VERSION", "ctx_rank"].tolist() == [0]


def test_launcher_tags_on_coll_lines_are_tags_not_times_on_both_paths():
    """A COLL line the C scanner reads and one it leaves to the regular expressions (an
    upper-case pointer) give the same time and launcher context: "[Rank 3] " is a tag."""
    line = ("{pre}node1:100:200 [0] NCCL INFO AllReduce: opCount {oc} sendbuff {sb} recvbuff 0x7f10 count 1024 "
            "datatype 7 op 0 root 0 comm 0x55aa [nranks=8] stream 0x99\n")
    for pre, ts, rank in (("[Rank 3] ", None, 3), ("[3] ", None, None),
                          ("[2025-08-12 01:37:03] ", "2025-08-12 01:37:03", None)):
        text = line.format(pre=pre, oc="1a", sb="0x7f00") + line.format(pre=pre, oc="1b", sb="0x7F00")
        t = NcclDebugParser.parse(text.encode()).tables
        ll = t["nccl_log_lines"]
        assert [None if pd.isna(v) else v for v in ll["ts"]] == [ts, ts], pre
        assert [None if pd.isna(v) else int(v) for v in ll["ctx_rank"]] == [rank, rank], pre
        assert t["nccl_coll"]["op_count"].tolist() == [0x1a, 0x1b]


def test_libfabric_errors_and_error_returns_as_warn_rows():
    text = (b"libfabric:462:1673041636:efa:core:rxr_info_to_rxr():506<warn> FI_HMEM capability requires RDMA, "
            b"which this device does not support.\n"
            b"libfabric:85:1747438790::core:core:fi_getinfo_():1392<warn> fi_getinfo: provider efa output empty list\n"
            b"node3:1234:1300 [2] NCCL INFO transport/net.cc:700 -> 2\n"
            b"node3:1234:1300 [2] NCCL INFO init.cc:1200 -> 2\n")
    w = NcclDebugParser.parse_bytes(text, "x.log").tables["nccl_warnings"]
    w = w if hasattr(w, "to_dict") else pd.DataFrame(w)
    msgs = list(w["message"])
    assert msgs == ["libfabric core:core: fi_getinfo_(): fi_getinfo: provider efa output empty list"]


def test_error_return_alone_is_a_warn_row():
    text = (b"node3:1234:1300 [2] NCCL INFO transport/net.cc:700 -> 2\n"
            b"node3:1234:1300 [2] NCCL INFO init.cc:1200 -> 2\n")
    w = NcclDebugParser.parse_bytes(text, "x.log").tables["nccl_warnings"]
    w = w if hasattr(w, "to_dict") else pd.DataFrame(w)
    assert list(w["message"]) == ["transport/net.cc:700 -> 2 (ncclSystemError)"] and list(w["host"]) == ["node3"]


def test_warn_lines_of_nccl_before_2_3_are_warn_lines():
    """NCCL 2.0-2.2 printed no "NCCL " before the level; 1.x put the level first. A log holding
    only such lines is claimed by this reader (corpus 058, 075)."""
    from forensics.parsers.text import LogText
    data = (b"server [0] include/socket.h:185 WARN Call to connect failed : Connection refused\n"
            b"NCCL failure MyProgram.cu:110 'unhandled system error'\n"
            b"gpu3:11:12 [1] misc/ibvwrap.cu:61 WARN Failed to open libibverbs.so[.1]\n"
            b"include/socket.h:344 WARN Socket creation failed : Address family not supported by protocol\n"
            b"WARN src/core.cu:512 Cuda failure 'out of memory'\n"
            b"2024-01-02 WARNING something else WARN here\n")
    assert NcclDebugParser.claims(LogText.of(data.splitlines(keepends=True)[3], "x"))    # the 2019 line alone
    assert not NcclDebugParser.claims(LogText.of(b"app: WARN disk almost full\n" * 3, "x"))
    r = NcclDebugParser.parse(data)
    w = r.tables["nccl_warnings"]
    assert w["message"].str.startswith(("Call to connect", "Failed to open", "Socket creation", "Cuda failure")).all()
    assert w["host"].tolist() == ["server", "gpu3", "", ""]
    assert w["src_file"].tolist() == ["include/socket.h", "misc/ibvwrap.cu", "include/socket.h", "src/core.cu"]
    assert w["src_line"].tolist() == [185, 61, 344, 512]
    assert w["pid"].tolist()[1] == 11 and w["dev"].tolist()[:2] == [0, 1]


def test_a_host_name_takes_no_punctuation_glued_before_it():
    """A backtick, quote or word glued onto the prefix is no part of the host (corpus 041,
    043), on the WARN path and on the C scanner's COLL path alike."""
    data = (b"`hostname-test:984:1357 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer "
            b"10.0.0.2<44206> with status=12 opcode=129 len=65536 vendor err 129 (Recv)\n"
            b"error log `H100-2:19989:20082 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion\n"
            b"\"node7:1:2 [0] NCCL INFO AllReduce: opCount 1a sendbuff 0x7f00 recvbuff 0x7f10 count 1024 "
            b"datatype 7 op 0 root 0 comm 0x55aa [nranks=8] stream 0x99\n")
    t = NcclDebugParser.parse(data).tables
    assert t["nccl_warnings"]["host"].tolist() == ["hostname-test", "H100-2"]
    assert t["nccl_coll"]["host"].tolist() == ["node7"]


def test_a_warn_line_of_device_minus_one_keeps_its_process():
    """libnccl 2.18.1 without a GPU: the init's WARN prints ``[-1]`` for its device; the line is
    still the process's (host, pid), its device NA."""
    r = parse("nccl_2.18.1_no_gpu.log")
    w = r.tables["nccl_warnings"]
    assert r.warnings == [] and len(w) == 4
    assert set(w["host"]) == {"vm"} and set(w["pid"]) == {18171}
    init = w[w["src_file"] == "init.cc"].iloc[0]
    assert pd.isna(init["dev"]) and init["message"].startswith("Cuda failure 'CUDA driver version")
    assert list(r.facts["processes"]) == ["vm:18171"]


def test_a_line_of_megabytes_is_read_in_linear_time():
    """One 2 MB line after an NCCL mention (a log with no newlines): the prefix is looked for
    only just before the mention; a search at every position took minutes."""
    import time
    t = time.monotonic()
    r = NcclDebugParser.parse(b"NCCL INFO " + b"x" * 2_000_000 + b"\nnode1:1:2 [0] NCCL INFO " + b"y" * 2_000_000)
    assert time.monotonic() - t < 10
    lines = r.tables["nccl_log_lines"]
    assert lines["host"].tolist() == ["node1"] and lines["message"].str.len().tolist() == [2_000_000]
