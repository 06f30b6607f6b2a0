"""Value objects of GPU discovery: ``GPUInfo`` (one device), ``GPURequest`` (what ``--gpus`` asks
for), ``Inventory`` (what a probe found, before ``CUDA_VISIBLE_DEVICES`` is applied) and
``DriverFacts`` (the NVIDIA driver).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from multigpu.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class GPUInfo:
    """One GPU (or one MIG instance) as this process sees it. Made by ``list_gpus``."""

    index: int
    """Physical index: NVML / nvidia-smi order, i.e. PCI bus order (the parent's, for MIG)."""
    logical_index: int | None = None
    """Index as this process sees it under ``CUDA_VISIBLE_DEVICES``; None if hidden from it."""
    uuid: str
    """``GPU-...`` (or ``MIG-...`` for a MIG instance); names the per-GPU lock file."""
    name: str
    """Marketing name, e.g. ``NVIDIA A100-SXM4-80GB`` (``... MIG 1g.10gb`` for an instance)."""
    pci_bus_id: str
    """``00000000:07:00.0``; empty when unknown."""
    memory_total_mib: int
    memory_free_mib: int
    """Free memory in MiB at the time of the probe."""
    memory_used_mib: int | None = None
    """Used memory in MiB as the driver counts it (None when not reported)."""
    utilization_percent: int | None = None
    """GPU utilisation in percent over the driver's last sample period; None when unsupported."""
    processes: tuple[int, ...] = ()
    """Pids of compute processes on it (any user's)."""
    visible_id: str
    """The token to put in a child's ``CUDA_VISIBLE_DEVICES`` for this GPU (its UUID when known,
    which means the same device whatever ``CUDA_DEVICE_ORDER`` the child uses)."""

    def mig_instance(
        self,
        *,
        uuid: str,
        profile: str,
        total_mib: int,
        free_mib: int,
        used_mib: int | None = None,
        processes: tuple[int, ...] = (),
    ) -> GPUInfo:
        """One MIG instance of this GPU (``profile`` ``1g.10gb`` and the like) as CUDA shows it: a
        device of its own, named by its ``MIG-...`` UUID. It has no utilisation: the GPU's counts
        every instance, and NVML reports none per instance."""
        return replace(
            self,
            uuid=uuid,
            name=f"{self.name} MIG {profile}",
            memory_total_mib=total_mib,
            memory_free_mib=free_mib,
            memory_used_mib=used_mib,
            utilization_percent=None,
            processes=processes,
            visible_id=uuid,
        )


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """Every physical GPU (``logical_index`` unset, ``visible_id`` = UUID) and MIG instance."""

    gpus: tuple[GPUInfo, ...] = ()
    """Physical GPUs in physical-index order."""
    migs: tuple[GPUInfo, ...] = ()
    """MIG instances of MIG-enabled GPUs (``GPUInfo.mig_instance``), in (GPU, instance) order."""
    source: str = "none"
    """Which probe found them: ``nvml``, ``nvidia-smi``, ``torch`` or ``none``."""


@dataclass(frozen=True, kw_only=True)
class DriverFacts:
    """The NVIDIA driver of this machine."""

    version: str
    """``"570.86.15"``."""
    cuda: str | None
    """The newest CUDA it supports, ``"12.8"`` (None when not reported)."""
    source: str
    """``nvml`` or ``nvidia-smi``."""


@dataclass(frozen=True, kw_only=True)
class GPURequest:
    """What the user asked for with ``--gpus``. Made by ``parse_gpu_request``."""

    kind: Literal["auto", "count", "indices"]
    """``auto`` (every idle GPU), ``count`` (that many) or ``indices`` (exactly those)."""
    count: int | None = None
    """For ``count``: how many GPUs, at least 1."""
    indices: tuple[int, ...] | None = None
    """For ``indices``: logical indices as the user sees them (under CUDA_VISIBLE_DEVICES)."""

    def __post_init__(self) -> None:
        # A request built by hand (not parsed) must still be coherent; checked, never asserted.
        ok = {
            "auto": self.count is None and self.indices is None,
            "count": self.count is not None and self.count >= 1 and self.indices is None,
            "indices": self.count is None
            and bool(self.indices)
            and all(i >= 0 for i in self.indices or ())
            and len(set(self.indices or ())) == len(self.indices or ()),
        }.get(self.kind, False)
        if not ok:
            raise UsageError(
                f"GPURequest(kind={self.kind!r}, count={self.count!r}, indices={self.indices!r}) "
                "is inconsistent; expected kind='auto', kind='count' with count >= 1, or "
                "kind='indices' with distinct indices >= 0; build it with parse_gpu_request"
            )

    def as_option(self) -> str:
        """The request spelled as the ``--gpus`` value that gives it (for messages).

        Example:
            >>> GPURequest(kind="indices", indices=(0,)).as_option()
            '--gpus 0,'
        """
        if self.kind == "count":
            return f"--gpus {self.count}"
        if self.kind == "indices":
            text = ",".join(str(i) for i in self.indices or ())
            return f"--gpus {text}" + ("," if len(self.indices or ()) == 1 else "")
        return "--gpus auto"
