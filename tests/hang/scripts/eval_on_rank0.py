"""Rank 0 alone runs a collective in its evaluation: the classic DDP deadlock."""

import torch
import torch.nn.functional as F

import multigpu


def evaluate(ctx, model):
    correct = torch.tensor(1.0)
    return ctx.all_reduce(correct)  # a collective that rank 1 never joins


with multigpu.init(seed=0) as ctx:
    model = ctx.setup(torch.nn.Linear(4, 2))
    for step in range(6):
        loss = F.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 2, (8,)))
        ctx.backward(loss)
        if step == 3 and ctx.is_main:
            evaluate(ctx, model)
    ctx.print("finished")
