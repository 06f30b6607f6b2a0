"""Train a step with DDP, finish normally, then let global rank 1 abort at interpreter exit.

The abort (SIGABRT, after every collective is done) stands for the teardown crash of issue 17:
one node's worker fails once the other node's workers have finished.

Usage: multigpu run ... abort_at_exit.py
"""

import atexit
import os
import time

import torch
import torch.nn.functional as F

import multigpu

with multigpu.init(seed=0, strategy="ddp") as ctx:
    net = torch.nn.Linear(4, 2)
    model, optimizer = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    ctx.backward(F.mse_loss(model(torch.randn(8, 4)), torch.zeros(8, 2)))
    ctx.step(optimizer)
    print(f"rank {ctx.rank} trained at {time.time():.3f}", flush=True)  # (the test's clock)
    if ctx.rank == 1:
        atexit.register(os.abort)
