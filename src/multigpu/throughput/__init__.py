"""Throughput you can compare: the step meter behind ``ctx.throughput()``, the collective-wait
clock, and MFU against a table of devices' peak FLOP/s."""

from multigpu.throughput.meter import StepMeter, peak_memory_bytes
from multigpu.throughput.peak import Peak, find_peak, flops_per_token, mfu, peak_flops

__all__ = [
    "Peak",
    "StepMeter",
    "find_peak",
    "flops_per_token",
    "mfu",
    "peak_flops",
    "peak_memory_bytes",
]
