"""Real Linux TCP captured in network namespaces, with injected loss: engine vs tshark.

Four runs of one bulk transfer sender (ns a) -> receiver (ns b) over veth pairs, each
captured with tcpdump (-s 128, nanosecond pcap) in both namespaces:

  clean_tso      offloads on (TSO/GSO/GRO: super-segments in the captures), no injected
                 loss, tbf 2 Gbit/s with a 1 s queue (no tbf drops).  A veth can still drop
                 on backlog overflow; then the kernel's RetransSegs counts it and the
                 captures must show retransmissions (counted while they capture: a probe of
                 the closing FIN can come after they stop); when it counts none up to the
                 end, the sender's capture must be free of loss verdicts (the receiver's may
                 show GRO reordering on a multi-CPU receive path, which is real)
  slow_reader    offloads on, no loss, a receiver that sleeps and reads slowly with a 64 KiB
                 receive buffer: zero windows, window probes, window updates
  loss_tso       offloads on, every 40th data packet dropped at the receiver's input hook
                 (deterministic nft `numgen inc`), tbf 200 Mbit/s on the sender; also a
                 dumpcap pcapng capture at the receiver
  loss_routed    offloads off (MSS-sized segments), sender -- router -- receiver: random
                 drops in the router's forward hook (2% of data: the receiver's capture
                 misses them -> "previous segment not captured"; 1% of ACKs: the sender's
                 capture misses them), plus 1% of data at the receiver's input hook (captured,
                 then dropped); tbf 100 Mbit/s on the sender

Each capture must agree with tshark 100%; the lossy runs must really contain
retransmissions (so the comparison is not vacuous), checked against nft's drop counters
and the kernel's RetransSegs.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import netns
import oracle

pytestmark = [pytest.mark.root, pytest.mark.slow]

NBYTES = 6 << 20
RUNS = {
    "clean_tso": dict(offloads=True, loss=[], rate="2gbit", latency="1s", pcapng=False),
    "loss_tso": dict(offloads=True, loss=[("b", "input", dict(every_nth=40, direction="dport"))],
                     rate="200mbit", pcapng=True),
    "loss_routed": dict(offloads=False, router=True,
                        loss=[("r", "forward", dict(per_mille=20, direction="dport")),
                              ("r", "forward", dict(per_mille=10, direction="sport")),
                              ("b", "input", dict(per_mille=10, direction="dport"))],
                        rate="100mbit", pcapng=False),
    "slow_reader": dict(offloads=True, loss=[], rate=None, pcapng=False, nbytes=2 << 20,
                        reader=dict(reader_delay=0.8, rcvbuf=65536, read_pause=0.03)),
}
CAPTURES = [(r, c) for r in RUNS for c in (["sender.pcap", "receiver.pcap"]
                                          + (["receiver.pcapng"] if RUNS[r]["pcapng"] else []))]


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    why = netns.missing_requirements()
    if why:
        pytest.skip(f"netns captures: {why}")
    try:
        oracle.tshark_info()
    except oracle.OracleUnavailable as e:
        pytest.skip(f"TCP oracle unavailable: {e}")
    base = tmp_path_factory.mktemp("sstcp-netns")
    out = {}
    for name, cfg in RUNS.items():
        d = base / name
        d.mkdir()
        with netns.NetnsPair(offloads=cfg["offloads"], router=cfg.get("router", False)) as pair:
            for side, hook, kw in cfg["loss"]:
                pair.add_loss(side, hook, **kw)
            if cfg["rate"]:
                pair.rate_limit("a", rate=cfg["rate"], latency=cfg.get("latency", "20ms"))
            files = {"sender.pcap": d / "sender.pcap", "receiver.pcap": d / "receiver.pcap"}
            with pair.capture("a", files["sender.pcap"]), pair.capture("b", files["receiver.pcap"]):
                if cfg["pcapng"] and shutil.which("dumpcap"):
                    files["receiver.pcapng"] = d / "receiver.pcapng"
                    with pair.capture("b", files["receiver.pcapng"], tool="dumpcap"):
                        secs = pair.transfer(cfg.get("nbytes", NBYTES), **cfg.get("reader", {}))
                else:
                    secs = pair.transfer(cfg.get("nbytes", NBYTES), **cfg.get("reader", {}))
                kretx_seen = pair.tcp_retrans_segs("a")   # what the captures (still running) must show
            drops = sum(pair.loss_counters(s) for s in pair.ns)
            kretx = pair.tcp_retrans_segs("a")
            offl = pair.offload_state("a")
            capdrops = {k: pair.capture_drops.get(str(v), -1) for k, v in files.items()}
        out[name] = {"files": files, "drops": drops, "seconds": secs, "offloads": offl, "kernel_retrans": kretx,
                     "kernel_retrans_captured": kretx_seen,
                     "capture_drops": capdrops}
    return out


def _capture(captures, run, cap) -> Path:
    f = captures[run]["files"].get(cap)
    if f is None:
        pytest.skip(f"{cap} not produced (dumpcap missing)")
    return f


def _tshark():
    try:
        return oracle.tshark_info()
    except oracle.OracleUnavailable as e:
        pytest.skip(f"TCP oracle unavailable: {e}")


@pytest.mark.parametrize("run,cap", CAPTURES, ids=[f"{r}-{c}" for r, c in CAPTURES])
def test_netns_capture_matches_tshark(captures, run, cap):
    _tshark()
    path = _capture(captures, run, cap)
    expected = oracle.oracle_packets(path)
    assert len(expected) > 50, f"{run}/{cap}: only {len(expected)} TCP frames captured"
    try:
        from forensics.tcp import analyze_file
    except ImportError as e:
        pytest.fail(f"cannot import forensics.tcp.analyze_file: {e!r}")
    ours = analyze_file(str(path)).packets
    mm = oracle.compare(ours, expected)
    assert not mm, oracle.format_mismatches(mm, label=f"netns {run}/{cap} ({captures[run]})")


def test_netns_runs_are_meaningful(captures):
    """The lossy runs really lose and retransmit, the clean one does not; TSO runs carry
    super-segments, the plain one only MSS-sized segments."""
    _tshark()
    problems = []
    for run, info in captures.items():
        cfg = RUNS[run]
        for cap, path in info["files"].items():
            df = oracle.oracle_packets(path)
            retx = int(df["retransmission"].sum())
            maxlen = int(df["len"].max())
            counts = {v: int(df[v].sum()) for v in oracle.VERDICTS if df[v].sum()}
            print(f"{run}/{cap}: {len(df)} TCP frames, max len {maxlen}, {info['drops']} nft drops, "
                  f"{info['kernel_retrans']} kernel RetransSegs, {info['capture_drops'][cap]} capture drops, "
                  f"{info['seconds']:.2f} s, offloads {info['offloads']}, verdicts {counts}")
            if cfg.get("reader"):
                if not (df["zero_window"].sum() and df["window_update"].sum()):
                    problems.append(f"{run}/{cap}: slow reader but no zero window / window update")
            elif cfg["loss"]:
                if retx == 0:
                    problems.append(f"{run}/{cap}: lossy run without any retransmission ({info['drops']} drops)")
            elif info["kernel_retrans_captured"] > 0:
                # a segment resent sooner after the last one than the conversation's initial RTT
                # (Wireshark's out-of-order threshold) is "out_of_order", not "retransmission"
                resent = int(df[["retransmission", "fast_retransmission", "spurious_retransmission",
                                 "out_of_order"]].to_numpy().sum())
                if resent == 0:
                    problems.append(f"{run}/{cap}: kernel retransmitted {info['kernel_retrans_captured']} segments "
                                    "while the capture ran, capture shows none")
            elif info["kernel_retrans"] == 0 and info["capture_drops"][cap] == 0 and cap.startswith("sender"):
                # no injected loss, the kernel retransmitted nothing and the capture lost
                # nothing: the sender's capture must be free of loss verdicts.  (Only the
                # sender's: with GRO the receive path of a veth on several CPUs can reorder
                # segments, which the receiver's capture rightly shows.)
                flagged = int(df[["retransmission", "lost_segment", "ack_lost_segment", "out_of_order"]].to_numpy().sum())
                if flagged:
                    problems.append(f"{run}/{cap}: clean run has {flagged} loss-related verdicts")
            if cfg["offloads"] and info["offloads"].get("tcp-segmentation-offload") == "on" and maxlen <= 1448:
                problems.append(f"{run}/{cap}: TSO on but no super-segment (max tcp.len {maxlen})")
            if not cfg["offloads"] and maxlen > 1448:
                problems.append(f"{run}/{cap}: offloads off but tcp.len {maxlen} > MSS")
        if cfg["loss"] and info["kernel_retrans"] == 0:
            problems.append(f"{run}: the sender's kernel retransmitted nothing")
        if cfg["loss"] and info["drops"] == 0:
            problems.append(f"{run}: nftables dropped nothing")
    assert not problems, "\n".join(problems)


def test_netns_teardown_leaves_nothing(captures):
    """Every namespace this process created is gone after its run."""
    import os
    import subprocess
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mine = [l for l in names.splitlines() if l.startswith(f"{netns.PREFIX}{os.getpid()}-")]
    assert not mine, f"namespaces left behind: {mine}"
