"""The Strategy interface: how a model is placed, wrapped and unwrapped, and whose state it is.

A strategy owns everything that depends on its wrapping: moving and wrapping the model (and
materializing a meta-device one), keeping the optimizers attached, skipping gradient
synchronisation, clipping, and producing and loading the model and optimizer state
(``multigpu.strategies.state``: plain tensors, or shards under FSDP). The checkpoint code calls
these and knows no wrapper.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import torch
from torch import nn

from multigpu.errors import UsageError
from multigpu.runtime.device import move_to_device
from multigpu.runtime.precision import Precision
from multigpu.runtime.wrappers import unwrap_module
from multigpu.strategies import state
from multigpu.strategies.activation_checkpointing import ActivationCheckpointing
from multigpu.strategies.compose import Composed, check_composition

__all__ = ["Strategy", "unwrap_module"]


def is_count(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an integer >= 1 (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def parameter_names(model: nn.Module) -> dict[int, str]:
    """``{id(parameter): name}`` of ``model``'s parameters (taken before wrapping)."""
    return {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}


def repoint_optimizers(
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer],
    names: dict[int, str],
    *,
    drop_missing: bool = False,
) -> None:
    """Point every param group of ``optimizers`` at ``model``'s current parameters, by name.

    ``ctx.setup`` takes optimizers built on the user's plain model, as a one-device script builds
    them. FSDP's ``fully_shard`` replaces each parameter by a sharded one, and a meta model gets
    new ones when it is materialized: an optimizer left pointing at the old objects would step
    tensors nobody trains. ``names``: ``parameter_names`` of the model before wrapping; ``model``:
    the plain (unwrapped) model after it. ``drop_missing``: a parameter ``model`` no longer has
    (another pipeline stage's) leaves the optimizer instead of being refused.
    """
    current = dict(model.named_parameters(remove_duplicate=False))
    live = {id(p) for p in current.values()}
    for index, optimizer in enumerate(optimizers):
        replaced = False
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                name = names.get(id(param))
                # Kept: a live parameter, or one not the model's (e.g. a learned loss weight).
                if id(param) in live or name is None:
                    params.append(param)
                    continue
                if name not in current:
                    if drop_missing:
                        continue
                    raise UsageError(
                        f"optimizer {index} ({type(optimizer).__name__}) steps the model's "
                        f"parameter {name!r}, which the strategy's model no longer has; build "
                        "the optimizer on the model given to ctx.setup"
                    )
                params.append(current[name])
                replaced = True
            group["params"] = params
        if replaced and optimizer.state:
            raise UsageError(
                f"optimizer {index} ({type(optimizer).__name__}) already has state, but its "
                "parameters were replaced by the strategy (sharded or materialized); load "
                "optimizer state after ctx.setup (ctx.load, or Checkpointer.resume), not before"
            )


