"""Loads the checkpoint ``argv[1]`` into a small model under DDP: the damaged-checkpoint
endings test's worker script (``argv[2]``, when given: the model's width, 16 as saved)."""

import sys

import torch

import multigpu

width = int(sys.argv[2]) if len(sys.argv) > 2 else 16
with multigpu.init(seed=0, strategy="ddp") as ctx:
    model = ctx.setup(torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Linear(width, 4)))
    ctx.load(sys.argv[1], {"model": model})
    ctx.print("loaded")
