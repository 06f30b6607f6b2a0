"""A multigpu script given a global batch its 2 processes cannot share: it exits 2, as told."""

import sys

import torch
from torch.utils.data import TensorDataset

import multigpu

with multigpu.init() as ctx:
    try:
        ctx.loader(TensorDataset(torch.zeros(10)), batch_size=3)
    except multigpu.UsageError as e:
        ctx.print(f"error: {e}")
        sys.exit(2)
