"""CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER applied to recorded machines, as CUDA does."""

from __future__ import annotations

import pytest

from multigpu.gpus.visible import visible_devices

from .recorded import inventory

A100 = inventory("a100x8")
MIG = inventory("mig")
PCI = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def seen(spec: str | None, inv=A100) -> list[int]:
    env = dict(PCI) if spec is None else {**PCI, "CUDA_VISIBLE_DEVICES": spec}
    gpus = visible_devices(inv, env)
    assert [g.logical_index for g in gpus] == list(range(len(gpus)))
    return [g.index for g in gpus]


def test_unset_means_all() -> None:
    assert seen(None) == list(range(8))


@pytest.mark.parametrize("spec", ["", "-1", " ", "-1,0", "x", "8"])
def test_none_visible(spec: str) -> None:
    assert seen(spec) == []


def test_indices_and_reordering() -> None:
    assert seen("3") == [3]
    assert seen("2,0") == [2, 0]
    assert seen(" 5 , 1 ") == [5, 1]


def test_invalid_entry_stops_the_list() -> None:
    assert seen("1,9,2") == [1]
    assert seen("1,-1,2") == [1]
    assert seen("1,1,2") == [1]  # a repeat is invalid too
    assert seen("0,,1") == [0]


def test_uuids_and_prefixes() -> None:
    u = [g.uuid for g in A100.gpus]
    assert seen(f"{u[6]},{u[2]}") == [6, 2]
    assert seen(u[5][:12]) == [5]
    assert u[1].startswith("GPU-d") and seen("GPU-d,0") == [1, 0]
    # "GPU-9" starts both GPU 2's and GPU 6's UUID: ambiguous, so invalid, so the list stops.
    assert u[2].startswith("GPU-9") and u[6].startswith("GPU-9")
    assert seen("0,GPU-9,3") == [0]
    assert seen("GPU-ffffffff") == []
    assert seen(u[3][4:]) == []  # CUDA wants the GPU- prefix


def test_logical_index_and_visible_id() -> None:
    gpus = visible_devices(A100, {"CUDA_VISIBLE_DEVICES": "7,4"})
    assert [(g.index, g.logical_index) for g in gpus] == [(7, 0), (4, 1)]
    assert [g.visible_id for g in gpus] == [A100.gpus[7].uuid, A100.gpus[4].uuid]


def test_mig_instances_are_devices() -> None:
    migs = [m.uuid for m in MIG.migs]
    gpus = visible_devices(MIG, PCI)
    assert [g.index for g in gpus] == [0, 0, 0, 1]
    assert [g.visible_id for g in gpus] == [*migs, MIG.gpus[1].uuid]
    assert gpus[2].name == "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    assert gpus[2].memory_total_mib == 5120 and gpus[2].utilization_percent is None
    # MIG tokens are opaque: matched whole or as a unique prefix, kept in the order given.
    assert [
        g.uuid for g in visible_devices(MIG, {"CUDA_VISIBLE_DEVICES": f"{migs[2]},{migs[0]}"})
    ] == [
        migs[2],
        migs[0],
    ]
    assert [g.uuid for g in visible_devices(MIG, {"CUDA_VISIBLE_DEVICES": migs[1][:10]})] == [
        migs[1]
    ]
    assert visible_devices(MIG, {"CUDA_VISIBLE_DEVICES": "MIG-00000000"}) == []
    # Index 1 is the plain GPU; index 0 names the MIG-enabled GPU, i.e. its instances.
    assert seen("1", MIG) == [1]
    assert seen("0", MIG) == [0, 0, 0]


def test_fastest_first_read_as_pci_order() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,0"}  # no CUDA_DEVICE_ORDER: CUDA's default FASTEST_FIRST
    assert [g.index for g in visible_devices(A100, env)] == [2, 0]
