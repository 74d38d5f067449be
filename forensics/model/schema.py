"""Column schemas of the event tables (DuckDB types), one source of truth.

Each table starts with exactly DESIGN.md's columns, in DESIGN's order; columns
after those are stallscope's additions, documented here. All times are UTC ns
(BIGINT); monotonic tracer times never reach a table.

A table that shows a parser's table (the artefacts: ``nccl_warnings``, ``sockets``,
``process_exits``, ...) names that table's columns and does not type them again: a bare
name takes its type from the parser's ``SCHEMAS`` kind (:data:`KIND_TYPES`), so the two
cannot drift apart; ``name:TYPE`` is the model's own column, or a parser's int kept as
``INTEGER`` (:func:`shown`).

The typed pandas frames of these tables are made here too, for every module that builds
one: :func:`empty` (no rows), :func:`conform` (exactly a table's columns and dtypes) and
:func:`concat` (parts made one table).
"""
from __future__ import annotations

import pandas as pd

from ..parsers import registry

# DESIGN.md's columns, verbatim
NCCL_EVENTS_DESIGN = [
    "timestamp_ns", "duration_ns", "duration_source", "end_ns", "op", "rank", "nranks", "comm_id_hash", "comm_ptr",
    "op_count", "count", "bytes", "datatype", "reduce_op", "root_or_peer", "stream", "host", "pid", "tid",
]
TCP_EVENTS_DESIGN = [
    "timestamp_ns", "event", "source", "saddr", "daddr", "sport", "dport", "state", "host", "pid", "rank", "peer_rank",
]

# a parser column's kind -> the type the model gives it
KIND_TYPES = {"int": "BIGINT", "uint": "UBIGINT", "float": "DOUBLE", "str": "VARCHAR", "bool": "BOOLEAN"}
# where a log line came from: the capture holding the file (NULL: loose evidence), the file, its line
LOG_ORIGIN = " node:VARCHAR artifact:VARCHAR log_line:BIGINT"


