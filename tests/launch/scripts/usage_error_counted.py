"""A script that refuses its input (a UsageError escaping ``multigpu.init``), counting its
starts in the file argv[1]: a restart could not help, so the launcher must not make one."""

import sys

import torch
from torch.utils.data import TensorDataset

import multigpu

with multigpu.init() as ctx, open(sys.argv[1], "a") as starts:
    starts.write(f"{ctx.rank}\n")
    starts.flush()
    ctx.loader(TensorDataset(torch.zeros(10)), batch_size=3)  # 2 processes cannot share 3
