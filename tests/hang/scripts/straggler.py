"""Rank 1 loads its data 30 ms slower per step: it is named a straggler at the end."""

import time

import torch
import torch.nn.functional as F

import multigpu

with multigpu.init(seed=0) as ctx:
    model = ctx.setup(torch.nn.Linear(4, 2))
    for _ in range(15):
        if ctx.rank == 1:
            time.sleep(0.03)  # slow data loading on one rank
        loss = F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
        ctx.backward(loss)
