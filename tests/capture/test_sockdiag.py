"""capture/sockdiag.py: the ss series read on a netlink socket must say what ss says."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

from capture import sockdiag
from forensics.parsers.ss import SsParser

# what changes between two dumps a few ms apart on an idle connection: time since the last
# packet; the rest must be equal
MOVING = {"line", "info", "lastsnd_ms", "lastrcv_ms", "lastack_ms"}


def _pairs():
    """Connected IPv4 and IPv6 loopback pairs that moved data both ways, then went idle."""
    socks = []
    for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        srv = socket.socket(fam)
        srv.bind((host, 0))
        srv.listen()
        c = socket.create_connection(srv.getsockname()[:2])
        a, _ = srv.accept()
        srv.close()
        c.sendall(b"x" * 300_000)
        got = 0
        while got < 300_000:
            got += len(a.recv(1 << 16))
        a.sendall(b"y" * 1000)
        c.recv(4096)
        socks += [c, a]
    time.sleep(0.3)          # delayed ACKs out: nothing moves between the two dumps
    return socks


def _rows(text: bytes, inodes: set[int]):
    r = SsParser.parse_bytes(text, "sys/host/ss-tinp-end.txt")
    assert not r.warnings, r.warnings
    t = r.tables["sockets"]
    return t[t["inode"].isin(inodes)].sort_values("inode").reset_index(drop=True)


@pytest.mark.skipif(not shutil.which("ss"), reason="needs ss (iproute2) to compare with")
def test_sock_diag_text_parses_to_what_ss_says_for_the_same_sockets():
    socks = _pairs()
    try:
        inodes = {os.fstat(s.fileno()).st_ino for s in socks}
        diag = sockdiag.SockDiag()
        try:
            ours = _rows(diag.text([os.getpid()]), inodes)
        finally:
            diag.close()
        theirs = _rows(subprocess.run(["ss", "-tinpeH"], capture_output=True, check=True).stdout, inodes)
    finally:
        for s in socks:
            s.close()
    assert len(ours) == len(theirs) == 4
    assert set(ours["local_addr"]) == {"127.0.0.1", "::1"}
    assert (ours["pid"] == os.getpid()).all() and ours["users"].notna().all()
    assert (ours["bytes_acked"].max() > 300_000) and (ours["bytes_received"].max() >= 300_000)
    for col in ours.columns:
        if col in MOVING:
            continue
        a, b = ours[col], theirs[col]
        if col.endswith("_bps"):     # ss rounds a rate it computes; ours is the same within 0.1%
            assert ((a - b).abs() <= 1e-3 * b.abs()).all() or (a.isna() & b.isna()).all(), (col, a, b)
        else:
            assert a.equals(b), (col, a.tolist(), b.tolist())


def test_owners_are_read_again_only_for_a_socket_not_seen_before(monkeypatch):
    reads = []
    table = {1: [("python", 10, 3)], 2: [("python", 10, 4)]}

    def read(self, pids):
        reads.append(pids)
        self.pids = pids
        self.owners = dict(table)
    monkeypatch.setattr(sockdiag.Owners, "_read", read)
    o = sockdiag.Owners()
    assert o.lookup({1, 2, 99}, [10])[1] == [("python", 10, 3)] and len(reads) == 1
    assert 99 not in o.owners and o.foreign == {99}
    o.lookup({1, 2, 99}, [10])           # nothing new, 99 known as someone else's: no reading
    assert len(reads) == 1
    table[3] = [("python", 10, 5)]
    assert o.lookup({1, 3}, [10])[3] == [("python", 10, 5)] and len(reads) == 2   # a new connection
    assert o.foreign == set()            # 99 is gone: forgotten
    o.lookup({1, 3}, [10, 11])           # the job has a new process: read again
    assert len(reads) == 3


def test_an_older_kernels_shorter_tcp_info_gives_the_fields_it_has():
    full = sockdiag.TCP_INFO_LAYOUT
    # 4.x kernels without delivery_rate and later: up to data_segs_out (offset 160)
    short = bytearray(160)
    short[0], short[5], short[6] = 1, sockdiag.TCPI_OPT_WSCALE, (7 << 4) | 9
    off = {name: (o, st) for name, o, st in full}
    o, st = off["rtt"]
    st.pack_into(short, o, 1500)
    o, st = off["bytes_acked"]
    st.pack_into(short, o, 123456789)
    ti = sockdiag.parse_tcp_info(bytes(short))
    assert ti["snd_wscale"] == 9 and ti["rcv_wscale"] == 7 and ti["rtt"] == 1500
    assert ti["bytes_acked"] == 123456789 and "data_segs_out" in ti and "delivery_rate" not in ti
    line = sockdiag.info_line(ti, "cubic")
    assert line.startswith("cubic wscale:9,7 ") and "rtt:1.5/0 " in line and "bytes_acked:123456789" in line


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and ip(8) for a network namespace")
def test_a_namespaces_sockets_are_read_from_outside_it_with_their_owner():
    """A job in its own namespace: the socket opened there sees its loopback connection (and
    not this namespace's), the owner found among the job's processes."""
    ns = f"ssd{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    job = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        code = ("import socket,sys,time\n"
                "s=socket.socket();s.bind(('127.0.0.1',0));s.listen()\n"
                "c=socket.create_connection(s.getsockname());a,_=s.accept();c.sendall(b'z'*5000);a.recv(9000)\n"
                "print(s.getsockname()[1],flush=True);time.sleep(60)\n")
        job = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=subprocess.PIPE,
                               text=True)
        port = int(job.stdout.readline())
        pid = job.pid                                # ip netns exec execs the command itself
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        srv = socket.socket()                        # a connection of this namespace: not listed
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        here = [socket.create_connection(srv.getsockname())]
        here.append(srv.accept()[0])
        srv.close()
        diag = sockdiag.SockDiag(f"/proc/{pid}/ns/net")
        try:
            r = SsParser.parse_bytes(diag.text([pid]), "sys/netns/ss-series.txt")
        finally:
            diag.close()
            for h in here:
                h.close()
        t = r.tables["sockets"]
        assert len(t) == 2 and set(t["local_port"]) | set(t["peer_port"]) >= {port}, t
        assert (t["pid"] == pid).all() and set(t["state"]) == {"ESTAB"}
        assert t["bytes_received"].max() == 5000
    finally:
        if job is not None:
            job.kill()
            job.wait()
        subprocess.run(["ip", "netns", "del", ns])

