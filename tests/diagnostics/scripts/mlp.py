"""A user-style training script for ``multigpu verify`` tests: a small MLP on random data.

``--dropout P`` adds a Dropout layer; ``--per-rank-batch B`` makes the loader's batch
``B * world_size`` (the classic mistake: a per-rank batch size, so the global batch grows);
``--unseeded`` initialises the model from an unseeded generator.
"""

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu

parser = argparse.ArgumentParser()
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--per-rank-batch", type=int, default=0)
parser.add_argument("--unseeded", action="store_true")
args = parser.parse_args()

with multigpu.init(seed=None if args.unseeded else 0) as ctx:
    g = torch.Generator().manual_seed(0)  # the data is the same in every run
    data = TensorDataset(
        torch.randn(1024, 16, generator=g), torch.randint(0, 4, (1024,), generator=g)
    )
    layers = [torch.nn.Linear(16, 32), torch.nn.ReLU()]
    if args.dropout:
        layers.append(torch.nn.Dropout(args.dropout))
    model = torch.nn.Sequential(*layers, torch.nn.Linear(32, 4))
    if args.unseeded:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(torch.seed())))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    batch = args.per_rank_batch * ctx.world_size if args.per_rank_batch else 32
    loader = ctx.loader(data, batch_size=batch)
    for _epoch in range(4):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            ctx.backward(loss)
            optimizer.step()
