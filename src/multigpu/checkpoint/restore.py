"""Choosing the checkpoint to resume from, and putting every tracked object back.

Environment variables read: none.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from multigpu.checkpoint.layout import (
    STATE_FILE,
    CheckpointStatus,
    find_latest,
    rank_file_name,
    verify_checkpoint,
)
from multigpu.checkpoint.objects import load_into
from multigpu.checkpoint.rng import restore_rng
from multigpu.errors import CheckpointError
from multigpu.seed import seed_everything

log = logging.getLogger(__name__)


def choose_checkpoint(directory: Path, path: str | os.PathLike[str]) -> str | None:
    """Rank 0's choice: the path to resume from, None for none, or ``"error: ..."``.

    The error comes back as text so that rank 0 can broadcast it: every rank then raises it,
    instead of the others waiting for a broadcast that never comes.
    """
    try:
        if str(path) == "auto":
            status: CheckpointStatus | None = find_latest(directory)
            return str(status.path) if status is not None else None
        status = verify_checkpoint(path)
        if not status.complete:
            return f"error: checkpoint {path} is not usable: {'; '.join(status.problems)}"
        return str(status.path)
    except OSError as e:
        return f"error: cannot read checkpoints in {path}: {e}"


def restore_checkpoint(
    path: Path,
    *,
    rank: int,
    shared: Mapping[str, Any],
    per_rank: Mapping[str, Any],
    unwrap: Callable[[nn.Module], nn.Module],
) -> int:
    """Load ``path`` into the tracked objects and this rank's RNGs; return the saved step.

    Raises:
        CheckpointError: a tracked object is missing from the checkpoint (a partial restore is
            an error, never a warning) or does not fit its saved state; a file does not load.
    """
    state = load_part(path / STATE_FILE)
    saved = state.get("objects", {})
    step, saved_world = int(state["step"]), int(state["world_size"])
    mine = load_part(path / rank_file_name(rank)) if rank < saved_world else None
    per_rank_saved = (mine or {}).get("objects", {})
    missing = [n for n in shared if n not in saved]
    if mine is not None:
        missing += [n for n in per_rank if n not in per_rank_saved]
    if missing:
        raise CheckpointError(
            f"checkpoint {path} has no state for {missing} (it holds {sorted(saved)}); "
            "track the same objects under the same names as the run that saved it"
        )
    extra = sorted(set(saved) - set(shared))
    if extra:
        log.warning("checkpoint %s also holds %s, which this run does not track", path, extra)
    for name, obj in shared.items():
        load_into(name, obj, saved[name], unwrap)
    if mine is not None:
        for name, obj in per_rank.items():
            load_into(name, obj, per_rank_saved[name], unwrap)
        restore_rng(mine["rng"])
    else:
        # More ranks than saved: no RNG state of their own. Seeded from (step, rank) so the
        # run is still reproducible, and distinct per rank.
        seed = (step * 1_000_003 + rank) % 2**32
        seed_everything(seed)
        left = f"; per-rank objects {sorted(per_rank)} left as they are" if per_rank else ""
        log.info(
            "rank %d: the checkpoint was saved by %d ranks; this rank's RNGs are seeded from "
            "(step, rank) = %d%s",
            rank,
            saved_world,
            seed,
            left,
        )
    if rank == 0:
        log.info("resumed from %s (step %d, saved by %d ranks)", path, step, saved_world)
    return step


def load_part(path: Path) -> dict[str, Any]:
    """One file of a checkpoint, on the CPU, with ``weights_only=True``."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot load {path}: {type(e).__name__}: {e}") from e
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{path} holds a {type(loaded).__name__}, not a checkpoint part")
    return loaded
