"""The command line: summaries, the CSV, and one clear line with exit 2 on bad input."""
from __future__ import annotations

import io
import subprocess
import sys

import pandas as pd
import pytest

from conftest import FIXTURES
from hung_process import DUMP_ON_SIGNAL, run_explained
from forensics.cli import Env, main
from forensics.tcp import PACKET_COLUMNS, analyze_file

PUBLIC = FIXTURES / "pcaps" / "public"
BAD = FIXTURES / "pcaps" / "bad"
DUPACK = PUBLIC / "tcp_dupack.pcapng"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), Env(stdout=out, stderr=err))
    return code, out.getvalue(), err.getvalue()


def test_summary_counts_verdicts_like_tshark_io_stat():
    code, out, err = run("tcp", str(DUPACK))
    assert code == 0, err
    lines = {l.split()[0]: int(l.split()[1]) for l in out.splitlines()[1:] if l.startswith("  ") and l.split()[1].isdigit()}
    # tcp_dupack.pcapng: three dup ACKs then a fast retransmission (counted as a retransmission too)
    assert lines == {"retransmission": 1, "fast_retransmission": 1, "duplicate_ack": 3}
    assert "9 frames, 9 TCP packets in 1 stream" in out


def test_csv_has_one_row_per_tcp_packet_and_matches_the_api(tmp_path):
    dest = tmp_path / "out.csv"
    code, _, err = run("tcp", str(DUPACK), "--csv", str(dest))
    assert code == 0, err
    csv = pd.read_csv(dest)
    assert list(csv.columns) == PACKET_COLUMNS
    api = analyze_file(DUPACK).packets
    assert len(csv) == len(api) == 9
    for col in PACKET_COLUMNS:
        assert csv[col].astype(str).tolist() == api[col].astype(str).tolist(), col
    assert csv.loc[csv.frame == 8, "fast_retransmission"].item() == 1
    assert csv.loc[csv.frame == 7, "duplicate_ack_num"].item() == 3


def test_csv_never_overwrites_without_force(tmp_path):
    dest = tmp_path / "out.csv"
    dest.write_text("precious\n")
    code, _, err = run("tcp", str(DUPACK), "--csv", str(dest))
    assert code == 2
    assert "already exists" in err and len(err.strip().splitlines()) == 1
    assert dest.read_text() == "precious\n"
    code, _, _ = run("tcp", str(DUPACK), "--csv", str(dest), "--force")
    assert code == 0 and dest.read_text().startswith("frame,stream,")


def test_flows_table_has_history_and_endpoints():
    code, out, _ = run("tcp", str(DUPACK), "--flows")
    assert code == 0
    assert "172.31.136.85:38760" in out and "195.81.202.68:80" in out
    assert "history" in out


def _one_error_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("content, expect", [
    (b"", "empty"),
    (b"\x00\x01", "empty or too short"),
    (b"this is not a capture file at all", "not a pcap or pcapng file"),
    (b"\xd4\xc3\xb2\xa1\x02\x00", "truncated pcap file header"),
    (bytes.fromhex("0a0d0d0a") + b"\xff" * 40, "corrupt pcapng"),
])
def test_unreadable_input_gives_one_line_and_exit_2(tmp_path, content, expect):
    path = tmp_path / "bad.pcap"
    path.write_bytes(content)
    code, out, err = run("tcp", str(path))
    assert code == 2
    assert expect in _one_error_line(err)
    assert out == ""


def test_missing_file_and_directory(tmp_path):
    code, _, err = run("tcp", str(tmp_path / "nope.pcap"))
    assert code == 2 and "cannot open" in _one_error_line(err)
    code, _, err = run("tcp", str(tmp_path))
    assert code == 2 and "cannot open" in _one_error_line(err)


def test_truncated_capture_gives_partial_result_warning_and_exit_2(tmp_path):
    data = DUPACK.read_bytes()
    path = tmp_path / "cut.pcapng"
    path.write_bytes(data[: len(data) - 50])       # cut inside the last packet block (frame 9)
    code, out, err = run("tcp", str(path))
    assert code == 2
    assert "file ends inside a record" in err and "Traceback" not in err
    assert "8 frames, 8 TCP packets" in out           # everything before the cut


