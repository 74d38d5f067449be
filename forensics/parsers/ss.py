"""``ss -tinp`` / ``ss -tinpH`` / ``ss -tainp`` snapshots: TCP sockets with their owner and state.

Each socket is one line ``[Netid] State Recv-Q Send-Q Local:Port Peer:Port [users:((…))]``
followed by a tab-indented info line (``cubic wscale:7,7 rto:204 rtt:0.5/0.25 …
retrans:0/3 … send 1.2Gbps … delivery_rate …``). Addresses are IPv4, IPv6 in
brackets (``[::1]:80``, ``[::ffff:10.0.0.1]:80``), old unbracketed IPv6, ``*``, or
carry an interface scope (``10.0.0.1%eth0``). A socket shared by several processes
lists them all in ``users:``; the first is the owner reported. The header line is
optional (``-H``). Tokens of the info line that are not understood are kept in
``info`` and never warned about (ss adds fields in every release); a socket line whose
columns do not parse, or an info line with no socket, is warned about.

Table ``sockets`` (one row per socket):
    line (int: the socket line), netid (str, NA without ``-a``/several types), state
    (ESTAB, LISTEN, SYN-SENT, …), recv_q, send_q (int), local_addr (str, no brackets),
    local_port (int, NA for ``*``), peer_addr, peer_port, process (str: first owner's
    name), pid (int), fd (int), users (str: every ``name/pid/fd``, comma-separated),
    cong (str: congestion control), rto_ms, rtt_ms, rttvar_ms, ato_ms (float), mss,
    pmtu, cwnd, ssthresh (int), bytes_sent, bytes_retrans, bytes_acked, bytes_received,
    segs_out, segs_in, data_segs_out, data_segs_in (int), retrans_cur, retrans_total
    (int: ``retrans:cur/total``, current unrecovered and total retransmissions), lost,
    unacked, sacked, reordering, reord_seen, dsack_dups, delivered, backoff, notsent,
    snd_wnd, rcv_space, rcv_ssthresh (int), busy_ms, rwnd_limited_ms,
    sndbuf_limited_ms, lastsnd_ms, lastrcv_ms, lastack_ms, minrtt_ms, rcv_rtt_ms
    (float), send_bps, pacing_rate_bps, delivery_rate_bps (float, bits/s), app_limited
    (bool), info (str: the raw info line), inode (int: ``ss -e``'s ``ino:``, joins the
    thread samples' socket_inode), sample_ns (int: UTC time of the sample in a capture
    series file, NA in a plain snapshot).

A capture series (``sys/<ns>/ss-series.txt``) is several snapshots, each after a line
``# stallscope-sample realtime_ns=<ns> monotonic_ns=<ns>``; other ``#`` lines are ignored.

Facts: phase (start|end|series|None, from the file name or the series markers), sockets
(int), pids (sorted owners), samples (int, series only).
"""
from __future__ import annotations

import re

from .ib_counters import phase_of
from .registry import Parser, WarningLog, decode_text, looks_binary, register, split_lines

STATES = {"ESTAB", "LISTEN", "SYN-SENT", "SYN-RECV", "FIN-WAIT-1", "FIN-WAIT-2", "TIME-WAIT", "CLOSE-WAIT",
          "LAST-ACK", "CLOSING", "CLOSED", "UNCONN", "UNKNOWN", "BOUND"}
NETIDS = {"tcp", "udp", "raw", "u_str", "u_dgr", "u_seq", "p_raw", "p_dgr", "nl", "mptcp", "sctp", "tipc", "v_str",
          "v_dgr", "xdp"}
USER_RE = re.compile(r'\("(?P<name>(?:[^"\\]|\\.)*)",pid=(?P<pid>\d+),fd=(?P<fd>\d+)\)')
RATE_RE = re.compile(r"^(?P<v>[\d.]+)(?P<unit>[KMGT]?)bps$")
INO_RE = re.compile(r"(?:^|\s)ino:(\d+)\b")
SAMPLE_RE = re.compile(r"^# stallscope-sample realtime_ns=(\d+)")
UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}

INT_FIELDS = {"mss", "pmtu", "rcvmss", "advmss", "cwnd", "ssthresh", "bytes_sent", "bytes_retrans", "bytes_acked",
              "bytes_received", "segs_out", "segs_in", "data_segs_out", "data_segs_in", "lost", "unacked",
              "sacked", "reordering", "reord_seen", "dsack_dups", "delivered", "backoff", "notsent", "snd_wnd",
              "rcv_space", "rcv_ssthresh", "fackets", "retrans", "probes"}
