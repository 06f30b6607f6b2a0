"""Which submodules FSDP shards as units of their own (each all-gathered on its own, in turn).

A rank's peak memory is its shard of everything plus the largest unit or two whole. The root is
always a unit: it holds every parameter no other unit took. By default the units are the direct
children holding at least ``min_block_params`` parameters, looking through ``ModuleList``,
``ModuleDict`` and ``Sequential`` (a transformer's ``blocks[i]``); with ``blocks=(Block,)``, the
outermost modules of those classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from torch import nn

DEFAULT_MIN_BLOCK_PARAMS = 100_000
"""Children with fewer parameters stay in their parent's unit: gathering tiny units costs more
in collectives than it saves in memory."""

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def _outermost(
    module: nn.Module, wanted: Callable[[nn.Module], bool], prefix: str = ""
) -> Iterator[tuple[str, nn.Module]]:
    """The ``wanted`` submodules of ``module`` not inside another wanted one, in order."""
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if wanted(child):
            yield path, child
        else:
            yield from _outermost(child, wanted, f"{path}.")


def count_params(module: nn.Module) -> int:
    """The number of parameters of ``module`` (shared ones once)."""
    return sum(p.numel() for p in module.parameters())


def shard_units(
    model: nn.Module,
    blocks: Sequence[type[nn.Module]] | None = None,
    min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS,
) -> list[tuple[str, nn.Module]]:
    """The (name, module) units FSDP shards separately, in order, the root last (name ``""``).

    Example:
        >>> net = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        >>> [name for name, _ in shard_units(net)]
        ['0', '']
        >>> [name for name, _ in shard_units(net, blocks=[nn.Linear])]
        ['0', '2', '']
    """
    if blocks:
        found = list(_outermost(model, lambda m: isinstance(m, tuple(blocks))))
    else:  # the children, looked through containers
        found = [
            (name, child)
            for name, child in _outermost(model, lambda m: not isinstance(m, _CONTAINERS))
            if count_params(child) >= min_block_params
        ]
    return [*found, ("", model)]


def unit_sizes(
    model: nn.Module,
    blocks: Sequence[type[nn.Module]] | None = None,
    min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS,
) -> list[tuple[str, int]]:
    """(name, parameters) of each unit: what one all-gather brings whole (the root: the rest).

    Example:
        >>> net = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        >>> unit_sizes(net)
        [('0', 262656), ('', 5130)]
    """
    units = shard_units(model, blocks, min_block_params)
    taken: set[int] = set()
    sizes = []
    for name, unit in units:
        own = [p for p in unit.parameters() if id(p) not in taken]
        taken.update(id(p) for p in own)
        sizes.append((name, sum(p.numel() for p in own)))
    return sizes
