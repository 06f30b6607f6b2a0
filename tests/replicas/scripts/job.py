"""A job for the replica-group tests, written for one process: nothing in it knows of replicas.

Writes, under OUT (argv[1]): ``pid-<group>-<rank>-<restart>`` at start, one line per stepped
optimizer step to ``steps-<group>-<rank>`` (the wall time and the global step it ended: the
loader's position), and the final parameters to ``params-<group>-<rank>.pt`` (group ``plain``
without --replicas). ``JOB_SLEEP`` paces a step; ``JOB_CKPT_EVERY=N`` checkpoints every N steps
into OUT/ckpt and resumes from there (a restarted plain run).
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu

out = Path(sys.argv[1])
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
pause = float(os.environ.get("JOB_SLEEP", "0"))
group = os.environ.get("MULTIGPU_REPLICA_GROUP", "plain")
with multigpu.init(seed=0) as ctx:
    tag = f"{group}-{ctx.rank}"
    (out / f"pid-{tag}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}").write_text(
        str(os.getpid())
    )
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(800, 8, generator=g), torch.randn(800, 1, generator=g))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(data, batch_size=16)
    every = int(os.environ.get("JOB_CKPT_EVERY", "0"))
    ckpt = None
    if every:
        ckpt = ctx.checkpointer(
            out / "ckpt", every_steps=every, model=model, optimizer=optimizer, loader=loader
        )
        ckpt.resume()
    with open(out / f"steps-{tag}", "a") as steps:
        while loader.epoch < epochs:  # bounded by the loader's epoch: a healed group's too
            for x, y in loader:
                optimizer.zero_grad()
                ctx.backward(F.mse_loss(model(x), y))
                if ctx.step(optimizer):
                    position = loader.epoch * 50 + loader.state_dict()["cursor"] // 16
                    steps.write(f"{time.time()} {position}\n")
                    steps.flush()
                    if ckpt is not None:
                        ckpt.step()
                time.sleep(pause)
    params = {k: v.detach().clone() for k, v in ctx.unwrap(model).state_dict().items()}
    torch.save(params, out / f"params-{tag}.pt")
