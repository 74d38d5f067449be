"""Column schemas of the event tables (DuckDB types), one source of truth.

Each table starts with exactly DESIGN.md's columns, in DESIGN's order; columns
after those are stallscope's additions, documented here. All times are UTC ns
(BIGINT); monotonic tracer times never reach a table.
"""
from __future__ import annotations

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
        "duration_ns": "BIGINT",         # end_ns - timestamp_ns; NULL while never completed
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
    # what could not be read, per bundle
    "problems": {"host": "VARCHAR", "bundle": "VARCHAR", "problem": "VARCHAR"},
}

TABLES = list(SCHEMAS)
