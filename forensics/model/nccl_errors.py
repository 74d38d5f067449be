"""What NCCL's WARN lines mean: each class of message, its meaning and the check to run.

NCCL says why it failed in a WARN line, in wordings that changed across versions (2.3 to
2.30) and plugins (the IB plugin of HPC-X, aws-ofi-nccl). :data:`CLASSES` is the table of
them, one row per class: a name, the pattern its message matches (every wording), the finding
kind it feeds, whether it is a cause or a consequence of an earlier failure (``cascade``), what
it usually means and what to check. :func:`classify` puts the class on each ``nccl_warnings``
row; :data:`IB_STATUS` decodes the IB work completion status (``ibv_wc_status``) the
completion errors carry; :func:`first_failures` tells the first failure of the job from the
cascade that follows it.

A WARN that is a consequence (a flushed work request, a proxy that gave up because its
connection died, "remote process exited") points back at an earlier line: the first cause in
time (where lines have times) or in each log's order is what the findings name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class WarnClass:
    name: str
    pattern: re.Pattern
    kind: str              # the finding kind it feeds: ib_errors, connection_reset, misconfiguration, gpu_error,
                           # hang_mismatch, none (context only)
    cascade: bool          # a consequence of an earlier failure, not a cause
    meaning: str
    action: str


def _c(name: str, rx: str, kind: str, cascade: bool, meaning: str, action: str) -> WarnClass:
    return WarnClass(name, re.compile(rx, re.I), kind, cascade, meaning, action)


# Order matters: the first row whose pattern matches a message is its class.
CLASSES: tuple[WarnClass, ...] = (
    _c("ib_completion", r"NET/IB(?:/GIN)? ?: Got completion", "ib_errors", False,
       "an InfiniBand/RoCE work request completed with an error (the status says which)",
       "see the status's own check"),
    _c("ib_async", r"NET/IB ?: (?:\S+:\d+ )?(?:Got (?:async|non-fatal async|async error) event|async fatal event"
                   r"|unknown event type|GID table changed)", "ib_errors", False,
       "the HCA reported an asynchronous event (a port error, a fatal device or queue error, a GID change)",
       "port error: the cable, transceiver or switch port of that device (ibstat, the switch logs); a fatal "
       "or catastrophic error: dmesg for mlx5_core health, the NIC's firmware; drain the node"),
    _c("ib_fatal_followup", r"communicator encountered a fatal error|Call to ibv_poll_cq\(\) returned"
                            r"|ibv_post_send\(\) failed", "ib_errors", True,
       "an IB call failed because the device or queue had already failed", "find the earlier IB error"),
    _c("ofi_completion", r"NET/OFI (?:.*completed with error|Fatal: .*recv completed with error"
                         r"|Unable to (?:read from fi_cq_readerr|retrieve next completion)|.*fi_cq_read\w* failed)",
       "ib_errors", False,
       "a libfabric (EFA, Slingshot) request completed with an error",
       "EHOSTUNREACH / prov_errno 4126 or 15: the security group or reachability between the instances; "
       "103 / 13 / 4124: the peer stopped responding (did it die?)"),
    _c("ofi_setup", r"NET/OFI (?:Unable to|Couldn't|Could not|Failed to|.*\bfi_\w+ (?:failed|returned)|.*\bfailed\b"
                    r"|.*(?:error|Error:|RC: -\d+))", "misconfiguration", False,
       "aws-ofi-nccl (the libfabric plugin for EFA, Slingshot) could not set up: a fabric, domain, endpoint or "
       "address vector it could not open, memory it could not register, or a provider libfabric does not offer",
       "fi_info -p efa (the provider and device are there), the EFA driver and libfabric versions of the image, "
       "FI_PROVIDER, the security group (EFA needs all traffic to itself), ulimit -l, FI_EFA_USE_DEVICE_RDMA"),
    _c("libfabric", r"^libfabric[: ]", "ib_errors", False,
       "libfabric (the EFA or Slingshot provider under aws-ofi-nccl) logged an error",
       "the provider's error (fi_info -p efa; an unreachable peer: the security group and the subnet; a CQ "
       "error: the peer process, did it die?)"),
    _c("size_mismatch", r"message truncated|collective mismatch error|posted incorrect receive info"
                        r"|Mismatched collective detected|may be hanging, this may be caused by a collective mismatch",
       "hang_mismatch", False,
       "ranks disagree on a collective's size: a collective mismatch (different counts, dtypes or order), "
       "or a protocol or algorithm set differently on some ranks",
       "compare the ranks' collective calls at that point (the same ops, sizes and order on every rank), "
       "and NCCL_PROTO / NCCL_ALGO in every rank's environment"),
    _c("socket_reset", r"reset by peer", "connection_reset", False,
       "a TCP connection between ranks was reset: the peer's kernel refused it (the peer died, was killed, "
       "or a firewall reset it)", "the peer's own log for its first error; firewall/conntrack rules"),
    _c("socket_broken_pipe", r"broken pipe", "connection_reset", True,
       "NCCL sent on a connection the peer had closed", "the peer's own log for its first error"),
    _c("socket_closed", r"closed by remote peer|Connection closed by|Net : Connection closed", "connection_reset",
       True, "the peer closed the connection: its process exited, crashed or aborted",
       "the named peer's log for its first error (OOM kill, segfault, Xid, watchdog abort)"),
    _c("socket_timeout", r"Connection timed out|No route to host|Network is unreachable", "connection_reset", False,
       "a connection to a peer timed out: the host or the path to it is gone",
       "ping/route to the peer on the interface NCCL uses, the firewall, whether the host is up"),
    _c("connect_failed", r"Connect to .* failed|connect (?:to \S+ )?returned .*(?:exceeded|retry)|exceeded retries"
                         r"|exceeded timeouts|Connection refused|Call to connect", "connection_reset", False,
       "a rank could not connect to a peer: nobody listening (the peer did not start or already exited) "
       "or the wrong address/interface", "that every rank started; NCCL_SOCKET_IFNAME; the firewall"),
    _c("socket_handshake", r"socketFinalizeAccept|wrong magic|wrong type \d+ != \d+", "misconfiguration", False,
       "a connection from something that is not this job's NCCL reached its port, or the ranks disagree "
       "on the connection sequence", "another job on the same ports, scanners, mixed NCCL versions"),
    # before "bootstrap": no interface at all is the host's setup, not the ranks disagreeing;
    # the garbage address family of an uninitialised address (2.27) and a socket of a family
    # the host has no interface for are the same failure, worded later
    _c("no_interface", r"no socket interface(?: found)?|no device found matching|No IP interface found"
                       r"|NET/Socket ?: no interface found|is neither AF_INET\(2\) nor AF_INET6"
                       r"|Socket creation failed ?: Address family not supported|Failed to find .*interface",
       "misconfiguration", False,
       "no network interface NCCL can use: NCCL_SOCKET_IFNAME (or NCCL_OOB_NET_IFNAME) names none that "
       "exists and is up on the host, or the host has no IP interface",
       "ip -br addr on that host; set NCCL_SOCKET_IFNAME to an interface that exists and is up there (=eth0, "
       "or ^lo,docker to exclude), or unset it"),
    _c("bootstrap", r"Bootstrap(?: Root)? ?: (?:mismatch|rank \d+ of \d+ ranks has already checked in)"
                    r"|Invalid NCCL_COMM_ID|bootstrap\w* (?:failed|error)|Unexpected magic|ncclGetUniqueId",
       "misconfiguration", False,
       "the ranks' bootstrap disagrees: a wrong world size, a rank started twice, two jobs on one "
       "rendezvous address", "RANK / WORLD_SIZE / MASTER_ADDR of the launcher; NCCL_COMM_ID"),
    _c("topology", r"ring \d+ does not (?:loop back|contain)|Duplicate GPU detected|Mismatched NCCL version"
                   r"|version mismatch with remote peer|no algorithm/protocol available|incompatible devices",
       "misconfiguration", False,
       "the ranks built different topologies, share a GPU, or run different NCCL versions",
       "the same NCCL version and NCCL_* environment on every rank; the local-rank-to-GPU mapping"),
    _c("resource_memlock", r"Call to ibv_(?:reg_mr\w*|reg_dmabuf_mr|create_cq|create_qp|alloc_pd) failed"
                           r"(?: with error (?:Cannot allocate memory|Operation not permitted|\S.*))?",
       "misconfiguration", False,
       "NCCL could not register memory or create an IB queue: the locked-memory limit (ulimit -l) is too "
       "low inside the job, or the HCA ran out of resources",
       "ulimit -l in the job's environment (unlimited; the launcher and container pass their own), "
       "NCCL_IB_QPS_PER_CONNECTION"),
    _c("resource_ib", r"Call to ibv_modify_qp failed|NET/IB ?: Unable to (?:open|query) device"
                      r"|ibv_open_device|Failed to open libibverbs", "misconfiguration", False,
       "an IB device could not be opened or a queue pair could not be connected (wrong GID index, "
       "unreachable rail)", "NCCL_IB_GID_INDEX, NCCL_IB_HCA, NCCL_CROSS_NIC; ibstat on both ends"),
    # before "resource_shm": the segment another process made is not there to attach to (2.24+
    # processes of different NCCL versions name it differently; containers without a shared /dev/shm)
    _c("shm_attach", r"(?:Error while )?attaching to shared memory segment", "misconfiguration", False,
       "a process could not attach to another process's shared memory segment: the segment is gone or named "
       "otherwise (processes of different NCCL versions, a regression of a newer NCCL, containers that do not "
       "share /dev/shm), not a /dev/shm too small",
       "one NCCL version in every process of the host (a wheel bundling its own libnccl, LD_LIBRARY_PATH); "
       "a shared /dev/shm (docker --ipc=host); else the previous NCCL release (2.21.5 fixed it where 2.24 "
       "failed), or NCCL_SHM_DISABLE=1"),
    _c("resource_shm", r"/dev/shm|shared memory segment|posix_fallocate|failed to extend|Could not map",
       "misconfiguration", False, "NCCL could not create its shared memory: /dev/shm is too small",
       "the container's shm size (docker --shm-size, a memory emptyDir on Kubernetes), or NCCL_SHM_DISABLE=1"),
    _c("nvls", r"\bNVLS\b|[Mm]ulticast|cuMulticast|\bIMEX\b|NVLink SHARP", "gpu_error", False,
       "NVLink SHARP (NVLS) or CUDA multicast could not be set up: the fabric manager or IMEX service, the "
       "driver, or a GPU without NVSwitch multicast",
       "nvidia-fabricmanager (and IMEX on GB200) on that host, the driver version, nvidia-smi -q (fabric state); "
       "NCCL_NVLS_ENABLE=0 to run without it"),
    _c("cuda_oom", r"Cuda failure (?:\d+ )?'out of memory'", "gpu_error", False,
       "the GPU had no memory left for NCCL's buffers",
       "leave headroom for NCCL (the framework's caching allocator), smaller NCCL_BUFFSIZE"),
    _c("cuda_fault", r"Cuda failure (?:\d+ )?'(?:unspecified launch failure|an illegal memory access|"
                     r"uncorrectable (?:ECC|NVLink)|misaligned|an illegal instruction|unknown error|"
                     r"device-side assert)", "gpu_error", False,
       "a GPU fault (a kernel crashed, an ECC or NVLink error)",
       "dmesg on that host for an NVIDIA Xid (13, 31, 43, 48, 74, 79, 94, 95), nvidia-smi -q; drain the "
       "node on a hardware Xid"),
    _c("cuda_setup", r"Cuda failure|CUDA driver version is insufficient|named symbol not found|nvmlInit"
                     r"|NVML failure|libnvidia-ml|P2P is disabled between NVLINK|NVLink SHARP|peer access is not"
                     r" supported", "gpu_error", False,
       "a CUDA or NVML call failed on that GPU (driver or toolkit mismatch, P2P/NVLink disabled, the "
       "fabric manager down)", "nvidia-smi, the driver and CUDA versions of the image, nvidia-fabricmanager"),
    _c("error_return", r"^[\w./-]+:\d+ (?:\(\w+\) )?-> \d+", "none", True,
       "an NCCL call failed and returned an error code, with no WARN line that says why (the ``file:line -> N`` "
       "lines: 1 a CUDA error, 2 a system or network error, 3 internal, 4/5 a wrong argument or usage, 6 a "
       "remote peer's error)",
       "the job's first failure: the same process's output before it (NCCL_DEBUG=WARN or INFO to see why), "
       "the peers' logs for a WARN line"),
    _c("invalid_usage", r"invalid usage|Invalid (?:config|rank|root|nranks|comm|communicator|argument|value|"
                        r"data ?type|reduction|op\b|type|size|count|buffer|pointer|device|group)|is (?:invalid|out of "
                        r"range)|Trying to (?:use|call)|has already been (?:destroyed|finalized)|must be called",
       "misconfiguration", False,
       "NCCL was called the wrong way (ncclInvalidUsage / ncclInvalidArgument): an argument, a rank, a "
       "communicator already destroyed, a group call left open, or a setting out of range",
       "the call and its arguments the WARN names (the framework's collective on that rank); NCCL_* values"),
    _c("proxy", r"\[Proxy Service \d+\]|\[Service thread\]|Socket recv failed while polling|Proxy Call to rank"
                r"|is in abort state|ncclProxyCall|commReclaim|Could not receive type from localRank",
       "none", True, "NCCL's proxy gave up because of an earlier failure (or a local rank exited)",
       "the WARN before it on the same process, or the job's first failure"),
    _c("plugin_load", r"(?:NET|TUNER|PROFILER|ENV|COLLNET|GIN|RAS)/Plugin ?:|Plugin load|[Ff]ailed to (?:load|open|find)"
                      r" .*(?:[Pp]lugin|\.so)|cannot open shared object|dlopen", "none", False,
       "NCCL could not load a plugin (network, tuner, profiler): it falls back to its internal transport (IB or "
       "sockets), which on EFA or another fabric means slow sockets",
       "the plugin library on LD_LIBRARY_PATH (libnccl-net.so, aws-ofi-nccl), NCCL_NET_PLUGIN; harmless where "
       "the internal IB transport is what the job uses"),
    _c("system_error", r"unhandled system error|ncclSystemError|System call \(e\.g\. socket, malloc\)"
                       r"|remote process exited or there was a network error|internal error|ncclInternalError",
       "none", True, "an NCCL call returned an error code after an earlier failure",
       "the WARN before it on the same process, or the job's first failure"),
    _c("socket_other", r"NET/Socket : socket progress error|socketProgress|Call to recv|Call to send"
                       r"|socketPollConnect|socketStartConnect", "connection_reset", True,
       "a socket to a peer failed", "the peer's log for its first error"),
)
CLASS_BY_NAME = {c.name: c for c in CLASSES}

# ibv_wc_status (rdma-core libibverbs/verbs.h): name, what it usually means, whether it follows
# an earlier failure rather than causing one
IB_STATUS: dict[int, tuple[str, str, bool]] = {
    0: ("SUCCESS", "no error", True),
    1: ("LOC_LEN_ERR", "a local length error: a posted buffer too small (a size mismatch between ranks, "
                       "or a software bug), not the fabric", False),
    2: ("LOC_QP_OP_ERR", "a local queue-pair operation error: a queue already broken by an earlier error, or "
                         "a software bug", True),
    3: ("LOC_EEC_OP_ERR", "a local EE context error (RD transport; not expected with NCCL)", False),
    4: ("LOC_PROT_ERR", "a local protection error: the HCA could not reach local memory; with NCCL almost always "
                        "GPUDirect RDMA (PCIe ACS/IOMMU, nvidia-peermem or dma-buf, BAR1)", False),
    5: ("WR_FLUSH_ERR", "work request flushed: the queue had already failed; a consequence, the cause is an "
                        "earlier error here or on the peer (or the peer process died)", True),
    6: ("MW_BIND_ERR", "a memory window bind error (not used by NCCL)", False),
    7: ("BAD_RESP_ERR", "a bad response from the responder: the remote HCA or its firmware", False),
    8: ("LOC_ACCESS_ERR", "a local access error: a local memory registration problem (GPUDirect RDMA)", False),
    9: ("REM_INV_REQ_ERR", "the peer rejected the request as invalid: a version or configuration mismatch between "
                           "the peers, or a broken remote queue", False),
    10: ("REM_ACCESS_ERR", "the peer rejected the access (its memory registration, GPUDirect RDMA or ACS, or it "
                           "was tearing down)", False),
    11: ("REM_OP_ERR", "the peer could not complete the operation (its queue failed, or its own protection "
                       "error)", False),
    12: ("RETRY_EXC_ERR", "transport retries exceeded: no acknowledgement from the peer's HCA; the link or port "
                          "is down or flapping, a switch or route problem, or the peer host/HCA is gone", False),
    13: ("RNR_RETRY_EXC_ERR", "receiver-not-ready retries exceeded: the peer posts no receives (its process is "
                              "stalled or hung)", False),
    14: ("LOC_RDD_VIOL_ERR", "a local RDD violation (RD transport; not expected)", False),
    15: ("REM_INV_RD_REQ_ERR", "a remote invalid RD request (RD transport; not expected)", False),
    16: ("REM_ABORT_ERR", "the peer aborted the operation (its queue destroyed or reset: teardown or a crash)", False),
    17: ("INV_EECN_ERR", "an invalid EE context number (RD transport)", False),
    18: ("INV_EEC_STATE_ERR", "an invalid EE context state (RD transport)", False),
    19: ("FATAL_ERR", "a fatal HCA error (device level)", False),
    20: ("RESP_TIMEOUT_ERR", "the responder did not answer in time (the peer or the fabric)", False),
    21: ("GENERAL_ERR", "a general error from the provider (see the vendor error and dmesg)", False),
}
IB_STATUS_ACTION = {
    4: "check PCIe ACS and the IOMMU on that host (ACS off, or redirected), the nvidia-peermem module or dma-buf "
       "support, the NIC firmware; confirm with NCCL_NET_GDR_LEVEL=0",
    8: "check GPUDirect RDMA on that host: ACS/IOMMU, nvidia-peermem",
    12: "check the link between that host and the named peer: ibstat / the port counters on both (symbol errors, "
        "link downed), the switch port and its logs, dmesg on both nodes; drain the node whose link flaps",
    13: "check the peer rank's process: alive? stuck (its stack)?",
    5: "find the first error that is not a flush, here or on the peer; none: did the peer process die?",
    10: "look at the peer node: its GPUDirect RDMA setup, whether it was tearing down",
    11: "look at the peer node: its own errors first",
    9: "the same NCCL version and settings on both ends",
    19: "dmesg for mlx5_core health on that host, the NIC's firmware; drain the node",
    20: "the peer and the fabric path to it",
}


def ib_status_name(st) -> str | None:
    try:
        return IB_STATUS[int(st)][0]
    except (KeyError, TypeError, ValueError):
        return None


# the source file of a WARN whose message names no class (NCCL >= 2.9 prints it): its class
SOURCE_CLASSES = (("bootstrap", re.compile(r"^bootstrap\.cc$")),)


def classify(messages: pd.Series, src_files: pd.Series | None = None) -> pd.Series:
    """The :data:`CLASSES` name of each WARN message ("other" where none matches); a message no
    pattern matches takes the class of its source file where :data:`SOURCE_CLASSES` names it."""
    out = _classify(messages)
    if src_files is not None and (out == "other").any():
        src = src_files.astype("string").fillna("").reindex(out.index, fill_value="")
        for name, rx in SOURCE_CLASSES:
            hit = (out == "other") & src.str.contains(rx, regex=True).fillna(False).astype(bool)
            out[hit] = name
    return out


def _classify(messages: pd.Series) -> pd.Series:
    msg = messages.astype("string").fillna("")
    out = pd.Series("other", index=msg.index, dtype="object")
    left = np.ones(len(msg), bool)
    for c in CLASSES:
        if not left.any():
            break
        hit = msg[left].str.contains(c.pattern, regex=True).fillna(False).to_numpy()
        idx = np.flatnonzero(left)[hit]
        out.iloc[idx] = c.name
        left[idx] = False
    return out


def is_cascade(classes: pd.Series, ib_status: pd.Series) -> pd.Series:
    """Whether each classified WARN is a consequence of an earlier failure (its class, or an IB
    status that follows another error, such as a flushed work request)."""
    base = classes.map(lambda c: CLASS_BY_NAME[c].cascade if c in CLASS_BY_NAME else True)
    st = pd.to_numeric(ib_status, errors="coerce")
    flushed = st.map(lambda s: IB_STATUS.get(int(s), ("", "", False))[2] if pd.notna(s) else False)
    return (base | ((classes == "ib_completion") & flushed.astype(bool))).astype(bool)


def first_failures(w: pd.DataFrame) -> pd.Series:
    """For ``nccl_warnings`` rows with ``class``, ``cascade``, ``time_ns`` (may be NA),
    ``artifact`` and ``log_line``: True on the job's first failure. The earliest cause in time
    where lines carry times (every log's line order breaking ties); without times, the first
    cause of each log (one per file: the files cannot be ordered against each other)."""
    if w.empty:
        return pd.Series(dtype=bool)
    cause = ~w["cascade"].astype(bool) & (w["class"] != "other")
    pool = w[cause] if cause.any() else w[w["class"] != "other"]
    if pool.empty:
        return pd.Series(False, index=w.index)
    t = pd.to_numeric(pool["time_ns"], errors="coerce")
    out = pd.Series(False, index=w.index)
    if t.notna().any():
        first = pool.assign(_t=t).sort_values(["_t", "log_line"], kind="stable", na_position="last").index[0]
        out.loc[first] = True
        return out
    firsts = pool.sort_values(["artifact", "log_line"], kind="stable").drop_duplicates("artifact").index
    out.loc[firsts] = True
    return out


__all__ = ["CLASSES", "CLASS_BY_NAME", "IB_STATUS", "IB_STATUS_ACTION", "WarnClass", "classify", "first_failures",
           "ib_status_name", "is_cascade"]
