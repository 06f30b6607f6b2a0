"""Launch checks (environment, hostname, MASTER_ADDR, a port held by a real socket), the
probe's rows, and the cross-rank comparison of gathered facts."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from multigpu.cli.doctor import doctor_main
from multigpu.common.host import read_interfaces
from multigpu.diagnostics.doctor.checks import ok, warn
from multigpu.diagnostics.doctor.collective import (
    compare_ranks,
    failure_check,
    merge_rows,
    result_check,
)
from multigpu.diagnostics.doctor.network import (
    env_check,
    hostname_check,
    launch_checks,
    master_addr_check,
    port_check,
)
from multigpu.errors import UsageError

TORCHRUN = {
    "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "job",
}  # fmt: skip


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another program listens on (this test's own socket)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def test_the_detected_environment_is_named_and_a_contradictory_one_fails() -> None:
    row, env = env_check(TORCHRUN)
    assert env is not None and row.status == "OK"
    assert row.value == (
        "torchrun: rank 1 of 4, local rank 1 of 2, node 0 of 2, master 127.0.0.1:29500"
    )
    row, env = env_check({"RANK": "0", "WORLD_SIZE": "two", "TORCHELASTIC_RUN_ID": "x"})
    assert env is None and row.status == "FAIL" and "WORLD_SIZE" in row.value


def test_a_port_held_by_another_program_warns_naming_it(held_port: int) -> None:
    row = port_check({"MASTER_PORT": str(held_port)}, local=True)
    assert row.status == "WARN" and row.value.startswith(f"{held_port} is in use on this machine")
    assert "--master-port" in row.fix and "--rdzv-endpoint" in row.fix
    assert f"sport = :{held_port}" in row.fix


def test_a_free_port_is_ok_and_a_bad_one_fails() -> None:
    with socket.socket() as probe:
        probe.bind(("", 0))
        free = probe.getsockname()[1]
    assert port_check({"MASTER_PORT": str(free)}, local=True).status == "OK"
    assert port_check({"MASTER_PORT": "http"}, local=True).status == "FAIL"
    assert port_check({"MASTER_ADDR": "node7"}, local=False).status == "SKIP"


def test_launched_jobs_leave_the_port_to_their_store() -> None:
    names = [r.name for r in launch_checks(TORCHRUN, [])[0]]
    assert names == ["environment", "hostname", "MASTER_ADDR"]
    assert [r.name for r in launch_checks({}, [])[0]][-1] == "rendezvous port"


def test_master_addr_must_resolve_and_is_told_local_or_remote() -> None:
    interfaces = read_interfaces()
    row, local = master_addr_check({"MASTER_ADDR": "127.0.0.1"}, interfaces)
    assert local and row.value == "127.0.0.1 -> 127.0.0.1 (this machine)"
    row, local = master_addr_check({"MASTER_ADDR": "198.51.100.7"}, interfaces)
    assert not local and row.status == "OK" and "another machine" in row.value
    row, local = master_addr_check({"MASTER_ADDR": "no-such-node.invalid"}, interfaces)
    assert row.status == "FAIL" and "does not resolve" in row.value and "/etc/hosts" in row.fix


def test_a_loopback_hostname_warns_only_for_several_nodes() -> None:
    one = hostname_check("vm", ["127.0.1.1"], several_nodes=False)
    assert one.status == "OK" and "fine on one machine" in one.value
    many = hostname_check("vm", ["127.0.1.1"], several_nodes=True)
    assert many.status == "WARN" and "--iface" in many.fix
    assert hostname_check("vm", [], several_nodes=False).status == "WARN"
    assert hostname_check("node0", ["10.0.0.1"], several_nodes=True).status == "OK"


def test_nproc_under_a_launcher_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--nproc 2 was given to a doctor started by a launcher"):
        doctor_main(["--nproc", "2"], environ=TORCHRUN)


def test_probe_rows_report_the_bus_bandwidth_or_a_wrong_sum() -> None:
    measured = {"size_bytes": 4 << 20, "busbw_gbps": 1.25, "algbw_gbps": 1.25, "time_us": 3355.4}
    row = result_check([{**measured, "correct": True}], backend="gloo", world_size=2, seconds=4)
    assert (
        row.status == "OK" and "busbw 1.250 GB/s" in row.value and "4 MiB in 3.36 ms" in row.value
    )
    assert row.detail["rows"][0]["busbw_gbps"] == 1.25
    wrong = result_check([{**measured, "correct": False}], backend="nccl", world_size=8, seconds=4)
    assert wrong.status == "FAIL" and "WRONG sum" in wrong.value
    failed = failure_check("RuntimeError: Connection refused\n  more", backend="gloo", timeout=60)
    assert failed.status == "FAIL" and failed.value == "gloo: RuntimeError: Connection refused more"
    assert "--timeout 120" in failed.fix


def _facts(rank: int, host: str, *, torch: str = "2.13.0", mtu: int = 1500) -> dict[str, Any]:
    return {
        "rank": rank,
        "host": host,
        "versions": {"python": "3.11.7", "torch": torch, "NCCL": "2.27.3"},
        "iface": "eth0",
        "mtu": mtu,
        "checks": [ok("cpu", "threads", "fine").as_dict()],
    }


def test_ranks_that_agree_give_ok_rows() -> None:
    found = [_facts(0, "node0"), _facts(1, "node0"), _facts(2, "node1"), _facts(3, "node1")]
    rows = compare_ranks(found)
    assert [(r.name, r.status) for r in rows] == [
        ("hosts", "OK"),
        ("versions", "OK"),
        ("MTU", "OK"),
    ]
    assert rows[0].value == "4 ranks: node0 (ranks 0, 1), node1 (ranks 2, 3)"
    assert rows[1].value == "the same on every rank: python 3.11.7, torch 2.13.0, NCCL 2.27.3"


def test_a_version_mismatch_fails_naming_the_hosts_and_ranks() -> None:
    found = [_facts(0, "node0"), _facts(1, "node0"), _facts(2, "node1", torch="2.12.1")]
    rows = {r.name: r for r in compare_ranks(found)}
    assert "versions" not in rows  # not all the same: each difference is its own row
    torch_row = rows["torch"]
    assert torch_row.status == "FAIL" and torch_row.group == "ranks"
    assert torch_row.value == "2.13.0 on node0 (ranks 0, 1); 2.12.1 on node1 (rank 2)"
    assert "install the same torch on every node (rank 0 has 2.13.0)" in torch_row.fix


def test_different_mtus_across_nodes_warn() -> None:
    found = [_facts(0, "node0"), _facts(1, "node1", mtu=1400)]
    row = compare_ranks(found)[-1]
    assert row.status == "WARN" and row.name == "MTU"
    assert row.value.endswith("1500 (eth0) on node0 (rank 0); 1400 (eth0) on node1 (rank 1)")
    assert "--iface" in row.fix


def test_other_ranks_warnings_show_once_per_host_with_where_they_come_from() -> None:
    shm = warn("cpu", "/dev/shm", "64 MiB", "docker run --shm-size=8g").as_dict()
    found = [_facts(0, "node0"), _facts(1, "node1"), _facts(2, "node1")]
    for facts in found[1:]:
        facts["checks"].append(shm)
    rows = merge_rows(found)
    moved = [r for r in rows if r.where]
    assert [(r.where, r.name, r.status) for r in moved] == [("rank 1 (node1)", "/dev/shm", "WARN")]
    assert rows[0].name == "threads" and not rows[0].where  # rank 0's own rows first
    assert [r.group for r in rows[-3:]] == ["ranks"] * 3
