"""Read GPUs and the driver through NVML (nvidia-ml-py, ``import pynvml``): the first probe.

NVML talks to the driver only; it never creates a CUDA context, so the launcher may call it
before forking workers. Its device order is PCI bus order, the same as nvidia-smi's.

Every reader takes the NVML module as its first argument (``open_nvml()``'s answer, or a
stand-in with the same functions in tests), so one ``nvmlInit`` serves the inventory, the
driver and the topology (``multigpu.gpus.topology``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from multigpu.gpus.types import DriverFacts, GPUInfo, Inventory

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


def text(value: str | bytes) -> str:
    """NVML's string answer as ``str`` (old nvidia-ml-py releases return bytes, newer ones str)."""
    return value.decode() if isinstance(value, bytes) else value


def open_nvml(module: Any | None = None) -> Any | None:
    """``module`` (default: ``pynvml``) after ``nvmlInit``; None when NVML cannot be loaded.

    The caller ends the session with ``close_nvml``.
    """
    nvml = module
    if nvml is None:
        import pynvml  # nvidia-ml-py, a dependency; imported late, like every probe

        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:  # no libnvidia-ml.so, or the driver does not answer
        logger.debug("NVML unavailable: %s", e)
        return None
    return nvml


def close_nvml(nvml: Any) -> None:
    """``nvmlShutdown``, ignoring NVML's errors (the facts are already read)."""
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()


def nvml_inventory(nvml: Any) -> Inventory | None:
    """Every GPU of an open NVML, with utilisation, compute processes and MIG instances.

    None when a query every GPU answers failed (the next probe is tried).
    """
    try:
        gpus: list[GPUInfo] = []
        migs: list[GPUInfo] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(_gpu(nvml, handle, index))
            migs.extend(_migs(nvml, handle, gpus[-1]))
        return Inventory(gpus=tuple(gpus), migs=tuple(migs), source="nvml")
    except nvml.NVMLError as e:
        logger.debug("NVML query failed: %s", e)
        return None


def nvml_driver(nvml: Any) -> DriverFacts | None:
    """The driver's version and the newest CUDA it supports, from an open NVML.

    ``nvmlSystemGetCudaDriverVersion_v2`` asks libcuda (``cuDriverGetVersion``: what torch
    will get, forward-compatibility package included); where libcuda is not found, or the
    bindings lack ``_v2``, the plain call answers from the driver's own record.
    """
    try:
        version = text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as e:
        logger.debug("NVML driver query failed: %s", e)
        return None
    cuda = None
    for name in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
        fn = getattr(nvml, name, None)
        number = _optional(nvml, fn) if fn is not None else None
        if number:
            cuda = f"{int(number) // 1000}.{int(number) % 1000 // 10}"  # 12080 -> "12.8"
            break
    return DriverFacts(version=version, cuda=cuda, source="nvml")


def _optional(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
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
    uuid = text(nvml.nvmlDeviceGetUUID(handle))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    util = _optional(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    pci = _optional(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    return GPUInfo(
        index=index,
        uuid=uuid,
        name=text(nvml.nvmlDeviceGetName(handle)),
        pci_bus_id=text(pci.busId) if pci is not None else "",
        memory_total_mib=int(memory.total) // MIB,
        memory_free_mib=int(memory.free) // MIB,
        memory_used_mib=int(memory.used) // MIB,
        utilization_percent=int(util.gpu) if util is not None else None,
        processes=_pids(nvml, handle),
        visible_id=uuid,
    )


def _migs(nvml: Any, handle: Any, parent: GPUInfo) -> list[GPUInfo]:
    mode = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    found = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        mig = _optional(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is None:
            continue  # empty slots raise NotFound
        memory = nvml.nvmlDeviceGetMemoryInfo(mig)
        name = text(nvml.nvmlDeviceGetName(mig))  # "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
        found.append(
            parent.mig_instance(
                uuid=text(nvml.nvmlDeviceGetUUID(mig)),
                profile=name.rsplit(" ", 1)[-1],
                total_mib=int(memory.total) // MIB,
                free_mib=int(memory.free) // MIB,
                used_mib=int(memory.used) // MIB,
                processes=_pids(nvml, mig),
            )
        )
    return found
