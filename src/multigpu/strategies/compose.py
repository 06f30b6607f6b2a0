"""The order in which a model's blocks get their wrappers, in one place (torchtitan's order).

Per block (the units FSDP shards: ``fsdp_units.plan_units``): tensor parallel first (the
tensor-parallel strategy's ``parallelize_module``, before this module is called), then activation
checkpointing, then ``torch.compile`` of the block, then ``fully_shard`` of the block; last the
root: ``fully_shard`` (FSDP) or the DDP wrap. Why this order:

- tensor parallel first: it replaces the Linear weights by DTensors and puts its redistributions
  around them; what comes after traces and checkpoints the parallel block.
- checkpointing inside compile: the compiler sees the checkpointed region (a higher-order op) and
  plans the recomputation inside the compiled backward, instead of breaking the graph at it.
- compile per block, not the whole model: the repeated blocks share one type, so they share one
  compiled graph (one compile, whatever the depth), and a block is small enough to trace whole.
- ``fully_shard`` (and DDP) outside compile: FSDP's all-gather and reduce-scatter hooks run
  eagerly around each compiled block (dynamo skips FSDP's hooks), and DDP's gradient hooks fire
  as the compiled backward produces each gradient.

A model without units (no block, nothing but the root) is compiled (and checkpointed) whole.
A memory budget (``ActivationCheckpointing.mode == "budget"``) wraps no block: the block is
compiled by a backend that sets the partitioner's budget while it compiles
(``torch_compat.backend_with_memory_budget``); nothing process-wide stays changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from multigpu.errors import UsageError
from multigpu.strategies.activation_checkpointing import ActivationCheckpointing, checkpoint_block
from multigpu.strategies.fsdp_ties import Unit
from multigpu.torch_compat import backend_with_memory_budget

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def resolve_backend(value: object, *, given_as: str) -> str | None:
    """``compile=`` as a backend name: None/False off, True ``inductor``, a name that backend.

    A name torch does not know is a UsageError that lists the ones it does.

    Example:
        >>> resolve_backend(True, given_as="compile"), resolve_backend(False, given_as="compile")
        ('inductor', None)
    """
    if value is None or value is False:
        return None
    if value is True:
        return "inductor"
    import torch

    known = torch.compiler.list_backends(exclude_tags=())
    if not isinstance(value, str) or not _WORD.fullmatch(value) or value not in known:
        raise UsageError(
            f"{given_as}={value!r}: expected True (inductor), False, or a torch.compile backend "
            f"({', '.join(sorted(known))}), e.g. compile='aot_eager'"
        )
    return value


def check_composition(
    checkpointing: ActivationCheckpointing, backend: str | None, *, owner: str
) -> None:
    """Refuse a memory budget without compile (only the compiler's partitioner acts on it)."""
    if checkpointing.mode == "budget" and backend is None:
        raise UsageError(
            f"{owner}(activation_checkpointing={checkpointing.budget!r}) is a memory budget, "
            "which only torch.compile's partitioner applies, and compile is off; add "
            "compile=True to multigpu.init (--compile, MULTIGPU_COMPILE=1), or use "
            "activation_checkpointing='selective' or 'full'"
        )


@dataclass(frozen=True)
class Composed:
    """What ``compose`` did to a model."""

    blocks: int
    """Blocks checkpointed and compiled one by one (0: the model was taken whole)."""
    block_class: str
    """The class of the first block (``Block``), or the model's when taken whole."""

    def describe(self) -> str:
        """``4 blocks`` or ``the whole model``."""
        if self.blocks:
            return f"{self.blocks} block{'s' if self.blocks > 1 else ''}"
        return "the whole model"

    def detail(self) -> str:
        """``Block`` (the blocks' class) or ``GPT: no blocks`` (the model's)."""
        return self.block_class if self.blocks else f"{self.block_class}: no blocks"


def compose(
    model: nn.Module,
    units: Sequence[Unit],
    *,
    checkpointing: ActivationCheckpointing,
    backend: str | None,
    shard: Callable[[Unit], None] | None = None,
) -> Composed:
    """Checkpoint, compile and ``shard`` each of ``units`` in turn (the root excluded).

    A tied unit (several modules sharing a parameter) is sharded as it is, neither checkpointed
    nor compiled. With no untied unit, ``model`` itself is checkpointed and compiled. The caller
    wraps the root afterwards (``fully_shard`` or DDP).
    """
    blocks = [unit.modules[0] for unit in units if not unit.tied]
    named = type(blocks[0] if blocks else model).__name__  # before checkpointing subclasses it
    for unit in units:
        if not unit.tied:
            _prepare(unit.modules[0], checkpointing, backend)
        if shard is not None:
            shard(unit)
    if not blocks:
        _prepare(model, checkpointing, backend)
    return Composed(len(blocks), named)


def _prepare(block: nn.Module, checkpointing: ActivationCheckpointing, backend: str | None) -> None:
    """Activation checkpointing, then compile (in place: the block keeps its object and names,
    and ``fully_shard`` can still take it)."""
    checkpoint_block(block, checkpointing)
    if backend is None:
        return
    if checkpointing.mode == "budget" and checkpointing.budget is not None:
        block.compile(backend=backend_with_memory_budget(backend, checkpointing.budget))
    else:
        block.compile(backend=backend)


def block_units(model: nn.Module) -> list[Unit]:
    """The units FSDP would shard ``model`` into (its root excluded), for DDP and one device."""
    from multigpu.strategies.fsdp_units import plan_units

    return plan_units(model).units[:-1]
