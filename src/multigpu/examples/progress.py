"""The built-in jobs' throughput on a progress line and in metrics.json, from
``ctx.throughput(across_ranks=True)``."""

from __future__ import annotations

from typing import Any


def throughput_record(figures: dict[str, Any]) -> dict[str, Any]:
    """``ctx.throughput(across_ranks=True)``'s figures as a metrics.json record keeps them:
    tokens/s over all ranks, step time, rank 0's collective-wait share and the largest over the
    ranks, the largest peak memory of a rank, MFU (None off the GPUs of the table)."""

    def rounded(key: str, digits: int) -> Any:
        value = figures.get(key)
        return None if value is None else round(value, digits)

    tokens = figures.get("tokens_per_second")
    return {
        "tokens_per_second": None if tokens is None else round(tokens),
        "step_seconds": rounded("step_seconds", 5),
        "collective_wait_share": rounded("collective_wait_share", 4),
        "collective_wait_share_max": rounded("collective_wait_share_max", 4),
        "peak_memory_bytes": figures.get("peak_memory_bytes_max", figures["peak_memory_bytes"]),
        "mfu": rounded("mfu", 4),
    }


def throughput_text(record: dict[str, Any]) -> str:
    """A progress line's throughput: ``12345 tokens/s  step 41.2 ms  wait 23%  peak 310 MiB``
    (each part only when the record has it).

    Example:
        >>> throughput_text({"tokens_per_second": 12345, "step_seconds": 0.0412,
        ...     "collective_wait_share": 0.231, "peak_memory_bytes": 325058560, "mfu": 0.412})
        '12345 tokens/s  step 41.2 ms  wait 23%  peak 310 MiB  MFU 41.2%'
    """
    parts = (
        []
        if record.get("tokens_per_second") is None
        else [f"{record['tokens_per_second']} tokens/s"]
    )
    if record.get("step_seconds") is not None:
        parts.append(f"step {1e3 * record['step_seconds']:.1f} ms")
    if record.get("collective_wait_share") is not None:
        parts.append(f"wait {100 * record['collective_wait_share']:.0f}%")
    if record.get("peak_memory_bytes") is not None:
        parts.append(f"peak {record['peak_memory_bytes'] / 2**20:.0f} MiB")
    if record.get("mfu") is not None:
        parts.append(f"MFU {100 * record['mfu']:.1f}%")
    return "  ".join(parts)
