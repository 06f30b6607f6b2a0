"""Time and bandwidth of a collective exactly as nccl-tests reports them (its doc/PERFORMANCE.md).

- ``algbw = S / t``, in GB/s of 10^9 bytes.
- ``busbw = algbw × factor``: ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather and
  reduce-scatter, ``1`` for broadcast — the speed of the busiest link, comparable with the
  hardware's peak whatever the number of ranks n.
- ``S`` is the size of the whole array: the buffer of all-reduce and broadcast; for all-gather
  and reduce-scatter the TOTAL (n × the per-rank part), as nccl-tests does.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
"""nccl-tests' GB: 10^9 bytes."""


def bus_factor(op: str, world_size: int) -> float:
    """The factor from algorithm bandwidth to bus bandwidth for ``op`` at ``world_size`` ranks.

    Example:
        >>> bus_factor("all_reduce", 4), bus_factor("all_gather", 4), bus_factor("broadcast", 4)
        (1.5, 0.75, 1.0)
    """
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth ``S / t`` in GB/s (10^9 bytes)."""
    return size_bytes / seconds / GB


def busbw_gbps(op: str, size_bytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth ``algbw × factor(op, n)`` in GB/s."""
    return algbw_gbps(size_bytes, seconds) * bus_factor(op, world_size)


@dataclass(frozen=True, kw_only=True)
class Shape:
    """The buffers of one measurement: elements per rank in and out, and the size ``S``."""

    input_numel: int
    """Elements of each rank's input (also the output of all-reduce and broadcast)."""
    output_numel: int
    """Elements of each rank's output."""
    size_bytes: int
    """``S`` of the bandwidth formulas: the whole array, in bytes."""


def shape_for(op: str, size_bytes: int, world_size: int, element_size: int = 4) -> Shape | None:
    """The buffers that measure ``op`` at (about) ``size_bytes``; None when it is too small.

    As nccl-tests, all-gather and reduce-scatter round the total down to a whole number of
    elements per rank, so ``size_bytes`` of the result may be a little below the one asked for.

    Example:
        >>> shape_for("all_gather", 1024, 2)
        Shape(input_numel=128, output_numel=256, size_bytes=1024)
        >>> shape_for("reduce_scatter", 4, 2) is None
        True
    """
    count = size_bytes // element_size
    if count == 0:
        return None
    if op in ("all_reduce", "broadcast"):
        return Shape(input_numel=count, output_numel=count, size_bytes=count * element_size)
    per_rank = count // world_size
    if per_rank == 0:
        return None
    total = per_rank * world_size
    if op == "all_gather":
        return Shape(input_numel=per_rank, output_numel=total, size_bytes=total * element_size)
    if op == "reduce_scatter":
        return Shape(input_numel=total, output_numel=per_rank, size_bytes=total * element_size)
    raise ValueError(f"unknown collective {op!r}")
