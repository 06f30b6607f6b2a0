"""Workers for the world-size invariance tests (module level: spawned children import them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import TensorDataset

import multigpu
from multigpu.runtime.seed import seed_everything

GLOBAL_BATCH = 32
NUM_SAMPLES = 480  # 15 steps per epoch: a run of 100+ steps crosses several reshuffled epochs


def make_model(kind: str) -> nn.Module:
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 48), nn.Tanh(), nn.Linear(48, 10))
    return nn.Sequential(  # a small CNN on 1×8×8 inputs, no dropout
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
    )


def make_data(dtype: torch.dtype) -> TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(NUM_SAMPLES, 1, 8, 8, generator=gen, dtype=dtype)
    y = torch.randint(0, 10, (NUM_SAMPLES,), generator=gen)
    return TensorDataset(x, y)


RUNS = [
    ("mlp", "float32", 100, 1),
    ("mlp", "float64", 100, 1),
    ("cnn", "float32", 100, 1),
    ("cnn", "float64", 100, 1),
    ("mlp", "float32", 30, 2),
    ("mlp", "float64", 30, 2),
]
"""(model, dtype, optimizer steps, micro-steps per step) of the invariance tests."""


def train_all(accumulate: bool) -> list[dict[str, Any]]:
    """Every run of RUNS, one after another in this process group (a process start costs
    seconds on 2 cores); with ``accumulate`` False, each run without accumulation (the
    reference of the accumulating ones at another world size)."""
    with multigpu.init(seed=0) as ctx:
        return [
            train(ctx, kind, dtype, steps, micro if accumulate else 1)
            for kind, dtype, steps, micro in RUNS
        ]


def train(
    ctx: Any, kind: str, dtype_name: str, steps: int, accumulation_steps: int = 1
) -> dict[str, Any]:
    """Train ``steps`` optimizer steps of a fixed global batch; report params and all-reduces."""
    dtype = getattr(torch, dtype_name)
    seed_everything(0)  # as init(seed=0) does: every run starts alike
    model = make_model(kind).to(dtype)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = ctx.setup(model, optimizer)
    allreduces = [0]
    if isinstance(model, nn.parallel.DistributedDataParallel):
        # No annotations: DDP rejects a hook whose "bucket" annotation is not GradBucket, and
        # postponed annotations would make it the string "Any".
        def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
            allreduces[0] += 1
            return default_hooks.allreduce_hook(state, bucket)

        model.register_comm_hook(None, counting_hook)
    loader = ctx.loader(
        make_data(dtype), batch_size=GLOBAL_BATCH, accumulation_steps=accumulation_steps
    )
    done, micro = 0, 0
    while done < steps:
        for x, y in loader:
            with ctx.accumulate(model):
                ctx.backward(F.cross_entropy(model(x), y))
                micro += 1
                done += ctx.step(optimizer)
            if done == steps:
                break
    state = {k: v.detach().clone() for k, v in ctx.unwrap(model).state_dict().items()}
    return {
        "state": state,
        "initial": initial,
        "steps": done,
        "micro_steps": micro,
        "allreduces": allreduces[0],
        "per_rank_batch": loader.batch_size,
        "world_size": ctx.world_size,
    }
