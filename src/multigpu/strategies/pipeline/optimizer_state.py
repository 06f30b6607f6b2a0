"""A pipeline's optimizer state in the form every strategy saves: by parameter name, any layout.

Each process's optimizer steps its stages' parameters only, so its param groups name only those.
Saved that way, groups of different processes would meet under one checkpoint key with different
contents. Here every process saves the *whole model's* param groups (the names the optimizer
stepped before the model was split, identical on every process, as a one-process run saves them)
and its own parameters' state under their names; loading keeps what this process's parameters
need. So a pipeline checkpoint resumes under another schedule, stage count or strategy, and a
checkpoint of any strategy resumes under a pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from multigpu.errors import CheckpointMismatchError
from multigpu.runtime.wrappers import unwrap_module
from multigpu.strategies import state

_PARAMS = "params"


def group_names(
    optimizer: torch.optim.Optimizer, first_names: Mapping[int, str]
) -> list[list[str]]:
    """The first names of the parameters of each param group of ``optimizer`` (built on the
    unsplit model; ``first_names``: ``{id(parameter): first name}`` of that model)."""
    return [
        [first_names[id(p)] for p in group[_PARAMS] if id(p) in first_names]
        for group in optimizer.param_groups
    ]


def gathered_group_names(
    model: nn.Module, optimizer: torch.optim.Optimizer, order: Sequence[str]
) -> list[list[str]]:
    """``group_names`` of an optimizer built after the split, from every process's part
    (collective), each group in the unsplit model's ``order`` (its ``state_dict`` keys)."""
    names = {id(p): n for n, p in unwrap_module(model).named_parameters()}
    mine = [[names[id(p)] for p in group[_PARAMS]] for group in optimizer.param_groups]
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    place = {name: index for index, name in enumerate(order)}
    return [
        sorted({n for part in parts for n in part[index]}, key=place.__getitem__)
        for index in range(len(mine))
    ]


def optimizer_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    groups: Sequence[Sequence[str]],
    *,
    initialise: bool = False,
) -> dict[str, Any]:
    """This process's state by name; the param groups of the whole model (``groups``)."""
    saved = state.optimizer_state(model, optimizer, initialise=initialise)
    whole = [
        {**{k: v for k, v in group.items() if k != _PARAMS}, _PARAMS: list(names)}
        for group, names in zip(saved["param_groups"], groups, strict=True)
    ]
    return {"state": saved["state"], "param_groups": whole}


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]
) -> None:
    """Load a state of any strategy (as ``optimizer_state`` gives) into this process's part of
    ``optimizer``: its parameters' state by name, each group's hyperparameters."""
    groups = saved["param_groups"]
    if not isinstance(groups, Sequence) or len(groups) != len(optimizer.param_groups):
        found = len(groups) if isinstance(groups, Sequence) else f"a {type(groups).__name__}"
        raise CheckpointMismatchError(
            f"the optimizer has {len(optimizer.param_groups)} param group(s) and the checkpoint "
            f"{found}; build the optimizer with the param groups of the run that saved it"
        )
    names = {id(p): n for n, p in unwrap_module(model).named_parameters()}
    by_name = saved.get("state") or {}
    packed_state: dict[int, Any] = {}
    packed_groups = []
    index = 0
    pairs = zip(optimizer.param_groups, groups, strict=True)
    for number, (group, saved_group) in enumerate(pairs):
        ids = []
        for param in group[_PARAMS]:
            name = names[id(param)]
            if name not in saved_group[_PARAMS]:
                raise CheckpointMismatchError(
                    f"parameter {name!r} is in param group {number} of the optimizer but not in "
                    "that group of the checkpoint; build the param groups as the run that saved "
                    "it did"
                )
            if name in by_name:
                packed_state[index] = by_name[name]
            elif by_name and param.requires_grad:
                raise CheckpointMismatchError(
                    f"the checkpoint's optimizer state has no entry for parameter {name!r}; "
                    "resume with the optimizer of the run that saved it"
                )
            ids.append(index)
            index += 1
        hyper = {k: v for k, v in saved_group.items() if k != _PARAMS}
        packed_groups.append({**hyper, _PARAMS: ids})
    if not by_name:  # saved before its first step: the hyperparameters, and no state
        optimizer.state.clear()
        for group, packed in zip(optimizer.param_groups, packed_groups, strict=True):
            group.update({k: v for k, v in packed.items() if k != _PARAMS})
        return
    optimizer.load_state_dict({"state": packed_state, "param_groups": packed_groups})
