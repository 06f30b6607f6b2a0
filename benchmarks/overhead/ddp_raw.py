"""(a) Hand-written DDP: torchrun, init_process_group, DistributedDataParallel, DistributedSampler.

Run:  torchrun --nproc-per-node 2 benchmarks/overhead/ddp_raw.py   (settings: see workload.py)

Environment variables read: torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT`` (through ``init_process_group``), and ``BENCH_*`` (see workload.py).
"""

from __future__ import annotations

import gc

import torch.distributed as dist
import torch.nn.functional as F
import workload
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


def main() -> None:
    cfg = workload.settings()
    dist.init_process_group("gloo")
    world_size = dist.get_world_size()
    model = DistributedDataParallel(workload.build_model(cfg))
    workload.require_data_parallel(cfg, model, "ddp")
    optimizer = workload.make_optimizer(model)
    dataset = workload.build_dataset(cfg)
    # In order (see workload.py): each rank takes every world_size-th sample.
    sampler: DistributedSampler[int] = DistributedSampler(dataset, shuffle=False, drop_last=True)
    loader = DataLoader(
        dataset, batch_size=cfg.batch // world_size, sampler=sampler, drop_last=True
    )
    clock = workload.StepClock(cfg.warmup)
    clock.start()
    epoch = 0
    while clock.steps < cfg.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            clock.tick(len(x))
            if clock.steps == cfg.steps:
                break
        epoch += 1
    workload.write_result(cfg, "ddp", clock, loss, model)
    # torch 2.13 can deadlock at exit when the DDP object outlives the group (DESIGN.md).
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
