"""Know before you run: a model's training state per rank under each strategy, and what fits.

``estimate_memory(model, world_size=N)`` counts (a meta-device model costs nothing);
``device_capacity(device, local_processes)`` says what a rank has; ``MemoryEstimate.choose`` /
``choose`` is what ``strategy="auto"`` does with both. ``multigpu estimate`` is the command line.

Example:
    >>> import torch
    >>> from multigpu.estimate import Capacity, estimate_memory
    >>> with torch.device("meta"):
    ...     net = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096) for _ in range(12)))
    >>> est = estimate_memory(net, world_size=2, capacity=Capacity(bytes=3 * 2**30, source="x"))
    >>> est.choose()[0]
    'fsdp'
"""

from __future__ import annotations

from multigpu.estimate.capacity import Capacity, cpu_capacity, device_capacity, gpus_capacity
from multigpu.estimate.choice import choose
from multigpu.estimate.memory import MemoryEstimate, estimate_memory

__all__ = [
    "Capacity",
    "MemoryEstimate",
    "choose",
    "cpu_capacity",
    "device_capacity",
    "estimate_memory",
    "gpus_capacity",
]
