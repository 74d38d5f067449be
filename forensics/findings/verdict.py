"""The analysis's one-line verdict: the most important finding's headline, or what the
evidence covered when nothing is wrong.

Policy, not presentation: which finding leads (the first serious one: ``runner.order`` put
them in order), that a failed detector never yields a clean bill of health, and what "no
problem" may claim for the evidence at hand (the logs alone, a capture that traced no call,
NCCL traffic over RDMA that TCP never saw). :class:`forensics.analysis.Analysis` asks for it;
the renderers print it.

Inputs: the model, the ordered findings, the analysis's problem lines, its database (only the
state-at-capture verdict of a capture with no traced call queries it) and options. Output:
one line of at most ``HEADLINE_CHARS``.
"""
from __future__ import annotations

from .base import Context, Finding, Options
from .contract import shorten
from .late_state import state_verdict


def verdict(model, findings: list[Finding], problems: list[str], con=None, options: Options | None = None) -> str:
    """The verdict line (``shorten``: at most HEADLINE_CHARS)."""
    return shorten(_verdict(model, findings, problems, con, options))


def _verdict(model, findings: list[Finding], problems: list[str], con, options: Options | None) -> str:
    serious = [f for f in findings if f.severity in ("error", "warning")]
    if serious:
        return serious[0].headline or serious[0].summary
    failed = [p for p in problems if p.startswith("detector ")]
    if failed:   # never a clean bill of health over a check that did not run
        return (f"No finding, but {len(failed)} detector(s) failed: this analysis is incomplete (see the "
                f"capture section): {failed[0]}")
    n = len(model["nccl_events"])
    if n == 0 and model.logs_only:
        return logs_verdict(model)
    if n == 0:
        said = state_verdict(Context(model, con, options or Options()))
        return said or "No NCCL collectives were captured: no verdict on the job (see the capture section)."
    if any(f.kind == "transport" and f.details.get("rule") == "rdma_invisible_to_tcp" for f in findings):
        # no retransmission means nothing when NCCL's traffic never touched the TCP stack
        return (f"No problem found in {n} NCCL calls; their traffic went over RDMA, invisible to TCP: the "
                "IB counters are the network evidence, and they show no error.")
    return f"No problem found in {n} NCCL calls and their TCP traffic."


def logs_verdict(model) -> str:
    """One sentence when the logs alone hold no problem: what they cover."""
    t = model.tables
    read = sum(len(c.get("files_read") or []) for c in model.captures)
    coll = t.get("coll_log_ops")
    ranks = int(coll["rank"].nunique()) if coll is not None and len(coll) else 0
    what = (f"; COLL lines place all {ranks} ranks" if ranks else "")
    return (f"No failure in {read} log file(s): no NCCL WARN, watchdog timeout or failed process{what}. A slow "
            "link or a straggler needs a capture (stallscope capture).")


__all__ = ["logs_verdict", "verdict"]
