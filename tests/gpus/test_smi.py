"""Parsing recorded nvidia-smi outputs into GPUs, processes and MIG instances."""

from __future__ import annotations

from multigpu.gpus.smi import (
    QUERY_GPU,
    parse_compute_apps,
    parse_mig_list,
    parse_query_gpu,
    read_smi,
    run_smi,
)

from .recorded import Recorded, inventory, recorded


def test_eight_a100_with_processes() -> None:
    inv = inventory("a100x8")
    assert inv.source == "nvidia-smi"
    assert [g.index for g in inv.gpus] == list(range(8))
    g4 = inv.gpus[4]
    assert g4.name == "NVIDIA A100-SXM4-80GB"
    assert g4.pci_bus_id == "00000000:87:00.0"
    assert (g4.memory_total_mib, g4.memory_free_mib, g4.utilization_percent) == (81920, 6245, 100)
    assert g4.processes == (50877, 50901)
    assert inv.gpus[0].processes == ()
    assert inv.gpus[7].processes == (3321,)
    assert all(g.visible_id == g.uuid and g.uuid.startswith("GPU-") for g in inv.gpus)
    assert all(g.logical_index is None for g in inv.gpus)  # not applied before visible.py
    assert inv.migs == ()


def test_two_gpus_one_busy() -> None:
    gpus = inventory("two_busy").gpus
    assert [(g.utilization_percent, g.memory_free_mib, g.processes) for g in gpus] == [
        (2, 23960, ()),
        (98, 1261, (91544,)),
    ]


def test_na_and_not_supported_fields() -> None:
    gt710, grid, k80 = inventory("na").gpus
    assert gt710.utilization_percent is None  # "[Not Supported]"
    assert gt710.processes == ()  # pid "[N/A]" is dropped, the row is not an error
    assert grid.pci_bus_id == ""
    assert grid.memory_free_mib == 8192 - 512  # free "[N/A]": total - used
    assert grid.utilization_percent is None
    assert grid.processes == (1234,)
    assert (k80.memory_total_mib, k80.memory_free_mib, k80.utilization_percent) == (0, 0, 0)


def test_mig_setup() -> None:
    inv = inventory("mig")
    assert inv.gpus[0].utilization_percent is None  # MIG mode: "[N/A]"
    assert [(m.index, m.name, m.memory_total_mib) for m in inv.migs] == [
        (0, "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20480),
        (0, "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 10240),
        (0, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 5120),
    ]
    assert all(m.uuid.startswith("MIG-") for m in inv.migs)


def test_old_style_mig_tokens() -> None:
    text = (
        "GPU 0: A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
        "  MIG 1g.5gb Device 0: (UUID: MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/7/0)\n"
    )
    (mig,) = parse_mig_list(text, inventory("mig").gpus)
    assert mig.uuid == "MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/7/0"


def test_no_devices_and_garbage() -> None:
    assert parse_query_gpu(recorded("no_devices.txt")) == []
    assert parse_query_gpu("") == []
    assert parse_query_gpu("x, GPU-1, name, bus, 1, 1, 1, 1") == []  # no index: skipped
    assert parse_compute_apps("") == {}
    assert parse_mig_list("", inventory("mig").gpus) == []


def test_command_missing_or_failing() -> None:
    runner = Recorded(None)
    assert read_smi(runner) is None
    assert runner.calls == [QUERY_GPU]  # gave up after the first command
    assert run_smi(["multigpu-no-such-command-xyz", "-L"]) is None
    assert run_smi(["false"]) is None
    assert run_smi(["echo", "hi"]) == "hi\n"