MS_FIELDS = {"rto": "rto_ms", "ato": "ato_ms", "lastsnd": "lastsnd_ms", "lastrcv": "lastrcv_ms",
             "lastack": "lastack_ms", "minrtt": "minrtt_ms", "rcv_rtt": "rcv_rtt_ms"}
DURATION_FIELDS = {"busy": "busy_ms", "rwnd_limited": "rwnd_limited_ms", "sndbuf_limited": "sndbuf_limited_ms"}
RATE_FIELDS = {"send": "send_bps", "pacing_rate": "pacing_rate_bps", "delivery_rate": "delivery_rate_bps"}
CONG_ALGS = {"cubic", "reno", "bbr", "bbr2", "bbr3", "dctcp", "htcp", "vegas", "westwood", "bic", "highspeed",
             "hybla", "illinois", "lp", "nv", "scalable", "veno", "yeah", "cdg"}


def split_addr(text: str) -> tuple[str | None, int | None] | None:
    """``addr:port`` as ss prints it -> (address, port); None if it is not one."""
    if text.startswith("["):
        m = re.fullmatch(r"\[(?P<a>[^\]]*)\](?:%\S+)?:(?P<p>\d+|\*)", text)
    else:
        m = re.fullmatch(r"(?P<a>.*?)(?:%[\w.@-]+)?:(?P<p>\d+|\*)", text)
    if not m:
        return None
    addr, port = m["a"], m["p"]
    if "%" in addr:
        addr = addr.split("%", 1)[0]
    return addr, (None if port == "*" else int(port))


def _rate(tok: str) -> float | None:
    m = RATE_RE.match(tok)
    return float(m["v"]) * UNITS[m["unit"]] if m else None


def parse_info(info: str) -> dict:
    """The fields of one ``ss -i`` info line."""
    out: dict = {}
    toks = info.split()
    i = 0
    while i < len(toks):
        tok = toks[i]
        i += 1
        if tok in RATE_FIELDS and i < len(toks):
            out[RATE_FIELDS[tok]] = _rate(toks[i])
            i += 1
            continue
        if tok in CONG_ALGS:
            out["cong"] = tok
            continue
        if tok == "app_limited":
            out["app_limited"] = True
            continue
        if ":" not in tok:
            continue
        key, _, val = tok.partition(":")
        try:
            if key == "rtt":
                rtt, _, var = val.partition("/")
                out["rtt_ms"] = float(rtt)
                out["rttvar_ms"] = float(var) if var else None
            elif key == "retrans":
                cur, _, total = val.partition("/")
                out["retrans_cur"] = int(cur)
                out["retrans_total"] = int(total) if total else None
            elif key in MS_FIELDS:
                out[MS_FIELDS[key]] = float(val)
            elif key in DURATION_FIELDS:
                m = re.match(r"(\d+(?:\.\d+)?)ms", val)
                if m:
                    out[DURATION_FIELDS[key]] = float(m[1])
            elif key in INT_FIELDS:
                out[key] = int(val)
        except ValueError:
            out.setdefault("_bad", []).append(tok)
    return out


