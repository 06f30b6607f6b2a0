"""``unwrap_module``: the plain model inside DataParallel, DDP, torch.compile and autocast wrappers;
``tied_names`` / ``with_tied``: the names under which it holds one tensor several times.

Kept apart from the strategies so that code below them (checkpoints, portable loading, the hub
format) can unwrap a model and know its ties too.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from typing import Any

from torch import nn

from multigpu.precision import AutocastModule

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel, AutocastModule)


def unwrap_module(module: nn.Module) -> nn.Module:
    """Strip DataParallel/DDP (``module.``), torch.compile (``_orig_mod``) and autocast wrappers."""
    while True:
        if isinstance(module, _WRAPPERS):
            module = module.module
        elif hasattr(module, "_orig_mod") and isinstance(module._orig_mod, nn.Module):
            module = module._orig_mod
        else:
            return module


def tied_names(model: nn.Module) -> dict[str, str]:
    """``{later name: first name}`` of the tensors ``model`` holds under several names.

    Example:
        >>> net = nn.Sequential(nn.Embedding(4, 2), nn.Linear(2, 4, bias=False))
        >>> net[1].weight = net[0].weight
        >>> tied_names(net)
        {'1.weight': '0.weight'}
    """
    plain = unwrap_module(model)
    named = chain(
        plain.named_parameters(remove_duplicate=False), plain.named_buffers(remove_duplicate=False)
    )
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, tensor in named:
        head = first.setdefault(id(tensor), name)
        if head != name:
            tied[name] = head
    return tied


def with_tied(state: Mapping[str, Any], tied: Mapping[str, str]) -> dict[str, Any]:
    """``state`` with each tied name holding its first name's tensor (one tensor, several
    names, as the model's own ``state_dict()``), for ``load_state_dict(strict=True)``.

    Example:
        >>> w = [1.0, 2.0]  # a tensor, in practice
        >>> whole = with_tied({"emb.weight": w}, {"head.weight": "emb.weight"})
        >>> list(whole), whole["head.weight"] is w
        (['emb.weight', 'head.weight'], True)
    """
    whole = dict(state)
    for alias, first in tied.items():
        if alias not in whole and first in whole:
            whole[alias] = whole[first]
    return whole
