"""``gpu_error``: a GPU, its driver or its memory failed the job, from what the logs and host say.

- NCCL's CUDA failures (:mod:`forensics.model.nccl_errors`): out of memory while NCCL allocates
  its buffers; a kernel fault, an ECC or NVLink error; a driver, NVML or P2P setup failure;
- PyTorch's watchdog stuck (its heartbeat monitor): a CUDA or NCCL call blocked the watchdog
  thread itself for minutes, which a hung GPU or driver does;
- NVIDIA Xid lines in a kernel log (``kernel_events``: the GPU's PCI address, each Xid's meaning;
  else a captured host's ``host_facts`` count);
- a GPU lost as ``nvidia-smi`` or the driver says it without an Xid (``gpu_events``): no device
  handle for it, fallen off the bus, its adapter failing to initialise, the driver unreachable.

Each names the host and the ranks on it, and the check to run there.
"""
from __future__ import annotations

import pandas as pd

from . import warns
from ..parsers.kernel_log import HARDWARE_XIDS, xid_meaning
from .base import Context, Finding, detector
from ..wording import ranks_text

STUCK_SQL = ("SELECT host, rank, pid, kind, time_ns, message, artifact, log_line FROM watchdog_events "
             "WHERE kind = 'watchdog_stuck' ORDER BY time_ns NULLS LAST, rank")


@detector("gpu_error", kinds=("gpu_error",))
def gpu_error(ctx: Context) -> list[Finding]:
    return _cuda_failures(ctx) + _watchdog_stuck(ctx) + _xids(ctx) + _gpu_events(ctx)


def _cuda_failures(ctx: Context) -> list[Finding]:
    rows = warns.rows_of(ctx, warns.classes_of("gpu_error"))
    out = []
    for cls, g in rows.groupby("class", sort=False):
        ranks = sorted({int(r) for r in pd.to_numeric(g["rank"], errors="coerce").dropna()})
        devs = sorted({int(d) for d in pd.to_numeric(g["dev"], errors="coerce").dropna()})
        detail = (f", {ranks_text(ranks)}" if ranks else "") + (f" (CUDA device {devs[0]})" if len(devs) == 1 else "")
        out.append(warns.class_finding(ctx, "gpu_error", cls, g, confidence=0.85, detail=detail, severity="error"))
    return out


def _watchdog_stuck(ctx: Context) -> list[Finding]:
    wd = ctx.model.tables.get("watchdog_events")
    if wd is None or wd.empty:
        return []
    g = wd[wd["kind"] == "watchdog_stuck"]
    if g.empty:
        return []
    ranks = sorted({int(r) for r in pd.to_numeric(g["rank"], errors="coerce").dropna()})
    hosts = sorted({h for h in g["host"].dropna().astype(str) if not h.startswith("unknown:")})
    t = pd.to_numeric(g["time_ns"], errors="coerce")
    who = ranks_text(ranks) if ranks else "a rank"
    return [Finding(
        kind="gpu_error", severity="error", confidence=0.7,
        summary=(f"PyTorch's watchdog got stuck on {who}" + (f" ({', '.join(hosts[:3])})" if hosts else "")
                 + ": a CUDA or NCCL call blocked its own thread (\"" + str(g.iloc[0]["message"])[:120]
                 + "\"): suspect that rank's GPU or driver."),
        ranks=ranks, hosts=hosts, evidence=warns.evidence(g, ["host", "rank", "pid", "kind", "time_ns", "message",
                                                             "artifact", "log_line"]),
        sql=STUCK_SQL,
        action=(f"On {', '.join(hosts[:2]) or 'its host'}: nvidia-smi (a GPU at 100% with no progress, or not "
                "answering), dmesg for NVIDIA Xid lines, the process's native stack (py-spy dump --native) to see "
                "the blocking call; drain the GPU if it does not recover"),
        score=warns.LOG_FINDING_SCORE, since_ns=int(t.min()) if t.notna().any() else None,
        since_source="PyTorch watchdog heartbeat line" if t.notna().any() else None,
        details={"rule": "watchdog_stuck", "lines": int(len(g))})]


KERNEL_SQL = ("SELECT host, time_ns, xid, pci, pid, process, message, artifact, log_line FROM kernel_events "
              "WHERE kind = 'xid' ORDER BY host, time_ns NULLS LAST, log_line")


def _kernel_xids(ctx: Context) -> list[Finding]:
    """One finding per host from the kernel log's Xid lines (``kernel_events``): which GPU (its
    PCI address), which Xids and what they mean, the first line quoted."""
    k = ctx.model.tables.get("kernel_events")
    if k is None or k.empty:
        return []
    x = k[k["kind"] == "xid"]
    out = []
    for host, g in x.groupby("host", sort=True):
        xids = sorted({int(v) for v in pd.to_numeric(g["xid"], errors="coerce").dropna()})
        pcis = list(dict.fromkeys(g["pci"].dropna().astype(str)))
        named = "; ".join(f"Xid {v}: {xid_meaning(v)}" for v in xids if xid_meaning(v)) or \
            "Xid " + ", ".join(map(str, xids)) + " (see NVIDIA's Xid table)"
        hw = bool(set(xids) & HARDWARE_XIDS)
        t = pd.to_numeric(g["time_ns"], errors="coerce")
        gpu = f"GPU {pcis[0]}" if len(pcis) == 1 else f"{len(pcis)} GPUs ({', '.join(pcis[:3])})"
        out.append(Finding(
            kind="gpu_error", severity="error", confidence=0.85 if hw else 0.75,
            headline=f"GPU fault on {host}: {gpu}, Xid {', '.join(map(str, xids[:4]))}" + " ({since})",
            summary=(f"{host}: {len(g)} NVIDIA Xid line(s) on {gpu}: {named}. First: \"{str(g.iloc[0]['message'])[:160]}\""
                     + (" A hardware fault: the ranks on that GPU fail or hang, their peers wait." if hw else "")),
            ranks=warns.ranks_of_hosts(ctx, [host]) if isinstance(host, str) else [], hosts=[host],
            evidence=warns.evidence(g, ["host", "time_ns", "xid", "pci", "pid", "process", "message", "artifact",
                                        "log_line"]),
            sql=KERNEL_SQL,
            action=(f"On {host}: nvidia-smi -q for {pcis[0] if pcis else 'that GPU'} (ECC, retired pages, NVLink); "
                    + ("drain the GPU and have it checked or reset" if hw else
                       "an application fault: the kernel or the memory access that faulted (compute-sanitizer)")),
            score=warns.FIRST_FAILURE_SCORE if hw else warns.LOG_FINDING_SCORE,
            since_ns=int(t.min()) if t.notna().any() else None,
            since_source="kernel log time" if t.notna().any() else None,
            details={"rule": "kernel_xid", "xids": xids, "pci": pcis, "hardware": hw}))
    return out


