"""How many parameter-sized tensors an optimizer keeps per parameter (its state).

Known by name for torch's optimizers (``adamw``: ``exp_avg`` and ``exp_avg_sq``, 2; SGD with
momentum: the momentum buffer, 1; plain SGD: 0). An optimizer object of any other class is
asked: a copy of it steps once on a tiny parameter and its full-sized state tensors are counted.
When even that fails (a closure-only optimizer such as L-BFGS), Adam's 2 is assumed and said.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multigpu.errors import UsageError

STATES_PER_PARAM = {
    "adam": 2, "adamw": 2, "adamax": 2, "nadam": 2, "radam": 2, "adadelta": 2, "rprop": 2,
    "sparseadam": 2, "sgd-momentum": 1, "rmsprop": 1, "adagrad": 1, "asgd": 1, "sgd": 0,
}  # fmt: skip
"""Parameter-sized state tensors per parameter, by optimizer name (scalar ``step`` counters,
a few bytes each, are left out)."""

ASSUMED_STATES = 2
"""What an optimizer that cannot be asked is taken to keep (Adam's, the common case)."""


@dataclass(frozen=True, kw_only=True)
class OptimizerStates:
    """An optimizer's state per parameter, and how that was found."""

    name: str
    """Lower-case name: ``adamw``, ``sgd-momentum``, ``sgd``, or an unknown class's name."""
    states: int
    """Parameter-sized tensors kept per parameter."""
    assumption: str | None = None
    """Said when ``states`` was assumed rather than known or measured; None otherwise."""

    @property
    def step_copies(self) -> int:
        """Parameter-sized temporaries of one step in torch's foreach implementation (the
        default on GPUs): Adam-like optimizers, RMSprop and Adagrad take the square root of a
        state into a new list of tensors as large as the parameters (1); SGD works in place (0).
        The CPU's per-tensor loop holds two copies of one tensor at a time instead.

        Example:
            >>> optimizer_state_count("adamw").step_copies, optimizer_state_count("sgd").step_copies
            (1, 0)
        """
        return 0 if self.states == 0 or self.name in ("sgd", "sgd-momentum") else 1


def optimizer_state_count(optimizer: str | torch.optim.Optimizer) -> OptimizerStates:
    """The state an optimizer (or an optimizer name) keeps per parameter.

    Args:
        optimizer: a name from ``STATES_PER_PARAM`` (any case) or an optimizer object; for an
            object the options matter (``momentum`` of SGD, ``amsgrad`` of Adam, ``centered``
            of RMSprop).

    Raises:
        UsageError: a name that is not known.

    Example:
        >>> optimizer_state_count("AdamW").states, optimizer_state_count("sgd").states
        (2, 0)
    """
    if isinstance(optimizer, torch.optim.Optimizer):
        return _of_object(optimizer)
    name = str(optimizer).lower()
    if name not in STATES_PER_PARAM:
        raise UsageError(
            f"optimizer {optimizer!r} is not known to the memory estimate; expected one of "
            f"{', '.join(sorted(STATES_PER_PARAM))}, or pass the optimizer object itself"
        )
    return OptimizerStates(name=name, states=STATES_PER_PARAM[name])


def _of_object(optimizer: torch.optim.Optimizer) -> OptimizerStates:
    groups = optimizer.param_groups
    name = type(optimizer).__name__.lower()

    def option(key: str) -> bool:
        return any(bool(group.get(key)) for group in groups)

    if type(optimizer) is torch.optim.SGD:
        momentum = option("momentum")
        return OptimizerStates(name="sgd-momentum" if momentum else "sgd", states=int(momentum))
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        # amsgrad keeps the running maximum of exp_avg_sq too
        return OptimizerStates(name=name, states=3 if option("amsgrad") else 2)
    if type(optimizer) is torch.optim.RMSprop:
        return OptimizerStates(name=name, states=1 + option("momentum") + option("centered"))
    if type(optimizer).__module__.startswith("torch.optim") and name in STATES_PER_PARAM:
        return OptimizerStates(name=name, states=STATES_PER_PARAM[name])
    measured = _measure(optimizer)
    if measured is not None:
        return OptimizerStates(name=name, states=measured)
    return OptimizerStates(
        name=name,
        states=ASSUMED_STATES,
        assumption=f"{type(optimizer).__name__}'s state could not be measured (one step on a "
        f"small parameter failed): assumed {ASSUMED_STATES} tensors per parameter, like Adam",
    )


def _measure(optimizer: torch.optim.Optimizer) -> int | None:
    """Full-sized state tensors a fresh copy of ``optimizer`` makes for one parameter."""
    probe = torch.nn.Parameter(torch.ones(8, 8))
    try:
        fresh = type(optimizer)([probe], **optimizer.defaults)
        probe.grad = torch.full_like(probe, 0.5)
        fresh.step()
    except Exception:  # any failure of user code means "cannot ask"; the caller assumes
        return None
    state = fresh.state.get(probe, {})
    return sum(
        1 for value in state.values() if isinstance(value, torch.Tensor) and value.numel() == 64
    )