def shown(parser: str, table: str, columns: str, own: tuple[str, ...] = ()) -> dict[str, str]:
    """The columns (name -> DuckDB type, in order) of a model table that shows ``parser``'s
    ``table``. ``columns`` is whitespace-separated: a bare name is the parser's column, typed
    from its kind; ``name:TYPE`` is a column the model adds, or an int of the parser's the model
    keeps as INTEGER; ``own`` names the parser's names the model fills from elsewhere (a
    rename). Raises ValueError at import on a bare name the parser has no column for, or a
    type that restates the parser's (a drift the tests then name)."""
    kinds = registry.get(parser).SCHEMAS[table]
    out: dict[str, str] = {}
    for spec in columns.split():
        name, _, t = spec.partition(":")
        if not t and name not in kinds:
            raise ValueError(f"model table of {parser}.{table}: the parser has no column {name!r}")
        if t and name in kinds and name not in own and t == KIND_TYPES.get(kinds[name]):
            raise ValueError(f"model table of {parser}.{table}: {name} restates the parser's type; name it bare")
        out[name] = t or KIND_TYPES[kinds[name]]
    return out


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
        "dsacked": "BOOLEAN",            # a resend on a connection whose resends the peer D-SACKed: it had the data
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
    # host: the host the line names (its prefix), else its rank's or its process's
    # dev: the CUDA device of the logging thread (not a rank)
    # node: the capture holding the log (NULL: loose evidence)
    # log_host: the host the prefix names, as printed (NULL: none)
    # class: forensics/model/nccl_errors.py: ib_completion, socket_closed, ...
    # cascade: a consequence of an earlier failure (a flush, a proxy, a closed peer)
    # first: the job's first failure (nccl_errors.first_failures)
    # time_ns: UTC, from the line's time (NCCL >= 2.26, or its launcher's)
    # time_source: nccl | launcher: which clock time_ns came from
    # peer_host: the host the peer address belongs to (its NCCL lines, or the name printed)
    # ib_status_name: IB work completion status (ibv_wc_status), decoded
    # ib_side: Send | Recv | Flush: the NCCL request that failed
    # ctx_rank: the rank a launcher's tag names ([1,N]<stdout>, [rankN]:)
    # ctx_host: the host (or address) a launcher's or shipper's tag names
    # ctx_clock: the launcher's or shipper's time on the line, as printed
    "nccl_warnings": shown("nccl_debug", "nccl_warnings",
        "host pid:INTEGER rank:INTEGER log_pid:INTEGER tid:INTEGER dev:INTEGER ts src_file "
        "src_line:INTEGER func message peer ib_status:INTEGER artifact:VARCHAR log_line:BIGINT "
        "node:VARCHAR log_host:VARCHAR class:VARCHAR cascade:BOOLEAN first:BOOLEAN time_ns:BIGINT "
        "time_source:VARCHAR peer_addr peer_port:INTEGER peer_host:VARCHAR peer_rank:INTEGER "
        "ib_status_name:VARCHAR ib_opcode:INTEGER vendor_err:INTEGER ib_side local_gid remote_gid "
        "ib_device ctx_rank:INTEGER ctx_host ctx_clock"),
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
    # placement: out | in (out-of-place, in-place)
    "nccl_tests": shown("nccl_tests", "nccl_tests",
        "host:VARCHAR artifact:VARCHAR line test size_bytes count dtype redop root:INTEGER "
        "placement time_us time_kind algbw_gbps busbw_gbps wrong timestamp"),
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
    "stacks": shown("pyspy", "stacks",
        "host:VARCHAR pid:INTEGER rank:INTEGER phase:VARCHAR thread_id os_tid:INTEGER thread_name "
        "status active owns_gil depth:INTEGER function code_file:VARCHAR lineno:INTEGER "
        "artifact:VARCHAR line"),
    # ss -tinp snapshots: one row per socket per snapshot
    # rank: owner's rank (pid, else the endpoint's owner)
    # peer_rank: rank owning the peer endpoint (or the only rank on its address)
    # sample_ns: UTC time of the sample (ss-series blocks); NULL for start/end snapshots
    # inode: the socket's inode (ss -e ino:), joins threads.socket_inode
    # backoff: RTO backoff: retransmission timeouts in a row with nothing acked
    # dsack_dups: D-SACKs the socket received: segments it resent that the peer already had
    # minrtt_ms: the kernel's windowed minimum RTT of the connection: its path's floor
    "sockets": shown("ss", "sockets",
        "host:VARCHAR netns:VARCHAR phase:VARCHAR pid:INTEGER rank:INTEGER peer_rank:INTEGER "
        "state local_addr local_port:INTEGER peer_addr peer_port:INTEGER process recv_q send_q "
        "retrans_cur retrans_total lost unacked bytes_sent bytes_retrans bytes_acked "
        "bytes_received segs_out segs_in rtt_ms rttvar_ms rto_ms cwnd delivery_rate_bps busy_ms "
        "lastsnd_ms lastrcv_ms artifact:VARCHAR line sample_ns inode backoff notsent lastack_ms dsack_dups minrtt_ms"),
    # Flight Recorder entries (times are wall-clock UTC ns as dumped; rank: global rank of the dump)
    # state: scheduled | started | completed
    "fr_entries": shown("flight_recorder", "fr_entries",
        "host:VARCHAR rank:INTEGER pid:INTEGER record_id pg_id pg_name pg_desc collective_seq_id "
        "p2p_seq_id op_id profiling_name op is_p2p state time_created_ns "
        "time_discovered_started_ns time_discovered_completed_ns duration_ms retired timeout_ms "
        "input_numel output_numel input_dtypes thread_name top_frame artifact:VARCHAR"),
    # Flight Recorder pg_status per dump: the last collective_seq_id enqueued/started/completed (-1: none)
    "fr_pg_status": shown("flight_recorder", "fr_pg_status",
        "host:VARCHAR rank:INTEGER pid:INTEGER pg_id last_enqueued_collective "
        "last_started_collective last_completed_collective artifact:VARCHAR"),
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
    # seq_num: PyTorch's SeqNum of the work (Flight Recorder's collective_seq_id)
    # peer_rank: the rank a dump signal names (it timed out first)
    # log_time: c10's "MMDD HH:MM:SS.frac", as printed
    "watchdog_events": shown("torch_watchdog", "watchdog",
        "host:VARCHAR pid:INTEGER rank:INTEGER kind severity pg_id:INTEGER pg_guid pg_desc "
        "seq_num op_type op numel_in numel_out timeout_ms ran_for_ms last_enqueued last_completed "
        "peer_rank:INTEGER wait_ms error nccl_version message log_time ctx_rank:INTEGER ctx_host "
        "ctx_clock time_ns:BIGINT time_source:VARCHAR" + LOG_ORIGIN),
    # processes a launcher reported failed or killed (parsers/torch_elastic.py, launcher_exits.py)
    # ctx_clock: the clock of the line's launcher or shipper prefix
    "process_exits": shown("torch_elastic", "process_exits",
        "host pid:INTEGER rank:INTEGER local_rank:INTEGER kind exitcode:INTEGER signal time "
        "time_ns:BIGINT error_file traceback ctx_clock" + LOG_ORIGIN),
    # what NCCL RAS (ncclras, parsers/ncclras.py) named: ranks of a communicator in trouble (missing,
    # with other op counts or status, errors) and job processes missing or dead (rank and comm NULL);
    # host: the node RAS names; group_ranks: a row for ranks RAS counted behind but did not list
    # (rank NULL), how many
    "ras_ranks": shown("ncclras", "ras_ranks",
        "host:VARCHAR rank:INTEGER pid:INTEGER gpu:VARCHAR comm_id comm_hash kind status op_count "
        "collective error missing behind peers_op_count group_ranks:INTEGER" + LOG_ORIGIN,
        own=("gpu", "node")),   # the node RAS names is the host; gpus, the gpu
    # kernel log events (parsers/kernel_log.py: dmesg, journal): NVIDIA Xid, NIC link loss, OOM kills
    # kind: xid | nic_link | oom_kill
    "kernel_events": shown("kernel_log", "kernel_events",
        "host time time_ns:BIGINT kind xid:INTEGER pci pid:INTEGER process message" + LOG_ORIGIN),
    # what the Flight Recorder analyzer (fr_trace / torchfrtrace, parsers/fr_analyzer.py) reported: per
    # collective the ranks that did not join it (missing_ranks) or whose entry disagrees (culprit_ranks),
    # comma lists; host NULL (the report covers the job)
    "fr_report": shown("fr_analyzer", "fr_report",
        "host:VARCHAR kind pg seq record_id op state world_size:INTEGER expected_ranks "
        "missing_ranks culprit_ranks error_type message" + LOG_ORIGIN),
    # ranks that never met: rendezvous and c10d store failures before the first collective
    # (parsers/torch_init.py)
    "init_errors": shown("torch_init", "init_errors",
        "host:VARCHAR rank:INTEGER root_rank:INTEGER kind address timeout_ms error message "
        "ctx_rank:INTEGER ctx_host ctx_clock time_ns:BIGINT" + LOG_ORIGIN),
    # communicator inits a rank began (model/inits.py: the tracer's comm_init, NCCL's Init START/COMPLETE)
    "comm_inits": {
        "host": "VARCHAR", "pid": "BIGINT", "tid": "BIGINT", "fn": "VARCHAR", "rank": "INTEGER", "nranks": "INTEGER",
        "comm_id": "VARCHAR", "start_ns": "BIGINT", "end_ns": "BIGINT", "completed": "BOOLEAN", "source": "VARCHAR",
        "unreached": "VARCHAR",
    },
    # InfiniBand/RoCE port state (parsers/ib_status.py: ibstat, ibstatus, ibv_devinfo, sysfs)
    # peer: iblinkinfo: Switch|CA|Router; the node at the other end
    "ib_ports": shown("ib_status", "ib_ports",
        "host device port:INTEGER state phys_state rate_gbps width speed link_layer tool "
        "node_type peer" + LOG_ORIGIN),
    # a GPU lost as nvidia-smi or the driver says it without an Xid (parsers/nvidia_smi.py)
    "gpu_events": shown("nvidia_smi", "gpu_events", "host bus_id kind tool message" + LOG_ORIGIN),
    # per thread of the traced processes at the start and end of the capture (/proc/PID/task)
    # syscall_name: the syscall the thread sits in (NULL: running, or unknown number)
    # fd: its fd argument, for the fd-taking ones
    # socket_inode: the socket that fd is (joins sockets.inode)
    # wait_events: in | out | in,out: what the wait is for (a recv: in; a send: out)
    "threads": shown("proc_threads", "threads",
        "host:VARCHAR pid:INTEGER rank:INTEGER phase sample_ns tid:INTEGER name state wchan "
        "syscall_name fd socket_inode wait_events utime_ticks stime_ticks artifact:VARCHAR"),
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


__all__ = ["KIND_TYPES", "LOG_ORIGIN", "NCCL_EVENTS_DESIGN", "SCHEMAS", "TABLES", "TCP_EVENTS_DESIGN", "concat", "conform",
           "empty", "shown"]
