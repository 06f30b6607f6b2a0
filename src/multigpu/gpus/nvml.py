"""Read GPUs through NVML (nvidia-ml-py, ``import pynvml``): the first and preferred probe.

NVML talks to the driver only; it never creates a CUDA context, so the launcher may call it
before forking workers. Its device order is PCI bus order, the same as nvidia-smi's.

Environment variables read: none (NVML ignores ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from multigpu.gpus.types import GPUInfo, Inventory, MigDevice

logger = logging.getLogger(__name__)

T = TypeVar("T")
MIB = 1024 * 1024


def _text(value: str | bytes) -> str:
    # Old nvidia-ml-py releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


def read_nvml() -> Inventory | None:
    """Every GPU NVML reports, with utilisation, compute processes and MIG instances.

    Returns:
        The inventory, or None when NVML is not installed, its library is missing, or the driver
        does not answer (the next probe is tried).

    Example:
        >>> [g.name for g in read_nvml().gpus]  # doctest: +SKIP
        ['NVIDIA A100-SXM4-80GB', 'NVIDIA A100-SXM4-80GB']
    """
    try:
        import pynvml
    except ImportError:
        logger.debug("nvidia-ml-py is not installed; NVML skipped")
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        logger.debug("NVML unavailable: %s", e)
        return None
    try:
        gpus: list[GPUInfo] = []
        migs: list[MigDevice] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(_gpu(pynvml, handle, index))
            migs.extend(_migs(pynvml, handle, index))
        return Inventory(gpus=tuple(gpus), migs=tuple(migs), source="nvml")
    except pynvml.NVMLError as e:
        logger.debug("NVML query failed: %s", e)
        return None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _optional(nvml: Any, fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)``, or None when the device does not support the query (MIG, old GPUs, vGPU)."""
    try:
        return fn(*args)
    except nvml.NVMLError as e:
        logger.debug("NVML query not answered: %s", e)
        return None


def _pids(nvml: Any, handle: Any) -> tuple[int, ...]:
    procs = _optional(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    return tuple(sorted({int(p.pid) for p in procs}))


def _gpu(nvml: Any, handle: Any, index: int) -> GPUInfo:
    uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    util = _optional(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    pci = _optional(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    return GPUInfo(
        index=index,
        logical_index=None,
        uuid=uuid,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        pci_bus_id=_text(pci.busId) if pci is not None else "",
        memory_total_mib=int(memory.total) // MIB,
        memory_free_mib=int(memory.free) // MIB,
        utilization_percent=int(util.gpu) if util is not None else None,
        processes=_pids(nvml, handle),
        visible_id=uuid,
    )


def _migs(nvml: Any, handle: Any, index: int) -> list[MigDevice]:
    mode = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    found = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        mig = _optional(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is None:
            continue  # empty slots raise NotFound
        memory = nvml.nvmlDeviceGetMemoryInfo(mig)
        name = _text(nvml.nvmlDeviceGetName(mig))  # "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
        found.append(
            MigDevice(
                parent_index=index,
                uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                profile=name.rsplit(" ", 1)[-1],
                memory_total_mib=int(memory.total) // MIB,
                memory_free_mib=int(memory.free) // MIB,
                processes=_pids(nvml, mig),
            )
        )
    return found
