"""The NVML reader against a stand-in module that answers like NVML on a 2-GPU MIG machine.

No GPU here, so the real library only shows its failure path; the stand-in checks the reading
logic, and ``test_names_exist_in_pynvml`` checks that every function it offers is real.
"""

from __future__ import annotations

import pynvml
import pytest

from multigpu.gpus.facts import read_facts
from multigpu.gpus.nvml import open_nvml
from multigpu.gpus.visible import visible_devices

from .fake_nvml import FakeNVML, LinkedNVML, NoNVML


def test_names_exist_in_pynvml() -> None:
    used = {
        n
        for cls in (FakeNVML, LinkedNVML, NoNVML)
        for n in vars(cls)
        if n.startswith("nvml") or n.startswith("NVML")
    }
    assert len(used) == 24
    assert sorted(n for n in used if not hasattr(pynvml, n)) == []


def test_reads_gpus_and_mig_instances() -> None:
    fake = FakeNVML()
    inv = read_facts(nvml=fake, driver=False, links=False).inventory
    assert inv.source == "nvml" and fake.shutdown
    g0, g1 = inv.gpus
    assert (g0.uuid, g0.name, g0.pci_bus_id) == (
        "GPU-gpu0",
        "NVIDIA A100-SXM4-40GB",
        "00000000:07:00.0",
    )
    assert (g0.memory_total_mib, g0.memory_free_mib, g0.utilization_percent) == (40960, 39936, None)
    assert (g1.utilization_percent, g1.processes, g1.visible_id) == (75, (4321,), "GPU-gpu1")
    assert g1.memory_used_mib == 1024
    assert [(m.uuid, m.name, m.memory_total_mib, m.processes) for m in inv.migs] == [
        ("MIG-mig0-0", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20480, ()),
        ("MIG-mig0-2", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20480, (4321,)),
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
        assert open_nvml() is None
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here")
