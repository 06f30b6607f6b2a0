"""What a Context offers for checkpoints: a ``Checkpointer``, or ``save``/``load`` at a path.

The strategy is the state adapter: it produces and loads the model and optimizer state as its
wrapping holds it.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from multigpu.checkpoint.direct import load_state, save_state
from multigpu.checkpoint.manager import Checkpointer
from multigpu.precision import Precision
from multigpu.strategies import Strategy


class Checkpointing:
    """Checkpoint makers of a Context (mixed into ``Context``)."""

    strategy: Strategy
    timeout: timedelta
    precision: Precision
    _checkpointers: list[Checkpointer]
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
        ckpt = Checkpointer(
            directory,
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
        )
        ckpt.track(**objects)
        if self.precision.scaler is not None and "grad_scaler" not in objects:
            ckpt.track(grad_scaler=self.precision.scaler)
        self._checkpointers.append(ckpt)
        return ckpt

    def save(self, path: str | Path, state: Mapping[str, Any]) -> Path:
        """Save ``state`` — models, optimizers, loaders, schedulers, plain values — at ``path``.

        Collective: every rank calls it. The checkpoint is a directory written atomically (a
        temp dir renamed once complete, with a manifest and checksums); models and optimizers
        are sharded through DCP, so it loads on any world size under any strategy. RNG states
        are not saved (use a ``Checkpointer`` for exact resume).
        """
        return save_state(
            path,
            state,
            rank=self.rank,
            world_size=self.world_size,
            adapter=self.strategy,
            timeout=self.timeout.total_seconds(),
            strategy=self.strategy.describe(),
        )

    def load(self, path: str | Path, state: MutableMapping[str, Any]) -> dict[str, Any]:
        """Fill ``state`` in place from a checkpoint; return the saved entries it did not ask for.

        ``path``: a directory written by ``ctx.save``, a ``Checkpointer``'s ``step-*``
        directory, or a ``Checkpointer``'s directory (its newest complete checkpoint). Models
        and optimizers are loaded into the objects (resharded to this run), plain values are
        replaced in ``state``. Collective: every rank calls it.
        """
        return load_state(path, state, rank=self.rank, adapter=self.strategy)
