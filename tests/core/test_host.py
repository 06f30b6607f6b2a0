"""multigpu.common.host: the one reading of cores and network interfaces, shared by the launcher's
``--iface`` and ``multigpu doctor`` (they used to read them with two copies of the ioctl code)."""

from __future__ import annotations

import os

from multigpu.common.host import (
    interface_address,
    interface_names,
    loopback_interface,
    read_interfaces,
    usable_cores,
)


def test_usable_cores_is_the_affinity_mask() -> None:
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_the_launcher_and_doctor_read_the_same_interfaces() -> None:
    interfaces = read_interfaces()
    assert [i.name for i in interfaces] == interface_names()
    for interface in interfaces:
        assert interface_address(interface.name) == interface.ipv4
    lo = loopback_interface()
    assert lo is not None and lo in interface_names()
    assert interface_address(lo) == "127.0.0.1"
    assert [i.loopback for i in interfaces if i.name == lo] == [True]


def test_an_unknown_interface_has_no_address() -> None:
    assert interface_address("nope0") is None
    assert read_interfaces(["nope0"])[0].usable is False
