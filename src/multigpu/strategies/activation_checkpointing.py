"""Activation checkpointing policies: what a block keeps of its forward for the backward.

- ``full``: keep only the block's input; recompute the whole block in the backward
  (``torch.utils.checkpoint``, ``use_reentrant=False``): least memory, about a third more compute.
- ``selective``: keep the outputs of the matmuls and the attention (the expensive ops), recompute
  the cheap ones (norms, activations, adds) from them
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``).
- a float in (0, 1): a memory budget, the share of the activations to keep; the compiler's
  min-cut partitioner chooses what to recompute (``torch._functorch.config
  .activation_memory_budget``), so it acts only under ``torch.compile``.

A checkpointed block keeps its object, its parameters and their names (optimizers and checkpoints
see nothing new); its class becomes a subclass, ``Checkpointed<Block>``, whose ``forward`` runs the
block's own under ``checkpoint``. The subclass is made once per class and policy, so repeated
blocks keep one type and ``torch.compile`` compiles them once; it shows in the module tree
(``FSDPCheckpointedBlock`` once ``fully_shard`` has made its own subclass on top).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from multigpu.errors import UsageError

EXPECTED = (
    "False (off), True or 'full' (recompute each block), 'selective' (keep matmul and attention "
    "outputs, recompute the rest) or a memory budget in (0, 1), e.g. 0.5 (needs compile)"
)


@dataclass(frozen=True)
class ActivationCheckpointing:
    """An activation checkpointing policy, parsed (``ActivationCheckpointing.parse``)."""

    mode: str
    """``none``, ``full``, ``selective`` or ``budget``."""
    budget: float | None = None
    """With ``budget``: the share of the activations kept, in (0, 1)."""

    @classmethod
    def parse(cls, value: object, *, owner: str) -> ActivationCheckpointing:
        """``value`` (``False``/``None``, ``True``/``"full"``, ``"selective"``, a float in
        (0, 1)) as a policy; anything else is a UsageError naming ``owner`` (the class).

        Example:
            >>> ActivationCheckpointing.parse(0.5, owner="FSDPStrategy").describe()
            'budget 0.5'
            >>> ActivationCheckpointing.parse(True, owner="FSDPStrategy").mode
            'full'
        """
        if value is None or value is False:
            return cls("none")
        if value is True or (isinstance(value, str) and value.lower() == "full"):
            return cls("full")
        if isinstance(value, str) and value.lower() == "selective":
            return cls("selective")
        if isinstance(value, float) and math.isfinite(value) and 0.0 < value < 1.0:
            return cls("budget", value)
        raise UsageError(f"{owner}(activation_checkpointing={value!r}): expected {EXPECTED}")

    @property
    def on(self) -> bool:
        """Whether any checkpointing is asked for."""
        return self.mode != "none"

    def describe(self) -> str | bool:
        """What ``describe()`` and manifests record: False, ``full``, ``selective`` or
        ``budget 0.5``."""
        if self.mode == "none":
            return False
        return f"budget {self.budget:g}" if self.mode == "budget" else self.mode

    def wraps_blocks(self) -> bool:
        """Whether each block gets a ``checkpoint`` wrapper (a budget is the compiler's)."""
        return self.mode in ("full", "selective")


def _save_ops() -> frozenset[Any]:
    """The ops whose outputs ``selective`` keeps: matmuls and attention (those torch has)."""
    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "linear",
        "convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math",
    )
    return frozenset(getattr(aten, name).default for name in names if hasattr(aten, name))


SAVE_OPS = _save_ops()
"""What ``selective`` keeps: the outputs of these ops (every other op is recomputed)."""


def _keep_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """``selective``'s policy: keep what is costly to recompute, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Any:
    return create_selective_checkpoint_contexts(_keep_matmuls)


_MADE: dict[tuple[type[nn.Module], str], type[nn.Module]] = {}


def checkpointed_class(cls: type[nn.Module], mode: str) -> type[nn.Module]:
    """``cls`` with its ``forward`` run under ``checkpoint`` (``mode``: ``full`` or
    ``selective``); one class per (class, mode)."""
    made = _MADE.get((cls, mode))
    if made is None:
        made = _MADE[cls, mode] = _checkpointed_class(cls, mode)
    return made


def _checkpointed_class(cls: type[nn.Module], mode: str) -> type[nn.Module]:
    options: dict[str, Any] = {"use_reentrant": False}
    if mode == "selective":
        options["context_fn"] = _selective_contexts
    inner = cls.forward

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, self, *args, **options, **kwargs)

    made = type(f"Checkpointed{cls.__name__}", (cls,), {"forward": forward})
    made.__module__ = cls.__module__
    made.__doc__ = f"{cls.__name__}, its activations recomputed in the backward ({mode})."
    made._multigpu_checkpointing = mode  # type: ignore[attr-defined]
    return made


def checkpoint_block(block: nn.Module, policy: ActivationCheckpointing) -> None:
    """Make ``block`` recompute its activations in the backward, in place (a no-op for a policy
    that wraps no block: off, or a budget)."""
    if policy.wraps_blocks() and getattr(type(block), "_multigpu_checkpointing", None) is None:
        block.__class__ = checkpointed_class(type(block), policy.mode)


def checkpointing_of(block: nn.Module) -> str | None:
    """The mode a block was checkpointed with (``full``/``selective``), or None."""
    return getattr(type(block), "_multigpu_checkpointing", None)
