"""Keep an optimizer built on the plain model attached after its parameters were replaced.

``ctx.setup(model, optimizer)`` takes an optimizer created on the user's plain model, as a
one-device script creates it. Most wrappings keep the parameter objects, but FSDP's
``fully_shard`` replaces each parameter by a sharded one, and a meta model gets new ones when it
is materialized: an optimizer left pointing at the old objects would step tensors nobody trains.
So each optimizer is re-pointed at the new parameters by their names in the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from multigpu.errors import UsageError


def parameter_names(model: nn.Module) -> dict[int, str]:
    """``{id(parameter): name}`` of ``model``'s parameters (taken before wrapping)."""
    return {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}


def repoint_optimizers(
    model: nn.Module, optimizers: Sequence[torch.optim.Optimizer], names: dict[int, str]
) -> None:
    """Point every param group of ``optimizers`` at ``model``'s current parameters, by name.

    ``names`` maps the ids of the parameters the optimizers were built on to their names (from
    ``parameter_names`` before wrapping); ``model`` is the plain (unwrapped) model after it.
    """
    current = dict(model.named_parameters(remove_duplicate=False))
    live = {id(p) for p in current.values()}
    for index, optimizer in enumerate(optimizers):
        replaced = False
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                if id(param) in live:
                    params.append(param)
                    continue
                name = names.get(id(param))
                if name is None:  # not the model's (e.g. a learned loss weight): left alone
                    params.append(param)
                    continue
                if name not in current:
                    raise UsageError(
                        f"optimizer {index} ({type(optimizer).__name__}) steps the model's "
                        f"parameter {name!r}, which the strategy's model no longer has; build "
                        "the optimizer on the model given to ctx.setup"
                    )
                params.append(current[name])
                replaced = True
            group["params"] = params
        if replaced and optimizer.state:
            raise UsageError(
                f"optimizer {index} ({type(optimizer).__name__}) already has state, but its "
                "parameters were replaced by the strategy (sharded or materialized); load "
                "optimizer state after ctx.setup (ctx.load, or Checkpointer.resume), not before"
            )
