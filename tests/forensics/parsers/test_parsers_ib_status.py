"""InfiniBand port state: ibstat, ibstatus, ibv_devinfo -v, sysfs lines, pdsh-tagged lines."""
from __future__ import annotations

import pandas as pd

from conftest import FIXTURES
from forensics.parsers.ib_status import IbStatusParser

D = FIXTURES / "parsers" / "ib_status"


def ports(name: str) -> pd.DataFrame:
    r = IbStatusParser.parse(D / name)
    assert r.warnings == []
    return r.tables["ib_ports"]


def test_ibstat_both_ports_and_the_down_one():
    p = ports("ibstat_one_down.txt")
    assert p[["device", "port", "state", "phys_state", "rate_gbps", "link_layer"]].values.tolist() == [
        ["mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand"], ["mlx5_1", 1, "DOWN", "Polling", 10.0, "InfiniBand"]]
    assert p["firmware"].tolist() == ["28.39.1002"] * 2 and p["ca_type"].tolist() == ["MT4129"] * 2
    assert p["tool"].unique().tolist() == ["ibstat"] and p["host"].isna().all()
    assert p["line"].tolist() == [8, 25]


def test_ibstatus_states_rates_and_widths():
    p = ports("ibstatus.txt")
    assert p[["device", "state", "phys_state", "rate_gbps", "width", "speed"]].values.tolist() == [
        ["mlx5_2", "ACTIVE", "LinkUp", 200.0, "4X", "HDR"], ["mlx5_3", "DOWN", "Disabled", 10.0, "4X", "SDR"]]


def test_ibv_devinfo_verbose_roce_port():
    p = ports("ibv_devinfo_v.txt")
    (r,) = p.to_dict("records")
    assert (r["device"], r["port"], r["state"], r["phys_state"], r["link_layer"], r["width"], r["speed"]) == \
        ("mlx5_4", 1, "ACTIVE", "LinkUp", "Ethernet", "4X", "25.0 Gbps")
    assert r["firmware"] == "22.36.1010"


def test_pdsh_tags_name_each_ports_host_and_sysfs_lines_read():
    text = ("gpu-a01: CA 'mlx5_0'\ngpu-a01: \tPort 1:\ngpu-a01: \t\tState: Active\ngpu-a01: \t\tPhysical state: LinkUp\n"
            "gpu-a02: CA 'mlx5_0'\ngpu-a02: \tPort 1:\ngpu-a02: \t\tState: Down\ngpu-a02: \t\tPhysical state: Disabled\n"
            "/sys/class/infiniband/mlx5_9/ports/1/state:1: DOWN\n/sys/class/infiniband/mlx5_9/ports/1/rate:100 Gb/sec "
            "(4X EDR)\n")
    p = IbStatusParser.parse(text.encode()).tables["ib_ports"]
    got = {(h if isinstance(h, str) else None, d, s) for h, d, s in zip(p["host"], p["device"], p["state"])}
    assert got == {("gpu-a01", "mlx5_0", "ACTIVE"), ("gpu-a02", "mlx5_0", "DOWN"), (None, "mlx5_9", "DOWN")}
    assert p.loc[p["device"] == "mlx5_9", "rate_gbps"].tolist() == [100.0]


def test_text_without_ports_warns_and_binary_is_refused():
    assert "no InfiniBand port status" in IbStatusParser.parse(b"hello\nworld\n").warnings[0]
    assert "binary" in IbStatusParser.parse(bytes(range(256)) * 8).warnings[0]


def test_states_are_read_by_their_number_whatever_the_words():
    text = ("/sys/class/infiniband/mlx5_5/ports/1/phys_state:7: Phy Test\n"
            "hca_id:\tmlx5_6\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_INIT (2)\n"
            "\t\t\tphys_state:\t\tPORT_CONFIGURATION TRAINNING (4)\n")
    p = IbStatusParser.parse(text.encode()).tables["ib_ports"].set_index("device")
    assert p.loc["mlx5_5", "phys_state"] == "PhyTest"
    assert (p.loc["mlx5_6", "state"], p.loc["mlx5_6", "phys_state"]) == ("INIT", "PortConfigurationTraining")


