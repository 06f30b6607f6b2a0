"""Stand-ins for the NVML module (``pynvml``), handed to the readers in place of the real one.

No GPU here, so the real library only shows its failure path; these answer as NVML does on the
machines they describe (same function names, NVML's own error class and constants), and
``test_nvml.test_names_exist_in_pynvml`` checks every name they offer against nvidia-ml-py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1024**3
SWITCH = "switch"


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # the real subclass for the code (NotSupported...)


class FakeNVML:
    """GPU 0: MIG enabled, two instances in slots 0 and 2; GPU 1: plain, one process, 75% busy.

    Driver 570.86.15 for CUDA 12.8; no NVLink; the two GPUs meet at a PCIe host bridge.
    """

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS

    count = 2

    def __init__(self) -> None:
        self.inits = 0
        self.shutdown = False

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12080

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetUUID(self, h: str) -> bytes:
        return f"GPU-{h}".encode() if h.startswith("gpu") else f"MIG-{h}".encode()

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA A100-SXM4-40GB" + (b"" if h.startswith("gpu") else b" MIG 3g.20gb")

    def nvmlDeviceGetPciInfo(self, h: str) -> Any:
        return SimpleNamespace(busId=self.bus(int(h[3:])).encode())

    def bus(self, index: int) -> str:
        return f"00000000:{index * 8 + 7:02X}:00.0"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        total = 40 * GIB if h.startswith("gpu") else 20 * GIB
        return SimpleNamespace(total=total, free=total - GIB, used=GIB)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        if h == "gpu0":
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # MIG mode
        return SimpleNamespace(gpu=75, memory=10)

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [SimpleNamespace(pid=4321)] if h in ("gpu1", "mig0-2") else []

    def nvmlDeviceGetMigMode(self, h: str) -> list[int]:
        if h != "gpu0":
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [self.NVML_DEVICE_MIG_ENABLE, self.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: str) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: str, slot: int) -> str:
        if slot == 1:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)  # an empty slot
        return f"mig0-{slot}"

    # Topology: no NVLink on these boards; PCIe host bridge between any two.
    def nvmlDeviceGetNvLinkState(self, h: str, link: int) -> int:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: str, link: int) -> int:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: str, link: int) -> Any:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: str, b: str) -> int:
        return pynvml.NVML_TOPOLOGY_HOSTBRIDGE


class LinkedNVML(FakeNVML):
    """Plain GPUs (no MIG) with NVLinks and PCIe paths as given.

    Args:
        count: the number of GPUs.
        nvlinks: per GPU, what each of its links reaches: a GPU index, ``SWITCH``, or None for a
            link that is down; a GPU absent here has no NVLink at all.
        levels: ``(i, j) -> NVML_TOPOLOGY_*`` for i < j (default: the CPU sockets, SYSTEM).
        legacy_remote_bus: answer remote PCI ids with a 4-digit domain in lower case.
    """

    def __init__(
        self,
        count: int,
        nvlinks: Mapping[int, Sequence[int | str | None]],
        levels: Mapping[tuple[int, int], int] | None = None,
        *,
        legacy_remote_bus: bool = False,
    ) -> None:
        super().__init__()
        self.count = count
        self.nvlinks = nvlinks
        self.levels = levels or {}
        self.legacy = legacy_remote_bus

    def nvmlDeviceGetMigMode(self, h: str) -> list[int]:
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=0, memory=0)

    def _link(self, h: str, link: int) -> int | str | None:
        index = int(h[3:])
        if index not in self.nvlinks:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(self.nvlinks[index]):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # no link with that number
        return self.nvlinks[index][link]

    def nvmlDeviceGetNvLinkState(self, h: str, link: int) -> int:
        return pynvml.NVML_FEATURE_DISABLED if self._link(h, link) is None else 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: str, link: int) -> int:
        if self._link(h, link) == SWITCH:
            return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        return pynvml.NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: str, link: int) -> Any:
        peer = self._link(h, link)
        if not isinstance(peer, int):
            return SimpleNamespace(busId=b"00000000:C1:00.0")  # an NVSwitch's own bus
        bus = self.bus(peer)
        return SimpleNamespace(busId=(bus[4:].lower() if self.legacy else bus).encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, a: str, b: str) -> int:
        i, j = sorted((int(a[3:]), int(b[3:])))
        return self.levels.get((i, j), pynvml.NVML_TOPOLOGY_SYSTEM)


class NoNVML(FakeNVML):
    """NVML that cannot be loaded: the library is missing, as on a machine without a driver."""

    def nvmlInit(self) -> None:
        raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
