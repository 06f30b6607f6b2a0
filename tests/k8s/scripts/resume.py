"""Train a small MLP with a Checkpointer; a restart resumes from its newest complete checkpoint.

Usage: multigpu run ... resume.py CKPT_DIR OUT.pt [--epochs N] [--sleep S]

Rank 0 prints ``resumed at step N on W ranks`` after a resume, ``step N on W ranks`` after each
step, and writes the final parameters to OUT.pt.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu

parser = argparse.ArgumentParser()
parser.add_argument("ckpt_dir")
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()

with multigpu.init(seed=0) as ctx:
    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(512, 16, generator=generator), torch.randint(0, 4, (512,)))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(data, batch_size=64)
    ckpt = ctx.checkpointer(
        args.ckpt_dir, every_steps=4, keep=2, model=model, optimizer=optimizer, loader=loader
    )
    if ckpt.resume() is not None:
        ctx.print(f"resumed at step {ckpt.steps} on {ctx.world_size} ranks")
    while loader.epoch < args.epochs:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            ctx.backward(loss)
            ctx.step(optimizer)
            ckpt.step()
            ctx.print(f"step {ckpt.steps} on {ctx.world_size} ranks")
            time.sleep(args.sleep)
    if ctx.is_main:
        torch.save(ctx.unwrap(model).state_dict(), args.out)
