"""``stallscope tcp FILE``: the TCP engine on its own (tshark-equivalent verdicts)."""
from __future__ import annotations

import argparse
import datetime as dt

from ..errors import ExitCode
from ..output import open_output

HELP = "per-packet TCP analysis flags of one capture (retransmissions, duplicate ACKs, ...)"

SUMMARY_ORDER = [
    "retransmission", "fast_retransmission", "spurious_retransmission", "out_of_order",
    "lost_segment", "ack_lost_segment", "duplicate_ack", "zero_window", "zero_window_probe",
    "zero_window_probe_ack", "window_full", "window_update", "keep_alive", "keep_alive_ack",
    "reused_ports", "rst",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE.pcap[ng]", help="capture file (pcap or pcapng)")
    p.add_argument("--csv", metavar="OUT", help="write one row per TCP packet ('-' for stdout)")
    p.add_argument("--flows", action="store_true", help="print one line per TCP stream")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")


def run(args: argparse.Namespace, env) -> int:
    # imported here: the CLI must start without numpy (capture runs on bare GPU nodes)
    from ..tcp import TcpAnalyzer
    from ..tcp.csvout import write_packets_csv

    analyzer = TcpAnalyzer(args.file)
    if args.csv:
        with open_output(args.csv, force=args.force, mode="wb") as fh:
            write_packets_csv(fh, analyzer.batches(), analyzer.conversations)
    else:
        for _ in analyzer.batches():
            pass
    out = env.stderr if args.csv == "-" else env.stdout
    stats = analyzer.stats
    for warning in stats.defects + stats.warnings:
        env.warn(warning)
    print(render_summary(stats), file=out)
    if args.flows:
        print(render_flows(analyzer.flows()), file=out)
    # a damaged capture still gets its partial result, but scripts must see it
    return ExitCode.BAD_INPUT if stats.defects else ExitCode.OK


def _utc(ns: int | None) -> str:
    if ns is None:
        return "-"
    t = dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{(ns // 1000) % 1_000_000:06d}Z"


def render_summary(stats) -> str:
    span = ""
    if stats.first_ns is not None and stats.last_ns is not None:
        span = f", {_utc(stats.first_ns)} .. {_utc(stats.last_ns)} ({(stats.last_ns - stats.first_ns) / 1e9:.3f} s)"
    lines = [f"{stats.path}: {stats.format}, {stats.frames} frames, {stats.tcp_packets} TCP packets "
             f"in {stats.streams} stream{'' if stats.streams == 1 else 's'}{span}"]
    counts = stats.verdict_counts
    width = max(len(k) for k in SUMMARY_ORDER)
    for name in SUMMARY_ORDER:
        if counts.get(name):
            lines.append(f"  {name:<{width}}  {counts[name]:>10}")
    if not any(counts.get(k) for k in SUMMARY_ORDER):
        lines.append("  no TCP analysis flags")
    sk = stats.skipped
    skipped = {"not IP": sk.non_ip, "IP but not TCP": sk.ip_not_tcp, "IP fragments": sk.ip_fragment,
               "truncated before the TCP header": sk.truncated, "malformed": sk.malformed,
               "unsupported link type": sum(sk.unknown_linktype.values())}
    parts = [f"{n} {what}" for what, n in skipped.items() if n]
    if parts:
        lines.append("  frames not analysed: " + ", ".join(parts))
    if sk.reassembled:
        lines.append(f"  {sk.reassembled} TCP segments reassembled from IP fragments "
                     "(analysed in the frame of their last fragment, as Wireshark does)")
    return "\n".join(lines)


def render_flows(flows) -> str:
    import pandas as pd
    if flows.empty:
        return "no TCP streams"
    show = pd.DataFrame({
        "stream": flows["stream"],
        "originator": flows["orig_addr"].astype(str) + ":" + flows["orig_port"].astype(str),
        "responder": flows["resp_addr"].astype(str) + ":" + flows["resp_port"].astype(str),
        "pkts": flows["packets_orig"] + flows["packets_resp"],
        "bytes": flows["bytes_orig"] + flows["bytes_resp"],
        "retx": flows["retransmissions"],
        "dupack": flows["duplicate_acks"],
        "rst": flows["rsts"],
        "zerowin": flows["zero_windows"],
        "rtt_ms": (flows["rtt_min_ns"] / 1e6).round(3),
        "history": flows["history"],
    })
    return show.to_string(index=False, na_rep="-")
