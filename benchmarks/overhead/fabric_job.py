"""(d) Lightning Fabric: Fabric(accelerator="cpu", strategy="ddp") + setup + fabric.backward.

Run:  torchrun --nproc-per-node 2 benchmarks/overhead/fabric_job.py   (settings: see workload.py)

Environment variables read: what ``Fabric`` reads (torchrun's variables, ``PL_*``) and
``BENCH_*`` (see workload.py).
"""

from __future__ import annotations

import os

import torch.distributed as dist
import torch.nn.functional as F
import workload
from lightning.fabric import Fabric
from torch.utils.data import DataLoader


def main() -> None:
    cfg = workload.settings()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=world_size)
    fabric.launch()  # under torchrun: joins the process group, starts nothing
    model = workload.build_model(cfg)
    optimizer = workload.make_optimizer(model)
    model, optimizer = fabric.setup(model, optimizer)
    workload.require_data_parallel(cfg, model, "fabric")
    # In order (see workload.py); setup_dataloaders puts a DistributedSampler in.
    loader = DataLoader(
        workload.build_dataset(cfg),
        batch_size=cfg.batch // fabric.world_size,
        shuffle=False,
        drop_last=True,
    )
    loader = fabric.setup_dataloaders(loader)
    clock = workload.StepClock(cfg.warmup)
    clock.start()
    epoch = 0
    while clock.steps < cfg.steps:
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            clock.tick(len(x))
            if clock.steps == cfg.steps:
                break
        epoch += 1
    workload.write_result(cfg, "fabric", clock, loss, model)
    del model, optimizer
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
