"""Column schemas of the event tables (DuckDB types), one source of truth.

Each table starts with exactly DESIGN.md's columns, in DESIGN's order; columns
after those are stallscope's additions, documented here. All times are UTC ns
(BIGINT); monotonic tracer times never reach a table.

The typed pandas frames of these tables are made here too, for every module that builds
one: :func:`empty` (no rows), :func:`conform` (exactly a table's columns and dtypes) and
:func:`concat` (parts made one table).
"""
from __future__ import annotations

import pandas as pd

# DESIGN.md's columns, verbatim
NCCL_EVENTS_DESIGN = [
    "timestamp_ns", "duration_ns", "duration_source", "end_ns", "op", "rank", "nranks", "comm_id_hash", "comm_ptr",
    "op_count", "count", "bytes", "datatype", "reduce_op", "root_or_peer", "stream", "host", "pid", "tid",
]
TCP_EVENTS_DESIGN = [
    "timestamp_ns", "event", "source", "saddr", "daddr", "sport", "dport", "state", "host", "pid", "rank", "peer_rank",
]

SCHEMAS: dict[str, dict[str, str]] = {
    # one row per NCCL collective/p2p call seen by the tracer
    "nccl_events": {
        "timestamp_ns": "BIGINT",        # call entry, UTC
        "duration_ns": "BIGINT",         # end_ns - timestamp_ns (source 'gpu': the GPU execution time); NULL
                                         # while never completed
        "duration_source": "VARCHAR",    # gpu | host_sync | call
        "end_ns": "BIGINT",              # completion (upper bound for host_sync), UTC
        "op": "VARCHAR", "rank": "INTEGER", "nranks": "INTEGER", "comm_id_hash": "VARCHAR", "comm_ptr": "VARCHAR",
        "op_count": "BIGINT", "count": "BIGINT", "bytes": "BIGINT", "datatype": "VARCHAR", "reduce_op": "VARCHAR",
        "root_or_peer": "INTEGER", "stream": "VARCHAR", "host": "VARCHAR", "pid": "INTEGER", "tid": "INTEGER",
        # additions
        "call_return_ns": "BIGINT",      # uprobe return (the launch finished), UTC; NULL: never returned
        "completed": "BOOLEAN",          # completion observed (a returned host wait / GPU time; for a
                                         # process that never waits, the call returned). FALSE: in
                                         # flight at the end, aborted, or not followed by any wait
        "rc": "INTEGER",                 # ncclResult_t of the call
        "fn": "VARCHAR",                 # the probed function (ncclAllReduce, ...)
        "gpu_source": "VARCHAR",         # duration_source 'gpu': flight_recorder | inspector | profiler (gpu_times.py);
                                         # for those rows duration_ns is the GPU execution time itself
        "op_count_source": "VARCHAR",    # what op_count counts from (model/op_align.py): init (the tracer
                                         # saw the communicator's init) | log (aligned to NCCL's COLL
                                         # opCount) | flight_recorder (to collective_seq_id - 1) |
                                         # peers (to another rank's counts, by time) |
                                         # estimated (across a tracer restart, by the call rate) |
                                         # attach (relative: from the first call any tracer saw)
        "tracer_run": "INTEGER",         # the tracer program (0, 1, ... restarts) whose count op_count was
    },
    # one row per TCP event: kernel tracepoints (bpf) and pcap verdicts (one row per verdict)
    "tcp_events": {
        "timestamp_ns": "BIGINT", "event": "VARCHAR", "source": "VARCHAR", "saddr": "VARCHAR", "daddr": "VARCHAR",
        "sport": "INTEGER", "dport": "INTEGER", "state": "VARCHAR", "host": "VARCHAR",
        "pid": "INTEGER",                # owner of (saddr, sport): by socket, not the tracepoint's current pid
        "rank": "INTEGER",               # the owner's rank
        "peer_rank": "INTEGER",          # rank owning (daddr, dport), else the only rank on daddr
        # additions
        "capture": "VARCHAR",            # pcap file (pcap rows) or netns label (bpf rows)
        "stream": "BIGINT",              # tcp.stream within that pcap (pcap rows)
        "frame": "BIGINT",               # frame number within that pcap (pcap rows)
        "event_pid": "INTEGER",          # the tracepoint's current pid (bpf rows; often softirq's victim)
        "coll_comm_id_hash": "VARCHAR",  # the collective last entered by `rank` at or before the event ...
        "coll_op_count": "BIGINT",
        "coll_op": "VARCHAR",
        "coll_in_flight": "BOOLEAN",     # ... and whether it had not completed yet at that moment
    },
    # flagged packets only (any tshark verdict or RST), from the TCP engine
    "packets": {
        "timestamp_ns": "BIGINT", "host": "VARCHAR", "capture": "VARCHAR", "frame": "BIGINT", "stream": "BIGINT",
        "src": "VARCHAR", "sport": "INTEGER", "dst": "VARCHAR", "dport": "INTEGER", "seq_rel": "BIGINT",
        "ack_rel": "BIGINT", "len": "BIGINT", "seq_raw": "BIGINT", "tcp_flags": "INTEGER", "window": "INTEGER",
        "verdicts": "VARCHAR",            # comma-separated verdict names
        "duplicate_ack_num": "BIGINT", "rto_ns": "BIGINT", "src_rank": "INTEGER", "dst_rank": "INTEGER",
    },
    # one row per tcp.stream per pcap
    "flows": {
        "host": "VARCHAR", "capture": "VARCHAR", "stream": "BIGINT", "orig_addr": "VARCHAR", "orig_port": "INTEGER",
        "resp_addr": "VARCHAR", "resp_port": "INTEGER", "first_ns": "BIGINT", "last_ns": "BIGINT",
        "packets_orig": "BIGINT", "packets_resp": "BIGINT", "bytes_orig": "BIGINT", "bytes_resp": "BIGINT",
        "retransmissions": "BIGINT", "fast_retransmissions": "BIGINT", "spurious_retransmissions": "BIGINT",
        "out_of_order": "BIGINT", "lost_segments": "BIGINT", "duplicate_acks": "BIGINT", "zero_windows": "BIGINT",
        "rsts": "BIGINT", "rtt_mean_ns": "DOUBLE", "history": "VARCHAR",
        "rank": "INTEGER",               # owner of the originator's endpoint
        "peer_rank": "INTEGER",          # owner of the responder's endpoint
        "pid": "INTEGER", "peer_pid": "INTEGER",
    },
    # one row per (communicator, op_count) across ranks; list columns are ordered by rank
    "collectives": {
        "comm_id_hash": "VARCHAR", "op_count": "BIGINT", "op": "VARCHAR", "nranks": "INTEGER",
        "ranks_entered": "INTEGER", "ranks_completed": "INTEGER",
        # ranks absent from it whose host's capture was not watching then (captures per host
        # start and stop apart): ranks_entered + ranks_unwatched = nranks is a collective
        # every watched rank took part in
        "ranks_unwatched": "INTEGER",
        "ranks": "INTEGER[]", "entry_ns": "BIGINT[]", "end_ns": "BIGINT[]", "lateness_ns": "BIGINT[]",
        "missing_ranks": "INTEGER[]",    # ranks of the communicator that never entered this collective
        "first_entry_ns": "BIGINT", "last_entry_ns": "BIGINT", "max_lateness_ns": "BIGINT",
        "latest_rank": "INTEGER",        # the rank that entered last
        "last_end_ns": "BIGINT", "bytes": "BIGINT", "ops_differ": "BOOLEAN",
    },
    # IB/RoCE port counter deltas (start -> end), when the bundle has ib/
    "ib_counters": {
        "host": "VARCHAR", "device": "VARCHAR", "port": "INTEGER", "counter": "VARCHAR", "start": "UBIGINT",
        "end": "UBIGINT", "delta": "UBIGINT", "kind": "VARCHAR", "problem": "BOOLEAN", "meaning": "VARCHAR",
        "action": "VARCHAR",
    },
    # residual clock skew between hosts, from TCP segments seen in two hosts' pcaps
    "clock_skew": {
        "host_a": "VARCHAR", "host_b": "VARCHAR", "skew_ns": "BIGINT", "one_way_delay_ns": "BIGINT",
        "matched_segments": "BIGINT", "status": "VARCHAR",
    },
    # ---- parsed artefacts (model/artifacts.py, nccl_config.py, gpu_times.py); `artifact`: the file in the bundle
    # one row per NCCL process: its NCCL_DEBUG log's init lines merged with the manifest's process
    "nccl_config": {
        "host": "VARCHAR", "pid": "INTEGER", "rank": "INTEGER", "local_rank": "INTEGER", "world_size": "INTEGER",
        "source": "VARCHAR",             # log+manifest | log | manifest
        "nccl_version": "VARCHAR", "libnccl": "VARCHAR",
        "transport": "VARCHAR",          # IB (also RoCE) | Socket | a net plugin's name; NULL: no log says
        "ib_devices": "VARCHAR",         # NET/IB devices, "mlx5_0:1/IB,mlx5_1:1/RoCE"
        "link_layers": "VARCHAR",        # IB | RoCE | both
        "socket_ifaces": "VARCHAR", "socket_addrs": "VARCHAR",   # NET/Socket interfaces (comma-separated)
        "oob_iface": "VARCHAR", "interfaces": "VARCHAR",
        "gdr": "BOOLEAN",                # GPU Direct RDMA: enabled on some HCA/channel; FALSE: only "Disabled" lines
        "nchannels": "INTEGER",          # "N coll channels" (or Channel xx/NN)
        "net_channels": "INTEGER", "gdr_channels": "INTEGER",
        "channel_transports": "VARCHAR", # distinct "via" kinds: NET/Socket, NET/IB, P2P, SHM ...
        "ring_channels": "INTEGER", "tree_channels": "INTEGER", "ring_prev": "INTEGER", "ring_next": "INTEGER",
        "comms": "INTEGER", "comm_ids": "VARCHAR",   # NCCL commId (commHash) of its communicators
        "warnings": "INTEGER",           # NCCL WARN lines
        "env": "VARCHAR",                # JSON {NCCL_*/TORCH_*: value}: the process env, else the log's "set by environment"
        "log_host": "VARCHAR", "log_pid": "INTEGER", "log_rank": "INTEGER", "netns": "VARCHAR", "artifact": "VARCHAR",
        "node": "VARCHAR",               # the capture that holds the evidence (NULL: loose evidence)
        "oob_addr": "VARCHAR",           # NET/IB's out-of-band address (the host's address on its IB-side interface)
        "bootstrap_addr": "VARCHAR",     # the address NCCL's bootstrap uses ("Bootstrap : Using eth0:10.0.0.4<0>")
    },
    # NCCL WARN lines of the NCCL_DEBUG logs (bundles' and loose ones; forensics/model/logs.py joins them)
    "nccl_warnings": {
        "host": "VARCHAR",               # the host the line names (its prefix), else its rank's or its process's
        "pid": "INTEGER", "rank": "INTEGER", "log_pid": "INTEGER", "tid": "INTEGER",
        "dev": "INTEGER",                # the CUDA device of the logging thread (not a rank)
        "ts": "VARCHAR", "src_file": "VARCHAR", "src_line": "INTEGER", "func": "VARCHAR",
        "message": "VARCHAR", "peer": "VARCHAR", "ib_status": "INTEGER", "artifact": "VARCHAR", "log_line": "BIGINT",
        "node": "VARCHAR",               # the capture holding the log (NULL: loose evidence)
        "log_host": "VARCHAR",           # the host the prefix names, as printed (NULL: none)
        "class": "VARCHAR",              # forensics/model/nccl_errors.py: ib_completion, socket_closed, ...
        "cascade": "BOOLEAN",            # a consequence of an earlier failure (a flush, a proxy, a closed peer)
        "first": "BOOLEAN",              # the job's first failure (nccl_errors.first_failures)
        "time_ns": "BIGINT",             # UTC, from the line's time (NCCL >= 2.26, or its launcher's)
        "time_source": "VARCHAR",        # nccl | launcher: which clock time_ns came from
        "peer_addr": "VARCHAR", "peer_port": "INTEGER",
        "peer_host": "VARCHAR",          # the host the peer address belongs to (its NCCL lines, or the name printed)
        "peer_rank": "INTEGER",
        "ib_status_name": "VARCHAR",     # IB work completion status (ibv_wc_status), decoded
        "ib_opcode": "INTEGER", "vendor_err": "INTEGER",
        "ib_side": "VARCHAR",            # Send | Recv | Flush: the NCCL request that failed
        "local_gid": "VARCHAR", "remote_gid": "VARCHAR", "ib_device": "VARCHAR",
        "ctx_rank": "INTEGER",           # the rank a launcher's tag names ([1,N]<stdout>, [rankN]:)
        "ctx_host": "VARCHAR",           # the host (or address) a launcher's or shipper's tag names
        "ctx_clock": "VARCHAR",          # the launcher's or shipper's time on the line, as printed
    },
    # one row per bundle: what the host has (IB, interfaces, GPUDirect module, XIDs)
    "host_facts": {
        "host": "VARCHAR", "kernel": "VARCHAR",
        "ib_present": "BOOLEAN",         # NULL: unknown (no ib/ and no collector verdict)
        "ib_devices": "VARCHAR", "ib_ports": "INTEGER", "ib_ports_active": "INTEGER", "ib_link_layers": "VARCHAR",
        "ib_rate_gbps": "DOUBLE",        # fastest port's rate (sysfs "rate")
        "interfaces": "VARCHAR", "link_types": "VARCHAR",   # ip -j link (all namespaces), lo left out
        "nvidia_peermem": "BOOLEAN",     # in lsmod; NULL without sys/lsmod.txt
        "gpus": "INTEGER", "xid_count": "INTEGER", "xid_first": "VARCHAR",
        "kernel_alerts": "INTEGER",      # lines of logs/dmesg-*-xid.txt (XID, GPU, peermem, mlx5 errors)
    },
    # nccl-tests result rows (one per size and placement)
    "nccl_tests": {
        "host": "VARCHAR", "artifact": "VARCHAR", "line": "BIGINT", "test": "VARCHAR", "size_bytes": "BIGINT",
        "count": "BIGINT", "dtype": "VARCHAR", "redop": "VARCHAR", "root": "INTEGER",
        "placement": "VARCHAR",          # out | in (out-of-place, in-place)
        "time_us": "DOUBLE", "time_kind": "VARCHAR", "algbw_gbps": "DOUBLE", "busbw_gbps": "DOUBLE",
        "wrong": "DOUBLE", "timestamp": "VARCHAR",
    },
    # one row per nccl-tests run (file and test)
    "nccl_tests_runs": {
        "host": "VARCHAR", "artifact": "VARCHAR", "test": "VARCHAR", "version": "VARCHAR", "ranks": "INTEGER",
        "nodes": "INTEGER", "test_hosts": "VARCHAR", "gpus": "VARCHAR", "rows": "INTEGER",
        "min_size_bytes": "BIGINT", "max_size_bytes": "BIGINT", "max_busbw_gbps": "DOUBLE",
        "max_busbw_size_bytes": "BIGINT", "busbw_at_max_size_gbps": "DOUBLE",
        "avg_busbw_gbps": "DOUBLE",      # the footer's "# Avg bus bandwidth"
        "avg_status": "VARCHAR", "wrong_total": "DOUBLE", "out_of_bounds": "INTEGER", "failures": "INTEGER",
        "failure_text": "VARCHAR",       # the failure line that says why (its host left out)
        "failure_hosts": "VARCHAR",      # every host a failure line names, comma-separated
    },
    # py-spy frames (depth 0 = innermost) of the traced processes
    "stacks": {
        "host": "VARCHAR", "pid": "INTEGER", "rank": "INTEGER", "phase": "VARCHAR", "thread_id": "VARCHAR",
        "os_tid": "INTEGER", "thread_name": "VARCHAR", "status": "VARCHAR", "active": "BOOLEAN",
        "owns_gil": "BOOLEAN", "depth": "INTEGER", "function": "VARCHAR", "code_file": "VARCHAR", "lineno": "INTEGER",
        "artifact": "VARCHAR", "line": "BIGINT",
    },
    # ss -tinp snapshots: one row per socket per snapshot
    "sockets": {
        "host": "VARCHAR", "netns": "VARCHAR", "phase": "VARCHAR", "pid": "INTEGER",
        "rank": "INTEGER",               # owner's rank (pid, else the endpoint's owner)
        "peer_rank": "INTEGER",          # rank owning the peer endpoint (or the only rank on its address)
        "state": "VARCHAR", "local_addr": "VARCHAR", "local_port": "INTEGER", "peer_addr": "VARCHAR",
        "peer_port": "INTEGER", "process": "VARCHAR", "recv_q": "BIGINT", "send_q": "BIGINT",
        "retrans_cur": "BIGINT", "retrans_total": "BIGINT", "lost": "BIGINT", "unacked": "BIGINT",
        "bytes_sent": "BIGINT", "bytes_retrans": "BIGINT", "bytes_acked": "BIGINT", "bytes_received": "BIGINT",
        "segs_out": "BIGINT", "segs_in": "BIGINT", "rtt_ms": "DOUBLE", "rttvar_ms": "DOUBLE", "rto_ms": "DOUBLE",
        "cwnd": "BIGINT", "delivery_rate_bps": "DOUBLE", "busy_ms": "DOUBLE", "lastsnd_ms": "DOUBLE",
        "lastrcv_ms": "DOUBLE", "artifact": "VARCHAR", "line": "BIGINT",
        "sample_ns": "BIGINT",           # UTC time of the sample (ss-series blocks); NULL for start/end snapshots
        "inode": "BIGINT",               # the socket's inode (ss -e ino:), joins threads.socket_inode
        "backoff": "BIGINT",             # RTO backoff: retransmission timeouts in a row with nothing acked
        "notsent": "BIGINT", "lastack_ms": "DOUBLE",
    },
    # Flight Recorder entries (times are wall-clock UTC ns as dumped; rank: global rank of the dump)
    "fr_entries": {
        "host": "VARCHAR", "rank": "INTEGER", "pid": "INTEGER", "record_id": "BIGINT", "pg_id": "BIGINT",
        "pg_name": "VARCHAR", "pg_desc": "VARCHAR", "collective_seq_id": "BIGINT", "p2p_seq_id": "BIGINT",
        "op_id": "BIGINT", "profiling_name": "VARCHAR", "op": "VARCHAR", "is_p2p": "BOOLEAN",
        "state": "VARCHAR",              # scheduled | started | completed
        "time_created_ns": "BIGINT", "time_discovered_started_ns": "BIGINT",
        "time_discovered_completed_ns": "BIGINT", "duration_ms": "DOUBLE", "retired": "BOOLEAN",
        "timeout_ms": "BIGINT", "input_numel": "BIGINT", "output_numel": "BIGINT", "input_dtypes": "VARCHAR",
        "thread_name": "VARCHAR", "top_frame": "VARCHAR", "artifact": "VARCHAR",
    },
    # Flight Recorder pg_status per dump: the last collective_seq_id enqueued/started/completed (-1: none)
    "fr_pg_status": {
        "host": "VARCHAR", "rank": "INTEGER", "pid": "INTEGER", "pg_id": "VARCHAR",
        "last_enqueued_collective": "BIGINT", "last_started_collective": "BIGINT",
        "last_completed_collective": "BIGINT", "artifact": "VARCHAR",
    },
    # what could not be read, per bundle
    "problems": {"host": "VARCHAR", "bundle": "VARCHAR", "problem": "VARCHAR"},
    # the interval each host's collectors really covered (forensics/model/windows.py)
    "capture_windows": {
        "host": "VARCHAR", "collector": "VARCHAR", "kind": "VARCHAR", "first_ns": "BIGINT", "last_ns": "BIGINT",
        "source": "VARCHAR",             # manifest (capture recorded it) | derived (from the bundle's data)
    },
    # the last collective each process launched per communicator, from NCCL_DEBUG COLL lines
    # (forensics/model/state.py): a late capture's op positions
    "coll_log_ops": {
        "host": "VARCHAR", "pid": "INTEGER", "rank": "INTEGER", "log_pid": "INTEGER", "comm_ptr": "VARCHAR",
        "comm_id": "VARCHAR",            # NCCL's commId (Init lines): the cross-host communicator key
        "comm_rank": "INTEGER", "nranks": "INTEGER", "last_op_count": "BIGINT", "last_op": "VARCHAR",
        "last_count": "BIGINT", "lines": "BIGINT", "artifact": "VARCHAR",
        "node": "VARCHAR",               # the capture holding the log (NULL: loose evidence)
        "log_host": "VARCHAR",           # the host the COLL lines name
        "last_line": "BIGINT",           # the line of the last COLL line in its log
        "last_ts": "VARCHAR",            # its NCCL time (>= 2.26 with INFO times), as printed
        "ctx_clock": "VARCHAR",          # its launcher's time, as printed
        "time_ns": "BIGINT",             # UTC of the last COLL line, where its log gives times (model/logs.py)
    },
    # PyTorch ProcessGroupNCCL lines (parsers/torch_watchdog.py): watchdog timeouts, the work each
    # rank was in, NCCL errors, dump signals; host and pid joined across files (model/logs.py)
    "watchdog_events": {
        "host": "VARCHAR", "pid": "INTEGER", "rank": "INTEGER", "kind": "VARCHAR", "severity": "VARCHAR",
        "pg_id": "INTEGER", "pg_guid": "VARCHAR", "pg_desc": "VARCHAR",
        "seq_num": "BIGINT",             # PyTorch's SeqNum of the work (Flight Recorder's collective_seq_id)
        "op_type": "VARCHAR", "op": "VARCHAR", "numel_in": "BIGINT", "numel_out": "BIGINT", "timeout_ms": "BIGINT",
        "ran_for_ms": "BIGINT", "last_enqueued": "BIGINT", "last_completed": "BIGINT",
        "peer_rank": "INTEGER",          # the rank a dump signal names (it timed out first)
        "wait_ms": "BIGINT", "error": "VARCHAR", "nccl_version": "VARCHAR", "message": "VARCHAR",
        "log_time": "VARCHAR",           # c10's "MMDD HH:MM:SS.frac", as printed
        "ctx_rank": "INTEGER", "ctx_host": "VARCHAR", "ctx_clock": "VARCHAR",
        "time_ns": "BIGINT", "time_source": "VARCHAR",
        "node": "VARCHAR", "artifact": "VARCHAR", "log_line": "BIGINT",
    },
    # processes a launcher reported failed or killed (parsers/torch_elastic.py, launcher_exits.py)
    "process_exits": {
        "host": "VARCHAR", "pid": "INTEGER", "rank": "INTEGER", "local_rank": "INTEGER", "kind": "VARCHAR",
        "exitcode": "INTEGER", "signal": "VARCHAR", "time": "VARCHAR", "time_ns": "BIGINT", "error_file": "VARCHAR",
        "traceback": "VARCHAR", "ctx_clock": "VARCHAR",     # the clock of the line's launcher or shipper prefix
        "node": "VARCHAR", "artifact": "VARCHAR", "log_line": "BIGINT",
    },
    # what NCCL RAS (ncclras, parsers/ncclras.py) named: ranks of a communicator in trouble (missing,
    # with other op counts or status, errors) and job processes missing or dead (rank and comm NULL);
    # host: the node RAS names; group_ranks: a row for ranks RAS counted behind but did not list
    # (rank NULL), how many
    "ras_ranks": {
        "host": "VARCHAR", "rank": "INTEGER", "pid": "INTEGER", "gpu": "VARCHAR", "comm_id": "VARCHAR",
        "comm_hash": "VARCHAR", "kind": "VARCHAR", "status": "VARCHAR", "op_count": "BIGINT", "collective": "VARCHAR",
        "error": "VARCHAR", "missing": "BOOLEAN", "behind": "BOOLEAN", "peers_op_count": "BIGINT",
        "group_ranks": "INTEGER", "node": "VARCHAR", "artifact": "VARCHAR", "log_line": "BIGINT",
    },
    # kernel log events (parsers/kernel_log.py: dmesg, journal): NVIDIA Xid, NIC link loss, OOM kills
    "kernel_events": {
        "host": "VARCHAR", "time": "VARCHAR", "time_ns": "BIGINT", "kind": "VARCHAR",   # xid | nic_link | oom_kill
        "xid": "INTEGER", "pci": "VARCHAR", "pid": "INTEGER", "process": "VARCHAR", "message": "VARCHAR",
        "node": "VARCHAR", "artifact": "VARCHAR", "log_line": "BIGINT",
    },
    # what the Flight Recorder analyzer (fr_trace / torchfrtrace, parsers/fr_analyzer.py) reported: per
    # collective the ranks that did not join it (missing_ranks) or whose entry disagrees (culprit_ranks),
    # comma lists; host NULL (the report covers the job)
    "fr_report": {
        "host": "VARCHAR", "kind": "VARCHAR", "pg": "VARCHAR", "seq": "BIGINT", "record_id": "BIGINT",
        "op": "VARCHAR", "state": "VARCHAR", "world_size": "INTEGER", "expected_ranks": "VARCHAR",
        "missing_ranks": "VARCHAR", "culprit_ranks": "VARCHAR", "error_type": "VARCHAR", "message": "VARCHAR",
        "node": "VARCHAR", "artifact": "VARCHAR", "log_line": "BIGINT",
    },
    # ranks that never met: rendezvous and c10d store failures before the first collective
    # (parsers/torch_init.py)
    "init_errors": {
        "host": "VARCHAR", "rank": "INTEGER", "root_rank": "INTEGER", "kind": "VARCHAR", "address": "VARCHAR",
        "timeout_ms": "BIGINT", "error": "VARCHAR", "message": "VARCHAR", "ctx_rank": "INTEGER", "ctx_host": "VARCHAR",
        "ctx_clock": "VARCHAR", "time_ns": "BIGINT", "node": "VARCHAR", "artifact": "VARCHAR", "log_line": "BIGINT",
    },
    # communicator inits a rank began (model/inits.py: the tracer's comm_init, NCCL's Init START/COMPLETE)
    "comm_inits": {
        "host": "VARCHAR", "pid": "BIGINT", "tid": "BIGINT", "fn": "VARCHAR", "rank": "INTEGER", "nranks": "INTEGER",
        "comm_id": "VARCHAR", "start_ns": "BIGINT", "end_ns": "BIGINT", "completed": "BOOLEAN", "source": "VARCHAR",
        "unreached": "VARCHAR",
    },
    # InfiniBand/RoCE port state (parsers/ib_status.py: ibstat, ibstatus, ibv_devinfo, sysfs)
    "ib_ports": {
        "host": "VARCHAR", "device": "VARCHAR", "port": "INTEGER", "state": "VARCHAR", "phys_state": "VARCHAR",
        "rate_gbps": "DOUBLE", "width": "VARCHAR", "speed": "VARCHAR", "link_layer": "VARCHAR", "tool": "VARCHAR",
        "node_type": "VARCHAR", "peer": "VARCHAR",   # iblinkinfo: Switch|CA|Router; the node at the other end
        "node": "VARCHAR", "artifact": "VARCHAR", "log_line": "BIGINT",
    },
    # a GPU lost as nvidia-smi or the driver says it without an Xid (parsers/nvidia_smi.py)
    "gpu_events": {
        "host": "VARCHAR", "bus_id": "VARCHAR", "kind": "VARCHAR", "tool": "VARCHAR", "message": "VARCHAR",
        "node": "VARCHAR", "artifact": "VARCHAR", "log_line": "BIGINT",
    },
    # per thread of the traced processes at the start and end of the capture (/proc/PID/task)
    "threads": {
        "host": "VARCHAR", "pid": "INTEGER", "rank": "INTEGER", "phase": "VARCHAR", "sample_ns": "BIGINT",
        "tid": "INTEGER", "name": "VARCHAR", "state": "VARCHAR", "wchan": "VARCHAR",
        "syscall_name": "VARCHAR",       # the syscall the thread sits in (NULL: running, or unknown number)
        "fd": "BIGINT",                  # its fd argument, for the fd-taking ones
        "socket_inode": "BIGINT",        # the socket that fd is (joins sockets.inode)
        "wait_events": "VARCHAR",        # in | out | in,out: what the wait is for (a recv: in; a send: out)
        "utime_ticks": "BIGINT", "stime_ticks": "BIGINT", "artifact": "VARCHAR",
    },
    # per directed TCP connection and capture: ACK round-trip times and data rate (forensics/model/timing.py)
    "flow_timing": {
        "host": "VARCHAR", "capture": "VARCHAR", "saddr": "VARCHAR", "sport": "INTEGER", "daddr": "VARCHAR",
        "dport": "INTEGER",              # the data's direction: saddr sends, daddr ACKs
        "data_packets": "BIGINT", "data_bytes": "BIGINT",
        "busy_bytes": "BIGINT", "busy_ns": "BIGINT",   # data segments <= 10 ms after the previous one
        "busy_rate_bps": "DOUBLE",       # busy_bytes * 8 / busy_ns: the sending rate while it was sending
        "rtt_samples": "BIGINT",         # ACKs with an RTT (tcp.analysis.ack_rtt) for this data
        "rtt_p50_ns": "DOUBLE", "rtt_p90_ns": "DOUBLE", "rtt_p99_ns": "DOUBLE", "rtt_max_ns": "DOUBLE",
        # the ACKs whose wait saw no retransmission, out-of-order or lost segment on the connection
        "rtt_clean_samples": "BIGINT", "rtt_clean_p50_ns": "DOUBLE", "rtt_clean_p90_ns": "DOUBLE",
        "rank": "INTEGER", "peer_rank": "INTEGER", "pid": "INTEGER",   # sender's rank, receiver's rank
    },
    # per-thread scheduler samples of the job (capture's schedstat sampler, bpf/README.md "offcpu")
    "offcpu": {
        "timestamp_ns": "BIGINT", "host": "VARCHAR", "pid": "INTEGER", "tid": "INTEGER", "rank": "INTEGER",
        "name": "VARCHAR", "state": "VARCHAR",   # thread name; R, S, D, ... at the sample
        "offcpu_ns": "BIGINT",           # off-CPU (blocked or runnable) since capture first saw the thread
        "oncpu_ns": "BIGINT", "runq_ns": "BIGINT",   # kernel totals since the thread started
        "offcpu_delta_ns": "BIGINT", "oncpu_delta_ns": "BIGINT", "runq_delta_ns": "BIGINT",  # since its last sample
    },
}

