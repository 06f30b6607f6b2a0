"""Module-level workers for the 2-D mesh tests: tensor parallel + FSDP, and HSDP, on 2x2.

Both strategies run in one process group (a process start costs seconds on 2 cores). Each trains
the same small model from the same seed straight through ``STEPS`` optimizer steps, with a
checkpoint every ``HALF`` steps (the run compared with one process), then again from its
checkpoint at ``HALF``, resumed through ``ctx.checkpointer``: it must end where the straight run
ended. Rank 0 also trains the plain model alone (no process group, the loader of a world of
one): the one-process reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import multigpu
from multigpu.data import make_loader
from multigpu.runtime.seed import seed_everything

SAMPLES = 96
BATCH = 16  # global: 6 steps an epoch, so the runs cross epochs
STEPS = 50
HALF = 25
KINDS = ("tp", "hsdp")
CLIP = 0.5  # below most steps' gradient norm: the clipping changes the run


class Net(nn.Module):
    """A block with a feed-forward part to split (``ff.0`` column-, ``ff.2`` row-wise) between
    layers that stay whole (sharded by FSDP only)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.ff = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        return self.out(h + self.ff(h))


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(SAMPLES, 8, generator=g)
    return TensorDataset(x, torch.arange(SAMPLES), torch.randint(0, 4, (SAMPLES,), generator=g))


def _optimizer(net: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)


def strategy(kind: str) -> multigpu.Strategy:
    """``tp``: the feed-forward split over 2 ranks, FSDP over the other 2; ``hsdp``: sharded
    within pairs of ranks, replicated across the pairs."""
    if kind == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        plan = {"ff.0": ColwiseParallel(), "ff.2": RowwiseParallel()}
        return multigpu.TensorParallelStrategy(plan, tensor_parallel=2, min_block_params=1)
    return multigpu.FSDPStrategy(mesh_shape="replicate=2,shard=2", min_block_params=1)


def _train(
    ctx: multigpu.Context, directory: Path, resume_from: Path | None = None
) -> dict[str, Any]:
    seed_everything(0)
    net = Net()
    model, opt = ctx.setup(net, _optimizer(net))
    loader = ctx.loader(data(), batch_size=BATCH)
    ckpt = ctx.checkpointer(directory, every_steps=HALF, model=model, optimizer=opt)
    ckpt.track(loader=loader)
    resumed = ckpt.resume(resume_from) if resume_from is not None else None
    seen: list[int] = []
    norms: list[float] = []
    while ckpt.steps < STEPS:
        for x, index, y in loader:
            seen += index.tolist()
            ctx.backward(F.cross_entropy(model(x), y))
            norms.append(float(ctx.clip_grad_norm(model, opt, CLIP)))
            ctx.step(opt)
            ckpt.step()
            if ckpt.steps == STEPS:
                break
    ckpt.close()
    evaluated = multigpu.Mean()  # each sample once, though a TP group reads it on both ranks
    with torch.no_grad():
        for x, _index, y in ctx.loader(data(), batch_size=BATCH, shuffle=False):
            evaluated.update(F.cross_entropy(model(x), y, reduction="none"))
    evaluated.compute()
    return {
        "state": ctx.full_state_dict(model),
        "resumed": resumed,
        "seen": seen,
        "norms": norms,
        "evaluated": evaluated.count,
    }


def one_process(steps: int) -> dict[str, Any]:
    """The plain model trained on the whole global batch, no process group involved: its final
    ``state`` and the gradient ``norms`` of every step."""
    seed_everything(0)
    net = Net()
    opt = _optimizer(net)
    loader = make_loader(data(), batch_size=BATCH, rank=0, world_size=1, seed=0)
    done = 0
    norms: list[float] = []
    while done < steps:
        for x, _index, y in loader:
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)))
            opt.step()
            done += 1
            if done == steps:
                break
    return {"state": {k: v.detach().clone() for k, v in net.state_dict().items()}, "norms": norms}


def _runs(kind: str, directory: Path) -> dict[str, Any]:
    with multigpu.init(strategy=strategy(kind), seed=0) as ctx:
        straight = _train(ctx, directory / "straight")
        half = directory / "straight" / f"step-{HALF:08d}"
        return {
            "mesh": (ctx.mesh.mesh_dim_names, tuple(ctx.mesh.shape)),
            "straight": straight,
            "resumed": _train(ctx, directory / "resumed", resume_from=half),
        }


def two_d(directory: str, kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """The runs of ``kinds`` (``tp``, ``hsdp``); rank 0 adds the one-process ``reference``."""
    with multigpu.init(strategy="ddp", seed=0) as ctx:  # holds the group the others reuse
        out: dict[str, Any] = {kind: _runs(kind, Path(directory) / kind) for kind in kinds}
        if ctx.rank == 0:
            out["reference"] = one_process(STEPS)
    return out