def test_blocks_in_a_merged_job_log_end_at_the_jobs_own_output():
    """ibstat run at the job's start and again at its end, 200 KB of training output between:
    the output's own "State:" and "Rate:" lines are not the port's, and both blocks are read
    (the stretch between them is not decoded)."""
    block = (D / "ibstat_one_down.txt").read_text().split("CA 'mlx5_1'")[0]
    noise = "".join(f"step {i} loss 2.31\n" for i in range(12000))
    text = (block + "State: evaluating\nRate: 3.2 it/s\n\tLink layer: none\n" + noise
            + block.replace("mlx5_0", "mlx5_4").replace("Rate: 400", "Rate: 200") + "Rate: 9 it/s\n")
    assert len(noise) > 2 * (64 << 10)
    r = IbStatusParser.parse(text.encode())
    p = r.tables["ib_ports"]
    assert p[["device", "state", "rate_gbps", "link_layer"]].values.tolist() == [
        ["mlx5_0", "ACTIVE", 400.0, "InfiniBand"], ["mlx5_4", "ACTIVE", 200.0, "InfiniBand"]]
    assert p["line"].tolist()[0] == 8 and p["line"].tolist()[1] > 12000


def test_ibstat_ca_port_prints_its_block_unindented():
    text = ("CA: 'mlx5_0'\nPort 1:\nState: Down\nPhysical state: Polling\nRate: 10\nBase lid: 65535\n"
            "Link layer: InfiniBand\nepoch 3 done\nState: fine\n")
    p = IbStatusParser.parse(text.encode()).tables["ib_ports"]
    assert p[["device", "port", "state", "phys_state", "rate_gbps", "lid"]].values.tolist() == [
        ["mlx5_0", 1, "DOWN", "Polling", 10.0, "65535"]]


def test_ibdev2netdev_up_and_down_and_the_verbose_port_state():
    p = ports("ibdev2netdev.txt")
    assert p[["tool", "device", "port", "state"]].values.tolist() == [
        ["ibdev2netdev", "mlx5_0", 1, "ACTIVE"], ["ibdev2netdev", "mlx5_1", 1, "DOWN"],
        ["ibdev2netdev", "mlx5_2", 1, "ACTIVE"]]
    v = ports("ibdev2netdev_v.txt")           # -v: the IB port state, "(DOWN  )" padded
    assert v[["device", "state"]].values.tolist() == [["mlx5_0", "ACTIVE"], ["mlx5_3", "DOWN"]]


def test_iblinkinfo_switch_and_ca_ports_with_the_down_ones():
    p = ports("iblinkinfo.txt")
    got = [[None if pd.isna(h) else h, d, pt, s, ph] for h, d, pt, s, ph in
           p[["host", "device", "port", "state", "phys_state"]].values.tolist()]
    sw = "MF0;sw-ib-01:MQM8700/U1"
    assert got == [[None, sw, 1, "ACTIVE", "LinkUp"], [None, sw, 2, "ACTIVE", "LinkUp"], [None, sw, 3, "DOWN", "Polling"],
                   ["gpu-a01", "mlx5_0", 1, "ACTIVE", "LinkUp"], ["gpu-a03", "mlx5_1", 1, "INIT", "LinkUp"]]
    assert p["rate_gbps"].tolist()[:2] == [103.125, 103.125] and p["width"].iloc[4] == "1X"
    assert (p["tool"] == "iblinkinfo").all() and p["line"].tolist() == [2, 3, 4, 6, 8]


def test_iblinkinfo_line_mode_names_each_lines_node():
    p = ports("iblinkinfo_line_mode.txt")
    assert p[["device", "port", "state", "phys_state"]].values.tolist() == [
        ["MF0;sw-ib-01:MQM8700/U1", 1, "ACTIVE", "LinkUp"], ["MF0;sw-ib-01:MQM8700/U1", 2, "DOWN", "Disabled"],
        ["mlx5_0", 1, "ACTIVE", "LinkUp"]]
    assert p["host"].iloc[2] == "gpu-b01" and p["rate_gbps"].iloc[0] == 212.5
def test_ibpanic_names_a_vanished_device():
    text = ("CA 'mlx5_7'\n\tCA type: MT4123\n\tNumber of ports: 1\n\tPort 1:\n\t\tState: Active\n"
            "\t\tPhysical state: LinkUp\n\t\tRate: 200\n"
            "ibpanic: [1323906] main: stat of IB device 'mlx5_8' failed: No such file or directory\n")
    p = IbStatusParser.parse(text.encode()).tables["ib_ports"]
    assert p[["device", "state"]].values.tolist() == [["mlx5_7", "ACTIVE"], ["mlx5_8", "MISSING"]]
    assert p["port"].isna().tolist() == [False, True]


def test_a_zsh_prompt_above_ibstat_names_the_ports_host():
    r = IbStatusParser.parse(b"alice@gpu-e03 ~ % ibstat mlx5_1\nCA 'mlx5_1'\n\tCA type: MT4123\n\tPort 1:\n"
                             b"\t\tState: Down\n\t\tPhysical state: Disabled\n\t\tRate: 10\n")
    p = r.tables["ib_ports"]
    assert p[["host", "device", "port", "state"]].values.tolist() == [["gpu-e03", "mlx5_1", 1, "DOWN"]]
