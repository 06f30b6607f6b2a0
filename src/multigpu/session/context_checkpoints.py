"""What a Context offers for checkpoints: a ``Checkpointer``, or ``save``/``load`` at a path.

The strategy is the state adapter: it produces and loads the model and optimizer state as its
wrapping holds it. ``ctx.save``'s checkpoint is the same kind of directory a ``Checkpointer``
writes (sharded through DCP, atomic, with a manifest and checksums), without RNG states.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from multigpu.checkpoint.hub import SUFFIX, is_hub
from multigpu.checkpoint.layout import (
    MANIFEST_FILE,
    METADATA_FILE,
    STATE_FILE,
    TMP_PREFIX,
    find_latest,
    read_manifest,
    usable,
)
from multigpu.checkpoint.loading import is_dcp_directory, unfinished_dcp
from multigpu.checkpoint.objects import epoch_of, kind_of
from multigpu.errors import (
    CheckpointMismatchError,
    CheckpointUnreadableError,
    UsageError,
)
from multigpu.instruments.hooks import Hook
from multigpu.replicas.settings import group_directory
from multigpu.runtime.precision import Precision
from multigpu.strategies import Strategy

if TYPE_CHECKING:
    from multigpu.checkpoint.manager import Checkpointer

log = logging.getLogger(__name__)

# The modules that save and load (DCP, and through it DTensor, FSDP and torch's elastic agent:
# about 1 s of CPU in every process) are imported by the methods that need them, so that a run
# that never checkpoints starts without them.


class Checkpointing:
    """Checkpoint makers of a Context (mixed into ``Context``)."""

    strategy: Strategy
    timeout: timedelta
    precision: Precision
    _checkpointers: list[Checkpointer]
    _hooks: tuple[Hook, ...]
    if TYPE_CHECKING:  # defined by Context

        @property
        def rank(self) -> int: ...

        @property
        def world_size(self) -> int: ...

        def _comm_device(self) -> torch.device: ...

    def checkpointer(
        self,
        directory: str | Path,
        *,
        every_steps: int | None = None,
        keep: int | None = None,
        async_save: bool = False,
        save_on_sigterm: bool = False,
        lock_timeout: float = 0.0,
        **objects: Any,
    ) -> Checkpointer:
        """A ``Checkpointer`` saving ``objects`` (and the GradScaler of ``16-mixed``) under
        ``directory``: every ``every_steps`` calls of ``step()``, keeping the ``keep`` newest
        (None: all); ``async_save`` writes in the background; ``save_on_sigterm`` saves and exits
        143 when any rank gets SIGTERM. One run at a time holds ``directory``: another live
        run's raises ``CheckpointLockedError`` (naming its pid and host) unless it lets go
        within ``lock_timeout`` seconds; a dead run's hold ends with it. See
        ``multigpu.checkpoint.manager``.
        """
        from multigpu.checkpoint.manager import Checkpointer

        ckpt = Checkpointer(
            group_directory(directory, os.environ),  # under --replicas: DIR/group-G
            rank=self.rank,
            world_size=self.world_size,
            adapter=self.strategy,
            comm_device=self._comm_device(),
            timeout=self.timeout.total_seconds(),
            every_steps=every_steps,
            keep=keep,
            async_save=async_save,
            save_on_sigterm=save_on_sigterm,
            describe=self.strategy.describe,
            lock_timeout=lock_timeout,
            before_save=self._before_save,
            counts_step=lambda: all(hook.counts_step(self) for hook in self._hooks),
        )
        ckpt.track(**objects)
        if self.precision.scaler is not None and "grad_scaler" not in objects:
            ckpt.track(grad_scaler=self.precision.scaler)
        self._checkpointers.append(ckpt)
        for hook in self._hooks:
            hook.on_checkpointer(self, ckpt)
        return ckpt

    def save(self, path: str | Path, state: Mapping[str, Any]) -> Path:
        """Save ``state`` — models, optimizers, loaders, schedulers, plain values — at ``path``.

        Collective: every rank calls it. The checkpoint is a directory written atomically (a
        temp dir renamed once complete, with a manifest and checksums); models and optimizers
        are sharded through DCP, so it loads on any world size under any strategy. RNG states
        are not saved (use a ``Checkpointer`` for exact resume). An existing ``path`` is
        replaced only when it is a multigpu checkpoint.
        """
        from multigpu.checkpoint.saving import SaveJob, decided_by_rank0, save

        _check_names(state, "save")
        final = Path(path)

        def check() -> None:
            if final.exists() and not (final / MANIFEST_FILE).is_file():
                raise UsageError(
                    f"ctx.save: {final} exists and is not a multigpu checkpoint; expected a new "
                    "path (or an earlier checkpoint to replace): choose another path"
                )

        decided_by_rank0(self.rank, check)
        self._before_save()
        step = state.get("step")
        job = SaveJob(
            final=final,
            stale=f"{TMP_PREFIX}{final.name}-*",
            step=step if isinstance(step, int) and not isinstance(step, bool) else 0,
            epoch=epoch_of(state),
            rank=self.rank,
            world_size=self.world_size,
            objects=state,
            rng=False,
            adapter=self.strategy,
            strategy=self.strategy.describe(),
        )
        return save(job)

    def _before_save(self) -> None:
        """A checkpoint is about to be saved: the hooks hear of it (the trackers flush)."""
        for hook in self._hooks:
            hook.on_save(self)

    def load(self, path: str | Path, state: MutableMapping[str, Any]) -> dict[str, Any]:
        """Fill ``state`` in place from a checkpoint; return the saved entries it did not ask for.

        ``path``: a directory written by ``ctx.save``, a ``Checkpointer``'s ``step-*``
        directory, or a ``Checkpointer``'s directory (its newest complete checkpoint). Models
        and optimizers are loaded into the objects (resharded to this run), plain values are
        replaced in ``state``. Collective: every rank calls it. The saved plain values and small
        objects' states that ``state`` has no entry for are returned (saved model and optimizer
        states not asked for stay on disk).

        Also read: a plain DCP checkpoint (a directory written by
        ``torch.distributed.checkpoint.save``, or its ``.metadata``; torchtitan's step
        directories), whose top-level objects are the names to ask for — its top-level tensors
        are ``model`` (see ``multigpu.checkpoint.dcp_load``); and weights in the hub format (a
        ``.safetensors`` file, or a directory with ``model.safetensors`` or its index) with
        ``{"model": model}``: after ``ctx.setup``, each rank reads only the part of each tensor
        it holds (its rows under FSDP; see ``multigpu.checkpoint.hub_load``).
        """
        from multigpu.checkpoint.dcp_load import load_dcp
        from multigpu.checkpoint.hub_load import load_hub
        from multigpu.checkpoint.restore import load_part, restore_objects, saved_names
        from multigpu.checkpoint.saving import decided_by_rank0

        _check_names(state, "load")
        kind, where = decided_by_rank0(self.rank, lambda: _resolve(path))
        if kind == "hub":
            return load_hub(where, state, self.strategy, rank=self.rank)
        if kind == "dcp":
            return load_dcp(where, state, self.strategy)
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
        restore_objects(where, stateful, manifest, small_saved, self.strategy)
        for name, value in state.items():
            if kind_of(value) == "value":
                state[name] = small_saved[name]
        if self.rank == 0:
            log.info("loaded %s from %s", ", ".join(state), where)
        return {k: v for k, v in small_saved.items() if k not in state}


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


def _resolve(path: str | Path) -> tuple[str, Path]:
    """Rank 0: what ``path`` names — ("multigpu", a complete checkpoint), ("dcp", a plain DCP
    checkpoint directory) or ("hub", safetensors weights) — else a CheckpointError."""
    p = Path(path)
    if p.is_file() and p.name == METADATA_FILE:  # DCP's index: its checkpoint directory
        p = p.parent
    if p.is_file() and p.name.endswith(SUFFIX):
        return "hub", p
    if not p.is_dir():
        raise CheckpointUnreadableError(
            f"{p} is not a checkpoint directory; expected a path given to ctx.save, a "
            "Checkpointer's directory, a DCP checkpoint directory or safetensors weights"
        )
    if (p / MANIFEST_FILE).is_file():
        return "multigpu", usable(p)
    if is_dcp_directory(p):
        return "dcp", p
    if is_hub(p):
        return "hub", p
    unfinished = unfinished_dcp(p)
    if unfinished is not None:
        raise unfinished
    latest = find_latest(p)
    if latest is None:
        raise CheckpointUnreadableError(
            f"{p} holds no complete checkpoint; see 'multigpu ckpt inspect {p}'"
        )
    return "multigpu", latest.path
