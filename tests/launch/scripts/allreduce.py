"""A plain torchrun script (no multigpu): all-reduce the ranks, write one result file per rank.

Usage: torchrun --nproc-per-node N allreduce.py OUT_DIR
"""

import json
import os
import sys

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
world_size = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
result = {
    "rank": rank,
    "local_rank": local_rank,
    "world_size": world_size,
    "sum": total.item(),
    "env": {
        k: os.environ.get(k)
        for k in (
            "OMP_NUM_THREADS",
            "MKL_NUM_THREADS",
            "MULTIGPU_DEVICE",
            "MULTIGPU_BACKEND",
            "CUDA_VISIBLE_DEVICES",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
        )
    },
    "args": sys.argv[2:],
}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as fh:
    json.dump(result, fh)
dist.destroy_process_group()