def _xids(ctx: Context) -> list[Finding]:
    out = _kernel_xids(ctx)
    hf = ctx.model.tables.get("host_facts")
    if hf is None or hf.empty or "xid_count" not in hf:
        return out
    bad = hf[(pd.to_numeric(hf["xid_count"], errors="coerce").fillna(0) > 0) & ~hf["host"].isin({h for f in out
                                                                                               for h in f.hosts})]
    for r in bad.itertuples(index=False):
        out.append(Finding(
            kind="gpu_error", severity="error", confidence=0.8,
            summary=f"{r.host}: {int(r.xid_count)} NVIDIA Xid line(s) in the kernel log, first: \"{str(r.xid_first)[:160]}\".",
            ranks=warns.ranks_of_hosts(ctx, [r.host]), hosts=[r.host],
            evidence=[{"host": r.host, "xid_count": int(r.xid_count), "xid_first": r.xid_first}],
            sql="SELECT host, xid_count, xid_first FROM host_facts WHERE xid_count > 0",
            action=(f"On {r.host}: look the Xid up (NVIDIA's Xid table: 13/31/43 application or kernel faults, "
                    "48/63/64/94/95 memory ECC, 74 NVLink, 79 the GPU fell off the bus); drain the GPU on a "
                    "hardware Xid"),
            score=warns.LOG_FINDING_SCORE, details={"rule": "xid"}))
    return out


# what each kind of ``gpu_events`` says of the GPU, and whether the GPU itself is gone
GPU_EVENTS = {
    "device_handle": ("is lost: nvidia-smi cannot get a handle to it", True),
    "fallen_off_bus": ("fell off the bus: it no longer answers the driver (as Xid 79 says)", True),
    "init_failed": ("failed to initialise in the driver (RmInitAdapter)", True),
    "reset_required": ("needs a reset: the driver refuses its work until then (NV_ERR_RESET_REQUIRED)", True),
    "err_field": ("shows ERR! in nvidia-smi's table", True),
    "driver_unreachable": ("is out of reach: nvidia-smi cannot talk to the NVIDIA driver", False),
    "nvml_init": ("is out of reach: NVML does not initialise", False),
    "no_devices": ("is not seen: nvidia-smi found no devices", False),
}
GPU_EVENTS_SQL = "SELECT host, bus_id, kind, tool, message, artifact, log_line FROM gpu_events ORDER BY host, log_line"


def _gpu_events(ctx: Context) -> list[Finding]:
    ev = ctx.model.tables.get("gpu_events")
    if ev is None or ev.empty:
        return []
    out = []
    for host, g in ev.groupby(ev["host"].fillna("").astype(str), sort=True):
        first = g.iloc[0]
        said, lost = GPU_EVENTS.get(str(first["kind"]), ("failed", True))
        buses = list(dict.fromkeys(g["bus_id"].dropna().astype(str)))
        gpu = (f"GPU {buses[0]}" if len(buses) == 1 else f"GPUs {', '.join(buses[:4])}" if buses
               else "the GPU" if lost else "every GPU")
        where = f" on {host}" if host else ""
        out.append(Finding(
            kind="gpu_error", severity="error", confidence=0.85 if lost else 0.7,
            headline=f"{gpu[0].upper()}{gpu[1:]}{where} {said.split(':')[0]}",
            summary=(f"{gpu[0].upper()}{gpu[1:]}{where} {said} (\"{str(first['message'])[:160]}\""
                     + (f", {len(g)} line(s)" if len(g) > 1 else "") + ")."),
            ranks=warns.ranks_of_hosts(ctx, [host]) if host else [], hosts=[host] if host else [],
            evidence=warns.evidence(g, ["host", "bus_id", "kind", "tool", "message", "artifact", "log_line"]),
            sql=GPU_EVENTS_SQL,
            action=(f"On {host or 'its host'}: nvidia-smi -q and dmesg for NVIDIA Xid lines (79: fallen off the bus); "
                    "drain the node, reset the GPU (nvidia-smi -r) or reboot, and have a GPU that keeps failing "
                    "replaced" if lost else
                    f"On {host or 'its host'}: the driver's state (lsmod | grep nvidia, dmesg for NVRM lines, the "
                    "driver and library versions); reload the driver or reboot"),
            score=warns.LOG_FINDING_SCORE, details={"rule": "gpu_events", "kinds": sorted(set(g["kind"].dropna())),
                                                    "bus_ids": buses}))
    return out
