"""How much memory one rank needs for a model's training state, per strategy.

Counted from the model's parameters alone (a meta-device model costs nothing to ask about).
With P the parameters' bytes, S the optimizer's state tensors per parameter, N processes, L the
largest FSDP unit's and R the root unit's parameters, c the bytes of a weight in compute (2
under ``bf16-mixed``, else as stored):

- **ddp**: params P, gradients P, optimizer S·P (on GPUs + P for the step's temporaries: torch's
  foreach Adam makes a new tensor list as large as the parameters), buffers: DDP's gradient
  buckets, a second copy of the gradients the all-reduce works on (none with
  ``gradient_as_bucket_view``, multigpu's default; none on one process: multigpu runs it
  unwrapped), and under
  ``bf16-mixed`` autocast's bf16 copy of the weights that the backward keeps (2 bytes a
  parameter);
- **fsdp**: params, gradients and optimizer state (and its GPU step temporaries) sharded (each
  parameter's dim 0 split in N, padded as FSDP2 pads it), and buffers: what is gathered whole —
  the root unit kept gathered with its unsharded gradient (2·c·R), and three copies of the
  largest unit in the backward (its gathered weights, the next unit's prefetched ones, its
  unsharded gradient: 3·c·L) with the reduce-scatter's float32 input (4·L);
- **fsdp+offload** (GPU only): the same, with the sharded state in CPU RAM (the optimizer
  steps there): the GPU holds only what is gathered.

The step's temporaries are counted on GPUs only (``device="cuda"``, or a GPU ``capacity``):
there they are a whole copy of the rank's parameters; on CPUs torch's per-tensor loop holds two
copies of one tensor at a time, within the slack, and a device not given leaves them out (said
in ``notes``).

**Resume** (``resume``): loading a checkpoint holds the parameters, the optimizer state (made by
one step, its temporaries included) and one buffer as large as the largest parameter — the zero
gradients that step reads, then the piece of a tensor DCP reads before copying it into place;
no gradients, no second copy of the model or the optimizer (DCP loads into the live tensors).
That is less than training holds, so each strategy's ``total`` covers a resume too; measured on
2 CPU processes at 67M (DDP) and 200M (FSDP) parameters, a resume and 3 steps peaked at 0.999x
and 1.001x the training's RSS (``benchmarks/resume_memory.py``, ``benchmarks/RESULTS.md``).

Not included: activations (they grow with the batch, not the model), the framework's own
memory (CUDA context, torch's libraries: about 0.2–0.3 GiB of RAM for a CPU process), and the
allocator's slack. The formulas were checked against the peak RSS of 2 CPU processes training
stacks of Linear blocks with AdamW (``benchmarks/memory.py``, ``benchmarks/RESULTS.md``); the
GPU terms (step temporaries, gathered units) follow torch's code and are not measured here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from multigpu.errors import UsageError
from multigpu.estimate import choice, render
from multigpu.estimate.capacity import Capacity
from multigpu.estimate.figures import (
    ACTIVATIONS_NOTE,
    STRATEGIES,
    MemoryFigures,
    StrategyMemory,
)
from multigpu.estimate.optimizers import optimizer_state_count
from multigpu.strategies.fsdp_units import DEFAULT_MIN_BLOCK_PARAMS, plan_units

PRECISIONS = ("32", "bf16-mixed")
"""The precisions the estimate knows (``16-mixed`` has no FSDP here)."""

__all__ = [
    "DEFAULT_MIN_BLOCK_PARAMS",
    "PRECISIONS",
    "STRATEGIES",
    "MemoryEstimate",
    "StrategyMemory",
    "estimate_memory",
]

UNIT_BUFFERS = 3.0
"""Largest-unit-sized copies alive at FSDP's backward peak, in compute bytes (the float32
reduce-scatter input adds 4 bytes a parameter): the unit's gathered weights, the next unit's
prefetched ones, its unsharded gradient. Checked against the peak RSS of 2 CPU processes at
201M parameters (``benchmarks/RESULTS.md``): within 3 %."""

STEP_NOTE = (
    "the optimizer step's temporaries are not counted (on GPUs, one more copy of the "
    "parameters for Adam-like optimizers): give device= or capacity="
)


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate(MemoryFigures):
    """A model's training state per rank, for each strategy (see the module doc): the figures
    (``MemoryFigures``), what ``strategy="auto"`` picks from them, and their views."""

    def choose(self, capacity: Capacity | None = None) -> tuple[str, str]:
        """(``"ddp"`` or ``"fsdp"``, a one-line reason): what ``strategy="auto"`` picks.

        DDP when its state takes at most ``HEADROOM`` (80 %) of the rank's memory, else FSDP
        (the reason then says whether it fits, and if not what would); ``"single"`` on one
        process. See ``choice.choose`` (and ``multigpu.estimate`` for an example).
        """
        capacity = capacity or self.capacity
        if capacity is None:
            raise UsageError(
                "MemoryEstimate.choose() has no capacity to compare with; pass "
                "capacity=device_capacity(device, local_processes) or give it to estimate_memory"
            )
        return choice.choose(self, capacity)

    def table(self) -> str:
        """The estimate as plain text: one row per strategy, then the capacity and the choice."""
        return render.as_text(self)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the model's figures, each strategy's bytes per rank, the fit."""
        return render.as_json(self)


