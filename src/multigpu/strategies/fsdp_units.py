"""Which submodules FSDP shards as units of their own (each all-gathered on its own, in turn).

A rank's peak memory is its shard of everything plus the largest unit or two whole, so the units
should be the model's blocks, wherever they sit in the module tree. The root is always a unit: it
holds every parameter no other unit took. By default (``choose_blocks``), in this order:

1. **declared**: the classes a model names as its blocks — Hugging Face's ``_no_split_modules``
   on any of its modules (GPT-2's ``GPT2Block``, Llama's ``LlamaDecoderLayer``, T5's
   ``T5Block``);
2. **repeated**: the items of a ``ModuleList``/``ModuleDict``/``Sequential`` whose class occurs
   there at least twice, the outermost such (a transformer's ``h[i]`` or ``layers[i]``, not the
   experts inside them);
3. otherwise the children holding at least ``min_block_params`` parameters, looking through
   containers (the rule for models without blocks).

Blocks (declared, or repeated modules whose parameters sit in submodules) are units at any size:
the same units at a test's size as at the real one, one unit per layer as Accelerate's
transformer wrap policy and torch's FSDP2 example make them. ``min_block_params`` applies where
the guess is about size, not structure: repeated plain layers (a ``Sequential`` of ``Linear``)
and rule 3. With ``blocks=(Block,)``: the outermost modules of those classes, at any size.

Modules that share a parameter (tied weights: ``named_parameters(remove_duplicate=False)``) are
then put in one unit, or left with the root: ``fsdp_ties``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from torch import nn

from multigpu.strategies.fsdp_ties import Unit, resolve_ties

DEFAULT_MIN_BLOCK_PARAMS = 100_000
"""Plain layers and children with fewer parameters stay in their parent's unit: gathering tiny
units costs more in collectives than it saves in memory."""

MOST = 0.5
"""A unit holding more than this share of the parameters is warned of (``Units.warning``)."""

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)

__all__ = [
    "DEFAULT_MIN_BLOCK_PARAMS",
    "Choice",
    "Unit",
    "Units",
    "choose_blocks",
    "count_params",
    "plan_units",
]


class Choice(NamedTuple):
    """The blocks found in a model, and by which rule."""

    blocks: list[tuple[str, nn.Module]]
    """(path, module) of each block, outermost, in module order, each module once."""
    rule: str
    """How they were found: ``given``, ``declared``, ``repeated`` or ``size``."""
    classes: tuple[str, ...]
    """The class names of the blocks (the declared or given ones, if any)."""
    min_block_params: int
    """The size threshold it applied (to plain layers and the children of rule 3)."""

    def __str__(self) -> str:
        if self.rule == "size":
            return f"children of {self.min_block_params:,}+ parameters"
        return f"{self.rule}: {', '.join(self.classes)}"


def count_params(module: nn.Module) -> int:
    """The number of parameters of ``module`` (shared ones once)."""
    return sum(p.numel() for p in module.parameters())


def _is_layer(module: nn.Module) -> bool:
    """Whether ``module`` holds its parameters itself (``Linear``, ``Embedding``), no block."""
    return not any(count_params(child) for child in module.children())


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


def _repeated(
    module: nn.Module, min_block_params: int, prefix: str = ""
) -> Iterator[tuple[str, nn.Module]]:
    """The outermost items of containers whose class occurs there twice or more (see rule 2)."""
    children = list(module.named_children())
    repeats: set[type] = set()
    if isinstance(module, _CONTAINERS):
        seen: dict[type, int] = {}
        for _, child in children:
            if count_params(child) and not isinstance(child, _CONTAINERS):
                seen[type(child)] = seen.get(type(child), 0) + 1
        repeats = {cls for cls, n in seen.items() if n > 1}
    for name, child in children:
        path = f"{prefix}{name}"
        if type(child) in repeats:
            if not _is_layer(child) or count_params(child) >= min_block_params:
                yield path, child
        else:
            yield from _repeated(child, min_block_params, f"{path}.")


def _declared(model: nn.Module) -> set[str]:
    """The block class names the model's modules declare (``_no_split_modules``)."""
    names: set[str] = set()
    for module in model.modules():
        declared = getattr(module, "_no_split_modules", None)
        if isinstance(declared, (list, tuple, set, frozenset)):
            names.update(name for name in declared if isinstance(name, str))
    return names