class SsParser(Parser):
    STRUCTURED = True     # a whole file of its own format
    NAME = "ss"
    DESCRIPTION = "ss -tinp socket snapshot: per-socket TCP state, retransmits and owning pid"
    GLOBS = ("sys/ss*", "sys/**/ss*", "ss-*.txt", "ss_*.txt", "ss.txt")
    SCHEMAS = {"sockets": {
        "line": "int", "netid": "str", "state": "str", "recv_q": "int", "send_q": "int", "local_addr": "str",
        "local_port": "int", "peer_addr": "str", "peer_port": "int", "process": "str", "pid": "int", "fd": "int",
        "users": "str", "cong": "str", "rto_ms": "float", "rtt_ms": "float", "rttvar_ms": "float",
        "ato_ms": "float", "mss": "int", "pmtu": "int", "cwnd": "int", "ssthresh": "int", "bytes_sent": "int",
        "bytes_retrans": "int", "bytes_acked": "int", "bytes_received": "int", "segs_out": "int", "segs_in": "int",
        "data_segs_out": "int", "data_segs_in": "int", "retrans_cur": "int", "retrans_total": "int",
        "lost": "int", "unacked": "int", "sacked": "int", "reordering": "int", "reord_seen": "int",
        "dsack_dups": "int", "delivered": "int", "backoff": "int", "notsent": "int", "snd_wnd": "int",
        "rcv_space": "int", "rcv_ssthresh": "int", "busy_ms": "float", "rwnd_limited_ms": "float",
        "sndbuf_limited_ms": "float", "lastsnd_ms": "float", "lastrcv_ms": "float", "lastack_ms": "float",
        "minrtt_ms": "float", "rcv_rtt_ms": "float", "send_bps": "float", "pacing_rate_bps": "float",
        "delivery_rate_bps": "float", "app_limited": "bool", "info": "str", "inode": "int", "sample_ns": "int"}}

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        t = head.decode("utf-8", "replace")
        if re.search(r"(?m)^(?:Netid\s+)?State\s+Recv-Q\s+Send-Q\s+Local Address:Port", t):
            return True
        return bool(re.search(r"(?m)^(?:tcp\s+)?(?:ESTAB|LISTEN|SYN-SENT|CLOSE-WAIT|FIN-WAIT-\d)\s+\d+\s+\d+\s+\S+:\S+\s+\S+", t)
                    and re.search(r"(?m)^\t.*\b(?:rtt|cwnd|rto):", t))

    @classmethod
    def parse_bytes(cls, data: bytes, label: str):
        log = WarningLog(label)
        facts = {"phase": phase_of(label), "sockets": 0, "pids": []}
        if not data.strip():
            log.add(None, "empty file")
            return cls.result(label, {}, facts, log)
        if looks_binary(data):
            log.add(None, "binary data, not ss output")
            return cls.result(label, {}, facts, log)
        rows: list[dict] = []
        current = None
        sample_ns = None
        for ln, raw in enumerate(split_lines(decode_text(data)), 1):
            if not raw.strip():
                continue
            if raw.startswith("#"):                 # capture's series: "# stallscope-sample realtime_ns=<ns> ..."
                m = SAMPLE_RE.match(raw)
                if m:
                    sample_ns = int(m[1])
                    facts["phase"] = "series"
                    facts["samples"] = facts.get("samples", 0) + 1
                current = None
                continue
            if raw[0] in " \t":                      # info line of the socket above
                if current is None:
                    log.add(ln, "info line without a socket line above it")
                    continue
                info = raw.strip()
                fields = parse_info(info)
                for tok in fields.pop("_bad", []):
                    log.add(ln, f"unreadable ss field {tok!r}")
                current.update(fields)
                current["info"] = (current.get("info") + " " + info) if current.get("info") else info
                continue
            toks = raw.split()
            if toks[0] in ("State", "Netid") or raw.startswith(("Recv-Q", "Total:")):
                current = None
                continue
            row = _socket_line(toks, ln)
            if isinstance(row, str):
                log.add(ln, f"{row}: {raw.strip()[:120]!r}")
                current = None
                continue
            row["sample_ns"] = sample_ns
            rows.append(row)
            current = row
        facts["sockets"] = len(rows)
        facts["pids"] = sorted({r["pid"] for r in rows if r.get("pid") is not None})
        if not rows and not facts.get("samples"):     # a series of an idle namespace is no error
            log.add(None, "no sockets found")
        return cls.result(label, {"sockets": rows}, facts, log)


def _socket_line(toks: list[str], ln: int) -> dict | str:
    netid = None
    if toks[0] in NETIDS:
        netid, toks = toks[0], toks[1:]
    if len(toks) < 5:
        return "socket line with too few columns"
    state, rq, sq, local, peer, *rest = toks
    if state not in STATES:
        return f"unknown socket state {state!r}"
    if not (rq.isdigit() and sq.isdigit()):
        return "non-numeric Recv-Q/Send-Q"
    la, pa = split_addr(local), split_addr(peer)
    if la is None or pa is None:
        return "unreadable address:port"
    row = {"line": ln, "netid": netid, "state": state, "recv_q": int(rq), "send_q": int(sq),
           "local_addr": la[0], "local_port": la[1], "peer_addr": pa[0], "peer_port": pa[1]}
    tail = " ".join(rest)
    users = [(m["name"].replace('\\"', '"'), int(m["pid"]), int(m["fd"])) for m in USER_RE.finditer(tail)]
    if users:
        row["process"], row["pid"], row["fd"] = users[0]
        row["users"] = ",".join(f"{n}/{p}/{f}" for n, p, f in users)
    elif "users:" in tail:
        return "unreadable users:(…) column"
    ino = INO_RE.search(tail)                  # ss -e: the socket's inode
    if ino:
        row["inode"] = int(ino[1])
    return row


register(SsParser)
