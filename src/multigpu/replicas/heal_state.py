"""What a replica group that heals receives from a live one: everything multigpu holds or can find.

A group restarted by its agent runs the script again from the top: its loop's state is new. At its
first step it heals from a live group over torchft's process group (no checkpoint read), and for
the loop to go on as the live group's does, every piece of state the loop depends on travels:

- the model(s) and optimizers given to ``ctx.setup``;
- the LR schedulers of those optimizers — none needs to be given: they are found by what refers to
  an optimizer (``gc.get_referrers``), the children of a ``SequentialLR``/``ChainedScheduler``
  through their parent, in an order both groups compute alike;
- the GradScaler of ``precision="16-mixed"``;
- every ``ctx.loader``'s position and epoch, and each ``Checkpointer``'s step count and the
  loop's own objects it tracks (``Checkpointer.heal_state``), in the order the script made them
  (one the healing group has not made yet is given its state when it is);
- this rank's RNG streams (Python, NumPy, torch, CUDA): every group's are the same at a step
  (``multigpu.init`` seeds every rank alike, and each group draws for one share a step).

The same object also keeps a step's snapshot (the schedulers, the optimizers' learning rates and
other settings a scheduler changes, and the RNG streams at its start):
a survivor that runs an absent group's share first runs it with the RNG streams of the step's
start, and when the step's last share begins the schedulers go back to the snapshot, so that a
loop that steps its scheduler on every batch steps it once a step, as an uninterrupted run does;
a step the groups did not commit starts again from it.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from multigpu.checkpoint.native.rng import capture_rng, restore_rng
from multigpu.errors import ReplicaError

# ReduceLROnPlateau is an LRScheduler from torch 2.2 on; named too, for what that changes.
SCHEDULER_TYPES: tuple[type, ...] = (LRScheduler, ReduceLROnPlateau)


def _referrers_of_type(obj: Any, kinds: tuple[type, ...]) -> list[Any]:
    """The objects of ``kinds`` that hold a reference to ``obj`` (as an attribute)."""
    found: list[Any] = []
    for holder in gc.get_referrers(obj):
        if isinstance(holder, kinds):
            found.append(holder)
        elif isinstance(holder, dict):  # an instance's __dict__ once materialised
            found += [
                owner
                for owner in gc.get_referrers(holder)
                if isinstance(owner, kinds) and getattr(owner, "__dict__", None) is holder
            ]
    unique: dict[int, Any] = {}
    for item in found:
        unique.setdefault(id(item), item)
    return list(unique.values())


def find_schedulers(optimizers: Sequence[torch.optim.Optimizer]) -> list[Any]:
    """The LR schedulers of ``optimizers``, outermost only, in an order that does not depend on
    memory addresses: by optimizer, then type name, then base learning rates."""
    found: list[tuple[int, Any]] = []
    for index, optimizer in enumerate(optimizers):
        found += [(index, s) for s in _referrers_of_type(optimizer, SCHEDULER_TYPES)]
    children = {id(child) for _, s in found for child in getattr(s, "_schedulers", ()) or ()}
    outer = [(i, s) for i, s in found if id(s) not in children]
    outer.sort(key=lambda pair: (pair[0], type(pair[1]).__qualname__, _base_lrs(pair[1])))
    return [s for _, s in outer]


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's settings (``lr``, ``momentum``, ...: what a scheduler changes)."""
    return [
        copy.deepcopy({k: v for k, v in group.items() if k != "params"})
        for group in optimizer.param_groups
    ]


def _base_lrs(scheduler: Any) -> tuple[float, ...]:
    lrs = getattr(scheduler, "base_lrs", None) or getattr(scheduler, "min_lrs", None) or ()
    return tuple(float(x) for x in lrs)


