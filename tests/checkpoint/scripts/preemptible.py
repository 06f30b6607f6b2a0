"""Trains until stopped, with save_on_sigterm: the preemption test's worker script.

Writes ``DIR/rank-N.pid`` once it has done a few steps, so the test knows whom to signal.
"""

import os
import sys
import time
from pathlib import Path

import torch

import multigpu

directory = Path(sys.argv[1])
with multigpu.init(seed=0) as ctx:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = ctx.setup(model, optimizer)
    ckpt = ctx.checkpointer(
        directory / "ckpt", save_on_sigterm=True, model=model, optimizer=optimizer
    )
    for step in range(100_000):
        ctx.backward(model(torch.ones(8, 4)).pow(2).mean())
        ctx.step(optimizer)
        ckpt.step()
        if step == 5:
            (directory / f"rank-{ctx.rank}.pid").write_text(str(os.getpid()))
        time.sleep(0.01)
