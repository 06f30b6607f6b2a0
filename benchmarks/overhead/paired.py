"""All four frameworks in the same two processes, taking turns in short blocks of steps.

Separate runs of each framework are at the mercy of whatever else the machine does during them:
on a shared 2-core machine two runs of the same job differ by 30 % and more. Here the four train
side by side in the same processes and process group, each its own copy of the model (the same
initial weights) with its own loader over the same data, in blocks of ``BENCH_BLOCK`` steps —
ddp, multigpu, accelerate, fabric, then the next block starting one further along — so a
disturbance falls on neighbouring blocks of every contender alike. Each block's time is compared
with the hand-written DDP block of the same round.

Two more contenders take turns with them to split multigpu's difference: hand-written DDP with
only ``ctx.loader`` swapped in, and with only ``ctx.backward`` (which records the backward for
the hang explainer). Besides wall and process CPU time, each block's CPU time of the main thread
alone is kept: it leaves out gloo's and the watchdog's threads and the time spent waiting for
the other rank, so it resolves a few microseconds of extra Python per step, which is how
multigpu's own work is measured where it runs — between the forward and backward passes, with
cold caches, it costs several times what the same code costs in a tight loop (extra_work.py).

What this cannot see: costs that one contender adds to the whole process (multigpu's watchdog
and liveness threads, Accelerate's and Fabric's set-up) fall on all of them here. The separate
runs and their CPU-time column show those.

Run:  multigpu run --cpu 2 benchmarks/overhead/paired.py   (BENCH_STEPS steps each)

Environment variables read: ``BENCH_*`` (see workload.py), ``BENCH_BLOCK`` (steps per block,
default 10), and what ``multigpu.init``, ``Accelerator`` and ``Fabric`` read.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
import workload
from accelerate import Accelerator, DistributedType
from lightning.fabric import Fabric
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import multigpu

Step = Callable[[], torch.Tensor]


def endless(loader: Any, sampler: Any = None) -> Iterator[Any]:
    """Batches of ``loader``, epoch after epoch (``sampler.set_epoch`` as a user would)."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


ROWS: dict[str, set[int]] = {}
"""Samples per batch each contender saw on this rank (checked: one value, batch / world)."""


def sgd_step(
    name: str,
    model: nn.Module,
    optimizer: Any,
    batches: Iterator[Any],
    backward: Callable[[Any], None],
) -> Step:
    """One training step of a contender: next batch, forward, zero_grad, backward, update."""
    rows = ROWS.setdefault(name, set())

    def step() -> torch.Tensor:
        x, y = next(batches)
        rows.add(len(x))
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        backward(loss)
        optimizer.step()
        return loss

    return step


