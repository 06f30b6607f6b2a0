"""What an estimate holds: one strategy's bytes per rank, the model's figures, and how a size reads.

The figures are counted in ``memory`` (``estimate_memory``); ``choice`` and ``render`` read them,
and ``memory.MemoryEstimate`` adds their verbs (``choose``, ``table``, ``to_json``) on top, so
that no module of this folder imports one that imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multigpu.estimate.capacity import GIB, Capacity

STRATEGIES = ("ddp", "fsdp", "fsdp+offload")

ACTIVATIONS_NOTE = (
    "not included: activations (they grow with the batch and the sequence length), the "
    "framework's own memory (torch, a CUDA context) and the allocator's slack"
)


def size(value: float) -> str:
    """Bytes as GiB, or MiB below a hundredth of a GiB.

    Example:
        >>> size(3 * 2**30), size(5 * 2**20), size(0)
        ('3.00 GiB', '5.0 MiB', '0 B')
    """
    if value == 0:
        return "0 B"
    return f"{value / GIB:.2f} GiB" if value >= GIB / 100 else f"{value / 2**20:.1f} MiB"


@dataclass(frozen=True, kw_only=True)
class StrategyMemory:
    """One rank's bytes under one strategy."""

    strategy: str
    """``ddp``, ``fsdp`` or ``fsdp+offload``."""
    params: int
    """The parameters this rank holds (a shard under FSDP), and the model's buffers."""
    grads: int
    """Their gradients."""
    optimizer: int
    """The optimizer's state for them, and on GPUs its step's temporaries."""
    buffers: int
    """Communication and compute copies: DDP's buckets (and autocast's bf16 weights); FSDP's
    gathered units, their unsharded gradients and the collectives' flat buffers."""
    host: int = 0
    """Of the above, what sits in CPU RAM rather than on the GPU (offload)."""
    gpu_only: bool = False
    """True for a strategy that means nothing on CPU processes (offload)."""
    resume: int = 0
    """What this rank holds at most while a checkpoint loads: the parameters, the optimizer
    state and one buffer as large as the largest parameter (see ``memory``'s module doc); below the
    training's sum for every model, and counted in ``total`` if it were not."""

    @property
    def total(self) -> int:
        """Everything this rank holds for the model's training state, or to resume it from a
        checkpoint when that were more."""
        return max(self.params + self.grads + self.optimizer + self.buffers, self.resume)

    @property
    def device(self) -> int:
        """What this rank's device holds (its GPU; on CPU processes: RAM, all of it)."""
        return self.total - self.host


@dataclass(frozen=True, kw_only=True)
class MemoryFigures:
    """A model's training state per rank, for each strategy: the figures and what they answer
    (``MemoryEstimate`` adds the choice and the views)."""

    parameters: int
    """Number of parameters (elements; shared ones once)."""
    param_bytes: int
    """Their bytes as stored (float32: 4 per element)."""
    world_size: int
    """Processes sharing the work; FSDP shards over all of them."""
    optimizer: str
    """The optimizer's name (``adamw``, ``sgd-momentum``...)."""
    states_per_param: int
    """Parameter-sized state tensors the optimizer keeps per parameter."""
    precision: str
    """``"32"`` or ``"bf16-mixed"``."""
    units: tuple[tuple[str, int], ...]
    """FSDP's units (name, parameters), the root (``""``) last; ``a+b``: modules sharing
    parameters (tied weights), one unit."""
    unit_rule: str = ""
    """How FSDP chose its blocks: ``declared: GPT2Block``, ``repeated: Block``, ``given: ...``
    or ``children of 100,000+ parameters`` (``multigpu.strategies.fsdp_units``)."""
    unit_warning: str | None = None
    """One line when a unit holds most of the model (sharding then saves little), with the
    ``FSDPStrategy(blocks=...)`` that splits it."""
    strategies: tuple[StrategyMemory, ...] = field(default=())
    """``ddp``, ``fsdp`` and ``fsdp+offload``, in that order."""
    capacity: Capacity | None = None
    """What a rank has, when given: ``fits`` and ``choose`` compare against it."""
    resident_bytes: int = 0
    """Parameter bytes the model already holds on ``resident_device`` (0 on the meta device):
    already counted as used by the capacity, so they are added back to it."""
    resident_device: str = "meta"
    """The device type of the model's parameters (``meta``, ``cpu``, ``cuda``)."""
    notes: tuple[str, ...] = (ACTIVATIONS_NOTE,)
    """What the figures leave out or assume, one sentence each."""

    def of(self, strategy: str) -> StrategyMemory:
        """The estimate of one strategy (``ddp``, ``fsdp``, ``fsdp+offload``).

        Example:
            >>> import torch
            >>> from multigpu.estimate import estimate_memory
            >>> with torch.device("meta"):
            ...     net = torch.nn.Linear(10, 10)
            >>> estimate_memory(net, world_size=2, optimizer="sgd").of("ddp").total
            880
        """
        for found in self.strategies:
            if found.strategy == strategy:
                return found
        raise KeyError(f"{strategy!r}; expected one of {', '.join(STRATEGIES)}")

    @property
    def largest_unit(self) -> int:
        """Parameters of the largest FSDP unit other than the root (0 when there is none)."""
        return max((n for _, n in self.units[:-1]), default=0)

    def room(self, capacity: Capacity | None = None) -> int | None:
        """Bytes a rank has for the model's state: the capacity plus what the model already
        holds on that kind of device (None without a capacity)."""
        capacity = capacity or self.capacity
        if capacity is None:
            return None
        held = self.resident_bytes if self.resident_device == capacity.kind else 0
        return capacity.bytes + held

    def fits(self, strategy: str, capacity: Capacity | None = None) -> bool | None:
        """Whether a rank holds ``strategy``'s state (None: no capacity, or offload on CPUs)."""
        room = self.room(capacity)
        chosen = self.of(strategy)
        kind = (capacity or self.capacity or Capacity(bytes=0, source="")).kind
        if room is None or (chosen.gpu_only and kind != "cuda"):
            return None
        return chosen.device <= room
