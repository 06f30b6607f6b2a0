"""Logs a value no tracker takes (a string) at step 2, to the trackers of argv[1] in argv[2]."""

import sys

import torch

import multigpu

with multigpu.init(seed=0, log_to=sys.argv[1], log_dir=sys.argv[2]) as ctx:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    for step in range(1, 4):
        loss = model(torch.ones(2, 4)).sum()
        ctx.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        ctx.log({"loss": loss if step != 2 else "high"}, step=step)
