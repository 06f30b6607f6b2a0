"""Where a run is, for a ``Checkpointer.save()``: whether anything moved since the last save.

``save()`` writes the state as it is now, whether ``step()`` counted the steps or not: a loop
that saves once per epoch and never calls ``step()`` (the PyTorch DDP tutorial's shape) gets
``step-00000000``, ``step-00000000.1``, ``step-00000000.2``... and a resume continues after the
last. Only a save that would write the very state already saved is left out (the loop's own
``save()`` right after ``step()`` saved that step, or right after a resume), and only when
something *says* nothing moved: the step count, every tracked loader's place (its epoch and
global cursor: no batch handed out since) and every tracked optimizer's steps (counted by a
step post-hook, torch's public ``register_step_post_hook``) are all as they were. With neither
a loader nor an optimizer tracked nothing can say so, and every ``save()`` writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multigpu.checkpoint.native.objects import kind_of


@dataclass(frozen=True)
class Mark:
    """The run's place: equal marks mean the same state."""

    steps: int
    """The Checkpointer's step count."""
    loaders: tuple[tuple[Any, Any], ...]
    """Each tracked loader's ``(epoch, cursor)``."""
    optimizer_steps: tuple[int, ...]
    """Each tracked optimizer's steps since the Checkpointer began to track it."""


@dataclass(frozen=True)
class LastSave:
    """The checkpoint a Checkpointer saved last, or resumed from."""

    path: Path
    step: int
    """Its step count."""
    index: int
    """``K`` of its ``step-XXXXXXXX.K`` name (0: the step's first save)."""
    mark: Mark | None
    """Where the run was then (None: nothing could tell)."""

    def unmoved(self, now: Mark | None) -> bool:
        """Whether the run is where it was at this save (``now``: ``Progress.mark``), so that
        another save would write the same state; False when nothing can tell."""
        return self.mark is not None and now is not None and self.mark == now


class Progress:
    """Counts the steps of the tracked optimizers; marks where the run is."""

    def __init__(self) -> None:
        self._counts: dict[int, list[int]] = {}  # id(optimizer): [steps]
        self._handles: list[Any] = []

    def watch(self, objects: Mapping[str, Any]) -> None:
        """Count the steps of the optimizers among ``objects`` from now on."""
        for obj in objects.values():
            if isinstance(obj, torch.optim.Optimizer) and id(obj) not in self._counts:
                count = self._counts[id(obj)] = [0]
                self._handles.append(obj.register_step_post_hook(_counter(count)))

    def mark(self, steps: int, objects: Mapping[str, Any]) -> Mark | None:
        """Where the run is now (None: no loader nor optimizer tracked, nothing can tell)."""
        loaders = tuple(_place(o) for o in objects.values() if kind_of(o) == "loader")
        if not loaders and not self._counts:
            return None
        return Mark(steps, loaders, tuple(c[0] for c in self._counts.values()))

    def close(self) -> None:
        """Stop counting (the hooks are removed from the optimizers)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _counter(count: list[int]) -> Any:
    def counted(*_: Any) -> None:
        count[0] += 1

    return counted


def _place(loader: Any) -> tuple[Any, Any]:
    state = loader.state_dict()  # the sampler's: small, no tensors
    return (state.get("epoch"), state.get("cursor"))