TABLES = list(SCHEMAS)


# ---------------------------------------------------------------- typed frames of these tables

_EMPTY: dict[str, pd.DataFrame] = {}


def empty(table: str) -> pd.DataFrame:
    """A table with no rows, its columns typed (built once per table, handed out as copies)."""
    if table not in _EMPTY:
        _EMPTY[table] = pd.DataFrame({c: pd.Series(dtype=_pd_dtype(t)) for c, t in SCHEMAS[table].items()})
    return _EMPTY[table].copy()


def _pd_dtype(t: str) -> str:
    return {"BIGINT": "Int64", "INTEGER": "Int64", "UBIGINT": "UInt64", "DOUBLE": "float64", "BOOLEAN": "boolean",
            "VARCHAR": "string"}.get(t, "object")


def conform(df: pd.DataFrame, table: str) -> pd.DataFrame:
    """Exactly the table's columns, in order, with nullable dtypes (missing ones NULL)."""
    out = {}
    n = len(df)
    for c, t in SCHEMAS[table].items():
        dt = _pd_dtype(t)
        s = df[c] if c in df.columns else pd.Series([None] * n, index=df.index, dtype="object")
        if dt == "object":
            out[c] = s
            continue
        if dt in ("Int64", "UInt64", "float64"):
            # an object column may hold any kind of missing value (None, NaN, pandas NA): NA
            # does not convert to float64 by astype
            s = pd.to_numeric(s, errors="coerce") if s.dtype == object else s
        out[c] = s if s.dtype == dt else s.astype(dt)   # the same dtype: no copy
    return pd.DataFrame(out, index=df.index, copy=False).reset_index(drop=True)


def concat(parts: list[pd.DataFrame], table: str) -> pd.DataFrame:
    """The non-empty parts as one conformed table (an empty one when there are none)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty(table)
    return conform(pd.concat(parts, ignore_index=True), table)


__all__ = ["NCCL_EVENTS_DESIGN", "SCHEMAS", "TABLES", "TCP_EVENTS_DESIGN", "concat", "conform", "empty"]
