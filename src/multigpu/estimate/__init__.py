"""Know before you run: a model's training state per rank under each strategy, and what fits.

``estimate_memory(model, world_size=N)`` counts (a meta-device model costs nothing);
``device_capacity(device, local_processes)`` says what a rank has; ``choose`` is what
``strategy="auto"`` does with both. ``multigpu estimate`` is the command line.
"""

from multigpu.estimate.capacity import Capacity, cpu_capacity, device_capacity
from multigpu.estimate.choice import HEADROOM, choose
from multigpu.estimate.memory import MemoryEstimate, StrategyMemory, estimate_memory

__all__ = [
    "HEADROOM",
    "Capacity",
    "MemoryEstimate",
    "StrategyMemory",
    "choose",
    "cpu_capacity",
    "device_capacity",
    "estimate_memory",
]