def test_corruption_after_good_records_keeps_what_came_before(tmp_path):
    data = bytearray(DUPACK.read_bytes())
    # find the 5th enhanced packet block and break its length field
    pos, seen = 0, 0
    import struct
    while pos < len(data):
        btype, blen = struct.unpack_from("<II", data, pos)
        if btype == 6:
            seen += 1
            if seen == 5:
                struct.pack_into("<I", data, pos + 4, 7)
                break
        pos += blen
    path = tmp_path / "broken.pcapng"
    path.write_bytes(bytes(data))
    code, out, err = run("tcp", str(path))
    assert code == 2
    assert "invalid block length" in err and "4 frames before it were analysed" in err
    assert "4 frames, 4 TCP packets" in out


VALID_BUT_EMPTY = {"header_only.pcap"}


@pytest.mark.parametrize("name", sorted(p.name for p in BAD.glob("*")
                                        if p.suffix != ".md" and p.name not in VALID_BUT_EMPTY))
def test_every_shipped_bad_capture_is_handled(name):
    code, out, err = run("tcp", str(BAD / name))
    assert code == 2, (name, out, err)
    assert "Traceback" not in err and "internal error" not in err
    assert err.strip(), name


def test_a_valid_capture_without_packets_is_fine():
    code, out, err = run("tcp", str(BAD / "header_only.pcap"))
    assert code == 0, err
    assert "0 frames, 0 TCP packets in 0 streams" in out


def test_usage_errors_exit_2():
    code, _, err = run("tcp")
    assert code == 2 and "required" in err
    code, _, err = run("frobnicate")
    assert code == 2


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "forensics", "tcp", str(DUPACK)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "duplicate_ack" in proc.stdout


def _console(argv: list[str]) -> subprocess.CompletedProcess:
    """The ``stallscope`` program (``forensics.cli.console``) in a fresh process, stdout a pipe
    (block-buffered), with an atexit handler that says whether the interpreter's teardown ran;
    a hang fails with every process's stacks (tests/hung_process.py)."""
    code = (DUMP_ON_SIGNAL + "import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('TEARDOWN\\n'))\n"
            "from forensics.cli import console\n"
            f"sys.argv = ['stallscope'] + {argv!r}\n"
            "console()\n")
    return run_explained([sys.executable, "-c", code], timeout=240)


def test_analyze_ends_without_the_interpreters_teardown_its_output_flushed(tmp_path):
    from shipped import shipped
    out = tmp_path / "r.html"
    p = _console(["analyze", str(shipped("loss")), "-o", str(out), "--json", str(tmp_path / "f.json")])
    assert p.returncode == 1, p.stderr                  # the loss bundle has an error finding
    assert "TEARDOWN" not in p.stderr
    assert p.stdout.startswith("verdict: ") and f"html: {out}" in p.stdout   # written before the exit
    assert out.read_text().rstrip().endswith("</html>")
    assert (tmp_path / "f.json").read_text().rstrip().endswith("}")
    # with a worker process: its pool's threads are gone by then, so the exit is as quick
    hosts = sorted((FIXTURES / "bundles-per-host" / "clean").glob("*.tar.gz"))
    p = _console(["analyze", *map(str, hosts), "-o", str(tmp_path / "r2.html"), "-q", "--jobs", "2"])
    assert p.returncode == 0, p.stderr
    assert "TEARDOWN" not in p.stderr and p.stdout.startswith("verdict: No problem found")


def test_other_commands_and_refused_arguments_end_as_usual():
    p = _console(["tcp", str(DUPACK)])
    assert p.returncode == 0 and "duplicate_ack" in p.stdout and "TEARDOWN" in p.stderr
    p = _console(["analyze"])
    assert p.returncode == 2 and "TEARDOWN" in p.stderr


def test_no_command_shows_the_two_ways_in():
    """``stallscope`` alone answers with the two ways in (capture during the incident, analyze
    the logs you have), not an argparse error; exit code 2 (nothing was done)."""
    import io
    from forensics.cli import Env, main
    out, err = io.StringIO(), io.StringIO()
    assert main([], Env(stdout=out, stderr=err)) == 2
    text = err.getvalue()
    assert "stallscope capture" in text and "stallscope analyze" in text, text
    assert "error" not in text and "required" not in text, text
