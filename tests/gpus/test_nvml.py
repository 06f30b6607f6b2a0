"""The NVML reader against a stand-in module that answers like NVML on a 2-GPU MIG machine.

No GPU here, so the real library only shows its failure path; the stand-in checks the reading
logic, and ``test_names_exist_in_pynvml`` checks that every function it offers is real.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from multigpu.gpus.nvml import read_nvml
from multigpu.gpus.visible import visible_devices

GIB = 1024**3


def not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # the real NotSupported subclass


class FakeNVML:
    """GPU 0: MIG enabled, two instances in slots 0 and 2; GPU 1: plain, one process, 75% busy."""

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self) -> None:
        self.shutdown = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetUUID(self, h: str) -> bytes:
        return f"GPU-{h}".encode() if h.startswith("gpu") else f"MIG-{h}".encode()

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA A100-SXM4-40GB" + (b"" if h.startswith("gpu") else b" MIG 3g.20gb")

    def nvmlDeviceGetPciInfo(self, h: str) -> Any:
        return SimpleNamespace(busId=f"00000000:0{h[-1]}:00.0".encode())

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        total = 40 * GIB if h.startswith("gpu") else 20 * GIB
        return SimpleNamespace(total=total, free=total - GIB, used=GIB)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        if h == "gpu0":
            raise not_supported()  # MIG mode
        return SimpleNamespace(gpu=75, memory=10)

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [SimpleNamespace(pid=4321)] if h in ("gpu1", "mig0-2") else []

    def nvmlDeviceGetMigMode(self, h: str) -> list[int]:
        if h == "gpu1":
            raise not_supported()
        return [self.NVML_DEVICE_MIG_ENABLE, self.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, slot: int) -> str:
        if slot == 1:
            raise not_supported()  # an empty slot
        return f"mig0-{slot}"


def test_names_exist_in_pynvml() -> None:
    used = [n for n in vars(FakeNVML) if n.startswith("nvml") or n.startswith("NVML")]
    assert len(used) == 15
    assert [n for n in used if not hasattr(pynvml, n)] == []


def test_reads_gpus_and_mig_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    inv = read_nvml()
    assert inv is not None and inv.source == "nvml" and fake.shutdown
    g0, g1 = inv.gpus
    assert (g0.uuid, g0.name, g0.pci_bus_id) == (
        "GPU-gpu0",
        "NVIDIA A100-SXM4-40GB",
        "00000000:00:00.0",
    )
    assert (g0.memory_total_mib, g0.memory_free_mib, g0.utilization_percent) == (40960, 39936, None)
    assert (g1.utilization_percent, g1.processes, g1.visible_id) == (75, (4321,), "GPU-gpu1")
    assert [(m.uuid, m.profile, m.memory_total_mib, m.processes) for m in inv.migs] == [
        ("MIG-mig0-0", "3g.20gb", 20480, ()),
        ("MIG-mig0-2", "3g.20gb", 20480, (4321,)),
    ]
    assert [g.visible_id for g in visible_devices(inv, {})] == [
        "MIG-mig0-0",
        "MIG-mig0-2",
        "GPU-gpu1",
    ]


def test_missing_library_is_none() -> None:
    # This machine has no driver: the real module fails to load libnvidia-ml and we get None.
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert read_nvml() is None
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here")
