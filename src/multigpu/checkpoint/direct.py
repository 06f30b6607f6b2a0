"""``ctx.save(path, state)`` and ``ctx.load(path, state)``: one checkpoint at a path of your own.

The checkpoint is the same kind of directory a ``Checkpointer`` writes (sharded through DCP,
atomic, with a manifest and checksums), without RNG states.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from multigpu import dist
from multigpu.checkpoint.layout import (
    MANIFEST_FILE,
    STATE_FILE,
    TMP_PREFIX,
    find_latest,
    read_manifest,
    verify_checkpoint,
)
from multigpu.checkpoint.objects import epoch_of, kind_of
from multigpu.checkpoint.restore import load_part, restore_objects, saved_names
from multigpu.checkpoint.saving import SaveJob, save
from multigpu.checkpoint.snapshot import StateAdapter
from multigpu.errors import CheckpointError, CheckpointMismatchError, UsageError

log = logging.getLogger(__name__)


def _check_names(state: Mapping[str, Any], verb: str) -> None:
    if not isinstance(state, Mapping) or not state:
        raise UsageError(
            f"ctx.{verb} got {type(state).__name__}; expected a non-empty dict such as "
            '{"model": model, "optimizer": optimizer, "step": 100}'
        )
    bad = [k for k in state if not (isinstance(k, str) and k.isidentifier())]
    if bad:
        raise UsageError(
            f"ctx.{verb}: state keys {bad!r} are not identifiers; name each entry like a "
            'variable, e.g. {"model": model}'
        )


def save_state(
    path: str | os.PathLike[str],
    state: Mapping[str, Any],
    *,
    rank: int,
    world_size: int,
    adapter: StateAdapter,
    timeout: float,
    strategy: Mapping[str, Any],
) -> Path:
    """Write ``state`` as a complete checkpoint at ``path`` (collective); return the path.

    An existing ``path`` is replaced only when it is a multigpu checkpoint.
    """
    _check_names(state, "save")
    final = Path(path)
    problem = None
    if rank == 0 and final.exists() and not (final / MANIFEST_FILE).is_file():
        problem = (
            f"ctx.save: {final} exists and is not a multigpu checkpoint; expected a new path "
            "(or an earlier checkpoint to replace): choose another path"
        )
    problem = dist.broadcast(problem, src=0)
    if problem:
        raise UsageError(problem)
    step = state.get("step")
    job = SaveJob(
        final=final,
        stale=f"{TMP_PREFIX}{final.name}-*",
        step=step if isinstance(step, int) and not isinstance(step, bool) else 0,
        epoch=epoch_of(state),
        rank=rank,
        world_size=world_size,
        objects=state,
        rng=False,
        adapter=adapter,
        timeout=timeout,
        strategy=strategy,
    )
    return save(job)


def _resolve(path: str | os.PathLike[str]) -> str:
    """Rank 0: the complete checkpoint ``path`` names, or ``"error: ..."``."""
    p = Path(path)
    if not p.is_dir():
        return (
            f"error: {p} is not a checkpoint directory; expected a path given to ctx.save or "
            "a Checkpointer's directory"
        )
    if not (p / MANIFEST_FILE).is_file():
        latest = find_latest(p)
        if latest is None:
            return f"error: {p} holds no complete checkpoint; see 'multigpu ckpt inspect {p}'"
        return str(latest.path)
    status = verify_checkpoint(p)
    if not status.complete:
        return f"error: checkpoint {p} is not usable: {'; '.join(status.problems)}"
    return str(p)


def load_state(
    path: str | os.PathLike[str],
    state: MutableMapping[str, Any],
    *,
    rank: int,
    adapter: StateAdapter,
) -> dict[str, Any]:
    """Fill ``state`` from the checkpoint at ``path`` (collective); return what it did not ask for.

    The return value holds the saved plain values and small objects' states that ``state`` has
    no entry for (saved model and optimizer states not asked for stay on disk).
    """
    _check_names(state, "load")
    choice = dist.broadcast(_resolve(path) if rank == 0 else None, src=0)
    if choice is None or choice.startswith("error:"):
        raise CheckpointError(str(choice)[len("error: ") :])
    where = Path(choice)
    manifest = read_manifest(where)
    small_saved = load_part(where / STATE_FILE).get("objects", {})
    available = saved_names(manifest, small_saved)
    missing = sorted(k for k in state if k not in available)
    if missing:
        raise CheckpointMismatchError(
            f"checkpoint {where} has no entry {missing} (it holds {sorted(available)}); ask "
            "for the names it was saved with"
        )
    stored_elsewhere = sorted(
        k for k, v in state.items() if kind_of(v) == "value" and k not in small_saved
    )
    if stored_elsewhere:
        raise CheckpointMismatchError(
            f"checkpoint {where} holds {stored_elsewhere} as models or optimizers, but state "
            "gives plain values for them; pass the objects to load them into"
        )
    stateful = {k: v for k, v in state.items() if kind_of(v) != "value"}
    restore_objects(where, stateful, manifest, small_saved, adapter)
    for name, value in state.items():
        if kind_of(value) == "value":
            state[name] = small_saved[name]
    if rank == 0:
        log.info("loaded %s from %s", ", ".join(state), where)
    return {k: v for k, v in small_saved.items() if k not in state}
