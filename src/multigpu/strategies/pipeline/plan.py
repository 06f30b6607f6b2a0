"""Where a pipeline splits a model, and what its schedule costs: names checked, stages counted.

Pure functions of the model's module names and the numbers of stages, processes and
micro-batches, for ``PipelineStrategy``.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from multigpu.common.choices import PIPELINE_SCHEDULES
from multigpu.errors import UsageError
from multigpu.strategies.base import is_count

INTERLEAVED = "interleaved-1f1b"


def check_schedule(schedule: object) -> str:
    """``schedule`` as one of ``PIPELINE_SCHEDULES`` (case-insensitive), or a UsageError."""
    name = str(schedule).lower()
    if name not in PIPELINE_SCHEDULES:
        raise UsageError(
            f"pipeline schedule={schedule!r} is not known; expected one of "
            f"{', '.join(PIPELINE_SCHEDULES)}"
        )
    return name


def check_microbatches(microbatches: object) -> int:
    """``microbatches`` as a positive int, or a UsageError."""
    if not is_count(microbatches):
        raise UsageError(
            f"pipeline microbatches={microbatches!r} is not a positive number of micro-batches; "
            "give an integer >= 1, e.g. microbatches=4 (a multiple of the stages keeps the "
            "bubble small)"
        )
    return microbatches


def check_batch(batch_size: int, microbatches: int) -> None:
    """Refuse a batch that does not split into ``microbatches`` equal micro-batches."""
    if batch_size % microbatches:
        lower = batch_size - batch_size % microbatches
        raise UsageError(
            f"the batch of {batch_size} samples does not split into {microbatches} equal "
            f"pipeline micro-batches; make the batch a multiple of {microbatches} (e.g. "
            f"{max(lower, microbatches)}) or change the micro-batches"
        )


def stages_per_process(stages: int, world_size: int, schedule: str) -> int:
    """How many stages each process holds (1, or several under the interleaved schedule)."""
    if stages < 2:
        raise UsageError(
            f"a pipeline of {stages} stage cannot be split across processes; give at least one "
            "split point (or leave split_points=None to split the longest block list evenly)"
        )
    if stages < world_size or stages % world_size:
        raise UsageError(
            f"{stages} pipeline stages on {world_size} processes: each process holds whole "
            f"stages, so the stages must be {world_size} (or a multiple, with schedule="
            f"'{INTERLEAVED}'); give {world_size - 1} split points or run {stages} processes"
        )
    per = stages // world_size
    if per > 1 and schedule != INTERLEAVED:
        raise UsageError(
            f"{stages} pipeline stages on {world_size} processes: more stages than processes "
            f"need schedule='{INTERLEAVED}' ({per} stages each); give {world_size - 1} split "
            f"points or run {stages} processes"
        )
    return per


def default_split_points(module: nn.Module, stages: int) -> list[str]:
    """Split points cutting the longest block list of ``module`` into ``stages`` even runs."""
    name, length = "", 0  # of the longest ModuleList or Sequential
    for found, child in module.named_modules():
        if found and isinstance(child, nn.ModuleList | nn.Sequential) and len(child) > length:
            name, length = found, len(child)
    if length < stages:
        found = f"{name} has {length} blocks" if name else "it has no ModuleList or Sequential"
        raise UsageError(
            f"cannot split {type(module).__name__} into {stages} pipeline stages: {found}; give "
            "split_points naming the modules each stage begins with, or fewer stages"
        )
    cuts = sorted({round(k * length / stages) for k in range(1, stages)})
    return [f"{name}.{cut}" for cut in cuts]


def check_split_points(module: nn.Module, points: Sequence[str]) -> list[str]:
    """``points`` checked against ``module``: each names a submodule (not the root), once."""
    names = {name for name, _ in module.named_modules() if name}
    seen: set[str] = set()
    for point in points:
        if point not in names:
            parent = point.rsplit(".", 1)[0] if "." in point else ""
            near = sorted(
                n for n in names if n.startswith(parent) and n.count(".") == point.count(".")
            )
            hint = f" such as {', '.join(near[:4])}" if near else ""
            raise UsageError(
                f"split point {point!r} names no module of {type(module).__name__}; give the "
                f"name of a submodule each stage begins with{hint} (see model.named_modules())"
            )
        if point in seen:
            raise UsageError(f"split point {point!r} is given twice; give each once")
        seen.add(point)
    return list(points)


def schedule_bubble(schedule: str, stages: int, per_process: int, microbatches: int) -> float:
    """The idle fraction of every process under ``schedule`` when all stages take equal time.

    GPipe and 1F1B idle ``(p - 1) / (m + p - 1)`` of a step (``p`` processes, ``m``
    micro-batches); interleaving ``v`` stages per process shrinks the ramp to
    ``(p - 1) / (v·m + p - 1)``.

    Example:
        >>> schedule_bubble("1f1b", 2, 1, 4)
        0.2
    """
    processes = stages // per_process
    return (processes - 1) / (per_process * microbatches + processes - 1)
