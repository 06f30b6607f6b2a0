"""What ``multigpu bench scaling`` is asked to measure (parsed by ``multigpu.cli.bench``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ScalingOptions:
    """What ``multigpu bench scaling`` was asked to measure."""

    target: str
    """The script's path, or the module with ``is_module``."""
    is_module: bool
    """``target`` is a module (``-m``)."""
    script_args: tuple[str, ...] = ()
    """Arguments passed to the script unchanged."""
    nproc: tuple[int, ...] = (1, 2)
    """World sizes, ascending; the first is the baseline of the speed-up."""
    steps: int = 50
    """Timed optimizer steps per run."""
    warmup: int = 5
    """Optimizer steps before them, not timed (start-up, first allocations)."""
    repeats: int = 1
    """Runs per configuration, interleaved; the median is reported."""
    as_json: bool = False
    """Print one JSON document instead of the tables."""
    out: Path | None = None
    """Directory for scaling.json, scaling.csv and scaling.png (None: write nothing)."""
    cpu: bool = False
    """CPU processes even on a machine with GPUs."""
    splits: bool = True
    """On CPUs, also measure every processes x threads split of the cores and save the best."""
    timeout: float = 600.0
    """Seconds one run may take."""
