"""GPU rows from recorded nvidia-smi outputs, the topology matrix, and the network checks on
interface records and on this machine's real interfaces."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from multigpu.diagnostics.doctor.gpu_checks import TOPO, gpu_checks, parse_topology, topology_check
from multigpu.diagnostics.doctor.network import (
    Interface,
    ifname_check,
    interface_rows,
    mtu_check,
    read_interfaces,
    used_interface,
)
from multigpu.gpus import Inventory
from tests.gpus.recorded import DATA as GPU_DATA
from tests.gpus.recorded import Recorded, fake_gpu, inventory

DATA = Path(__file__).parent / "data"


class WithTopo(Recorded):
    """The recorded nvidia-smi of a machine, plus its ``topo -m``."""

    def __call__(self, argv: Sequence[str]) -> str | None:
        if list(argv) == TOPO:
            self.calls.append(list(argv))
            return (GPU_DATA / f"{self.machine}_topo.txt").read_text()
        return super().__call__(argv)


def test_topology_pairs_are_read_from_nvidia_smi_topo_m() -> None:
    dgx = parse_topology((GPU_DATA / "a100x8_topo.txt").read_text())
    assert len(dgx) == 28 and set(dgx.values()) == {"NV12"}  # NIC rows and columns ignored
    pcie = parse_topology((DATA / "pcie4_topo.txt").read_text())
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
    assert parse_topology("") == {} and parse_topology("No devices were found") == {}
    assert topology_check({}, gpus=4).status == "SKIP"
    assert topology_check({}, gpus=1).status == "SKIP"


def test_each_visible_gpu_is_a_row_and_busy_ones_warn_naming_their_processes() -> None:
    runner = WithTopo("a100x8")
    rows = gpu_checks(inventory("a100x8"), {}, runner)
    assert [r.name for r in rows] == [f"gpu {i}" for i in range(8)] + ["topology"]
    assert rows[0].status == "OK" and "81036/81920 MiB free, util 0%, no processes" in rows[0].value
    busy = rows[1]
    assert busy.status == "WARN" and "util 87%" in busy.value and "processes 48211" in busy.value
    assert "--gpus" in busy.fix and "48211" in busy.fix
    assert rows[-1].value == "NV12 (NVLink) x28"
    assert TOPO in runner.calls


def test_cuda_visible_devices_limits_the_rows_and_the_topology() -> None:
    rows = gpu_checks(inventory("a100x8"), {"CUDA_VISIBLE_DEVICES": "0,3"}, WithTopo("a100x8"))
    assert [r.name for r in rows] == ["gpu 0", "gpu 1", "topology"]  # logical indices
    assert rows[-1].value == "NV12 (NVLink) x1"
    hidden = gpu_checks(inventory("a100x8"), {"CUDA_VISIBLE_DEVICES": ""})
    assert [r.status for r in hidden] == ["SKIP"]
    assert "8 GPU(s) on the machine, hidden" in hidden[0].value
    none = gpu_checks(Inventory(), {})
    assert none[0].status == "SKIP" and "no GPU found" in none[0].value


def test_one_gpu_has_no_topology_and_an_idle_one_is_ok() -> None:
    idle = Inventory(gpus=(fake_gpu(0),), source="nvml")
    runner = WithTopo("a100x8")
    rows = gpu_checks(idle, {}, runner)
    assert [r.status for r in rows] == ["OK", "SKIP"]
    assert runner.calls == []  # topo -m is not asked for one GPU


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
