"""``unwrap_module`` knows a split model (a pipeline's stages) by its type: no pretending to be
``torch.compile``'s wrapper."""

from __future__ import annotations

import torch
from torch import nn

from multigpu.runtime.wrappers import SplitModel, unwrap_module


class _Half(SplitModel):
    """A stand-in for a pipeline's stages: it holds the second layer of a two-layer model."""

    def __init__(self) -> None:
        super().__init__()
        self.stage = nn.Linear(2, 2)
        self.plain = nn.Module()
        self.plain.add_module("1", self.stage)


def test_a_split_model_unwraps_to_its_plain_view_and_saves_its_names() -> None:
    half = _Half()
    assert unwrap_module(half) is half.plain
    assert unwrap_module(nn.parallel.DataParallel(half)) is half.plain
    assert not hasattr(half, "_orig_mod")
    assert sorted(half.state_dict()) == ["1.bias", "1.weight"]  # the whole model's names
    half.load_state_dict({"1.weight": torch.zeros(2, 2), "1.bias": torch.ones(2)})
    assert half.stage.weight.abs().sum() == 0 and half.stage.bias.sum() == 2
