"""GPU rows from recorded nvidia-smi outputs and NVML stand-ins, the topology row, and the network
checks on interface records and on this machine's real interfaces."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from multigpu.common.host import Interface, read_interfaces
from multigpu.diagnostics.doctor.cuda import driver_check, gpu_checks, topology_check
from multigpu.diagnostics.doctor.network import (
    ifname_check,
    interface_rows,
    mtu_check,
    used_interface,
)
from multigpu.gpus import GPUFacts, read_facts
from multigpu.gpus.smi import QUERY_GPU
from multigpu.gpus.topology import TOPO, parse_topo_matrix
from tests.gpus.fake_nvml import SWITCH, LinkedNVML, NoNVML
from tests.gpus.recorded import DATA as GPU_DATA
from tests.gpus.recorded import Recorded

DATA = Path(__file__).parent / "data"


def smi_facts(machine: str) -> GPUFacts:
    """The facts of a recorded machine whose NVML cannot be loaded (nvidia-smi answers)."""
    return read_facts({}, nvml=NoNVML(), runner=Recorded(machine))


def test_topology_pairs_are_read_from_nvidia_smi_topo_m() -> None:
    dgx = parse_topo_matrix((GPU_DATA / "a100x8_topo.txt").read_text())
    assert len(dgx) == 28 and set(dgx.values()) == {"NV12"}  # NIC rows and columns ignored
    pcie = parse_topo_matrix((DATA / "pcie4_topo.txt").read_text())
    assert pcie == {
        (0, 1): "PIX", (0, 2): "SYS", (0, 3): "SYS",
        (1, 2): "SYS", (1, 3): "SYS", (2, 3): "PIX",
    }  # fmt: skip
    row = topology_check(pcie, gpus=4)
    assert row.status == "OK"
    assert row.value == (
        "SYS (the link between CPU sockets (QPI/UPI)) x4, PIX (one PCIe switch) x2"
    )
    assert row.detail["pairs"]["0-2"] == "SYS"
    assert parse_topo_matrix("") == {} and parse_topo_matrix("No devices were found") == {}
    assert topology_check({}, gpus=4).status == "SKIP"
    assert topology_check({}, gpus=1).status == "SKIP"


def test_each_visible_gpu_is_a_row_and_busy_ones_warn_naming_their_processes() -> None:
    rows = gpu_checks(smi_facts("a100x8"), {})
    assert [r.name for r in rows] == [f"gpu {i}" for i in range(8)] + ["topology"]
    assert rows[0].status == "OK" and "81036/81920 MiB free, util 0%, no processes" in rows[0].value
    busy = rows[1]
    assert busy.status == "WARN" and "util 87%" in busy.value and "processes 48211" in busy.value
    assert "--gpus" in busy.fix and "48211" in busy.fix
    assert rows[-1].value == "NV12 (NVLink) x28"


def test_cuda_visible_devices_limits_the_rows_and_the_topology() -> None:
    facts = smi_facts("a100x8")
    rows = gpu_checks(facts, {"CUDA_VISIBLE_DEVICES": "0,3"})
    assert [r.name for r in rows] == ["gpu 0", "gpu 1", "topology"]  # logical indices
    assert rows[-1].value == "NV12 (NVLink) x1"
    hidden = gpu_checks(facts, {"CUDA_VISIBLE_DEVICES": ""})
    assert [r.status for r in hidden] == ["SKIP"]
    assert "8 GPU(s) on the machine, hidden" in hidden[0].value
    none = gpu_checks(GPUFacts(), {})
    assert none[0].status == "SKIP" and "no GPU found" in none[0].value


def test_with_nvml_the_doctor_reads_driver_and_links_from_it_not_from_nvidia_smi() -> None:
    # An HGX A100 in a container that has the NVML library but no nvidia-smi binary: the links
    # and the driver come from NVML (formerly `nvidia-smi topo -m` and its header: SKIP rows).
    no_smi = Recorded(None)
    facts = read_facts({}, nvml=LinkedNVML(8, {i: [SWITCH] * 12 for i in range(8)}), runner=no_smi)
    rows = gpu_checks(facts, {"CUDA_VISIBLE_DEVICES": "2,5,7"})
    assert [r.name for r in rows] == ["gpu 0", "gpu 1", "gpu 2", "topology"]
    assert rows[-1].status == "OK" and rows[-1].value == "NV12 (NVLink) x3"
    assert rows[-1].detail["pairs"] == {"2-5": "NV12", "2-7": "NV12", "5-7": "NV12"}
    driver = driver_check("12.8", facts.driver, 3)
    assert driver.status == "OK" and driver.value == "570.86.15, supports CUDA 12.8 (from nvml)"
    assert no_smi.calls == []


def test_one_gpu_has_no_topology_and_an_idle_one_is_ok() -> None:
    class OneGPU(Recorded):
        def __call__(self, argv: Sequence[str]) -> str | None:
            out = super().__call__(argv)
            return out.splitlines()[0] if out and list(argv) == QUERY_GPU else out

    smi = OneGPU("a100x8")
    facts = read_facts({}, nvml=NoNVML(), runner=smi)
    rows = gpu_checks(facts, {})
    assert [r.status for r in rows] == ["OK", "SKIP"]
    assert TOPO not in smi.calls  # topo -m is not asked for one GPU
    assert read_facts({}, nvml=LinkedNVML(1, {})).links == {}


def _iface(name: str, mtu: int, *, up: bool = True, carrier: bool = True) -> Interface:
    return Interface(name=name, up=up, carrier=carrier, loopback=name == "lo", mtu=mtu)


NICS = [
    _iface("lo", 65536),
    _iface("eth0", 1500),
    _iface("ib0", 2044),
    _iface("docker0", 1500, carrier=False),
    _iface("veth1a2b", 1450),
    _iface("eth1", 1500, up=False, carrier=False),
]


def test_interfaces_that_cannot_carry_traffic_are_skipped_with_their_state() -> None:
    rows = {r.name: r for r in interface_rows(NICS)}
    assert rows["eth0"].status == "OK" and rows["eth0"].value == "up, MTU 1500, no IPv4 address"
    assert rows["docker0"].status == "SKIP" and "up, no carrier" in rows["docker0"].value
    assert rows["eth1"].status == "SKIP" and rows["eth1"].value.startswith("down")


def test_different_mtus_of_real_interfaces_warn_and_virtual_ones_do_not_count() -> None:
    row = mtu_check(NICS)
    assert row.status == "WARN" and row.value.startswith("eth0 1500, ib0 2044: differ")
    assert "--iface" in row.fix and "mtu" in row.fix
    same = mtu_check([_iface("lo", 65536), _iface("eth0", 9000), _iface("veth0", 1500)])
    assert same.status == "OK" and same.value == "eth0 9000"
    assert mtu_check([_iface("lo", 65536)]).status == "SKIP"


@pytest.mark.parametrize(
    ("variable", "spec", "status", "said"),
    [
        ("GLOO_SOCKET_IFNAME", "eth0", "OK", "eth0 up, MTU 1500"),
        ("GLOO_SOCKET_IFNAME", "does-not-exist0", "FAIL", "no interface does-not-exist0 on"),
        ("GLOO_SOCKET_IFNAME", "eth", "FAIL", "no interface eth on"),  # gloo: exact names
        ("GLOO_SOCKET_IFNAME", "eth1", "FAIL", "selects eth1 (down"),
        ("GLOO_SOCKET_IFNAME", "eth0,docker0", "FAIL", "selects docker0 (up, no carrier"),
        ("NCCL_SOCKET_IFNAME", "eth0", "OK", "eth0: eth0 up"),
        ("NCCL_SOCKET_IFNAME", "ib", "OK", "ib0 up, MTU 2044"),  # NCCL: prefixes
        ("NCCL_SOCKET_IFNAME", "=eth", "FAIL", "no interface eth on"),  # "=": exact
        ("NCCL_SOCKET_IFNAME", "^docker,lo,veth,eth", "OK", "ib0 up"),  # "^": all but these
        ("NCCL_SOCKET_IFNAME", "^docker,lo,veth,eth,ib", "FAIL", "selects nothing"),
    ],
)
def test_socket_ifname_variables_must_name_interfaces_that_are_up(
    variable: str, spec: str, status: str, said: str
) -> None:
    row = ifname_check(variable, {variable: spec}, NICS)
    assert row.status == status and said in row.value, row
    if status == "FAIL":
        assert f"set {variable} to an interface that is up" in row.fix
        assert "here: lo, eth0, ib0, veth1a2b" in row.fix


def test_unset_socket_ifname_is_skipped_saying_what_the_library_does_instead() -> None:
    assert "hostname resolves to" in ifname_check("GLOO_SOCKET_IFNAME", {}, NICS).value
    assert "not lo or docker" in ifname_check("NCCL_SOCKET_IFNAME", {}, NICS).value


def test_real_interfaces_agree_with_the_kernel() -> None:
    found = {i.name: i for i in read_interfaces()}
    assert sorted(found) == sorted(name for _, name in socket.if_nameindex())
    lo = found["lo"]
    assert lo.loopback and lo.usable and lo.ipv4 == "127.0.0.1"
    if shutil.which("ip"):  # iproute2's view of the same namespace
        links = json.loads(subprocess.check_output(["ip", "-j", "link"], text=True))
        assert {link["ifname"]: link["mtu"] for link in links} == {
            name: i.mtu for name, i in found.items()
        }
        up = {link["ifname"] for link in links if "LOWER_UP" in link["flags"]}
        assert up == {name for name, i in found.items() if i.carrier}


def test_the_interface_used_is_the_named_one_or_the_route_to_master_addr() -> None:
    real = read_interfaces()
    used = used_interface({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, real)
    assert used is not None and used.name == "lo"
    assert used_interface({"GLOO_SOCKET_IFNAME": "eth0"}, NICS) == NICS[1]
    assert used_interface({}, NICS) is None
