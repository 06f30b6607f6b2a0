"""Model and optimizer state of any wrapping, through ``torch.distributed.checkpoint.state_dict``.

``get_model_state_dict`` / ``get_optimizer_state_dict`` already know DDP, FSDP2, ``torch.compile``
and plain modules: keys are the plain model's parameter names (no ``module.``), optimizer state
is keyed by those names too (not by position), and FSDP's tensors stay sharded (DTensors) unless
a full state dict is asked for. So a state saved under one strategy loads under another.

One thing the torch functions do that a checkpoint must not: an optimizer that has not stepped
yet gets its state *created* (a zero-gradient step, Adam's ``step`` becoming 1), which would
change the run that saved it. An optimizer without state is saved as its hyperparameters only.

Loading needs that state first: DCP reads a checkpoint *into* the tensors it is given, so the
optimizer's own state tensors are the targets and no second copy of it is made. multigpu makes
that state itself (``initialise_optimizer_state``) rather than through torch's zero step, which
gives every parameter a zero gradient of its own and runs the optimizer's step hooks.

A tensor the model holds under several names (an embedding tied to the output head) is one
tensor in a checkpoint, under its first name (``named_parameters(remove_duplicate=False)``
order), as torch's optimizer state already keys it; loading puts it back under every name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from multigpu.runtime.wrappers import tied_names, unwrap_module, with_tied
from multigpu.torch_compat import (
    dtensor_from_local_like,
    is_dtensor,
    quiet_sequential_redistribution,
    step_without_hooks,
)

_PARAMS = "params"

_LAZY = None
"""``torch.distributed.checkpoint.state_dict`` is imported by the functions that use it: it pulls
in DCP, DTensor, FSDP and the elastic agent (about 1 s of CPU in every process that imports
``multigpu``), which a run that never saves or loads a state does not need."""


def model_state(model: nn.Module) -> dict[str, Any]:
    """The model's state: plain tensors, or this rank's shards (DTensors) under FSDP; a tied
    tensor once, under its first name."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict  # see _LAZY

    saved = get_model_state_dict(unwrap_module(model))
    for alias in tied_names(model):
        saved.pop(alias, None)
    return saved


def full_model_state(model: nn.Module) -> dict[str, Any]:
    """The whole model's state on the CPU, on rank 0 (collective under FSDP; other ranks get {}).

    Without a process group (one process) it is every tensor, on the CPU.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    with quiet_sequential_redistribution():  # a 2-D mesh gathers along one axis, then the other
        return get_model_state_dict(unwrap_module(model), options=options)


def optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, *, initialise: bool = False
) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name (``{"state": ..., "param_groups": ...}``).

    An optimizer that has not stepped yet gives ``{"state": {}, "param_groups": [...]}`` (names
    in ``params``) without touching it — unless ``initialise``: then its state is created
    (``initialise_optimizer_state``), and the state tensors returned are the optimizer's own,
    for a checkpoint to be loaded into.
    """
    if initialise:
        initialise_optimizer_state(optimizer)
    if not optimizer.state:  # not stepped yet, or stateless (SGD without momentum)
        return {"state": {}, "param_groups": _groups_by_name(model, optimizer)}
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(unwrap_module(model), optimizer)


def initialise_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Make ``optimizer``'s state as its first step makes it (Adam's moments and ``step``),
    leaving the parameters, their gradients and learning rates as they were; nothing when it
    has state already. Only the state's shapes matter: a checkpoint is loaded into it next.

    As torch's own (``get_optimizer_state_dict``): one step with zero gradients at a learning
    rate of 0. Unlike it, the step runs without the optimizer's step hooks (it is not a
    training step: DDP's allocator setting, counted by a hook, came one step early, before
    DDP's bucket rebuild, and kept the old buckets: a run resumed at 67M parameters on 2 CPU
    processes peaked 1.22x the training's), and the zero gradients are views of one buffer as
    large as the largest parameter rather than a gradient-sized allocation of each (an optimizer
    only reads its gradients). Gradients the parameters hold already are set aside meanwhile
    (torch's does nothing then: a resume after a backward would load no state at all).
    """
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group[_PARAMS] if p.requires_grad]
    held = [p.grad for p in params]
    rates = [group.get("lr") for group in optimizer.param_groups]
    try:
        with torch.no_grad():
            for param, zero in zip(params, _zero_gradients(params), strict=True):
                param.grad = zero
            for group, rate in zip(optimizer.param_groups, rates, strict=True):
                if rate is not None:  # a learning rate of 0: the parameters stay as they are
                    group["lr"] = torch.tensor(0.0) if isinstance(rate, torch.Tensor) else 0.0
            step_without_hooks(optimizer)
    finally:
        for group, rate in zip(optimizer.param_groups, rates, strict=True):
            if rate is not None:
                group["lr"] = rate
        for param, grad in zip(params, held, strict=True):
            param.grad = grad


def _zero_gradients(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """A zero gradient for each of ``params``: views of one zero buffer per dtype and device, as
    large as the largest of them (DTensors get this rank's piece, laid out as the parameter)."""
    local = [p.to_local() if is_dtensor(p) else p for p in params]  # type: ignore[attr-defined]
    sizes: dict[tuple[torch.dtype, torch.device], int] = {}
    for t in local:
        key = (t.dtype, t.device)
        sizes[key] = max(sizes.get(key, 0), t.numel())
    buffers = {key: torch.zeros(n, dtype=key[0], device=key[1]) for key, n in sizes.items()}
    zeros = []
    for param, t in zip(params, local, strict=True):
        view = buffers[(t.dtype, t.device)][: t.numel()].view(t.shape)
        zeros.append(dtensor_from_local_like(view, param) if is_dtensor(param) else view)
    return zeros


def _groups_by_name(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    names = {id(p): n for n, p in unwrap_module(model).named_parameters()}
    groups = []
    for group in optimizer.param_groups:
        hyper = {k: v for k, v in group.items() if k != _PARAMS}
        groups.append({**hyper, _PARAMS: [names[id(p)] for p in group[_PARAMS]]})
    return groups


def load_model_state(model: nn.Module, state: Mapping[str, Any]) -> None:
    """Load ``state`` (plain tensors or shards, as ``model_state`` gives) into ``model``; a tied
    tensor saved under its first name only is loaded under every name."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(unwrap_module(model), with_tied(state, tied_names(model)))


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]
) -> None:
    """Load ``state`` (as ``optimizer_state`` gives) into ``optimizer``.

    A saved optimizer without state restores its hyperparameters and leaves it without state.
    """
    if not state.get("state"):
        optimizer.state.clear()
        for group, saved in zip(optimizer.param_groups, state["param_groups"], strict=True):
            group.update({k: v for k, v in saved.items() if k != _PARAMS})
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(unwrap_module(model), optimizer, dict(state))
