"""Workers of the reshard matrix: save under one (strategy, world size), resume under another.

Each worker runs several runs in one process group (contexts nest: the outer one owns the
group). A run trains the LM of the FSDP tests with SGD and momentum (no dropout: runs on
different world sizes agree within rounding), checkpointing model, optimizer and loader.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import multigpu
from multigpu.runtime.seed import seed_everything
from tests.strategies import fsdp_workers

STOP = 9  # the step checkpointed and resumed from: mid-epoch (13 steps per epoch)
END = 16  # the step every run ends at: into the second epoch


def _run(ctx: Any, directory: str, stop: int | None, resume: bool) -> dict[str, Any]:
    """Train to END (or to ``stop``, saving there), resuming from ``directory`` if asked."""
    seed_everything(0)
    net = fsdp_workers.build("lm")
    model, opt = ctx.setup(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9))
    loader = ctx.loader(fsdp_workers._data("lm"), batch_size=fsdp_workers.BATCH)
    ckpt = ctx.checkpointer(directory, model=model, optimizer=opt, loader=loader)
    resumed = ckpt.resume() if resume else None
    first: list[int] | None = None  # the samples of the first step this run trains
    while ckpt.steps < (stop or END):
        for x, index, y in loader:
            if first is None:
                first = index.tolist()
            out = model(x)
            ctx.backward(F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)))
            ctx.step(opt)
            ckpt.step()
            if ckpt.steps == (stop or END):
                break
    if stop is not None:
        ckpt.save()
    return {
        "resumed": resumed,
        "first": ctx.gather(first),
        "state": ctx.full_state_dict(model),
        "strategy": ctx.strategy.name,
    }


def save_runs(root: str) -> dict[str, Any]:
    """On this world size, for ddp and fsdp: an uninterrupted run, and one saved at STOP."""
    size = multigpu.detect().world_size
    out: dict[str, Any] = {}
    with multigpu.init(strategy="fsdp", seed=0) as fsdp:
        out["fsdp"] = _run(fsdp, f"{root}/full-fsdp{size}", None, False)
        _run(fsdp, f"{root}/fsdp{size}", STOP, False)
        with multigpu.init(strategy="ddp", seed=0) as ddp:
            out["ddp"] = _run(ddp, f"{root}/full-ddp{size}", None, False)
            _run(ddp, f"{root}/ddp{size}", STOP, False)
    return out


def resume_runs(root: str, sources: list[str]) -> dict[str, Any]:
    """Resume each saved run of ``sources`` (e.g. "fsdp2") under fsdp and under ddp, here."""
    out: dict[str, Any] = {}
    with multigpu.init(strategy="fsdp", seed=0) as fsdp:
        for source in sources:
            out[f"{source}->fsdp"] = _run(fsdp, f"{root}/{source}", None, True)
        with multigpu.init(strategy="ddp", seed=0) as ddp:
            for source in sources:
                out[f"{source}->ddp"] = _run(ddp, f"{root}/{source}", None, True)
    return out


def save_sharded_model(directory: str) -> dict[str, torch.Tensor]:
    """Train the LM to STOP under FSDP and checkpoint it (each rank writes its shards)."""
    with multigpu.init(strategy="fsdp", seed=0) as ctx:
        return _run(ctx, directory, STOP, False)["state"]  # type: ignore[no-any-return]


def load_converted(path: str, strategy: str) -> dict[str, Any]:
    """``ctx.load`` the converted checkpoint into a fresh LM, and resume a Checkpointer on it."""
    with multigpu.init(strategy=strategy, seed=1) as ctx:
        model = ctx.setup(fsdp_workers.build("lm"))
        rest = ctx.load(path, {"model": model})
        loaded = ctx.full_state_dict(model)
        again = ctx.setup(fsdp_workers.build("lm"))
        step = ctx.checkpointer(path + "-unused", model=again).resume(path)
        return {"loaded": loaded, "resumed": ctx.full_state_dict(again), "rest": rest, "step": step}