def contenders(ctx: multigpu.Context, cfg: workload.Settings) -> dict[str, tuple[Step, nn.Module]]:
    """The set-ups of ddp_raw.py, multigpu_job.py, accelerate_job.py and fabric_job.py, and
    hand-written DDP with one piece of multigpu each (``ctx.loader``, ``ctx.backward``)."""
    world, dataset = ctx.world_size, workload.build_dataset(cfg)
    out: dict[str, tuple[Step, nn.Module]] = {}

    model: Any = DistributedDataParallel(workload.build_model(cfg))
    optimizer: Any = workload.make_optimizer(model)
    sampler: Any = DistributedSampler(dataset, shuffle=False, drop_last=True)
    loader: Any = DataLoader(
        dataset, batch_size=cfg.batch // world, sampler=sampler, drop_last=True
    )
    out["ddp"] = (
        sgd_step("ddp", model, optimizer, endless(loader, sampler), _plain_backward),
        model,
    )

    model = workload.build_model(cfg)
    model, optimizer = ctx.setup(model, workload.make_optimizer(model))
    loader = ctx.loader(dataset, batch_size=cfg.batch, shuffle=False, drop_last=True)
    out["multigpu"] = (sgd_step("multigpu", model, optimizer, endless(loader), ctx.backward), model)

    accelerator = Accelerator(cpu=True)  # joins the existing process group
    model = workload.build_model(cfg)
    loader = DataLoader(dataset, batch_size=cfg.batch // world, shuffle=False, drop_last=True)
    model, optimizer, loader = accelerator.prepare(model, workload.make_optimizer(model), loader)
    out["accelerate"] = (
        sgd_step("accelerate", model, optimizer, endless(loader), accelerator.backward),
        model,
    )

    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=world)
    fabric.launch()  # the process group exists: nothing to start
    model = workload.build_model(cfg)
    model, optimizer = fabric.setup(model, workload.make_optimizer(model))
    loader = DataLoader(dataset, batch_size=cfg.batch // world, shuffle=False, drop_last=True)
    loader = fabric.setup_dataloaders(loader)
    out["fabric"] = (
        sgd_step("fabric", model, optimizer, endless(loader, loader.sampler), fabric.backward),
        model,
    )
    # multigpu's two per-step pieces, each alone in the hand-written DDP loop.
    model = DistributedDataParallel(workload.build_model(cfg))
    loader = ctx.loader(dataset, batch_size=cfg.batch, shuffle=False, drop_last=True)
    out["ddp + ctx.loader"] = (
        sgd_step(
            "ddp + ctx.loader",
            model,
            workload.make_optimizer(model),
            endless(loader),
            _plain_backward,
        ),
        model,
    )
    model = DistributedDataParallel(workload.build_model(cfg))
    sampler = DistributedSampler(dataset, shuffle=False, drop_last=True)
    loader = DataLoader(dataset, batch_size=cfg.batch // world, sampler=sampler, drop_last=True)
    out["ddp + ctx.backward"] = (
        sgd_step(
            "ddp + ctx.backward",
            model,
            workload.make_optimizer(model),
            endless(loader, sampler),
            ctx.backward,
        ),
        model,
    )
    for name, (_, model) in out.items():
        workload.require_data_parallel(cfg, model, name)
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        raise SystemExit(f"Accelerate: {accelerator.distributed_type}; expected MULTI_CPU")
    return out


def release_ddp(model: nn.Module) -> None:
    """Drop the reducer of every DistributedDataParallel in ``model`` (it is unusable after)."""
    for module in model.modules():
        if isinstance(module, DistributedDataParallel):
            for attr in ("logger", "reducer"):
                if attr in module.__dict__:
                    delattr(module, attr)


def _plain_backward(loss: torch.Tensor) -> None:
    loss.backward()


def main() -> None:
    cfg = workload.settings()
    block = int(os.environ.get("BENCH_BLOCK", "10"))
    rounds, warm_rounds = cfg.steps // block, -(-cfg.warmup // block)
    with multigpu.init(seed=cfg.seed) as ctx:
        runners = contenders(ctx, cfg)
        names = list(runners)
        blocks: dict[str, list[float]] = {name: [] for name in names}
        cpu_blocks: dict[str, list[float]] = {name: [] for name in names}
        thread_blocks: dict[str, list[float]] = {name: [] for name in names}
        last: dict[str, torch.Tensor] = {}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                step = runners[name][0]
                started, cpu = time.perf_counter(), time.process_time()
                mine = time.thread_time()
                for _ in range(block):
                    last[name] = step()
                if r >= warm_rounds:
                    blocks[name].append((time.perf_counter() - started) / block)
                    cpu_blocks[name].append((time.process_time() - cpu) / block)
                    thread_blocks[name].append((time.thread_time() - mine) / block)
        losses = {name: workload.global_loss(last[name]) for name in names}
        wrong = {n: sorted(r) for n, r in ROWS.items() if r != {cfg.batch // ctx.world_size}}
        if wrong:
            raise SystemExit(
                f"per-rank batch sizes {wrong}; expected {cfg.batch // ctx.world_size}"
            )
        # Free every DDP object before the group goes (torch 2.13's exit deadlock, DESIGN.md):
        # their reducers first, as multigpu's own teardown does, since Accelerate and Fabric
        # may keep references of their own to the models they wrapped.
        for _, model in runners.values():
            release_ddp(model)
        runners.clear()
        last.clear()
        gc.collect()
        if ctx.is_main and cfg.out:
            result = {
                "block": block,
                "rounds": rounds - warm_rounds,
                "steps": rounds * block,
                "block_step_s": blocks,
                "block_cpu_s": cpu_blocks,
                "block_thread_s": thread_blocks,
                "final_loss": losses,
                "threads": torch.get_num_threads(),
                "world_size": ctx.world_size,
            }
            with open(cfg.out, "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
