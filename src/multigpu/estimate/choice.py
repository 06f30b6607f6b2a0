"""``strategy="auto"``: DDP when the model's state fits a rank with room to spare, else FSDP.

DDP is the faster of the two wherever it fits (no gathering before each unit's compute; on 2
CPU processes FSDP's step was 2-2.4x slower, ``benchmarks/RESULTS.md``), so it is kept unless
its state would take more than ``HEADROOM`` of the rank's memory — the rest is for activations,
which the estimate leaves out.
"""

from __future__ import annotations

from multigpu.estimate.capacity import GIB, Capacity
from multigpu.estimate.memory import MemoryEstimate

HEADROOM = 0.8
"""The share of a rank's memory the model's state may take under the strategy chosen."""


def choose(estimate: MemoryEstimate, capacity: Capacity) -> tuple[str, str]:
    """(``"ddp"`` or ``"fsdp"``, the one-line reason), from the estimate and the capacity.

    Example:
        >>> from multigpu.estimate.memory import estimate_memory
        >>> import torch
        >>> with torch.device("meta"):
        ...     net = torch.nn.Linear(1000, 1000)
        >>> choose(estimate_memory(net, world_size=2), Capacity(bytes=2**30, source="x"))[0]
        'ddp'
    """
    ddp, fsdp = estimate.of("ddp").device, estimate.of("fsdp").device
    room = capacity.bytes * HEADROOM
    need = f"ddp needs ~{ddp / GIB:.2f} GiB per rank, fsdp ~{fsdp / GIB:.2f} GiB"
    have = f"{capacity} available"
    if ddp <= room:
        return "ddp", f"the model's state fits every rank ({need}; {have})"
    if fsdp <= room:
        return "fsdp", f"the model's state does not fit a rank whole ({need}; {have})"
    return "fsdp", (
        f"the model's state fits a rank under neither ({need}; {have}): fsdp holds the least; "
        "add processes, use precision='bf16-mixed', or cpu_offload on GPUs"
    )
