"""A pipelined model whose forward branches on a tensor's values (torch.export refuses it)."""

import torch
from torch import nn

import multigpu


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # the data-dependent branch
            return self.linear(x)
        return x


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Gate(), Gate())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


strategy = multigpu.PipelineStrategy(example_input=torch.ones(4, 4), microbatches=2)
with multigpu.init(strategy=strategy) as ctx:
    model = Model()
    model, optimizer = ctx.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
