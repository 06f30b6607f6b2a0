"""A script that loads a checkpoint of another model's shape: one line, exit 2, nothing written."""

import sys
import tempfile

import torch

import multigpu

with multigpu.init() as ctx:
    where = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    ctx.save(f"{where}/small", {"model": ctx.setup(torch.nn.Linear(4, 3))})
    ctx.load(f"{where}/small", {"model": ctx.setup(torch.nn.Linear(5, 3))})
