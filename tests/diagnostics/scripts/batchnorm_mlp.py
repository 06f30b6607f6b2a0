"""An MLP with a BatchNorm layer for ``multigpu verify`` tests, synchronized across ranks.

``multigpu.init(sync_batchnorm=True)``: its statistics cover the global batch at every world
size, so what differs between world sizes is float rounding (sums in another order, compounded
by SGD's learning rate and momentum), not BatchNorm.
"""

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu

with multigpu.init(seed=0, sync_batchnorm=True) as ctx:
    g = torch.Generator().manual_seed(0)  # the data is the same in every run
    data = TensorDataset(
        torch.randn(1024, 16, generator=g), torch.randint(0, 4, (1024,), generator=g)
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(data, batch_size=32)
    for _epoch in range(4):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            ctx.backward(loss)
            optimizer.step()
