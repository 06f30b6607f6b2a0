"""Parse ``--gpus`` and choose GPUs: every idle one, the N with the most free memory, or exactly
the indices given.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Sequence

from multigpu.errors import UsageError
from multigpu.gpus.types import GPUInfo, GPURequest

logger = logging.getLogger(__name__)


def parse_gpu_request(text: str) -> GPURequest:
    """Parse a ``--gpus`` value: ``auto``, a count ``N`` or indices ``i,j`` / ``i,``.

    A trailing comma means indices (Lightning's convention): ``"2"`` is two GPUs, ``"2,"`` is
    the GPU with index 2.

    Raises:
        UsageError: empty, negative, not a number, zero, or a repeated index.

    Example:
        >>> parse_gpu_request("3")
        GPURequest(kind='count', count=3, indices=None)
        >>> parse_gpu_request("1,0").indices
        (1, 0)
    """
    given = text.strip()
    if given.lower() == "auto":
        return GPURequest(kind="auto")
    if "," in given:
        parts = given.split(",")
        if parts[-1].strip() == "":
            parts = parts[:-1]  # "0," → [0]
        indices = [_non_negative(p, text) for p in parts]
        repeated = sorted({i for i in indices if indices.count(i) > 1})
        if repeated:
            raise UsageError(
                f"--gpus {text!r} names GPU {', '.join(map(str, repeated))} more than once; "
                "expected distinct indices; give each GPU once (one process per GPU)"
            )
        return GPURequest(kind="indices", indices=tuple(indices))
    count = _non_negative(given, text)
    if count == 0:
        raise UsageError(
            "--gpus 0 asks for zero GPUs; expected a count >= 1, 'auto' or indices; "
            'use --cpu N for CPU processes, or "--gpus 0," for the GPU with index 0'
        )
    return GPURequest(kind="count", count=count)


def _non_negative(part: str, text: str) -> int:
    part = part.strip()
    if not part.isdigit():
        raise UsageError(
            f"--gpus {text!r} is not understood ({part!r} is not an index >= 0); expected "
            "'auto', a count N >= 1, or indices like '0,1' or '2,' (trailing comma: one index); "
            "use --cpu N for CPU processes"
        )
    return int(part)


def busy_reason(
    gpu: GPUInfo,
    *,
    busy_utilization: int = 50,
    min_free_fraction: float = 0.1,
    busy_if_processes: bool = False,
) -> str | None:
    """Why ``gpu`` looks taken by someone else (``"util 97%"``), or None when it is idle."""
    why = []
    if gpu.utilization_percent is not None and gpu.utilization_percent >= busy_utilization:
        why.append(f"util {gpu.utilization_percent}%")
    if gpu.memory_total_mib > 0 and gpu.memory_free_mib < min_free_fraction * gpu.memory_total_mib:
        why.append(f"{gpu.memory_free_mib}/{gpu.memory_total_mib} MiB free")
    if busy_if_processes and gpu.processes:
        why.append(f"processes {', '.join(map(str, gpu.processes))}")
    return ", ".join(why) or None


def _names(gpus: Sequence[GPUInfo]) -> str:
    return ", ".join(_label(g) for g in gpus)


def _label(gpu: GPUInfo) -> str:
    return f"{_key(gpu)[0]}: {gpu.name}"


def _excluded(gpu: GPUInfo, exclude: Collection[int | str]) -> bool:
    return gpu.index in exclude or gpu.uuid in exclude


def select_gpus(
    gpus: Sequence[GPUInfo],
    request: GPURequest,
    *,
    busy_utilization: int = 50,
    min_free_fraction: float = 0.1,
    exclude: Collection[int | str] = (),
    busy_if_processes: bool = False,
) -> list[GPUInfo]:
    """Choose the GPUs for ``request`` among ``gpus`` (as ``list_gpus`` returns them).

    Args:
        busy_utilization: a GPU at or above this utilisation (percent) is busy.
        min_free_fraction: a GPU with less free memory than this fraction of its total is busy.
        exclude: physical indices (or UUIDs, for MIG instances) locked by other jobs; never chosen.
        busy_if_processes: also count a GPU with any compute process on it as busy.

    Returns:
        ``auto``: every GPU that is neither busy nor excluded. ``count``: the N with the most
        free memory, idle ones first (a busy one only when the idle ones are too few, with a
        warning), in logical-index order. ``indices``: exactly those, in the order given.

    Raises:
        UsageError: no GPU at all, too few GPUs, an index that does not exist, or one that is
            locked by another job.
    """
    if not gpus:
        raise UsageError(
            f"{request.as_option()} asks for GPUs but this machine shows none (no NVIDIA driver "
            "answered, or CUDA_VISIBLE_DEVICES hides them); use --cpu N for CPU processes"
        )

    busy = functools.partial(
        busy_reason,
        busy_utilization=busy_utilization,
        min_free_fraction=min_free_fraction,
        busy_if_processes=busy_if_processes,
    )
    if request.kind == "indices":
        return _by_indices(gpus, request, exclude, busy)
    free = [g for g in gpus if not _excluded(g, exclude)]
    idle = [g for g in free if busy(g) is None]
    if request.kind == "auto":
        if not idle:
            states = "; ".join(f"{_label(g)} ({busy(g) or 'locked'})" for g in gpus)
            raise UsageError(
                f"--gpus auto found no idle GPU among {len(gpus)} ({states}); expected one with "
                f"utilisation < {busy_utilization}% and >= {min_free_fraction:.0%} memory free; "
                "name GPUs explicitly with --gpus i,j, wait, or use --cpu N"
            )
        return idle
    count = request.count or 0
    if count > len(gpus):
        raise UsageError(
            f"--gpus {count} asks for {count} GPUs but this machine has {len(gpus)} "
            f"({_names(gpus)}); use --gpus {len(gpus)} or fewer, or --cpu N"
        )
    if count > len(free):  # so some GPUs are locked
        locked = [g for g in gpus if _excluded(g, exclude)]
        raise UsageError(
            f"--gpus {count} asks for {count} GPUs but only {len(free)} of {len(gpus)} are not "
            f"locked by other multigpu jobs ({_names(free) or 'none'}; locked by other multigpu "
            f"jobs: {_names(locked)}); use --gpus {len(free)} or fewer, wait for the other job, "
            "or use --cpu N"
        )
    by_free = sorted(free, key=lambda g: (busy(g) is not None, -g.memory_free_mib, _key(g)))
    chosen = by_free[:count]
    for g in chosen:
        why = busy(g)
        if why is not None:
            logger.warning(
                "GPU %s looks busy (%s); using it because --gpus %s asks for %s and only %s "
                "are idle",
                _label(g),
                why,
                count,
                count,
                len(idle),
            )
    return sorted(chosen, key=_key)


def _key(gpu: GPUInfo) -> tuple[int, int]:
    return (gpu.logical_index if gpu.logical_index is not None else gpu.index, gpu.index)


def _by_indices(
    gpus: Sequence[GPUInfo],
    request: GPURequest,
    exclude: Collection[int | str],
    busy: Callable[[GPUInfo], str | None],
) -> list[GPUInfo]:
    by_logical = {_key(g)[0]: g for g in gpus}
    chosen = []
    for i in request.indices or ():
        if i not in by_logical:
            raise UsageError(
                f"{request.as_option()} asks for GPU index {i} but this machine shows "
                f"{len(gpus)} GPU(s) ({_names(gpus)}); use indices 0..{max(by_logical)}, "
                f"--gpus {len(gpus)}, or --cpu N"
            )
        gpu = by_logical[i]
        if _excluded(gpu, exclude):
            raise UsageError(
                f"{request.as_option()} asks for GPU {_label(gpu)}, which another multigpu job "
                "has locked; pick other indices, use --gpus N to choose free ones, or wait"
            )
        why = busy(gpu)
        if why is not None:
            logger.warning("GPU %s looks busy (%s); using it as asked", _label(gpu), why)
        chosen.append(gpu)
    return chosen
