"""Logs to argv[2] (trackers argv[1]) on a small file system that fills.

argv[3]: ``flush`` (every ctx.log flushes; the disk fills at step 3: it is full at a flush
during training) or ``end`` (the flushes wait; the disk fills after the last step: it is full
at the last steps' flush, as the block ends).
"""

import os
import sys

import torch

import multigpu
from multigpu.instruments.tracking import dispatch

names, log_dir, when = sys.argv[1], sys.argv[2], sys.argv[3]
dispatch.FLUSH_EVERY_S = 0.0 if when == "flush" else 3600.0


def fill(directory: str) -> None:
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"x" * 4096)
        except OSError:
            pass


with multigpu.init(seed=0, log_to=names, log_dir=log_dir) as ctx:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)
    for step in range(1, 11):
        loss = model(torch.ones(2, 4)).sum()
        ctx.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        ctx.log({"loss": loss, "a": 1.0}, step=step)
        if step == 3 and ctx.is_main and when == "flush":
            fill(os.path.dirname(log_dir))
    ctx.print("trained 10 steps")
    if ctx.is_main and when == "end":  # after the steps: no rank is slower at them
        fill(os.path.dirname(log_dir))