class HealState:
    """The state of one worker that a healing group receives, and a step's snapshot of it."""

    def __init__(self) -> None:
        self.models: list[nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.loaders: list[Any] = []
        self.checkpointers: list[Any] = []
        self.scaler: Any = None
        self._pending: dict[str, list[Any]] = {"loaders": [], "checkpointers": []}
        self._schedulers: list[Any] | None = None  # found at the first step (and at each heal)
        # (schedulers' states, optimizers' group settings, RNG streams) at the step's start
        self._snapshot: tuple[list[Any], list[list[dict[str, Any]]], dict[str, Any]] | None = None

    # ---- what there is --------------------------------------------------------------------------
    def add_setup(self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """``ctx.setup`` made ``model`` (its plain module) with ``optimizers``."""
        self.models.append(model)
        self.optimizers.extend(optimizers)

    def add_loader(self, loader: Any) -> None:
        """``ctx.loader`` made ``loader``; a heal that came before it gave its state already."""
        self.loaders.append(loader)
        if self._pending["loaders"]:
            loader.load_state_dict(self._pending["loaders"].pop(0))

    def add_checkpointer(self, checkpointer: Any) -> None:
        """``ctx.checkpointer`` made ``checkpointer`` (its count heals too)."""
        self.checkpointers.append(checkpointer)
        if self._pending["checkpointers"]:
            checkpointer.load_heal_state(self._pending["checkpointers"].pop(0))

    def schedulers(self, *, again: bool = False) -> list[Any]:
        """The LR schedulers of the optimizers (looked for once, or ``again``)."""
        if self._schedulers is None or again:
            self._schedulers = find_schedulers(self.optimizers)
        return self._schedulers

    # ---- a heal ----------------------------------------------------------------------------------
    def save(self) -> dict[str, Any]:
        """Everything a healing group loads (``load``), by kind, in the script's order."""
        return {
            "models": [m.state_dict() for m in self.models],
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers(again=True)],
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "loaders": [loader.state_dict() for loader in self.loaders],
            "checkpointers": [c.heal_state() for c in self.checkpointers],
            "rng": capture_rng(),
        }

    def load(self, state: dict[str, Any], source: int) -> list[str]:
        """Put a live group's ``save()`` in place; the names of what was healed, for the line."""
        schedulers = self.schedulers(again=True)
        for kind, here in (
            ("models", self.models),
            ("optimizers", self.optimizers),
            ("schedulers", schedulers),
        ):
            if len(state[kind]) != len(here):
                raise ReplicaError(
                    f"replica group {source}'s script holds {len(state[kind])} {kind} where this "
                    f"group's holds {len(here)}: the groups run one script and heal from each "
                    "other; make the same objects in every group (before the training loop)"
                )
        for model, part in zip(self.models, state["models"], strict=True):
            model.load_state_dict(part)
        for optimizer, part in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(part)
        for scheduler, part in zip(schedulers, state["schedulers"], strict=True):
            scheduler.load_state_dict(part)
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        made = len(self.loaders)
        for loader, part in zip(self.loaders, state["loaders"][:made], strict=True):
            loader.load_state_dict(part)
        self._pending["loaders"] = list(state["loaders"][made:])
        counts = state["checkpointers"]
        for checkpointer, part in zip(self.checkpointers, counts, strict=False):
            checkpointer.load_heal_state(part)
        self._pending["checkpointers"] = list(counts[len(self.checkpointers) :])
        restore_rng(state["rng"])
        self._snapshot = None
        names = ["weights", "optimizer state"]
        if schedulers:
            names.append(f"{len(schedulers)} LR scheduler(s)")
        if self.scaler is not None:
            names.append("GradScaler")
        names.append("data position")
        if self.checkpointers:
            names.append("Checkpointer state")
        return [*names, "RNG"]

    # ---- a step's snapshot -----------------------------------------------------------------------
    def begin_step(self, *, again: bool) -> None:
        """A step begins: remember the schedulers and RNG streams (``again``: the same step runs
        once more after a failure: its snapshot is put back instead)."""
        if again and self._snapshot is not None:
            self.restore(schedulers=True)
            return
        self._snapshot = (
            [copy.deepcopy(s.state_dict()) for s in self.schedulers()],
            [_hyperparameters(o) for o in self.optimizers],
            capture_rng(),
        )

    def restore(self, *, schedulers: bool) -> None:
        """Back to the step's start: the RNG streams, and the schedulers when ``schedulers``."""
        if self._snapshot is None:
            return
        states, hyperparameters, rng = self._snapshot
        restore_rng(rng)
        if schedulers:
            for scheduler, part in zip(self.schedulers(), states, strict=False):
                scheduler.load_state_dict(copy.deepcopy(part))
            # A scheduler's state is its count; what it set is the optimizer's learning rate
            # (and momentum, ...), which its load_state_dict leaves as it is.
            for optimizer, groups in zip(self.optimizers, hyperparameters, strict=True):
                for group, values in zip(optimizer.param_groups, groups, strict=True):
                    group.update(copy.deepcopy(values))
