"""Recorded ``nvidia-smi`` outputs (tests/gpus/data) served through a runner, and fake GPUs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from multigpu.gpus.smi import LIST, QUERY_APPS, QUERY_DRIVER, QUERY_GPU, QUERY_XML, read_smi
from multigpu.gpus.topology import TOPO
from multigpu.gpus.types import GPUInfo, Inventory

DATA = Path(__file__).parent / "data"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


class Recorded:
    """A runner answering nvidia-smi's commands from ``data/<machine>_*``; logs calls.

    A command with no recording for the machine fails (None); one the readers should never
    run (``nvidia-smi`` alone, whose human-readable page they must not parse) raises KeyError.
    """

    def __init__(self, machine: str | None) -> None:
        self.machine = machine
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str | None:
        self.calls.append(list(argv))
        if self.machine is None:
            return None  # the command is missing
        suffix = {
            tuple(QUERY_GPU): "query.csv",
            tuple(QUERY_APPS): "apps.csv",
            tuple(LIST): "list.txt",
            tuple(QUERY_DRIVER): "driver.csv",
            tuple(QUERY_XML): "q.xml",
            tuple(TOPO): "topo.txt",
        }
        path = DATA / f"{self.machine}_{suffix[tuple(argv)]}"
        return path.read_text() if path.exists() else None


def inventory(machine: str) -> Inventory:
    found = read_smi(Recorded(machine))
    assert found is not None
    return found


def fake_gpu(
    index: int,
    *,
    free: int = 20000,
    total: int = 24000,
    util: int | None = 0,
    name: str = "Fake GPU",
) -> GPUInfo:
    uuid = f"GPU-{index:08d}-fake-0000-0000-000000000000"
    return GPUInfo(
        index=index,
        logical_index=index,
        uuid=uuid,
        name=name,
        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
        memory_total_mib=total,
        memory_free_mib=free,
        utilization_percent=util,
        processes=(),
        visible_id=uuid,
    )


def h100(index: int, free_mib: int) -> GPUInfo:
    """An 80 GB H100 (81559 MiB, as nvidia-smi says) with ``free_mib`` free."""
    return fake_gpu(index, free=free_mib, total=81559, name="NVIDIA H100 80GB HBM3")