def estimate_memory(
    model: nn.Module,
    *,
    world_size: int,
    optimizer: str | torch.optim.Optimizer = "adamw",
    precision: str = "32",
    blocks: Sequence[type[nn.Module]] | None = None,
    min_block_params: int = DEFAULT_MIN_BLOCK_PARAMS,
    gradient_as_bucket_view: bool = True,
    capacity: Capacity | None = None,
    device: str | torch.device | None = None,
) -> MemoryEstimate:
    """Estimate one rank's memory for ``model``'s training state under ddp, fsdp, fsdp+offload.

    Build the model on the meta device to ask about one that fits nowhere:
    ``with torch.device("meta"): model = Big()``. Activations are not included.

    Args:
        model: the plain model (wrappers are not looked through).
        optimizer: an optimizer or its name (``adamw``, ``adam``, ``sgd``, ``sgd-momentum``...).
        blocks: FSDP's unit classes, as given to ``FSDPStrategy`` (None: its default choice).
        min_block_params: the size threshold of FSDP's default unit choice.
        gradient_as_bucket_view: DDP's option (its buckets are then the gradients themselves);
            True is multigpu's default, False torch's.
        capacity: what a rank has (``device_capacity(...)``), for ``fits`` and ``choose``.
        device: where the ranks train (``"cuda"``, ``"cpu"``); default: the capacity's kind.
            On GPUs the optimizer step's temporaries are counted.

    Raises:
        UsageError: a world size below 1, an unknown precision or optimizer name.

    Example:
        >>> with torch.device("meta"):
        ...     net = nn.Sequential(*(nn.Linear(1000, 1000) for _ in range(8)))
        >>> est = estimate_memory(net, world_size=2)
        >>> round(est.of("ddp").total / 2**20), round(est.of("fsdp").total / 2**20)
        (122, 76)
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise UsageError(
            f"world_size={world_size!r}; expected a positive number of processes, e.g. 2"
        )
    if precision not in PRECISIONS:
        raise UsageError(
            f"precision={precision!r}; the memory estimate knows {', '.join(PRECISIONS)}"
        )
    opt = optimizer_state_count(optimizer)
    params = list({id(p): p for p in model.parameters()}.values())
    count = sum(p.numel() for p in params)
    stored = sum(p.numel() * p.element_size() for p in params)
    model_buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    n, states = world_size, opt.states
    kind = capacity.kind if capacity is not None else None
    if device is not None:
        kind = torch.device(device).type
    copies = states + (opt.step_copies if kind == "cuda" else 0)
    plan = plan_units(model, blocks, min_block_params)
    units = tuple(plan.sizes)
    per_element = stored / count if count else 4.0
    compute = 2.0 if precision == "bf16-mixed" else per_element
    # A resume's one extra buffer: the zero gradients of the largest parameter (one buffer
    # for all, strategies.state), then the largest piece DCP reads (a whole tensor when the
    # checkpoint was saved unsharded).
    largest_param = max((p.numel() * p.element_size() for p in params), default=0)
    ddp = StrategyMemory(
        strategy="ddp",
        params=stored + model_buffers,
        grads=stored,
        optimizer=stored * copies,
        buffers=(0 if gradient_as_bucket_view or n == 1 else stored)
        + (2 * count if precision == "bf16-mixed" else 0),
        resume=stored + model_buffers + stored * copies + largest_param,
    )
    shard = sum(_shard_bytes(p, n) for p in params)
    root, largest = units[-1][1], max((size for _, size in units[:-1]), default=0)
    reduce_bytes = max(per_element, 4.0)  # gradients are reduced in float32 (or as stored)
    gathered = math.ceil(2 * compute * root + largest * (UNIT_BUFFERS * compute + reduce_bytes))
    held = shard + model_buffers
    fsdp = StrategyMemory(
        strategy="fsdp",
        params=held,
        grads=shard,
        optimizer=shard * copies,
        buffers=gathered,
        resume=held + shard * copies + largest_param,
    )
    # The same as fsdp, with the optimizer stepping in CPU RAM: no GPU step temporaries there.
    offload = replace(
        fsdp,
        strategy="fsdp+offload",
        optimizer=shard * states,
        host=shard * (2 + states),
        gpu_only=True,
        resume=held + shard * states + largest_param,
    )
    resident = [p for p in params if p.device.type != "meta"]
    notes = [ACTIVATIONS_NOTE]
    if opt.assumption:
        notes.append(opt.assumption)
    if kind is None and opt.step_copies:
        notes.append(STEP_NOTE)
    return MemoryEstimate(
        parameters=count,
        param_bytes=stored,
        world_size=n,
        optimizer=opt.name,
        states_per_param=states,
        precision=precision,
        units=units,
        unit_rule=str(plan.choice),
        unit_warning=plan.warning,
        strategies=(ddp, fsdp, offload),
        capacity=capacity,
        resident_bytes=sum(p.numel() * p.element_size() for p in resident),
        resident_device=resident[0].device.type if resident else "meta",
        notes=tuple(notes),
    )


def _shard_bytes(param: torch.Tensor, world_size: int) -> int:
    """One rank's bytes of ``param`` under FSDP2: dim 0 split in ``world_size``, padded."""
    if param.dim() == 0:
        return param.element_size()
    rows = -(-param.shape[0] // world_size)
    return rows * (param.numel() // max(1, param.shape[0])) * param.element_size()
