"""The tutorials' model parallel (one process, submodules on two devices, activations moved in
``forward``) through ``place_stages``: the tutorial's model ported to it trains with the same
losses as the original, each stage lands on its device, and bad split points or device lists
are one-line errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from multigpu.errors import UsageError
from multigpu.strategies.model_parallel import place_stages, stage_of


class TutorialToyModel(nn.Module):
    """The original, from "Single-Machine Model Parallel Best Practices" (devices as arguments
    instead of "cuda:0" and "cuda:1", so that it runs on the CPU)."""

    def __init__(self, dev0: str, dev1: str) -> None:
        super().__init__()
        self.dev0, self.dev1 = dev0, dev1
        self.net1 = nn.Linear(10, 10).to(dev0)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5).to(dev1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.net1(x.to(self.dev0)))
        return self.net2(x.to(self.dev1))


class ToyModel(nn.Module):
    """The same model ported to the recipe: no device in it at all."""

    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def _losses(model: nn.Module, out_device: str, steps: int = 30) -> list[float]:
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(20, 10, generator=g), torch.randn(20, 5, generator=g)) for _ in range(5)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        inputs, labels = data[step % len(data)]
        optimizer.zero_grad()
        loss = nn.MSELoss()(model(inputs), labels.to(out_device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def run_both(devices: list[str]) -> tuple[list[float], list[float]]:
    """The tutorial's losses and the ported model's, on ``devices`` (also the GPU test's)."""
    torch.manual_seed(0)
    original = _losses(TutorialToyModel(*devices), devices[1])
    torch.manual_seed(0)
    ported = place_stages(ToyModel(), ["net2"], devices)
    return original, _losses(ported, devices[-1])


def test_the_tutorials_model_ported_to_place_stages_gives_the_same_losses() -> None:
    original, ported = run_both(["cpu", "cpu"])
    assert ported == original
    assert original[-1] < 0.9 * original[0]  # it learns: the comparison is not of constants


def test_each_stage_is_on_its_device_and_activations_follow() -> None:
    # "meta" stands in for a second device on a machine without one: net2's weights go there,
    # and net1's output is moved to it by the hook (else the forward would mix devices).
    model = place_stages(ToyModel(), ["net2"], ["cpu", "meta"])
    assert model.net1.weight.device.type == "cpu" and model.net2.weight.device.type == "meta"
    assert model(torch.ones(3, 10)).device.type == "meta"
    assert stage_of(ToyModel(), ["net2"]) == {"": 0, "net1": 0, "relu": 0, "net2": 1}


def test_bad_split_points_and_device_lists_are_one_line_errors() -> None:
    with pytest.raises(UsageError, match=r"split_points \['net3'\] name no submodule"):
        place_stages(ToyModel(), ["net3"], ["cpu", "cpu"])
    with pytest.raises(UsageError, match="give one device per stage"):
        place_stages(ToyModel(), ["net2"], ["cpu"])
    with pytest.raises(UsageError, match="not in the model's order"):
        place_stages(ToyModel(), ["net2", "relu"], ["cpu", "cpu", "cpu"])
