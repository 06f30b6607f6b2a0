"""``unwrap_module``: the plain model inside DataParallel, DDP, torch.compile and autocast wrappers
and a split model (``SplitModel``: a pipeline's stages); ``tied_names`` / ``with_tied``: the names
under which it holds one tensor several times.

Kept apart from the strategies so that code below them (checkpoints, portable loading, the hub
format) can unwrap a model and know its ties too.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from typing import Any

from torch import nn

from multigpu.runtime.precision import AutocastModule

_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel, AutocastModule)


class SplitModel(nn.Module):
    """A model this process holds a part of (a pipeline's stages), with ``plain``: one module
    holding this process's tensors under the whole model's names, which optimizers and
    checkpoints see. ``unwrap_module`` returns ``plain``; the state dict is ``plain``'s.

    Defined here, below the strategies, so that ``unwrap_module`` knows it by its type.
    """

    def __init__(self) -> None:
        super().__init__()
        self.plain: nn.Module = nn.Module()
        """This process's tensors under the whole model's names (set by the subclass)."""

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """``plain``'s state dict: the whole model's names, no prefix of this wrapper's."""
        return self.plain.state_dict(*args, **kwargs)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """Load into ``plain`` (a state dict of the whole model's names)."""
        return self.plain.load_state_dict(state_dict, strict=strict, assign=assign)


def unwrap_module(module: nn.Module) -> nn.Module:
    """Strip DataParallel/DDP (``module.``), torch.compile (``_orig_mod``) and autocast wrappers,
    and take a split model's ``plain`` view."""
    while True:
        if isinstance(module, _WRAPPERS):
            module = module.module
        elif isinstance(module, SplitModel):
            module = module.plain
        elif hasattr(module, "_orig_mod") and isinstance(module._orig_mod, nn.Module):
            module = module._orig_mod  # torch.compile's OptimizedModule
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
