"""The job ``benchmarks/exit_repeat.py`` runs again and again: a short, finished DDP run.

ctx.setup with DDP, a few steps, a synchronous and an asynchronous checkpoint (the async one
makes the checkpointer's own gloo group), a straggler report at the end, then a normal exit:
every thread and torch object that exists at the end of a real job exists here.

Usage: multigpu run --cpu 2 job.py CHECKPOINT_DIR
"""

import sys

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu

with multigpu.init(seed=0, strategy="ddp") as ctx:
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(data, batch_size=64)
    ckpt = ctx.checkpointer(sys.argv[1], keep=2, async_save=True, model=model, optimizer=optimizer)
    for x, y in loader:
        ctx.backward(F.cross_entropy(model(x), y))
        ctx.step(optimizer)
        ckpt.step()
    ckpt.save()  # in the background: still running when the script leaves the block
    ctx.print(f"loss {ctx.all_reduce(F.cross_entropy(model(x), y).item()):.4f}")
