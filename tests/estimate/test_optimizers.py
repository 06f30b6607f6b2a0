"""Optimizer state per parameter: by name, by an object's class and options, measured, assumed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from multigpu.errors import UsageError
from multigpu.estimate import estimate_memory
from multigpu.estimate.optimizers import ASSUMED_STATES, STATES_PER_PARAM, optimizer_state_count


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(3))]


@pytest.mark.parametrize(
    ("make", "name", "states"),
    [
        (lambda p: torch.optim.AdamW(p), "adamw", 2),
        (lambda p: torch.optim.Adam(p, amsgrad=True), "adam", 3),
        (lambda p: torch.optim.SGD(p, lr=0.1), "sgd", 0),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "sgd-momentum", 1),
        (lambda p: torch.optim.RMSprop(p, momentum=0.9, centered=True), "rmsprop", 3),
        (lambda p: torch.optim.Adagrad(p), "adagrad", 1),
    ],
)
def test_an_optimizer_object_is_read_with_its_options(make: Any, name: str, states: int) -> None:
    found = optimizer_state_count(make(_params()))
    assert (found.name, found.states, found.assumption) == (name, states, None)


def test_names_are_case_insensitive_and_unknown_ones_are_refused() -> None:
    assert optimizer_state_count("AdamW").states == STATES_PER_PARAM["adamw"] == 2
    with pytest.raises(UsageError, match=r"optimizer 'lion' is not known .* adamw"):
        optimizer_state_count("lion")


class ThreeStates(torch.optim.Optimizer):
    """A user's optimizer: two full-sized buffers and a scalar per parameter, and one more."""

    def __init__(self, params: Any, lr: float = 0.1) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(
                        a=torch.zeros_like(p), b=torch.zeros_like(p), c=torch.zeros_like(p)
                    )
                    state["count"] = torch.tensor(0.0)  # a scalar: not parameter-sized
                p.add_(p.grad, alpha=-group["lr"])


class NeedsClosure(torch.optim.Optimizer):
    def __init__(self, params: Any) -> None:
        super().__init__(params, {})

    def step(self, closure: Any = None) -> None:
        raise RuntimeError("needs a closure")


def test_other_classes_are_measured_by_one_step_on_a_small_parameter() -> None:
    param = torch.nn.Parameter(torch.ones(5))
    opt = ThreeStates([param])
    found = optimizer_state_count(opt)
    assert (found.name, found.states, found.assumption) == ("threestates", 3, None)
    assert not opt.state and param.grad is None  # the user's optimizer was not touched
    assert (
        estimate_memory(torch.nn.Linear(2, 2), world_size=2, optimizer=opt).of("ddp").optimizer
        == 3 * 4 * 6
    )


def test_an_optimizer_that_cannot_be_asked_is_assumed_adam_like_and_said() -> None:
    found = optimizer_state_count(NeedsClosure(_params()))
    assert found.states == ASSUMED_STATES == 2
    assert found.assumption and "NeedsClosure" in found.assumption
    est = estimate_memory(torch.nn.Linear(2, 2), world_size=2, optimizer=NeedsClosure(_params()))
    assert any("assumed 2 tensors per parameter" in note for note in est.notes)