def _once(found: Iterator[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """``found`` with each module once (a module reachable by two paths keeps its first)."""
    seen: set[int] = set()
    out = []
    for path, module in found:
        if id(module) not in seen:
            seen.add(id(module))
            out.append((path, module))
    return out


def choose_blocks(
    model: nn.Module,
    blocks: Sequence[type[nn.Module]] | None = None,
    min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS,
) -> Choice:
    """The modules FSDP would shard as units before tied weights are considered (module doc).

    Example:
        >>> class Block(nn.Module):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
        >>> net = nn.Sequential(nn.Embedding(10, 8), nn.Sequential(Block(), Block()))
        >>> choice = choose_blocks(net)
        >>> [path for path, _ in choice.blocks], str(choice)
        (['1.0', '1.1'], 'repeated: Block')
    """
    if blocks:
        wanted = tuple(blocks)
        found = _once(_outermost(model, lambda m: isinstance(m, wanted)))
        return Choice(found, "given", tuple(b.__name__ for b in wanted), min_block_params)
    declared = _declared(model)
    if declared:
        found = _once(_outermost(model, lambda m: type(m).__name__ in declared))
        if found:
            return Choice(found, "declared", tuple(sorted(declared)), min_block_params)
    found = _once(_repeated(model, min_block_params))
    if found:
        return Choice(found, "repeated", _class_names(found), min_block_params)
    found = [
        (path, child)
        for path, child in _once(_outermost(model, lambda m: not isinstance(m, _CONTAINERS)))
        if count_params(child) >= min_block_params
    ]
    return Choice(found, "size", _class_names(found), min_block_params)


def _class_names(found: list[tuple[str, nn.Module]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(type(module).__name__ for _, module in found))


class Units(NamedTuple):
    """What ``plan_units`` found: the units, their sizes, and how the blocks were chosen."""

    units: list[Unit]
    """In the order ``fully_shard`` takes them: tied groups, blocks, the root (``""``) last."""
    sizes: list[tuple[str, int]]
    """(name, parameters) of each unit: what one all-gather brings whole (the root: the rest)."""
    choice: Choice
    """The blocks before tied weights were considered, and the rule that found them."""
    warning: str | None
    """One line when a unit holds most of a model worth sharding (``MOST``), with the fix."""

    @property
    def names(self) -> list[str]:
        """The units' names, the root as ``<root>`` (``FSDPStrategy.describe()["units"]``)."""
        return [unit.name or "<root>" for unit in self.units]


def plan_units(
    model: nn.Module,
    blocks: Sequence[type[nn.Module]] | None = None,
    min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS,
) -> Units:
    """The units FSDP shards ``model`` into (module doc), with their sizes and any warning.

    Example:
        >>> class Net(nn.Module):  # two large layers, but in no container: nothing repeats
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.one, self.two = nn.Linear(400, 400), nn.Linear(400, 400)
        >>> plan = plan_units(Net())
        >>> plan.names, plan.sizes, plan.choice.rule
        (['one', 'two', '<root>'], [('one', 160400), ('two', 160400), ('', 0)], 'size')
        >>> print(plan_units(Net(), min_block_params=200_000).warning)
        FSDP unit <root> holds 100% of the model's 320,800 parameters: it is gathered whole, so sharding saves little; name blocks to shard one at a time: FSDPStrategy(blocks=(nn.Linear,)) (multigpu estimate --blocks Linear)
    """  # noqa: E501
    choice = choose_blocks(model, blocks, min_block_params)
    units = list(resolve_ties(model, choice.blocks))
    sizes = _sizes(units)
    warning = _dominant(model, units, sizes, choice)
    return Units(units, sizes, choice, warning)


def _sizes(units: list[Unit]) -> list[tuple[str, int]]:
    """(name, parameters no earlier unit took) of each unit, in ``fully_shard`` order."""
    taken: set[int] = set()
    sizes = []
    for unit in units:
        own = {id(p): p for m in unit.modules for p in m.parameters() if id(p) not in taken}
        taken.update(own)
        sizes.append((unit.name, sum(p.numel() for p in own.values())))
    return sizes


def _dominant(
    model: nn.Module,
    units: list[Unit],
    sizes: list[tuple[str, int]],
    choice: Choice,
) -> str | None:
    """The warning of ``Units``: which unit holds most of the model, and which blocks to name
    to split it (``_better_blocks``)."""
    total = count_params(model)
    if total < DEFAULT_MIN_BLOCK_PARAMS:  # a model this small: its memory does not matter
        return None
    (name, size), unit = max(zip(sizes, units, strict=True), key=lambda pair: pair[0][1])
    if size <= MOST * total:
        return None
    said = (
        f"FSDP unit {name or '<root>'} holds {100 * size / total:.0f}% of the model's "
        f"{total:,} parameters: it is gathered whole, so sharding saves little"
    )
    better = _better_blocks(model, units, unit, size, choice, total)
    if better is not None:
        names = ", ".join(_cls_name(cls) for cls in better) + ("," if len(better) == 1 else "")
        return (
            f"{said}; name blocks to shard one at a time: FSDPStrategy(blocks=({names})) "
            f"(multigpu estimate --blocks {','.join(cls.__name__ for cls in better)})"
        )
    if unit.tied:
        return f"{said}; its modules share parameters (tied weights), which one unit must hold"
    return f"{said}; name smaller blocks of it: FSDPStrategy(blocks=(MyBlock,))"


def _better_blocks(
    model: nn.Module, units: list[Unit], unit: Unit, size: int, choice: Choice, total: int
) -> list[type[nn.Module]] | None:
    """The block classes that best shrink the largest unit ``unit`` (None: none does): the
    classes of the blocks that are units (less ``unit``'s own) plus one class of a module inside
    ``unit`` that holds no other unit: of those that leave no unit with most of the model, the
    one with the fewest units (collectives), else the one that leaves the smallest largest."""
    elsewhere = {id(m) for u in units if u is not unit for top in u.modules for m in top.modules()}
    largest: dict[type[nn.Module], int] = {}
    for top in unit.modules:
        for module in top.modules():
            if module is top or isinstance(module, _CONTAINERS):
                continue
            if any(id(m) in elsewhere for m in module.modules()):
                continue  # holds a unit: naming it would swallow that unit
            held = count_params(module)
            largest[type(module)] = max(largest.get(type(module), 0), held)
    own = {type(m) for m in unit.modules}
    kept = {id(m) for u in units if not u.tied for m in u.modules}  # not those tied weights undid
    keep = [type(m) for _, m in choice.blocks if id(m) in kept and type(m) not in own]
    best: tuple[bool, int, int, list[type[nn.Module]]] | None = None
    for cls in largest:
        classes = list(dict.fromkeys([*keep, cls]))
        tried = _sizes(list(resolve_ties(model, choose_blocks(model, classes).blocks)))
        found = max(n for _, n in tried)
        # those that leave no unit with most of the model first, then the fewest collectives
        key = (found > MOST * total, len(tried) if found <= MOST * total else found)
        if found < size and (best is None or key < best[:2]):
            best = (*key, found, classes)
    return None if best is None else best[3]


def _cls_name(cls: type) -> str:
    """``nn.Linear`` for torch's layers, the bare class name otherwise."""
    return f"nn.{cls.__name__}" if cls.__module__.startswith("torch.nn") else cls.__name__
