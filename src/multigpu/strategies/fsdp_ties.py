"""Tied weights and FSDP units: the modules that share a parameter are sharded together.

FSDP2 manages each parameter in exactly one unit: GPT-2's ``lm_head.weight`` *is*
``transformer.wte.weight``, and sharding the two modules in different units fails at the first
forward (``Parameter ... is shared with a parameter already managed by another FSDP group``), or
on older torch silently unties them. Shared parameters are found by identity
(``named_parameters(remove_duplicate=False)``: whatever tied them) and, for each group of
modules holding them (the *holders*):

- all holders outside every unit (embedding and head both with the root: Hugging Face's tied
  models under their default units): nothing to do;
- all holders inside units, and not all in one: the holders become one unit of their own,
  ``fully_shard([a, b])`` (torch >= 2.5), sharded before the units around them, which then
  leave those parameters to it (a unit that is itself a holder becomes part of it);
- a holder outside every unit, or torch 2.4 (no module lists): the units holding the others
  are not units; their parameters stay with the root, which holds the rest of the tie.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

from torch import nn

from multigpu.torch_compat import fully_shard_takes_module_lists


class Unit(NamedTuple):
    """One ``fully_shard`` call: the modules whose parameters are gathered together."""

    name: str
    """The module's path; ``a+b`` for modules sharing parameters; ``""`` for the root."""
    modules: tuple[nn.Module, ...]
    """The module, or the modules sharing parameters (given to ``fully_shard`` as a list)."""
    tied: bool = False
    """True for modules grouped because they share parameters (not a block)."""


def _cover(model: nn.Module, units: dict[int, int]) -> dict[int, set[int | None]]:
    """For each module (by id), the units it lies in along any path (None: outside every one)."""
    cover: dict[int, set[int | None]] = {}
    visited: set[tuple[int, int | None]] = set()

    def walk(module: nn.Module, inside: int | None) -> None:
        if inside is None and id(module) in units:
            inside = units[id(module)]
        if (id(module), inside) in visited:  # shared modules: each subtree once per unit
            return
        visited.add((id(module), inside))
        cover.setdefault(id(module), set()).add(inside)
        for child in module.children():
            walk(child, inside)

    for child in model.children():
        walk(child, None)
    cover.setdefault(id(model), set()).add(None)
    return cover


def _holders(model: nn.Module) -> list[tuple[int, list[nn.Module]]]:
    """(parameter id, the modules holding it directly) for every parameter, in module order."""
    held: dict[int, list[nn.Module]] = {}
    for module in model.modules():  # each module once: a shared module holds its own once
        for param in module.parameters(recurse=False):
            held.setdefault(id(param), []).append(module)
    return list(held.items())


class _Find:
    """Union-find over ids: the holders one tie joins."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def root(self, key: int) -> int:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def join(self, a: int, b: int) -> None:
        self.parent[self.root(a)] = self.root(b)


def resolve_ties(
    model: nn.Module, blocks: Sequence[tuple[str, nn.Module]], *, groups: bool | None = None
) -> Iterator[Unit]:
    """The units for ``blocks`` (outermost, disjoint paths) with shared parameters kept in one
    unit (module doc), in the order ``fully_shard`` must take them: the tied groups, the blocks,
    the root (``""``) last.

    Args:
        groups: whether ``fully_shard`` takes a list of modules (default: this torch's answer).

    Example:
        >>> emb, head = nn.Embedding(100, 8), nn.Linear(8, 100)
        >>> head.weight = emb.weight
        >>> net = nn.Sequential(emb, nn.Linear(8, 8), head)
        >>> [u.name for u in resolve_ties(net, [("0", emb), ("2", head)], groups=True)]
        ['0+2', '']
        >>> [u.name for u in resolve_ties(net, [("0", emb), ("2", head)], groups=False)]
        ['']
        >>> [u.name for u in resolve_ties(net, [("0", emb)], groups=True)]
        ['']
    """
    groups = fully_shard_takes_module_lists() if groups is None else groups
    kept = list(blocks)
    held = _holders(model)  # the model does not change while units are dropped
    while True:  # dropping a unit can put another tie's holder outside every unit
        cover = _cover(model, {id(m): i for i, (_, m) in enumerate(kept)})
        drop: set[int] = set()
        ties = _Find()
        for param_id, holders in held:
            units = set().union(*(cover[id(h)] for h in holders))
            if len(units) < 2:
                continue  # inside one unit, or all with the root
            if None in units or not groups:
                drop.update(u for u in units if u is not None)
                continue
            for holder in holders:
                ties.join(id(holder), param_id)
        if not drop:
            break
        kept = [block for i, block in enumerate(kept) if i not in drop]
    grouped = list(_groups(model, ties))
    taken = {id(p) for unit in grouped for top in unit.modules for p in top.parameters()}
    yield from grouped
    for path, module in kept:
        if any(id(p) not in taken for p in module.parameters()):  # else all in a group
            yield Unit(path, (module,))
    yield Unit("", (model,))


def _groups(model: nn.Module, ties: _Find) -> Iterator[Unit]:
    """One unit per group of tied holders: its outermost holders, in module order. A holder
    inside another (Bert's prediction head holds a bias its decoder holds too) joins its
    group: ``fully_shard`` on the outer one takes the inner one's parameters."""
    holders = [m for m in model.modules() if id(m) in ties.parent]
    inner: set[int] = set()
    for outer in holders:
        for module in outer.modules():
            if module is not outer and id(module) in ties.parent:
                ties.join(id(module), id(outer))
                inner.add(id(module))
    paths = {id(m): path for path, m in model.named_modules()}
    by_group: dict[int, list[nn.Module]] = {}
    for module in holders:
        if id(module) not in inner:
            by_group.setdefault(ties.root(id(module)), []).append(module)
    for members in by_group.values():
        yield Unit("+".join(paths[id(m)] for m in members), tuple(members), tied=True)
