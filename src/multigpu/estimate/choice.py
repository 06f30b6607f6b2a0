"""``strategy="auto"``: DDP when the model's state fits a rank with room to spare, else FSDP.

DDP is the faster of the two wherever it fits (no gathering before each unit's compute; on 2
CPU processes FSDP's step was 2-2.4x slower, ``benchmarks/RESULTS.md``), so it is kept unless
its state would take more than ``HEADROOM`` of the rank's memory — the rest is for activations,
which the estimate leaves out. When even FSDP's state does not fit, FSDP is still the answer
(it holds the least) and the reason says what would fit: more processes, CPU offload on GPUs,
an optimizer with less state.
"""

from __future__ import annotations

import math

from multigpu.estimate.capacity import Capacity
from multigpu.estimate.figures import MemoryFigures, size

HEADROOM = 0.8
"""The share of a rank's memory the model's state may take under the strategy chosen."""


def choose(estimate: MemoryFigures, capacity: Capacity) -> tuple[str, str]:
    """(``"ddp"`` or ``"fsdp"``, the one-line reason), from the estimate and the capacity
    (``"single"`` for one process: there is nothing to split).

    Example:
        >>> import torch
        >>> from multigpu.estimate.memory import estimate_memory
        >>> with torch.device("meta"):
        ...     net = torch.nn.Linear(1000, 1000)
        >>> choose(estimate_memory(net, world_size=2), Capacity(bytes=2**30, source="x"))[0]
        'ddp'
    """
    if estimate.world_size == 1:
        return "single", "one process: nothing to split"
    ddp, fsdp = estimate.of("ddp").device, estimate.of("fsdp").device
    room = estimate.room(capacity) or 0
    usable = room * HEADROOM
    need = f"ddp needs ~{size(ddp)} per rank, fsdp ~{size(fsdp)}"
    have = f"{size(room)} per rank: {capacity.source}"
    if ddp <= usable:
        share = f"{100 * ddp / max(room, 1):.0f} % <= {100 * HEADROOM:.0f} %"
        return "ddp", f"the model's state fits every rank ({need}; {share} of {have})"
    if fsdp <= usable:
        return "fsdp", (
            f"the model's state does not fit a rank whole with room to spare ({need}; "
            f"{100 * HEADROOM:.0f} % of {have})"
        )
    if fsdp <= room:
        return "fsdp", (
            f"the model's state does not fit a rank whole, and under fsdp leaves little room "
            f"for activations ({need}; {have}); {_ways_out(estimate, usable, capacity)}"
        )
    return "fsdp", (
        f"the model's state fits a rank under neither ({need}; {have}): fsdp holds the least; "
        f"{_ways_out(estimate, usable, capacity)}"
    )


def processes_needed(estimate: MemoryFigures, usable: float) -> int | None:
    """The fewest processes over which FSDP's state takes at most ``usable`` bytes a rank
    (None: the gathered units alone take more).

    Example:
        >>> import torch
        >>> from multigpu.estimate.memory import estimate_memory
        >>> with torch.device("meta"):
        ...     net = torch.nn.Sequential(*(torch.nn.Linear(1000, 1000) for _ in range(8)))
        >>> processes_needed(estimate_memory(net, world_size=2), 50 * 2**20)
        4
    """
    fsdp = estimate.of("fsdp")
    whole = (fsdp.params + fsdp.grads + fsdp.optimizer) * estimate.world_size
    left = usable - fsdp.buffers
    if left <= 0:
        return None
    return max(1, math.ceil(whole / left))


def _ways_out(estimate: MemoryFigures, usable: float, capacity: Capacity) -> str:
    ways = []
    needed = processes_needed(estimate, usable)
    if needed is not None and needed > estimate.world_size:
        ways.append(f"{needed} or more processes")
    offload = estimate.of("fsdp+offload")
    if capacity.kind == "cuda" and offload.device <= usable:
        ways.append("FSDPStrategy(cpu_offload=True)")
    if estimate.states_per_param:
        ways.append("an optimizer with less state (sgd keeps none)")
    ways.append("a smaller model")
    return "it would fit with " + ", or ".join(ways)
