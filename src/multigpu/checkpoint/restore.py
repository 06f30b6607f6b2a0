"""Choosing the checkpoint to resume from, and putting every tracked object back."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint.layout import (
    COMMIT_FILE,
    MANIFEST_FILE,
    STATE_FILE,
    TMP_PREFIX,
    CheckpointStatus,
    find_latest,
    rank_file_name,
    scan,
    unfinished_step,
    verify_checkpoint,
)
from multigpu.checkpoint.legacy import restore_whole
from multigpu.checkpoint.objects import kind_of, load_into
from multigpu.checkpoint.rng import restore_rng
from multigpu.checkpoint.snapshot import SHARDED_KINDS, StateAdapter, restore_sharded
from multigpu.checkpoint.writer import remove_stale
from multigpu.errors import CheckpointError, CheckpointMismatchError
from multigpu.seed import seed_everything

log = logging.getLogger(__name__)


def choose_checkpoint(
    directory: Path, path: str | os.PathLike[str], *, remove_unfinished: bool = False
) -> str | None:
    """Rank 0's choice: the path to resume from, None for none, or ``"error: ..."``.

    The error comes back as text so that rank 0 can broadcast it: every rank then raises it,
    instead of the others waiting for a broadcast that never comes.

    ``remove_unfinished``: the caller holds the directory (its lock: no other run writes there),
    so the temp dirs of saves no save of this process is writing belong to a dead run and can
    never be completed; they are removed, and said so.
    """
    try:
        if str(path) == "auto":
            return _choose_latest(directory, remove_unfinished)
        status = verify_checkpoint(path)
        if not status.complete:
            return f"error: checkpoint {path} is not usable: {'; '.join(status.problems)}"
        return str(status.path)
    except OSError as e:
        return f"error: cannot read checkpoints in {path}: {e}"


def _choose_latest(directory: Path, remove_unfinished: bool) -> str | None:
    if not remove_unfinished:
        status = find_latest(directory)
        return str(status.path) if status is not None else None
    removed = remove_stale(directory, f"{TMP_PREFIX}step-*") if directory.is_dir() else []
    found = scan(directory)
    if found.chosen is None:
        _say_nothing_complete(directory, found.skipped, removed)
        return None
    newest = found.chosen.step if found.chosen.step is not None else -1
    newer = [p for p in removed if (unfinished_step(p) or -1) > newest]
    for status in found.skipped:
        log.warning("skipping checkpoint %s: %s", status.path, "; ".join(status.problems))
    for path in newer:
        log.warning(
            "removed %s: a save of step %s that did not finish (no %s) by a run that is gone",
            path,
            unfinished_step(path),
            COMMIT_FILE,
        )
    if found.skipped or newer:
        log.warning("using the previous complete checkpoint %s", found.chosen.path)
    return str(found.chosen.path)


def _say_nothing_complete(
    directory: Path, skipped: tuple[CheckpointStatus, ...], removed: list[Path]
) -> None:
    """One warning line: what was found, that nothing is complete, that training starts over."""
    found = [f"{s.path.name} ({'; '.join(s.problems)})" for s in skipped]
    found += [f"{p.name} (no {COMMIT_FILE} marker: a save that did not finish)" for p in removed]
    if not found:
        return
    gone = (
        f"; the {len(removed)} unfinished save(s) of a run that is gone were removed"
        if removed
        else ""
    )
    log.warning(
        "checkpoint directory %s holds %d incomplete checkpoint(s): %s; nothing is complete; "
        "training starts from the beginning (step 0)%s",
        directory,
        len(found),
        ", ".join(found),
        gone,
    )


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint directory."""
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path / MANIFEST_FILE}: {e}") from e
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path / MANIFEST_FILE} is not a manifest")
    return manifest


def restore_checkpoint(
    path: Path,
    *,
    rank: int,
    shared: Mapping[str, Any],
    per_rank: Mapping[str, Any],
    adapter: StateAdapter,
    rng: bool = True,
) -> int:
    """Load ``path`` into the tracked objects and this rank's RNGs; return the saved step.

    Collective (the sharded part is read by every rank together).

    Raises:
        CheckpointError: a tracked object is missing from the checkpoint (a partial restore is
            an error, never a warning) or does not fit its saved state; a file does not load.
    """
    manifest = read_manifest(path)
    state = load_part(path / STATE_FILE)
    saved_objects: dict[str, Any] = manifest.get("objects", {})
    step, saved_world = int(state["step"]), int(state["world_size"])
    legacy = int(manifest.get("version", 1)) < 2
    # ctx.save and `ckpt convert` write no rank files: no RNG states to restore, none to seed.
    per_rank_files = legacy or any(n.startswith("rank-") for n in manifest.get("files", {}))
    mine = load_part(path / rank_file_name(rank)) if per_rank_files and rank < saved_world else None
    per_rank_saved = (mine or {}).get("objects", {})
    in_state = state.get("objects", {})
    available = set(in_state) if legacy else set(saved_objects)
    missing = [n for n in shared if n not in available]
    if mine is not None or not per_rank_files:
        missing += [n for n in per_rank if n not in per_rank_saved]
    if missing:
        raise CheckpointMismatchError(
            f"checkpoint {path} has no state for {missing} (it holds {sorted(available)}); "
            "track the same objects under the same names as the run that saved it"
        )
    extra = sorted(available - set(shared) - set(per_rank))
    if extra:
        log.warning("checkpoint %s also holds %s, which this run does not track", path, extra)
    small = {n: o for n, o in shared.items() if legacy or kind_of(o) not in SHARDED_KINDS}
    if legacy:
        restore_whole(path, small, in_state)
    else:
        sharded = {n: o for n, o in shared.items() if n not in small}
        restore_sharded(path, sharded, saved_objects, adapter)
        for name, obj in small.items():
            load_into(name, obj, in_state[name])
    _restore_rank(path, rank, step, saved_world, mine, per_rank, rng and per_rank_files)
    if rank == 0:
        log.info("resumed from %s (step %d, saved by %d ranks)", path, step, saved_world)
    return step


def _restore_rank(
    path: Path,
    rank: int,
    step: int,
    saved_world: int,
    mine: dict[str, Any] | None,
    per_rank: Mapping[str, Any],
    rng: bool,
) -> None:
    if mine is not None:
        for name, obj in per_rank.items():
            load_into(name, obj, mine["objects"][name])
        if rng and mine.get("rng") is not None:
            restore_rng(mine["rng"])
        return
    if not rng:
        return
    # More ranks than saved: no RNG state of their own. Seeded from (step, rank) so the run is
    # still reproducible, and distinct per rank.
    seed = (step * 1_000_003 + rank) % 2**32
    seed_everything(seed)
    left = f"; per-rank objects {sorted(per_rank)} left as they are" if per_rank else ""
    log.info(
        "rank %d: the checkpoint %s was saved by %d ranks; this rank's RNGs are seeded from "
        "(step, rank) = %d%s",
        rank,
        path,
        saved_world,
        seed,
        left,
    )


def load_part(path: Path) -> dict[str, Any]:
    """One file of a checkpoint, on the CPU, with ``weights_only=True``."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot load {path}: {type(e).__name__}: {e}") from e
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{path} holds a {type(loaded).__name__}, not a checkpoint part")
    return loaded
