"""Trains slowly, logging to argv[3] (trackers argv[2], "" for none) and checkpointing every
step under argv[1]: Ctrl-C comes while it runs. Optional argv[4]: a profile window."""

import sys
import time

import torch

import multigpu

directory, names, log_dir = sys.argv[1], sys.argv[2] or None, sys.argv[3]
profile = sys.argv[4] if len(sys.argv) > 4 else None
with multigpu.init(seed=0, log_to=names, log_dir=log_dir, profile=profile,
                   profile_dir=f"{log_dir}/profile") as ctx:  # fmt: skip
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    ckpt = ctx.checkpointer(directory, every_steps=1, model=model, optimizer=optimizer)
    while ckpt.steps < 100000:
        loss = model(torch.ones(2, 4)).sum()
        ctx.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        ckpt.step()
        ctx.log({"loss": loss}, step=ckpt.steps)
        time.sleep(0.2)
