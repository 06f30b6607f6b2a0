"""All-reduce in a loop until stopped; each rank writes its pid to ``argv[1]/pid-RANK`` first."""

import os
import sys
import time
from pathlib import Path

import torch

import multigpu

with multigpu.init() as ctx:
    (Path(sys.argv[1]) / f"pid-{ctx.rank}").write_text(str(os.getpid()))
    value = torch.ones(1)
    while True:
        ctx.all_reduce(value)
        time.sleep(0.05)
