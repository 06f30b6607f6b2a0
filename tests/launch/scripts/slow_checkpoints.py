"""Trains a tiny model slowly, checkpointing every step under argv[1], for argv[2] steps.

Each worker writes its pid to ``argv[1]/../pids/<rank>``; rank 0 prints ``resumed at step N``.
"""

import os
import sys
import time
from pathlib import Path

import torch

import multigpu

directory, steps = Path(sys.argv[1]), int(sys.argv[2])
with multigpu.init(seed=0) as ctx:
    pids = directory.parent / "pids"
    pids.mkdir(exist_ok=True)
    (pids / str(ctx.rank)).write_text(str(os.getpid()))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    ckpt = ctx.checkpointer(directory, every_steps=1, model=model, optimizer=optimizer)
    ckpt.resume()
    ctx.print(f"resumed at step {ckpt.steps}")
    while ckpt.steps < steps:
        loss = model(torch.ones(2, 4)).sum()
        ctx.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        ckpt.step()
        time.sleep(0.2)
    ctx.print(f"finished at step {ckpt.steps}")
