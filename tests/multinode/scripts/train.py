"""Train a small MLP for a few steps on fixed data; rank 0 writes the final parameters.

Usage: multigpu run ... train.py OUT.pt [--steps N] [--sleep S]

``--sleep`` waits S seconds after each step (a job that is still running when a test cuts a
link); each step prints ``step N`` on rank 0, so the test sees the job train.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()

with multigpu.init(seed=0) as ctx:
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(512, 16, generator=generator), torch.randint(0, 4, (512,)))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(data, batch_size=64)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            ctx.backward(loss)
            optimizer.step()
            step += 1
            ctx.print(f"step {step} on {ctx.world_size} ranks ({ctx.num_nodes} nodes)")
            time.sleep(args.sleep)
            if step == args.steps:
                break
    if ctx.is_main:
        torch.save(ctx.unwrap(model).state_dict(), args.out)
