"""NCCL RAS (NCCL >= 2.24): keep ``ncclras -v`` output when the job's libnccl has RAS and
its client port answers here.

NCCL's RAS thread (one per process) listens on ``NCCL_RAS_ADDR`` (default
``localhost:28028``) in the process's network namespace; ``ncclras`` connects,
sends ``CLIENT PROTOCOL``/``VERBOSE STATUS`` and prints the job summary, the
communicators and their errors/warnings (docs: NCCL User Guide, Troubleshooting,
RAS; client: ``src/ras/client.cc`` of NVIDIA/nccl). Checked before running it: the
mapped libnccl carries RAS (its ``NCCL_RAS_ENABLE`` parameter string), and something
accepts a connection on the port within 1 s. Standard library only.
"""
from __future__ import annotations

import os
import socket
import sys

from .children import run
from .procs import netns_inode

DEFAULT_ADDR = "localhost:28028"
RAS_MARKER = b"NCCL_RAS_ENABLE"
TIMEOUT_S = 30.0
_has_ras: dict[tuple[str, int, int], bool] = {}


def lib_has_ras(path: str) -> bool:
    """Whether a libnccl file contains the RAS subsystem (its parameter name string)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    key = (path, st.st_ino, st.st_mtime_ns)
    if key not in _has_ras:
        found = False
        try:
            with open(path, "rb") as fh:
                tail = b""
                while chunk := fh.read(8 << 20):
                    if RAS_MARKER in tail + chunk:
                        found = True
                        break
                    tail = chunk[-len(RAS_MARKER):]
        except OSError:
            found = False
        _has_ras[key] = found
    return _has_ras[key]


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` / ``host`` -> (host, port)."""
    addr = addr.strip()
    if addr.startswith("["):
        host, _, rest = addr[1:].partition("]")
        port = rest.lstrip(":")
    elif addr.count(":") == 1:
        host, _, port = addr.partition(":")
    else:
        host, port = addr, ""
    return host or "localhost", int(port) if port.isdigit() else 28028


def port_answers(host: str, port: int, pid: int | None, own_ns: bool, timeout: float = 1.0) -> bool:
    """Whether something accepts a TCP connection on host:port in pid's network namespace."""
    if own_ns:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False
    code = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=%g).close()\n"
            "except OSError:\n sys.exit(1)" % timeout)
    rc, _, _ = run(["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-S", "-E", "-c", code, host, str(port)],
                   timeout=timeout + 5)
    return rc == 0


def collect(ctx) -> bytes:
    """The collector: LookupError (skipped, with the reason) when RAS cannot answer here."""
    job = ctx.get("procs") or {}
    if not job:
        raise LookupError("no NCCL process found")
    libs = sorted({lib.host_path for info in job.values() for lib in info.nccl_libs})
    with_ras = [pid for pid, info in sorted(job.items()) if any(lib_has_ras(l.host_path) for l in info.nccl_libs)]
    if not with_ras:
        raise LookupError(f"the job's libnccl has no RAS (NCCL < 2.24 or built without it): {', '.join(libs)}")
    pid = next((p for p in with_ras if os.path.isdir(f"/proc/{p}")), None)
    if pid is None:
        raise LookupError("the job's processes exited")
    addr = next((job[p].env["NCCL_RAS_ADDR"] for p in with_ras if job[p].env.get("NCCL_RAS_ADDR")), DEFAULT_ADDR)
    host, port = split_addr(addr)
    own = netns_inode(pid) == netns_inode("self")
    if not own and os.geteuid() != 0:
        raise LookupError("the job runs in another network namespace: entering it needs root")
    if not port_answers(host, port, pid, own):
        raise LookupError(f"nothing answers on {host}:{port} (NCCL_RAS_ADDR of the job, or the default) "
                          "in the job's network namespace: RAS disabled (NCCL_RAS_ENABLE=0) or not started")
    argv = ["ncclras", "-v"]
    if (host, port) != ("localhost", 28028):
        argv += ["-h", host, "-p", str(port)]
    if not own:
        argv = ["nsenter", f"--net=/proc/{pid}/ns/net"] + argv
    rc, out, err = run(argv, timeout=TIMEOUT_S)
    if rc is None:
        raise RuntimeError(f"still running after {TIMEOUT_S:g}s: killed")
    text = out
    if err.strip():
        text += b"".join(b"# ncclras stderr: " + l + b"\n" for l in err.splitlines()[-50:])
    if rc != 0:
        raise RuntimeError(f"ncclras exited {rc}: {err.decode('utf-8', 'replace').strip()[-300:]}")
    return b"# " + " ".join(argv).encode() + b"\n" + text
