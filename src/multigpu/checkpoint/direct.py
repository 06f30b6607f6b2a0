"""``ctx.save(path, state)`` and ``ctx.load(path, state)``: one checkpoint at a path of your own.

For scripts that want no ``Checkpointer``: ``state`` is a dict of models, optimizers, loaders,
schedulers (anything with ``state_dict``/``load_state_dict``) and plain values (numbers,
strings, tensors, lists and dicts of them). The checkpoint is the same kind of directory a
``Checkpointer`` writes — sharded through DCP, atomic, with a manifest and checksums — so it
loads on any world size under any strategy, and ``multigpu ckpt`` reads it. RNG states are not
part of it (a ``Checkpointer`` saves them, for exact resume).
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
    verify_checkpoint,
)
from multigpu.checkpoint.legacy import restore_whole
from multigpu.checkpoint.objects import kind_of, load_into
from multigpu.checkpoint.restore import load_part, read_manifest
from multigpu.checkpoint.saving import SaveJob, save
from multigpu.checkpoint.snapshot import SHARDED_KINDS, StateAdapter, restore_sharded
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

    Raises:
        UsageError: ``state`` is not a dict of named entries, or ``path`` exists and is not a
            multigpu checkpoint (it would be replaced).
        CheckpointError: the save failed on some rank (nothing is left at ``path``).
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
    loaders = [o for o in state.values() if kind_of(o) == "loader"]
    step = state.get("step")
    job = SaveJob(
        final=final,
        stale=f"{TMP_PREFIX}{final.name}-*",
        step=step if isinstance(step, int) and not isinstance(step, bool) else 0,
        epoch=int(loaders[0].epoch) if loaders else None,
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

    Objects are loaded in place (models and optimizers resharded to this run's strategy and
    world size); plain values are replaced in ``state``. The return value holds the saved plain
    values and small objects' states that ``state`` has no entry for (saved model and optimizer
    states not asked for stay on disk).

    Raises:
        CheckpointError: no complete checkpoint at ``path``, an entry of ``state`` is not in it,
            or does not fit it.
    """
    _check_names(state, "load")
    choice = dist.broadcast(_resolve(path) if rank == 0 else None, src=0)
    if choice is None or choice.startswith("error:"):
        raise CheckpointError(str(choice)[len("error: ") :])
    where = Path(choice)
    manifest = read_manifest(where)
    saved_objects: dict[str, Any] = manifest.get("objects", {})
    small_saved = load_part(where / STATE_FILE).get("objects", {})
    legacy = int(manifest.get("version", 1)) < 2
    available = set(small_saved) if legacy else set(saved_objects)
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
    small = {k: v for k, v in stateful.items() if legacy or kind_of(v) not in SHARDED_KINDS}
    if legacy:
        restore_whole(where, small, small_saved)
    else:
        restore_sharded(
            where, {k: v for k, v in stateful.items() if k not in small}, saved_objects, adapter
        )
        for name, obj in small.items():
            load_into(name, obj, small_saved[name])
    for name, value in state.items():
        if kind_of(value) == "value":
            state[name] = small_saved[name]
    if rank == 0:
        log.info("loaded %s from %s", ", ".join(state), where)
    return {k: v for k, v in small_saved.items() if k not in state}
