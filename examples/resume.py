"""Checkpoints and resume: stop this script at any point (Ctrl-C, kill -9) and start it again.

multigpu run --cpu 2 --max-restarts 3 examples/resume.py     # restarts resume by themselves
python examples/resume.py                                    # any world size resumes too
"""

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu

EPOCHS = 10  # 16 steps each

with multigpu.init(seed=0) as ctx:
    data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=40, gamma=0.5)
    model, optimizer = ctx.setup(model, optimizer)
    loader = ctx.loader(data, batch_size=256)
    ckpt = ctx.checkpointer(
        "runs/ckpt",
        every_steps=20,
        keep=3,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        loader=loader,
    )
    ckpt.resume()  # the newest complete checkpoint, if any: everything restored
    while loader.epoch < EPOCHS:  # a resumed run continues mid-epoch, at the same global sample
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            ctx.backward(loss)
            ctx.step(optimizer)
            scheduler.step()
            ckpt.step()  # counts the optimizer step; saves every 20
        ctx.print(f"epoch {loader.epoch} step {ckpt.steps} loss {ctx.all_reduce(loss.item()):.4f}")
