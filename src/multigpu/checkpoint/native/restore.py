"""Choosing the checkpoint to resume from, and putting every tracked object back.

Format-1 checkpoints (before DCP) hold whole models and optimizers in ``state.pt``. They load
under any strategy through torch's full-state-dict path: each rank reads the whole tensors and
keeps what it holds (all of them, or its FSDP shards). A format-1 optimizer state is keyed by
parameter *position*; the live optimizer's parameters, in the same order, give the names
torch's loader wants.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from multigpu.checkpoint.native.layout import (
    COMMIT_FILE,
    STATE_FILE,
    TMP_PREFIX,
    CheckpointStatus,
    complete_checkpoint,
    rank_file_name,
    read_manifest,
    scan,
    warn_skipped,
)
from multigpu.checkpoint.native.objects import kind_of, load_into
from multigpu.checkpoint.native.rng import restore_rng
from multigpu.checkpoint.native.sharded import first_line
from multigpu.checkpoint.native.snapshot import (
    SHARDED_KINDS,
    StateAdapter,
    pair_optimizers,
    restore_sharded,
)
from multigpu.checkpoint.native.writer import remove_stale
from multigpu.errors import CheckpointError, CheckpointMismatchError, CheckpointUnreadableError
from multigpu.runtime.seed import seed_everything
from multigpu.runtime.wrappers import unwrap_module

log = logging.getLogger(__name__)


def choose_checkpoint(directory: Path, path: str | os.PathLike[str]) -> Path | None:
    """Rank 0's choice: the checkpoint to resume from, or None for none (a CheckpointError
    when ``path`` is not usable).

    The caller holds ``directory``'s lock, so the temp dirs no save of this process is writing
    are a dead run's, never to be completed: they are removed, and said so.
    """
    try:
        if str(path) == "auto":
            return _choose_latest(directory)
        return complete_checkpoint(path)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoints in {path}: {e}") from e


def _choose_latest(directory: Path) -> Path | None:
    removed = remove_stale(directory, f"{TMP_PREFIX}step-*")
    chosen, skipped = scan(directory)
    if chosen is None:
        _say_nothing_complete(directory, skipped, removed)
        return None
    warn_skipped(
        log,
        chosen,
        skipped,
        removed,
        "removed %s: a save of step %s that did not finish (no %s) by a run that is gone",
    )
    return chosen.path


def _say_nothing_complete(
    directory: Path, skipped: list[CheckpointStatus], removed: list[Path]
) -> None:
    """One warning line: what was found, that nothing is complete, that training starts over."""
    found = [f"{s.path.name} ({'; '.join(s.problems)})" for s in skipped]
    found += [f"{p.name} (no {COMMIT_FILE} marker: a save that did not finish)" for p in removed]
    if not found:
        return
    gone = f"; the {len(removed)} unfinished save(s) of a run that is gone were removed"
    log.warning(
        "checkpoint directory %s holds %d incomplete checkpoint(s): %s; nothing is complete; "
        "training starts from the beginning (step 0)%s",
        directory,
        len(found),
        ", ".join(found),
        gone if removed else "",
    )


def restore_checkpoint(
    path: Path,
    *,
    rank: int,
    shared: Mapping[str, Any],
    per_rank: Mapping[str, Any],
    adapter: StateAdapter,
    optional: Collection[str] = (),
) -> int:
    """Load ``path`` into the tracked objects and this rank's RNGs; return the saved step.

    Collective. A tracked object missing from the checkpoint is an error, never a warning —
    except the ``optional`` ones (what multigpu itself adds, e.g. a replica group's job step,
    absent from checkpoints saved without it): left as they are.
    """
    manifest = read_manifest(path)
    state = load_part(path / STATE_FILE)
    step, saved_world = int(state["step"]), int(state["world_size"])
    # ctx.save and `ckpt convert` write no rank files: no RNG states to restore, none to seed.
    files = manifest.get("files", {})
    per_rank_files = _legacy(manifest) or any(n.startswith("rank-") for n in files)
    mine = load_part(path / rank_file_name(rank)) if per_rank_files and rank < saved_world else None
    per_rank_saved = (mine or {}).get("objects", {})
    in_state = state.get("objects", {})
    available = saved_names(manifest, in_state)
    shared = {k: v for k, v in shared.items() if k in available or k not in optional}
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
    restore_objects(path, shared, manifest, in_state, adapter)
    if mine is not None:
        for name, obj in per_rank.items():
            load_into(name, obj, mine["objects"][name])
        if mine.get("rng") is not None:
            restore_rng(mine["rng"])
    elif per_rank_files:  # none: no RNG states were saved, none to seed either
        # More ranks than saved: no RNG state of their own. Seeded from (step, rank) so the run
        # is still reproducible, and distinct per rank.
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
    if rank == 0:
        log.info("resumed from %s (step %d, saved by %d ranks)", path, step, saved_world)
    return step


def _legacy(manifest: Mapping[str, Any]) -> bool:
    return int(manifest.get("version", 1)) < 2


def saved_names(manifest: Mapping[str, Any], in_state: Mapping[str, Any]) -> set[str]:
    """The names of the objects a checkpoint holds (``in_state``: ``state.pt``'s objects)."""
    return set(in_state) if _legacy(manifest) else set(manifest.get("objects", {}))


def restore_objects(
    path: Path,
    objects: Mapping[str, Any],
    manifest: Mapping[str, Any],
    in_state: Mapping[str, Any],
    adapter: StateAdapter,
) -> None:
    """Load ``objects``: models and optimizers from the DCP part (format 1: whole, from
    ``state.pt``), the others from ``in_state``. Collective."""
    if _legacy(manifest):
        restore_whole(path, objects, in_state)
        return
    sharded = {n: o for n, o in objects.items() if kind_of(o) in SHARDED_KINDS}
    restore_sharded(path, sharded, manifest.get("objects", {}), adapter)
    for name, obj in objects.items():
        if name not in sharded:
            load_into(name, obj, in_state[name])


def load_part(path: Path) -> dict[str, Any]:
    """One file of a checkpoint, on the CPU, with ``weights_only=True``."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointUnreadableError(f"cannot load {path}: {type(e).__name__}: {e}") from e
    if not isinstance(loaded, dict):
        raise CheckpointUnreadableError(
            f"{path} holds a {type(loaded).__name__}, not a checkpoint part"
        )
    return loaded


_FULL = StateDictOptions(full_state_dict=True)


def restore_whole(path: Path, objects: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    """Load the format-1 states ``saved`` (``state.pt``'s objects) into ``objects``."""
    pairs = pair_optimizers(objects)
    for name, obj in objects.items():
        try:
            if isinstance(obj, nn.Module):
                set_model_state_dict(unwrap_module(obj), dict(saved[name]), options=_FULL)
            elif isinstance(obj, torch.optim.Optimizer):
                model = unwrap_module(pairs[name])
                state = _by_name(obj, model, saved[name])
                set_optimizer_state_dict(model, obj, state, options=_FULL)
            else:
                load_into(name, obj, saved[name])
        except CheckpointError:
            raise
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
            raise CheckpointError(
                f"checkpoint object {name!r} ({type(obj).__name__}) does not fit the saved "
                f"state of {path}: {first_line(e)}"
            ) from e


def _by_name(
    optimizer: torch.optim.Optimizer, model: nn.Module, saved: Mapping[str, Any]
) -> dict[str, Any]:
    names = {id(p): n for n, p in model.named_parameters()}
    live = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    position = dict(enumerate(live))
    return {
        "state": {position[int(i)]: dict(s) for i, s in saved["state"].items()},
        "param_groups": [
            {**g, "params": [position[int(i)] for i in g["params"]]} for g in saved["param_groups"]
        ],
    }
