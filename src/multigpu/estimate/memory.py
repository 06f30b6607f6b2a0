"""How much memory one rank needs for a model's training state, per strategy.

Counted from the model's parameters alone (a meta-device model costs nothing to ask about):

- **ddp**: every rank holds the parameters, their gradients, the optimizer state, and DDP's
  gradient buckets — a second copy of the gradients that the all-reduce works on;
- **fsdp** over N ranks: 1/N of the parameters, gradients and optimizer state, plus what is
  gathered whole for compute: the root unit (kept gathered, its backward comes first) and the
  largest unit twice (the one computing and the one prefetched) with its unsharded gradient;
- **fsdp+offload** (GPU only): the same, with the sharded state in CPU RAM — the device holds
  only what is gathered.

Optimizer state per parameter: Adam/AdamW/Adamax/NAdam/RAdam 2 tensors, SGD with momentum,
RMSprop, Adagrad 1, plain SGD 0; ``bf16-mixed`` computes with bfloat16 copies of the weights
(autocast's cache under DDP, FSDP's gathered units) while the weights, gradients and optimizer
state stay float32. Activations are not included: they grow with the batch, not the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from multigpu.errors import UsageError
from multigpu.strategies.fsdp_units import DEFAULT_MIN_BLOCK_PARAMS, unit_sizes

STATES_PER_PARAM = {
    "adam": 2, "adamw": 2, "adamax": 2, "nadam": 2, "radam": 2,
    "sgd-momentum": 1, "rmsprop": 1, "adagrad": 1, "adadelta": 2, "sgd": 0,
}  # fmt: skip
"""Optimizer state tensors kept per parameter, by optimizer name."""

PRECISIONS = ("32", "bf16-mixed")


def optimizer_states(optimizer: str | torch.optim.Optimizer) -> tuple[str, int]:
    """(name, state tensors per parameter) of an optimizer or an optimizer name.

    Example:
        >>> optimizer_states("AdamW"), optimizer_states("sgd")
        (('adamw', 2), ('sgd', 0))
    """
    if isinstance(optimizer, torch.optim.Optimizer):
        name = type(optimizer).__name__.lower()
        if name == "sgd" and any(g.get("momentum", 0) for g in optimizer.param_groups):
            name = "sgd-momentum"
    else:
        name = str(optimizer).lower()
    if name not in STATES_PER_PARAM:
        raise UsageError(
            f"optimizer {optimizer!r} is not known to the estimate; expected one of "
            f"{sorted(STATES_PER_PARAM)} (or an optimizer object of those classes)"
        )
    return name, STATES_PER_PARAM[name]


@dataclass(frozen=True, kw_only=True)
class StrategyMemory:
    """One rank's bytes under one strategy."""

    strategy: str
    """``ddp``, ``fsdp`` or ``fsdp+offload``."""
    params: int
    grads: int
    optimizer: int
    buffers: int
    """DDP's buckets (and autocast's bf16 copies); FSDP's gathered units."""
    host: int = 0
    """Of the above, what sits in CPU RAM rather than on the device (offload)."""

    @property
    def total(self) -> int:
        """Everything this rank holds for the model's training state."""
        return self.params + self.grads + self.optimizer + self.buffers

    @property
    def device(self) -> int:
        """What this rank's device holds (its GPU; on CPU processes, RAM: all of it)."""
        return self.total - self.host


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """A model's training state per rank, for each strategy (see the module doc)."""

    parameters: int
    """Number of parameters (elements)."""
    param_bytes: int
    """Their bytes as stored (float32: 4 per element)."""
    world_size: int
    optimizer: str
    states_per_param: int
    precision: str
    units: tuple[tuple[str, int], ...]
    """FSDP's units (name, parameters), the root (``""``) last."""
    strategies: tuple[StrategyMemory, ...] = field(default=())

    def of(self, strategy: str) -> StrategyMemory:
        """The estimate of one strategy (``ddp``, ``fsdp``, ``fsdp+offload``)."""
        for found in self.strategies:
            if found.strategy == strategy:
                return found
        raise KeyError(strategy)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the model's figures and each strategy's bytes per rank."""
        return {
            "parameters": self.parameters,
            "param_bytes": self.param_bytes,
            "world_size": self.world_size,
            "optimizer": self.optimizer,
            "states_per_param": self.states_per_param,
            "precision": self.precision,
            "largest_unit": max((n for _, n in self.units[:-1]), default=0),
            "strategies": {
                s.strategy: {
                    "params": s.params,
                    "grads": s.grads,
                    "optimizer": s.optimizer,
                    "buffers": s.buffers,
                    "total": s.total,
                    "device": s.device,
                    "host": s.host,
                }
                for s in self.strategies
            },
        }


def estimate_memory(
    model: nn.Module,
    *,
    world_size: int,
    optimizer: str | torch.optim.Optimizer = "adamw",
    precision: str = "32",
    blocks: Sequence[type[nn.Module]] | None = None,
    min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS,
    gradient_as_bucket_view: bool = False,
) -> MemoryEstimate:
    """Estimate one rank's memory for ``model``'s training state under ddp, fsdp, fsdp+offload.

    Build the model on the meta device to ask about one that does not fit anywhere:
    ``with torch.device("meta"): model = Big()``.

    Args:
        model: the plain model (wrappers are not looked through).
        world_size: processes sharing the work (FSDP shards over all of them).
        optimizer: an optimizer or its name (``adamw``, ``sgd-momentum``...).
        precision: ``"32"`` or ``"bf16-mixed"``.
        blocks / min_block_params: FSDP's unit choice, as given to ``FSDPStrategy``.
        gradient_as_bucket_view: DDP's option (its buckets are then the gradients).

    Example:
        >>> with torch.device("meta"):
        ...     net = nn.Sequential(*(nn.Linear(1000, 1000) for _ in range(8)))
        >>> est = estimate_memory(net, world_size=2)
        >>> round(est.of("ddp").total / 2**20), round(est.of("fsdp").total / 2**20)
        (153, 73)
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise UsageError(f"world_size={world_size!r}; expected a positive number of processes")
    if precision not in PRECISIONS:
        raise UsageError(f"precision={precision!r}; expected one of {PRECISIONS}")
    name, states = optimizer_states(optimizer)
    params = list({id(p): p for p in model.parameters()}.values())
    count = sum(p.numel() for p in params)
    stored = sum(p.numel() * p.element_size() for p in params)
    per_element = stored / count if count else 4.0
    units = tuple(unit_sizes(model, blocks, min_block_params))
    compute = 2 if precision == "bf16-mixed" else per_element  # bytes of a gathered weight
    n = world_size
    cast_cache = int(count * 2) if precision == "bf16-mixed" else 0
    ddp = StrategyMemory(
        strategy="ddp",
        params=stored,
        grads=stored,
        optimizer=int(stored * states),
        buffers=(0 if gradient_as_bucket_view or n == 1 else stored) + cast_cache,
    )
    root = units[-1][1]
    largest = max((size for _, size in units[:-1]), default=0)
    gathered = 0 if n == 1 else int(root * compute + 2 * largest * compute + largest * 4)
    shard = -(-stored // n)  # ceil: the first ranks hold the remainder
    fsdp = StrategyMemory(
        strategy="fsdp",
        params=shard,
        grads=shard,
        optimizer=int(shard * states),
        buffers=gathered,
    )
    offload = StrategyMemory(
        strategy="fsdp+offload",
        params=shard,
        grads=shard,
        optimizer=int(shard * states),
        buffers=gathered,
        host=shard * (2 + states),
    )
    return MemoryEstimate(
        parameters=count,
        param_bytes=stored,
        world_size=n,
        optimizer=name,
        states_per_param=states,
        precision=precision,
        units=units,
        strategies=(ddp, fsdp, offload),
    )
