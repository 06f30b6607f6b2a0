"""A tiny training script for the `multigpu bench scaling` tests: an MLP on random data.

It would train for 100 epochs (1600 steps); the benchmark stops it after the steps it times.
"""

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu

with multigpu.init(seed=0) as ctx:
    data = TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(data, batch_size=32)
    for _epoch in range(100):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            ctx.backward(loss)
            optimizer.step()
    ctx.print("finished all 100 epochs")  # the benchmark must have stopped it long before
