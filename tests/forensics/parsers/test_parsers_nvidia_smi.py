"""GPU failures nvidia-smi and the NVIDIA driver print without an Xid line."""
from __future__ import annotations

from forensics.parsers.nvidia_smi import NvidiaSmiParser
from forensics.parsers.text import LogText


def events(text: str):
    r = NvidiaSmiParser.parse(text.encode())
    assert r.warnings == []
    return r.tables["gpu_events"].to_dict("records")


def test_no_device_handle_with_the_prompts_host():
    ev = events("```\n[root@bh174 chenyang]# nvidia-smi \n"
                "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error\n```\n")
    assert [(e["host"], e["bus_id"], e["kind"], e["tool"], e["line"]) for e in ev] == [
        ("bh174", "0000:0b:00.0", "device_handle", "nvidia-smi", 3)]


def test_fallen_off_the_bus_over_three_nvrm_lines_names_the_gpu():
    ev = events("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
                "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
                "               NVRM: fallen off the bus and is not responding to commands.\n"
                "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n")
    assert [(e["bus_id"], e["kind"], e["tool"], e["line"]) for e in ev] == [
        ("0000:b3:00.0", "fallen_off_bus", "kernel", 3)]
    assert "not responding" in ev[0]["message"]


def test_xid_lines_are_left_to_the_kernel_log_and_tags_name_the_host():
    ev = events("node7: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
                "node8: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
                "No devices were found\n")
    assert [(e["host"], e["kind"]) for e in ev] == [("node8", "driver_unreachable"), (None, "no_devices")]


def test_claims_only_its_messages():
    assert NvidiaSmiParser.claims(LogText.of(b"x\nUnable to determine the device handle for GPU 0000:09:00.0: "
                                            b"Unknown Error\n", "f"))
    assert not NvidiaSmiParser.claims(LogText.of(b"Wed Jan  1 nvidia-smi 535.54\n| 0  H100 |\n", "f"))


def test_every_message_of_the_sample():
    from conftest import FIXTURES
    r = NvidiaSmiParser.parse(FIXTURES / "parsers" / "nvidia_smi" / "gpu_lost.txt")
    ev = r.tables["gpu_events"]
    assert r.warnings == []
    assert ev["kind"].tolist() == ["device_handle", "fallen_off_bus", "init_failed", "driver_unreachable",
                                   "nvml_init", "err_field", "no_devices"]
    assert set(ev["bus_id"].dropna()) == {"0000:9d:00.0"}
    assert ev["host"].tolist()[:5] == ["gpu-node12"] * 3 + ["node8", "node9"]


def test_zsh_and_tcsh_prompts_name_the_host_too():
    for prompt, host in (("zeyer@cn-234 ~ % nvidia-smi", "cn-234"), ("root@gpu-7:~> nvidia-smi -q", "gpu-7")):
        ev = events(prompt + "\nUnable to determine the device handle for GPU0000:03:00.0: Unknown Error\n")
        assert [(e["host"], e["bus_id"], e["kind"]) for e in ev] == [(host, "0000:03:00.0", "device_handle")], prompt


def test_a_gsp_call_refused_until_a_reset_is_a_gpu_event():
    ev = events(" [Sun Jan 11 09:52:01 2026] NVRM: rpcRmApiAlloc_GSP: GspRmAlloc failed: hClient=0xc1d1a616; "
                "status=0x00000062 \n [Sun Jan 11 09:52:01 2026] NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset "
                "required [NV_ERR_RESET_REQUIRED] (0x00000062) returned from status @ kernel_channel.c:2874 \n")
    assert [(e["kind"], e["tool"], e["line"], e["bus_id"]) for e in ev] == [("reset_required", "kernel", 2, None)]
