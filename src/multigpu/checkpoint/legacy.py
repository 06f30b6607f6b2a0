"""Resuming format-1 checkpoints (before DCP): whole models and optimizers in ``state.pt``.

They load under any strategy through torch's full-state-dict path: each rank reads the whole
tensors and keeps what it holds (all of them, or its FSDP shards). A format-1 optimizer state is
keyed by parameter *position*; the live optimizer's parameters, in the same order, give the
names torch's loader wants.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from multigpu.checkpoint.objects import load_into
from multigpu.errors import CheckpointError
from multigpu.wrappers import unwrap_module

_FULL = StateDictOptions(full_state_dict=True)


def restore_whole(path: Path, objects: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    """Load the format-1 states ``saved`` (``state.pt``'s objects) into ``objects``."""
    modules = {n: unwrap_module(o) for n, o in objects.items() if isinstance(o, nn.Module)}
    for name, obj in objects.items():
        try:
            if isinstance(obj, nn.Module):
                set_model_state_dict(modules[name], dict(saved[name]), options=_FULL)
            elif isinstance(obj, torch.optim.Optimizer):
                model = _owner(obj, modules.values())
                state = _by_name(obj, model, saved[name])
                set_optimizer_state_dict(model, obj, state, options=_FULL)
            else:
                load_into(name, obj, saved[name])
        except CheckpointError:
            raise
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
            raise CheckpointError(
                f"checkpoint object {name!r} ({type(obj).__name__}) does not fit the saved "
                f"state of {path}: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            ) from e


def _owner(optimizer: torch.optim.Optimizer, models: Iterable[nn.Module]) -> nn.Module:
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for model in models:
        if ids <= {id(p) for p in model.parameters()}:
            return model
    raise CheckpointError(
        "a format-1 optimizer state loads by parameter name, which needs the model it "
        "optimizes tracked too (e.g. model=model)"
    )


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
