"""(c) HuggingFace Accelerate: Accelerator(cpu=True) + prepare + accelerator.backward.

Run:  torchrun --nproc-per-node 2 benchmarks/overhead/accelerate_job.py   (settings: workload.py)

``cpu=True`` is required: without it, on a machine without a GPU, ``Accelerator()`` under
torchrun even creates a process group but reports ``num_processes == 1`` and
``DistributedType.NO``: no DDP, no sharded loader, every process trains alone on the whole data,
silently.

Environment variables read: what ``Accelerator`` reads (torchrun's variables, ``ACCELERATE_*``)
and ``BENCH_*`` (see workload.py).
"""

from __future__ import annotations

import gc

import torch.nn.functional as F
import workload
from accelerate import Accelerator, DistributedType
from torch.utils.data import DataLoader


def main() -> None:
    cfg = workload.settings()
    accelerator = Accelerator(cpu=True)
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        raise SystemExit(
            f"Accelerate runs {accelerator.num_processes} process(es) "
            f"({accelerator.distributed_type}); expected MULTI_CPU: launch under torchrun with "
            "cpu=True"
        )
    model = workload.build_model(cfg)
    optimizer = workload.make_optimizer(model)
    # In order (see workload.py). The per-process batch: prepare() deals whole batches
    # round-robin to the processes, so the global batch is batch_size x processes.
    loader = DataLoader(
        workload.build_dataset(cfg),
        batch_size=cfg.batch // accelerator.num_processes,
        shuffle=False,
        drop_last=True,
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    workload.require_data_parallel(cfg, model, "accelerate")
    clock = workload.StepClock(cfg.warmup)
    clock.start()
    while clock.steps < cfg.steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            clock.tick(len(x))
            if clock.steps == cfg.steps:
                break
    workload.write_result(cfg, "accelerate", clock, loss, model)
    # torch 2.13 can abort at exit ("terminate called without an active exception") when a DDP
    # object outlives the group (DESIGN.md): the Accelerator keeps the prepared objects too.
    accelerator.free_memory()
    del model, optimizer, loader
    gc.collect()
    accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main()
