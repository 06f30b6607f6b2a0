"""``format_gpu_table``: the GPUs as a plain-text table (``multigpu gpus``, ``--dry-run``)."""

from __future__ import annotations

from collections.abc import Sequence

from multigpu.gpus.types import GPUInfo

HEADER = ("GPU", "CUDA", "NAME", "FREE/TOTAL MiB", "UTIL", "PROCESSES")


def _processes(pids: tuple[int, ...], limit: int = 4) -> str:
    if not pids:
        return "-"
    shown = ",".join(map(str, pids[:limit]))
    return shown + (f" +{len(pids) - limit}" if len(pids) > limit else "")


def format_gpu_table(gpus: Sequence[GPUInfo]) -> str:
    """A left-aligned table: physical index, logical index (``-`` if hidden), name, free/total
    memory, utilisation (``n/a`` when unsupported) and compute pids."""
    rows = [HEADER] + [
        (
            str(g.index),
            "-" if g.logical_index is None else str(g.logical_index),
            g.name,
            f"{g.memory_free_mib}/{g.memory_total_mib}",
            "n/a" if g.utilization_percent is None else f"{g.utilization_percent}%",
            _processes(g.processes),
        )
        for g in gpus
    ]
    widths = [max(len(r[c]) for r in rows) for c in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"