class Strategy(ABC):
    """Places a model on this rank's device and wraps it for data parallelism.

    Subclasses are configured in their constructor and bound to a device and world by
    ``bind`` (done by ``multigpu.init``).
    """

    name: str = "base"
    handles_precision: bool = False
    """True when the strategy applies mixed precision itself (FSDP's MixedPrecisionPolicy);
    otherwise the Context wraps the model's forward in autocast."""
    needs_process_group: bool = False
    """True when the strategy needs a process group even for one process (FSDP's mesh)."""
    forward_is_collective: bool = False
    """True when the model's forward communicates (FSDP all-gathers): every rank must run the
    same number of forwards, so evaluation loaders give a rank short of data an empty batch."""
    compiles: bool = True
    """False when the strategy cannot compile its model's blocks (``init(compile=)`` refused)."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.world_size = 1
        self.sync_batchnorm = False
        self.precision = Precision("32", self.device)
        self.compile: str | None = None
        """The ``torch.compile`` backend of the model's blocks (``init(compile=)``); None: off."""
        self.checkpointing = ActivationCheckpointing("none")
        """The activation checkpointing policy (DDP, FSDP and tensor parallel take one)."""
        self.composed: Composed | None = None
        """What the last ``wrap`` checkpointed and compiled (``strategies.compose``)."""

    def bind(
        self,
        device: torch.device,
        world_size: int,
        *,
        sync_batchnorm: bool = False,
        precision: Precision | None = None,
        compile: str | None = None,
    ) -> None:
        """Attach the strategy to this rank's device, the job's world size, its precision and
        its ``torch.compile`` backend (``compile``: a backend name, or None)."""
        if compile is not None and not self.compiles:
            raise UsageError(
                f"compile={compile!r} with strategy={self.name!r}: this strategy does not "
                "compile its model; use strategy='ddp', 'fsdp' or 'single', or compile=False"
            )
        check_composition(self.checkpointing, compile, owner=type(self).__name__)
        self.device = device
        self.world_size = world_size
        self.sync_batchnorm = sync_batchnorm
        self.precision = precision or Precision("32", device)
        self.compile = compile
        self.validate()

    def validate(self) -> None:  # noqa: B027 - optional hook
        """Raise a UsageError when the strategy cannot run in the bound world."""

    def forward_backward(
        self, model: nn.Module, inputs: tuple[Any, ...], target: Any, loss_fn: Any
    ) -> torch.Tensor | None:
        """Run the forward and backward of one batch in the strategy's own way and return the
        loss (a pipeline's schedule); None: the Context calls the model and ``backward``."""
        return None

    @abstractmethod
    def wrap(self, module: nn.Module) -> nn.Module:
        """Move ``module`` to the device and wrap it; return what the training loop calls.

        A module on the meta device is materialized here (``strategies.materialize``), at the
        point where this strategy knows which part of it this rank holds.
        """

    def setup(self, module: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> nn.Module:
        """Wrap ``module`` and keep ``optimizers`` (built on the plain module) attached to it."""
        names = parameter_names(module)
        wrapped = self.wrap(module)
        repoint_optimizers(unwrap_module(wrapped), optimizers, names)
        # Optimizer state loaded before setup follows the parameters to the device; "step" stays
        # where torch keeps it (CPU for most optimizers).
        for opt_state in (s for optimizer in optimizers for s in optimizer.state.values()):
            for key, value in list(opt_state.items()):
                if isinstance(value, torch.Tensor) and key != "step":
                    opt_state[key] = move_to_device(value, self.device)
        return wrapped

    def unwrap(self, module: nn.Module) -> nn.Module:
        """Return the plain module (no ``module.``/``_orig_mod.`` prefixes in its state dict)."""
        return unwrap_module(module)

    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Skip gradient synchronisation inside the block (no-op unless the wrapper supports it)."""
        return contextlib.nullcontext()

    def join(self, module: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context for uneven inputs across ranks (no-op unless the wrapper supports it)."""
        return contextlib.nullcontext()

    def clip_grad_norm(
        self, module: nn.Module, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradients of ``module`` to ``max_norm``; return the total norm before it."""
        return torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm, norm_type=norm_type)

    # ---- state: what checkpoints save and load ------------------------------------------------
    def model_state(self, module: nn.Module) -> dict[str, Any]:
        """The model's state as this rank holds it (plain tensors; shards under FSDP)."""
        return state.model_state(module)

    def full_model_state(self, module: nn.Module) -> dict[str, Any]:
        """The whole model's state on the CPU, on rank 0 (collective when the model is sharded)."""
        return state.full_model_state(module)

    def tied_names(self, module: nn.Module) -> dict[str, str]:
        """``{later name: first name}`` of the tensors the (unsplit) model holds under several
        names: ``model_state`` holds them once, under the first (the manifest records these)."""
        return state.tied_names(module)

    def optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, *, initialise: bool = False
    ) -> dict[str, Any]:
        """The optimizer's state keyed by parameter names (see ``strategies.state``)."""
        return state.optimizer_state(module, optimizer, initialise=initialise)

    def load_model_state(self, module: nn.Module, saved: Mapping[str, Any]) -> None:
        """Load a state shaped like ``model_state``'s into ``module``."""
        state.load_model_state(module, saved)

    def load_optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]
    ) -> None:
        """Load a state shaped like ``optimizer_state``'s into ``optimizer``."""
        state.load_optimizer_state(module, optimizer, saved)

    @property
    def mesh(self) -> Any:
        """The strategy's ``DeviceMesh`` (None when it uses none)."""
        return None

    def data_shard(self, rank: int, world_size: int) -> tuple[int, int]:
        """(which shard, how many shards) of the data ``rank`` reads: every rank its own by
        default; under tensor parallelism the ranks of one TP group read the same batch."""
        return rank, world_size

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Release what the strategy holds before the process group goes away."""

    def describe(self) -> dict[str, Any]:
        """A short JSON-able description (for logs and metrics)."""
        return {"strategy": self.name, **self.composition()}

    def composition(self) -> dict[str, Any]:
        """What ``describe`` says of compile and activation checkpointing, when they are on:
        ``compile`` (the backend) and ``activation_checkpointing`` (the policy)."""
        described: dict[str, Any] = {}
        if self.compile is not None:
            described["compile"] = self.compile
        if self.checkpointing.on:
            described["activation_checkpointing"] = self.checkpointing.describe()
        return described
